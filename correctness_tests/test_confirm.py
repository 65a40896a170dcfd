"""The gate's confirmation (kernels.bench.confirm): a "slower" row stands only if base and
head, measured again in interleaved rounds, show it in every round."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("asv") is None:  # third-party only: see test_test_hygiene
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from kernels.bench import asv_tools, confirm  # noqa: E402

TIME = "benchmarks.Softmax.time_device"
PARAMS = ("'xla'", "'f32-64x1000'", "'fwd'")
KEY = ("softmax", "xla", "f32-64x1000", "fwd")


@pytest.mark.parametrize(("ratios", "confirmed"), [
    ((1.02, 1.021, 1.019), True),  # a real 2% regression, every round
    ((1.03, 1.0, 1.0), False),  # one slow process or spell
    ((1.004, 1.004, 1.045), False),  # a round under half the gap
    ((1.0055, 1.0055, 1.0055), False),  # every round over half the gap, the mean under it
    ((1.02, 1.02), True),  # a round missing: nothing was disproved, the first pass stands
])
def test_decide(ratios, confirmed):
    assert confirm.decide(ratios, gap=0.01, rounds=3).confirmed is confirmed


def _row(verdict: str, params=PARAMS) -> asv_tools.Row:
    return asv_tools.Row(TIME, params, 1e-3, 1.02e-3, 1.02, verdict, gap=0.01)


def _fake(medians: dict[str, list[float]]):
    """measure(commit, keys, journal): the next of each commit's medians per round."""
    order = []

    def measure(commit, keys, journal):
        order.append(commit)
        value = medians[commit][sum(c == commit for c in order) - 1]
        return {key: {"event": "done", "samples": [value] * 10} for key in keys}
    return measure, order


def test_only_slower_time_rows_are_measured_again_and_rounds_alternate():
    measure, order = _fake({"base": [1.0, 1.0, 1.0], "head": [1.02, 1.021, 1.019]})
    rows = [_row("slower"), _row("same", ("'torch'", "'f32-64x1000'", "'fwd'")),
            asv_tools.Row("benchmarks.Softmax.track_gbps", PARAMS, 1.0, 0.5, 0.5,
                          "worse (no samples)")]
    out = confirm.confirm(rows, "base", "head", rounds=3, measure=measure,
                          log=lambda _: None)
    assert order == ["base", "head", "head", "base", "base", "head"]
    assert out[0].verdict == "slower" and out[0].confirmed.startswith("1.020 1.021 1.019")
    assert out[1:] == rows[1:]
    assert asv_tools.exit_status(out) == 1


def test_a_slowdown_one_round_shows_is_not_confirmed():
    measure, _ = _fake({"base": [1.0, 1.0, 1.0], "head": [1.03, 1.0, 1.001]})
    out = confirm.confirm([_row("slower")], "base", "head", rounds=3, measure=measure,
                          log=lambda _: None)
    assert out[0].verdict == "same (not confirmed)"
    assert asv_tools.exit_status(out) == 0


def test_rows_name_their_operation_by_the_benchmark_class():
    assert confirm.key_of("benchmarks.RowSum.time_device", PARAMS, confirm.class_names()) == \
        ("row_sum", "xla", "f32-64x1000", "fwd")
