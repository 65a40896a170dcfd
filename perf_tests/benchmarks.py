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
  track_peak_memory peak device bytes of the compiled program (XLA's memory
                    analysis: arguments + outputs + temporaries - aliased;
                    kernels.guards.memory), JAX implementations only: a change that
                    doubles memory shows like a slowdown.

Dashboard metrics, defined (so recorded) only when KERNELPERF_DASHBOARD_METRICS=1
(set by `python -m kernels bench`, `make bench` and the CI workflows):

  track_tflops      achieved TFLOP/s           } from one `kernels.core.timing.measure`
  track_gbps        achieved GB/s              } per (implementation, case,
  track_roofline    fraction of the roofline   } direction) per commit,
  track_speedup     over the best baseline     } shared by these four.
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
import json
import os
import pathlib
import tempfile

# The flat module names (kernels.registry, ...) on purpose: asv runs this file against the
# `kernels` installed from each benchmarked commit, and every commit of the history has them
# (kernels/__init__.py's MOVED maps them to their homes in the packages).
from kernels import environment

environment.configure()

from kernels import compilation_cache  # noqa: E402

compilation_cache.enable()  # $KERNELPERF_COMPILATION_CACHE=off disables it

from kernels import asv_tools, devices, fingerprint, memory, registry, timing  # noqa: E402
from kernels.roofline import ceilings, model  # noqa: E402

# Device-time samples per asv round: at least, at most, and the wall-time cap (s).
REPEAT = (10, 100, 20.0)
# Without a GPU the default set is one operation, forward, the implementations that run here
# outside Triton's interpreter: each (method, parameters) is a process of its own that starts
# JAX and compiles, Pallas and Triton run interpreted, and the whole CPU set (44 parameter sets
# x 6 methods) ran past 10 minutes on 2 cores. KERNELPERF_BENCH_FULL=1 runs the whole set; a
# GPU always does.
CPU_QUICK_OPS = ("softmax",)
CPU_QUICK_DIRECTIONS = ("fwd",)
# ... and fewer device-time samples: asv prints nothing while a method runs over its
# parameters, so each must take seconds, not REPEAT's 20 s.
CPU_QUICK_REPEAT = (5, 50, 2.0)


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
    """The operation's "bench" cases for this platform ("gpu" or "cpu" sized)."""
    # Not devices.this_machine(): that starts a JAX backend, which a process asv forks
    # benchmarks from (its forkserver) must not hold.
    platform_tag = "gpu" if environment.nvidia_gpu_present() else "cpu"
    if cpu_quick() and op.name not in CPU_QUICK_OPS:
        return []
    return [c for c in registry.bench_cases(op, platform_tag)
            if _wanted(c.id, "KERNELPERF_BENCH_CASES")]


@functools.cache
def _sampler(impl: registry.Implementation, case: registry.Case, direction: str):
    """The warmed-up device-time sampler of one benchmark, made once per process: asv runs
    setup() again before every sample, and inputs, compilation and warm-up (seconds at real
    sizes) must not be paid per sample."""
    timeable = timing.prepare(impl, case, direction=direction)
    sampler, _ = timing.make_sampler(timeable, "cold", fingerprint.fingerprint())
    sampler.take(timing.WARMUP_CALLS)
    return sampler


def _resolve(op_name: str, impl_name: str, case_id: str, direction: str):
    """(impl, case) for a benchmark's parameters; NotImplementedError (asv: skipped) if it
    cannot run here."""
    op = registry.operation(op_name)
    impl = registry.implementation(op_name, impl_name)
    case = op.case(case_id)
    reason = devices.case_unavailable_reason(impl, case)
    if reason is None and not registry.has_direction(impl, direction):
        reason = "no backward"
    if reason:
        raise NotImplementedError(reason)
    return impl, case


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


def measurement(impl: registry.Implementation, case: registry.Case,
                direction: str) -> timing.Measurement:
    """One `timing.measure` per (implementation, case, direction) per asv run."""
    path = _cache_dir() / f"{impl.id}-{case.id}-{direction}.json"
    if path.exists():
        return timing.Measurement.from_dict(json.loads(path.read_text()))
    result = timing.measure(impl, case, direction=direction)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(result.to_dict()))
    os.replace(partial, path)
    return result


