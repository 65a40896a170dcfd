"""perf_tests/measuring.py driven in this process, through fakes: the supervisor's reading of a
worker that hangs, dies, raises or fails while compiling ahead (a scripted stand-in for
subprocess.Popen and a clock that moves only when the supervisor sleeps), the worker's loop
over cases and parameter sets (its backend, inputs, compilation and measurement faked), one
parameter set's measurement phase by phase, and the journal's small helpers.

No test here starts a process, a JAX backend or a CUDA context, or sleeps: they are the
mutation target `gate-measuring`'s tests (`isolation="fork"`). The slow tests that run real
worker processes are in test_measuring.py (marked slow).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import types
from pathlib import Path

import pytest

from correctness_tests import fakes
from kernels import registry, timing
from perf_tests import measuring


def _keys(*impls, op="op", case="case"):
    return [(op, impl, case, "fwd") for impl in impls]


def _ids(keys):
    return [measuring.key_id(key) for key in keys]


# -- the supervisor, with scripted workers ------------------------------------------------------

@dataclasses.dataclass
class Run:
    """What one stand-in worker sees: the journal, its keys (ids) and flags."""

    journal: Path
    keys: list[str]
    flags: list[str]
    pid: int
    stderr: Path  # the file the supervisor gave the worker's stderr

    def say(self, **entry):
        measuring.append(self.journal, entry)

    def complain(self, text):
        with open(self.stderr, "a") as out:
            out.write(text)


class Process:
    """A stand-in for subprocess.Popen: one step of its script per poll()."""

    def __init__(self, steps, pid):
        self.steps, self.pid, self.returncode = steps, pid, None

    def poll(self):
        if self.returncode is None:
            try:
                next(self.steps)
            except StopIteration as stop:
                self.returncode = 0 if stop.value is None else stop.value
        return self.returncode

    def wait(self):
        return self.returncode


class Workers:
    """Starts stand-in workers running `script(run)` (a generator: each `yield` is one poll);
    records every command and keyword, and os.killpg's calls."""

    def __init__(self, monkeypatch, script):
        self.script, self.started, self.killed, self.processes = script, [], [], {}
        self.clock = fakes.Clock()
        monkeypatch.setattr(measuring, "time", self.clock)
        monkeypatch.setattr(measuring.subprocess, "Popen", self.popen)
        monkeypatch.setattr(os, "killpg", self.killpg)

    def popen(self, command, **kwargs):
        assert len(self.started) < 50, "the supervisor starts workers without end"
        at = next(i for i, arg in enumerate(command) if ".todo." in arg)  # the keys file
        journal, keys_file, flags = command[at - 1], command[at], command[at + 1:]
        pid = 10_000_000 + len(self.started)  # above any pid_max: no real process
        keys = json.loads(Path(keys_file).read_text())
        self.started.append((command, kwargs, keys))
        run = Run(Path(journal), keys, flags, pid, Path(kwargs["stderr"].name))
        process = Process(self.script(run), pid)
        self.processes[pid] = process
        return process

    def killpg(self, pid, sig):
        self.killed.append((pid, sig, self.clock.now))
        self.processes[pid].returncode = -sig


def faulty(run):
    """Measures its keys in order, unless an implementation's name says to hang, abort or
    raise; "ahead-..." ones compile ahead first (unless --serial), "ahead-hang" hanging and
    "ahead-raise" raising there."""
    run.say(event="worker", pid=run.pid)
    yield
    early = [text for text in run.keys if text.split("/")[1].startswith("ahead-")]
    if early and "--serial" not in run.flags:
        run.say(event="ahead", keys=early, threads=2)
        yield
        names = {text.split("/")[1] for text in early}
        while "ahead-hang" in names:
            yield
        if "ahead-raise" in names:
            run.say(event="ahead-failed", reason="CUDA_ERROR_X")
            return measuring.EXIT_AHEAD_FAILED
        run.say(event="ahead-done", seconds=0.0)
        yield
    for text in run.keys:
        impl = text.split("/")[1].removeprefix("ahead-")
        run.say(event="start", key=text)
        yield
        while impl == "hang":
            yield
        if impl == "abort":
            run.complain("some noise\nFatal Python error: Aborted\n\n")
            return -signal.SIGABRT
        if impl == "raise":
            run.say(event="failed", key=text, reason="XlaRuntimeError: CUDA_ERROR_ILLEGAL")
            return measuring.EXIT_AFTER_FAILURE
        run.say(event="done", key=text, samples=[0.5, 1.0, 1.5], stop="pinned", pid=run.pid,
                serial="--serial" in run.flags)
        yield
    return 0


def _supervise(tmp_path, monkeypatch, keys, script=faulty, limit=2.0, **kwargs):
    workers = Workers(monkeypatch, script)
    logged = []
    kwargs.setdefault("worker_command", ["worker"])
    records = measuring.ensure_measured(keys, tmp_path / "op.jsonl", limit=lambda key: limit,
                                        poll_s=0.5, log=logged.append, **kwargs)
    return records, workers, logged


def test_each_fault_fails_only_its_own_parameter_set_and_a_fresh_worker_takes_the_rest(
        tmp_path, monkeypatch):
    keys = _keys("a", "hang", "b", "abort", "c", "raise", "d")
    records, workers, logged = _supervise(tmp_path, monkeypatch, keys)
    failed = {key[1]: record["reason"] for key, record in records.items()
              if record["event"] == "failed"}
    assert set(failed) == {"hang", "abort", "raise"}
    assert failed["hang"].startswith("timed out: no result after") and "limit 2 s" in failed["hang"]
    assert failed["abort"] == "worker killed by SIGABRT: Fatal Python error: Aborted"
    assert "CUDA_ERROR_ILLEGAL" in failed["raise"]
    assert all(records[key]["event"] == "done" for key in _keys("a", "b", "c", "d"))
    assert list(records) == keys  # in the order asked
    # a fresh worker after each fault, given only the keys left
    assert [ids for _, _, ids in workers.started] == [
        _ids(keys), _ids(keys[2:]), _ids(keys[4:]), _ids(keys[6:])]
    assert len({records[key]["pid"] for key in _keys("a", "b", "c", "d")}) == 4
    assert [(pid, sig) for pid, sig, _ in workers.killed] == [(min(workers.processes),
                                                               signal.SIGKILL)]
    assert any("op/hang/case/fwd: timed out" in line for line in logged)
    assert "  measured op/a/case/fwd: 3 samples, median 1000000.00 us (pinned)" in logged


def test_a_hung_parameter_set_runs_its_whole_limit_and_no_longer(tmp_path, monkeypatch):
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("hang"), limit=2.0)
    (_, _, killed_at), = workers.killed
    started_at = 1000.0 + 0.5  # the "start" line is read at the second poll
    assert 2.0 < killed_at - started_at <= 2.0 + 0.5
    assert records[_keys("hang")[0]]["reason"] == \
        f"timed out: no result after {killed_at - started_at:.0f} s (limit 2 s)"


def test_each_parameter_set_gets_its_own_limit(tmp_path, monkeypatch):
    keys = _keys("hang", "slow")

    def script(run):
        run.say(event="worker")
        yield
        for text in run.keys:
            run.say(event="start", key=text)
            for _ in range(7):  # 3.5 s: past the hang's 2 s, within slow's 5 s
                yield
            run.say(event="done", key=text, samples=[1.0], stop="pinned")
            yield
    workers = Workers(monkeypatch, script)
    records = measuring.ensure_measured(
        keys, tmp_path / "op.jsonl", worker_command=["w"], poll_s=0.5, log=lambda _: None,
        limit=lambda key: {"hang": 2.0, "slow": 5.0}[key[1]])
    assert records[keys[0]]["event"] == "failed" and "(limit 2 s)" in records[keys[0]]["reason"]
    assert records[keys[1]]["event"] == "done"
    assert len(workers.started) == 2


