"""Verdicts of `python -m kernels compare`: each unit judged the right way up, noise respected."""

import dataclasses
import importlib.util
import json
import pathlib
import time

import pytest

# Skip only when the third-party package is missing; an import error in our own
# kernels.bench.asv_tools must fail the module, never turn it into a skip.
if importlib.util.find_spec("asv") is None or importlib.util.find_spec("asv_runner") is None:
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from correctness_tests import fakes  # noqa: E402
from kernels.bench import asv_tools  # noqa: E402


def _tracked(value: float) -> asv_tools.Result:
    return asv_tools.Result(value, None, None)


TIME = "benchmarks.Softmax.time_device"


def test_clear_slowdown_is_slower_and_fails_the_gate():
    ratio, word = asv_tools.verdict(TIME, fakes.asv_timed(1e-3, 1e-6),
                                    fakes.asv_timed(1.2e-3, 1e-6, seed=1))
    assert word == "slower" and ratio == pytest.approx(1.2, rel=1e-2)
    rows = [asv_tools.Row(TIME, (), 1e-3, 1.2e-3, ratio, word)]
    assert asv_tools.exit_status(rows) == 1


def test_clear_speedup_is_faster():
    assert asv_tools.verdict(TIME, fakes.asv_timed(1e-3, 1e-6),
                             fakes.asv_timed(0.8e-3, 1e-6, seed=1))[1] == "faster"


def test_small_change_counts_as_same_even_if_significant():
    assert asv_tools.verdict(TIME, fakes.asv_timed(1e-3, 1e-7),
                             fakes.asv_timed(1.005e-3, 1e-7, seed=1))[1] == "same"


def test_a_two_percent_change_is_called_where_the_samples_are_tight():
    """The clock spreads 0.1-0.5% at real sizes: 2% either way must be called, by the
    default gap, from ten samples a side."""
    base = fakes.asv_timed(1e-3, 2e-6, n=10)
    assert asv_tools.verdict(TIME, base,
                             fakes.asv_timed(1.02e-3, 2e-6, n=10, seed=1))[1] == "slower"
    assert asv_tools.verdict(TIME, base,
                             fakes.asv_timed(0.98e-3, 2e-6, n=10, seed=1))[1] == "faster"


def test_large_change_within_the_samples_spread_is_same_within_noise():
    base, head = fakes.asv_timed(1e-3, 4e-4, n=6), fakes.asv_timed(1.1e-3, 4e-4, n=6, seed=1)
    assert asv_tools.verdict(TIME, base, head)[1] == "same (within sample noise)"


def test_the_gap_widens_with_the_spread_and_says_why():
    tight = asv_tools.threshold(TIME, fakes.asv_timed(1e-3, 1e-7),
                                fakes.asv_timed(1e-3, 1e-7, seed=1))
    assert tight.gap == asv_tools.DEFAULT_MIN_GAP and tight.why is None
    wide = asv_tools.threshold(TIME, fakes.asv_timed(1e-3, 3e-5),
                               fakes.asv_timed(1e-3, 3e-5, seed=1))
    assert wide.gap > 0.02 and wide.why.startswith("sample spread")
    floored = asv_tools.threshold(TIME, fakes.asv_timed(1e-3, 1e-7),
                                  fakes.asv_timed(1e-3, 1e-7, seed=1), floor=0.04)
    assert floored.gap == 0.04 and floored.why == "learned run-to-run shift 4.0%"
    # tracked numbers have no samples: the gap is min_gap or the floor
    assert asv_tools.threshold("benchmarks.S.track_gbps", _tracked(1.0), _tracked(1.0)).gap \
        == asv_tools.DEFAULT_MIN_GAP


def test_resolution_lists_the_rows_that_cannot_call_the_target():
    rows = [asv_tools.Row(TIME, ("'a'",), 1.0, 1.0, 1.0, "same", gap=0.01),
            asv_tools.Row(TIME, ("'b'",), 1.0, 1.0, 1.0, "same", gap=0.012),
            asv_tools.Row(TIME, ("'c'",), 1.0, 1.0, 1.0, "same", gap=0.05,
                          why="sample spread 2.0%")]
    text = asv_tools.resolution(rows)
    assert "median 1.2% over 3 time_ rows" in text
    assert "1 cannot call 2%" in text and "Softmax.time_device(c): 5.0%, sample spread 2.0%" \
        in text