def _skip(reason: str) -> None:
    """Skip the running benchmark method (asv: n/a). A NotImplementedError skips only from
    setup(); from the method itself asv_runner wants its SkipNotImplemented."""
    try:
        from asv_runner.benchmarks.mark import SkipNotImplemented
    except ImportError:  # called outside asv (tests)
        raise NotImplementedError(reason) from None
    raise SkipNotImplemented(reason)


def _placement(impl, case, direction, seconds) -> model.Placement:
    sheet, measured = ceilings.for_device(fingerprint.fingerprint())
    chosen = measured or sheet
    return model.place(registry.operation(impl.op).work(case, direction), seconds, chosen,
                       case.dtype, devices=impl.devices_for(case))


class _OperationBenchmarks:
    """Benchmarks of one operation; subclassed per operation below (asv skips "_" names)."""

    op_name = ""
    param_names = ["implementation", "case", "direction"]
    timer = staticmethod(DEVICE_CLOCK.read)
    number = 1  # one device-time sample per asv sample
    repeat = REPEAT
    warmup_time = 0.0  # warm-up happens in setup, through the measurement core
    rounds = 1
    timeout = 1800

    def setup(self, impl_name: str, case_id: str, direction: str) -> None:
        self.impl, self.case = _resolve(self.op_name, impl_name, case_id, direction)
        self.direction = direction

    def time_device(self, *params) -> None:
        DEVICE_CLOCK.advance(_sampler(self.impl, self.case, self.direction).take(1)[0])

    def track_peak_memory(self, *params) -> float:
        """Bytes of the compiled program; NaN for torch (no XLA memory analysis)."""
        if self.impl.framework != "jax":
            return float("nan")
        use = memory.measure(self.impl, self.case, self.direction, live=False)
        return float(use.compiled_peak_bytes)

    track_peak_memory.unit = "bytes"


class _DashboardMetrics:
    """The dashboard's metrics, defined only when this run records them
    (asv_tools.DASHBOARD_VARIABLE):
    asv spawns a process for every benchmark and parameter, so metrics it would only skip
    would still cost a process each, and asv's verdict would misread the throughputs."""

    def _measured(self) -> timing.Measurement:
        return measurement(self.impl, self.case, self.direction)

    def track_tflops(self, *params) -> float:
        work = registry.operation(self.op_name).work(self.case, self.direction)
        return work.flops / self._measured().median_s / 1e12

    track_tflops.unit = "TFLOP/s"

    def track_gbps(self, *params) -> float:
        work = registry.operation(self.op_name).work(self.case, self.direction)
        return work.bytes / self._measured().median_s / 1e9

    track_gbps.unit = "GB/s"

    def track_roofline(self, *params) -> float:
        return _placement(self.impl, self.case, self.direction, self._measured().median_s).fraction

    track_roofline.unit = "fraction of roofline"

    def track_speedup(self, *params) -> float:
        """Best baseline's median time over ours, same case and direction (NaN for baselines)."""
        if self.impl.baseline:
            return float("nan")
        ours = self._measured()
        peers = {}
        for peer in registry.implementations(self.op_name):
            if not peer.baseline:
                continue
            try:
                _resolve(self.op_name, peer.name, self.case.id, self.direction)
            except NotImplementedError:
                continue
            peers[peer.name] = measurement(peer, self.case, self.direction)
        if not peers:
            return float("nan")
        fastest = timing.speedup(ours, peers)
        if fastest.other_clock:  # a history point over some baselines only would drift
            _skip(f"no speedup: {timing.comparable(ours, *peers.values())}")
        return fastest.value

    track_speedup.unit = "x best baseline"

    def track_launch(self, *params) -> float:
        """Host launch cost per call (pipelined calls, not waited for), microseconds."""
        timeable = timing.prepare(self.impl, self.case, direction=self.direction)
        return timing.launch_overhead(timeable).median_s * 1e6

    track_launch.unit = "us per call (host)"



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
        **({"repeat": CPU_QUICK_REPEAT} if quick else {}),
    })


for _op in registry.operations():
    _cls = _suite(_op)
    if _cls is not None:
        globals()[_cls.__name__] = _cls
