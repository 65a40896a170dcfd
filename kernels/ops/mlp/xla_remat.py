"""The residual MLP stack with each layer rematerialised (jax.checkpoint) in the backward.

The forward saves only each layer's input x_l; the backward recomputes
x_l @ w1 and its gelu from it before differentiating the layer. Per layer that
keeps batch x d_model values instead of batch x (d_model + 2 d_ff), for a
third more FLOPs (the first product and the gelu run twice): memory down,
time up. Same forward as xla.py.
"""

import jax

from kernels.core import precisions, registry
from kernels.ops.mlp import spec


@jax.jit
def _mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    # nothing_saveable: keep no intermediate of the block, only its arguments.
    block = jax.checkpoint(spec.block, policy=jax.checkpoint_policies.nothing_saveable)

    def layer(x, weights):
        return block(x, *weights), None

    return jax.lax.scan(layer, x, (w1, w2))[0]


def mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    """The residual MLP stack of `spec`; differentiable, rematerialised per layer.

    Args:
      x: (batch, d_model); w1: (layers, d_model, d_ff); w2: (layers, d_ff, d_model); one
        dtype, float32 or bfloat16.
    Returns:
      (batch, d_model) in x's dtype.
    """
    spec.validate(x, w1, w2)
    return _mlp(x, w1, w2)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla_remat", fn=mlp,
    description="lax.scan over layers with jax.checkpoint per layer: less memory, more FLOPs",
    precision=precisions.TF32_ON_GPU,  # XLA's default dots
    autotunes=True,  # its dots go through XLA:GPU's GEMM autotuner
))
