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

Journal lines (JSON, one object each), read by `read_journal` and by `kernels.bench`:
  {"event": "worker", "pid", "process_s", "backend_s"}   a worker started and is ready
  {"event": "ahead", "keys", "threads"}                   a case's JAX keys compile ahead
  {"event": "ahead-done", "seconds"}                      ... and are compiled (wall time)
  {"event": "ahead-failed", "reason"}                     ... or one raised: worker exits
  {"event": "start", "key"}                               a parameter set begins
  {"event": "done", "key", "samples", "method", "stop", "throttled", "peak_bytes",
   "launch_us", "roofline", "phases": {"inputs", "compile", "warmup", "sampling", "memory",
   "launch"}}
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


def _measure(key: Key, inputs: tuple, device, dashboard: bool,
             ready: tuple | None = None) -> dict:
    """One parameter set, timed phase by phase; `ready`: its (compiled, jitted) timeables
    when it was compiled ahead (its "compile" phase is then its first call only)."""
    from kernels import registry, timing

    op, impl_name, case_id, direction = key
    impl = registry.implementation(op, impl_name)
    case = registry.operation(op).case(case_id)
    phases = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = now - clock
        clock = now

    timeable, jitted = ready or (None, None)
    if timeable is None:
        timeable = jitted = timing.prepare(impl, case, direction=direction, inputs=inputs)
    sampler, method = timing.make_sampler(timeable, "cold", device)  # its first call compiles
    lap("compile")
    sampler.take(timing.WARMUP_CALLS)
    sampler.reset()
    lap("warmup")
    rule = GPU_SAMPLING if device.platform == "gpu" else CPU_SAMPLING
    samples, stop = collect_samples(sampler.take, rule, getattr(timing, "median_halfwidth", None))
    throttled = sum(sampler.throttled)
    lap("sampling")
    peak = _compiled_peak_bytes(timeable) if impl.framework == "jax" else None
    lap("memory")
    launch = roofline = None
    if dashboard:
        # The jitted function, as users call it: a compiled-ahead executable dispatches
        # through another path.
        launch = _launch_us(timing, jitted)
        roofline = _roofline(impl, case, direction, _median(samples), device)
    lap("launch")
    return {"samples": samples, "method": method, "stop": stop, "throttled": throttled,
            "peak_bytes": peak, "launch_us": launch, "roofline": roofline, "phases": phases}


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
    append(journal, {"event": "worker", "pid": os.getpid(), "process_s": time.time() - spawned
                     - backend_s, "backend_s": backend_s, "t": time.time()})
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


def _main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "worker":
        print("usage: measuring.py worker JOURNAL KEYS.json [--dashboard] [--serial]",
              file=sys.stderr)
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
