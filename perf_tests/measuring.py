"""How the asv benchmarks measure: every parameter set of an operation in one worker process,
journalled, with device-time samples taken until the median is pinned.

asv forks one process per (benchmark method, parameter set). Were each to start JAX and
torch, make its inputs, compile and warm up, that would cost seconds per parameter set, over
a thousand times for the whole suite. Instead the first benchmark process of an operation
calls `ensure_measured`: a supervisor that starts a worker (this file run as a script, by the
same Python, so it measures the `kernels` asv installed for the commit) over every parameter
set of the operation. The worker starts its backends once, makes each case's inputs once
(every implementation of a case shares them), and per parameter set compiles (through the
persistent JAX, Triton and nvcc caches), warms up and samples, appending one JSON line per
result to a journal. Every later benchmark process reads its record from the journal and
replays it: `time_device` hands asv the recorded samples one by one.

Samples (`Sampling`): at least `min_samples` (asv's Mann-Whitney test needs 7 a side to
fire at its p < 0.002), then doubling batches until the 99% confidence interval of the
median is within `target` of it (`kernels.timing.median_halfwidth`), `max_samples` are
taken, or `max_seconds` of sampling have passed.

Compiling ahead: before a case is sampled, its JAX parameter sets (two or more) are prepared
and compiled together on threads (XLA's compiler, Mosaic's and ptxas run without the GIL; on
one H100 compiling was 72% of a cold commit's measuring, 2026-11-26), then sampled one at a
time, so no compilation shares the GPU with a sample. torch and Triton kernels compile at
their first call, as before.

Faults are contained: the supervisor gives each parameter set a time limit that grows with
its case's bytes; a worker that runs past it, dies (a segfault, an abort) or reports an
exception (after which a CUDA context may be unusable) is replaced, the parameter set in
flight is recorded as failed with a one-line reason, and the rest are measured by the new
worker (one stopped while compiling ahead is replaced by one that compiles serially, which
finds the parameter set at fault). A call that launches no kernel (a view) is skipped. The
journal is appended and flushed line by line, so what was measured survives an interrupted
run. Whether a parameter set can run on this machine is decided by the worker too
(`skipped`), so the benchmark processes never start a JAX backend or a CUDA context.

The live worker (`serve`, supervised by `LiveWorker`): `python -m kernels bench --base`
starts one per commit for the whole gate (kernels/bench/interleaved.py). It answers commands
(a case to prepare, a parameter set to measure, parameter sets to release) one JSON line
each, keeps each parameter set it measured (executable, sampler, inputs on the device) so a
later round costs its warm-up and samples only, and journals as the worker does, each line
tagged with its pass ("first", "confirm") and round. Its faults are contained the same way:
a limit per command, a parameter set that hangs, dies or raises is failed alone, and a fresh
worker is sent the case again.

Journal lines (JSON, one object each), read by `read_journal` and by `kernels.bench`:
  {"event": "worker", "pid", "process_s", "backend_s"}   a worker started and is ready
  {"event": "ahead", "keys", "threads"}                   a case's JAX keys compile ahead
  {"event": "ahead-done", "seconds"}                      ... and are compiled (wall time)
  {"event": "ahead-failed", "reason"}                     ... or one raised: worker exits
  {"event": "start", "key"}                               a parameter set begins
  {"event": "done", "key", "samples", "clocks" (the SM clock, MHz, beside each sample; None
   where unread), "method", "stop", "throttled", "peak_bytes", "launch_us", "roofline",
   "phases": {"inputs", "compile", "warmup", "sampling", "memory", "launch"}}
   (a live worker's later rounds: "warmup" and "sampling" only, no memory or launch cost)
  {"event": "failed", "key", "reason"}
  {"event": "skipped", "key", "reason"}                  it cannot run here (asv: n/a)

This file runs against the `kernels` of every benchmarked commit, older layouts included: it
imports the flat names every commit has (kernels.registry, kernels.timing, ...) and uses the
newer helpers only where present.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

# A parameter set: (operation, implementation, case id, direction).
Key = tuple[str, str, str, str]
FINAL_EVENTS = ("done", "failed", "skipped")
# After a worker dies, how much of its stderr a failure's reason quotes (its last error line).
_ERROR_WORDS = ("Error", "error", "CUDA", "Fatal", "Abort", "Segmentation")
# Worker exit status after it reported an exception: the supervisor starts a fresh one, since
# a CUDA fault leaves the process's context unusable for everything after it.
EXIT_AFTER_FAILURE = 3
WORKER_START_LIMIT_S = 180.0  # imports and backend start
ITEM_LIMIT_S = 120.0  # per parameter set: compile, warm-up, sampling, memory ...
ITEM_LIMIT_S_PER_GB = 30.0  # ... plus this much per GB one call moves (large cases compile
#                             and make inputs longer)
LIMIT_VARIABLE = "KERNELPERF_ITEM_LIMIT_S"  # a fixed limit per parameter set, in seconds
# Compiling ahead (see the module docstring): at most this many threads, "0" in this variable
# turns it off. A worker that fails or is stopped while compiling ahead exits with
# EXIT_AHEAD_FAILED (or is killed), and its replacement compiles serially, so that a fault is
# charged to its own parameter set.
AHEAD_VARIABLE = "KERNELPERF_COMPILE_AHEAD"
AHEAD_THREADS = 8
EXIT_AHEAD_FAILED = 4
# The supervisor's "parameter set in flight" while its worker compiles ahead.
AHEAD = ("(compiling ahead)",) * 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
    """When the samples of one parameter set are enough (see the module docstring)."""

    min_samples: int = 10
    max_samples: int = 100
    target: float = 0.004  # relative half-width of the median's 99% interval
    max_seconds: float = 3.0  # wall time of sampling, flushes and waits included

    def __post_init__(self) -> None:
        if not 2 <= self.min_samples <= self.max_samples:
            raise ValueError(f"min_samples: expected 2 <= min_samples <= max_samples "
                             f"({self.max_samples}), got {self.min_samples}")
        if not (self.target > 0 and self.max_seconds > 0):
            raise ValueError(f"target, max_seconds: expected > 0, got {self.target}, "
                             f"{self.max_seconds}")


GPU_SAMPLING = Sampling()
# The host clock on a shared CPU is noisy and interpreted kernels slow: fewer, capped sooner.
CPU_SAMPLING = Sampling(min_samples=7, max_samples=50, max_seconds=2.0)
# A `kernels` older than timing.median_halfwidth: a fixed count.
FALLBACK_SAMPLES = 20


def key_id(key: Key) -> str:
    return "/".join(key)


def parse_key(text: str) -> Key:
    op, impl, case, direction = text.split("/")
    return op, impl, case, direction


def collect_samples(take: Callable[[int], list[float]], rule: Sampling,
                    halfwidth: Callable[[Sequence[float]], float] | None,
                    clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], str]:
    """Samples from `take(n)` until the median is pinned (`halfwidth(samples) <= target`),
    or the count or time cap is reached; (samples, why it stopped). Without `halfwidth` (an
    older kernels), FALLBACK_SAMPLES capped by `max_samples`."""
    start = clock()
    if halfwidth is None:
        return take(min(FALLBACK_SAMPLES, rule.max_samples)), "fixed"
    samples = take(rule.min_samples)
    while True:
        if halfwidth(samples) <= rule.target:
            return samples, "pinned"
        if len(samples) >= rule.max_samples:
            return samples, "max-samples"
        if clock() - start >= rule.max_seconds:
            return samples, "time-cap"
        samples += take(min(len(samples), rule.max_samples - len(samples)))


# -- the journal ------------------------------------------------------------------------------

def append(journal: Path, entry: dict) -> None:
    """One JSON line, flushed to disk before returning: an interrupted run keeps it."""
    with open(journal, "a") as out:
        out.write(json.dumps(entry) + "\n")
        out.flush()
        os.fsync(out.fileno())


def read_journal(journal: Path) -> list[dict]:
    """Every complete line of `journal` (a line cut short by a killed writer is skipped)."""
    if not journal.exists():
        return []
    entries = []
    for line in journal.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def final_records(entries: Iterable[dict]) -> dict[Key, dict]:
    """The last done/failed record of each parameter set."""
    return {parse_key(e["key"]): e for e in entries if e.get("event") in FINAL_EVENTS}


# -- the supervisor ---------------------------------------------------------------------------

def item_limit(key: Key) -> float:
    """Seconds a parameter set may take before its worker is killed: $KERNELPERF_ITEM_LIMIT_S,
    else ITEM_LIMIT_S plus ITEM_LIMIT_S_PER_GB per GB one call moves."""
    fixed = os.environ.get(LIMIT_VARIABLE)
    if fixed:
        return float(fixed)
    from kernels import registry

    op, _, case_id, direction = key
    operation = registry.operation(op)
    moved = operation.work(operation.case(case_id), direction).bytes
    return ITEM_LIMIT_S + ITEM_LIMIT_S_PER_GB * moved / 1e9


def _last_error_line(log: Path) -> str:
    if not log.exists():
        return ""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines[-200:]):
        if any(word in line for word in _ERROR_WORDS):
            return line[:300]
    return lines[-1][:300] if lines else ""


def _last_ahead_failure(journal: Path) -> str:
    reasons = [entry.get("reason", "") for entry in read_journal(journal)
               if entry.get("event") == "ahead-failed"]
    return reasons[-1] if reasons else "no reason given"


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def ensure_measured(keys: Sequence[Key], journal: Path, *, dashboard: bool = False,
                    limit: Callable[[Key], float] = item_limit,
                    python: str = sys.executable, env: dict[str, str] | None = None,
                    worker_command: Sequence[str] | None = None, poll_s: float = 0.2,
                    log: Callable[[str], None] | None = None) -> dict[Key, dict]:
    """Every key's record, measuring (in workers) those `journal` does not hold yet.

    A worker is `worker_command JOURNAL KEYS.json [--dashboard]` (default: this file's
    worker, run by `python`).

    Workers are started until every key has a done or failed record: one that dies or runs
    past `limit(key)` has the key in flight recorded as failed, and the keys after it go to
    a new worker. One that fails, dies or runs past its limit while compiling ahead is
    replaced by a worker that compiles serially (`--serial`), which finds the key at fault.
    A worker that records nothing at all fails every key left (it could not start: an import
    error, say), so the loop always ends.
    """
    journal.parent.mkdir(parents=True, exist_ok=True)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    serial = False
    while True:
        records = final_records(read_journal(journal))
        todo = [key for key in keys if key not in records]
        if not todo:
            return {key: records[key] for key in keys}
        keys_file = journal.with_suffix(f".todo.{os.getpid()}.json")
        keys_file.write_text(json.dumps([key_id(key) for key in todo]))
        stderr_log = journal.with_suffix(".stderr.log")
        command = [*(worker_command or [python, str(Path(__file__).resolve()), "worker"]),
                   str(journal), str(keys_file), *(["--dashboard"] if dashboard else []),
                   *(["--serial"] if serial else [])]
        started = time.monotonic()
        with open(stderr_log, "a") as stderr:
            worker = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                      env={**(env or os.environ),
                                           "KERNELPERF_SPAWNED_AT": repr(time.time())},
                                      start_new_session=True)
        progressed, failure = _watch(worker, journal, limit, started, poll_s, log)
        keys_file.unlink(missing_ok=True)
        if failure is None:
            continue
        key, reason = failure
        if key == AHEAD and not serial:
            serial = True
            log(f"kernelperf: compiling ahead failed ({reason}); its replacement compiles one "
                f"parameter set at a time")
        elif key not in (None, AHEAD):
            append(journal, {"event": "failed", "key": key_id(key), "reason": reason})
            log(f"kernelperf: {key_id(key)}: {reason}")
        elif not progressed:  # it could not even start: every key left fails for that reason
            for left in todo:
                append(journal, {"event": "failed", "key": key_id(left), "reason": reason})
            log(f"kernelperf: measuring worker: {reason}")


def _watch(worker: subprocess.Popen, journal: Path, limit: Callable[[Key], float],
           started: float, poll_s: float, log: Callable[[str], None],
           ) -> tuple[bool, tuple[Key | None, str] | None]:
    """Follow one worker until it exits: (whether it started a key, and None, or (the key in
    flight, or None between keys, the reason) when it ended abnormally)."""
    offset = journal.stat().st_size if journal.exists() else 0
    in_flight: Key | None = None
    since = started
    ready = progressed = False
    allowed_now = ITEM_LIMIT_S
    stderr_log = journal.with_suffix(".stderr.log")
    try:
        while True:
            code = worker.poll()
            with open(journal) if journal.exists() else open(os.devnull) as lines:
                lines.seek(offset)
                chunk = lines.read()
            complete = chunk[:chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                event = entry.get("event")
                if event == "worker":
                    ready = True
                    since = time.monotonic()
                elif event == "ahead":
                    early = [parse_key(text) for text in entry["keys"]]
                    rounds = -(-len(early) // max(1, entry.get("threads", 1)))
                    in_flight, since = AHEAD, time.monotonic()
                    allowed_now = rounds * max(limit(key) for key in early)
                elif event == "ahead-done":
                    in_flight, since = None, time.monotonic()
                elif event == "start":
                    in_flight, since = parse_key(entry["key"]), time.monotonic()
                    allowed_now = limit(in_flight)
                    progressed = True
                elif event in FINAL_EVENTS:
                    if event == "done":
                        log(f"  measured {entry['key']}: {len(entry['samples'])} samples, "
                            f"median {_median(entry['samples']) * 1e6:.2f} us ({entry['stop']})")
                    in_flight = None
                    since = time.monotonic()
            if code is not None:
                if code in (0, EXIT_AFTER_FAILURE) and in_flight is None:
                    return progressed, None
                if code == EXIT_AHEAD_FAILED:
                    return progressed, (AHEAD, _last_ahead_failure(journal))
                why = _describe_exit(code)
                detail = _last_error_line(stderr_log)
                reason = f"worker {why}" + (f": {detail}" if detail else "")
                return progressed, (in_flight, reason if ready else
                                    f"worker did not start ({reason})")
            waited = time.monotonic() - since
            allowed = allowed_now if in_flight else WORKER_START_LIMIT_S if not ready \
                else ITEM_LIMIT_S
            if waited > allowed:
                _kill(worker)
                what = "still compiling ahead" if in_flight == AHEAD else "no result" \
                    if in_flight else "the worker did not go on"
                return progressed, (in_flight, f"timed out: {what} after {waited:.0f} s "
                                               f"(limit {allowed:.0f} s)")
            time.sleep(poll_s)
    except BaseException:
        _kill(worker)  # Ctrl-C or asv's timeout: leave no worker holding the GPU
        raise


def _kill(worker: subprocess.Popen) -> None:
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    worker.wait()


def _median(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# -- the live supervisor: one long-lived worker per commit ------------------------------------

class _Lost(Exception):
    """The live worker answered nothing in time, or died: why, in one line."""

    def __init__(self, reason: str, started: bool = True):
        super().__init__(reason)
        self.reason, self.started = reason, started


class _PipeChannel:
    """A live worker process: commands to its standard input, replies from its standard
    output, one JSON object a line; its standard error appended to a log."""

    def __init__(self, command: Sequence[str], env: dict[str, str], stderr_log: Path):
        with open(stderr_log, "a") as stderr:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=stderr, env=env,
                                            start_new_session=True)
        self.pid = self.process.pid
        self._buffer = b""

    def send(self, command: dict) -> None:
        try:
            self.process.stdin.write((json.dumps(command) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died: the next receive reads the end of its output

    def receive(self, timeout: float) -> dict | None:
        """The next reply; None if none came within `timeout` seconds; EOFError once the
        worker's output ended (it exited)."""
        import select

        deadline = time.monotonic() + timeout
        output = self.process.stdout.fileno()
        while True:
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([output], [], [], left)[0]:
                    return None
                chunk = os.read(output, 1 << 16)
                if not chunk:
                    raise EOFError
                self._buffer += chunk
            line, _, self._buffer = self._buffer.partition(b"\n")
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue

    def exit_code(self, wait_s: float) -> int | None:
        try:
            return self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        _kill(self.process)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


