"""Expert parallelism by jax.shard_map: experts over the `expert` mesh axis, all-to-all dispatch.

Each device routes its own groups (the groups are sharded over the same mesh
axis as the experts), packs the tokens per expert slot, and one all-to-all
sends every expert's slots to the device that holds that expert; the experts'
MLPs, whose hidden features are split over the `mlp` axis (tensor
parallelism), run on all groups' slots at once, a second all-to-all brings the
outputs home, and the gate-weighted combine is summed over the tensor-parallel
devices (GShard's dispatch, Lepikhin et al., 2020; the layout of MaxText's
sparse-matmul MoE). JAX differentiates the shard_map: all-to-alls transpose to
all-to-alls.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.core import compat, precisions, registry
from kernels.ops.moe import spec
from kernels.sharding import meshes


def _local_moe(x, router, w_in, w_out, *, top_k: int, slots: int, rules: meshes.MeshRules):
    """Per device: x (groups/d, s, m), router (m, e), w_in (e/d, m, h/t), w_out (e/d, h/t, m)."""
    dispatch, combine = spec.route(x, router, top_k, slots)
    tokens = jnp.einsum("gsec,gsm->egcm", dispatch.astype(x.dtype), x)
    # (e, g/d, c, m) -> (e/d, g, c, m): each expert's slots from every group, on its device.
    tokens = jax.lax.all_to_all(tokens, rules.expert, 0, 1, tiled=True)
    outputs = spec.expert_mlp(tokens, w_in, w_out)
    outputs = jax.lax.all_to_all(outputs, rules.expert, 1, 0, tiled=True)
    y = jnp.einsum("gsec,egcm->gsm", combine.astype(x.dtype), outputs)
    # Each tensor-parallel device summed over its share of the hidden features only.
    return jax.lax.psum(y, rules.mlp) if rules.mlp else y


@functools.cache
def sharded_moe(mesh_shape: str, top_k: int, slots: int, rules: meshes.MeshRules = spec.RULES):
    if rules.batch != rules.expert:
        raise ValueError(f"rules: expected groups ('batch', {rules.batch!r}) on the expert "
                         f"axis ({rules.expert!r}) for the all-to-all dispatch")
    mesh = meshes.make_mesh(mesh_shape)
    body = functools.partial(_local_moe, top_k=top_k, slots=slots, rules=rules)
    return jax.jit(compat.shard_map(body, mesh=mesh, in_specs=in_specs(rules),
                                    out_specs=rules.spec("batch", None, "embed")))


def in_specs(rules: meshes.MeshRules):
    return (rules.spec("batch", None, "embed"), rules.spec("embed", None),
            rules.spec("expert", "embed", "mlp"), rules.spec("expert", "mlp", "embed"))


def prepare(case: registry.Case, *inputs: jax.Array) -> tuple[jax.Array, ...]:
    mesh = meshes.make_mesh(case.kwargs["mesh"])
    return tuple(meshes.place(x, mesh, s)
                 for x, s in zip(inputs, in_specs(spec.RULES), strict=True))


def moe(x: jax.Array, router: jax.Array, w_in: jax.Array, w_out: jax.Array, top_k: int,
        capacity_factor: float, mesh: str) -> jax.Array:
    """The MoE layer of spec.py over a `mesh` ("4x2") mesh, experts over its data axis."""
    spec.validate(x, router, w_in, w_out, top_k, capacity_factor, mesh)
    slots = spec.capacity(x.shape[1], router.shape[1], top_k, capacity_factor)
    return sharded_moe(mesh, top_k, slots)(x, router, w_in, w_out)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="expert_parallel", fn=moe, prepare=prepare,
    requires=registry.Requirements(devices=2),
    description="shard_map: experts over the expert axis, all-to-all dispatch and return",
    # XLA's default dots for the tokens' products (the router's logits are HIGHEST).
    precision=precisions.TF32_ON_GPU,
))
