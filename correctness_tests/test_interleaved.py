"""The interleaved gate, driven in this process through fakes: the live worker's supervisor
(perf_tests/measuring.py's LiveWorker) reading a worker that hangs, dies or fails, the live
worker's command loop (`serve`, its backend, inputs and measurement faked), the pool of one
worker per commit (kernels.bench.confirm.Pool), the clock adjustment of a confirmation's
rounds, and the gate itself (kernels.bench.interleaved): the order it measures in, which
worker measures what, the rounds a flagged row gets, and its verdicts, asv results and exit
status from the same samples the compare reads.

No test here starts a process, a JAX backend or a CUDA context, or sleeps: a stand-in
channel (send, receive, exit_code, kill) answers for the worker, and a clock moves only
when a reply is waited for.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import pathlib
import signal

import pytest

from correctness_tests import fakes
from perf_tests import measuring

if importlib.util.find_spec("asv") is None:  # third-party only: see test_test_hygiene
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from kernels.bench import asv_tools, confirm, interleaved, recover  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASE = "f32-64x1000"
BASE, HEAD = "b" * 40, "c" * 40


def _key(impl: str, case: str = CASE) -> tuple[str, str, str, str]:
    return ("softmax", impl, case, "fwd")


# -- a stand-in for a live worker process ------------------------------------------------------

HANG = "hang"
_PIDS = itertools.count(10_000_000)  # above any pid_max: no real process


@dataclasses.dataclass
class Die:
    code: int
    stderr: str = ""


class Channel:
    """What LiveWorker talks to: replies made by `behave(channel, command)` (a list of replies,
    HANG, or Die), the ready line first unless `ready` is False; `clock` moves by each wait
    that ends without a reply."""

    def __init__(self, command, env, stderr_log, *, behave, clock, ready=True, sends=None):
        self.command, self.env, self.stderr_log = command, env, pathlib.Path(stderr_log)
        self.sends = [] if sends is None else sends  # every channel's, in order
        self.behave, self.clock, self.pid = behave, clock, next(_PIDS)
        self.pending = [{"event": "worker", "pid": self.pid}] if ready else []
        self.sent, self.code, self.killed = [], None, False
        self.exiting = None  # the status it exits with once it has said so

    @property
    def tree(self) -> str:
        return self.env["PYTHONPATH"].split(":")[0]

    def send(self, command):
        self.sent.append(command)
        self.sends.append((self, command))
        if self.code is not None or self.exiting is not None:
            return
        if command["do"] == "exit":
            self.exiting = 0
            return
        outcome = self.behave(self, command)
        if isinstance(outcome, Die):
            with open(self.stderr_log, "a") as out:
                out.write(outcome.stderr)
            self.code = outcome.code
        elif outcome != HANG:
            self.pending += outcome
            if any(reply.get("event") in ("failed", "ahead-failed") for reply in outcome):
                self.exiting = (measuring.EXIT_AFTER_FAILURE if outcome[-1]["event"] == "failed"
                                else measuring.EXIT_AHEAD_FAILED)

    def receive(self, timeout):
        if self.pending:
            return self.pending.pop(0)
        if self.code is not None:
            raise EOFError
        self.clock.now += timeout
        return None

    def exit_code(self, wait_s):
        if self.code is not None:
            return self.code
        if self.exiting is not None:
            return self.exiting
        self.clock.now += wait_s
        return None

    def kill(self):
        self.killed = True
        if self.code is None:
            self.code = -signal.SIGKILL


class Spawner:
    """spawn(command, env, stderr_log) for LiveWorker: every channel it made, in order."""

    def __init__(self, monkeypatch, behave, ready=True):
        self.behave, self.ready, self.channels, self.sends = behave, ready, [], []
        self.clock = fakes.Clock()
        monkeypatch.setattr(measuring, "time", self.clock)

    def __call__(self, command, env, stderr_log):
        assert len(self.channels) < 50, "workers started without end"
        channel = Channel(command, env, stderr_log, behave=self.behave, clock=self.clock,
                          ready=self.ready, sends=self.sends)
        self.channels.append(channel)
        return channel

    def measured(self):
        """(channel index, key id, pass, round) of every measure command, in order."""
        return [(i, c["key"], c["pass"], c["round"]) for i, channel in enumerate(self.channels)
                for c in channel.sent if c["do"] == "measure"]


def _done(channel, command, samples=(1.0, 1.0, 1.0), **fields):
    record = {"event": "done", "key": command["key"], "pass": command["pass"],
              "round": command["round"], "samples": list(samples), "stop": "pinned",
              "pid": channel.pid, **fields}
    measuring.append(pathlib.Path(command["journal"]), record)
    return [record]


def faulty(channel, command):
    """Measures every key, unless its implementation says to hang, abort or raise; a case of
    an "ahead-raise" key fails compiling ahead unless the worker is serial."""
    if command["do"] == "case":
        names = {text.split("/")[1] for text in command["keys"]}
        if "ahead-raise" in names and "--serial" not in channel.command:
            return [{"event": "ahead", "keys": command["keys"], "threads": 2},
                    {"event": "ahead-failed", "reason": "CUDA_ERROR_X"}]
        if "ahead-hang" in names and "--serial" not in channel.command:
            channel.pending.append({"event": "ahead", "keys": command["keys"], "threads": 1})
            return HANG
        skipped = {text: "no GPU here" for text in command["keys"]
                   if text.split("/")[1] == "skip"}
        return [{"event": "case", "skipped": skipped}]
    if command["do"] == "release":
        return [{"event": "released"}]
    impl = command["key"].split("/")[1]
    if impl == "hang":
        return HANG
    if impl == "abort":
        return Die(-signal.SIGABRT, "some noise\nFatal Python error: Aborted\n\n")
    if impl == "raise":
        record = {"event": "failed", "key": command["key"],
                  "reason": "XlaRuntimeError: CUDA_ERROR_ILLEGAL"}
        measuring.append(pathlib.Path(command["journal"]), record)
        return [record]
    return _done(channel, command)


def _live(tmp_path, monkeypatch, behave=faulty, ready=True, limit=2.0, keys=()):
    spawn = Spawner(monkeypatch, behave, ready)
    logged = []
    worker = measuring.LiveWorker("base", tmp_path / "w", list(keys), env={"PYTHONPATH": "t"},
                                  limit=lambda key: limit, log=logged.append, spawn=spawn)
    return worker, spawn, logged


# -- the live worker's supervisor --------------------------------------------------------------

def test_each_fault_fails_only_its_own_round_and_a_fresh_worker_continues_with_the_case(
        tmp_path, monkeypatch):
    keys = [_key(name) for name in ("a", "hang", "b", "abort", "c", "raise", "d")]
    worker, spawn, logged = _live(tmp_path, monkeypatch, keys=keys)
    journal = tmp_path / "softmax.jsonl"
    assert worker.case(keys, journal) == {}
    records = {key[1]: worker.measure(key, journal) for key in keys}
    failed = {name: r["reason"] for name, r in records.items() if r["event"] == "failed"}
    assert set(failed) == {"hang", "abort", "raise"}
    assert failed["hang"] == "timed out: no result after 2 s (limit 2 s)"
    assert failed["abort"] == "worker killed by SIGABRT: Fatal Python error: Aborted"
    assert failed["raise"] == "XlaRuntimeError: CUDA_ERROR_ILLEGAL"
    assert all(records[name]["event"] == "done" for name in "abcd")
    # a fresh worker after each fault, each sent the case in hand before its next key
    assert len(spawn.channels) == 4
    assert [len({records[name]["pid"] for name in "abcd"})] == [4]
    for channel in spawn.channels:
        assert channel.sent[0]["do"] == "case" and channel.sent[0]["keys"] == [
            measuring.key_id(key) for key in keys]
    assert [channel.killed for channel in spawn.channels] == [True, True, False, False]
    # the supervisor journals what the dead worker could not; the worker its own failure
    entries = measuring.read_journal(journal)
    assert [e["key"].split("/")[1] for e in entries if e["event"] == "failed"] == [
        "hang", "abort", "raise"]
    assert any("softmax/hang/f32-64x1000/fwd: timed out" in line for line in logged)


def test_a_worker_that_never_gets_ready_fails_every_command_after_at_once(tmp_path, monkeypatch):
    worker, spawn, logged = _live(tmp_path, monkeypatch, ready=False)
    assert worker.case([_key("a"), _key("b")], tmp_path / "j.jsonl") == {}
    first = worker.measure(_key("a"), tmp_path / "j.jsonl")
    second = worker.measure(_key("b"), tmp_path / "j.jsonl")
    expected = (f"worker did not start (timed out: the worker did not go on after "
                f"{measuring.WORKER_START_LIMIT_S:.0f} s (limit "
                f"{measuring.WORKER_START_LIMIT_S:.0f} s))")
    assert first["reason"] == second["reason"] == expected
    assert len(spawn.channels) == 1 and spawn.channels[0].killed
    assert sum("measuring worker: worker did not start" in line for line in logged) == 1


def test_a_worker_that_dies_before_it_is_ready_says_its_error(tmp_path, monkeypatch):
    def behave(channel, command):
        raise AssertionError("no command reaches a worker that never started")
    spawn = Spawner(monkeypatch, behave, ready=False)
    worker = measuring.LiveWorker("head", tmp_path / "w", [], env={"PYTHONPATH": "t"},
                                  limit=lambda key: 2.0, log=lambda _: None, spawn=spawn)
    worker.start()
    channel = spawn.channels[0]
    channel.stderr_log.write_text("Traceback ...\nModuleNotFoundError: No module named 'kernels'\n")
    channel.code = 1
    assert worker.measure(_key("a"), tmp_path / "j.jsonl")["reason"] == (
        "worker did not start (worker exit status 1: ModuleNotFoundError: No module named "
        "'kernels')")


def test_a_worker_that_died_between_commands_costs_no_parameter_set(tmp_path, monkeypatch):
    worker, spawn, _ = _live(tmp_path, monkeypatch)
    assert worker.measure(_key("a"), tmp_path / "j.jsonl")["event"] == "done"
    spawn.channels[0].code = -signal.SIGSEGV  # died while idle
    assert worker.measure(_key("b"), tmp_path / "j.jsonl")["event"] == "done"
    assert len(spawn.channels) == 2


@pytest.mark.parametrize("fault", ["ahead-raise", "ahead-hang"])
def test_a_fault_while_compiling_ahead_sends_a_serial_worker_the_case_again(
        tmp_path, monkeypatch, fault):
    keys = [_key("ahead-a"), _key(fault), _key("c")]
    worker, spawn, logged = _live(tmp_path, monkeypatch, keys=keys)
    assert worker.case(keys, tmp_path / "j.jsonl") == {}
    records = [worker.measure(key, tmp_path / "j.jsonl") for key in (keys[0], keys[2])]
    assert all(record["event"] == "done" for record in records)
    assert ["--serial" in channel.command for channel in spawn.channels] == [False, True]
    assert spawn.channels[1].sent[0]["do"] == "case"  # the replacement is sent the case
    said = [line for line in logged if "compiling ahead failed" in line]
    assert len(said) == 1 and said[0].endswith("its replacement compiles one parameter set "
                                               "at a time")
    if fault == "ahead-hang":  # its rounds (1 key a thread: 3) times the largest limit
        assert "(timed out: still compiling ahead after 6 s (limit 6 s))" in said[0]
    else:
        assert "(CUDA_ERROR_X)" in said[0]


def test_what_cannot_run_here_is_reported_skipped_by_the_case(tmp_path, monkeypatch):
    worker, _, _ = _live(tmp_path, monkeypatch)
    skipped = worker.case([_key("a"), _key("skip")], tmp_path / "j.jsonl")
    assert skipped == {_key("skip"): {"event": "skipped", "key": measuring.key_id(_key("skip")),
                                      "reason": "no GPU here"}}


def test_the_worker_command_names_the_journal_the_keys_the_pass_and_the_flags(tmp_path,
                                                                            monkeypatch):
    spawn = Spawner(monkeypatch, faulty)
    worker = measuring.LiveWorker("base", tmp_path / "w", [_key("a")], python="/py",
                                  env={"PYTHONPATH": "/tree", "ONLY": "this"}, dashboard=True,
                                  limit=lambda key: 2.0, log=lambda _: None, spawn=spawn)
    worker.start("confirm")
    (channel,) = spawn.channels
    assert channel.command[:3] == ["/py", str(pathlib.Path(measuring.__file__).resolve()),
                                   "serve"]
    assert channel.command[3] == str(tmp_path / "w" / "workers.jsonl")
    assert json.loads(pathlib.Path(channel.command[4]).read_text()) == ["softmax/a/" + CASE
                                                                        + "/fwd"]
    assert channel.command[5:] == ["--pass", "confirm", "--dashboard"]
    assert set(channel.env) == {"PYTHONPATH", "ONLY", "KERNELPERF_SPAWNED_AT"}
    assert channel.stderr_log == tmp_path / "w" / "worker.stderr.log"
    worker.start()  # alive already: no second worker
    assert len(spawn.channels) == 1
    worker.close()
    assert channel.sent[-1] == {"do": "exit"} and not channel.killed


def test_the_end_of_a_case_releases_it_and_forgets_it(tmp_path, monkeypatch):
    worker, spawn, _ = _live(tmp_path, monkeypatch)
    worker.case([_key("a")], tmp_path / "j.jsonl")
    worker.measure(_key("a"), tmp_path / "j.jsonl")
    worker.end_case([_key("a")])
    assert spawn.channels[0].sent[-1] == {"do": "release", "keys": [measuring.key_id(_key("a"))],
                                          "case_done": True}
    spawn.channels[0].code = -signal.SIGSEGV
    worker.measure(_key("b"), tmp_path / "j.jsonl")
    assert [c["do"] for c in spawn.channels[1].sent] == ["measure"]  # no case sent again


def test_a_worker_that_recorded_a_device_trace_is_replaced_after_its_case(tmp_path,
                                                                         monkeypatch):
    """After a device trace (the device-span clock of a sharded case) a process must not
    start CUPTI: the next case would be timed another way than in a fresh process, so the
    worker is told to exit at the case's release and the next case gets a fresh one."""
    def behave(channel, command):
        if command["do"] == "measure" and command["key"].split("/")[1] == "sharded":
            return [{**_done(channel, command)[0], "traced": True}]
        return faulty(channel, command)
    worker, spawn, _ = _live(tmp_path, monkeypatch, behave)
    worker.case([_key("sharded")], tmp_path / "j.jsonl")
    record = worker.measure(_key("sharded"), tmp_path / "j.jsonl")
    assert "traced" not in record  # the supervisor's business, not the record's
    worker.measure(_key("sharded"), tmp_path / "j.jsonl", "confirm", 1)  # same case: same one
    worker.release([_key("sharded")])  # one parameter set released: the case goes on
    assert len(spawn.channels) == 1 and spawn.channels[0].sent[-1]["do"] == "release"
    worker.end_case([_key("sharded")])
    assert spawn.channels[0].sent[-1] == {"do": "exit"}
    worker.measure(_key("a", "f32-3x5"), tmp_path / "j.jsonl")
    assert len(spawn.channels) == 2
    worker.end_case([_key("a", "f32-3x5")])  # no trace in this one: released, kept alive
    assert spawn.channels[1].sent[-1]["do"] == "release"


