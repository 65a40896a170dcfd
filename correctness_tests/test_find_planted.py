"""find_planted's pull-request summary of the searched range, from the results asv find saved."""

import importlib.util

import pytest

if importlib.util.find_spec("asv") is None or importlib.util.find_spec("asv_runner") is None:
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from correctness_tests import fakes  # noqa: E402
from kernels.bench import asv_tools, find_planted  # noqa: E402

KEY = ("benchmarks.Softmax.time_device", ("'xla'", "'f32-32768x4096'", "'fwd'"))


def test_the_summary_compares_the_first_commit_with_the_last(monkeypatch, tmp_path):
    saved = {"first": {KEY: fakes.asv_timed(358e-6, 1e-7)},
             "last": {KEY: fakes.asv_timed(383e-6, 1e-7)}}
    monkeypatch.setattr(asv_tools, "load", lambda results, machine, commit: saved.get(commit, {}))
    summary = find_planted.job_summary(tmp_path, "h100", "first", "last")
    assert "asv on h100: first (first of the range) -> last (last)" in summary
    assert "**1 slower**" in summary
    assert "| **slower** | Softmax.time_device |" in summary and "| 1.070 |" in summary
    assert find_planted.job_summary(tmp_path, "h100", "first", "unbenchmarked") is None
