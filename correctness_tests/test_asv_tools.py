"""Verdicts of `python -m kernels compare`: each unit judged the right way up, noise respected."""

import dataclasses
import importlib.util
import json
import pathlib
import time

import numpy as np
import pytest

# Skip only when the third-party package is missing; an import error in our own
# kernels.bench.asv_tools must fail the module, never turn it into a skip.
if importlib.util.find_spec("asv") is None or importlib.util.find_spec("asv_runner") is None:
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from asv_runner import statistics  # noqa: E402

from kernels.bench import asv_tools  # noqa: E402


def _timed(center: float, spread: float, n: int = 20, seed: int = 0) -> asv_tools.Result:
    samples = list(center + spread * np.random.default_rng(seed).standard_normal(n))
    value, stats = statistics.compute_stats(samples, 1)
    return asv_tools.Result(value, samples, stats)


def _tracked(value: float) -> asv_tools.Result:
    return asv_tools.Result(value, None, None)


TIME = "benchmarks.Softmax.time_device"


def test_clear_slowdown_is_slower_and_fails_the_gate():
    ratio, word = asv_tools.verdict(TIME, _timed(1e-3, 1e-6), _timed(1.2e-3, 1e-6, seed=1))
    assert word == "slower" and ratio == pytest.approx(1.2, rel=1e-2)
    rows = [asv_tools.Row(TIME, (), 1e-3, 1.2e-3, ratio, word)]
    assert asv_tools.exit_status(rows) == 1


def test_clear_speedup_is_faster():
    assert asv_tools.verdict(TIME, _timed(1e-3, 1e-6), _timed(0.8e-3, 1e-6, seed=1))[1] == "faster"


def test_small_change_counts_as_same_even_if_significant():
    assert asv_tools.verdict(TIME, _timed(1e-3, 1e-7), _timed(1.01e-3, 1e-7, seed=1))[1] == "same"


def test_large_change_within_noise_is_too_noisy():
    base, head = _timed(1e-3, 4e-4, n=6), _timed(1.1e-3, 4e-4, n=6, seed=1)
    assert asv_tools.verdict(TIME, base, head)[1] == "too noisy to tell"


def test_without_samples_overlapping_intervals_are_too_noisy():
    base, head = _timed(1e-3, 4e-4, n=6), _timed(1.1e-3, 4e-4, n=6, seed=1)
    base, head = (asv_tools.Result(r.value, None, r.stats) for r in (base, head))
    assert asv_tools.verdict(TIME, base, head)[1] == "too noisy to tell"


def test_higher_throughput_is_better_not_worse():
    ratio, word = asv_tools.verdict("benchmarks.Matmul.track_tflops", _tracked(500.0),
                                    _tracked(600.0))
    assert word == "better (no samples)" and ratio == pytest.approx(1.2)
    assert asv_tools.verdict("benchmarks.Matmul.track_tflops", _tracked(600.0),
                             _tracked(500.0))[1] == "worse (no samples)"


def test_failure_on_head_is_reported_and_exits_2():
    ratio, word = asv_tools.verdict(TIME, _timed(1e-3, 1e-6), asv_tools.Result(None, None, None))
    assert word == "FAILED on head"
    assert asv_tools.exit_status([asv_tools.Row(TIME, (), 1e-3, None, None, word)]) == 2


def test_render_shows_units_and_verdicts():
    rows = asv_tools.compare({(TIME, ("'pallas'",)): _timed(1e-3, 1e-6)},
                             {(TIME, ("'pallas'",)): _timed(1.5e-3, 1e-6, seed=1)})
    text = asv_tools.render(rows)
    assert "Softmax.time_device" in text and "pallas" in text and "slower" in text
    assert " us " in text and "1.500" in text


def test_machine_file_carries_device_keys_that_asv_loads(tmp_path, monkeypatch):
    from asv.machine import Machine

    from kernels.core import fingerprint

    gpu = fingerprint.Identity("gpu", "Test GPU 80GB", "test-gpu-80gb", "999.1", "99.9", 1234)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(fingerprint, "identity", lambda: gpu)
    assert asv_tools.register_machine() == "test-gpu-80gb"
    machine = Machine.load(machine_name="test-gpu-80gb",
                           _path=str(tmp_path / ".asv-machine.json"))
    for key, value in asv_tools.machine_keys(gpu).items():
        assert getattr(machine, key) == value
    assert (machine.gpu, machine.driver, machine.cuda) == (gpu.name, gpu.driver, gpu.cuda)
    assert machine.sm_clock_mhz == str(gpu.default_sm_mhz)
    assert machine.num_cpu and machine.ram and machine.arch and "Test GPU" in machine.cpu


