"""Row sum over the last axis: reference, inputs, work model, tolerance and cases.

A bandwidth-bound reduction: every element is read once and a row of n adds
to one number, so the speed of light is the device's read bandwidth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation
from kernels.ops.softmax import spec as softmax_spec

NAME = "row_sum"
SUPPORTED_DTYPES = ("f32", "bf16", "f16")


def reference(x: jax.Array) -> jax.Array:
    """y[..., i] = sum_j x[..., i, j]: the last axis summed."""
    return jnp.sum(x, axis=-1)


def validate(x) -> None:
    """Checks every row_sum implementation of ours applies before launching."""
    validation.check_array("x", x, min_rank=1, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_nonempty_axis("x", x, -1)


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray]:
    """Normal(0, 1) entries, or scaled by 50 ("large"; float16 sums stay below its 65504)."""
    x = rng.standard_normal((case["rows"], case["cols"]), dtype=np.float32)
    if distribution == "large":
        x *= 50.0
    return (x.astype(dtypes.to_numpy(case.dtype)),)


def work(case: registry.Case, direction: str) -> registry.Work:
    """FLOPs and fewest bytes.

    Forward: one add per element; reads x, writes one value per row. Backward
    (dx[i, j] = dy[i]) is a broadcast: no FLOPs; reads dy, writes dx.
    """
    rows, cols = case["rows"], case["cols"]
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    moved = (rows * cols + rows) * itemsize
    if direction == "fwd":
        return registry.Work(flops=float(rows * cols), bytes=float(moved))
    registry.check_direction(direction)
    return registry.Work(flops=0.0, bytes=float(moved))


def tolerance(case: registry.Case) -> float:
    return checking.relative_tolerance(case.dtype, case["cols"])


def _case(dtype: str, rows: int, cols: int, *tags: str) -> registry.Case:
    return registry.make_case(NAME, dtype, {"rows": rows, "cols": cols}, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    cases = []
    for dtype in SUPPORTED_DTYPES:
        # Small and awkward: one row, one column, odd widths (no 16-byte vectors), rows that
        # are not a multiple of any rows-per-block, a row longer than one block's sweep.
        # asv tracks ("bench") 64x1000 in f32 on CPU machines, as softmax's.
        for rows, cols in [(1, 1000), (3, 5), (37, 128), (5, 4097), (7, 1), (64, 1000),
                           (3, 20000)]:
            tracked = dtype == "f32" and (rows, cols) == (64, 1000)
            cases.append(_case(dtype, rows, cols, "cpu", *(["bench"] if tracked else [])))
        # Real sizes: many short rows, a square batch, long rows, an odd width. asv and the
        # perf tests track ("bench") the bandwidth-bound square batch in f32 and bf16, so a
        # slower CUDA row sum fails the gate as a slower CUDA softmax does.
        for rows, cols in [(262144, 256), (32768, 4096), (4096, 32768), (8192, 8191)]:
            tracked = dtype in ("f32", "bf16") and (rows, cols) == (32768, 4096)
            cases.append(_case(dtype, rows, cols, "gpu", *(["bench"] if tracked else [])))
    return tuple(cases)


# Same checks as softmax (any rank >= 1, float dtypes, a non-empty last axis), so the
# same bad calls.
BAD_INPUTS = softmax_spec.BAD_INPUTS

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="sum over the last axis",
    input_names=("x",),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    bad_inputs=BAD_INPUTS,
))
