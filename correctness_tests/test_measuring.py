"""The benchmarks' measuring (perf_tests/measuring.py): samples until the median is pinned, a
journal that survives its writer, and a supervisor that contains a worker's hang, crash or
exception to the one parameter set in flight."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernels.core import timing
from perf_tests import measuring


def _source(values):
    """take(n) over a fixed sequence of samples, recording the batch sizes asked for."""
    stream = iter(values)
    asked = []

    def take(n):
        asked.append(n)
        return [next(stream) for _ in range(n)]
    return take, asked


def test_tight_samples_stop_at_the_minimum():
    take, asked = _source([1.0 + 1e-4 * (i % 3) for i in range(1000)])
    samples, why = measuring.collect_samples(take, measuring.GPU_SAMPLING,
                                             timing.median_halfwidth)
    assert why == "pinned" and len(samples) == measuring.GPU_SAMPLING.min_samples
    assert asked == [measuring.GPU_SAMPLING.min_samples]


def test_noisy_samples_double_until_the_median_is_pinned():
    # CV 2%: the 99% half-width reaches 0.4% near n = (2.576 * 1.2533 * 2 / 0.4)^2 ~ 260,
    # beyond the cap, so the rule stops at max_samples with batches that doubled.
    values = [1.0 + 0.02 * ((i * 7919) % 11 - 5) / 5 for i in range(1000)]
    rule = measuring.Sampling(min_samples=10, max_samples=80, target=0.004, max_seconds=60)
    take, asked = _source(values)
    samples, why = measuring.collect_samples(take, rule, timing.median_halfwidth)
    assert why == "max-samples" and len(samples) == 80
    assert asked == [10, 10, 20, 40]


def test_a_slow_sampler_stops_at_the_time_cap():
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]
    take, _ = _source([1.0 + 0.05 * (i % 2) for i in range(1000)])
    rule = measuring.Sampling(min_samples=10, max_samples=100, max_seconds=2.5)
    samples, why = measuring.collect_samples(take, rule, timing.median_halfwidth, clock=clock)
    assert why == "time-cap" and len(samples) < 100


def test_an_older_kernels_gets_a_fixed_count():
    take, _ = _source([1.0] * 100)
    samples, why = measuring.collect_samples(take, measuring.GPU_SAMPLING, None)
    assert why == "fixed" and len(samples) == measuring.FALLBACK_SAMPLES


def test_the_minimum_lets_asvs_mann_whitney_fire():
    """asv's Mann-Whitney at p < 0.002 cannot fire on fewer than 7 samples a side."""
    from asv import _stats

    base = [1.0 + 1e-4 * i for i in range(measuring.GPU_SAMPLING.min_samples)]
    head = [1.02 * s for s in base]
    assert _stats.mann_whitney_u(base, head)[1] < 0.002
    assert measuring.CPU_SAMPLING.min_samples >= 7


def test_median_halfwidth_shrinks_with_count_and_ignores_an_outlier():
    tight = [1.0, 1.001, 0.999, 1.0005, 0.9995] * 4
    assert timing.median_halfwidth(tight * 4) < timing.median_halfwidth(tight)
    assert timing.median_halfwidth(tight + [50.0]) < 0.01


@pytest.mark.parametrize("bad", [dict(min_samples=1), dict(min_samples=20, max_samples=10),
                                 dict(target=0), dict(max_seconds=-1)])
def test_bad_sampling_is_refused(bad):
    with pytest.raises(ValueError):
        measuring.Sampling(**bad)


def test_a_line_cut_short_is_skipped(tmp_path: Path):
    journal = tmp_path / "j.jsonl"
    measuring.append(journal, {"event": "done", "key": "a/b/c/fwd", "samples": [1.0]})
    with open(journal, "a") as out:
        out.write('{"event": "done", "key": "a/b/c/bw')  # the writer was killed here
    assert [e["key"] for e in measuring.read_journal(journal)] == ["a/b/c/fwd"]