# After a reply that says it failed, how long a worker may take to exit before it is killed.
EXIT_WAIT_S = 10.0


class LiveWorker:
    """One commit's measuring worker, alive for a whole gate: `serve` above, run by `python`
    with `env` (PYTHONPATH: the commit's source tree, so it measures that commit's `kernels`).

    Each command waits for its reply within its limit: a parameter set's measurement
    `limit(key)` (every round: the first compiles), a case's compiling ahead its rounds times
    the largest limit of its keys, the start WORKER_START_LIMIT_S. A worker that runs past a
    limit is killed, one that dies is read for its last error line, and the parameter set in
    flight is recorded as failed (in its journal, as the worker would) with that reason; the
    next command starts a fresh worker, which is sent the case in hand again (its parameter
    sets compile again, from the persistent caches). A fault while compiling ahead makes
    every later worker compile one parameter set at a time (`--serial`), which finds the one
    at fault. A worker that cannot start at all fails every command after, at once.

    spawn(command, env, stderr_log) -> a channel (send, receive, exit_code, kill, pid):
    default _PipeChannel; tests give a stand-in.
    """

    def __init__(self, name: str, directory: Path, keys: Sequence[Key], *,
                 python: str = sys.executable, env: dict[str, str] | None = None,
                 dashboard: bool = False, limit: Callable[[Key], float] | None = None,
                 log: Callable[[str], None] | None = None, spawn=None,
                 worker_command: Sequence[str] | None = None):
        self.name, self.directory, self.keys = name, directory, list(keys)
        self.python, self.env, self.dashboard = python, env, dashboard
        self.limit = limit or item_limit
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.spawn = spawn or _PipeChannel
        self.worker_command = worker_command
        self.serial = False
        self.broken: str | None = None  # why no worker could start
        self.channel = None
        self.ready = False
        self.started = 0  # workers started
        self.case_command: dict | None = None  # sent again to a replacement
        self._case_sent: object = None  # the channel the case was sent to
        self._skipped: dict[Key, dict] = {}
        self.traced = False  # the live worker recorded a device trace (see release)

    @property
    def workers_journal(self) -> Path:
        return self.directory / "workers.jsonl"

    @property
    def stderr_log(self) -> Path:
        return self.directory / "worker.stderr.log"

    def start(self, pass_name: str = "first") -> None:
        """Start a worker if none is alive, without waiting for it to be ready."""
        if self.channel is not None or self.broken:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        keys_file = self.directory / "keys.json"
        keys_file.write_text(json.dumps([key_id(key) for key in self.keys]))
        command = [*(self.worker_command or [self.python, str(Path(__file__).resolve())]),
                   "serve", str(self.workers_journal), str(keys_file), "--pass", pass_name,
                   *(["--dashboard"] if self.dashboard else []),
                   *(["--serial"] if self.serial else [])]
        self.channel = self.spawn(command, {**(self.env or os.environ),
                                            "KERNELPERF_SPAWNED_AT": repr(time.time())},
                                  self.stderr_log)
        self.ready, self.started = False, self.started + 1

    def _receive(self, limit: float, what: str) -> dict:
        """The live worker's next reply within `limit` seconds, or _Lost (the worker killed
        or dead, and forgotten)."""
        started = time.monotonic()
        try:
            reply = self.channel.receive(limit)
        except EOFError:
            code = self.channel.exit_code(EXIT_WAIT_S)
            self.channel.kill()
            self.channel = None
            detail = _last_error_line(self.stderr_log)
            why = "worker " + (_describe_exit(code) if code is not None else "ended")
            raise _Lost(why + (f": {detail}" if detail else ""), self.ready) from None
        if reply is None:
            self.channel.kill()
            self.channel = None
            raise _Lost(f"timed out: {what} after {time.monotonic() - started:.0f} s "
                        f"(limit {limit:.0f} s)", self.ready)
        return reply

    def _live(self, pass_name: str):
        """A ready worker (started now if needed, and sent the case in hand); _Lost if it
        could not start (then this LiveWorker is broken for good)."""
        if self.broken:
            raise _Lost(self.broken, False)
        if self.channel is not None and self.ready and self.channel.exit_code(0) is not None:
            self.channel.kill()  # it died between commands: that costs no parameter set
            self.channel = None
        self.start(pass_name)
        if not self.ready:
            try:
                while self._receive(WORKER_START_LIMIT_S, "the worker did not go on").get(
                        "event") != "worker":
                    pass
            except _Lost as lost:
                self.broken = f"worker did not start ({lost.reason})"
                self.log(f"kernelperf: {self.name}: measuring worker: {self.broken}")
                raise _Lost(self.broken, False) from None
            self.ready = True
        if self.case_command is not None and self._case_sent is not self.channel:
            self._send_case(pass_name)
        return self.channel

    def _retire(self) -> None:
        """The worker said it failed and exits by itself: wait for it, else kill it."""
        if self.channel is not None:
            if self.channel.exit_code(EXIT_WAIT_S) is None:
                self.channel.kill()
            self.channel = None

    def case(self, keys: Sequence[Key], journal: Path, pass_name: str = "first") -> dict[Key, dict]:
        """Tell the worker the next case's parameter sets (it skips those that cannot run here
        and compiles the JAX ones ahead together); their skipped records."""
        self.case_command = {"do": "case", "keys": [key_id(key) for key in keys],
                             "journal": str(journal), "pass": pass_name}
        self._case_sent, self._skipped = None, {}
        try:
            self._live(pass_name)
        except _Lost:
            pass  # it could not start: each measurement says so
        return dict(self._skipped)

    def _send_case(self, pass_name: str) -> None:
        """Send the case in hand to the live worker. After a fault while compiling ahead, a
        serial replacement is sent it instead; after a fault of a serial worker's, the case is
        dropped (each parameter set then opens at its first measurement). _Lost only if a
        replacement cannot start."""
        self._case_sent, self._skipped = self.channel, {}
        self.channel.send({**self.case_command, "pass": pass_name})
        try:
            reply = self._receive(ITEM_LIMIT_S, "no result")
            if reply.get("event") == "ahead":
                early = [parse_key(text) for text in reply["keys"]]
                rounds = -(-len(early) // max(1, reply.get("threads", 1)))
                reply = self._receive(rounds * max(self.limit(key) for key in early),
                                      "still compiling ahead")
                if reply.get("event") == "ahead-failed":
                    raise _Lost(reply.get("reason") or "no reason given")
            if reply.get("event") != "case":
                raise _Lost(f"expected the case's reply, got {reply.get('event')!r}")
        except _Lost as lost:
            self._retire()
            if self.serial:
                self.case_command = None
                self.log(f"kernelperf: {self.name}: the case failed again ({lost.reason}); "
                         f"its parameter sets open one at a time")
            else:
                self.serial = True
                self.log(f"kernelperf: {self.name}: compiling ahead failed ({lost.reason}); "
                         f"its replacement compiles one parameter set at a time")
            self._live(pass_name)
            return
        self._skipped = {parse_key(text): {"event": "skipped", "key": text, "reason": why}
                         for text, why in reply.get("skipped", {}).items()}

    def measure(self, key: Key, journal: Path, pass_name: str = "first",
                round_index: int = 0) -> dict:
        """One round of `key`: its record (done, skipped or failed). A fault fails this round
        of this key alone, and is journalled as the worker would."""
        tags = {"pass": pass_name, "round": round_index}
        try:
            self._live(pass_name)
            self.channel.send({"do": "measure", "key": key_id(key), "journal": str(journal),
                               **tags})
            record = self._receive(self.limit(key), "no result")
        except _Lost as lost:
            record = {"event": "failed", "key": key_id(key), "reason": lost.reason, **tags,
                      "t": time.time()}
            journal.parent.mkdir(parents=True, exist_ok=True)
            append(journal, record)
            self.log(f"kernelperf: {self.name}: {key_id(key)}: {lost.reason}")
            return record
        if record.get("event") == "failed":
            self.log(f"kernelperf: {self.name}: {key_id(key)}: {record.get('reason')}")
            self._retire()
        self.traced = self.traced or bool(record.pop("traced", False))
        return record

    def release(self, keys: Sequence[Key], case_done: bool = False) -> None:
        """Let the worker drop these parameter sets (their executables and device memory;
        with `case_done`, the case's inputs too)."""
        if self.channel is None or not self.ready:
            return
        self.channel.send({"do": "release", "keys": [key_id(key) for key in keys],
                           **({"case_done": True} if case_done else {})})
        try:
            self._receive(ITEM_LIMIT_S, "no result")
        except _Lost as lost:
            self.log(f"kernelperf: {self.name}: releasing: {lost.reason}")

    def end_case(self, keys: Sequence[Key]) -> None:
        """The case in hand is done: its parameter sets released, and it is not sent to a
        replacement. A worker that recorded a device trace is told to exit instead: CUPTI
        must not start after a trace, so its next case would be timed another way than in a
        fresh process (the next command starts a fresh one)."""
        self.case_command = None
        if self.traced:
            self.close()
        else:
            self.release(keys, case_done=True)

    def close(self) -> None:
        """Tell the worker to exit, and make sure it has."""
        self.traced = False
        if self.channel is None:
            return
        self.channel.send({"do": "exit"})
        if self.channel.exit_code(EXIT_WAIT_S) is None:
            self.channel.kill()
        self.channel = None


# -- the worker -------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (asv killing a benchmark process at
    its timeout must not leave a worker holding the GPU)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _backend_start(keys: Sequence[Key]) -> float:
    """Start the frameworks the keys need (JAX always; torch's CUDA context for torch ones);
    seconds taken."""
    from kernels import registry

    start = time.perf_counter()
    import jax

    jax.devices()
    if any(registry.implementation(op, impl).framework == "torch" for op, impl, _, _ in keys):
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()
            torch.empty(1, device="cuda")
    return time.perf_counter() - start