def test_without_samples_overlapping_intervals_are_too_noisy():
    base, head = fakes.asv_timed(1e-3, 4e-4, n=6), fakes.asv_timed(1.1e-3, 4e-4, n=6, seed=1)
    base, head = (asv_tools.Result(r.value, None, r.stats) for r in (base, head))
    assert asv_tools.verdict(TIME, base, head)[1] == "too noisy to tell"


def test_higher_throughput_is_better_not_worse():
    ratio, word = asv_tools.verdict("benchmarks.Matmul.track_tflops", _tracked(500.0),
                                    _tracked(600.0))
    assert word == "better (no samples)" and ratio == pytest.approx(1.2)
    assert asv_tools.verdict("benchmarks.Matmul.track_tflops", _tracked(600.0),
                             _tracked(500.0))[1] == "worse (no samples)"


def test_failure_on_head_is_reported_and_fails_the_gate():
    ratio, word = asv_tools.verdict(TIME, fakes.asv_timed(1e-3, 1e-6),
                                    asv_tools.Result(None, None, None))
    assert word == "FAILED on head"
    assert asv_tools.exit_status([asv_tools.Row(TIME, (), 1e-3, None, None, word)]) == 1


def test_render_shows_units_and_verdicts():
    rows = asv_tools.compare({(TIME, ("'pallas'",)): fakes.asv_timed(1e-3, 1e-6)},
                             {(TIME, ("'pallas'",)): fakes.asv_timed(1.5e-3, 1e-6, seed=1)})
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


def test_a_machine_of_several_gpus_is_named_by_their_count(tmp_path, monkeypatch):
    from kernels.core import fingerprint

    four = fingerprint.Identity("gpu", "Test GPU 80GB", "test-gpu-80gb", "999.1", "99.9",
                                1234, devices=4)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(fingerprint, "identity", lambda: four)
    assert asv_tools.machine_name() == "4x-test-gpu-80gb"
    assert asv_tools.register_machine() == "4x-test-gpu-80gb"
    one = dataclasses.replace(four, devices=1)
    assert asv_tools.machine_name(one) == "test-gpu-80gb"


def test_machine_keys_on_cpu_name_no_gpu():
    from kernels.core import fingerprint

    cpu = dataclasses.replace(fingerprint.fingerprint(), platform="cpu", driver=None, cuda=None,
                              default_sm_mhz=None)
    assert asv_tools.machine_keys(cpu) == {"gpu": "none", "driver": "n/a", "cuda": "n/a",
                                           "sm_clock_mhz": "n/a"}


def test_noise_floor_is_the_largest_same_commit_shift_and_raises_the_bar():
    key = (TIME, ("'xla'", "'f32-64x1000'", "'fwd'"))
    runs = [{key: fakes.asv_timed(v, 1e-7), ("benchmarks.Softmax.track_gbps", ()): _tracked(v)}
            for v in (1.0e-3, 1.2e-3, 1.1e-3)]
    floors = asv_tools.floors_from_runs(runs)
    # track_ rows learn no floor.
    assert floors == {asv_tools.floor_key(key): pytest.approx(0.2, rel=1e-3)}
    # A 15% slowdown with tight samples: "slower" without a floor, "same" inside a 20% floor,
    # "slower" again once it exceeds the floor.
    base, head = fakes.asv_timed(1e-3, 1e-7), fakes.asv_timed(1.15e-3, 1e-7, seed=1)
    assert asv_tools.verdict(TIME, base, head)[1] == "slower"
    assert asv_tools.verdict(TIME, base, head, floor=0.2)[1] == "same (within noise floor)"
    rows = asv_tools.compare({key: base}, {key: fakes.asv_timed(1.3e-3, 1e-7, seed=1)},
                             floors=floors)
    assert [row.verdict for row in rows] == ["slower"] and asv_tools.exit_status(rows) == 1


def _fresh(result: asv_tools.Result) -> asv_tools.Result:
    """`result` as measured by the run in progress (asv stamps when it started a benchmark)."""
    return dataclasses.replace(result, started_at=time.time() * 1000)


