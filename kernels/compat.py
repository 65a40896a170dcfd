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


def cupti_measure():
    """`jax.experimental.mosaic.gpu.profiler.measure` (CUPTI kernel timings), or None where the
    Mosaic GPU extension that provides CUPTI is not available."""
    try:
        from jax.experimental.mosaic.gpu import profiler
    except ImportError:
        return None
    if getattr(profiler, "mosaic_gpu_lib", None) is None:
        return None
    return profiler.measure
