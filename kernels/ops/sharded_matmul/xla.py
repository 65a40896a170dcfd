"""Baseline: jnp.matmul under jax.jit with NamedSharding in and out; XLA's SPMD partitioner
chooses the collectives (an all-gather of A over the model axis, or a reduction)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from kernels.core import precisions, registry
from kernels.ops.sharded_matmul import spec
from kernels.sharding import meshes

# XLA's own collective matmul on GPU: the partitioner splits an all-gather feeding a dot into
# a loop of permutes and partial dots ("windowed einsum") when the operand passes a size
# threshold (0 MiB: always), the partial dots on several streams, and the latency-hiding
# scheduler moves each permute's start ahead of the dot before it. These are the flags XLA's
# GPU performance guide gives for overlapping tensor-parallel communication. On 4 H100s with
# jax 0.11.2 its product on a 1x4 mesh was wrong (relative error 0.87; 1x2 and 2x2 right), so
# the overlap script checks every variant's product before timing it.
WINDOWED_OPTIONS = {"xla_gpu_threshold_for_windowed_einsum_mib": 0,
                    "xla_gpu_multi_streamed_windowed_einsum": True,
                    "xla_gpu_enable_latency_hiding_scheduler": True}


@functools.cache
def partitioned(mesh_shape: str, windowed: bool = False):
    """The jitted product for one mesh, its input and output layouts fixed; `windowed`
    compiles it with WINDOWED_OPTIONS (XLA's best flags for overlap) instead of the defaults."""
    mesh = meshes.make_mesh(mesh_shape)
    a_layout, b_layout = NamedSharding(mesh, spec.A_SPEC), NamedSharding(mesh, spec.B_SPEC)
    return jax.jit(jnp.matmul, in_shardings=(a_layout, b_layout),
                   out_shardings=NamedSharding(mesh, spec.C_SPEC),
                   compiler_options=WINDOWED_OPTIONS if windowed else None)


def matmul(a: jax.Array, b: jax.Array, mesh: str) -> jax.Array:
    """C = A @ B with A, B and C laid out as spec.py says over a `mesh` ("4x2") mesh."""
    spec.validate(a, b, mesh)
    return partitioned(mesh)(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=matmul, baseline=True,
    prepare=spec.prepare, requires=registry.Requirements(devices=2),
    description="jnp.matmul partitioned by XLA's SPMD partitioner (NamedSharding in/out)",
    precision=precisions.TF32_ON_GPU,  # XLA's default dots
    autotunes=True,  # its dots go through XLA:GPU's GEMM autotuner
))