def test_learned_floors_round_trip_through_the_results_folder(tmp_path, monkeypatch):
    key = (TIME, ("'xla'",))
    runs = iter([{key: fakes.asv_timed(1.0e-3, 1e-7)}, {key: fakes.asv_timed(1.1e-3, 1e-7)}])
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


def test_a_benchmark_replays_the_samples_its_operation_was_measured_with(monkeypatch, tmp_path):
    """asv calls setup() before every sample: each benchmark process replays the journal's
    record of its parameter set, asv takes exactly that many samples, and nothing is
    measured again (no worker is started while the journal holds every parameter set)."""
    import subprocess

    import perf_tests.benchmarks as benchmarks
    from perf_tests import measuring

    monkeypatch.setenv("ASV_ENV_DIR", str(tmp_path))
    benchmarks._records.cache_clear()
    journal = benchmarks._cache_dir() / "softmax.jsonl"
    keys = benchmarks._keys(benchmarks.Softmax)
    samples = [1e-3 + 1e-6 * i for i in range(12)]
    for key in keys:
        measuring.append(journal, {"event": "done", "key": measuring.key_id(key),
                                   "samples": samples, "peak_bytes": 4096.0, "method": "cupti"})

    def no_worker(*args, **kwargs):
        raise AssertionError("a worker was started for a journalled operation")

    monkeypatch.setattr(subprocess, "Popen", no_worker)
    key = next(k for k in keys if k[1] == "xla")
    bench = benchmarks.Softmax()
    seen = []
    for _ in range(len(samples)):
        bench.setup(*key[1:])
        before = benchmarks.DEVICE_CLOCK.now
        bench.time_device()
        seen.append(benchmarks.DEVICE_CLOCK.now - before)
    assert bench.repeat[:2] == (len(samples), len(samples))
    assert seen == pytest.approx(samples, rel=1e-9)
    assert bench.track_peak_memory() == 4096.0
    benchmarks._records.cache_clear()
    benchmarks._REPLAY.clear()


def test_a_later_asv_round_in_one_process_tree_measures_afresh_never_replays_again(
        monkeypatch, tmp_path):
    """`asv run -a rounds=2` (no --interleave-rounds) runs both rounds from one forkserver:
    the second round's time_ process must get samples of its own (a fresh worker's, its own
    journal), not round 1's again, which would double the samples asv's statistics see.
    planted: every time_ process taking round 1 -> fails this."""
    import perf_tests.benchmarks as benchmarks
    from perf_tests import measuring

    monkeypatch.setenv("ASV_ENV_DIR", str(tmp_path))
    benchmarks._records.cache_clear()
    journal = benchmarks._cache_dir() / "softmax.jsonl"
    keys = benchmarks._keys(benchmarks.Softmax)
    first, second = [1e-3] * 12, [2e-3] * 10
    for key in keys:
        measuring.append(journal, {"event": "done", "key": measuring.key_id(key),
                                   "samples": first, "peak_bytes": 1.0, "method": "cupti"})
    measured = []
    journalled = measuring.ensure_measured

    def ensure_measured(asked, path, dashboard=False):
        if path == journal:  # round 1: the journal holds it, no worker starts
            return journalled(asked, path, dashboard=dashboard)
        measured.append(path.name)
        return {k: {"event": "done", "key": measuring.key_id(k), "samples": second}
                for k in asked}
    monkeypatch.setattr(measuring, "ensure_measured", ensure_measured)
    monkeypatch.setattr(benchmarks, "_timing_process", lambda: True)
    key = next(k for k in keys if k[1] == "xla")
    counts = []
    for _ in range(3):  # three benchmark processes of the time_ method: rounds 1, 2, 3
        benchmarks._REPLAY.clear()
        benchmarks._ROUNDS.clear()
        bench = benchmarks.Softmax()
        bench.setup(*key[1:])
        bench.setup(*key[1:])  # asv's setup before the next sample: the same round
        counts.append((bench.repeat[0], bench._replay[-1]))
    assert counts == [(12, 1e-3), (10, 2e-3), (10, 2e-3)]
    assert measured == ["softmax.round2.jsonl", "softmax.round3.jsonl"]
    # a memory (track_) process takes no round of its own: round 1's record
    monkeypatch.setattr(benchmarks, "_timing_process", lambda: False)
    benchmarks._REPLAY.clear()
    benchmarks._ROUNDS.clear()
    bench = benchmarks.Softmax()
    bench.setup(*key[1:])
    assert bench.repeat[0] == 12 and len(measured) == 2
    benchmarks._records.cache_clear()
    benchmarks._REPLAY.clear()
    benchmarks._ROUNDS.clear()


