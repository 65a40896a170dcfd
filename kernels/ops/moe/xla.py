"""Baseline: the dense GShard einsums under jax.jit, laid out by sharding constraints only.

Inputs carry the same layouts as the expert-parallel version; the dispatched
tokens are constrained to be expert-major over the expert axis, and XLA's SPMD
partitioner derives the collectives (an all-to-all where it can).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.core import precisions, registry
from kernels.ops.moe import expert_parallel, spec
from kernels.sharding import meshes


@functools.cache
def constrained_moe(mesh_shape: str, top_k: int, slots: int):
    mesh = meshes.make_mesh(mesh_shape)
    rules = spec.RULES

    def dense(x, router, w_in, w_out):
        dispatch, combine = spec.route(x, router, top_k, slots)
        tokens = jnp.einsum("gsec,gsm->egcm", dispatch.astype(x.dtype), x)
        tokens = jax.lax.with_sharding_constraint(
            tokens, rules.sharding(mesh, "expert", None, None, "embed"))
        outputs = spec.expert_mlp(tokens, w_in, w_out)
        outputs = jax.lax.with_sharding_constraint(
            outputs, rules.sharding(mesh, "expert", None, None, "embed"))
        return jnp.einsum("gsec,egcm->gsm", combine.astype(x.dtype), outputs)

    layouts = tuple(jax.sharding.NamedSharding(mesh, s)
                    for s in expert_parallel.in_specs(rules))
    return jax.jit(dense, in_shardings=layouts, out_shardings=layouts[0])


def moe(x: jax.Array, router: jax.Array, w_in: jax.Array, w_out: jax.Array, top_k: int,
        capacity_factor: float, mesh: str) -> jax.Array:
    spec.validate(x, router, w_in, w_out, top_k, capacity_factor, mesh)
    slots = spec.capacity(x.shape[1], router.shape[1], top_k, capacity_factor)
    return constrained_moe(mesh, top_k, slots)(x, router, w_in, w_out)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=moe, baseline=True,
    prepare=expert_parallel.prepare, requires=registry.Requirements(devices=2),
    description="dense GShard einsums, with_sharding_constraint, XLA SPMD partitioning",
    # XLA's default dots for the tokens' products (the router's logits are HIGHEST).
    precision=precisions.TF32_ON_GPU,
    autotunes=True,  # its dots go through XLA:GPU's GEMM autotuner
))
