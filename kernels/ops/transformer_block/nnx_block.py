"""The transformer block as a Flax NNX module, sharded by logical-axis rules (the module
itself is in _nnx_model.py, imported on the first call: Flax is not imported by loading the
registry)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.core import precisions, registry
from kernels.ops.transformer_block import spec
from kernels.sharding import meshes

RULES = meshes.MeshRules()


def prepare(case: registry.Case, *inputs: jax.Array) -> tuple[jax.Array, ...]:
    mesh = meshes.make_mesh(case.kwargs["mesh"])
    return tuple(jax.device_put(x, RULES.sharding(mesh, *spec.LOGICAL[name]))
                 for x, name in zip(inputs, spec.INPUT_NAMES, strict=True))


def block(x, wq, wk, wv, wo, w_in, w_out, mesh: str) -> jax.Array:
    """The transformer block of spec.py, as an NNX module sharded over a `mesh` ("4x2") mesh."""
    from kernels.ops.transformer_block import _nnx_model

    spec.validate(x, wq, wk, wv, wo, w_in, w_out, mesh)
    d = spec.dims_of(x, wq, w_in)
    dims = _nnx_model.BlockDims(embed=d["embed"], heads=d["heads"], head_dim=d["head_dim"],
                                mlp=d["mlp"])
    return _nnx_model.sharded_apply(dims, mesh, jnp.dtype(x.dtype).name)(
        x, wq, wk, wv, wo, w_in, w_out)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="nnx", fn=block, prepare=prepare,
    requires=registry.Requirements(devices=2, modules=("flax",)),
    description="Flax NNX module, nnx.with_partitioning + logical axis rules, jit",
    precision=precisions.TF32_ON_GPU,  # XLA's default dots
))