# -- the live worker itself, its measurement faked ---------------------------------------------

class ServeWorld:
    """What measuring.serve reaches outside itself, faked: every key opens and samples;
    "raise" raises while sampled, "nokernel" launches no kernel, "skip" cannot run here."""

    def __init__(self, monkeypatch):
        self.opened, self.inputs, self.sampled, self.released = [], [], [], 0
        monkeypatch.setattr(measuring, "_die_with_parent", lambda: None)
        monkeypatch.setattr(measuring, "_start_up", lambda keys: (
            "the device", {"event": "worker", "pid": 1, "process_s": 1.0, "backend_s": 2.0}))
        monkeypatch.setattr(measuring, "_unrunnable",
                            lambda key: "no GPU here" if key[1] == "skip" else None)
        monkeypatch.setattr(measuring, "_ahead_keys", lambda keys: [])
        monkeypatch.setattr(measuring, "_make_inputs", self.make_inputs)
        monkeypatch.setattr(measuring, "_open", self.open)
        monkeypatch.setattr(measuring, "_sample", self.sample)
        monkeypatch.setattr(measuring, "_extras", lambda held, samples, device, dashboard, lap:
                            {"peak_bytes": 7.0, "launch_us": None, "roofline": None})
        monkeypatch.setattr(measuring.gc, "collect", self.collect)

    def collect(self):
        self.released += 1

    def make_inputs(self, op, case_id):
        self.inputs.append((op, case_id))
        return ("inputs", case_id), 0.25

    def open(self, key, inputs, device, ready=None):
        self.opened.append(key)
        return measuring._Held(impl=None, case=None, direction=key[3], timeable=None,
                               jitted=None, sampler=None, method="host-clock")

    def sample(self, held, device, lap):
        self.sampled.append(held)
        if held.direction == "raise":
            raise RuntimeError("boom")
        if held.direction == "nokernel":
            raise RuntimeError("it launches none")
        lap("warmup")
        lap("sampling")
        return {"samples": [1.0, 2.0], "method": "host-clock", "stop": "pinned", "throttled": 0,
                "clocks": [1980, 1965]}


