"""Baseline: jnp.matmul compiled by XLA (cuBLAS / cuBLASLt on GPU), default precision."""

import jax
import jax.numpy as jnp

from kernels import registry
from kernels.ops.matmul import spec


@jax.jit
def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=matmul, baseline=True,
    description="jnp.matmul through XLA (cuBLAS on GPU)",
))
