"""Baseline: jax.nn.dot_product_attention(implementation="xla"), XLA's fused attention."""

import jax

from kernels.core import compat, precisions, registry
from kernels.ops.attention import spec


@jax.jit(static_argnames="causal")
def _attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False) -> jax.Array:
    if q.dtype == jax.numpy.float32:
        # The float32 tolerance assumes float32 dots; GPUs would otherwise use TF32.
        with jax.default_matmul_precision("highest"):
            return _attention(q, k, v, causal)
    return _attention(q, k, v, causal)


def supports(case: registry.Case) -> str | None:
    # Seen with jax 0.10.2 on CPU: XLA:CPU has no 16-bit dot with float32 accumulation
    # ("The precision 'F16_F16_F32' is not supported by dot_general on CPU"; for bf16,
    # "ALG_DOT_BF16_BF16_F32" when a single query makes the dot elementwise). Seen with
    # jax 0.11.2 on the H100: a single f16 query fails the same way ("Unsupported dot
    # precision algorithm: 4").
    if case.dtype != "f32" and case["seq"] == 1 and (compat.on_gpu() or case.dtype == "bf16"):
        return (f"XLA rejects the {case.dtype} dot with float32 accumulation that "
                f"dot_product_attention asks for when a single query makes it elementwise")
    if not compat.on_gpu() and case.dtype == "f16":
        return ("needs a GPU for f16: XLA:CPU rejects the 16-bit dot with float32 "
                "accumulation that dot_product_attention asks for")
    return None


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=attention, baseline=True, supports=supports,
    description='jax.nn.dot_product_attention(implementation="xla")',
    precision=precisions.EVERYWHERE_FP32,  # default_matmul_precision("highest") for f32
    autotunes=True,  # its dots go through XLA:GPU's GEMM autotuner
))