@dataclasses.dataclass
class _Held:
    """A parameter set ready to sample, kept by a live worker between rounds: its sampler holds
    the compiled executable and the inputs on the device."""

    impl: object
    case: object
    direction: str
    timeable: object
    jitted: object
    sampler: object
    method: str
    rounds: int = 0  # rounds sampled so far


def _open(key: Key, inputs: tuple, device, ready: tuple | None = None) -> _Held:
    """A parameter set made ready to sample: its timeable (`ready`: its (compiled, jitted)
    pair when it was compiled ahead) and its sampler, whose first call compiles."""
    from kernels import registry, timing

    op, impl_name, case_id, direction = key
    impl = registry.implementation(op, impl_name)
    case = registry.operation(op).case(case_id)
    timeable, jitted = ready or (None, None)
    if timeable is None:
        timeable = jitted = timing.prepare(impl, case, direction=direction, inputs=inputs)
    sampler, method = timing.make_sampler(timeable, "cold", device)  # its first call compiles
    return _Held(impl=impl, case=case, direction=direction, timeable=timeable, jitted=jitted,
                 sampler=sampler, method=method)


def _sample(held: _Held, device, lap: Callable[[str], None]) -> dict:
    """One round of a held parameter set: warm-up (outside the samples), then samples by the
    device's rule; the samples, why they stopped, and the SM clock beside each sample (the
    lower of the reads around its batch; None where none could be read) with the count taken
    while throttled."""
    from kernels import timing

    sampler = held.sampler
    sampler.take(timing.WARMUP_CALLS)
    sampler.reset()
    lap("warmup")
    rule = GPU_SAMPLING if device.platform == "gpu" else CPU_SAMPLING
    samples, stop = collect_samples(sampler.take, rule, getattr(timing, "median_halfwidth", None))
    throttled = sum(sampler.throttled)
    clocks = list(getattr(sampler, "clocks", ()))  # an older kernels' sampler reads none
    lap("sampling")
    return {"samples": samples, "method": held.method, "stop": stop, "throttled": throttled,
            "clocks": clocks if len(clocks) == len(samples) else [None] * len(samples)}


