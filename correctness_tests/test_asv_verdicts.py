"""asv_tools.verdict and compare at their edges, with exact ratios (powers of two and their
simple fractions): missing results, the gap and noise-floor boundaries, units judged the right
way up, and rows kept or dropped."""

from __future__ import annotations

import importlib.util
import math

import pytest

if importlib.util.find_spec("asv") is None:  # third-party only: see test_test_hygiene
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from correctness_tests import fakes  # noqa: E402
from kernels.bench import asv_tools  # noqa: E402

TRACK = "benchmarks.Softmax.track_tflops"  # higher is better, no samples
TIME = "benchmarks.Softmax.time_device"
GAP = 0.25


def _r(value):
    return asv_tools.Result(value, None, None)


@pytest.mark.parametrize("base,head,word", [
    (None, _r(1.0), "new"), (_r(None), _r(1.0), "new"), (None, None, "n/a"),
    (None, _r(None), "n/a"), (_r(None), None, "n/a"), (_r(1.0), None, "FAILED on head"),
    (_r(1.0), _r(None), "FAILED on head"),
])
def test_missing_results(base, head, word):
    assert asv_tools.verdict(TRACK, base, head) == (None, word)


def test_zero_base_is_an_infinite_ratio():
    ratio, word = asv_tools.verdict(TRACK, _r(0.0), _r(1.0))
    assert ratio == math.inf and word == "better (no samples)"


@pytest.mark.parametrize("head,word", [
    (1.25, "same (no samples)"), (1.25 + 2**-20, "better (no samples)"),
    (0.8, "same (no samples)"), (0.75, "worse (no samples)"),
])
def test_a_change_must_exceed_the_gap(head, word):
    assert asv_tools.verdict(TRACK, _r(1.0), _r(head), GAP)[1] == word


@pytest.mark.parametrize("head,word", [
    (1.0, "same (no samples)"), (1.125, "same (no samples)"),
    (1.25, "same (no samples)"), (1.375, "same (within noise floor)"),
    (0.8, "same (no samples)"), (0.85, "same (no samples)"),
    (0.7, "same (within noise floor)"), (1.75, "better (no samples)"),
])
def test_noise_floor_covers_changes_between_the_gap_and_the_floor(head, word):
    assert asv_tools.verdict(TRACK, _r(1.0), _r(head), GAP, floor=0.5)[1] == word


def test_unknown_tracked_number_counts_lower_as_better():
    assert asv_tools.verdict("benchmarks.X.track_new_thing", _r(1.0), _r(2.0))[1] == \
        "worse (no samples)"
    assert asv_tools.verdict("benchmarks.X.track_peak_memory", _r(2.0), _r(1.0))[1] == \
        "better (no samples)"


def test_time_with_samples_on_one_side_only_judges_by_the_gap():
    base = asv_tools.Result(1.0, [1.0] * 10, {"ci_99_a": 0.9, "ci_99_b": 1.1, "q_25": 1.0,
                                              "q_75": 1.0, "repeat": 10, "number": 1})
    assert asv_tools.verdict(TIME, base, _r(1.5)) == (1.5, "slower")
    assert asv_tools.verdict(TIME, _r(1.5), base) == (1.0 / 1.5, "faster")


def test_compare_keeps_new_and_failed_rows_drops_absent_ones_and_passes_gap_and_floors():
    key, only_base, only_head = ("b.S.track_tflops", ("a",)), ("b.S.track_tflops", ("x",)), \
        ("b.S.track_gbps", ("y",))
    base = {key: _r(1.0), only_base: _r(1.0)}
    head = {key: _r(1.375), only_head: _r(1.0)}
    rows = asv_tools.compare(base, head, min_gap=GAP)
    by_key = {(row.benchmark, row.params): row for row in rows}
    assert by_key[key].verdict == "better (no samples)" and by_key[key].ratio == 1.375
    assert (by_key[key].base, by_key[key].head) == (1.0, 1.375)
    assert by_key[only_base].verdict == "FAILED on head" and by_key[only_base].head is None
    assert by_key[only_base].base == 1.0 and by_key[only_head].head == 1.0
    assert by_key[only_head].verdict == "new" and by_key[only_head].base is None
    wide = asv_tools.compare(base, head, min_gap=0.5)
    assert {(r.benchmark, r.params): r.verdict for r in wide}[key] == "same (no samples)"
    floors = {asv_tools.floor_key(key): 0.5}
    floored = asv_tools.compare(base, head, min_gap=GAP, floors=floors)
    assert {(r.benchmark, r.params): r.verdict for r in floored}[key] == \
        "same (within noise floor)"
    assert asv_tools.compare({key: _r(None)}, {key: None}) == []  # n/a rows are dropped


