"""The transformer block as a Flax NNX module, sharded by logical-axis rules.

Parameters are created through `nnx.with_partitioning(init, logical_names)`;
under `nnx.logical_axis_rules(MeshRules().as_pairs())` Flax maps those names
to mesh axes and places each parameter sharded when it is created. Activations
are pinned with `with_sharding_constraint` at the points where the Megatron
layout fixes them (heads and MLP features over `model`, batch over `data`);
XLA inserts the two all-reduces per block. `make_block(..., mesh=None)` builds
the same module unsharded, with the same initial values, for comparison.

Private (kernels.core.registry): nnx_block.py registers the implementation and imports this
module on its first call, so loading the registry does not import Flax (0.4 s of CPU in every
process that loads it, on the 2-core machine).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from kernels.ops.transformer_block import spec
from kernels.sharding import meshes

RULES = meshes.MeshRules()


@dataclasses.dataclass(frozen=True)
class BlockDims:
    embed: int
    heads: int
    head_dim: int
    mlp: int


class Block(nnx.Module):
    """Pre-norm attention + GELU MLP; parameters named as spec.LOGICAL says."""

    def __init__(self, dims: BlockDims, *, rngs: nnx.Rngs, mesh: Mesh | None = None,
                 rules: meshes.MeshRules = RULES, dtype=jnp.float32):
        self.mesh, self.rules = mesh, rules
        m, h, d, f = dims.embed, dims.heads, dims.head_dim, dims.mlp

        def param(name: str, shape: tuple[int, ...], fan_in: int) -> nnx.Param:
            init = nnx.initializers.normal(1 / np.sqrt(fan_in))
            if mesh is not None:
                init = nnx.with_partitioning(init, spec.LOGICAL[name], mesh=mesh)
            return nnx.Param(init(rngs.params(), shape, dtype))

        self.wq, self.wk, self.wv = (param(n, (m, h, d), m) for n in ("wq", "wk", "wv"))
        self.wo = param("wo", (h, d, m), h * d)
        self.w_in = param("w_in", (m, f), m)
        self.w_out = param("w_out", (f, m), f)

    def _constrain(self, y: jax.Array, *logical: str | None) -> jax.Array:
        if self.mesh is None:
            return y
        return jax.lax.with_sharding_constraint(y, self.rules.sharding(self.mesh, *logical))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self._constrain(x, "batch", None, "embed")
        h = spec.rms_norm(x)
        q, k, v = (self._constrain(jnp.einsum("bsm,mhd->bshd", h, w[...]),
                                   "batch", None, "heads", None)
                   for w in (self.wq, self.wk, self.wv))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        x = self._constrain(x + jnp.einsum("bqhd,hdm->bqm", attended, self.wo[...]),
                            "batch", None, "embed")
        hidden = self._constrain(jax.nn.gelu(jnp.einsum("bsm,mf->bsf", spec.rms_norm(x),
                                                        self.w_in[...])),
                                 "batch", None, "mlp")
        return self._constrain(x + hidden @ self.w_out[...], "batch", None, "embed")


def make_block(dims: BlockDims, *, seed: int = 0, mesh: Mesh | None = None,
               rules: meshes.MeshRules = RULES, dtype=jnp.float32) -> Block:
    """A Block with parameters from `seed`; sharded by `rules` over `mesh` if one is given."""
    with nnx.logical_axis_rules(rules.as_pairs()):
        return Block(dims, rngs=nnx.Rngs(seed), mesh=mesh, rules=rules, dtype=dtype)


@nnx.jit
def train_step(model: Block, x: jax.Array, target: jax.Array, learning_rate: float) -> jax.Array:
    """One SGD step on the mean squared error of model(x) against `target`; returns the loss.

    Sharded or not, the same function: the layout comes from the model's
    parameters and x, and the updated parameters keep the parameters' layout.
    """
    def loss_fn(model: Block) -> jax.Array:
        return jnp.mean((model(x).astype(jnp.float32) - target) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - learning_rate * g, params, grads))
    return loss


def input_shardings(mesh: Mesh, rules: meshes.MeshRules = RULES):
    return tuple(rules.sharding(mesh, *spec.LOGICAL[name]) for name in spec.INPUT_NAMES)


@functools.cache
def sharded_apply(dims: BlockDims, mesh_shape: str, dtype_name: str):
    """jit of (x, *weights) -> block output: a Block whose parameters are the given arrays."""
    mesh = meshes.make_mesh(mesh_shape)
    # eval_shape resolves the parameters' logical names too: it needs the rules.
    with nnx.logical_axis_rules(RULES.as_pairs()):
        abstract = nnx.eval_shape(lambda: make_block(dims, mesh=mesh,
                                                     dtype=jnp.dtype(dtype_name)))
    graphdef, _ = nnx.split(abstract)
    layouts = input_shardings(mesh)

    def apply(x, *weights):
        model = nnx.merge(graphdef, dict(zip(spec.INPUT_NAMES[1:], weights, strict=True)))
        return model(x)

    return jax.jit(apply, in_shardings=layouts, out_shardings=layouts[0])