# A stand-in worker: by implementation name it measures, raises, aborts, hangs or dies
# between parameter sets, as a faulting kernel would take the real worker down.
# Implementations named "ahead-..." compile ahead: unless the worker is told --serial, all of
# them compile first, and an "ahead-raise" raises there, an "ahead-hang" hangs there (in a
# serial worker they raise and hang as themselves).
FAKE_WORKER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {here!r})
    import measuring
    journal, keys = sys.argv[1], json.load(open(sys.argv[2]))
    serial = "--serial" in sys.argv[3:]
    measuring.append(journal, {{"event": "worker", "process_s": 0.0, "backend_s": 0.0}})
    early = [text for text in keys if text.split("/")[1].startswith("ahead-")]
    if early and not serial:
        measuring.append(journal, {{"event": "ahead", "keys": early, "threads": 2}})
        if any(text.split("/")[1] == "ahead-hang" for text in early):
            time.sleep(3600)
        if any(text.split("/")[1] == "ahead-raise" for text in early):
            measuring.append(journal, {{"event": "ahead-failed", "reason": "CUDA_ERROR_X"}})
            sys.exit(measuring.EXIT_AHEAD_FAILED)
        measuring.append(journal, {{"event": "ahead-done", "seconds": 0.0}})
    for text in keys:
        impl = text.split("/")[1].removeprefix("ahead-")
        measuring.append(journal, {{"event": "start", "key": text}})
        if impl == "hang":
            time.sleep(3600)
        if impl == "abort":
            os.abort()
        if impl == "raise":
            measuring.append(journal, {{"event": "failed", "key": text,
                                        "reason": "XlaRuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS"}})
            sys.exit(measuring.EXIT_AFTER_FAILURE)
        measuring.append(journal, {{"event": "done", "key": text, "samples": [1e-3] * 10,
                                    "stop": "pinned", "pid": os.getpid(), "serial": serial}})