def _extras(held: _Held, samples: Sequence[float], device, dashboard: bool,
            lap: Callable[[str], None]) -> dict:
    """What a parameter set's first round records beside its samples: the compiled peak
    memory (JAX), and on the dashboard the host launch cost and the roofline fraction."""
    from kernels import timing

    peak = _compiled_peak_bytes(held.timeable) if held.impl.framework == "jax" else None
    lap("memory")
    launch = roofline = None
    if dashboard:
        # The jitted function, as users call it: a compiled-ahead executable dispatches
        # through another path.
        launch = _launch_us(timing, held.jitted)
        roofline = _roofline(held.impl, held.case, held.direction, _median(samples), device)
    lap("launch")
    return {"peak_bytes": peak, "launch_us": launch, "roofline": roofline}


def _lapper(phases: dict) -> Callable[[str], None]:
    """lap(name): the seconds since the last lap (or since now) recorded as phase `name`."""
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = now - clock
        clock = now
    return lap


def _measure(key: Key, inputs: tuple, device, dashboard: bool,
             ready: tuple | None = None) -> dict:
    """One parameter set, timed phase by phase; `ready`: its (compiled, jitted) timeables
    when it was compiled ahead (its "compile" phase is then its first call only)."""
    phases: dict[str, float] = {}
    lap = _lapper(phases)
    held = _open(key, inputs, device, ready)
    lap("compile")
    record = _sample(held, device, lap)
    record.update(_extras(held, record["samples"], device, dashboard, lap))
    return {**record, "phases": phases}


