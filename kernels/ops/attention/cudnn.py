"""Baseline: jax.nn.dot_product_attention(implementation="cudnn"), cuDNN's fused flash attention."""

import jax

from kernels.core import precisions, registry
from kernels.ops.attention import spec


@jax.jit(static_argnames="causal")
def _attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False) -> jax.Array:
    return _attention(q, k, v, causal)


def supports(case: registry.Case) -> str | None:
    if case.dtype == "f32":
        return "cuDNN fused attention takes bf16/f16 only, not f32"
    if case["seq"] % 2:
        # jax 0.11.2 on the H100: "NotImplementedError: Unsupported sequence length Q 37, KV 37".
        return "jax's cuDNN attention has no backward for an odd sequence length"
    return None


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="cudnn", fn=attention, baseline=True, supports=supports,
    requires=registry.Requirements(gpu=True, min_compute_capability=(8, 0)),
    description='jax.nn.dot_product_attention(implementation="cudnn")',
    precision=precisions.NO_FLOAT32,  # bf16/f16 only (supports)
))