def _serve(tmp_path, commands):
    replies = []
    lines = [json.dumps({"journal": str(tmp_path / "op.jsonl"), **c}) for c in commands]
    code = measuring.serve(tmp_path / "workers.jsonl", [], False, True, lines, replies.append)
    return code, replies, measuring.read_journal(tmp_path / "op.jsonl")


def _measure(key, round_index=0, pass_name="first"):
    return {"do": "measure", "key": measuring.key_id(key), "pass": pass_name,
            "round": round_index}


def test_a_live_worker_keeps_each_executable_between_rounds_and_makes_inputs_once(
        tmp_path, monkeypatch):
    world = ServeWorld(monkeypatch)
    a, b = _key("a"), _key("b")
    code, replies, entries = _serve(tmp_path, [
        {"do": "case", "keys": [measuring.key_id(a), measuring.key_id(b)]},
        _measure(a), _measure(b), _measure(a, 1, "confirm"), _measure(b, 1, "confirm"),
        {"do": "exit"}, _measure(a, 2)])
    assert code == 0
    assert world.opened == [a, b] and world.inputs == [("softmax", CASE)]  # once each
    assert [r["event"] for r in replies] == ["worker", "case", "done", "done", "done", "done"]
    first, again = replies[2], replies[4]
    assert list(first["phases"]) == ["inputs", "compile", "warmup", "sampling"]
    assert first["phases"]["inputs"] == 0.25 and replies[3]["phases"]["inputs"] == 0.0
    assert list(again["phases"]) == ["warmup", "sampling"]  # no inputs, no compile
    assert first["peak_bytes"] == 7.0 and "peak_bytes" not in again  # memory once
    assert (again["pass"], again["round"]) == ("confirm", 1)
    assert first["clocks"] == [1980, 1965]  # the SM clock beside each sample
    assert [e["event"] for e in entries] == ["start", "done"] * 4  # every round journalled
    assert measuring.read_journal(tmp_path / "workers.jsonl")[0]["pass"] == "first"


