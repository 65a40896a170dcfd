"""Baseline: jnp.matmul under jax.jit with NamedSharding in and out; XLA's SPMD partitioner
chooses the collectives (an all-gather of A over the model axis, or a reduction)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from kernels.core import registry
from kernels.ops.sharded_matmul import spec
from kernels.sharding import meshes


@functools.cache
def partitioned(mesh_shape: str):
    """The jitted product for one mesh, its input and output layouts fixed."""
    mesh = meshes.make_mesh(mesh_shape)
    a_layout, b_layout = NamedSharding(mesh, spec.A_SPEC), NamedSharding(mesh, spec.B_SPEC)
    return jax.jit(jnp.matmul, in_shardings=(a_layout, b_layout),
                   out_shardings=NamedSharding(mesh, spec.C_SPEC))


def matmul(a: jax.Array, b: jax.Array, mesh: str) -> jax.Array:
    """C = A @ B with A, B and C laid out as spec.py says over a `mesh` ("4x2") mesh."""
    spec.validate(a, b, mesh)
    return partitioned(mesh)(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=matmul, baseline=True,
    prepare=spec.prepare, requires=registry.Requirements(devices=2),
    description="jnp.matmul partitioned by XLA's SPMD partitioner (NamedSharding in/out)",
))
