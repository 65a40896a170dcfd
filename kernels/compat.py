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


def make_mesh(shape, axis_names, devices=None):
    """`jax.make_mesh` with Auto axes (the compiler propagates shardings), on a device subset.

    Auto is spelled out because newer JAX releases change the default axis type.
    """
    from jax.sharding import AxisType

    return jax.make_mesh(tuple(shape), tuple(axis_names),
                         axis_types=(AxisType.Auto,) * len(axis_names), devices=devices)


def shard_map(f, *, mesh, in_specs, out_specs, check_vma: bool = True):
    """`jax.shard_map` (top-level since jax 0.7; both supported versions have it)."""
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=check_vma)