def test_a_worker_that_never_gets_ready_is_stopped_at_the_start_limit(tmp_path, monkeypatch):
    def script(run):
        while True:
            yield
    records, workers, logged = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script)
    (_, _, killed_at), = workers.killed
    assert measuring.WORKER_START_LIMIT_S < killed_at - 1000.0 <= measuring.WORKER_START_LIMIT_S + 1
    for record in records.values():
        assert record["event"] == "failed"
        assert record["reason"].startswith("timed out: the worker did not go on after")
        assert f"(limit {measuring.WORKER_START_LIMIT_S:.0f} s)" in record["reason"]
    assert len(workers.started) == 1
    assert any(line.startswith("kernelperf: measuring worker: timed out") for line in logged)


def test_a_ready_worker_stuck_between_parameter_sets_gets_the_item_limit(tmp_path, monkeypatch):
    """Between parameter sets the limit is ITEM_LIMIT_S from its last result; the keys left go
    to the next worker, which measures them."""
    def script(run):
        run.say(event="worker")
        yield
        text = run.keys[0]
        run.say(event="start", key=text)
        yield
        run.say(event="done", key=text, samples=[1.0], stop="pinned")
        yield
        if len(run.keys) > 1:
            while True:
                yield
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script,
                                     limit=1000.0)
    (_, _, killed_at), = workers.killed
    done_at = 1000.0 + 1.0  # the "done" line is read at the third poll
    assert measuring.ITEM_LIMIT_S < killed_at - done_at <= measuring.ITEM_LIMIT_S + 0.5
    assert all(record["event"] == "done" for record in records.values())
    assert [ids for _, _, ids in workers.started] == [_ids(_keys("a", "b")), _ids(_keys("b"))]


def test_a_worker_that_dies_before_it_is_ready_fails_every_key_saying_it_did_not_start(
        tmp_path, monkeypatch):
    def script(run):
        run.complain("Traceback ...\nModuleNotFoundError: No module named 'kernels'\n")
        return 1
        yield
    records, workers, logged = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script)
    assert len(workers.started) == 1
    for record in records.values():
        assert record["reason"] == ("worker did not start (worker exit status 1: "
                                    "ModuleNotFoundError: No module named 'kernels')")
    entries = measuring.read_journal(tmp_path / "op.jsonl")
    assert sorted(e["key"] for e in entries if e["event"] == "failed") == _ids(_keys("a", "b"))
    assert logged == ["kernelperf: measuring worker: " + records[_keys("a")[0]]["reason"]]


def test_a_worker_that_dies_between_parameter_sets_costs_no_parameter_set(tmp_path, monkeypatch):
    def script(run):
        run.say(event="worker")
        yield
        run.say(event="start", key=run.keys[0])
        yield
        run.say(event="done", key=run.keys[0], samples=[1.0], stop="pinned")
        return -signal.SIGSEGV if len(run.keys) > 1 else 0
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script)
    assert all(record["event"] == "done" for record in records.values())
    assert len(workers.started) == 2


@pytest.mark.parametrize("code", [0, measuring.EXIT_AFTER_FAILURE])
def test_a_worker_that_exits_with_a_key_in_flight_fails_that_key(tmp_path, monkeypatch, code):
    """Exit 0 or EXIT_AFTER_FAILURE are clean only once the key in flight has its record."""
    def script(run):
        run.say(event="worker")
        yield
        run.say(event="start", key=run.keys[0])
        return code
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script)
    assert records[_keys("a")[0]]["reason"] == f"worker exit status {code}"
    assert records[_keys("b")[0]]["event"] == "failed"  # the next worker does the same to b


def test_a_line_written_in_two_parts_is_read_once_whole(tmp_path, monkeypatch):
    def script(run):
        run.say(event="worker")
        yield
        for text in run.keys:
            run.say(event="start", key=text)
            line = json.dumps({"event": "done", "key": text, "samples": [1.0], "stop": "pinned"})
            with open(run.journal, "a") as out:
                out.write(line[:9])
            yield
            with open(run.journal, "a") as out:
                out.write(line[9:] + "\n")
        return 0
    records, workers, logged = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script)
    assert len(workers.started) == 1
    assert all(record["event"] == "done" for record in records.values())
    assert sum(line.startswith("  measured") for line in logged) == 2


def test_a_line_that_is_no_json_is_passed_over_and_the_lines_after_it_read(tmp_path,
                                                                             monkeypatch):
    def script(run):
        run.say(event="worker")
        yield
        run.say(event="start", key=run.keys[0])
        yield
        with open(run.journal, "a") as out:
            out.write("not json\n")
        run.say(event="done", key=run.keys[0], samples=[1.0], stop="pinned")
        return 0
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("a"), script)
    assert records[_keys("a")[0]]["event"] == "done" and len(workers.started) == 1


def test_every_line_a_worker_writes_before_it_exits_is_read(tmp_path, monkeypatch):
    def script(run):
        run.say(event="worker")
        for text in run.keys:
            run.say(event="start", key=text)
            run.say(event="done", key=text, samples=[1.0], stop="pinned")
        return 0
        yield
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script)
    assert all(record["event"] == "done" for record in records.values())
    assert len(workers.started) == 1


def test_what_an_earlier_worker_journalled_is_not_read_as_the_next_ones(tmp_path, monkeypatch):
    """The first worker measures a and dies; the second dies before it is ready: b fails as
    'did not start', though the journal already holds the first one's lines."""
    def script(run):
        if len(run.keys) == 1:
            run.complain("ImportError: no kernels\n")
            return 1
        run.say(event="worker")
        run.say(event="start", key=run.keys[0])
        run.say(event="done", key=run.keys[0], samples=[1.0], stop="pinned")
        yield
        return -signal.SIGSEGV
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script)
    assert len(workers.started) == 2
    assert records[_keys("a")[0]]["event"] == "done"
    assert records[_keys("b")[0]]["reason"] == (
        "worker did not start (worker exit status 1: ImportError: no kernels)")


@pytest.mark.parametrize("fault", ["ahead-raise", "ahead-hang"])
def test_a_fault_while_compiling_ahead_sends_a_serial_worker_to_find_its_key(
        tmp_path, monkeypatch, fault):
    keys = _keys("ahead-a", fault, "ahead-b", "c")
    records, workers, logged = _supervise(tmp_path, monkeypatch, keys)
    assert {key[1] for key, record in records.items() if record["event"] == "failed"} == {fault}
    assert all(records[key]["serial"] for key in _keys("ahead-a", "ahead-b", "c"))
    assert ["--serial" in command for command, _, _ in workers.started] == \
        [False] + [True] * (len(workers.started) - 1)
    said = [line for line in logged if "compiling ahead failed" in line]
    assert len(said) == 1 and said[0].endswith(
        "; its replacement compiles one parameter set at a time")
    if fault == "ahead-raise":
        assert said[0] == ("kernelperf: compiling ahead failed (CUDA_ERROR_X); its replacement "
                           "compiles one parameter set at a time")
        assert not workers.killed
    else:
        assert "(timed out: still compiling ahead after" in said[0]
    # no parameter set is charged with the compiling-ahead worker's fault
    assert all("compiling ahead" not in record.get("reason", "") for record in records.values())


