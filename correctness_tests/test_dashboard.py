"""The asv dashboard draws a benchmark's graph: a tiny real asv run on this machine's CPU,
published by kernels.bench.dashboard, opened in headless chromium (no network needed)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from kernels.bench import dashboard

BENCHMARK = "benchmarks.Softmax.time_device"


@pytest.fixture
def tiny_results():
    """asv results of Softmax.time_device (xla and torch, forward, the CPU bench
    case), recorded by
    `asv run --python=same` for a one-commit scratch repository; deleted afterwards."""
    reason = dashboard.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="kernelperf-dashboard-test-") as tmp:
        tmp = Path(tmp)
        repo = tmp / "repo"
        git = ["git", "-c", "user.name=kernelperf", "-c", "user.email=kernelperf@localhost"]
        subprocess.run([*git, "init", "-q", "-b", "main", str(repo)], check=True)
        subprocess.run([*git, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "one"],
                       check=True)
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
        config = dashboard.asv_config(repo, tmp / "results", tmp / "html", env_dir=tmp / "env")
        # HOME: asv's machine file; the filters: two implementations (two series), one direction.
        env = {**os.environ, "HOME": str(tmp), "KERNELPERF_BENCH_IMPLS": "xla,torch",
               "KERNELPERF_BENCH_DIRECTIONS": "fwd"}
        dashboard.run_asv(config, "machine", "--yes", "--machine", "dashboard-test", env=env)
        dashboard.run_asv(config, "run", "--python=same", "--set-commit-hash", commit,
                          "--machine", "dashboard-test", "--bench", r"Softmax\.time_device",
                          "--quick", "--show-stderr", env=env)
        yield tmp, repo


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_published_dashboard_draws_the_benchmark_graph(tiny_results, tmp_path):
    tmp, repo = tiny_results
    png = tmp_path / "softmax_time_device.png"  # kept under pytest's basetemp to look at
    facts = dashboard.screenshot(tmp / "results", BENCHMARK, png, html_dir=tmp / "html",
                                 repo=repo)
    assert not facts.error_page, "asv's page fell back to error.html: a script did not load"
    assert facts.canvases >= 2, f"no flot canvases in #main-graph: {facts}"
    assert sorted(facts.legend) == ["implementation-torch", "implementation-xla"], facts
    assert len([label for label in facts.tick_labels if _number(label)]) >= 2, facts
    assert facts.drawn
    # The points themselves, in asv's first series colour, not just axes and legend.
    assert dashboard.series_pixels(png) > 20

    # Every script and style sheet from a local copy: the page needs no network.
    index = (tmp / "html" / "index.html").read_text()
    assert "https://cdn" not in index and "code.jquery.com" not in index
    for name in [*dashboard.VENDOR, *dashboard.SHIMS]:
        assert (tmp / "html" / "vendor" / name).is_file(), name


def _results_folder(root: Path, machine: str, params: list, version: str) -> Path:
    (root / machine).mkdir(parents=True)
    (root / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    (root / machine / "c0ffee-env.json").write_text("{}")
    benchmarks = {BENCHMARK: {"name": BENCHMARK, "params": params, "version": version},
                  "version": 2}
    (root / "benchmarks.json").write_text(json.dumps(benchmarks))
    return root


def test_dashboard_publishes_shipped_and_local_results_together(tmp_path):
    """`make dashboard`: the GPU results the repository ships and this machine's CPU results in
    one published folder, each benchmark's parameters the union of both."""
    shipped = _results_folder(tmp_path / "shipped", "nvidia-h100-80gb-hbm3",
                              [["'pallas'", "'xla'"], ["'f32-32768x4096'"], ["'fwd'"]], "v1")
    local = _results_folder(tmp_path / "local", "amd-epyc",
                            [["'pallas'", "'torch'"], ["'f32-64x1000'"], ["'fwd'"]], "v1")
    lines = dashboard.combine_results([shipped, tmp_path / "absent", local], tmp_path / "both")
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == [
        "amd-epyc", "benchmarks.json", "nvidia-h100-80gb-hbm3"]
    assert (tmp_path / "both" / "nvidia-h100-80gb-hbm3" / "c0ffee-env.json").is_file()
    merged = json.loads((tmp_path / "both" / "benchmarks.json").read_text())
    assert merged[BENCHMARK]["params"] == [["'pallas'", "'xla'", "'torch'"],
                                           ["'f32-32768x4096'", "'f32-64x1000'"], ["'fwd'"]]
    assert len(lines) == 2 and "not shown" not in " ".join(lines)
    # Results recorded by other benchmark code are left out by asv: said, not silent.
    (local / "benchmarks.json").write_text(json.dumps(
        {BENCHMARK: {"name": BENCHMARK, "params": [["'xla'"], ["'f32-64x1000'"], ["'fwd'"]],
                     "version": "v2"}}))
    lines = dashboard.combine_results([shipped, local], tmp_path / "both")
    assert lines[0].endswith(f"not shown, recorded by other code: {BENCHMARK}")
