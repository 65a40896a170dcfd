"""Baseline: jnp.matmul compiled by XLA (cuBLAS / cuBLASLt on GPU), default precision."""

import jax
import jax.numpy as jnp

from kernels.core import precisions, registry
from kernels.core.hlo_rules import HloExpectation, HloRules
from kernels.ops.matmul import spec


@jax.jit
def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=matmul, baseline=True,
    description="jnp.matmul through XLA (cuBLAS on GPU)",
    # XLA's default dot precision: TF32 for float32 on an Ampere+ GPU (JAX's "Matmul
    # precision" notes), FP32 on XLA:CPU.
    precision=precisions.TF32_ON_GPU,
    autotunes=True,  # XLA:GPU times cuBLAS algorithms and Triton GEMM tilings as it compiles
    # On GPU one cuBLAS call or one Triton GEMM fusion (XLA's autotuner picks), so the
    # custom calls are not pinned; for awkward shapes a split-K Triton GEMM adds a padding
    # fusion per operand and the reduction of the partial products (4 fusions for
    # 129x130x257 on an H100, jax 0.11.2); no operand is transposed or copied first.
    # On CPU 16-bit operands are converted to float32 around the product (up to 4).
    hlo=HloExpectation(cpu=HloRules(fusions=(1, 4), custom_calls=()),
                       gpu=HloRules(fusions=(0, 4))),
))