@pytest.mark.parametrize("threads, rounds", [(2, 3), (1, 5), (0, 5), (None, 5)])
def test_compiling_ahead_may_take_its_rounds_times_the_largest_limit(tmp_path, monkeypatch,
                                                                     threads, rounds):
    """Five keys on two threads compile in three rounds: the worker gets 3 x the largest key's
    limit, and is stopped once past it (no thread count: one thread)."""
    keys = _keys("ahead-hang", "ahead-a", "ahead-b", "ahead-c", "ahead-d")

    def script(run):
        run.say(event="worker")
        yield
        if "--serial" not in run.flags:
            run.say(event="ahead", keys=run.keys,
                    **({} if threads is None else {"threads": threads}))
            while True:
                yield
        for text in run.keys:
            run.say(event="start", key=text)
            run.say(event="done", key=text, samples=[1.0], stop="pinned")
            yield
    workers = Workers(monkeypatch, script)
    records = measuring.ensure_measured(
        keys, tmp_path / "op.jsonl", worker_command=["w"], poll_s=0.5, log=lambda _: None,
        limit=lambda key: 4.0 if key[1] == "ahead-b" else 1.0)
    (_, _, killed_at), = workers.killed
    ahead_at = 1000.0 + 0.5
    assert rounds * 4.0 < killed_at - ahead_at <= rounds * 4.0 + 0.5
    assert all(record["event"] == "done" for record in records.values())


def test_once_compiled_ahead_a_stalled_worker_is_no_longer_charged_as_compiling(
        tmp_path, monkeypatch):
    """After "ahead-done" the worker is between parameter sets: ITEM_LIMIT_S, and a stall
    there is no compiling-ahead fault (no serial worker is sent)."""
    def script(run):
        run.say(event="worker")
        yield
        run.say(event="ahead", keys=run.keys, threads=2)
        yield
        run.say(event="ahead-done", seconds=1.0)
        while True:
            yield
    records, workers, logged = _supervise(tmp_path, monkeypatch, _keys("a", "b"), script,
                                          limit=1.0)
    assert len(workers.started) == 1
    assert not any("compiling ahead failed" in line for line in logged)
    (_, _, killed_at), = workers.killed
    assert measuring.ITEM_LIMIT_S < killed_at - (1000.0 + 1.0) <= measuring.ITEM_LIMIT_S + 0.5
    assert all(record["reason"].startswith("timed out: the worker did not go on")
               for record in records.values())


def test_a_worker_that_measured_its_compiled_ahead_sets_is_done(tmp_path, monkeypatch):
    records, workers, logged = _supervise(tmp_path, monkeypatch, _keys("ahead-a", "ahead-b"))
    assert all(record["event"] == "done" and not record["serial"] for record in records.values())
    assert len(workers.started) == 1 and not workers.killed


def test_by_default_a_hang_is_stopped_within_a_fifth_of_a_second_past_its_limit(tmp_path,
                                                                               monkeypatch):
    workers = Workers(monkeypatch, faulty)
    measuring.ensure_measured(_keys("hang"), tmp_path / "op.jsonl", worker_command=["w"],
                              limit=lambda key: 2.0, log=lambda _: None)
    (_, _, killed_at), = workers.killed
    assert killed_at - 1000.0 <= 2.0 + 3 * 0.2 + 1e-9  # start and ready lines, then the limit


def test_a_worker_that_fails_again_while_serial_cannot_loop_for_ever(tmp_path, monkeypatch):
    """A worker that exits EXIT_AHEAD_FAILED before its first key even when told --serial: the
    keys fail, the run ends."""
    def script(run):
        run.say(event="worker")
        yield
        run.say(event="ahead-failed", reason="boom")
        return measuring.EXIT_AHEAD_FAILED
    records, workers, _ = _supervise(tmp_path, monkeypatch, _keys("a"), script)
    assert len(workers.started) == 2 and "--serial" in workers.started[1][0]
    assert records[_keys("a")[0]]["reason"] == "boom"


def test_an_ahead_failure_without_a_reason_says_so(tmp_path):
    journal = tmp_path / "j.jsonl"
    assert measuring._last_ahead_failure(journal) == "no reason given"
    measuring.append(journal, {"event": "ahead-failed", "reason": "first"})
    measuring.append(journal, {"event": "failed", "key": "a/b/c/d", "reason": "other"})
    measuring.append(journal, {"event": "ahead-failed", "reason": "second"})
    assert measuring._last_ahead_failure(journal) == "second"
    measuring.append(journal, {"event": "ahead-failed"})
    assert measuring._last_ahead_failure(journal) == ""


def test_the_worker_command_carries_the_journal_the_keys_left_and_the_flags(tmp_path, monkeypatch):
    journal = tmp_path / "deep" / "er" / "op.jsonl"
    workers = Workers(monkeypatch, faulty)
    measuring.ensure_measured(_keys("a"), journal, worker_command=["py", "w.py"], dashboard=True,
                              limit=lambda key: 5.0, poll_s=0.5, log=lambda _: None,
                              env={"ONLY": "this"})
    (command, kwargs, ids), = workers.started
    assert command[:3] == ["py", "w.py", str(journal)]
    assert command[3].endswith(".json") and command[4:] == ["--dashboard"]
    assert ids == _ids(_keys("a"))
    assert not Path(command[3]).exists()  # the keys file is removed after
    assert set(kwargs["env"]) == {"ONLY", "KERNELPERF_SPAWNED_AT"}
    assert float(kwargs["env"]["KERNELPERF_SPAWNED_AT"]) == 1.7e9 + 1000.0  # when started
    assert kwargs["start_new_session"] is True and kwargs["stdout"] == measuring.subprocess.DEVNULL
    assert kwargs["stderr"].name == str(journal.with_suffix(".stderr.log"))


def test_the_default_worker_is_this_file_run_by_the_given_python(tmp_path, monkeypatch):
    workers = Workers(monkeypatch, faulty)
    monkeypatch.setenv("KERNELPERF_CANARY", "1")
    measuring.ensure_measured(_keys("a"), tmp_path / "op.jsonl", python="/some/python",
                              limit=lambda key: 5.0, poll_s=0.5, log=lambda _: None)
    (command, kwargs, _), = workers.started
    assert command[:3] == ["/some/python", str(Path(measuring.__file__).resolve()), "worker"]
    assert "--dashboard" not in command and "--serial" not in command
    assert kwargs["env"]["KERNELPERF_CANARY"] == "1"  # os.environ, when no env is given


def test_what_the_journal_holds_starts_no_worker(tmp_path, monkeypatch):
    workers = Workers(monkeypatch, faulty)
    journal = tmp_path / "op.jsonl"
    for key in _keys("a", "b"):
        measuring.append(journal, {"event": "skipped", "key": measuring.key_id(key),
                                   "reason": "n/a"})
    records = measuring.ensure_measured(_keys("b", "a"), journal, poll_s=0.5, log=lambda _: None)
    assert not workers.started and list(records) == _keys("b", "a")


def test_the_default_log_writes_to_stderr(tmp_path, monkeypatch, capsys):
    Workers(monkeypatch, faulty)
    measuring.ensure_measured(_keys("a"), tmp_path / "op.jsonl", worker_command=["w"],
                              limit=lambda key: 5.0, poll_s=0.5)
    assert "measured op/a/case/fwd" in capsys.readouterr().err