def test_machine_keys_on_cpu_name_no_gpu():
    from kernels.core import fingerprint

    cpu = dataclasses.replace(fingerprint.fingerprint(), platform="cpu", driver=None, cuda=None,
                              default_sm_mhz=None)
    assert asv_tools.machine_keys(cpu) == {"gpu": "none", "driver": "n/a", "cuda": "n/a",
                                           "sm_clock_mhz": "n/a"}


def test_noise_floor_is_the_largest_same_commit_shift_and_raises_the_bar():
    key = (TIME, ("'xla'", "'f32-64x1000'", "'fwd'"))
    runs = [{key: _timed(v, 1e-7), ("benchmarks.Softmax.track_gbps", ()): _tracked(v)}
            for v in (1.0e-3, 1.2e-3, 1.1e-3)]
    floors = asv_tools.floors_from_runs(runs)
    # track_ rows learn no floor.
    assert floors == {asv_tools.floor_key(key): pytest.approx(0.2, rel=1e-3)}
    # A 15% slowdown with tight samples: "slower" without a floor, "same" inside a 20% floor,
    # "slower" again once it exceeds the floor.
    base, head = _timed(1e-3, 1e-7), _timed(1.15e-3, 1e-7, seed=1)
    assert asv_tools.verdict(TIME, base, head)[1] == "slower"
    assert asv_tools.verdict(TIME, base, head, floor=0.2)[1] == "same (within noise floor)"
    rows = asv_tools.compare({key: base}, {key: _timed(1.3e-3, 1e-7, seed=1)}, floors=floors)
    assert [row.verdict for row in rows] == ["slower"] and asv_tools.exit_status(rows) == 1


def _fresh(result: asv_tools.Result) -> asv_tools.Result:
    """`result` as measured by the run in progress (asv stamps when it started a benchmark)."""
    return dataclasses.replace(result, started_at=time.time() * 1000)


def test_learned_floors_round_trip_through_the_results_folder(tmp_path, monkeypatch):
    key = (TIME, ("'xla'",))
    runs = iter([{key: _timed(1.0e-3, 1e-7)}, {key: _timed(1.1e-3, 1e-7)}])
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: "c" * 40)
    monkeypatch.setattr(asv_tools, "bench", lambda revisions, bench_regex=None: "test-machine")
    # Stamped when loaded, as asv stamps each benchmark during the run that just ended.
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit:
                        {k: _fresh(r) for k, r in next(runs).items()})
    results = str(tmp_path / "results")
    floors = asv_tools.learn_floors("HEAD", 2, results_dir=results)
    assert floors == {asv_tools.floor_key(key): pytest.approx(0.1, rel=1e-3)}
    assert (tmp_path / "noise-floors" / "test-machine.json").exists()
    assert asv_tools.load_floors("test-machine", results) == floors
    with pytest.raises(ValueError, match="runs: expected at least 2"):
        asv_tools.learn_floors("HEAD", 1, results_dir=results)


def test_dashboard_metrics_exist_only_when_recorded(monkeypatch):
    """Plain asv never sees the throughput metrics (its verdict would read a speedup as a
    regression); `kernels bench` sets the variable and records them."""
    import importlib

    import perf_tests.benchmarks as benchmarks

    monkeypatch.delenv(asv_tools.DASHBOARD_VARIABLE, raising=False)
    plain = importlib.reload(benchmarks).Softmax
    assert hasattr(plain, "time_device") and hasattr(plain, "track_peak_memory")
    assert not any(hasattr(plain, name) for name in ("track_tflops", "track_gbps",
                                                     "track_roofline", "track_speedup",
                                                     "track_launch"))
    monkeypatch.setenv(asv_tools.DASHBOARD_VARIABLE, "1")
    recorded = importlib.reload(benchmarks).Softmax
    assert all(hasattr(recorded, name) for name in ("track_tflops", "track_gbps",
                                                    "track_roofline", "track_speedup",
                                                    "track_launch"))
    assert all(method in asv_tools.LOWER_IS_BETTER for method in dir(recorded)
               if method.startswith(("time_", "track_")))
    monkeypatch.delenv(asv_tools.DASHBOARD_VARIABLE)
    importlib.reload(benchmarks)