def _ahead_keys(keys: Sequence[Key]) -> list[Key]:
    """The keys of one case worth compiling ahead: its JAX ones, when there are two or more
    (torch and Triton kernels compile at their first call, and Triton's autotuner is not
    made for threads)."""
    from kernels import registry

    jax_keys = [key for key in keys if registry.implementation(key[0], key[1]).framework == "jax"]
    return jax_keys if len(jax_keys) > 1 else []


def _compile_ahead(keys: Sequence[Key], inputs: tuple, threads: int) -> dict[Key, tuple]:
    """Each key's (compiled, jitted) timeable, prepared and compiled on `threads` threads
    (XLA's compiler, Mosaic's and ptxas run without the GIL); the first key's error, if any,
    is raised once every thread has ended."""
    from concurrent.futures import ThreadPoolExecutor

    from kernels import registry, timing

    def one(key: Key) -> tuple:
        op, impl_name, case_id, direction = key
        jitted = timing.prepare(registry.implementation(op, impl_name),
                                registry.operation(op).case(case_id), direction=direction,
                                inputs=inputs)
        compiled = jitted.fn.lower(*jitted.args).compile()
        return dataclasses.replace(jitted, fn=compiled), jitted

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(one, key) for key in keys]
    return {key: future.result() for key, future in zip(keys, futures, strict=True)}


