"""Baseline: the block in plain jnp under jax.jit with NamedSharding in and out only; XLA's
SPMD partitioner chooses the activations' layouts (no constraints, no Flax)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import precisions, registry
from kernels.ops.transformer_block import spec
from kernels.sharding import meshes

RULES = meshes.MeshRules()


def _block(x, wq, wk, wv, wo, w_in, w_out):
    h = spec.rms_norm(x)
    q, k, v = (jnp.einsum("bsm,mhd->bshd", h, w) for w in (wq, wk, wv))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    x = x + jnp.einsum("bqhd,hdm->bqm",
                       jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v), wo)
    return x + jax.nn.gelu(spec.rms_norm(x) @ w_in) @ w_out


@functools.cache
def partitioned(mesh_shape: str):
    mesh = meshes.make_mesh(mesh_shape)
    layouts = tuple(RULES.sharding(mesh, *spec.LOGICAL[name]) for name in spec.INPUT_NAMES)
    return jax.jit(_block, in_shardings=layouts, out_shardings=layouts[0])


def prepare(case: registry.Case, *inputs: jax.Array) -> tuple[jax.Array, ...]:
    mesh = meshes.make_mesh(case.kwargs["mesh"])
    return tuple(jax.device_put(x, RULES.sharding(mesh, *spec.LOGICAL[name]))
                 for x, name in zip(inputs, spec.INPUT_NAMES, strict=True))


def block(x, wq, wk, wv, wo, w_in, w_out, mesh: str) -> jax.Array:
    spec.validate(x, wq, wk, wv, wo, w_in, w_out, mesh)
    return partitioned(mesh)(x, wq, wk, wv, wo, w_in, w_out)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=block, baseline=True, prepare=prepare,
    requires=registry.Requirements(devices=2),
    description="plain jnp block, jit with NamedSharding in/out (XLA chooses the rest)",
    precision=precisions.TF32_ON_GPU,  # XLA's default dots
    autotunes=True,  # its dots go through XLA:GPU's GEMM autotuner
))
