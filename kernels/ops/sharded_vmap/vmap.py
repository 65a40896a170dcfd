"""jax.vmap over the sharded batch under jax.jit, with `spmd_axis_name` naming the mesh axis.

The per-example function constrains its logits to have their features over
`model`; `spmd_axis_name` makes vmap add the batch's mesh axis to that
constraint, so the batched intermediate is (data, None, model) and nothing is
gathered. correctness_tests/test_sharded.py reads the compiled HLO to check.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import NamedSharding, PartitionSpec

from kernels.core import precisions, registry
from kernels.ops.sharded_vmap import spec
from kernels.sharding import meshes


def _per_example_constrained(x: jax.Array, w: jax.Array, *, mesh) -> jax.Array:
    y = spec.per_example(x, w)
    return jax.lax.with_sharding_constraint(
        y, NamedSharding(mesh, PartitionSpec(None, spec.RULES.mlp)))


@functools.cache
def batched(mesh_shape: str):
    """The jitted vmap for one mesh, input and output layouts fixed."""
    mesh = meshes.make_mesh(mesh_shape)
    body = jax.vmap(functools.partial(_per_example_constrained, mesh=mesh), in_axes=(0, None),
                    spmd_axis_name=spec.RULES.batch)
    return jax.jit(body, in_shardings=(NamedSharding(mesh, spec.X_SPEC),
                                      NamedSharding(mesh, spec.W_SPEC)),
                   out_shardings=NamedSharding(mesh, spec.OUT_SPEC))


def vmapped(x: jax.Array, w: jax.Array, mesh: str) -> jax.Array:
    """softmax(x_i @ w) over rows for every example i, batch sharded over the mesh's data axis."""
    spec.validate(x, w, mesh)
    return batched(mesh)(x, w)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="vmap", fn=vmapped, prepare=spec.prepare,
    requires=registry.Requirements(devices=2),
    description="jax.vmap(spmd_axis_name=data) under jit with NamedSharding in and out",
    precision=precisions.TF32_ON_GPU,  # XLA's default dot (bf16 cases: exact products)
))