# Host launch cost is a dashboard number, never gated: a few samples of a few calls each (a
# 10 ms attention backward at the default 20 calls x 13 samples took 2.6 s per parameter set).
LAUNCH_SAMPLES = 3
LAUNCH_CALLS = 5
LAUNCH_BUDGET_S = 0.1


def _launch_us(timing, timeable) -> float:
    rule = timing.StoppingRule(min_samples=LAUNCH_SAMPLES, time_budget_s=LAUNCH_BUDGET_S)
    return timing.launch_overhead(timeable, rule=rule, calls=LAUNCH_CALLS).median_s * 1e6


def _compiled_peak_bytes(timeable) -> float:
    """The compiled program's peak device bytes (XLA's memory analysis: arguments + outputs +
    temporaries - aliased, as kernels.guards.memory counts them) of the very program timed,
    read from the executable compiled for the samples (no second compilation); for a backward
    that is the pullback applied to its cotangent."""
    fn = timeable.fn
    compiled = fn if hasattr(fn, "memory_analysis") else fn.lower(*timeable.args).compile()
    analysis = compiled.memory_analysis()
    return float(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
                 + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)


def _roofline(impl, case, direction: str, seconds: float, device) -> float | None:
    """Fraction of the roofline (the device's measured ceilings, else its datasheet's)."""
    from kernels import registry
    from kernels.roofline import ceilings, model

    sheet, measured = ceilings.for_device(device)
    chosen = measured or sheet
    if chosen is None:
        return None
    return model.place(registry.operation(impl.op).work(case, direction), seconds, chosen,
                       case.dtype, devices=impl.devices_for(case)).fraction


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    first = next((line for line in text.splitlines() if line.strip()), text)
    return first[:400]


def _unrunnable(key: Key) -> str | None:
    """Why this machine cannot run `key`, or None."""
    from kernels import devices, registry

    op, impl_name, case_id, direction = key
    impl = registry.implementation(op, impl_name)
    reason = devices.case_unavailable_reason(impl, registry.operation(op).case(case_id))
    if reason is None and not registry.has_direction(impl, direction):
        reason = "no backward"
    return reason


def _make_inputs(op: str, case_id: str) -> tuple[tuple, float]:
    """A case's inputs (numpy, shared by every implementation) and the seconds they took."""
    from kernels import checking, registry

    start = time.perf_counter()
    operation = registry.operation(op)
    inputs = checking.make_inputs(operation, operation.case(case_id), 0, "normal")
    return inputs, time.perf_counter() - start


def _launches_no_kernel(error: BaseException) -> bool:
    """The timed call launched nothing on the device (kernels.timing.NoKernel; an older
    kernels said so only in the message): nothing to time, not a fault."""
    return type(error).__name__ == "NoKernel" or "launches none" in str(error)