def test_a_released_parameter_set_is_opened_again_and_its_cases_inputs_made_again(
        tmp_path, monkeypatch):
    world = ServeWorld(monkeypatch)
    a = _key("a")
    _, replies, _ = _serve(tmp_path, [_measure(a), {"do": "release",
                                                    "keys": [measuring.key_id(a)]},
                                      _measure(a, 1)])
    assert [r["event"] for r in replies] == ["worker", "done", "released", "done"]
    assert world.opened == [a, a] and len(world.inputs) == 2 and world.released == 1


def test_the_case_in_hands_inputs_outlive_its_parameter_sets_until_the_case_is_done(
        tmp_path, monkeypatch):
    """Each parameter set is released once measured; the case's inputs are made once all the
    same, and dropped with the case. planted: dropping them with the last parameter set
    held -> fails this."""
    world = ServeWorld(monkeypatch)
    a, b = _key("a"), _key("b")
    ids = [measuring.key_id(a), measuring.key_id(b)]
    _serve(tmp_path, [{"do": "case", "keys": ids}, _measure(a), {"do": "release", "keys": ids[:1]},
                      _measure(b), {"do": "release", "keys": ids[1:]},
                      {"do": "release", "keys": ids, "case_done": True}, _measure(a, 1)])
    assert world.inputs == [("softmax", CASE), ("softmax", CASE)]  # once, then after the case


def test_a_live_worker_exits_after_a_failure_and_skips_what_launches_no_kernel(
        tmp_path, monkeypatch):
    ServeWorld(monkeypatch)
    nokernel, bad = ("op", "x", "c", "nokernel"), ("op", "y", "c", "raise")
    code, replies, entries = _serve(tmp_path, [_measure(nokernel), _measure(bad),
                                               _measure(_key("never"))])
    assert code == measuring.EXIT_AFTER_FAILURE
    assert [r["event"] for r in replies] == ["worker", "skipped", "failed"]
    assert replies[2]["reason"] == "RuntimeError: boom"
    assert [e["event"] for e in entries] == ["start", "skipped", "start", "failed"]


def test_a_live_worker_says_what_cannot_run_here_and_refuses_an_unknown_command(tmp_path,
                                                                              monkeypatch):
    ServeWorld(monkeypatch)
    _, replies, entries = _serve(tmp_path, [
        {"do": "case", "keys": [measuring.key_id(_key("skip"))]}, {"do": "dance"}])
    assert replies[1] == {"event": "case", "skipped": {measuring.key_id(_key("skip")):
                                                       "no GPU here"}}
    assert replies[2]["event"] == "error" and "got 'dance'" in replies[2]["reason"]
    assert entries == [{"event": "skipped", "key": measuring.key_id(_key("skip")),
                        "reason": "no GPU here"}]


def test_a_live_worker_that_fails_compiling_ahead_says_so_and_exits(tmp_path, monkeypatch):
    ServeWorld(monkeypatch)
    monkeypatch.setattr(measuring, "_ahead_keys", lambda keys: list(keys))

    def compile_ahead(keys, inputs, threads):
        raise ValueError("Mosaic failed")
    monkeypatch.setattr(measuring, "_compile_ahead", compile_ahead)
    code, replies, _ = _serve(tmp_path, [{"do": "case", "keys": [
        measuring.key_id(_key("a")), measuring.key_id(_key("b"))]}, _measure(_key("a"))])
    assert code == measuring.EXIT_AHEAD_FAILED
    assert [r["event"] for r in replies] == ["worker", "ahead", "ahead-failed"]
    assert replies[2]["reason"] == "ValueError: Mosaic failed"


def test_the_serve_command_line_reads_its_keys_flags_and_pass(tmp_path, monkeypatch):
    seen = {}

    def serve(journal, keys, dashboard, ahead, commands, reply, pass_name):
        seen.update(journal=journal, keys=keys, dashboard=dashboard, ahead=ahead,
                    pass_name=pass_name)
        return 0
    monkeypatch.setattr(measuring, "serve", serve)
    monkeypatch.setattr(measuring.os, "dup2", lambda a, b: None)
    monkeypatch.setattr(measuring.os, "fdopen", lambda fd, mode: open(tmp_path / "r", mode))
    monkeypatch.setattr(measuring.sys, "stdout", measuring.sys.stdout)
    keys_file = tmp_path / "k.json"
    keys_file.write_text(json.dumps([measuring.key_id(_key("a"))]))
    assert measuring._main(["serve", str(tmp_path / "w.jsonl"), str(keys_file), "--serial",
                            "--pass", "confirm", "--dashboard"]) == 0
    assert seen == {"journal": tmp_path / "w.jsonl", "keys": [_key("a")], "dashboard": True,
                    "ahead": False, "pass_name": "confirm"}


