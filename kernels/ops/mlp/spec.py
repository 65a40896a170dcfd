"""Residual MLP stack: reference, inputs, work model, tolerance and cases.

x_{l+1} = x_l + gelu(x_l @ w1[l]) @ w2[l] for l < layers, gelu in its tanh form.
Several layers make the backward's saved activations add up, which is what
rematerialisation (`jax.checkpoint`) trades for recomputation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation

NAME = "mlp"
SUPPORTED_DTYPES = ("f32", "bf16")


def block(x: jax.Array, w1: jax.Array, w2: jax.Array, **dot) -> jax.Array:
    """One residual block, in x's dtype; `dot` goes to both products (precision, ...)."""
    hidden = jax.nn.gelu(jnp.matmul(x, w1, **dot), approximate=True)
    return x + jnp.matmul(hidden, w2, **dot)


def reference(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    """The layers in order at full float32 precision."""
    for layer in range(w1.shape[0]):
        x = block(x, w1[layer], w2[layer], precision=jax.lax.Precision.HIGHEST)
    return x


def validate(x, w1, w2) -> None:
    """x: (batch, d_model); w1: (layers, d_model, d_ff); w2: (layers, d_ff, d_model)."""
    validation.check_array("x", x, rank=2, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_array("w1", w1, rank=3, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_array("w2", w2, rank=3, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_same_dtype(x=x, w1=w1, w2=w2)
    layers, d_model, d_ff = w1.shape
    if d_model != x.shape[1]:
        raise ValueError(f"w1: expected (layers, {x.shape[1]}, d_ff) to match x's d_model, "
                         f"got shape {tuple(w1.shape)}")
    if tuple(w2.shape) != (layers, d_ff, d_model):
        raise ValueError(f"w2: expected shape {(layers, d_ff, d_model)} to match w1 "
                         f"{tuple(w1.shape)}, got {tuple(w2.shape)}")


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normal x; weights scaled by 1/sqrt(fan-in) so every layer keeps O(1) activations
    ("large": x times 50)."""
    batch, d_model, d_ff, layers = case["batch"], case["d_model"], case["d_ff"], case["layers"]
    dtype = dtypes.to_numpy(case.dtype)
    x = rng.standard_normal((batch, d_model), dtype=np.float32)
    if distribution == "large":
        x *= 50.0
    w1 = rng.standard_normal((layers, d_model, d_ff), dtype=np.float32) / np.sqrt(d_model)
    w2 = rng.standard_normal((layers, d_ff, d_model), dtype=np.float32) / np.sqrt(d_ff)
    return x.astype(dtype), w1.astype(dtype), w2.astype(dtype)


def work(case: registry.Case, direction: str) -> registry.Work:
    """Two products per layer, 2 * batch * d_model * d_ff FLOPs each; the backward's four
    (dx and dW for each) are twice that (recomputation by remat not counted).

    Bytes: x, the weights and the output once (fwd); x, weights, dy in and dx, dweights
    out (bwd).
    """
    batch, d_model, d_ff, layers = case["batch"], case["d_model"], case["d_ff"], case["layers"]
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    flops = layers * 2 * (2.0 * batch * d_model * d_ff)
    weights = 2.0 * layers * d_model * d_ff
    if direction == "fwd":
        return registry.Work(flops=flops, bytes=(2.0 * batch * d_model + weights) * itemsize)
    registry.check_direction(direction)
    return registry.Work(flops=2 * flops,
                         bytes=(4.0 * batch * d_model + 2 * weights) * itemsize)


def tolerance(case: registry.Case, *, rounding: float = 0.0) -> float:
    """Each layer rounds its two products and its activations; `rounding`: the relative
    rounding of float32 operands by the implementation's precision (TF32: 2^-11), twice per
    product, as in the matmul operation."""
    per_layer = checking.relative_tolerance(case.dtype, case["d_ff"]) + 2.0 * rounding
    return min(2.0 * case["layers"] * per_layer, 0.04)


def _case(dtype: str, batch: int, d_model: int, d_ff: int, layers: int,
          *tags: str) -> registry.Case:
    return registry.make_case(NAME, dtype, {"batch": batch, "d_model": d_model, "d_ff": d_ff,
                                            "layers": layers}, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    cases = []
    for dtype in SUPPORTED_DTYPES:
        # Small and awkward: an odd batch, widths that are not powers of two.
        cases.append(_case(dtype, 8, 16, 64, 2, "cpu"))
        cases.append(_case(dtype, 13, 24, 40, 3, "cpu", *(["bench"] if dtype == "f32" else [])))
        # Real sizes: 8 layers of a 1024-wide model with a 4x feed-forward; the remat
        # trade is tracked by asv on both.
        cases.append(_case(dtype, 8192, 1024, 4096, 8, "gpu", "bench"))
    return tuple(cases)


BAD_INPUTS = (
    registry.BadInput("x-rank3", lambda: (np.ones((2, 4, 8), np.float32),
                                          np.ones((1, 8, 16), np.float32),
                                          np.ones((1, 16, 8), np.float32)),
                      ValueError, r"x: expected rank 2, got shape \(2, 4, 8\)"),
    registry.BadInput("w1-width", lambda: (np.ones((4, 8), np.float32),
                                           np.ones((1, 6, 16), np.float32),
                                           np.ones((1, 16, 8), np.float32)),
                      ValueError, r"w1: expected \(layers, 8, d_ff\) .* got shape \(1, 6, 16\)"),
    registry.BadInput("w2-shape", lambda: (np.ones((4, 8), np.float32),
                                           np.ones((2, 8, 16), np.float32),
                                           np.ones((1, 16, 8), np.float32)),
                      ValueError, r"w2: expected shape \(2, 16, 8\) .* got \(1, 16, 8\)"),
    registry.BadInput("mixed-dtypes", lambda: (np.ones((4, 8), np.float32),
                                               np.ones((1, 8, 16), np.float16),
                                               np.ones((1, 16, 8), np.float32)),
                      TypeError, r"w1: expected dtype in .* got float16"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="residual MLP stack x + gelu(x @ w1) @ w2, per layer",
    input_names=("x", "w1", "w2"),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    dots=True,
    bad_inputs=BAD_INPUTS,
))