def test_only_asvs_timing_benchmark_counts_as_a_time_process():
    from asv_runner.benchmarks.time import TimeBenchmark

    import perf_tests.benchmarks as benchmarks

    assert not benchmarks._timing_process()

    class Runner(TimeBenchmark):
        def __init__(self):  # no asv discovery: only the type matters
            pass

        def call(self):
            return benchmarks._timing_process()
    assert Runner().call()


def test_a_skipped_parameter_set_skips_and_a_failed_one_fails(monkeypatch, tmp_path):
    import perf_tests.benchmarks as benchmarks
    from perf_tests import measuring

    monkeypatch.setenv("ASV_ENV_DIR", str(tmp_path))
    benchmarks._records.cache_clear()
    journal = benchmarks._cache_dir() / "softmax.jsonl"
    first, second, *rest = benchmarks._keys(benchmarks.Softmax)
    measuring.append(journal, {"event": "failed", "key": measuring.key_id(first),
                               "reason": "timed out: no result after 121 s (limit 120 s)"})
    for key in (second, *rest):
        measuring.append(journal, {"event": "skipped", "key": measuring.key_id(key),
                                   "reason": "needs a CUDA GPU"})
    with pytest.raises(RuntimeError, match="timed out: no result after 121 s"):
        benchmarks.Softmax().setup(*first[1:])
    with pytest.raises(NotImplementedError, match="needs a CUDA GPU"):
        benchmarks.Softmax().setup(*second[1:])
    benchmarks._records.cache_clear()


def test_asv_benchmark_dir_holds_only_the_benchmarks_and_their_measuring():
    """asv imports every module of its benchmark directory, in name order, in each benchmark
    process: a helper there that puts the checkout on sys.path and imports `kernels` made
    every commit run the working tree's code (a planted slowdown measured 1.000 on the H100).
    measuring.py may sit there because importing it does neither."""
    import subprocess
    import sys

    bench_dir = pathlib.Path(__file__).parents[1] / "perf_tests"
    modules = sorted(p.name for p in bench_dir.glob("*.py"))
    assert modules == ["__init__.py", "benchmarks.py", "measuring.py"], modules
    probe = ("import sys; before = list(sys.path); import perf_tests.measuring; "
             "print(sys.path == before, 'kernels' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=bench_dir.parent, timeout=120)
    assert result.stdout.split() == ["True", "False"], result.stdout + result.stderr


def test_floors_come_only_from_runs_of_that_benchmark(tmp_path, monkeypatch):
    """`make noise-floor BENCH=Softmax`: asv's results file still holds Attention's and Matmul's
    values from an earlier run; they must not become 0.0% floors, and the floor learned earlier
    for Attention must stay as it was."""
    softmax = (TIME, ("'xla'",))
    attention = ("benchmarks.Attention.time_device", ("'xla'",))
    matmul = ("benchmarks.Matmul.time_device", ("'xla'",))
    stale = {attention: dataclasses.replace(fakes.asv_timed(2e-3, 1e-7), started_at=1.0),
             matmul: dataclasses.replace(fakes.asv_timed(3e-3, 1e-7), started_at=1.0)}
    values = iter([1.0e-3, 1.25e-3, 1.1e-3])
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: "c" * 40)
    monkeypatch.setattr(asv_tools, "bench", lambda revisions, bench_regex=None: "test-machine")
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit:
                        {**stale, softmax: _fresh(fakes.asv_timed(next(values), 1e-7))})
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
    rows = asv_tools.compare({matmul: fakes.asv_timed(3e-3, 1e-7)},
                             {matmul: fakes.asv_timed(3e-3, 1e-7, seed=1)})
    text = asv_tools.render(rows, asv_tools.load_floors("test-machine", results))
    assert "noise floor" in text.splitlines()[0] and " none " in text.splitlines()[2]


