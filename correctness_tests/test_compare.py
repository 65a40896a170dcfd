"""`checking.compare` case by case, on small numpy arrays with known answers (no JAX): each test
pins a behaviour a mutant of compare changed without any other test noticing."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.core.checking import CheckFailure, compare


def test_float64_is_compared_in_float64_whichever_side_is():
    """An error of 1e-9 vanishes in float32; with either side float64 it must be seen."""
    e32 = np.linspace(1.0, 2.0, 16, dtype=np.float32)
    off = e32.astype(np.float64) * (1 + 1e-9)
    with pytest.raises(CheckFailure):
        compare(off, e32, tolerance=1e-12, name="actual f64")
    with pytest.raises(CheckFailure):
        compare(e32, off, tolerance=1e-12, name="expected f64")


def test_nan_output_is_reported_with_count_and_first_position():
    expected = np.ones((2, 4), np.float32)
    actual = expected.copy()
    actual[0, 1] = actual[1, 3] = np.nan
    actual[1, 0] = np.inf
    with pytest.raises(CheckFailure, match=r"^out: 3 of 8 elements are NaN/inf where the "
                                           r"reference is finite \(first at \(0, 1\): nan\)$"):
        compare(actual, expected, tolerance=0.1, name="out")


def test_nan_reference_needs_nan_output():
    expected = np.array([1.0, np.nan, 2.0], np.float32)
    compare(np.array([1.0, np.nan, 2.0], np.float32), expected, tolerance=0.1, name="ok")
    with pytest.raises(CheckFailure, match=r"reference is nan at \(1,\), got 5.0"):
        compare(np.array([1.0, 5.0, 2.0], np.float32), expected, tolerance=0.1, name="out")


def test_magnitude_applies_to_the_finite_entries_only():
    """With -inf in the reference, the magnitude is taken at the same finite entries (2-D)."""
    expected = np.array([[1.0, -np.inf], [0.001, 2.0]], np.float32)
    magnitude = np.array([[1.0, 1.0], [1.0, 2.0]], np.float32)
    actual = np.array([[1.0, -np.inf], [0.002, 2.0]], np.float32)
    compare(actual, expected, tolerance=0.01, name="masked", magnitude=magnitude)
    finite = np.array([[1.0, 3.0], [0.001, 2.0]], np.float32)
    compare(finite + np.array([[0, 0], [0.001, 0]], np.float32), finite, tolerance=0.01,
            name="finite", magnitude=magnitude)


def test_empty_arrays_compare_equal():
    result = compare(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), tolerance=0.1,
                     name="empty")
    assert result.relative_error == 0 and result.max_error == 0 and result.name == "empty"
    assert result.tolerance == 0.1  # what it was judged against, as for any other result


def test_zeros_are_fine_where_the_reference_cancels_below_its_terms():
    """The reference 0.5 is the cancelled sum of terms of size 100: all zeros is within 1%."""
    expected = np.full(8, 0.5, np.float32)
    compare(np.zeros(8, np.float32), expected, tolerance=0.01, name="cancelled",
            magnitude=np.full(8, 100.0, np.float32))
    compare(np.full(8, 0.25, np.float32), expected + np.arange(8, dtype=np.float32) * 0.01,
            tolerance=0.01, name="constant", magnitude=np.full(8, 100.0, np.float32))


def test_degenerate_outputs_are_named():
    expected = np.array([0.0, 1.0], np.float32)
    with pytest.raises(CheckFailure, match=r"^out: output is all zeros; the reference is not$"):
        compare(np.zeros(2, np.float32), np.array([1.0, 2.0], np.float32), tolerance=0.1,
                name="out")
    with pytest.raises(CheckFailure, match=r"^out: output is constant \(0.5\); the reference "
                                           r"is not$"):
        compare(np.array([0.5, 0.5], np.float32), expected, tolerance=0.1, name="out")


def test_one_element_far_below_fails_by_its_max_error_and_names_where():
    """The norm of the error is within tolerance; the single worst element (negative, not at
    index 0) is not, and the message points at it."""
    expected = np.ones((10, 10), np.float32)
    actual = expected.copy()
    actual[3, 7] = 0.5
    with pytest.raises(CheckFailure) as caught:
        compare(actual, expected, tolerance=0.1, name="out")
    message = str(caught.value)
    assert message.startswith("out: rel 5.00e-02, max 5.00e-01 (tol 1.0e-01); worst at (3, 7): "
                              "got 0.5, expected 1.0"), message


def test_many_small_errors_fail_by_their_norm_against_a_zero_reference():
    with pytest.raises(CheckFailure, match=r"rel 2.00e-01, max 5.00e-02"):
        compare(np.full(16, 0.05, np.float32), np.zeros(16, np.float32), tolerance=0.1,
                name="out")


def test_worst_position_skips_masked_entries():
    expected = np.array([[-np.inf, 1.0], [1.0, 1.0]], np.float32)
    actual = np.array([[-np.inf, 1.0], [1.0, 3.0]], np.float32)
    with pytest.raises(CheckFailure, match=r"worst at \(1, 1\): got 3.0, expected 1.0"):
        compare(actual, expected, tolerance=0.1, name="out")


def test_result_carries_its_name_and_numbers():
    result = compare(np.array([1.0, 2.02], np.float32), np.array([1.0, 2.0], np.float32),
                     tolerance=0.1, name="out")
    assert result.name == "out" and result.tolerance == 0.1
    assert result.max_error == pytest.approx(0.01, rel=1e-3)
    assert str(result) == "out: rel 8.94e-03, max 1.00e-02 (tol 1.0e-01)"


def test_values_in_messages_print_as_their_dtype_does():
    """float32 values print as float32 ("0.1", not its float64 expansion); float64 as float64."""
    expected = np.ones(4, np.float32)
    actual = np.array([1.0, 1.0, 0.1, 1.0], np.float32)
    with pytest.raises(CheckFailure, match=r"worst at \(2,\): got 0\.1, expected 1\.0$"):
        compare(actual, expected, tolerance=0.01, name="f32")
    with pytest.raises(CheckFailure, match=r"got 0\.10000000149011612, expected 1\.0$"):
        compare(actual.astype(np.float64), expected, tolerance=0.01, name="f64")


@pytest.mark.parametrize("scale", [1e-25, 1.0, 1e20])
def test_an_error_is_judged_alike_at_any_scale_float32_holds(scale):
    """Relative errors do not depend on units: a reference of one large entry among zeros,
    met by a result off by 5% of it everywhere (19% in norm, 5% at most), fails by its norm
    whether the values are near 1e-25, 1 or 1e20 (float32 squares of these underflow to 0
    or overflow, which once made the norm 0 and passed the tiny one), and the exact result
    passes."""
    expected = np.zeros(16, np.float32)
    expected[0] = scale
    actual = np.full(16, 0.05 * scale, np.float32)
    actual[0] = scale
    with pytest.raises(CheckFailure, match=r"^out: rel 1\.94e-01, max 5\.00e-02 "):
        compare(actual, expected, tolerance=0.1, name="out")
    assert compare(expected.copy(), expected, tolerance=0.1, name="out").relative_error == 0


def test_an_error_of_exactly_the_tolerance_passes():
    """The tolerance is the largest error allowed, in norm and in max: a result off by exactly
    it passes (every number here is exact in binary), and so does an all-zero result whose
    reference is exactly the tolerance of its terms' size: the degenerate-output guard
    refuses only what stands clear of the error rule, it does not tighten it."""
    expected = np.ones(4, np.float32)
    result = compare(expected * np.float32(1.5), expected, tolerance=0.5, name="edge")
    assert (result.relative_error, result.max_error) == (0.5, 0.5)
    zeros = compare(np.zeros(4, np.float32), np.full(4, 0.25, np.float32), tolerance=0.25,
                    name="zeros", magnitude=np.ones(4, np.float32))
    assert (zeros.relative_error, zeros.max_error) == (0.25, 0.25)


def test_a_reference_with_no_finite_entry_passes_when_reproduced():
    """A fully masked result (every entry -inf, as a row of attention scores can be) compared
    with itself: nothing finite to be off by, so it passes with no error, and a finite value
    in its place still fails."""
    expected = np.full((2, 3), -np.inf, np.float32)
    result = compare(expected.copy(), expected, tolerance=1e-6, name="masked")
    assert (result.relative_error, result.max_error) == (0.0, 0.0)
    actual = expected.copy()
    actual[1, 2] = 0.0
    with pytest.raises(CheckFailure, match=r"reference is -inf at \(1, 2\), got 0\.0"):
        compare(actual, expected, tolerance=1e-6, name="masked")


def test_masked_entries_do_not_hide_a_constant_output():
    """A constant output is named as such where the reference has masked (-inf) entries that
    the output reproduces: the spreads are taken over the finite entries alone."""
    expected = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    expected[:, -1] = -np.inf
    actual = np.full_like(expected, 0.25)
    actual[:, -1] = -np.inf
    with pytest.raises(CheckFailure, match=r"^out: output is constant \(0\.25\); the reference "
                                           r"is not$"):
        compare(actual, expected, tolerance=1e-3, name="out")
