"""Tolerance calibration: errors planted at 3x and 10x the tolerance of each dtype fail, a tenth
of it passes, and the tolerances themselves are pinned, so loosening one is a visible decision.

The pinned values were checked by hand against the rule in `checking.relative_tolerance`:
eps(dtype) + 2 eps(f32) sqrt(n); for f32 and n = 1000, 1.19e-7 + 2 * 1.19e-7 * 31.6 = 7.66e-6.
Each operation's tolerance adds its own terms (chained layers, and for operations with matrix
products the rounding of the implementation's precision: TF32's), pinned per dtype on its
first CPU case, and at TF32 for those with matrix products. The observed errors of our
kernels, with their margins below these tolerances, are printed by `python -m kernels check
--tags cpu` (column "margin").
"""

from __future__ import annotations

import numpy as np
import pytest

from correctness_tests import fakes
from kernels.core import checking, dtypes, registry

# (dtype, reduction length) -> relative tolerance.
PINNED = {
    ("f32", 1): 3.576e-07, ("f32", 1000): 7.659e-06, ("f32", 4096): 1.538e-05,
    ("bf16", 1): 7.813e-03, ("bf16", 1000): 7.820e-03, ("bf16", 4096): 7.828e-03,
    ("f16", 1): 9.768e-04, ("f16", 1000): 9.841e-04, ("f16", 4096): 9.918e-04,
}

# operation -> {dtype: tolerance of its first CPU case in that dtype, computed in the dtype's
# own precision (FP32 for f32)}.
PINNED_OPS = {
    "attention": {"f32": 3.268e-05, "bf16": 1.566e-02, "f16": 1.986e-03},
    "matmul": {"f32": 2.027e-06, "bf16": 7.814e-03, "f16": 9.785e-04},
    "mlp": {"f32": 8.106e-06, "bf16": 3.126e-02},
    "moe": {"f32": 4.292e-06},
    "softmax": {"f32": 7.659e-06, "bf16": 7.820e-03, "f16": 9.841e-04},
    "row_sum": {"f32": 7.659e-06, "bf16": 7.820e-03, "f16": 9.841e-04},
    "sharded_matmul": {"f32": 1.771e-06},
    "sharded_vmap": {"f32": 2.146e-06},
    "transformer_block": {"f32": 5.872e-06},
}
# operation with matrix products -> tolerance of its first f32 CPU case computed in TF32 (XLA's
# and Triton's default on a GPU, docs/precision.md): what those implementations are held to
# there. The ones that were TF32's before precisions were declared are unchanged.
PINNED_TF32 = {"attention": 2.510e-01, "matmul": 9.786e-04, "mlp": 3.914e-03,
               "moe": 3.911e-03, "sharded_matmul": 9.783e-04, "sharded_vmap": 1.953e-02,
               "transformer_block": 3.912e-03}


@pytest.mark.parametrize("dtype,length", sorted(PINNED), ids=lambda v: str(v))
def test_relative_tolerance_is_pinned(dtype, length):
    assert checking.relative_tolerance(dtype, length) == pytest.approx(PINNED[dtype, length],
                                                                        rel=1e-3)


def _first_cases(op: registry.Operation) -> dict[str, registry.Case]:
    first: dict[str, registry.Case] = {}
    for case in op.cases_tagged("cpu"):
        first.setdefault(case.dtype, case)
    return first


def test_every_operations_tolerance_is_pinned():
    found = {op.name: {dtype: op.tolerance(case) for dtype, case in _first_cases(op).items()}
             for op in registry.operations()}
    assert set(found) == set(PINNED_OPS)
    for name, by_dtype in found.items():
        assert set(by_dtype) == set(PINNED_OPS[name]), name
        for dtype, tolerance in by_dtype.items():
            assert tolerance == pytest.approx(PINNED_OPS[name][dtype], rel=1e-3), (name, dtype)


def test_every_operations_tf32_tolerance_is_pinned():
    found = {op.name: op.tolerance_at(_first_cases(op)["f32"], "TF32")
             for op in registry.operations() if op.dots}
    assert found == pytest.approx(PINNED_TF32, rel=1e-3)


