"""Softmax over the last axis: reference, inputs, work model, tolerance and cases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation

NAME = "softmax"
SUPPORTED_DTYPES = ("f32", "bf16", "f16")
# GPT-2's vocabulary: the width of the rows softmax meets over a language model's logits.
VOCABULARY = 50257


def reference(x: jax.Array) -> jax.Array:
    """softmax(x) = exp(x - max) / sum(exp(x - max)) over the last axis."""
    shifted = x - jnp.max(x, axis=-1, keepdims=True)
    numerator = jnp.exp(shifted)
    return numerator / jnp.sum(numerator, axis=-1, keepdims=True)


def gradient_magnitude(inputs, y, dy):
    """dx = y * dy - y * sum(y * dy): the two terms' sizes (near one-hot rows cancel them)."""
    return (jnp.abs(y) * (jnp.abs(dy) + jnp.abs(jnp.sum(y * dy, axis=-1, keepdims=True))),)


def validate(x) -> None:
    """Checks every softmax implementation of ours applies before launching."""
    validation.check_array("x", x, min_rank=1, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_nonempty_axis("x", x, -1)


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray]:
    """Normal(0, 1) logits, or scaled by 50 ("large"); "masked" sets ~30% to -inf.

    Masked rows keep at least one finite entry: a row of only -inf has no
    softmax (0/0), and the reference would be NaN there.
    """
    rows, cols = case["rows"], case["cols"]
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    if distribution == "large":
        x *= 50.0
    if case.variant == "masked":
        masked = rng.random((rows, cols)) < 0.3
        masked[np.arange(rows), rng.integers(0, cols, rows)] = False
        x[masked] = -np.inf
    return (x.astype(dtypes.to_numpy(case.dtype)),)


def work(case: registry.Case, direction: str) -> registry.Work:
    """FLOPs and fewest bytes.

    Forward per element: subtract max, exp, add to sum, divide (max compare
    counted too): 5 FLOPs; reads x once, writes y once. Backward
    (dx = y * (dy - sum(y * dy))): multiply, add, subtract, multiply: 4 FLOPs;
    reads y and dy, writes dx.
    """
    elements = case["rows"] * case["cols"]
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    if direction == "fwd":
        return registry.Work(flops=5.0 * elements, bytes=2.0 * elements * itemsize)
    registry.check_direction(direction)
    return registry.Work(flops=4.0 * elements, bytes=3.0 * elements * itemsize)


def tolerance(case: registry.Case) -> float:
    return checking.relative_tolerance(case.dtype, case["cols"])


def _case(dtype: str, rows: int, cols: int, *tags: str, variant: str = "") -> registry.Case:
    return registry.make_case(NAME, dtype, {"rows": rows, "cols": cols}, variant=variant, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    cases = []
    for dtype in SUPPORTED_DTYPES:
        # Small and awkward: interpretable on CPU, and rerun compiled on the GPU.
        # 4097 columns takes two column blocks (the online path); 37 rows is not a
        # multiple of any row block; 1 row, 1 column, 3 x 5.
        for rows, cols in [(1, 1000), (3, 5), (37, 128), (5, 4097), (7, 1)]:
            cases.append(_case(dtype, rows, cols, "cpu"))
        # Tracked by asv on CPU machines ("bench"), float32 only to keep runs short.
        cases.append(_case(dtype, 64, 1000, "cpu", *(["bench"] if dtype == "f32" else [])))
        cases.append(_case(dtype, 6, 300, "cpu", variant="masked"))
        cases.append(_case(dtype, 3, 4097, "cpu", variant="masked"))
        if dtype == "f32":
            # A vocabulary-wide row (GPT-2's 50257 tokens: odd, so every row starts off a
            # 16-byte boundary and ends in a ragged block), the CPU analogue of the GPU's
            # vocabulary case below; about 2 s per interpreted implementation.
            cases.append(_case(dtype, 3, VOCABULARY, "cpu"))
        # Real sizes: a short-row batch, a square, a long batch, and rows too wide
        # for one block; asv tracks ("bench") three of them in f32 and bf16.
        for rows, cols in [(256, 1024), (4096, 4096), (32768, 4096), (4096, 32768)]:
            tracked = dtype != "f16" and (rows, cols) != (4096, 4096)
            cases.append(_case(dtype, rows, cols, "gpu", *(["bench"] if tracked else [])))
        cases.append(_case(dtype, 8192, 8191, "gpu", variant="masked"))
    # Logits over a vocabulary (issue 51): 2048 rows of 50257 float32 are 412 MB, far past
    # any L2; tracked by asv and timed by the perf items like the other bench cases (its
    # H100 floors are the 4096x32768 case's by analogy: no H100 has measured it).
    cases.append(_case("f32", 2048, VOCABULARY, "gpu", "bench"))
    return tuple(cases)


BAD_INPUTS = (
    registry.BadInput("rank0", lambda: (np.float32(1.0),), ValueError, r"x: expected rank >= 1"),
    registry.BadInput("int32", lambda: (np.ones((4, 8), np.int32),), TypeError,
                      r"x: expected dtype in \(float32, bfloat16, float16\), got int32"),
    registry.BadInput("f64", lambda: (np.ones((4, 8), np.float64),), TypeError,
                      r"x: expected dtype .* got float64"),
    registry.BadInput("empty-axis", lambda: (np.ones((4, 0), np.float32),), ValueError,
                      r"x: expected a non-empty axis -1, got shape \(4, 0\)"),
    registry.BadInput("not-an-array", lambda: ([[1.0, 2.0]],), TypeError,
                      r"x: expected an array, got list"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="softmax over the last axis",
    input_names=("x",),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    bad_inputs=BAD_INPUTS,
    gradient_magnitude=gradient_magnitude,
))