def test_an_interrupted_supervisor_kills_its_worker(tmp_path, monkeypatch):
    workers = Workers(monkeypatch, faulty)

    def interrupted(seconds):
        raise KeyboardInterrupt
    monkeypatch.setattr(workers.clock, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        measuring.ensure_measured(_keys("a"), tmp_path / "op.jsonl", worker_command=["w"],
                                  limit=lambda key: 5.0, poll_s=0.5, log=lambda _: None)
    assert [sig for _, sig, _ in workers.killed] == [signal.SIGKILL]


class _Waited:
    pid = 12345678

    def __init__(self):
        self.waited = 0

    def wait(self):
        self.waited += 1


@pytest.mark.parametrize("error", [ProcessLookupError, PermissionError])
def test_killing_a_worker_that_is_gone_still_reaps_it(monkeypatch, error):
    calls = []

    def killpg(pid, sig):
        calls.append((pid, sig))
        raise error
    monkeypatch.setattr(os, "killpg", killpg)
    worker = _Waited()
    measuring._kill(worker)
    assert calls == [(worker.pid, signal.SIGKILL)] and worker.waited == 1


def test_how_a_worker_ended_is_said_in_words():
    assert measuring._describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert measuring._describe_exit(-200) == "killed by signal 200"
    assert measuring._describe_exit(0) == "exit status 0"
    assert measuring._describe_exit(3) == "exit status 3"


def test_a_dead_workers_reason_is_its_last_error_line(tmp_path):
    log = tmp_path / "w.stderr.log"
    assert measuring._last_error_line(log) == ""
    log.write_text("")
    assert measuring._last_error_line(log) == ""
    log.write_text("start\n  Segmentation fault  \nlater noise\n\n")
    assert measuring._last_error_line(log) == "Segmentation fault"
    log.write_text("one\n  two  \n\n")
    assert measuring._last_error_line(log) == "two"  # no error word: the last line
    log.write_text("CUDA " + "x" * 400 + "\n")
    assert measuring._last_error_line(log) == ("CUDA " + "x" * 400)[:300]
    log.write_text("quiet " + "y" * 400 + "\n")
    assert measuring._last_error_line(log) == ("quiet " + "y" * 400)[:300]
    for word in measuring._ERROR_WORDS:
        log.write_text(f"a {word} b\nplain\n")
        assert measuring._last_error_line(log) == f"a {word} b"


def test_only_the_last_200_lines_are_searched_for_an_error(tmp_path):
    log = tmp_path / "w.stderr.log"
    log.write_text("old Error\n" + "".join(f"line {i}\n" for i in range(200)))
    assert measuring._last_error_line(log) == "line 199"
    log.write_text("old Error\n" + "".join(f"line {i}\n" for i in range(199)))
    assert measuring._last_error_line(log) == "old Error"


def test_an_undecodable_stderr_is_read_with_replacements(tmp_path):
    log = tmp_path / "w.stderr.log"
    log.write_bytes(b"Fatal \xff\n")
    assert measuring._last_error_line(log) == "Fatal \ufffd"


# -- the parameter set's limit ------------------------------------------------------------------

def test_a_fixed_item_limit_from_the_environment_wins(monkeypatch):
    monkeypatch.setenv(measuring.LIMIT_VARIABLE, "7.5")
    assert measuring.item_limit(("no-such-op", "x", "y", "fwd")) == 7.5


def test_the_item_limit_grows_with_the_bytes_one_call_moves(monkeypatch):
    monkeypatch.setenv(measuring.LIMIT_VARIABLE, "")
    asked = []

    class Operation:
        def case(self, case_id):
            return f"case {case_id}"

        def work(self, case, direction):
            asked.append((case, direction))
            return types.SimpleNamespace(bytes=2e9)
    monkeypatch.setattr(registry, "operation", lambda name: Operation() if name == "op" else None)
    limit = measuring.item_limit(("op", "impl", "c1", "bwd"))
    assert limit == measuring.ITEM_LIMIT_S + 2 * measuring.ITEM_LIMIT_S_PER_GB
    assert asked == [("case c1", "bwd")]


# -- the sampling rule --------------------------------------------------------------------------

def _counting_take():
    asked = []

    def take(n):
        asked.append(n)
        assert 0 < n and sum(asked) <= 10_000, f"asked for {asked[-5:]}: no end"
        return [1.0] * n
    return take, asked


def test_the_median_pinned_exactly_at_the_target_stops():
    take, asked = _counting_take()
    rule = measuring.Sampling(min_samples=5, max_samples=50, target=0.01)
    samples, why = measuring.collect_samples(take, rule, lambda s: 0.01 if len(s) >= 10 else 1.0)
    assert (len(samples), why, asked) == (10, "pinned", [5, 5])


def test_the_last_batch_stops_at_max_samples():
    take, asked = _counting_take()
    rule = measuring.Sampling(min_samples=10, max_samples=25, max_seconds=1e9)
    samples, why = measuring.collect_samples(take, rule, lambda s: 1.0)
    assert (len(samples), why, asked) == (25, "max-samples", [10, 10, 5])


def test_sampling_stops_once_the_time_cap_is_reached():
    now = iter([0.0, 1.0, 2.0, 3.0])
    take, asked = _counting_take()
    rule = measuring.Sampling(min_samples=2, max_samples=100, max_seconds=2.0)
    samples, why = measuring.collect_samples(take, rule, lambda s: 1.0, clock=lambda: next(now))
    assert (why, asked) == ("time-cap", [2, 2])


def test_an_older_kernels_fixed_count_is_capped_by_max_samples():
    take, asked = _counting_take()
    rule = measuring.Sampling(min_samples=2, max_samples=5)
    assert measuring.collect_samples(take, rule, None) == ([1.0] * 5, "fixed")
    assert asked == [5]


@pytest.mark.parametrize("rule", [dict(min_samples=2, max_samples=2), dict(target=1e-9),
                                  dict(max_seconds=1e-9)])
def test_the_edges_of_a_good_sampling_rule_are_accepted(rule):
    measuring.Sampling(**rule)


@pytest.mark.parametrize("bad, words", [
    (dict(min_samples=1), ["min_samples", "(100)", "got 1"]),
    (dict(min_samples=20, max_samples=10), ["max_samples (10)", "got 20"]),
    (dict(target=0), ["target, max_seconds", "got 0, 3.0"]),
    (dict(target=-1.0), ["got -1.0, 3.0"]),
    (dict(max_seconds=0), ["got 0.004, 0"]),
    (dict(max_seconds=-2.0), ["got 0.004, -2.0"])])
def test_a_bad_sampling_rule_is_refused_naming_what_and_the_value(bad, words):
    with pytest.raises(ValueError) as refused:
        measuring.Sampling(**bad)
    assert all(word in str(refused.value) for word in words), str(refused.value)
    assert str(refused.value).startswith(("min_samples: expected 2 <= min_samples",
                                          "target, max_seconds: expected > 0"))


def test_the_median_of_an_odd_and_an_even_count():
    assert measuring._median([3.0, 1.0, 2.0]) == 2.0
    assert measuring._median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert measuring._median([5.0]) == 5.0


# -- the journal --------------------------------------------------------------------------------

def test_keys_are_written_and_read_as_slashed_ids():
    key = ("softmax", "xla", "f32-64x1000", "bwd")
    assert measuring.key_id(key) == "softmax/xla/f32-64x1000/bwd"
    assert measuring.parse_key(measuring.key_id(key)) == key
    with pytest.raises(ValueError):
        measuring.parse_key("softmax/xla/fwd")


def test_the_journal_is_appended_one_json_line_per_entry(tmp_path):
    journal = tmp_path / "j.jsonl"
    assert measuring.read_journal(journal) == []
    measuring.append(journal, {"event": "worker", "pid": 1})
    measuring.append(journal, {"event": "start", "key": "a/b/c/fwd"})
    assert journal.read_text().splitlines() == [json.dumps({"event": "worker", "pid": 1}),
                                                json.dumps({"event": "start", "key": "a/b/c/fwd"})]
    assert journal.read_text().endswith("\n")


def test_a_bad_line_in_the_middle_loses_only_itself(tmp_path):
    journal = tmp_path / "j.jsonl"
    journal.write_text('{"event": "start", "key": "a/b/c/d"}\n{"event": \n\n'
                       '{"event": "done", "key": "a/b/c/d"}\n')
    assert [e["event"] for e in measuring.read_journal(journal)] == ["start", "done"]


def test_the_final_record_of_a_key_is_its_last_done_failed_or_skipped():
    entries = [{"event": "worker"}, {"event": "start", "key": "a/b/c/d"},
               {"event": "failed", "key": "a/b/c/d", "n": 1},
               {"event": "done", "key": "a/b/c/d", "n": 2},
               {"event": "skipped", "key": "a/x/c/d"},
               {"event": "ahead", "keys": ["a/b/c/d"]}, {"no": "event"}]
    records = measuring.final_records(entries)
    assert records == {("a", "b", "c", "d"): entries[3], ("a", "x", "c", "d"): entries[4]}


# -- the worker, with its backend, inputs and measurement faked ---------------------------------

def _worker(tmp_path, keys, dashboard=False):
    """measuring.worker over `keys`, journalling into tmp_path: (its exit status, the journal)."""
    journal = tmp_path / "j.jsonl"
    return measuring.worker(journal, keys, dashboard=dashboard), journal


class FakeWorld:
    """What measuring.worker reaches outside itself, faked: implementations named "xla...",
    "pallas..." and "ahead-..." are JAX ones; "skip..." cannot run here; "nokernel..."
    launches no kernel; "raise..." raises while measured; "ahead-raise" while compiled
    ahead."""

    def __init__(self, monkeypatch):
        self.inputs_made, self.measured, self.compiled, self.backend = [], [], [], []
        self.collected = 0
        monkeypatch.setattr(measuring, "_die_with_parent", lambda: self.died.append(1))
        self.died = []
        monkeypatch.setattr(measuring, "_backend_start", self.backend_start)
        monkeypatch.setattr(measuring, "_unrunnable",
                            lambda key: "no GPU here" if key[1].startswith("skip") else None)
        monkeypatch.setattr(measuring, "_make_inputs", self.make_inputs)
        monkeypatch.setattr(measuring, "_measure", self.measure)
        monkeypatch.setattr(measuring, "_compile_ahead", self.compile_ahead)
        monkeypatch.setattr(measuring, "_ahead_keys", self.ahead_keys)
        monkeypatch.setattr(measuring.gc, "collect", self.collect)
        from kernels import compilation_cache, environment, fingerprint
        monkeypatch.setattr(environment, "configure", lambda: None)
        monkeypatch.setattr(compilation_cache, "enable", lambda: None)
        monkeypatch.setattr(fingerprint, "fingerprint", lambda: "the device")
        monkeypatch.setattr(os, "cpu_count", lambda: 16)
        monkeypatch.delenv(measuring.AHEAD_VARIABLE, raising=False)
        monkeypatch.setenv("KERNELPERF_SPAWNED_AT", repr(100.0))
        self.clock = fakes.Clock()
        monkeypatch.setattr(measuring, "time", self.clock)

    @staticmethod
    def ahead_keys(keys):
        jax = [key for key in keys if key[1].startswith(("xla", "pallas", "ahead"))]
        return jax if len(jax) > 1 else []

    def collect(self):
        self.collected += 1

    def backend_start(self, keys):
        self.backend.append(list(keys))
        return 2.0

    def make_inputs(self, op, case_id):
        self.inputs_made.append((op, case_id))
        self.clock.now += 0.25
        return ("inputs", op, case_id), 0.25

    def compile_ahead(self, keys, inputs, threads):
        self.compiled.append((list(keys), inputs, threads))
        self.clock.now += 1.0
        if any(key[1] == "ahead-raise" for key in keys):
            raise RuntimeError("CUDA_ERROR_X\nmore detail")
        return {key: ("compiled", key) for key in keys}

    def measure(self, key, inputs, device, dashboard, ready=None):
        self.measured.append((key, inputs, device, dashboard, ready))
        if key[1].startswith("nokernel"):
            raise timing.NoKernel("it launches none")
        if key[1].startswith("raise"):
            raise ValueError("bad kernel\nsecond line")
        return {"samples": [1.0], "phases": {"compile": 0.1}}


def _events(journal):
    return [(e["event"], e.get("key")) for e in measuring.read_journal(journal)]


def test_the_worker_measures_each_key_once_making_each_cases_inputs_once(tmp_path, monkeypatch):
    world = FakeWorld(monkeypatch)
    keys = [("op", "torch", "c1", "fwd"), ("op", "torch2", "c1", "bwd"),
            ("op", "torch", "c2", "fwd")]
    status, journal = _worker(tmp_path, keys, dashboard=True)
    assert status == 0
    assert world.died and world.backend == [keys]
    assert world.inputs_made == [("op", "c1"), ("op", "c2")]
    assert [(key, inputs, device, dashboard, ready) for key, inputs, device, dashboard, ready
            in world.measured] == [(key, ("inputs", "op", key[2]), "the device", True, None)
                                   for key in keys]
    assert _events(journal) == [("worker", None)] + [
        (event, measuring.key_id(key)) for key in keys for event in ("start", "done")]
    entries = measuring.read_journal(journal)
    header = entries[0]
    assert header["pid"] == os.getpid() and header["backend_s"] == 2.0
    assert header["process_s"] == pytest.approx(world.clock.time() - 100.0 - 2.0)
    done = [e for e in entries if e["event"] == "done"]
    # a case's inputs are charged to its first parameter set only
    assert [e["phases"].get("inputs") for e in done] == [0.25, 0.0, 0.25]
    assert all(e["phases"]["compile"] == 0.1 and e["samples"] == [1.0] for e in done)
    assert world.collected == 2 + 3  # before each case and after each result


def test_every_line_the_worker_writes_but_a_skip_carries_its_wall_clock_time(tmp_path,
                                                                             monkeypatch):
    FakeWorld(monkeypatch)
    keys = [("op", "xla", "c1", "fwd"), ("op", "pallas", "c1", "fwd"),
            ("op", "raise", "c1", "fwd")]
    _, journal = _worker(tmp_path, keys)
    measuring.worker(journal, [("op", "ahead-raise", "c2", "fwd"), ("op", "xla", "c2", "fwd")],
                     dashboard=False)
    entries = measuring.read_journal(journal)
    assert [e["event"] for e in entries] == [
        "worker", "ahead", "ahead-done", "start", "done", "start", "done", "start", "failed",
        "worker", "ahead", "ahead-failed"]
    assert all(1.7e9 < e["t"] < 1.7e9 + 2000 for e in entries)


def test_the_worker_without_a_spawn_time_counts_its_process_time_from_now(tmp_path, monkeypatch):
    FakeWorld(monkeypatch)
    monkeypatch.delenv("KERNELPERF_SPAWNED_AT")
    journal = tmp_path / "j.jsonl"
    measuring.worker(journal, [("op", "torch", "c1", "fwd")], dashboard=False)
    assert measuring.read_journal(journal)[0]["process_s"] == pytest.approx(-2.0)


def test_what_cannot_run_here_is_skipped_and_a_case_with_nothing_left_makes_no_inputs(
        tmp_path, monkeypatch):
    world = FakeWorld(monkeypatch)
    keys = [("op", "skip", "c1", "fwd"), ("op", "skip2", "c1", "fwd"),
            ("op", "skip", "c2", "fwd"), ("op", "torch", "c2", "fwd")]
    status, journal = _worker(tmp_path, keys)
    assert status == 0
    assert world.inputs_made == [("op", "c2")]
    assert _events(journal)[1:] == [("skipped", "op/skip/c1/fwd"), ("skipped", "op/skip2/c1/fwd"),
                                    ("skipped", "op/skip/c2/fwd"), ("start", "op/torch/c2/fwd"),
                                    ("done", "op/torch/c2/fwd")]
    assert measuring.read_journal(journal)[1]["reason"] == "no GPU here"


def test_a_case_compiles_its_jax_sets_ahead_and_each_is_measured_with_its_executable(
        tmp_path, monkeypatch):
    world = FakeWorld(monkeypatch)
    keys = [("op", "xla", "c1", "fwd"), ("op", "torch", "c1", "fwd"),
            ("op", "pallas", "c1", "fwd")]
    status, journal = _worker(tmp_path, keys)
    assert status == 0
    early = [keys[0], keys[2]]
    assert world.compiled == [(early, ("inputs", "op", "c1"), 2)]
    assert world.inputs_made == [("op", "c1")]  # made once, before compiling
    assert [ready for *_, ready in world.measured] == [("compiled", keys[0]), None,
                                                       ("compiled", keys[2])]
    events = _events(journal)
    assert events[1:3] == [("ahead", None), ("ahead-done", None)]
    entries = measuring.read_journal(journal)
    assert entries[1]["keys"] == _ids(early) and entries[1]["threads"] == 2
    assert entries[2]["seconds"] == 1.0
    assert [e["phases"]["inputs"] for e in entries if e["event"] == "done"] == [0.25, 0.0, 0.0]


@pytest.mark.parametrize("count, cpus, threads", [(3, 16, 3), (10, 16, measuring.AHEAD_THREADS),
                                                  (5, 2, 2), (3, None, 1)])
def test_compiling_ahead_uses_a_thread_a_key_within_the_cap_and_the_cores(
        tmp_path, monkeypatch, count, cpus, threads):
    world = FakeWorld(monkeypatch)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    keys = [("op", f"xla{i}", "c1", "fwd") for i in range(count)]
    measuring.worker(tmp_path / "j.jsonl", keys, dashboard=False)
    assert world.compiled[0][2] == threads


@pytest.mark.parametrize("serial, variable", [(True, None), (False, "0")])
def test_a_serial_worker_or_compiling_ahead_turned_off_compiles_nothing_ahead(
        tmp_path, monkeypatch, serial, variable):
    world = FakeWorld(monkeypatch)
    if variable is not None:
        monkeypatch.setenv(measuring.AHEAD_VARIABLE, variable)
    keys = [("op", "xla", "c1", "fwd"), ("op", "pallas", "c1", "fwd")]
    journal = tmp_path / "j.jsonl"
    assert measuring.worker(journal, keys, dashboard=False, ahead=not serial) == 0
    assert not world.compiled and [ready for *_, ready in world.measured] == [None, None]
    assert "ahead" not in [event for event, _ in _events(journal)]


def test_compiling_ahead_is_on_unless_the_variable_says_0(tmp_path, monkeypatch):
    world = FakeWorld(monkeypatch)
    monkeypatch.setenv(measuring.AHEAD_VARIABLE, "1")
    measuring.worker(tmp_path / "j.jsonl", [("op", "xla", "c1", "fwd"),
                                            ("op", "pallas", "c1", "fwd")], dashboard=False)
    assert world.compiled


def test_a_fault_while_compiling_ahead_is_journalled_and_the_worker_exits_at_once(
        tmp_path, monkeypatch):
    world = FakeWorld(monkeypatch)
    keys = [("op", "ahead-raise", "c1", "fwd"), ("op", "xla", "c1", "fwd"),
            ("op", "xla", "c2", "fwd")]
    status, journal = _worker(tmp_path, keys)
    assert status == measuring.EXIT_AHEAD_FAILED
    assert _events(journal) == [("worker", None), ("ahead", None), ("ahead-failed", None)]
    assert measuring.read_journal(journal)[-1]["reason"] == "RuntimeError: CUDA_ERROR_X"
    assert not world.measured


def test_a_parameter_set_that_raises_is_failed_and_the_worker_exits_for_a_fresh_one(
        tmp_path, monkeypatch):
    world = FakeWorld(monkeypatch)
    keys = [("op", "torch", "c1", "fwd"), ("op", "raise", "c1", "fwd"),
            ("op", "torch", "c2", "fwd")]
    status, journal = _worker(tmp_path, keys)
    assert status == measuring.EXIT_AFTER_FAILURE
    assert _events(journal)[1:] == [("start", "op/torch/c1/fwd"), ("done", "op/torch/c1/fwd"),
                                    ("start", "op/raise/c1/fwd"), ("failed", "op/raise/c1/fwd")]
    assert measuring.read_journal(journal)[-1]["reason"] == "ValueError: bad kernel"
    assert len(world.measured) == 2


def test_a_call_that_launches_no_kernel_is_skipped_and_the_next_one_measured(tmp_path,
                                                                             monkeypatch):
    FakeWorld(monkeypatch)
    keys = [("op", "nokernel", "c1", "bwd"), ("op", "torch", "c1", "bwd")]
    status, journal = _worker(tmp_path, keys)
    assert status == 0
    entries = measuring.read_journal(journal)
    assert _events(journal)[1:] == [("start", "op/nokernel/c1/bwd"),
                                    ("skipped", "op/nokernel/c1/bwd"),
                                    ("start", "op/torch/c1/bwd"), ("done", "op/torch/c1/bwd")]
    assert entries[2]["reason"] == "NoKernel: it launches none"


def test_a_call_that_launches_no_kernel_is_known_by_its_type_or_an_older_message():
    class NoKernel(Exception):
        pass
    assert measuring._launches_no_kernel(NoKernel("anything"))
    assert measuring._launches_no_kernel(RuntimeError("the call launches none"))
    assert not measuring._launches_no_kernel(RuntimeError("illegal address"))


def test_an_error_is_told_in_its_first_nonblank_line_with_its_type():
    assert measuring._one_line(ValueError("\n\n  bad\nworse")) == "ValueError: "
    assert measuring._one_line(ValueError("  bad  ")) == "ValueError:   bad"
    assert measuring._one_line(ValueError("bad\nworse")) == "ValueError: bad"
    assert measuring._one_line(KeyError()) == "KeyError:"
    assert measuring._one_line(RuntimeError("x" * 500)) == ("RuntimeError: " + "x" * 500)[:400]


def test_the_worker_script_reads_its_keys_and_flags(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(measuring, "worker",
                        lambda journal, keys, dashboard, ahead: calls.append(
                            (journal, keys, dashboard, ahead)) or 7)
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(["a/b/c/fwd", "a/b/d/bwd"]))
    keys = [("a", "b", "c", "fwd"), ("a", "b", "d", "bwd")]
    assert measuring._main(["worker", "j.jsonl", str(keys_file)]) == 7
    assert measuring._main(["worker", "j.jsonl", str(keys_file), "--dashboard", "--serial"]) == 7
    assert measuring._main(["worker", "j.jsonl", str(keys_file), "--serial"]) == 7
    assert calls == [(Path("j.jsonl"), keys, False, True), (Path("j.jsonl"), keys, True, False),
                     (Path("j.jsonl"), keys, False, False)]


@pytest.mark.parametrize("argv", [[], ["worker", "j.jsonl"], ["other", "j.jsonl", "k.json"]])
def test_the_worker_script_says_how_to_call_it(argv, capsys):
    assert measuring._main(argv) == 2
    assert capsys.readouterr().err.startswith("usage: measuring.py worker JOURNAL KEYS.json")


def test_the_worker_leaves_jax_its_memory_setting_or_turns_preallocation_off(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    measuring._worker_environment()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    measuring._worker_environment()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_the_worker_asks_to_die_with_its_parent(monkeypatch):
    calls = []

    class Libc:
        def prctl(self, *args):
            calls.append(args)
    import ctypes
    monkeypatch.setattr(ctypes, "CDLL", lambda name, use_errno: calls.append((name, use_errno))
                        or Libc())
    measuring._die_with_parent()
    assert calls == [("libc.so.6", True), (1, signal.SIGKILL)]

    def missing(name, use_errno):
        raise OSError("no libc")
    monkeypatch.setattr(ctypes, "CDLL", missing)
    measuring._die_with_parent()  # elsewhere than Linux: nothing, no error


# -- one parameter set's measurement, its framework faked ---------------------------------------

@dataclasses.dataclass(frozen=True)
class FakeTimeable:
    fn: object
    args: tuple = (1, 2)


class Sampler:
    """Hands out `values` in order; records take and reset calls."""

    def __init__(self, values, throttled=(1, 0, 2)):
        self.values, self.calls, self.throttled = iter(values), [], list(throttled)

    def take(self, n):
        self.calls.append(("take", n))
        return [next(self.values) for _ in range(n)]

    def reset(self):
        self.calls.append(("reset",))


class Analysis:
    argument_size_in_bytes, output_size_in_bytes = 100, 20
    temp_size_in_bytes, alias_size_in_bytes = 7, 4


class Compiled:
    """An executable: its memory analysis."""

    def memory_analysis(self):
        return Analysis()


class Jittable:
    """A jitted function: lowers, with the arguments it is given, to a Compiled."""

    def __init__(self):
        self.lowered = []

    def lower(self, *args):
        self.lowered.append(args)
        return types.SimpleNamespace(compile=Compiled)


class MeasureWorld:
    """registry, timing and the roofline as _measure reaches them, faked."""

    def __init__(self, monkeypatch, framework="jax", values=None):
        self.impl = types.SimpleNamespace(op="op", framework=framework,
                                          devices_for=lambda case: 1)
        self.case = types.SimpleNamespace(id="c1", dtype="float32")
        self.sampler = Sampler(values or [9.0] * 3 + [1.0] * 200)
        self.prepared, self.samplers, self.launched, self.roofs = [], [], [], []
        self.jitted = FakeTimeable(fn=Jittable())
        monkeypatch.setattr(registry, "implementation",
                            lambda op, name: self.impl if op == "op" and name == "xla" else None)
        monkeypatch.setattr(registry, "operation", lambda op: types.SimpleNamespace(
            case=lambda case_id: self.case if case_id == "c1" else None) if op == "op" else None)
        monkeypatch.setattr(timing, "prepare", self.prepare)
        monkeypatch.setattr(timing, "make_sampler", self.make_sampler)
        monkeypatch.setattr(timing, "median_halfwidth", lambda samples: 0.0)
        monkeypatch.setattr(measuring, "_launch_us", self.launch_us)
        monkeypatch.setattr(measuring, "_roofline", self.roofline)

    def prepare(self, impl, case, *, direction, inputs):
        self.prepared.append((impl, case, direction, inputs))
        return self.jitted

    def make_sampler(self, timeable, regime, device):
        self.samplers.append((timeable, regime, device))
        return self.sampler, "cupti"

    def launch_us(self, timing_module, timeable):
        self.launched.append((timing_module, timeable))
        return 4.5

    def roofline(self, impl, case, direction, seconds, device):
        self.roofs.append((impl, case, direction, seconds, device))
        return 0.25


GPU = types.SimpleNamespace(platform="gpu")
CPU = types.SimpleNamespace(platform="cpu")


def test_a_parameter_set_is_warmed_up_then_sampled_by_the_devices_rule(monkeypatch):
    world = MeasureWorld(monkeypatch)
    record = measuring._measure(("op", "xla", "c1", "bwd"), ("in",), GPU, dashboard=False)
    assert world.prepared == [(world.impl, world.case, "bwd", ("in",))]
    assert world.samplers == [(world.jitted, "cold", GPU)]
    assert world.sampler.calls[:2] == [("take", timing.WARMUP_CALLS), ("reset",)]
    assert world.sampler.calls[2] == ("take", measuring.GPU_SAMPLING.min_samples)
    # the warm-up's samples are not among those recorded
    assert record["samples"] == [1.0] * measuring.GPU_SAMPLING.min_samples
    assert (record["method"], record["stop"], record["throttled"]) == ("cupti", "pinned", 3)
    assert record["peak_bytes"] == 100 + 20 + 7 - 4
    assert world.jitted.fn.lowered == [(1, 2)]
    assert record["launch_us"] is None and record["roofline"] is None and not world.launched
    assert list(record["phases"]) == ["compile", "warmup", "sampling", "memory", "launch"]
    assert all(seconds >= 0 for seconds in record["phases"].values())


def test_each_phase_is_timed_from_where_the_last_one_ended(monkeypatch):
    world = MeasureWorld(monkeypatch)
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0] ** 2
    monkeypatch.setattr(measuring, "time", types.SimpleNamespace(perf_counter=clock))
    monkeypatch.delattr(timing, "median_halfwidth")  # an older kernels: one take
    record = measuring._measure(("op", "xla", "c1", "fwd"), ("in",), GPU, dashboard=False)
    # reads 1, 4, 9, 16, 25, 36 (the start, then one per phase)
    assert record["phases"] == {"compile": 3.0, "warmup": 5.0, "sampling": 7.0, "memory": 9.0,
                                "launch": 11.0}
    assert record["stop"] == "fixed" and world.sampler.calls[2] == ("take", 20)


def test_a_cpu_parameter_set_is_sampled_by_the_cpu_rule(monkeypatch):
    world = MeasureWorld(monkeypatch)
    record = measuring._measure(("op", "xla", "c1", "fwd"), ("in",), CPU, dashboard=False)
    assert len(record["samples"]) == measuring.CPU_SAMPLING.min_samples
    assert world.sampler.calls[2] == ("take", measuring.CPU_SAMPLING.min_samples)


def test_a_torch_parameter_set_has_no_compiled_peak(monkeypatch):
    world = MeasureWorld(monkeypatch, framework="torch")
    record = measuring._measure(("op", "xla", "c1", "fwd"), ("in",), GPU, dashboard=False)
    assert record["peak_bytes"] is None and world.jitted.fn.lowered == []


def test_a_dashboard_run_adds_the_launch_cost_of_the_jitted_call_and_the_roofline(monkeypatch):
    world = MeasureWorld(monkeypatch, values=[9.0] * 3 + [1.0, 3.0, 2.0, 5.0] * 50)
    compiled = FakeTimeable(fn=Compiled())
    record = measuring._measure(("op", "xla", "c1", "bwd"), ("in",), GPU, dashboard=True,
                                ready=(compiled, world.jitted))
    assert not world.prepared  # compiled ahead: nothing prepared again
    assert world.samplers[0][0] is compiled
    assert world.launched == [(timing, world.jitted)]
    assert world.roofs == [(world.impl, world.case, "bwd", 2.5, GPU)]
    assert (record["launch_us"], record["roofline"]) == (4.5, 0.25)
    assert record["peak_bytes"] == 123  # read from the executable itself


def test_the_launch_cost_is_a_few_short_samples_in_microseconds():
    asked = []
    fake = types.SimpleNamespace(
        StoppingRule=lambda **kwargs: ("rule", kwargs),
        launch_overhead=lambda timeable, *, rule, calls: asked.append((timeable, rule, calls))
        or types.SimpleNamespace(median_s=1.0))
    assert measuring._launch_us(fake, "jitted") == 1e6
    assert asked == [("jitted", ("rule", {"min_samples": measuring.LAUNCH_SAMPLES,
                                          "time_budget_s": measuring.LAUNCH_BUDGET_S}),
                      measuring.LAUNCH_CALLS)]


def test_the_roofline_uses_the_measured_ceilings_else_the_datasheets(monkeypatch):
    from kernels.roofline import ceilings, model

    placed = []
    case = types.SimpleNamespace(dtype="bfloat16")
    impl = types.SimpleNamespace(op="op", devices_for=lambda of: 4 if of is case else None)
    monkeypatch.setattr(registry, "operation", lambda op: types.SimpleNamespace(
        work=lambda of, direction: (op, direction, of is case)))

    def place(work, seconds, ceiling, dtype, *, devices):
        placed.append((work, seconds, ceiling, dtype, devices))
        return types.SimpleNamespace(fraction=0.5)
    monkeypatch.setattr(model, "place", place)
    for sheet, measured, chosen in [("sheet", "measured", "measured"), ("sheet", None, "sheet")]:
        monkeypatch.setattr(ceilings, "for_device",
                            lambda device, s=sheet, m=measured: (s, m) if device is GPU else None)
        assert measuring._roofline(impl, case, "bwd", 1e-3, GPU) == 0.5
        assert placed.pop() == (("op", "bwd", True), 1e-3, chosen, "bfloat16", 4)
    monkeypatch.setattr(ceilings, "for_device", lambda device: (None, None))
    assert measuring._roofline(impl, case, "bwd", 1e-3, GPU) is None and not placed


def test_the_peak_is_read_from_the_executable_or_its_one_compilation():
    assert measuring._compiled_peak_bytes(FakeTimeable(fn=Compiled())) == 123.0
    jitted = FakeTimeable(fn=Jittable(), args=(5, 6))
    assert measuring._compiled_peak_bytes(jitted) == 123.0
    assert jitted.fn.lowered == [(5, 6)]


def test_only_two_or_more_jax_sets_of_a_case_compile_ahead(monkeypatch):
    frameworks = {("op", "xla"): "jax", ("op", "pallas"): "jax", ("op", "torch"): "torch",
                  ("op", "triton"): "triton"}
    monkeypatch.setattr(registry, "implementation",
                        lambda op, name: types.SimpleNamespace(framework=frameworks[op, name]))
    keys = _keys("xla", "torch", "pallas", "triton")
    assert measuring._ahead_keys(keys) == _keys("xla", "pallas")
    assert measuring._ahead_keys(_keys("xla", "torch")) == []
    assert measuring._ahead_keys(_keys("torch", "triton")) == []


def test_compiling_ahead_gives_each_key_its_executable_and_its_jitted_call(monkeypatch):
    prepared = []
    monkeypatch.setattr(registry, "implementation", lambda op, name: f"impl {op}/{name}")
    monkeypatch.setattr(registry, "operation", lambda op: types.SimpleNamespace(
        case=lambda case_id: f"case {case_id} of {op}"))
    import concurrent.futures

    pools = []
    real_pool = concurrent.futures.ThreadPoolExecutor
    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor",
                        lambda workers: pools.append(workers) or real_pool(workers))

    def prepare(impl, case, *, direction, inputs):
        prepared.append((impl, case, direction, inputs))
        if impl.endswith("bad"):
            raise RuntimeError(f"{impl} failed")
        return FakeTimeable(fn=Jittable(), args=(impl,))
    monkeypatch.setattr(timing, "prepare", prepare)
    keys = [("op", "a", "c1", "fwd"), ("op", "b", "c1", "bwd")]
    ready = measuring._compile_ahead(keys, ("in",), threads=2)
    assert list(ready) == keys
    for key, (compiled, jitted) in ready.items():
        assert isinstance(compiled.fn, Compiled) and compiled.args == jitted.args
        assert jitted.fn.lowered == [(f"impl op/{key[1]}",)]
    assert sorted(prepared) == [("impl op/a", "case c1 of op", "fwd", ("in",)),
                                ("impl op/b", "case c1 of op", "bwd", ("in",))]
    assert pools == [2]
    prepared.clear()
    with pytest.raises(RuntimeError, match="impl op/bad failed"):
        measuring._compile_ahead([("op", "bad", "c1", "fwd"), ("op", "b", "c1", "fwd")],
                                 ("in",), threads=1)
    assert len(prepared) == 2  # every thread ended first