def test_compare_of_a_commit_with_itself_says_so(monkeypatch, capsys):
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: "c" * 40)
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit:
                        {(TIME, ("'xla'",)): fakes.asv_timed(1e-3, 1e-7)})
    assert asv_tools.run("main", "HEAD", machine="test-machine") == 0
    out = capsys.readouterr().out
    assert "main and HEAD are the same commit (cccccccc): nothing to compare" in out
    assert "1.000" not in out and "Softmax.time_device" in out


def test_a_speedup_is_as_noisy_as_its_own_time_and_the_baselines_together():
    """track_speedup is a baseline's median over ours: a quiet kernel beside a noisy baseline
    (a CPU's XLA at 17%) moves by the baseline's noise, which its own time's gap misses."""
    case = ("'f32-64x1000'", "'fwd'")
    ours, xla, other_case = ("'pallas'", *case), ("'xla'", *case), ("'xla'", "'big'", "'fwd'")
    speedup = "benchmarks.Softmax.track_speedup"
    timed = fakes.asv_timed
    base = {(TIME, ours): timed(1e-3, 1e-6), (TIME, xla): timed(1e-3, 1.5e-4, n=50),
            (TIME, other_case): timed(1e-3, 3e-4, n=7), (speedup, ours): _tracked(1.0)}
    head = {(TIME, ours): timed(1e-3, 1e-6, seed=1),
            (TIME, xla): timed(1e-3, 1.5e-4, n=50, seed=1),
            (TIME, other_case): timed(1e-3, 3e-4, n=7, seed=1), (speedup, ours): _tracked(0.9)}
    rows = {(row.benchmark.rsplit(".", 1)[-1], row.params): row
            for row in asv_tools.compare(base, head)}
    own, baseline = rows[("time_device", ours)].gap, rows[("time_device", xla)].gap
    assert own < 0.1 < own + baseline < rows[("time_device", other_case)].gap
    assert rows[("track_speedup", ours)].gap == pytest.approx(own + baseline)
    assert rows[("track_speedup", ours)].verdict == "same (within sample noise)"
    alone = {key: value for key, value in base.items() if key[1] != xla and key[1] != other_case}
    assert asv_tools.compare(alone, head)[-1].verdict == "worse (no samples)"  # without peers


def test_base_rows_of_earlier_runs_the_head_did_not_select_are_left_out_not_failed():
    """kernels bench measures the base itself: a base row the head lacks failed on the head
    if this run measured it, and is an earlier run's (another selection) if not; a reused
    base (no start given) keeps every missing row a failure."""
    def stamped(value, at):
        return asv_tools.Result(value, None, None, started_at=at)

    kept, failed, earlier = (("b.S.track_tflops", (p,)) for p in ("a", "b", "c"))
    base = {kept: stamped(1.0, 2000), failed: stamped(1.0, 2000), earlier: stamped(1.0, 999)}
    head = {kept: stamped(1.0, 3000), failed: stamped(None, 3000)}
    assert asv_tools.earlier_runs_only(base, head, since_ms=1000) == {earlier}
    assert asv_tools.earlier_runs_only(base, {kept: head[kept]}, since_ms=1000) == {earlier}
    assert asv_tools.earlier_runs_only(base, head, since_ms=None) == set()
    assert asv_tools.earlier_runs_only({earlier: stamped(1.0, None)}, {}, 1000) == {earlier}


def test_dashboard_metrics_the_heads_run_did_not_record_are_left_out_not_failed():
    """The gate's run (kernels bench --base, no --dashboard) records no dashboard metric: a
    base holding them (an earlier dashboard run) fails nothing for it; one metric row missing
    beside others of its method is still a failure, and so is a missing time row."""
    def plain(value):
        return asv_tools.Result(value, None, None)

    tflops, other_tflops = (("benchmarks.S.track_tflops", (p,)) for p in ("a", "b"))
    launch, time_row = ("benchmarks.S.track_launch", ("a",)), (TIME, ("'b'",))
    base = {tflops: plain(1.0), other_tflops: plain(1.0), launch: plain(5.0),
            time_row: plain(1e-3)}
    assert asv_tools.unrecorded_metrics(base, {}) == {tflops, other_tflops, launch}
    assert asv_tools.unrecorded_metrics(base, {tflops: plain(1.0)}) == {launch}
    assert time_row not in asv_tools.unrecorded_metrics(base, {tflops: plain(1.0)})


