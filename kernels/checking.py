"""Correctness harness: one comparison for every framework, hard to fool.

`check(impl, case, seed, distribution)` makes fresh inputs, runs the
implementation with NaN-poisoned output buffers, compares the output and the
gradients (vector-Jacobian product with a random cotangent) against the
operation's jnp reference computed in float32, and checks that the inputs were
not modified. `compare` is the single comparison: relative error in norm and
in max-abs, plus guards against outputs that are NaN, all zeros or constant
where the reference is not (kernels returning zeros have passed absolute
tolerances in public harnesses).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kernels import dtypes, frameworks, registry


def relative_tolerance(dtype: str, reduction_length: int, accumulator: str = "f32") -> float:
    """Relative error allowed for a result in `dtype` reduced over `reduction_length` terms.

    One rounding of the output (eps of its dtype) plus accumulation error that
    grows like sqrt(length) in the accumulator's precision (random-walk rounding).
    """
    return dtypes.eps(dtype) + 2.0 * dtypes.eps(accumulator) * math.sqrt(reduction_length)


class CheckFailure(AssertionError):
    """A result that does not match its reference; the message says how."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    name: str
    relative_error: float  # ||out - ref|| / ||ref|| over the finite reference entries
    max_error: float  # max |out - ref| / max |ref|
    tolerance: float

    def __str__(self) -> str:
        return (f"{self.name}: rel {self.relative_error:.2e}, max {self.max_error:.2e} "
                f"(tol {self.tolerance:.1e})")


def compare(actual: np.ndarray, expected: np.ndarray, *, tolerance: float, name: str,
            magnitude: np.ndarray | None = None) -> Comparison:
    """Compare `actual` with `expected`; raise CheckFailure on mismatch.

    Errors are relative to `expected`, or to `magnitude` (the size of the terms
    that were summed into `expected`, same shape) where that is larger: a result
    that cancels to almost nothing cannot be expected to keep relative accuracy.
    Arithmetic is float32 (exact for 16-bit and float32 results; float64 stays
    float64), which keeps a 10^8-element comparison to about a second.
    """
    work_dtype = np.float64 if np.float64 in (np.asarray(actual).dtype,
                                              np.asarray(expected).dtype) else np.float32
    actual = np.asarray(actual).astype(work_dtype, copy=False)
    expected = np.asarray(expected).astype(work_dtype, copy=False)
    if actual.shape != expected.shape:
        raise CheckFailure(f"{name}: shape {actual.shape}, expected {expected.shape}")

    finite = np.isfinite(expected)
    all_finite = bool(finite.all())
    bad = ~np.isfinite(actual) if all_finite else finite & ~np.isfinite(actual)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CheckFailure(f"{name}: {int(bad.sum())} of {bad.size} elements are NaN/inf where the "
                           f"reference is finite (first at {first}: {actual[first]})")
    if not all_finite:
        mismatched = ~finite & ~((actual == expected) | (np.isnan(actual) & np.isnan(expected)))
        if mismatched.any():
            first = tuple(int(i) for i in np.argwhere(mismatched)[0])
            raise CheckFailure(
                f"{name}: reference is {expected[first]} at {first}, got {actual[first]}")

    a, e = (actual, expected) if all_finite else (actual[finite], expected[finite])
    size = np.abs(e)
    if magnitude is not None:
        magnitude = np.asarray(magnitude).astype(work_dtype, copy=False)
        np.maximum(size, np.abs(magnitude if all_finite else magnitude[finite]), out=size)
    peak = float(size.max()) if e.size else 0.0
    # Degenerate outputs, judged only where the reference stands clear of rounding.
    if e.size and float(np.abs(e).max()) > tolerance * peak and not a.any():
        raise CheckFailure(f"{name}: output is all zeros; the reference is not")
    if e.size > 1 and float(np.ptp(e)) > tolerance * peak and float(np.ptp(a)) == 0:
        raise CheckFailure(f"{name}: output is constant ({a.flat[0]}); the reference is not")

    scale = max(_norm(e), _norm(size))
    diff = np.subtract(a, e)
    np.abs(diff, out=diff)
    relative = _norm(diff) / (scale or 1.0)
    worst_flat = int(diff.argmax()) if diff.size else 0
    max_error = (float(diff.flat[worst_flat]) if diff.size else 0.0) / (peak or 1.0)
    result = Comparison(name, relative, max_error, tolerance)
    if not (relative <= tolerance and max_error <= tolerance):
        worst = tuple(int(i) for i in (np.unravel_index(worst_flat, expected.shape) if all_finite
                                       else np.argwhere(finite)[worst_flat]))
        raise CheckFailure(f"{result}; worst at {worst}: got {actual[worst]}, "
                           f"expected {expected[worst]}")
    return result


