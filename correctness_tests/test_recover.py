"""Results an interrupted run took, recovered from its journals into asv's results file
(kernels.bench.recover): the values asv would have stored, skipped and failed kept apart."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import statistics

import pytest

if importlib.util.find_spec("asv") is None:  # third-party only: see test_test_hygiene
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from correctness_tests import fakes  # noqa: E402
from kernels.bench import asv_tools, recover  # noqa: E402
from kernels.core import registry  # noqa: E402
from perf_tests import measuring  # noqa: E402

CASE = "f32-32768x4096"  # a GPU case: the records may come from another machine
IMPLS = ["cuda", "pallas", "xla"]
MACHINE = "test-gpu"


def _benchmark(method: str) -> dict:
    return {"name": f"benchmarks.Softmax.{method}", "version": f"v-{method}",
            "params": [[f"'{i}'" for i in IMPLS], [f"'{CASE}'"], ["'fwd'"]],
            "param_names": ["implementation", "case", "direction"], "type": "track",
            "unit": "seconds"}


@pytest.fixture
def interrupted(tmp_path: pathlib.Path, monkeypatch):
    """A run cut short after measuring softmax: xla done, pallas failed, cuda skipped."""
    journal = tmp_path / "journals" / "softmax.jsonl"
    journal.parent.mkdir()
    samples = [1e-3 + 1e-6 * i for i in range(12)]
    measuring.append(journal, {"event": "done", "key": f"softmax/xla/{CASE}/fwd",
                               "samples": samples, "method": "cupti", "peak_bytes": 2048.0,
                               "launch_us": 9.5, "roofline": 0.8})
    measuring.append(journal, {"event": "failed", "key": f"softmax/pallas/{CASE}/fwd",
                               "reason": "worker killed by SIGABRT"})
    measuring.append(journal, {"event": "skipped", "key": f"softmax/cuda/{CASE}/fwd",
                               "reason": "needs a CUDA GPU"})
    methods = ["time_device", "track_peak_memory", "track_gbps", "track_launch"]
    listing = {f"benchmarks.Softmax.{m}": _benchmark(m) for m in methods}
    results = fakes.asv_results_folder(tmp_path / "results", MACHINE, listing, {})  # no run yet
    commit = recover._commit("HEAD")
    monkeypatch.setenv("KERNELPERF_BENCH_CASES", "nothing")  # recovery ignores narrowing
    yield tmp_path / "journals", results, commit, samples
    import perf_tests.benchmarks as benchmarks

    monkeypatch.delenv(recover.JOURNAL_VARIABLE, raising=False)
    monkeypatch.delenv(asv_tools.DASHBOARD_VARIABLE, raising=False)
    monkeypatch.delenv("KERNELPERF_BENCH_FULL", raising=False)
    importlib.reload(benchmarks)


def test_a_recovered_run_reads_as_asv_would_have_stored_it(interrupted):
    journals, results, commit, samples = interrupted
    written = recover.recover(journals, results, results / "benchmarks.json", MACHINE, commit,
                              python="3.12", log=lambda _: None)
    assert written == 4
    stored = asv_tools.load(str(results), MACHINE, commit)
    time = {key[1][0].strip("'"): result for key, result in stored.items()
            if key[0].endswith("time_device")}
    assert time["xla"].value == pytest.approx(statistics.median(samples))
    assert time["xla"].samples == pytest.approx(samples)
    assert time["xla"].stats["repeat"] == len(samples)
    assert time["pallas"].value is None and time["cuda"].value is None  # failed, skipped
    raw = json.loads(next((results / MACHINE).glob(f"{commit[:8]}-*.json")).read_text())
    index = raw["result_columns"].index("result")
    row = raw["results"]["benchmarks.Softmax.time_device"][index]
    assert row[0] != row[0] and row[1] is None  # cuda: NaN (skipped), pallas: None (failed)
    peak = {key[1][0].strip("'"): r.value for key, r in stored.items()
            if key[0].endswith("track_peak_memory")}
    assert peak["xla"] == 2048.0
    gbps = next(r.value for key, r in stored.items()
                if key[0].endswith("track_gbps") and key[1][0] == "'xla'")
    op = registry.operation("softmax")
    expected = op.work(op.case(CASE), "fwd").bytes / statistics.median(samples) / 1e9
    assert gbps == pytest.approx(expected)
    assert not math.isnan(next(r.value for key, r in stored.items()
                               if key[0].endswith("track_launch") and key[1][0] == "'xla'"))
    assert raw["results"]["benchmarks.Softmax.time_device"][
        raw["result_columns"].index("version")] == "v-time_device"