def test_the_gate_records_time_and_memory_and_a_dashboard_run_everything(monkeypatch, capsys):
    """`kernels bench --base` (the gate) measures without the dashboard metrics unless
    --dashboard, interleaved or (--sequential) through asv; `kernels bench` alone (for the
    dashboard) always records them."""
    from kernels import cli
    from kernels.bench import breakdown, interleaved

    asked, gated = [], []
    monkeypatch.setattr(asv_tools, "bench",
                        lambda revisions, bench_regex=None, dashboard=True:
                        asked.append(dashboard) or "m")
    monkeypatch.setattr(asv_tools, "run", lambda *args, **kwargs: 0)
    monkeypatch.setattr(asv_tools, "full_hash", lambda rev: rev * 40)
    monkeypatch.setattr(asv_tools, "register_machine", lambda: "m")
    monkeypatch.setattr(breakdown, "report", lambda *args, **kwargs: "")
    monkeypatch.setattr(interleaved, "gate", lambda base, head, **kwargs:
                        gated.append((base, head, kwargs["dashboard"])) or 0)
    for argv in (["bench"], ["bench", "--base", "a", "--sequential"],
                 ["bench", "--base", "a", "--sequential", "--dashboard"],
                 ["bench", "--base", "a"], ["bench", "--base", "a", "--dashboard"]):
        assert cli.main(argv) == 0
    assert asked == [True, False, True]
    assert gated == [("a", "HEAD", False), ("a", "HEAD", True)]
    assert capsys.readouterr().out.count("--dashboard also records") == 1


def test_throughputs_are_as_noisy_as_the_device_time_they_come_from():
    """TFLOP/s, GB/s, roofline and speedup are the time row's median inverted: a change that
    is noise in time_device is noise in them too; the host launch cost is never gated."""
    params = ("'xla'",)
    base = {(TIME, params): fakes.asv_timed(1e-3, 3e-4, n=7),
            ("benchmarks.Softmax.track_gbps", params): _tracked(100.0),
            ("benchmarks.Softmax.track_launch", params): _tracked(10.0)}
    head = {(TIME, params): fakes.asv_timed(1e-3, 3e-4, n=7, seed=1),
            ("benchmarks.Softmax.track_gbps", params): _tracked(80.0),
            ("benchmarks.Softmax.track_launch", params): _tracked(12.0)}
    rows = {row.benchmark.rsplit(".", 1)[-1]: row for row in asv_tools.compare(base, head)}
    assert rows["track_gbps"].gap == rows["time_device"].gap > 0.25
    assert rows["track_gbps"].verdict == "same (within sample noise)"
    assert rows["track_launch"].verdict == "same (within host noise)"
    assert asv_tools.exit_status(list(rows.values())) == 0
    head[("benchmarks.Softmax.track_launch", params)] = _tracked(15.0)  # past the host gap
    launch = [row for row in asv_tools.compare(base, head) if "launch" in row.benchmark]
    assert launch[0].verdict == "worse (host clock, not gated)"
    assert asv_tools.exit_status(launch) == 0


# Which way a unit is better follows from what it measures: a rate or a ratio of speeds is
# better higher, a time or a size lower. A unit neither rule knows needs a decision here.
def _lower_is_better(unit: str) -> bool:
    if unit.endswith("/s") or unit in ("x", "of roof"):
        return False  # work per second, speedup, fraction of the roofline
    if unit in ("s", "B") or unit.startswith("us"):
        return True  # device or host time, bytes of memory
    raise AssertionError(f"unit {unit!r}: say here whether more of it is better")


def test_each_metrics_direction_follows_its_unit():
    assert set(asv_tools.UNITS) == set(asv_tools.LOWER_IS_BETTER)
    for metric, unit in asv_tools.UNITS.items():
        assert asv_tools.LOWER_IS_BETTER[metric] == _lower_is_better(unit), (metric, unit)