def worker(journal: Path, keys: Sequence[Key], dashboard: bool, ahead: bool = True) -> int:
    """Measure `keys` in order, one case at a time, one journal line per result; with `ahead`,
    a case's JAX parameter sets are compiled together first. EXIT_AFTER_FAILURE after the
    first exception while measuring (a fresh worker takes the rest), EXIT_AHEAD_FAILED after
    one while compiling ahead (a fresh worker compiles serially)."""
    _die_with_parent()
    device, ready = _start_up(keys)
    append(journal, ready)
    ahead = ahead and os.environ.get(AHEAD_VARIABLE, "") != "0"
    for (op, case_id), group in itertools.groupby(keys, key=lambda key: (key[0], key[2])):
        runnable = []
        for key in group:
            reason = _unrunnable(key)
            if reason:
                append(journal, {"event": "skipped", "key": key_id(key), "reason": reason})
            else:
                runnable.append(key)
        if not runnable:
            continue
        gc.collect()
        inputs, inputs_s, ready = None, 0.0, {}
        early = _ahead_keys(runnable) if ahead else []
        if early:
            threads = min(len(early), AHEAD_THREADS, os.cpu_count() or 1)
            append(journal, {"event": "ahead", "keys": [key_id(key) for key in early],
                             "threads": threads, "t": time.time()})
            try:
                inputs, inputs_s = _make_inputs(op, case_id)
                start = time.perf_counter()
                ready = _compile_ahead(early, inputs, threads)
            except Exception as error:  # noqa: BLE001 - a fresh worker finds whose it is
                append(journal, {"event": "ahead-failed", "reason": _one_line(error),
                                 "t": time.time()})
                return EXIT_AHEAD_FAILED
            append(journal, {"event": "ahead-done", "seconds": time.perf_counter() - start,
                             "t": time.time()})
        for key in runnable:
            append(journal, {"event": "start", "key": key_id(key), "t": time.time()})
            try:
                if inputs is None:
                    inputs, inputs_s = _make_inputs(op, case_id)
                record = _measure(key, inputs, device, dashboard, ready.pop(key, None))
                record["phases"]["inputs"], inputs_s = inputs_s, 0.0
            except Exception as error:  # noqa: BLE001 - any failure of the kernel is its record
                if _launches_no_kernel(error):
                    append(journal, {"event": "skipped", "key": key_id(key),
                                     "reason": _one_line(error)})
                    continue
                append(journal, {"event": "failed", "key": key_id(key),
                                 "reason": _one_line(error), "t": time.time()})
                return EXIT_AFTER_FAILURE
            append(journal, {"event": "done", "key": key_id(key), "t": time.time(), **record})
            gc.collect()
    return 0


# -- the live worker: kernels bench's interleaved gate ------------------------------------------

class _Served:
    """What a live worker keeps between commands: each held parameter set (its executable and
    sampler), each case's inputs while a parameter set of it is held, and what a case
    compiled ahead."""

    def __init__(self, device, dashboard: bool, ahead: bool):
        self.device, self.dashboard, self.ahead = device, dashboard, ahead
        self.held: dict[Key, _Held] = {}
        self.inputs: dict[tuple[str, str], tuple] = {}
        self.inputs_s: dict[tuple[str, str], float] = {}  # not yet charged to a record
        self.ready: dict[Key, tuple] = {}  # compiled ahead, not yet opened
        self.current: tuple[str, str] | None = None  # the case in hand: its inputs are kept

    def _inputs(self, op: str, case_id: str) -> tuple:
        if (op, case_id) not in self.inputs:
            self.inputs[(op, case_id)], self.inputs_s[(op, case_id)] = _make_inputs(op, case_id)
        return self.inputs[(op, case_id)]

    def case(self, command: dict, reply: Callable[[dict], None]) -> int | None:
        """Skip what cannot run here; with compiling ahead, make the case's inputs and compile
        its JAX parameter sets together. EXIT_AHEAD_FAILED if that raised, else None."""
        journal, pass_name = Path(command["journal"]), command.get("pass", "first")
        keys = [parse_key(text) for text in command["keys"]]
        self.current = (keys[0][0], keys[0][2]) if keys else None
        skipped, runnable = {}, []
        for key in keys:
            reason = _unrunnable(key)
            if reason:
                skipped[key_id(key)] = reason
                append(journal, {"event": "skipped", "key": key_id(key), "reason": reason})
            elif key not in self.held:
                runnable.append(key)
        early = _ahead_keys(runnable) if self.ahead and runnable else []
        if early:
            threads = min(len(early), AHEAD_THREADS, os.cpu_count() or 1)
            entry = {"event": "ahead", "keys": [key_id(key) for key in early],
                     "threads": threads, "pass": pass_name, "t": time.time()}
            append(journal, entry)
            reply(entry)
            try:
                inputs = self._inputs(early[0][0], early[0][2])
                start = time.perf_counter()
                self.ready.update(_compile_ahead(early, inputs, threads))
            except Exception as error:  # noqa: BLE001 - a fresh worker finds whose it is
                failed = {"event": "ahead-failed", "reason": _one_line(error), "t": time.time()}
                append(journal, failed)
                reply(failed)
                return EXIT_AHEAD_FAILED
            append(journal, {"event": "ahead-done", "seconds": time.perf_counter() - start,
                             "pass": pass_name, "t": time.time()})
        reply({"event": "case", "skipped": skipped})
        return None

    def measure(self, command: dict) -> dict:
        """One round of one parameter set: opened (inputs, compile, first call) the first time,
        then warm-up and samples; its first round also records memory and launch cost."""
        key, journal = parse_key(command["key"]), Path(command["journal"])
        tags = {"pass": command.get("pass", "first"), "round": command.get("round", 0)}
        append(journal, {"event": "start", "key": key_id(key), **tags, "t": time.time()})
        phases: dict[str, float] = {}
        try:
            held = self.held.get(key)
            if held is None:
                op, _, case_id, _ = key
                inputs = self._inputs(op, case_id)
                phases["inputs"] = self.inputs_s.pop((op, case_id), 0.0)
                lap = _lapper(phases)
                held = self.held[key] = _open(key, inputs, self.device, self.ready.pop(key, None))
                lap("compile")
            else:
                lap = _lapper(phases)
            record = _sample(held, self.device, lap)
            if not held.rounds:
                record.update(_extras(held, record["samples"], self.device, self.dashboard, lap))
            held.rounds += 1
        except Exception as error:  # noqa: BLE001 - any failure of the kernel is its record
            self.held.pop(key, None)
            event = "skipped" if _launches_no_kernel(error) else "failed"
            entry = {"event": event, "key": key_id(key), "reason": _one_line(error), **tags,
                     "t": time.time()}
            append(journal, entry)
            return entry
        entry = {"event": "done", "key": key_id(key), **tags, "t": time.time(), **record,
                 "phases": phases}
        append(journal, entry)
        return {**entry, "traced": _traced()}

    def release(self, keys: Iterable[Key], case_done: bool = False) -> None:
        """Drop the parameter sets (their executables and device buffers), and the inputs of
        cases no longer held (the case in hand's are kept until `case_done`)."""
        for key in keys:
            self.held.pop(key, None)
            self.ready.pop(key, None)
        if case_done:
            self.current = None
        cases = {(key[0], key[2]) for key in (*self.held, *self.ready)} | {self.current}
        for case in [case for case in self.inputs if case not in cases]:
            del self.inputs[case]
            self.inputs_s.pop(case, None)
        gc.collect()


