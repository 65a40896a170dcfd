"""asv benchmarks, generated from the registry: one class per operation.

Each class is parametrized over (implementation, case, direction), with the
operation's "bench" cases for this platform. Per benchmark:

  time_device       device time, lower is better, the number to gate on.
                    Each asv sample is one device-time sample from the
                    measurement core (CUPTI kernel time on a GPU for every
                    framework, the host clock on CPU, L2 flushed before each:
                    see kernels.core.timing); asv's timer is a clock advanced only
                    by those samples, so asv's own statistics (Mann-Whitney,
                    confidence intervals) apply to device time.

How: the first benchmark process of an operation measures every parameter set of
it in one worker process (perf_tests/measuring.py: backends started once, each
case's inputs made once, samples until the median is pinned, faults contained
per parameter set), journalled; each benchmark process replays its record, so
asv takes exactly the samples the worker took.
  track_peak_memory peak device bytes of the compiled program (XLA's memory
                    analysis: arguments + outputs + temporaries - aliased;
                    kernels.guards.memory), JAX implementations only: a change that
                    doubles memory shows like a slowdown.

Dashboard metrics, defined (so recorded) only when KERNELPERF_DASHBOARD_METRICS=1
(set by `python -m kernels bench`, `make bench` and the CI workflows):

  track_tflops      achieved TFLOP/s           } from one `kernels.core.timing.measure`
  track_gbps        achieved GB/s              } per (implementation, case,
  track_roofline    fraction of the roofline   } direction) per commit,
  track_speedup     over the best baseline     } shared by these four
                    of the kernel's precision  } (docs/precision.md).
  track_launch      host launch cost per call (us): Python, autograd, ctypes,
                    argument checks; pipelined calls, never device time.

asv 0.6 reads a larger number as worse for every benchmark (asv issue 1617)
and has no way to say otherwise, so plain `asv run` / `asv continuous` do not
see the dashboard metrics: a throughput gain must never read as a regression
in asv's own verdict, and host launch times, noisier than device time and
without samples, must not fail its gate. (A plain `asv run` rewrites asv's
benchmark list without them; `python -m kernels bench` keeps its own list,
which the dashboard publishes from: kernels.bench.dashboard.) `python -m kernels compare`
knows which direction is good for each unit. Combinations that cannot run here
(missing GPU, unsupported case, no backward) are skipped (n/a).
"""

from __future__ import annotations

import functools
import itertools
import os
import pathlib
import statistics
import sys
import tempfile

# The flat module names (kernels.registry, ...) on purpose: asv runs this file against the
# `kernels` installed from each benchmarked commit, and every commit of the history has them
# (kernels/__init__.py's MOVED maps them to their homes in the packages).
from kernels import environment

environment.configure()

from kernels import compilation_cache  # noqa: E402

compilation_cache.enable()  # $KERNELPERF_COMPILATION_CACHE=off disables it

from kernels import asv_tools, devices, registry, timing  # noqa: E402

from . import measuring  # noqa: E402

# Without a GPU the default set is one operation, forward, the implementations that run here
# outside Triton's interpreter: Pallas and Triton run interpreted there, and the whole CPU set
# (44 parameter sets x 6 methods) ran past 10 minutes on 2 cores. KERNELPERF_BENCH_FULL=1 runs
# the whole set; a GPU always does.
CPU_QUICK_OPS = ("softmax",)
CPU_QUICK_DIRECTIONS = ("fwd",)
# asv stops sampling at this many seconds; the samples replayed take none (asv's timer is
# DEVICE_CLOCK), so it never cuts a replay short.
NO_TIME_CAP_S = 1e9


# asv's `timer`: advanced only by measured device time.
DEVICE_CLOCK = timing.DeviceClock()


def _wanted(name: str, variable: str) -> bool:
    """Whether `name` contains one of the comma-separated words in $variable (all if unset).

    KERNELPERF_BENCH_IMPLS=pallas,xla, KERNELPERF_BENCH_CASES=32768x4096 and
    KERNELPERF_BENCH_DIRECTIONS=fwd narrow a run (asv's --bench selects classes and
    methods, not parameters).
    """
    words = [w for w in os.environ.get(variable, "").split(",") if w]
    return not words or any(w in name for w in words)


def cpu_quick() -> bool:
    """Whether this run takes the quick CPU set (no GPU here, KERNELPERF_BENCH_FULL unset)."""
    return not environment.nvidia_gpu_present() and os.environ.get("KERNELPERF_BENCH_FULL") != "1"