@pytest.mark.parametrize("metric", sorted(asv_tools.LOWER_IS_BETTER))
def test_a_change_in_each_metric_reads_the_right_way_up(metric):
    """Every metric of the table, halved and doubled: a drop in a higher-is-better metric is
    worse and a rise better; the other way round for lower-is-better ones."""
    name = f"benchmarks.Softmax.{metric}"
    lower = asv_tools.LOWER_IS_BETTER[metric]
    timed = metric.startswith("time_")
    _, drop = asv_tools.verdict(name, _tracked(2.0), _tracked(1.0), min_gap=0.05)
    _, rise = asv_tools.verdict(name, _tracked(1.0), _tracked(2.0), min_gap=0.05)
    good, bad = ("faster", "slower") if timed else ("better (no samples)", "worse (no samples)")
    assert (drop, rise) == ((good, bad) if lower else (bad, good)), metric


def test_the_default_gap_is_the_documented_one():
    """The documents (README.md or docs/*.md): each row's gap is "1% (`--min-gap`)" where the
    clock resolves it; the verdicts' default gap must say the same."""
    from correctness_tests import documents

    (percent,) = documents.sentence(r"(\d+)% \(`--min-gap`\)")
    assert asv_tools.DEFAULT_MIN_GAP == pytest.approx(int(percent) / 100)


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


def test_each_row_takes_its_own_suites_device_time_and_says_so():
    """Two operations with the same parameters: each derived row takes its own suite's time
    gap (a suite read as 'benchmarks' would share one), and its reason names device time."""
    params = ("'xla'", "'c'", "'fwd'")
    noisy, quiet = "benchmarks.Noisy", "benchmarks.Quiet"
    base = {(f"{noisy}.time_device", params): fakes.asv_timed(1e-3, 3e-4, n=7),
            (f"{quiet}.time_device", params): fakes.asv_timed(1e-3, 1e-7),
            (f"{noisy}.track_gbps", params): _tracked(100.0),
            (f"{quiet}.track_gbps", params): _tracked(100.0)}
    head = {**base, (f"{noisy}.time_device", params): fakes.asv_timed(1e-3, 3e-4, n=7, seed=1),
            (f"{quiet}.track_gbps", params): _tracked(90.0)}
    rows = {row.benchmark: row for row in asv_tools.compare(base, head)}
    assert rows[f"{noisy}.track_gbps"].gap == rows[f"{noisy}.time_device"].gap > 0.25
    assert rows[f"{noisy}.track_gbps"].why.startswith("device time's: sample spread")
    assert rows[f"{quiet}.track_gbps"].gap == asv_tools.DEFAULT_MIN_GAP
    assert rows[f"{quiet}.track_gbps"].verdict == "worse (no samples)"


def test_only_the_launch_cost_takes_the_host_gap():
    """Memory is judged at the plain gap: a 10% rise is worse, not within host noise; a
    launch cost under the plain gap is plain 'same (no samples)'."""
    params = ("'xla'",)
    memory, launch = "benchmarks.S.track_peak_memory", "benchmarks.S.track_launch"
    base = {(memory, params): _tracked(100.0), (launch, params): _tracked(10.0)}
    head = {(memory, params): _tracked(110.0), (launch, params): _tracked(10.05)}
    rows = {row.benchmark: row for row in asv_tools.compare(base, head)}
    assert (rows[memory].verdict, rows[memory].gap) == ("worse (no samples)",
                                                        asv_tools.DEFAULT_MIN_GAP)
    assert rows[launch].verdict == "same (no samples)"
    assert rows[launch].gap == asv_tools.HOST_GAP and "host clock" in rows[launch].why


