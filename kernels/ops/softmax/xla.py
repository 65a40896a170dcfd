"""Baseline: jax.nn.softmax compiled by XLA, in float32 for 16-bit inputs.

16-bit inputs are upcast and the result cast back, as mixed-precision code
does: XLA fuses the converts into its softmax kernel, so the bytes moved are
those of the 16-bit arrays, and the gradient accumulates in float32 (in
float16 it misses the reference by 3e-2 over 4097 columns).
"""

import jax
import jax.numpy as jnp

from kernels.core import registry
from kernels.core.hlo_rules import HloExpectation, HloRules
from kernels.ops.softmax import spec


@jax.jit
def softmax(x: jax.Array) -> jax.Array:
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def _gpu_fusions(case: registry.Case) -> int | tuple[int, int]:
    if case["cols"] <= 4096:
        return 1
    return (1, 2) if case["cols"] <= 32768 else (1, 5)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="xla", fn=softmax, baseline=True,
    description="jax.nn.softmax, compiled by XLA",
    # XLA:GPU fuses the whole softmax into one Triton fusion (it runs at the copy bandwidth
    # on an H100), with a second fusion in front for rows wider than 4096 (seen on an H100,
    # jax 0.11.2). Past 32768 columns each row reduction (the max, the sum) is split in two,
    # partials over column blocks and then their reduction, before the divide: 5 fusions
    # for the vocabulary row 3x50257 (an H200, jax 0.11.2). XLA:CPU into one to seven, by
    # shape and dtype.
    hlo=HloExpectation(cpu=HloRules(fusions=(1, 7), custom_calls=()),
                       gpu=HloRules(fusions=_gpu_fusions, custom_calls=())),
))
