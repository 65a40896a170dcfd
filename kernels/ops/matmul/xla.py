"""Baseline: jnp.matmul compiled by XLA (cuBLAS / cuBLASLt on GPU), default precision."""

import jax
import jax.numpy as jnp

from kernels import registry
from kernels.hlo import HloExpectation, HloRules
from kernels.ops.matmul import spec


@jax.jit
def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=matmul, baseline=True,
    description="jnp.matmul through XLA (cuBLAS on GPU)",
    # On GPU one cuBLAS call or one Triton GEMM fusion (XLA's autotuner picks), so the
    # custom calls are not pinned; no operand is transposed or copied first. On CPU
    # 16-bit operands are converted to float32 around the product (up to 4 fusions).
    hlo=HloExpectation(cpu=HloRules(fusions=(1, 4), custom_calls=()),
                       gpu=HloRules(fusions=(0, 2))),
))
