"""Baseline: jnp.sum compiled by XLA, accumulating in float32 for 16-bit inputs."""

import jax
import jax.numpy as jnp

from kernels.core import registry
from kernels.ops.row_sum import spec


@jax.jit
def row_sum(x: jax.Array) -> jax.Array:
    return jnp.sum(x, axis=-1, dtype=jnp.float32).astype(x.dtype)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=row_sum, baseline=True,
    description="jnp.sum(axis=-1) in float32, compiled by XLA",
))