def _norm(x: np.ndarray) -> float:
    """Euclidean norm, accumulated in float64 so 10^8 float32 squares lose nothing."""
    flat = x.reshape(-1)
    return float(np.sqrt(sum(np.dot(chunk, chunk).astype(np.float64)
                             for chunk in np.array_split(flat, max(1, flat.size // 2**20)))))


def reference_outputs(op: registry.Operation, case: registry.Case, inputs: tuple[np.ndarray, ...],
                      cotangent: np.ndarray | None):
    """Reference output, input gradients for `cotangent` and their term magnitudes, in float32."""
    import jax
    import jax.numpy as jnp

    upcast = [jnp.asarray(x, dtype=jnp.float32) for x in inputs]
    if cotangent is None:
        return np.asarray(op.reference(*upcast, **case.kwargs)), None, None
    out, pullback = jax.vjp(lambda *a: op.reference(*a, **case.kwargs), *upcast)
    cotangent = jnp.asarray(cotangent, dtype=jnp.float32)
    grads = tuple(np.asarray(g) for g in pullback(cotangent))
    magnitudes = (tuple(np.asarray(m) for m in op.gradient_magnitude(
        upcast, out, cotangent, **case.kwargs))
                  if op.gradient_magnitude else (None,) * len(grads))
    return np.asarray(out), grads, magnitudes


def make_inputs(op: registry.Operation, case: registry.Case, seed: int,
                distribution: str) -> tuple[np.ndarray, ...]:
    if distribution not in op.distributions:
        raise ValueError(f"distribution: expected one of {op.distributions}, got {distribution!r}")
    rng = np.random.default_rng(seed)
    inputs = op.make_inputs(case, rng, distribution)
    expected_dtype = dtypes.to_numpy(case.dtype)
    for name, x in zip(op.input_names, inputs, strict=True):
        if x.dtype != expected_dtype:
            raise TypeError(f"{op.name}.make_inputs: {name} has dtype {x.dtype}, case wants "
                            f"{expected_dtype}")
        if x.size and not np.any(x != 0):
            raise ValueError(f"{op.name}.make_inputs: {name} is all zeros; inputs must not be")
    return inputs


def check(impl: registry.Implementation, case: registry.Case, *, seed: int = 0,
          distribution: str = "normal", gradients: bool = True) -> list[Comparison]:
    """Run `impl` on fresh inputs for `case` and compare with the reference; raise on mismatch."""
    op = registry.operation(impl.op)
    fw = frameworks.framework(impl.framework)
    inputs = make_inputs(op, case, seed, distribution)
    with_grad = gradients and op.differentiable and impl.differentiable
    label = f"{impl.id}[{case.id}, {distribution}, seed {seed}]"

    out_example_rng = np.random.default_rng(seed + 1_000_003)
    args = impl.place(case, fw.from_numpy(inputs))
    with frameworks.poisoned_outputs():
        out = fw.synchronize(impl.fn(*args, **case.kwargs))
    out_np = fw.to_numpy(out)
    if dtypes.short_name(out_np.dtype) != case.dtype:
        raise CheckFailure(f"{label} output: dtype {out_np.dtype}, expected {case.dtype}")

    cotangent = None
    if with_grad:
        # Round the cotangent to the case dtype so kernel and reference see the same values.
        cotangent = out_example_rng.standard_normal(out_np.shape).astype(
            dtypes.to_numpy(case.dtype))
    ref_out, ref_grads, magnitudes = reference_outputs(op, case, inputs, cotangent)

    tol = op.tolerance(case)
    results = [compare(out_np, ref_out, tolerance=tol, name=f"{label} output")]
    for name, before, after in zip(op.input_names, inputs, args, strict=True):
        if not np.array_equal(before, fw.to_numpy(after), equal_nan=True):
            raise CheckFailure(f"{label}: input {name} was modified by the call")

    if with_grad:
        with frameworks.poisoned_outputs():
            _, grads = fw.vjp(impl.fn, impl.place(case, fw.from_numpy(inputs)), cotangent,
                              case.kwargs)
            grads = fw.synchronize(grads)
        for name, grad, ref_grad, magnitude in zip(op.input_names, grads, ref_grads, magnitudes,
                                                   strict=True):
            results.append(compare(fw.to_numpy(grad), ref_grad, magnitude=magnitude,
                                   tolerance=tol * op.gradient_tolerance_factor,
                                   name=f"{label} d{name}"))
    return results
