"""Everything that differs between the JAX/Triton versions we support lives here.

Supported: jax 0.10.2 (CPU machines, Python 3.11) and jax 0.11.2 (the GPU
machine, Python 3.12). The Pallas Triton-lowering API we use
(`jax.experimental.pallas.triton`: load, store, CompilerParams(num_warps,
num_stages)) is the same in both; jax 0.11 adds a DeprecationWarning on its
use, filtered in pyproject.toml by its exact message.
"""

from __future__ import annotations

import functools

import jax

JAX_VERSION = tuple(int(part) for part in jax.__version__.split(".")[:3])

# The message jax >= 0.11 emits when a kernel is lowered through Pallas-Triton.
PALLAS_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"


@functools.cache
def on_gpu() -> bool:
    """Whether JAX's default backend is a GPU."""
    return jax.default_backend() == "gpu"


def pallas_interpret() -> bool:
    """Pallas kernels run in interpret mode wherever JAX has no GPU."""
    return not on_gpu()


def pallas_triton():
    """The Pallas Triton-lowering module (`load`, `store`, `CompilerParams`)."""
    from jax.experimental.pallas import triton as pallas_triton_module

    return pallas_triton_module


def pallas_mosaic_gpu():
    """The Pallas Mosaic GPU module (`kernel`, `emit_pipeline`, `wgmma`, `BlockSpec`, ...)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu


MOSAIC_GPU_INTERPRET_MISSING = (
    "needs a Hopper GPU: this jax has no Mosaic GPU interpreter (InterpretGPUParams) to run "
    "Mosaic GPU kernels on CPU")


def _interpret_gpu_params_class():
    # Public as plgpu.InterpretGPUParams in jax 0.11; private module in 0.10.2.
    plgpu = pallas_mosaic_gpu()
    if hasattr(plgpu, "InterpretGPUParams"):
        return plgpu.InterpretGPUParams
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:
        return None
    return InterpretGPUParams


def mosaic_gpu_interpret_available() -> bool:
    return _interpret_gpu_params_class() is not None


def mosaic_gpu_interpret_params():
    """Parameters that make `plgpu.kernel` run in JAX's GPU interpreter (simulated TMA,
    barriers and wgmma on CPU)."""
    cls = _interpret_gpu_params_class()
    if cls is None:
        raise RuntimeError(MOSAIC_GPU_INTERPRET_MISSING)
    return cls()


@functools.cache
def multiprocessor_count() -> int:
    """Streaming multiprocessors of the default device (persistent grids); 1 without a GPU,
    (the Mosaic GPU interpreter simulates one block at a time)."""
    device = jax.devices()[0]
    return int(getattr(device, "core_count", 0) or 0) if on_gpu() else 1