""")


@pytest.fixture
def fake_worker(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER.format(here=str(Path(measuring.__file__).parent)))
    return [sys.executable, str(script)]


def _keys(*impls):
    return [("op", impl, "case", "fwd") for impl in impls]


@pytest.mark.slow
def test_each_fault_costs_only_its_own_parameter_set(tmp_path: Path, fake_worker):
    keys = _keys("a", "hang", "b", "abort", "c", "raise", "d")
    journal = tmp_path / "op.jsonl"
    started = time.monotonic()
    records = measuring.ensure_measured(keys, journal, worker_command=fake_worker,
                                        limit=lambda key: 2.0, poll_s=0.05, log=lambda _: None)
    took = time.monotonic() - started
    failed = {key[1]: record["reason"] for key, record in records.items()
              if record["event"] == "failed"}
    assert set(failed) == {"hang", "abort", "raise"}
    assert "timed out" in failed["hang"] and "limit 2 s" in failed["hang"]
    assert "SIGABRT" in failed["abort"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in failed["raise"]
    assert all(records[k]["event"] == "done" for k in _keys("a", "b", "c", "d"))
    # a fresh worker after each fault: the parameter sets after a fault are not run by it
    pids = {key[1]: records[key]["pid"] for key in _keys("a", "b", "c", "d")}
    assert len({pids["a"], pids["b"], pids["c"], pids["d"]}) == 4
    assert took < 15, f"the run took {took:.0f} s: the hang's limit was 2 s"


@pytest.mark.slow
@pytest.mark.item_limit(60)  # a supervisor that never goes serial restarts workers forever
@pytest.mark.parametrize("fault", ["ahead-raise", "ahead-hang"])
def test_a_fault_while_compiling_ahead_is_found_by_a_serial_worker(tmp_path: Path, fake_worker,
                                                                   fault):
    """The worker that compiled ahead cannot say whose the fault was: its replacement compiles
    one parameter set at a time, and only the faulting one fails."""
    keys = _keys("ahead-a", fault, "ahead-b", "c")
    logged = []
    started = time.monotonic()
    records = measuring.ensure_measured(keys, tmp_path / "op.jsonl", worker_command=fake_worker,
                                        limit=lambda key: 2.0, poll_s=0.05, log=logged.append)
    assert time.monotonic() - started < 15
    assert {key[1] for key, record in records.items() if record["event"] == "failed"} == {fault}
    assert all(records[key]["event"] == "done" and records[key]["serial"]
               for key in _keys("ahead-a", "ahead-b"))
    reason = records[_keys(fault)[0]]["reason"]
    assert ("CUDA_ERROR_ILLEGAL_ADDRESS" if fault == "ahead-raise" else "timed out") in reason
    said = next(line for line in logged if "compiling ahead failed" in line)
    assert ("CUDA_ERROR_X" if fault == "ahead-raise" else "still compiling ahead") in said


@pytest.mark.slow
def test_a_worker_compiles_ahead_unless_told_serial(tmp_path: Path, fake_worker):
    records = measuring.ensure_measured(_keys("ahead-a", "ahead-b"), tmp_path / "op.jsonl",
                                        worker_command=fake_worker, limit=lambda key: 30.0,
                                        poll_s=0.05, log=lambda _: None)
    assert not any(record["serial"] for record in records.values())


@pytest.mark.slow
def test_what_the_journal_holds_is_not_measured_again(tmp_path: Path, fake_worker):
    journal = tmp_path / "op.jsonl"
    measuring.append(journal, {"event": "done", "key": "op/a/case/fwd", "samples": [5.0],
                               "pid": -1})
    records = measuring.ensure_measured(_keys("a", "b"), journal, worker_command=fake_worker,
                                        limit=lambda key: 30.0, poll_s=0.05, log=lambda _: None)
    assert records[_keys("a")[0]]["pid"] == -1  # kept from the interrupted run
    assert records[_keys("b")[0]]["event"] == "done"


@pytest.mark.slow
def test_a_worker_that_cannot_start_fails_every_key_once(tmp_path: Path):
    records = measuring.ensure_measured(
        _keys("a", "b"), tmp_path / "op.jsonl",
        worker_command=[sys.executable, "-c", "import sys; sys.exit('no kernels here')"],
        poll_s=0.05, log=lambda _: None)
    assert all(r["event"] == "failed" and "did not start" in r["reason"]
               and "no kernels here" in r["reason"] for r in records.values())


@pytest.mark.slow
def test_the_real_worker_measures_a_cpu_case(tmp_path: Path):
    """The worker this file runs, on the `kernels` of this checkout: samples, phases, peak;
    what cannot run here is skipped with the reason (the benchmark processes start no
    backend to find out)."""
    journal = tmp_path / "softmax.jsonl"
    key = ("softmax", "xla", "f32-64x1000", "fwd")
    cuda = ("softmax", "cuda", "f32-64x1000", "fwd")
    records = measuring.ensure_measured([cuda, key], journal, log=lambda _: None)
    assert records[cuda]["event"] == "skipped" and "GPU" in records[cuda]["reason"]
    record = records[key]
    assert record["event"] == "done", record
    assert len(record["samples"]) >= measuring.CPU_SAMPLING.min_samples
    assert record["method"] == "host-clock" and record["peak_bytes"] > 0
    assert set(record["phases"]) == {"inputs", "compile", "warmup", "sampling", "memory",
                                     "launch"}
    worker = [e for e in measuring.read_journal(journal) if e["event"] == "worker"]
    assert len(worker) == 1 and worker[0]["backend_s"] > 0
    assert json.loads(journal.read_text().splitlines()[-1])["key"] == measuring.key_id(key)


@pytest.mark.slow
def test_the_real_worker_compiles_a_cases_jax_sets_ahead(tmp_path: Path):
    journal = tmp_path / "softmax.jsonl"
    keys = [("softmax", impl, "f32-64x1000", direction) for impl in ("xla", "pallas", "torch")
            for direction in ("fwd", "bwd")]
    records = measuring.ensure_measured(keys, journal, log=lambda _: None)
    assert all(record["event"] == "done" for record in records.values()), records
    entries = measuring.read_journal(journal)
    ahead = [e for e in entries if e["event"] == "ahead"]
    assert len(ahead) == 1 and set(ahead[0]["keys"]) == {
        measuring.key_id(key) for key in keys if key[1] != "torch"}
    events = [e["event"] for e in entries]
    assert events.index("ahead-done") < events.index("start")  # compiled before any sample


def _fake_measure(key, inputs, device, dashboard, ready=None):
    if key[1] == "torch":
        raise timing.NoKernel("CUPTI recorded no kernel for it: it launches none")
    return {"samples": [1e-3] * 10, "phases": {}, "ready": ready is not None}


@pytest.mark.slow
def test_a_call_that_launches_no_kernel_is_skipped_and_the_worker_goes_on(tmp_path: Path,
                                                                          monkeypatch):
    monkeypatch.setattr(measuring, "_die_with_parent", lambda: None)
    monkeypatch.setattr(measuring, "_measure", _fake_measure)
    journal = tmp_path / "row_sum.jsonl"
    keys = [("row_sum", impl, "f32-64x1000", "bwd") for impl in ("torch", "xla")]
    assert measuring.worker(journal, keys, dashboard=False) == 0
    records = measuring.final_records(measuring.read_journal(journal))
    assert records[keys[0]]["event"] == "skipped" and "launches none" in records[keys[0]]["reason"]
    assert records[keys[1]]["event"] == "done"


# A stand-in live worker: the real `serve` loop and pipes, its backend and measurement faked;
# by implementation name a parameter set measures, hangs or aborts, and every opening prints
# to standard output, as libraries do, which must not reach the replies.
FAKE_LIVE_WORKER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {here!r})
    import measuring
    measuring._start_up = lambda keys: (None, {{"event": "worker", "pid": os.getpid(),
                                                "process_s": 0.0, "backend_s": 0.0}})
    measuring._unrunnable = lambda key: "no GPU here" if key[1] == "skip" else None
    measuring._make_inputs = lambda op, case: ((), 0.0)
    measuring._ahead_keys = lambda keys: []

    def open_(key, inputs, device, ready=None):
        print("a library's chatter on standard output", flush=True)
        if key[1] == "hang":
            time.sleep(3600)
        if key[1] == "abort":
            os.abort()
        return measuring._Held(impl=None, case=None, direction=key[3], timeable=None,
                               jitted=None, sampler=None, method="fake")
    measuring._open = open_
    measuring._sample = lambda held, device, lap: {{
        "samples": [1e-3] * 10, "method": "fake", "stop": "pinned", "throttled": 0,
        "clocks": [None] * 10, "pid": os.getpid()}}
    measuring._extras = lambda held, samples, device, dashboard, lap: {{}}
    sys.exit(measuring._main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_a_live_worker_over_real_pipes_contains_each_fault_and_keeps_its_replies_clean(
        tmp_path: Path):
    script = tmp_path / "fake_live_worker.py"
    script.write_text(FAKE_LIVE_WORKER.format(here=str(Path(measuring.__file__).parent)))
    keys = _keys("a", "hang", "b", "abort", "c", "skip")
    # The hang gets 2 s; the others 30 s, since a fresh worker's start (Python, numpy,
    # measuring) counts in its first item's limit and took over 2 s on a loaded CI machine.
    worker = measuring.LiveWorker("base", tmp_path / "w", keys,
                                  worker_command=[sys.executable, str(script)],
                                  limit=lambda key: 2.0 if key[1] == "hang" else 30.0,
                                  log=lambda _: None)
    journal = tmp_path / "op.jsonl"
    started = time.monotonic()
    skipped = worker.case(keys, journal)
    records = {key[1]: worker.measure(key, journal) for key in keys[:-1]}
    again = worker.measure(_keys("c")[0], journal, "confirm", 1)
    worker.close()
    assert time.monotonic() - started < 60  # the hang was cut at its limit, not an hour on
    assert set(skipped) == set(_keys("skip"))
    assert records["hang"]["reason"] == "timed out: no result after 2 s (limit 2 s)"
    assert records["abort"]["reason"].startswith("worker killed by SIGABRT")
    assert all(records[name]["event"] == "done" for name in "abc")
    assert len({records[name]["pid"] for name in "abc"}) == 3  # a fresh worker after each
    assert again["event"] == "done" and again["pid"] == records["c"]["pid"]  # the same one
    assert "chatter" in (tmp_path / "w" / "worker.stderr.log").read_text()
    assert len(measuring.read_journal(tmp_path / "w" / "workers.jsonl")) == 3


@pytest.mark.slow
def test_the_real_live_worker_keeps_a_cpu_case_open_between_rounds(tmp_path: Path):
    """The live worker this file runs, on this checkout's `kernels`: a second round of a
    parameter set costs its warm-up and samples, no compile."""
    key = ("softmax", "xla", "f32-64x1000", "fwd")
    cuda = ("softmax", "cuda", "f32-64x1000", "fwd")
    root = str(Path(__file__).resolve().parents[1])
    worker = measuring.LiveWorker("head", tmp_path / "w", [key, cuda],
                                  env={**os.environ, "PYTHONPATH": root}, log=lambda _: None)
    journal = tmp_path / "softmax.jsonl"
    try:
        assert set(worker.case([key, cuda], journal)) == {cuda}
        first = worker.measure(key, journal)
        second = worker.measure(key, journal, "confirm", 1)
    finally:
        worker.close()
    assert first["event"] == second["event"] == "done", (first, second)
    assert set(first["phases"]) == {"inputs", "compile", "warmup", "sampling", "memory",
                                    "launch"}
    assert set(second["phases"]) == {"warmup", "sampling"} and second["round"] == 1
    assert len(first["clocks"]) == len(first["samples"])
    assert first["peak_bytes"] > 0 and "peak_bytes" not in second
