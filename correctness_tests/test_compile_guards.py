"""Compile-level guards, generated from the registry: HLO rules and recompilation.

Every JAX implementation that declares an `HloExpectation` has its forward
compiled for each "cpu" case and checked against its rules for this platform;
every JAX implementation is called twice with new values of the same shapes
and must not compile again. Planted faults show that the guards fail, and
what their messages say.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.core import devices, hlo_rules, registry
from kernels.guards import hlo, recompilation

SMALL_CASE = "f32-37x128"


def _smallest(cases, per_dtype: bool) -> list[registry.Case]:
    """The case with the fewest elements (per dtype, if asked)."""
    smallest: dict[str, registry.Case] = {}
    for case in sorted(cases, key=lambda c: np.prod([n for _, n in c.dims])):
        smallest.setdefault(case.dtype if per_dtype else "", case)
    return list(smallest.values())


def _params(impls, select=lambda impl, cases: cases) -> list:
    machine = devices.this_machine()
    params = []
    for impl in impls:
        for case in select(impl, registry.operation(impl.op).cases_tagged("cpu")):
            reason = devices.case_unavailable_reason(impl, case, machine)
            marks = [pytest.mark.small]
            if machine.has_gpu or impl.requires.gpu:
                marks.append(pytest.mark.gpu)
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            params.append(pytest.param(impl, case, id=f"{impl.id}-{case.id}", marks=marks))
    return params


def _hlo_cases(impl, cases):
    """Every case where fusions are counted; else (Pallas on CPU: the interpreter's loop,
    seconds to compile) the smallest per dtype."""
    rules = impl.hlo.for_platform(hlo.platform())
    return cases if rules is None or rules.fusions is not None else _smallest(cases, True)


def _jax_impls() -> list[registry.Implementation]:
    return [impl for impl in registry.implementations() if impl.framework == "jax"]


@pytest.mark.parametrize(("impl", "case"), _params(hlo.expectations(), _hlo_cases))
def test_hlo_follows_declared_rules(impl, case):
    report = hlo.check(impl, case)
    if report is None:
        pytest.skip(f"{impl.id} declares no HLO rules for {hlo.platform()}")
    assert report.ok, str(report)


# Recompiling is a property of the code path, not of the size: the smallest case (the
# interpreted Pallas calls take seconds each).
@pytest.mark.parametrize(("impl", "case"),
                         _params(_jax_impls(), lambda impl, cases: _smallest(cases, False)))
def test_same_shapes_compile_once(impl, case):
    report = recompilation.check(impl, case)
    assert report.ok, str(report)


def _softmax(case_id: str = SMALL_CASE):
    impl = registry.implementation("softmax", "xla")
    case = next(c for c in registry.operation("softmax").cases if c.id == case_id)
    return impl, case


def _row_by_row(x):
    """A fusion break: the rows normalised one at a time in a loop (lax.map)."""
    return jax.lax.map(lambda row: jax.nn.softmax(row.astype(jnp.float32)), x).astype(x.dtype)


def _transposed(x):
    """Adds copies: softmax over the leading axis of the transpose, transposed back."""
    return jax.nn.softmax(x.astype(jnp.float32).T, axis=0).T.astype(x.dtype)


def _with_barrier(x):
    """A fusion break: an optimization barrier between the exponent and the normalisation."""
    x32 = x.astype(jnp.float32)
    numerator = jax.lax.optimization_barrier(jnp.exp(x32 - jnp.max(x32, -1, keepdims=True)))
    return (numerator / jnp.sum(numerator, -1, keepdims=True)).astype(x.dtype)


def test_planted_fusion_break_fails_with_the_hlo_lines():
    impl, case = _softmax()
    report = hlo.check(impl, case, fn=_row_by_row)
    message = str(report)
    assert not report.ok
    low, high = impl.hlo.for_platform(hlo.platform()).fusion_range(case)
    expected = str(low) if low == high else f"{low} to {high}"
    assert f"fusions: expected {expected}, got {report.fusions}" in message
    # The kernels are quoted as HLO lines, naming the computation they sit in.
    assert " fusion(" in message and "kind=" in message


@pytest.mark.skipif(devices.this_machine().has_gpu,
                    reason="XLA:GPU folds these transposes into its softmax fusion (one fusion, "
                           "no copy: seen on an H100, jax 0.11.2), so there is nothing to catch")
def test_planted_transpose_fails_naming_the_copies():
    impl, case = _softmax()
    message = str(hlo.check(impl, case, fn=_transposed))
    assert "forbidden ops ['copy', 'transpose'] run as kernels of their own" in message
    assert " transpose(" in message or " copy(" in message, message


@pytest.mark.gpu
@pytest.mark.skipif(not devices.this_machine().has_gpu,
                    reason="needs a CUDA GPU: XLA:CPU removes optimization barriers before "
                           "fusion, so a barrier cannot break a CPU fusion")
def test_planted_optimization_barrier_breaks_gpu_fusion():
    impl, case = _softmax()
    report = hlo.check(impl, case, fn=_with_barrier)
    assert not report.ok, f"the barrier did not break fusion: {report}"
    assert "fusions: expected" in str(report)


def test_rules_reject_a_bad_range():
    with pytest.raises(ValueError, match=r"fusions: expected a count or \(min, max\) .* "
                                         r"got \(3, 1\)"):
        hlo_rules.HloRules(fusions=(3, 1))


def _static_scale(x, scale):
    return (jax.nn.softmax(x.astype(jnp.float32)) * scale).astype(x.dtype)


_scaled = jax.jit(_static_scale, static_argnames="scale")


def _new_jit_per_call(x):
    """A fresh jax.jit (of a new lambda) built at every call: nothing is ever cached."""
    rows = x.shape[0]
    return jax.jit(lambda v: jax.nn.softmax(v) * (rows / rows))(x)


def test_planted_static_argument_fails_naming_it():
    impl, case = _softmax()

    def data_dependent(x):
        # Rounded max |x|, a different Python float for every batch of values.
        return _scaled(x, scale=round(float(jnp.max(jnp.abs(x))), 3))

    # Forward only: a Python float() of the values cannot be taken under jax.vjp.
    report = recompilation.check(impl, case, fn=data_dependent, directions=("fwd",))
    assert not report.ok
    message = str(report)
    # Named by comparing the arguments the retraced function was called with.
    assert "caused by: scale of _static_scale" in message, message


def test_planted_new_function_per_call_fails():
    impl, case = _softmax()
    report = recompilation.check(impl, case, fn=_new_jit_per_call)
    assert not report.ok
    assert "re-defined repeatedly" in str(report) or "never seen function" in str(report)