# -- the pool of one worker per commit, and the clocks of a round ------------------------------

def _trees(monkeypatch, tmp_path):
    trees = {}

    def source_tree(commit, root=None):
        trees.setdefault(commit, tmp_path / "trees" / commit[:12])
        return trees[commit]
    monkeypatch.setattr(confirm, "source_tree", source_tree)
    return trees


def test_the_pool_keeps_one_worker_per_commit_over_its_own_tree_and_serves_kept_rounds(
        tmp_path, monkeypatch):
    trees = _trees(monkeypatch, tmp_path)
    spawn = Spawner(monkeypatch, faulty)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    pool = confirm.Pool(tmp_path / "j", keys={BASE: [_key("a")], HEAD: [_key("a")]},
                        log=lambda _: None, spawn=spawn)
    for index in range(2):
        for commit in (BASE, HEAD):
            assert pool.measure(commit, [_key("a")], index)[_key("a")]["event"] == "done"
    assert len(spawn.channels) == 2  # one per commit, for every round
    assert [channel.env["PYTHONPATH"] for channel in spawn.channels] == [
        f"{trees[BASE].resolve()}:/elsewhere", f"{trees[HEAD].resolve()}:/elsewhere"]
    assert pool.journal(BASE, _key("a"), "confirm") == tmp_path / "j" / BASE[:12] / "rounds" / \
        "softmax.jsonl"
    assert pool.journal(HEAD, _key("a"), "first") == tmp_path / "j" / HEAD[:12] / "softmax.jsonl"
    # a round kept (measured beside the first pass) is served, marked, and not measured again
    pool.keep(BASE, _key("a"), 2, {"event": "done", "samples": [1.0]})
    served = pool.measure(BASE, [_key("a")], 2)[_key("a")]
    assert served == {"event": "done", "samples": [1.0], "stored": True}
    assert len(spawn.measured()) == 4
    pool.close()
    assert all(channel.sent[-1] == {"do": "exit"} for channel in spawn.channels)


@pytest.mark.parametrize(("base", "head", "slower", "factor"), [
    ([1980] * 3, [1980] * 3, True, 1.0),
    ([1980] * 3, [1960] * 3, True, 1.0),  # one boost step apart: within CLOCK_TOLERANCE
    ([1980] * 3, [1650] * 3, True, 1980 / 1650),  # the head throttled: it may explain a slowdown
    ([1650] * 3, [1980] * 3, True, 1.0),  # the base throttled: it explains no slowdown
    ([1650] * 3, [1980] * 3, False, 1980 / 1650),  # ... but may explain a speed-up
    ([None] * 3, [1650] * 3, True, 1.0),  # a side without clocks (a CPU): no adjustment
    ([1980, None, 1980], [1650, None, 1650], True, 1980 / 1650),
])
def test_a_rounds_clock_factor_is_what_throttling_could_explain(base, head, slower, factor):
    assert confirm.clock_factor({"clocks": base}, {"clocks": head}, slower) == \
        pytest.approx(factor)


def _row(verdict="slower", impl="xla"):
    return asv_tools.Row("benchmarks.Softmax.time_device", (f"'{impl}'", f"'{CASE}'", "'fwd'"),
                         1e-3, 1.03e-3, 1.03, verdict, gap=0.01)


def test_a_slowdown_the_heads_throttled_clock_explains_is_not_confirmed():
    """Three rounds 3% slower, the head's SM clock 3.6% lower in one: in cycles that round
    reads under half the gap, so the row is not confirmed (a throttled stretch cannot fail a
    pull request); the same rounds at equal clocks are."""
    def measure_with(head_mhz):
        def measure(commit, keys, index):
            slow = commit == HEAD
            mhz = head_mhz[index] if slow else 1980
            return {key: {"event": "done", "samples": [1.03 if slow else 1.0] * 5,
                          "clocks": [mhz] * 5} for key in keys}
        return measure
    (throttled,) = confirm.confirm([_row()], BASE, HEAD, rounds=3, log=lambda _: None,
                                   measure=measure_with([1980, 1912, 1980]))
    assert throttled.verdict == "same (not confirmed)"
    assert "round 2 counted as 0.995 in cycles (clocks 4% apart)" in throttled.confirmed
    (steady,) = confirm.confirm([_row()], BASE, HEAD, rounds=3, log=lambda _: None,
                                measure=measure_with([1980, 1975, 1980]))
    assert steady.verdict == "slower" and "cycles" not in steady.confirmed


def test_the_log_says_how_many_rounds_were_measured_now_and_how_many_kept():
    lines = []

    def measure(commit, keys, index):
        return {key: {"event": "done", "samples": [1.03 if commit == HEAD else 1.0],
                      **({"stored": True} if index < 2 else {})} for key in keys}
    confirm.confirm([_row()], BASE, HEAD, rounds=3, log=lines.append, measure=measure)
    took = next(line for line in lines if line.startswith("confirmation took"))
    assert took.endswith(": 2 measurement(s) now, 4 taken beside the first pass")


# -- the interleaved gate ------------------------------------------------------------------------

def _listing(impls=("xla", "torch", "pallas"), cases=(CASE,)):
    """asv's discovery of Softmax's two gate benchmarks over these parameters."""
    params = [[f"'{i}'" for i in impls], [f"'{c}'" for c in cases], ["'fwd'"]]
    return [{"name": f"benchmarks.Softmax.{method}", "params": params, "version": "1",
             "param_names": ["implementation", "case", "direction"], "type": kind,
             "unit": unit}
            for method, kind, unit in (("time_device", "time", "seconds"),
                                       ("track_peak_memory", "track", "bytes"))]


