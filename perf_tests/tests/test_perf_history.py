"""pytest-benchmark history end to end on CPU: save a perf run, compare a slower one, fail.

Runs one real perf item in a child pytest (pytest-benchmark records nothing
under xdist, which `make test` uses): it must save the device-time samples
with its extra info and the device fingerprint; then, against a saved run made
100 times faster and marked as taken by another clock, the next run must exit 1
with both pytest-benchmark's `--benchmark-compare-fail` message and our
refusal to compare clocks. On a GPU, perf_tests/tests/gpu_verify.sh does this at
real size with a slowdown planted in the kernel.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from kernels.bench import perfcheck
from kernels.core import devices

ROOT = pathlib.Path(__file__).resolve().parents[2]
ITEM = "softmax-pallas-f32-64x1000-fwd"
SPEEDUP = 100.0
STATS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "iqr_outliers",
         "stddev_outliers", "outliers", "ld15iqr", "hd15iqr", "ops", "total", "data",
         "iterations", "rounds")

pytestmark = [
    pytest.mark.perf,
    pytest.mark.skipif(devices.this_machine().has_gpu,
                       reason="CPU round trip; on a GPU perf_tests/tests/gpu_verify.sh does it at "
                              "real size"),
]


def _pytest(*args: str) -> subprocess.CompletedProcess:
    # An xdist worker's variables would make the child think it is one too (and
    # pytest-benchmark disable itself there).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env[perfcheck.BUDGET_VARIABLE] = "0.05"
    command = [sys.executable, "-m", "pytest", "perf_tests/tests/test_performance.py", "-k", ITEM,
               "-p", "no:xdist", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_saved_history_then_a_slower_run_fails_the_compare(tmp_path):
    storage = f"file://{tmp_path / 'history'}"
    first = _pytest(f"--benchmark-storage={storage}", "--benchmark-autosave",
                    f"--benchmark-json={tmp_path / 'run.json'}")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run = json.loads((tmp_path / "run.json").read_text())
    (bench,) = run["benchmarks"]
    assert bench["name"] == f"test_kernel_performance[{ITEM}]"
    assert bench["options"]["timer"] == "device_time"  # kernels.bench.perfcheck.device_time
    info = bench["extra_info"]
    assert info["clock_method"] == "host-clock" and info["floor_verdict"] == "skipped"
    assert info["fingerprint"]["platform"] == "cpu"
    assert info["gbps"] > 0 and info["baselines"] and info["roofline_fraction"] > 0
    # The recorded median is the measurement's (GB/s come from it), not the wall time of
    # pedantic's rounds, each of which only advances the device clock (about a microsecond).
    assert bench["stats"]["rounds"] >= perfcheck.CPU_MIN_SAMPLES
    softmax_bytes = 2 * 64 * 1000 * 4  # f32 64x1000: read x, write y
    assert bench["stats"]["median"] == pytest.approx(softmax_bytes / (info["gbps"] * 1e9),
                                                     rel=1e-9)
    assert run["machine_info"]["kernelperf"]["model"] == info["fingerprint"]["model"]

    (saved_path,) = (tmp_path / "history").glob("*/0001_*.json")
    saved = json.loads(saved_path.read_text())
    (saved_bench,) = saved["benchmarks"]
    # The plant: the saved run 100 times faster than this one (far beyond the host clock's
    # run-to-run swings on a shared CPU, up to 4x seen), and taken by another clock.
    for key in STATS:
        value = saved_bench["stats"].get(key)
        if key in ("median", "min", "max", "mean", "stddev", "iqr", "q1", "q3", "ld15iqr",
                   "hd15iqr", "total"):
            saved_bench["stats"][key] = value / SPEEDUP
        elif key == "ops":
            saved_bench["stats"][key] = value * SPEEDUP
    saved_bench["extra_info"]["clock_method"] = "cupti"
    saved_path.write_text(json.dumps(saved))

    second = _pytest(f"--benchmark-storage={storage}", "--benchmark-compare=0001",
                     "--benchmark-compare-fail=median:5%")
    output = second.stdout + second.stderr
    assert second.returncode == 1, output[-3000:]
    assert "Performance has regressed" in output and "Field 'median' has failed" in output, \
        output[-3000:]
    assert "timed by cupti, this run by host-clock" in output, output[-3000:]