def test_a_speedups_gap_adds_the_widest_other_implementation_not_its_own_twice():
    case = ("'c'", "'fwd'")
    ours, quiet, noisy = (("'" + name + "'", *case) for name in ("ours", "quiet", "noisy"))
    speedup = "benchmarks.Softmax.track_speedup"
    times = {ours: (1e-3, 6e-5), quiet: (1e-3, 1e-7), noisy: (1e-3, 3e-5)}
    base = {(TIME, p): fakes.asv_timed(c, s, n=30) for p, (c, s) in times.items()}
    head = {(TIME, p): fakes.asv_timed(c, s, n=30, seed=1) for p, (c, s) in times.items()}
    base[(speedup, ours)], head[(speedup, ours)] = _tracked(1.0), _tracked(1.0)
    rows = {(row.benchmark, row.params): row for row in asv_tools.compare(base, head)}
    own, widest = rows[(TIME, ours)].gap, rows[(TIME, noisy)].gap
    assert own > widest > rows[(TIME, quiet)].gap  # ours is the noisiest of the three
    assert rows[(speedup, ours)].gap == pytest.approx(own + widest)
    assert rows[(speedup, ours)].why == (f"device time's: {rows[(TIME, ours)].why} plus the "
                                         f"baselines' {widest:.1%}")
    alone = asv_tools._with_baselines(asv_tools.Threshold(0.01), "benchmarks.S", ours, {})
    assert alone == asv_tools.Threshold(0.01)  # no other implementation timed: its own gap
    quiet_own = asv_tools._with_baselines(asv_tools.Threshold(0.01), "benchmarks.S", ours,
                                          {("benchmarks.S", noisy): asv_tools.Threshold(0.02)})
    assert quiet_own == asv_tools.Threshold(0.03, "its own 1.0% plus the baselines' 2.0%")


def test_the_samples_gap_reads_both_sides_and_names_a_launch_bound_kernel():
    wide, tight = fakes.asv_timed(1e-3, 3e-4, n=7), fakes.asv_timed(1e-3, 1e-7, n=7, seed=1)
    assert asv_tools.threshold(TIME, wide, tight).why == asv_tools.threshold(TIME, tight,
                                                                             wide).why
    spread = asv_tools.threshold(TIME, wide, tight).why
    assert spread.startswith("sample spread ") and spread != "sample spread 0.0%"
    short = asv_tools.threshold(TIME, fakes.asv_timed(5e-6, 2e-6, n=7),
                                fakes.asv_timed(8e-6, 2e-6, n=7, seed=1))
    assert short.why.endswith(" us kernel (launch-bound)")
    assert float(short.why.split(", a ")[1].split()[0]) < 6.0  # the shorter side's median
    assert ", a " not in spread  # a 1 ms kernel is not launch-bound


def test_runs_measured_once_learn_no_floor_and_the_since_boundaries_count_the_run():
    key = (TIME, ("'xla'",))
    assert asv_tools.floors_from_runs([{key: fakes.asv_timed(1e-3, 1e-6)}]) == {}
    stamped = asv_tools.Result(1.0, None, None, started_at=1000)
    assert asv_tools.measured_since({key: stamped}, 1000) == {key: stamped}  # at the start
    assert asv_tools.earlier_runs_only({key: stamped}, {}, since_ms=1000) == set()


def test_asvs_tables_write_every_declared_unit(monkeypatch):
    """asv 0.6.6 writes a unit only for seconds and bytes (`make bench` printed TFLOP/s as
    0.13796688283128342); with the plug-in's hook run, as asv runs it before any command,
    every tracked number of a shipped result comes out in asv's own table with the unit
    perf_tests/benchmarks.py declares, and no bare float."""
    import re

    from asv import results as asv_results
    from asv import util as asv_util
    from asv.commands import compare

    from kernels.bench import asv_plugin, dashboard

    monkeypatch.setattr(asv_util, "human_value", asv_util.human_value)  # restored afterwards
    monkeypatch.setattr(compare, "human_value", compare.human_value)
    monkeypatch.setattr("sys.argv", ["asv", "show"])  # a command that names no machine
    asv_plugin.setup()
    listing = json.loads((dashboard.SHIPPED_RESULTS / "benchmarks.json").read_text())
    tracked = 0
    for machine in ("nvidia-h100-80gb-hbm3", "nvidia-h200"):
        for result in asv_results.iter_results_for_machine(str(dashboard.SHIPPED_RESULTS),
                                                           machine):
            for name in result.get_all_result_keys():
                unit = listing[name]["unit"]
                if ".track_" not in name or unit == "bytes":  # asv writes bytes itself
                    continue
                values = [v for v in result.get_result_value(name, listing[name]["params"])
                          if v is not None and v == v]
                _, table = asv_results.format_benchmark_result(result, listing[name])
                assert table.count(f" {unit}") == len(values), (name, unit, table)
                assert not re.search(r"\d\.\d{6,}", table), (name, table)
                tracked += len(values)
    assert tracked, "the shipped results hold tracked numbers"