def _triton_interpreted(impl: registry.Implementation) -> bool:
    """A Triton kernel, which a CPU runs in Triton's interpreter: left out of the quick set
    unless KERNELPERF_BENCH_IMPLS names implementations (gate-power --families triton does), as
    one call of the softmax case takes ~0.2 s there and track_launch alone took 100 s."""
    return "triton" in impl.requires.modules and not os.environ.get("KERNELPERF_BENCH_IMPLS")


# The machine a CPU run has, described without starting JAX (see bench_cases).
_CPU_MACHINE = devices.Machine(platform="cpu", device_kind="cpu",
                               device_count=environment.HOST_DEVICE_COUNT, compute_capability=None)


def bench_cases(op: registry.Operation) -> list[registry.Case]:
    """The operation's "bench" cases for this platform ("gpu" or "cpu" sized); on a GPU
    machine, those some implementation can run on the GPUs there are (a sharded case over more
    devices is not a benchmark there: on one H100 each sharded class cost ~13 s a commit to
    find all its cases skipped)."""
    # Not devices.this_machine(): that starts a JAX backend, which a process asv forks
    # benchmarks from (its forkserver) must not hold.
    platform_tag = "gpu" if environment.nvidia_gpu_present() else "cpu"
    if cpu_quick() and op.name not in CPU_QUICK_OPS:
        return []
    cases = [c for c in registry.bench_cases(op, platform_tag)
             if _wanted(c.id, "KERNELPERF_BENCH_CASES")]
    # An older commit's package has no count (benchmarks run against the base's kernels).
    count = getattr(environment, "nvidia_gpu_count", None)
    gpus = count() if platform_tag == "gpu" and count else None
    if not gpus:
        return cases
    impls = registry.implementations(op.name)
    return [c for c in cases if any(i.devices_for(c) <= gpus for i in impls)]


def _cache_dir() -> pathlib.Path:
    """Where this asv run keeps its measurements: per environment, commit and run.

    asv starts every benchmark in a child of one process per run (its fork
    server or itself), so the parent pid tells runs of the same commit apart.
    """
    root = os.environ.get("ASV_ENV_DIR") or tempfile.gettempdir()
    commit = os.environ.get("ASV_COMMIT", "working-tree")[:12]
    path = pathlib.Path(root) / "kernelperf-measurements" / f"{commit}-{os.getppid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _keys(cls) -> list[measuring.Key]:
    """The parameter sets of a benchmark class, cases grouped (each case's inputs are made
    once); the worker skips those this machine cannot run."""
    impls, cases, directions = cls.params
    return [(cls.op_name, impl, case, d) for case in cases for impl in impls
            for d in directions]


# Set by kernels.bench.recover, which replays the journals of an interrupted run: records
# are then only read from that folder, never measured.
JOURNAL_VARIABLE = "KERNELPERF_JOURNAL_DIR"


@functools.cache
def _records(cls) -> dict:
    """Every runnable parameter set's record for this run, measured by the first benchmark
    process of the class that asks (the others find them in the journal)."""
    replayed = os.environ.get(JOURNAL_VARIABLE)
    if replayed:
        return measuring.final_records(measuring.read_journal(
            pathlib.Path(replayed) / f"{cls.op_name}.jsonl"))
    return measuring.ensure_measured(_keys(cls), _cache_dir() / f"{cls.op_name}.jsonl",
                                     dashboard=recording_dashboard_metrics())


def record(cls, impl_name: str, case_id: str, direction: str) -> dict:
    """This parameter set's record; NotImplementedError (asv: skipped) if it cannot run here,
    RuntimeError (asv: failed) if measuring it failed."""
    return _checked(_records(cls).get((cls.op_name, impl_name, case_id, direction)),
                    cls.op_name, impl_name, case_id, direction)


def _checked(found: dict | None, op: str, impl_name: str, case_id: str, direction: str) -> dict:
    """A done record; NotImplementedError for a skipped one, RuntimeError for a failed or
    missing one."""
    if found is None:
        raise RuntimeError(f"{op}-{impl_name} {case_id} {direction}: not measured")
    if found["event"] == "skipped":
        raise NotImplementedError(found["reason"])
    if found["event"] == "failed":
        raise RuntimeError(f"{op}-{impl_name} {case_id} {direction}: {found['reason']}")
    return found


# Per benchmark process, the samples of its parameter set still to hand to asv: asv runs
# setup() again before every sample, so the position cannot live on the instance.
_REPLAY: dict[tuple, list[float]] = {}
# ... and the record those samples are of (a later round's, where asv runs several).
_ROUNDS: dict[tuple, dict] = {}