def test_a_dropped_row_does_not_end_the_table():
    first, second = ("a.S.track_tflops", ()), ("b.S.track_tflops", ())
    rows = asv_tools.compare({first: _r(None), second: _r(1.0)}, {second: _r(1.0)})
    assert [(r.benchmark, r.verdict) for r in rows] == [("b.S.track_tflops", "same (no samples)")]


def test_lower_is_better_judges_a_rise_as_worse():
    assert asv_tools.verdict("b.S.track_peak_memory", _r(1.0), _r(1.5))[1] == "worse (no samples)"


def test_exit_status_by_worst_verdict():
    def row(word):
        return asv_tools.Row(TIME, (), 1.0, 1.0, 1.0, word)

    assert asv_tools.exit_status([]) == 0
    assert asv_tools.exit_status([row("same"), row("faster"), row("too noisy to tell")]) == 0
    assert asv_tools.exit_status([row("same"), row("slower")]) == 1
    # A benchmark that fails on the head fails the gate as a slower one does; 2 stays a
    # user's mistake on the command line.
    assert asv_tools.exit_status([row("same"), row("FAILED on head")]) == 1
    assert asv_tools.exit_status([row("slower"), row("FAILED on head")]) == 1


def test_time_verdict_uses_the_samples_where_both_sides_have_them():
    """Samples that differ clearly (Mann-Whitney) beside 99% intervals that overlap: with the
    samples the change is confirmed; an empty sample list on one side leaves only the
    intervals, which cannot confirm it."""
    wide = {"ci_99_a": 0.5, "ci_99_b": 2.0, "q_25": 1.0, "q_75": 1.0, "repeat": 20,
            "number": 1}
    base = asv_tools.Result(1.0, [1.0 + 1e-3 * i for i in range(20)], wide)
    head = asv_tools.Result(1.5, [1.5 + 1e-3 * i for i in range(20)], wide)
    assert asv_tools.verdict(TIME, base, head)[1] == "slower"
    assert asv_tools.verdict(TIME, head, base)[1] == "faster"
    no_samples = asv_tools.Result(1.0, [], wide)
    assert asv_tools.verdict(TIME, no_samples, head)[1] == "too noisy to tell"
    assert asv_tools.verdict(TIME, base, asv_tools.Result(1.5, [], wide))[1] == \
        "too noisy to tell"


@pytest.mark.parametrize("change,word", [
    (1 + asv_tools.TARGET_CHANGE, "slower"), (1 / (1 + asv_tools.TARGET_CHANGE), "faster"),
    (1 + asv_tools.DEFAULT_MIN_GAP / 2, "same"), (1 - asv_tools.DEFAULT_MIN_GAP / 2, "same"),
])
def test_the_default_gap_calls_the_target_change_where_samples_are_tight(change, word):
    """The gate's promise, with no gap passed: samples spread 0.05% (an H100's device clock
    at real sizes) resolve a change of TARGET_CHANGE either way, and half the default gap stays
    same. Every other verdict test passes its own gap, so a gap widened inside verdict or
    threshold (say to 15%) passed them all."""
    def result(centre):
        return fakes.asv_result([centre * (1 + 5e-4 * (i - 9.5) / 9.5) for i in range(20)])

    assert asv_tools.verdict(TIME, result(1e-3), result(1e-3 * change)) == \
        (pytest.approx(change), word)


def test_a_row_with_no_result_on_either_side_hides_no_other_row():
    """A benchmark neither commit measured ("n/a") is left out of the table, and only it: the
    rows compared after it (track_ rows follow every time_ row) are still reported."""
    base = {(TIME, ("xla",)): _r(None), (TRACK, ("xla",)): _r(1.0)}
    head = {(TIME, ("xla",)): None, (TRACK, ("xla",)): _r(2.0)}
    rows = asv_tools.compare(base, head)
    assert [(row.benchmark, row.params) for row in rows] == [(TRACK, ("xla",))]
    assert rows[0].verdict.startswith("better")
