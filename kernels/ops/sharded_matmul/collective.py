"""Ring collective matmul: the all-gather of A over the model axis overlapped with the products.

jax.shard_map over the (data, model) mesh. With `model` = p devices, each holds
one row block of A. In step s every device multiplies the block it holds by
its columns of B while it passes that block to its left neighbour
(`ppermute`), so after p steps it has used every block of its data row and
never held the gathered A (Wang et al., ASPLOS 2023, the "looped collective
einsum"; JAX's shard_map collective-matmul notes). The transfer is issued
before the product it overlaps, so XLA's scheduler can run both at once.
Bidirectional (a Config option): half of each block goes each way round the
ring, which uses both directions of every link and halves the steps' transfer
size, but needs two permutes in flight at once, which XLA's GPU scheduler
limits by default (parallel collective overlap limit 1); the one-way ring is
the default, and `python -m kernels.ops.sharded_matmul.overlap` times both.

Gradients are JAX's own transpose of the shard_map: the ppermutes reverse, so
dA comes back as a ring reduce-scatter, each partial block travelling while
the next is computed (the overlap script times the forward only).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from kernels.core import compat, precisions, registry
from kernels.ops.sharded_matmul import spec
from kernels.sharding import meshes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """bidirectional: send half of each block each way round the ring."""

    bidirectional: bool = False


def default_config(case: registry.Case | None = None) -> Config:
    return Config()


def _local_product(a_rows: jax.Array, b_block: jax.Array) -> jax.Array:
    """One device's product of the rows it holds by its columns of B. A function of its own
    so that gate-power's sharded plant (kernels.bench.gate.PLANTS) can add work here, inside
    the kernel, without adding an exchange."""
    return a_rows @ b_block


def _ring_matmul(a_block: jax.Array, b_block: jax.Array, *, ring: int,
                 bidirectional: bool) -> jax.Array:
    """Per device: (rows, k) @ (k, n/p) for every row block of the ring -> (p*rows, n/p)."""
    rows = a_block.shape[0]
    me = jax.lax.axis_index(meshes.MODEL)
    out = jnp.zeros((ring * rows, b_block.shape[1]), a_block.dtype)
    # Receive from the right neighbour: after s steps we hold block (me + s) % ring.
    from_right = [(j, (j - 1) % ring) for j in range(ring)]
    from_left = [(j, (j + 1) % ring) for j in range(ring)]
    if not bidirectional or rows % 2:
        held = a_block
        for step in range(ring):
            nxt = jax.lax.ppermute(held, meshes.MODEL, from_right) if step < ring - 1 else None
            source = (me + step) % ring
            out = jax.lax.dynamic_update_slice(out, _local_product(held, b_block),
                                               (source * rows, 0))
            held = nxt
        return out
    half = rows // 2
    # Top halves travel right-to-left, bottom halves left-to-right.
    top, bottom = a_block[:half], a_block[half:]
    for step in range(ring):
        if step < ring - 1:
            next_top = jax.lax.ppermute(top, meshes.MODEL, from_right)
            next_bottom = jax.lax.ppermute(bottom, meshes.MODEL, from_left)
        out = jax.lax.dynamic_update_slice(out, _local_product(top, b_block),
                                           (((me + step) % ring) * rows, 0))
        out = jax.lax.dynamic_update_slice(out, _local_product(bottom, b_block),
                                           (((me - step) % ring) * rows + half, 0))
        if step < ring - 1:
            top, bottom = next_top, next_bottom
    return out


def ring(mesh_shape: str, config: Config = Config()):
    """The ring collective matmul for one mesh, as a shard_map (not yet jitted)."""
    mesh = meshes.make_mesh(mesh_shape)
    _, model = meshes.parse_mesh_shape(mesh_shape)
    body = functools.partial(_ring_matmul, ring=model, bidirectional=config.bidirectional)
    return compat.shard_map(body, mesh=mesh, in_specs=(spec.A_SPEC, spec.B_SPEC),
                            out_specs=spec.C_SPEC)


@functools.cache
def collective(mesh_shape: str, config: Config = Config()):
    """The jitted ring collective matmul for one mesh."""
    return jax.jit(ring(mesh_shape, config))


@functools.cache
def compute_only(mesh_shape: str):
    """The same per-device products with A already gathered (no communication): the
    time a perfectly hidden all-gather would leave. Takes A laid out as spec.C_SPEC's rows."""
    mesh = meshes.make_mesh(mesh_shape)
    return jax.jit(compat.shard_map(jnp.matmul, mesh=mesh,
                                    in_specs=(jax.sharding.PartitionSpec(meshes.DATA, None),
                                              spec.B_SPEC),
                                    out_specs=spec.C_SPEC))


def _gather_then_multiply(a_block: jax.Array, b_block: jax.Array) -> jax.Array:
    return jax.lax.all_gather(a_block, meshes.MODEL, tiled=True) @ b_block


@functools.cache
def gather_then_multiply(mesh_shape: str):
    """No overlap: the all-gather of A over `model`, then one product per device (the
    reference JAX's collective-matmul example compares against). Takes spec.A_SPEC's A."""
    mesh = meshes.make_mesh(mesh_shape)
    return jax.jit(compat.shard_map(_gather_then_multiply, mesh=mesh,
                                    in_specs=(spec.A_SPEC, spec.B_SPEC), out_specs=spec.C_SPEC))


def matmul(a: jax.Array, b: jax.Array, mesh: str, config: Config | None = None) -> jax.Array:
    """C = A @ B by a ring collective matmul over a `mesh` ("4x2") mesh."""
    spec.validate(a, b, mesh)
    return collective(mesh, config or default_config())(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="collective", fn=matmul, prepare=spec.prepare,
    requires=registry.Requirements(devices=2),
    description="shard_map ring collective matmul (ppermute overlapped with local products)",
    precision=precisions.TF32_ON_GPU,  # XLA's default dots per device
))