def test_what_cannot_run_here_says_why(monkeypatch):
    from kernels import devices

    impls = {"gpu-only": "impl g", "no-bwd": "impl n", "fine": "impl f"}
    monkeypatch.setattr(registry, "implementation",
                        lambda op, name: impls[name] if op == "op" else None)
    monkeypatch.setattr(registry, "operation", lambda op: types.SimpleNamespace(
        case=lambda case_id: f"case {case_id}" if op == "op" else None))
    asked = []

    def unavailable(impl, case):
        asked.append((impl, case))
        return "needs a GPU" if impl == "impl g" else None
    monkeypatch.setattr(devices, "case_unavailable_reason", unavailable)
    monkeypatch.setattr(registry, "has_direction",
                        lambda impl, direction: direction == "fwd" or impl != "impl n")
    assert measuring._unrunnable(("op", "gpu-only", "c1", "bwd")) == "needs a GPU"
    assert asked == [("impl g", "case c1")]
    assert measuring._unrunnable(("op", "no-bwd", "c1", "bwd")) == "no backward"
    assert measuring._unrunnable(("op", "no-bwd", "c1", "fwd")) is None
    assert measuring._unrunnable(("op", "fine", "c1", "bwd")) is None


def test_a_cases_inputs_are_made_once_from_seed_0(monkeypatch):
    from kernels import checking

    made = []
    operation = types.SimpleNamespace(case=lambda case_id: f"case {case_id}")
    monkeypatch.setattr(registry, "operation", lambda op: operation if op == "op" else None)
    clock = fakes.Clock()
    monkeypatch.setattr(measuring, "time", clock)

    def make_inputs(*args):
        made.append(args)
        clock.now += 0.75
        return ("x",)
    monkeypatch.setattr(checking, "make_inputs", make_inputs)
    inputs, seconds = measuring._make_inputs("op", "c1")
    assert inputs == ("x",) and seconds == 0.75
    assert made == [(operation, "case c1", 0, "normal")]


@pytest.mark.parametrize("frameworks, cuda, started", [
    (["jax"], True, False), (["jax", "torch"], True, True), (["torch"], False, False)])
def test_the_backends_started_are_jax_and_torch_only_for_torch_keys(monkeypatch, frameworks,
                                                                    cuda, started):
    import jax
    import torch

    calls = []
    clock = fakes.Clock()
    monkeypatch.setattr(measuring, "time", clock)

    def devices():
        calls.append("jax.devices")
        clock.now += 1.5
    monkeypatch.setattr(jax, "devices", devices)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "init", lambda: calls.append("torch.cuda.init"))
    monkeypatch.setattr(torch, "empty", lambda n, device: calls.append(("torch.empty", n, device)))
    monkeypatch.setattr(registry, "implementation",
                        lambda op, name: types.SimpleNamespace(framework=name if op == "op"
                                                               else "jax"))
    seconds = measuring._backend_start([("op", name, "c", "fwd") for name in frameworks])
    assert seconds == 1.5
    assert calls == ["jax.devices"] + (["torch.cuda.init", ("torch.empty", 1, "cuda")]
                                       if started else [])
