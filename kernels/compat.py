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


class CuptiSession:
    """CUPTI kernel-activity recording around arbitrary JAX dispatches.

    The calls `jax.experimental.mosaic.gpu.profiler.measure` makes, without
    its wrapper (which jits the function, adds a warm-up call and requires
    every iteration to launch the same kernels): `start()`, dispatch anything,
    wait for it, `stop()` -> [(kernel name, milliseconds)] in launch order.
    """

    def __init__(self, extension):
        self._extension = extension

    def start(self) -> None:
        self._extension._cupti_init()

    def stop(self) -> list[tuple[str, float]]:
        return list(self._extension._cupti_get_timings(True) or ())


def cupti_session() -> CuptiSession | None:
    """A CuptiSession over the Mosaic GPU extension, or None where it is not available."""
    try:
        from jax._src.lib import mosaic_gpu as mosaic_gpu_lib
    except ImportError:
        return None
    extension = getattr(mosaic_gpu_lib, "_mosaic_gpu_ext", None)
    if extension is None or not hasattr(extension, "_cupti_init"):
        return None
    return CuptiSession(extension)