def _planted(expected: np.ndarray, factor: float, tolerance: float, dtype: str,
             seed: int = 0) -> np.ndarray:
    """`expected` plus noise whose norm is `factor` x `tolerance` x its norm, in `dtype`."""
    noise = np.random.default_rng(seed).standard_normal(expected.shape).astype(np.float32)
    noise *= factor * tolerance * np.linalg.norm(expected) / np.linalg.norm(noise)
    return (expected + noise).astype(dtypes.to_numpy(dtype))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("factor", [3.0, 10.0])
def test_planted_error_above_the_tolerance_fails(dtype, factor):
    """Against the pinned tolerance, so a loosened tolerance lets the plant through and fails."""
    length = 1000
    expected = np.random.default_rng(1).standard_normal((8, length)).astype(np.float32)
    tolerance = PINNED[dtype, length]
    actual = _planted(expected, factor, tolerance, dtype)
    with pytest.raises(checking.CheckFailure, match=r"rel \d"):
        checking.compare(actual, expected, tolerance=checking.relative_tolerance(dtype, length),
                         name=f"planted-{factor}x-{dtype}")


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_planted_error_below_the_tolerance_passes(dtype):
    """A tenth of the tolerance, plus the rounding to the dtype, passes: the plants above fail
    because of their size, not because any error fails."""
    length = 1000
    expected = np.random.default_rng(1).standard_normal((8, length)).astype(np.float32)
    tolerance = checking.relative_tolerance(dtype, length)
    result = checking.compare(_planted(expected, 0.1, PINNED[dtype, length], dtype), expected,
                              tolerance=tolerance, name=f"planted-0.1x-{dtype}")
    assert result.relative_error < tolerance


PLANTED_OPS = ("softmax", "matmul", "row_sum")


@pytest.mark.parametrize("op_name", PLANTED_OPS)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("factor", [3.0, 10.0])
def test_planted_error_through_the_harness_fails(op_name, dtype, factor):
    """An implementation returning the reference plus an error of `factor` x the pinned
    tolerance: `checking.check` (the path every kernel test takes) must fail it."""
    import jax.numpy as jnp

    op = registry.operation(op_name)
    case = _first_cases(op)[dtype]
    inputs = checking.make_inputs(op, case, 0, "normal")
    expected, _, _ = checking.reference_outputs(op, case, inputs, None)
    planted = jnp.asarray(_planted(expected, factor, PINNED_OPS[op_name][dtype], dtype))

    def fn(*args, **kwargs):
        return planted

    impl = registry.Implementation(op=op_name, name=f"planted-{factor:g}x", fn=fn)
    with pytest.raises(checking.CheckFailure, match="output"):
        checking.check(impl, case, gradients=False)


# Gradients are judged against the output's tolerance times this factor (registry.Operation's
# default, which every operation keeps); pinned like the tolerances, so the gradients'
# tolerance cannot loosen through the factor, nor at the call in `checking.check`.
GRADIENT_FACTOR = 4.0


def test_every_operations_gradient_factor_is_pinned():
    assert {op.name: op.gradient_tolerance_factor for op in registry.operations()} == \
        dict.fromkeys(PINNED_OPS, GRADIENT_FACTOR)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("factor", [3.0, 0.3])
def test_gradient_error_is_judged_against_the_pinned_gradient_tolerance(dtype, factor):
    """Through `checking.check`: a gradient off by 3x the pinned gradient tolerance fails on
    dx, one off by 0.3x of it passes (so the failure is the error's size, not any error)."""
    op = registry.operation("softmax")
    case = _first_cases(op)[dtype]
    gradient_tolerance = PINNED_OPS["softmax"][dtype] * GRADIENT_FACTOR
    impl = registry.Implementation(op="softmax", name=f"dx-off-{factor:g}x",
                                   fn=fakes.softmax_with_scaled_gradient(
                                       1.0 + factor * gradient_tolerance))
    if factor > 1:
        with pytest.raises(checking.CheckFailure, match=r" dx: rel \d"):
            checking.check(impl, case)
    else:
        output, dx = checking.check(impl, case)
        assert dx.name.endswith(" dx")
        assert dx.tolerance == pytest.approx(gradient_tolerance, rel=1e-3)
        assert factor * gradient_tolerance / 2 < dx.relative_error < gradient_tolerance
