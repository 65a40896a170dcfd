"""Baseline: the batched computation written out (no vmap) under jax.jit, NamedSharding in/out."""

from __future__ import annotations

import functools

import jax
from jax.sharding import NamedSharding

from kernels.core import precisions, registry
from kernels.ops.sharded_vmap import spec
from kernels.sharding import meshes


@functools.cache
def batched(mesh_shape: str):
    mesh = meshes.make_mesh(mesh_shape)

    def run(x, w):
        logits = jax.numpy.einsum("bnd,de->bne", x.astype("float32"), w.astype("float32"))
        return jax.nn.softmax(logits, axis=1).astype(x.dtype)

    return jax.jit(run, in_shardings=(NamedSharding(mesh, spec.X_SPEC),
                                      NamedSharding(mesh, spec.W_SPEC)),
                   out_shardings=NamedSharding(mesh, spec.OUT_SPEC))


def written_out(x: jax.Array, w: jax.Array, mesh: str) -> jax.Array:
    spec.validate(x, w, mesh)
    return batched(mesh)(x, w)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=written_out, baseline=True,
    prepare=spec.prepare, requires=registry.Requirements(devices=2),
    description="batched einsum + softmax, jit with NamedSharding in and out",
    precision=precisions.TF32_ON_GPU,  # XLA's default dot (bf16 cases: exact products)
    autotunes=True,  # its dots go through XLA:GPU's GEMM autotuner
))