def test_importing_the_benchmarks_starts_no_backend():
    """asv's forkserver imports the benchmark module once and forks every benchmark from it:
    a JAX backend (threads) or a CUDA context made at import would be forked into each."""
    import subprocess
    import sys

    probe = ("import perf_tests.benchmarks, sys; from jax._src import xla_bridge; "
             "torch = sys.modules.get('torch'); "
             "print(list(xla_bridge._backends), bool(torch and torch.cuda.is_initialized()))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=pathlib.Path(__file__).parents[1], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "[] False", result.stdout


def test_a_benchmark_prepares_its_timing_once_however_often_asv_reruns_setup(monkeypatch):
    """asv calls setup() before every sample: inputs, compilation and warm-up must not be
    redone each time (at real sizes that is seconds per sample, and asv's 20 s cap then
    leaves ten samples)."""
    import perf_tests.benchmarks as benchmarks
    from kernels.core import timing

    prepared = []
    real_prepare = timing.prepare

    def counting_prepare(*args, **kwargs):
        prepared.append(args)
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(timing, "prepare", counting_prepare)
    benchmarks._sampler.cache_clear()
    bench = benchmarks.Softmax()
    before = benchmarks.DEVICE_CLOCK.now
    for _ in range(3):
        bench.setup("xla", "f32-64x1000", "fwd")
        bench.time_device()
    assert len(prepared) == 1
    assert benchmarks.DEVICE_CLOCK.now > before
    benchmarks._sampler.cache_clear()


def test_asv_benchmark_dir_holds_only_the_benchmarks():
    """asv imports every module of its benchmark directory, in name order, in each benchmark
    process: a helper there that puts the checkout on sys.path and imports `kernels` made
    every commit run the working tree's code (a planted slowdown measured 1.000 on the H100)."""
    bench_dir = pathlib.Path(__file__).parents[1] / "perf_tests"
    modules = sorted(p.name for p in bench_dir.glob("*.py"))
    assert modules == ["__init__.py", "benchmarks.py"], modules


def test_floors_come_only_from_runs_of_that_benchmark(tmp_path, monkeypatch):
    """`make noise-floor BENCH=Softmax`: asv's results file still holds Attention's and Matmul's
    values from an earlier run; they must not become 0.0% floors, and the floor learned earlier
    for Attention must stay as it was."""
    softmax = (TIME, ("'xla'",))
    attention = ("benchmarks.Attention.time_device", ("'xla'",))
    matmul = ("benchmarks.Matmul.time_device", ("'xla'",))
    stale = {attention: dataclasses.replace(_timed(2e-3, 1e-7), started_at=1.0),
             matmul: dataclasses.replace(_timed(3e-3, 1e-7), started_at=1.0)}
    values = iter([1.0e-3, 1.25e-3, 1.1e-3])
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: "c" * 40)
    monkeypatch.setattr(asv_tools, "bench", lambda revisions, bench_regex=None: "test-machine")
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit:
                        {**stale, softmax: _fresh(_timed(next(values), 1e-7))})
    results = str(tmp_path / "results")
    path = asv_tools.floors_path("test-machine", results)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"floors": {asv_tools.floor_key(attention): 0.3}}))
    learned = asv_tools.learn_floors("HEAD", 3, bench_regex="Softmax", results_dir=results)
    assert learned == {asv_tools.floor_key(softmax): pytest.approx(0.25, rel=1e-3)}
    assert asv_tools.load_floors("test-machine", results) == {
        asv_tools.floor_key(softmax): pytest.approx(0.25, rel=1e-3),
        asv_tools.floor_key(attention): 0.3}  # kept unchanged; none invented for Matmul
    # The compare table names the rows that have no floor.
    rows = asv_tools.compare({matmul: _timed(3e-3, 1e-7)}, {matmul: _timed(3e-3, 1e-7, seed=1)})
    text = asv_tools.render(rows, asv_tools.load_floors("test-machine", results))
    assert "noise floor" in text.splitlines()[0] and " none " in text.splitlines()[2]


def test_compare_of_a_commit_with_itself_says_so(monkeypatch, capsys):
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: "c" * 40)
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit:
                        {(TIME, ("'xla'",)): _timed(1e-3, 1e-7)})
    assert asv_tools.run("main", "HEAD", machine="test-machine") == 0
    out = capsys.readouterr().out
    assert "main and HEAD are the same commit (cccccccc): nothing to compare" in out
    assert "1.000" not in out and "Softmax.time_device" in out


def test_noise_floor_runs_only_the_timed_benchmarks():
    """Floors are learned for time_ rows alone, so `noise-floor` asks asv for no track_ row
    (they were most of each run's processes); BENCH narrows within the time_ methods."""
    import re

    from kernels.cli.bench import floor_regex

    names = ["benchmarks.Softmax.time_device", "benchmarks.Softmax.track_gbps",
             "benchmarks.Softmax.track_peak_memory", "benchmarks.Matmul.time_device"]
    for bench, wanted in ((None, [names[0], names[3]]), ("Softmax", [names[0]]),
                          (r"Softmax\.track_gbps", []), ("Matmul|Softmax", [names[0], names[3]])):
        assert [n for n in names if re.search(floor_regex(bench), n)] == wanted, bench