def _timing_process() -> bool:
    """Whether asv runs a time_ benchmark in this process: its TimeBenchmark is among setup's
    callers (asv tells a benchmark process nothing else of what it runs)."""
    try:
        from asv_runner.benchmarks.time import TimeBenchmark
    except ImportError:  # called outside asv (tests, kernels.bench.recover)
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), TimeBenchmark):
            return True
        frame = frame.f_back
    return False


def _claim_round(op: str, key: tuple) -> int:
    """Which round of this asv run this time_ process is, for its parameter set: 1, or more
    where asv runs rounds in one process tree (`asv run -a rounds=N` without
    --interleave-rounds), each claiming the next number (a file made exclusively)."""
    folder = _cache_dir() / "rounds"
    folder.mkdir(exist_ok=True)
    for number in itertools.count(1):
        try:
            os.close(os.open(folder / f"{op}-{'-'.join(key)}.{number}",
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return number
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _round_record(cls, number: int, impl_name: str, case_id: str, direction: str) -> dict:
    """Round `number`'s record of a parameter set: round 1's is the run's first measurement;
    a later round's a fresh measurement of the operation (a fresh worker, its own journal),
    so asv's rounds never replay the same samples twice (which would halve the spread its
    statistics see)."""
    if number == 1:
        return record(cls, impl_name, case_id, direction)
    journal = _cache_dir() / f"{cls.op_name}.round{number}.jsonl"
    found = measuring.ensure_measured(_keys(cls), journal, dashboard=recording_dashboard_metrics())
    return _checked(found.get((cls.op_name, impl_name, case_id, direction)), cls.op_name,
                    impl_name, case_id, direction)


def _skip(reason: str) -> None:
    """Skip the running benchmark method (asv: n/a). A NotImplementedError skips only from
    setup(); from the method itself asv_runner wants its SkipNotImplemented."""
    try:
        from asv_runner.benchmarks.mark import SkipNotImplemented
    except ImportError:  # called outside asv (tests)
        raise NotImplementedError(reason) from None
    raise SkipNotImplemented(reason)


def _median(samples) -> float:
    return statistics.median(samples)


class _OperationBenchmarks:
    """Benchmarks of one operation; subclassed per operation below (asv skips "_" names)."""

    op_name = ""
    param_names = ["implementation", "case", "direction"]
    timer = staticmethod(DEVICE_CLOCK.read)
    number = 1  # one device-time sample per asv sample
    repeat = (measuring.GPU_SAMPLING.min_samples, measuring.GPU_SAMPLING.max_samples,
              NO_TIME_CAP_S)  # setup() sets exactly the recorded count
    warmup_time = 0.0  # warm-up happens in the worker, through the measurement core
    rounds = 1
    # The first process of an operation measures all of it; a hung kernel is stopped by the
    # worker's own limit per parameter set (measuring.item_limit), not by this.
    timeout = 3600

    def setup(self, impl_name: str, case_id: str, direction: str) -> None:
        # Registry lookups only: a benchmark process starts no JAX backend and no CUDA context
        # (a second each, a thousand times over); the worker decided what runs here.
        self.impl = registry.implementation(self.op_name, impl_name)
        self.case = registry.operation(self.op_name).case(case_id)
        self.direction = direction
        self.record = record(type(self), impl_name, case_id, direction)
        key = (impl_name, case_id, direction)
        if key not in _REPLAY:  # the first setup of this process (asv repeats it per sample)
            if _timing_process():
                self.record = _ROUNDS[key] = _round_record(
                    type(self), _claim_round(self.op_name, key), *key)
            _REPLAY[key] = list(reversed(self.record["samples"]))
        self.record = _ROUNDS.get(key, self.record)
        count = len(self.record["samples"])
        self.repeat = (count, count, NO_TIME_CAP_S)
        self._replay = _REPLAY[key]

    def time_device(self, *params) -> None:
        DEVICE_CLOCK.advance(self._replay.pop())

    def track_peak_memory(self, *params) -> float:
        """Bytes of the compiled program; NaN for torch (no XLA memory analysis)."""
        peak = self.record.get("peak_bytes")
        return float("nan") if peak is None else float(peak)

    track_peak_memory.unit = "bytes"
    # 2 since 2026-11-26: the bytes of the program timed (for a backward, the pullback applied
    # to its cotangent), no longer of a forward-and-backward program compiled apart for it.
    track_peak_memory.version = "2"


class _DashboardMetrics:
    """The dashboard's metrics, defined only when this run records them
    (asv_tools.DASHBOARD_VARIABLE): asv's verdict would misread the throughputs, and
    every metric asv would only skip still costs a process per parameter set."""

    def _seconds(self) -> float:
        return _median(self.record["samples"])

    def track_tflops(self, *params) -> float:
        work = registry.operation(self.op_name).work(self.case, self.direction)
        return work.flops / self._seconds() / 1e12

    track_tflops.unit = "TFLOP/s"

    def track_gbps(self, *params) -> float:
        work = registry.operation(self.op_name).work(self.case, self.direction)
        return work.bytes / self._seconds() / 1e9

    track_gbps.unit = "GB/s"

    def track_roofline(self, *params) -> float:
        fraction = self.record.get("roofline")
        return float("nan") if fraction is None else fraction

    track_roofline.unit = "fraction of roofline"

    def track_speedup(self, *params) -> float:
        """Best baseline's median time over ours, same case, direction and precision (NaN for
        baselines). A baseline of another precision (cuBLAS's FP32 GEMM beside a TF32 kernel)
        is never divided by; where only such baselines ran, the speedup is skipped, naming
        them with their precision."""
        if self.impl.baseline:
            return float("nan")
        ours = self.record
        platform = "gpu" if environment.nvidia_gpu_present() else "cpu"
        precision = _precision(self.impl, self.case, platform)
        peers, other_precision = {}, []
        for peer in registry.implementations(self.op_name):
            if not peer.baseline:
                continue
            found = _records(type(self)).get((self.op_name, peer.name, self.case.id,
                                              self.direction))
            if found is None or found["event"] != "done":
                continue
            theirs = _precision(peer, self.case, platform)
            if theirs != precision:
                other_precision.append(f"{peer.name} ({theirs})")
                continue
            peers[peer.name] = found
        if not peers:
            if other_precision:
                _skip(f"no speedup: no baseline computed in {precision} "
                      f"({', '.join(other_precision)}: another precision, never divided by)")
            return float("nan")
        other = sorted(name for name, found in peers.items()
                       if found["method"] != ours["method"])
        if other:  # a history point over some baselines only would drift
            _skip(f"no speedup: {', '.join(other)} timed by another clock than "
                  f"{ours['method']}")
        return min(_median(found["samples"]) for found in peers.values()) / self._seconds()

    track_speedup.unit = "x best baseline"

    def track_launch(self, *params) -> float:
        """Host launch cost per call (pipelined calls, not waited for), microseconds."""
        return self.record["launch_us"]

    track_launch.unit = "us per call (host)"


def _precision(impl: registry.Implementation, case: registry.Case, platform: str) -> str:
    """What `impl` computes `case` in on `platform` (FP32, TF32, BF16 ...), as the benchmarked
    commit's kernels declare it; "" for every implementation of a commit from before they
    declared precisions, whose speedups keep the meaning they had (over the best baseline of
    any precision)."""
    precision_of = getattr(registry, "precision_of", None)
    return precision_of(impl, case, platform) if precision_of else ""


def recording_dashboard_metrics() -> bool:
    return os.environ.get(asv_tools.DASHBOARD_VARIABLE, "") not in ("", "0")


# asv's version of every benchmark here (the `version` class attribute _suite gives). asv
# shows a result only under its benchmark's current version, which is otherwise a hash of
# the method's and setup's source: any edit there, a comment included, hid every result
# recorded before it, the shipped GPU results too. Change it only when what the benchmarks
# measure changes meaning; each machine's graph then starts afresh.
BENCHMARK_VERSION = "1"


def _suite(op: registry.Operation) -> type | None:
    cases = bench_cases(op)
    quick = cpu_quick()
    impls = [i for i in registry.implementations(op.name)
             if _wanted(i.name, "KERNELPERF_BENCH_IMPLS")
             and not (quick and (_triton_interpreted(i) or any(
                 devices.case_unavailable_reason(i, c, _CPU_MACHINE) for c in cases)))]
    directions = [d for d in registry.DIRECTIONS if _wanted(d, "KERNELPERF_BENCH_DIRECTIONS")
                  and not (quick and d not in CPU_QUICK_DIRECTIONS)]
    if not cases or not impls or not directions:
        return None
    name = "".join(part.title() for part in op.name.split("_"))
    bases = (_DashboardMetrics, _OperationBenchmarks) if recording_dashboard_metrics() \
        else (_OperationBenchmarks,)
    return type(name, bases, {
        "op_name": op.name,
        "params": [[i.name for i in impls], [c.id for c in cases], directions],
        "__doc__": f"{op.description}: implementations x bench cases x directions.",
        "version": BENCHMARK_VERSION,
    })


for _op in registry.operations():
    _cls = _suite(_op)
    if _cls is not None:
        globals()[_cls.__name__] = _cls