def _plan(listings):
    chosen = {commit: interleaved.selection(listing, None) for commit, listing in
              listings.items()}
    keys = {commit: interleaved.keys_of(listings[commit], chosen[commit],
                                        confirm.class_names()) for commit in listings}
    return interleaved.Plan(BASE, HEAD, listings, chosen, keys)


class Samples:
    """behave() for the gate's workers: each commit's samples by (implementation, round)
    (default 1.0 ms), each worker's commit known by its tree; what an implementation's
    name says (hang, abort) it does."""

    def __init__(self, trees, slow=None, hang=()):
        self.trees, self.slow, self.hang = trees, slow or {}, set(hang)

    def __call__(self, channel, command):
        commit = next(c for c, tree in self.trees.items() if str(tree.resolve()) == channel.tree)
        if command["do"] != "measure":
            return faulty(channel, command)
        impl = command["key"].split("/")[1]
        if (commit, impl) in self.hang:
            return HANG
        value = self.slow.get((commit, impl), {}).get(command["round"], 1e-3)
        samples = [value * (1 + 0.001 * ((i % 3) - 1)) for i in range(10)]
        phases = {"warmup": 0.01, "sampling": 0.02, **(
            {"inputs": 0.1, "compile": 0.5} if command["pass"] == "first" else {})}
        return _done(channel, command, samples, commit=commit, peak_bytes=100.0,
                     method="host-clock", clocks=[1980] * 10, phases=phases)


def _first_pass(tmp_path, monkeypatch, listings, slow=None, rounds=3):
    trees = _trees(monkeypatch, tmp_path)
    for commit in (BASE, HEAD):
        confirm.source_tree(commit)
    spawn = Spawner(monkeypatch, Samples(trees, slow))
    plan = _plan(listings)
    pool = confirm.Pool(tmp_path / "journals", keys=plan.keys, log=lambda _: None, spawn=spawn)
    logged = []
    interleaved.first_pass(plan, pool, rounds=rounds, min_gap=0.01, floors={},
                           log=logged.append)
    return plan, pool, spawn, trees, logged


def _measures(spawn, trees, pass_name=None):
    """(commit of the worker, implementation, pass, round) of every measurement, in the order
    they were sent, over all workers."""
    commit_of = {str(tree.resolve()): commit for commit, tree in trees.items()}
    return [(commit_of[channel.tree], command["key"].split("/")[1], command["pass"],
             command["round"]) for channel, command in spawn.sends
            if command["do"] == "measure" and pass_name in (None, command["pass"])]


def test_each_parameter_set_is_measured_on_both_commits_the_order_alternating(
        tmp_path, monkeypatch):
    """planted: a fixed order (base first every time) fails this."""
    _, _, spawn, trees, _ = _first_pass(tmp_path, monkeypatch, {BASE: _listing(),
                                                                HEAD: _listing()})
    assert [(commit, impl) for commit, impl, _, _ in _measures(spawn, trees, "first")] == [
        (BASE, "xla"), (HEAD, "xla"), (HEAD, "torch"), (BASE, "torch"), (BASE, "pallas"),
        (HEAD, "pallas")]


def test_each_commit_has_its_own_worker_over_its_own_tree_for_the_whole_gate(
        tmp_path, monkeypatch):
    """planted: one worker reused across commits fails this (it would measure the head's
    samples with the base's kernels)."""
    slow = {(HEAD, "xla"): {0: 1.05e-3, 1: 1.05e-3, 2: 1.05e-3, 3: 1.05e-3}}
    plan, pool, spawn, trees, _ = _first_pass(tmp_path, monkeypatch,
                                              {BASE: _listing(), HEAD: _listing()}, slow)
    assert len(spawn.channels) == 2  # two workers, started once, for both passes
    by_tree = {channel.tree for channel in spawn.channels}
    assert by_tree == {str(trees[BASE].resolve()), str(trees[HEAD].resolve())}
    for channel in spawn.channels:  # every record a worker took is of its own commit
        records = [c for c in channel.sent if c["do"] == "measure"]
        assert records and all(pool.workers[commit].channel is not None
                               for commit in (BASE, HEAD))
    for commit in (BASE, HEAD):
        entries = measuring.read_journal(pool.journal(commit, _key("xla"), "first"))
        assert {e["commit"] for e in entries if e["event"] == "done"} == {commit}
        rounds = measuring.read_journal(pool.journal(commit, _key("xla"), "confirm"))
        assert {e["commit"] for e in rounds if e["event"] == "done"} == {commit}


def test_a_flagged_row_gets_every_round_on_both_commits_while_its_case_is_open(
        tmp_path, monkeypatch):
    """planted: a round dropped (one round fewer measured) fails this."""
    slow = {(HEAD, "torch"): dict.fromkeys(range(4), 1.05e-3)}
    _, pool, spawn, trees, logged = _first_pass(tmp_path, monkeypatch,
                                                {BASE: _listing(), HEAD: _listing()}, slow)
    rounds = [(commit, r) for commit, impl, pass_name, r in _measures(spawn, trees, "confirm")]
    assert rounds == [(BASE, 1), (HEAD, 1), (HEAD, 2), (BASE, 2), (BASE, 3), (HEAD, 3)]
    # confirmed before the next parameter set, and before the case's release
    order = [(command["do"], command.get("key", "").split("/")[1:2])
             for _, command in spawn.sends]
    torch_done = max(i for i, (do, impl) in enumerate(order) if impl == ["torch"])
    pallas_first = min(i for i, (do, impl) in enumerate(order) if impl == ["pallas"])
    assert torch_done < pallas_first
    assert [len(pool.kept)] == [6]
    (said,) = [line for line in logged if "re-measured" in line]
    assert said.startswith(f"  re-measured softmax/torch/{CASE}/fwd (slower by 1.050")
    assert said.endswith("1.050 1.050 1.050 (mean 1.050) -> slower")