def _traced() -> bool:
    """Whether this process has recorded a device trace (the device-span clock): CUPTI must
    not be started in it after that, so its later JAX work would be timed by the device span
    (kernels.timing.traced_here; False for an older kernels without it)."""
    from kernels import timing

    return bool(getattr(timing, "traced_here", lambda: False)())


def _start_up(keys: Sequence[Key]) -> tuple[object, dict]:
    """A worker's start: the package configured, the persistent compilation cache on, the
    backends the keys need started; (the device's fingerprint, the "worker" journal line)."""
    spawned = float(os.environ.get("KERNELPERF_SPAWNED_AT", time.time()))
    from kernels import environment

    environment.configure()
    from kernels import fingerprint

    try:
        from kernels import compilation_cache

        compilation_cache.enable()
    except ImportError:  # a commit from before the persistent cache
        pass
    backend_s = _backend_start(keys)
    device = fingerprint.fingerprint()
    return device, {"event": "worker", "pid": os.getpid(),
                    "process_s": time.time() - spawned - backend_s, "backend_s": backend_s,
                    "t": time.time()}


def serve(workers_journal: Path, keys: Sequence[Key], dashboard: bool, ahead: bool,
          commands: Iterable[str], reply: Callable[[dict], None], pass_name: str = "first") -> int:
    """A live worker: started once for one commit, it answers the commands it reads (one JSON
    object a line: "case", "measure", "release", "exit"), each with one reply (a "case" that
    compiles ahead first says "ahead"), and journals as `worker` does; `keys` (every key it
    may be asked) choose the backends started. It keeps every parameter set it measured,
    executable and inputs, until told to release it, so a later round costs warm-up and
    samples only. EXIT_AFTER_FAILURE after a parameter set failed, EXIT_AHEAD_FAILED after
    compiling ahead did (the supervisor starts a fresh one); 0 on "exit" or end of input."""
    _die_with_parent()
    device, ready = _start_up(keys)
    ready["pass"] = pass_name
    append(workers_journal, ready)
    reply(ready)
    state = _Served(device, dashboard,
                    ahead and os.environ.get(AHEAD_VARIABLE, "") != "0")
    for line in commands:
        if not line.strip():
            continue
        command = json.loads(line)
        do = command.get("do")
        if do == "exit":
            return 0
        if do == "case":
            code = state.case(command, reply)
            if code is not None:
                return code
        elif do == "measure":
            record = state.measure(command)
            reply(record)
            if record["event"] == "failed":
                return EXIT_AFTER_FAILURE
        elif do == "release":
            state.release((parse_key(text) for text in command.get("keys", ())),
                          bool(command.get("case_done")))
            reply({"event": "released"})
        else:
            reply({"event": "error", "reason": f"do: expected case, measure, release or exit, "
                                               f"got {do!r}"})
    return 0


def _serve_main(argv: list[str]) -> int:
    """`serve WORKERS_JOURNAL KEYS.json [--dashboard] [--serial] [--pass NAME]`: replies go to
    the standard output this process started with; anything else written there (a library's
    print) goes to the standard error instead."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(entry: dict) -> None:
        replies.write(json.dumps(entry) + "\n")
        replies.flush()

    flags = argv[3:]
    pass_name = flags[flags.index("--pass") + 1] if "--pass" in flags[:-1] else "first"
    keys = [parse_key(text) for text in json.loads(Path(argv[2]).read_text())]
    return serve(Path(argv[1]), keys, "--dashboard" in flags, "--serial" not in flags,
                 sys.stdin, reply, pass_name)


def _main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "serve":
        return _serve_main(argv)
    if len(argv) < 3 or argv[0] != "worker":
        print("usage: measuring.py worker JOURNAL KEYS.json [--dashboard] [--serial]\n"
              "       measuring.py serve WORKERS_JOURNAL KEYS.json [--dashboard] [--serial] "
              "[--pass NAME]", file=sys.stderr)
        return 2
    keys = [parse_key(text) for text in json.loads(Path(argv[2]).read_text())]
    return worker(Path(argv[1]), keys, "--dashboard" in argv[3:], "--serial" not in argv[3:])


def _worker_environment() -> None:
    """The worker shares the GPU with torch in one process: JAX must not take 75% of it."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


if __name__ == "__main__":
    _worker_environment()
    # This folder is no package path: `kernels` must come from the commit under test.
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    sys.exit(_main(sys.argv[1:]))
