"""Baseline: the residual MLP stack as a lax.scan over layers, compiled by XLA.

The backward keeps every layer's activations (x_l, x_l @ w1, gelu of it) from
the forward: the most memory, no recomputation. See xla_remat.py for the trade.
"""

import jax

from kernels.core import precisions, registry
from kernels.ops.mlp import spec


@jax.jit
def mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    def layer(x, weights):
        return spec.block(x, *weights), None

    return jax.lax.scan(layer, x, (w1, w2))[0]


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=mlp, baseline=True,
    description="lax.scan over layers, XLA; the backward keeps every activation",
    precision=precisions.TF32_ON_GPU,  # XLA's default dots
    autotunes=True,  # its dots go through XLA:GPU's GEMM autotuner
))