def test_a_chance_flag_settles_in_one_round_and_an_unflagged_row_gets_none(tmp_path,
                                                                           monkeypatch):
    slow = {(HEAD, "xla"): {0: 1.05e-3}}  # the first pass only: a slow spell
    _, _, spawn, trees, logged = _first_pass(tmp_path, monkeypatch,
                                             {BASE: _listing(), HEAD: _listing()}, slow)
    assert [(c, impl, r) for c, impl, _, r in _measures(spawn, trees, "confirm")] == [
        (BASE, "xla", 1), (HEAD, "xla", 1)]
    (said,) = [line for line in logged if "re-measured" in line]
    assert said.endswith("-> same (not confirmed)")
    assert logged[0] == f"  [1/3] softmax/xla/{CASE}/fwd: base 1000.00 us, head 1050.00 us (1.050)"


def test_no_rounds_measure_nothing_again(tmp_path, monkeypatch):
    slow = {(HEAD, "xla"): dict.fromkeys(range(4), 1.05e-3)}
    _, _, spawn, trees, logged = _first_pass(tmp_path, monkeypatch,
                                             {BASE: _listing(), HEAD: _listing()}, slow,
                                             rounds=0)
    assert not _measures(spawn, trees, "confirm")
    assert not any("re-measured" in line for line in logged) and len(logged) == 3


def test_a_parameter_set_one_commit_lacks_is_measured_on_the_other_alone(tmp_path, monkeypatch):
    _, _, spawn, trees, _ = _first_pass(tmp_path, monkeypatch, {
        BASE: _listing(("xla", "torch")), HEAD: _listing(("xla", "torch", "pallas"))})
    assert [(c, impl) for c, impl, _, _ in _measures(spawn, trees, "first")] == [
        (BASE, "xla"), (HEAD, "xla"), (HEAD, "torch"), (BASE, "torch"), (HEAD, "pallas")]


def test_both_workers_are_sent_each_case_before_its_first_measurement_then_release_it(
        tmp_path, monkeypatch):
    listing = _listing(("xla", "torch"), (CASE, "f32-3x5"))
    _, _, spawn, _, _ = _first_pass(tmp_path, monkeypatch, {BASE: listing, HEAD: listing})
    for channel in spawn.channels:
        done = [(c["do"], len(c.get("keys", [0])), c.get("keys", [c.get("key")])[0].split("/")[2])
                for c in channel.sent]
        assert done == [("case", 2, CASE), ("measure", 1, CASE), ("release", 1, CASE),
                        ("measure", 1, CASE), ("release", 1, CASE), ("release", 2, CASE),
                        ("case", 2, "f32-3x5"), ("measure", 1, "f32-3x5"),
                        ("release", 1, "f32-3x5"), ("measure", 1, "f32-3x5"),
                        ("release", 1, "f32-3x5"), ("release", 2, "f32-3x5")]


def test_the_chosen_benchmarks_select_their_parameter_sets_as_asv_run_bench_does():
    listing = _listing(("xla", "torch"), (CASE, "f32-3x5"))
    chosen = interleaved.selection(listing, r"time_device\(.*torch")
    assert chosen == {"benchmarks.Softmax.time_device": [2, 3]}
    keys = interleaved.keys_of(listing, chosen, confirm.class_names())
    assert keys == [_key("torch"), _key("torch", "f32-3x5")]
    everything = interleaved.keys_of(listing, interleaved.selection(listing, None), {})
    # grouped by case (inputs made once), each key once though two benchmarks read it
    assert everything == [_key("xla"), _key("torch"), _key("xla", "f32-3x5"),
                          _key("torch", "f32-3x5")]


@pytest.mark.parametrize(("name", "op"), [("Softmax", "softmax"), ("RowSum", "row_sum"),
                                          ("ShardedMatmul", "sharded_matmul")])
def test_a_benchmark_class_names_its_operation(name, op):
    assert interleaved._op_of(name, {}) == op
    assert interleaved._op_of(name, confirm.class_names()) == op


# -- the whole gate: asv results, the table, the exit status -----------------------------------

def _gate(tmp_path, monkeypatch, slow=None, impls=("xla", "torch"), head_impls=None, hang=()):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv(confirm.ROOT_VARIABLE, str(tmp_path / "confirm"))
    trees = _trees(monkeypatch, tmp_path)
    monkeypatch.setattr(asv_tools, "full_hash", lambda rev: {"main": BASE, "HEAD": HEAD}[rev])
    monkeypatch.setattr(recover, "_commit_date_ms", lambda commit: 1_700_000_000_000)
    monkeypatch.setattr(interleaved, "keep_benchmark_list", lambda *args: None)
    monkeypatch.setattr(measuring, "item_limit", lambda key: 5.0)
    listings = {BASE: _listing(impls), HEAD: _listing(head_impls or impls)}

    def discover_with(tree, *, dashboard, benchmark_dir):
        assert benchmark_dir == pathlib.Path("perf_tests") and not dashboard
        return next(listings[c] for c, t in trees.items() if t == tree)
    spawn = Spawner(monkeypatch, Samples(trees, slow, hang))
    lines = []
    results = tmp_path / "results"
    status = interleaved.gate("main", "HEAD", machine="m", results_dir=str(results),
                              json_path=str(tmp_path / "rows.json"), log=lines.append,
                              spawn=spawn, discover_with=discover_with)
    rows = {(row["benchmark"].split(".")[-1], row["params"][0].strip("'")): row
            for row in json.loads((tmp_path / "rows.json").read_text())}
    return status, rows, lines, results, spawn


def test_the_gate_writes_both_commits_asv_results_and_judges_them_as_the_compare_does(
        tmp_path, monkeypatch, capsys):
    slow = {(HEAD, "xla"): dict.fromkeys(range(4), 1.05e-3)}
    status, rows, lines, results, _ = _gate(tmp_path, monkeypatch, slow)
    assert status == 1
    assert rows[("time_device", "xla")]["verdict"] == "slower"
    assert rows[("time_device", "xla")]["confirmed"] == "1.050 1.050 1.050 (mean 1.050)"
    assert rows[("time_device", "torch")]["verdict"].startswith("same")
    assert rows[("track_peak_memory", "xla")]["verdict"] == "same (no samples)"
    # the asv results hold the first pass's samples, read back as the compare reads them
    base = asv_tools.load(str(results), "m", BASE)
    key = ("benchmarks.Softmax.time_device", ("'xla'", f"'{CASE}'", "'fwd'"))
    first = measuring.final_records(measuring.read_journal(
        next((tmp_path / "confirm" / "journals").glob(f"*/{BASE[:12]}/softmax.jsonl"))))
    assert base[key].samples == first[_key("xla")]["samples"]
    assert json.loads((results / "benchmarks.json").read_text())[key[0]]["version"] == "1"
    assert (results / "m" / "machine.json").exists()
    # verdict logic unchanged: the compare over the written results says what the first pass
    # said of the same samples
    head = asv_tools.load(str(results), "m", HEAD)
    (again,) = [row for row in asv_tools.compare(base, head) if row.benchmark == key[0]
                and row.params == key[1]]
    assert again.verdict == "slower" and again.gap == rows[("time_device", "xla")]["gap"]
    out = capsys.readouterr().out
    assert "6 taken beside the first pass" in out and "0 measurement(s) now" in out
    said = "\n".join(lines)
    assert "confirmation: 6 round(s)" in said and "first pass" in said
    assert "the two workers at once" in said or "between the workers" in said


def test_an_a_a_gate_exits_0(tmp_path, monkeypatch):
    status, rows, _, _, spawn = _gate(tmp_path, monkeypatch)
    assert status == 0 and all(row["verdict"].startswith("same") for row in rows.values())
    assert len(spawn.channels) == 2


def test_a_parameter_set_that_hangs_on_the_head_fails_alone_and_fails_the_gate(
        tmp_path, monkeypatch):
    status, rows, lines, _, spawn = _gate(tmp_path, monkeypatch, impls=("xla", "torch", "pallas"),
                                          hang={(HEAD, "torch")})
    assert status == 1
    verdicts = {impl: row["verdict"] for (method, impl), row in rows.items()
                if method == "time_device"}
    assert verdicts == {"xla": verdicts["xla"], "torch": "FAILED on head",
                        "pallas": verdicts["pallas"]}
    assert verdicts["xla"].startswith("same") and verdicts["pallas"].startswith("same")
    assert len(spawn.channels) == 3  # the head's worker replaced once, the base's kept
    assert any("softmax/torch/f32-64x1000/fwd: timed out: no result after 5 s" in line
               for line in lines)


@pytest.mark.parametrize("floor", [0.0, 0.05])
def test_the_first_pass_judges_a_row_exactly_as_the_compare_does_on_the_same_samples(floor):
    """The verdict that decides whether a row is confirmed at once is the compare's own, from
    the same samples (asv's statistics over them), the same gap and the same noise floor.
    planted: the first pass ignoring the learned floors -> fails this."""
    listing = _listing(("xla",))
    plan = _plan({BASE: listing, HEAD: listing})
    import numpy as np

    rng = np.random.default_rng(3)
    base = list(1e-3 * (1 + 0.002 * rng.standard_normal(20)))
    head = list(1.03e-3 * (1 + 0.002 * rng.standard_normal(20)))
    name, params = "benchmarks.Softmax.time_device", ("'xla'", f"'{CASE}'", "'fwd'")
    floors = {asv_tools.floor_key((name, params)): floor} if floor else {}
    row = interleaved.first_row(plan, _key("xla"), {
        BASE: {"event": "done", "samples": base}, HEAD: {"event": "done", "samples": head}},
        min_gap=0.01, floors=floors, ops=confirm.class_names())
    (expected,) = asv_tools.compare({(name, params): fakes.asv_result(base)},
                                    {(name, params): fakes.asv_result(head)}, 0.01, floors)
    assert row == expected
    assert row.verdict == ("slower" if not floor else "same (within noise floor)")
    # no time row on both sides, or no result on one: nothing to judge
    assert interleaved.first_row(plan, _key("xla"), {BASE: {"event": "done", "samples": base},
                                                     HEAD: {"event": "failed"}},
                                 min_gap=0.01, floors={}, ops={}) is None


def test_a_commit_whose_benchmarks_do_not_import_fails_the_gate_in_one_line(tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(ROOT)
    _trees(monkeypatch, tmp_path)

    def discover_with(tree, *, dashboard, benchmark_dir):
        raise RuntimeError(f"discovering the benchmarks of {tree.name} failed (exit 1): "
                           "ImportError: no kernels")
    with pytest.raises(SystemExit) as failed:
        interleaved.plan(BASE, HEAD, bench_regex=None, dashboard=False, log=lambda _: None,
                         discover_with=discover_with)
    assert str(failed.value).startswith("kernels bench: discovering the benchmarks of ")
    assert str(failed.value).endswith("ImportError: no kernels")


@pytest.mark.slow
def test_asvs_own_discovery_lists_a_commits_benchmarks_with_its_kernels(tmp_path):
    """asv's benchmark.py over this checkout's perf_tests, this checkout as the commit's tree:
    the classes and parameters asv would run (the CPU's quick set)."""
    listing = interleaved.discover(ROOT, dashboard=False, benchmark_dir=ROOT / "perf_tests")
    names = {benchmark["name"] for benchmark in listing}
    assert "benchmarks.Softmax.time_device" in names
    assert "benchmarks.Softmax.track_gbps" not in names  # the dashboard's, not asked for
    with_dashboard = interleaved.discover(ROOT, dashboard=True,
                                          benchmark_dir=ROOT / "perf_tests")
    assert "benchmarks.Softmax.track_gbps" in {b["name"] for b in with_dashboard}
    broken = tmp_path / "tree" / "kernels"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a broken commit')\n")
    with pytest.raises(RuntimeError, match="discovering the benchmarks of tree failed"):
        interleaved.discover(tmp_path / "tree", dashboard=False,
                             benchmark_dir=ROOT / "perf_tests")
