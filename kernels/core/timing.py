"""Device-time measurement: one path for every implementation, on GPU and CPU.

`measure(impl, case)` makes the case's inputs, places them for the
implementation, compiles and warms up outside the timed region, then takes
samples until the noise allows a verdict, and returns a `Measurement`.

How a sample is taken (the `method` every result names):

  "cupti"        the default on a GPU, for every framework (JAX, torch, Triton,
                 the ctypes CUDA kernels): kernel time from CUPTI, recorded as
                 `jax.experimental.mosaic.gpu.profiler.measure` does (see
                 `compat.CuptiSession`); a sample is the sum of the durations
                 of the kernels one call launched, and nothing else: not the
                 L2 flush, not the GPU idling while the host launches.
  "cuda-events"  torch / Triton on a GPU, only when asked for
                 (KERNELPERF_TORCH_TIMER=cuda-events) or where CUPTI cannot be
                 had (then with a warning): a CUDA event pair around one call,
                 as `triton.testing.do_bench` does. It also counts the GPU
                 waiting for Python to launch (a 357 us Triton kernel read
                 610 us on an H100, a 2 us one 105 us).
  "device-span"  JAX inputs laid out over several GPUs (and whatever asks for it,
                 such as the one-device runs beside them in
                 kernels.bench.scaling): an in-memory profiler trace
                 (`compat.trace_session_factory`) of many calls, each waited
                 for, gives every kernel, NCCL kernel, memcpy and memset of
                 every device and stream on one timebase; the calls are told
                 apart by the idle gaps between them (`split_calls`), and a
                 sample is the largest per-device span of a call, first start
                 to last end on that device (the span over all devices is kept
                 beside it, `Measurement.all_devices_s`). CUPTI's sum would
                 count overlapped streams and devices twice. Never compared
                 with "cupti": a span includes the gaps between a call's
                 kernels.
  "host-clock"   the CPU, a GPU JAX without CUPTI, or sharded inputs where no
                 device trace can be had (then with a warning): perf_counter
                 around one call that waits for its result. On a GPU this
                 includes dispatch overhead (a 1.8 us kernel read 38.9 us; a
                 2-GPU all-gather about 230 us more than its device span), so
                 it is labelled, never passed off as device time.

Results taken by different methods are not compared (`comparable`): a
speedup or a roofline over mixed clocks would measure the clocks.

Host launch cost per call (Python launchers, autograd, ctypes, argument
checks) is real but is not device time: `launch_overhead` measures it apart,
as the host time to issue a run of calls back to back without waiting.

Regimes: "cold" (default) writes exactly the L2 size (the last-level cache
size on CPU) into a scratch buffer before every sample, outside the timed
span, so the cache does not hold the inputs; "hot" runs calls back to back.

How many samples: as nvbench does, samples are taken in growing batches until
the coefficient of variation is under `max_noise` (0.5%) after at least
`min_samples` samples and `min_time_s` of measured time ("converged"), or the
wall-time budget is spent ("time-budget"), or `max_samples` are taken
("max-samples"). The SM clock is read around every batch; samples taken while
it ran well below its default are flagged as throttled, and kept.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from kernels.core import checking, fingerprint, frameworks, registry

REGIMES = ("cold", "hot")
WARMUP_CALLS = 3
CPU_CACHE_FALLBACK_BYTES = 32 << 20
# The most a CPU flush writes. A VM reports its host's whole last-level cache (480 MiB on the
# project's 2-core VM), and writing that before every sample was most of each CPU timing's
# time (a 4-point `kernels time` took 18 CPU-s, 5 with the cap; 2026-11-26). A real desktop
# or server core's share of its last level is far below it.
CPU_FLUSH_MAX_BYTES = 32 << 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoppingRule:
    """When to stop sampling (nvbench's criteria: noise after a minimum time, or a timeout)."""

    min_samples: int = 20
    min_time_s: float = 0.02  # measured time the samples must add up to before converging
    max_noise: float = 0.005  # coefficient of variation that counts as converged
    time_budget_s: float = 3.0  # wall time, overheads (flushes, dispatch) included
    max_samples: int = 10_000
    max_batch: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError(f"min_samples: expected 1 <= min_samples <= max_samples "
                             f"({self.max_samples}), got {self.min_samples}")
        if self.time_budget_s <= 0 or self.max_noise <= 0:
            raise ValueError(f"time_budget_s and max_noise: expected > 0, got "
                             f"{self.time_budget_s}, {self.max_noise}")


class Sampler(Protocol):
    def take(self, n: int) -> list[float]:
        """n samples of one call's time, in seconds."""


def coefficient_of_variation(samples: Sequence[float]) -> float:
    if len(samples) < 2:
        return float("inf")
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / mean if mean > 0 else float("inf")


# Two-sided 99% normal quantile, and the large-sample standard error of a median in units of
# sigma / sqrt(n) (sqrt(pi / 2): the median of normal samples is that much less efficient
# than their mean).
Z99 = 2.5758
MEDIAN_SE_FACTOR = 1.2533


def robust_cv(samples: Sequence[float]) -> float:
    """Spread of `samples` relative to their median, as a standard deviation estimated from the
    median absolute deviation (1.4826 MAD): a few outliers (an interrupt, a clock step) do not
    widen it as they widen the plain coefficient of variation. inf for fewer than 2 samples."""
    if len(samples) < 2:
        return float("inf")
    middle = statistics.median(samples)
    if middle <= 0:
        return float("inf")
    mad = statistics.median(abs(s - middle) for s in samples)
    return 1.4826 * mad / middle


def median_halfwidth(samples: Sequence[float], z: float = Z99) -> float:
    """Half-width of the confidence interval of the samples' median, relative to it: z times
    the median's standard error (normal approximation, spread from `robust_cv`). The
    benchmarks sample until this is well inside the smallest change the gate must see."""
    return z * MEDIAN_SE_FACTOR * robust_cv(samples) / math.sqrt(len(samples)) \
        if len(samples) >= 2 else float("inf")


def collect(sampler: Sampler, rule: StoppingRule,
            clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], str]:
    """Samples from `sampler` until `rule` says stop; (samples, stop reason)."""
    samples: list[float] = []
    start = clock()
    batch = rule.min_samples
    while True:
        samples += sampler.take(min(batch, rule.max_samples - len(samples)))
        if (len(samples) >= rule.min_samples and sum(samples) >= rule.min_time_s
                and coefficient_of_variation(samples) <= rule.max_noise):
            return samples, "converged"
        if clock() - start >= rule.time_budget_s:
            return samples, "time-budget"
        if len(samples) >= rule.max_samples:
            return samples, "max-samples"
        batch = min(rule.max_batch, len(samples))  # double the count each round


@dataclasses.dataclass(frozen=True)
class Measurement:
    """The timing of one (implementation, case, direction): statistics, samples, how and where."""

    label: str  # e.g. "softmax-xla f32-4096x4096 fwd"
    median_s: float
    min_s: float
    max_s: float
    cv: float  # coefficient of variation of the samples
    repeats: int
    samples: tuple[float, ...]
    method: str  # "cupti", "device-span", "cuda-events" or "host-clock"
    regime: str  # "cold" or "hot"
    stop_reason: str  # "converged", "time-budget" or "max-samples"
    sm_clock_mhz: tuple[int | None, ...]  # per sample: the lower of the reads around its batch
    throttled: tuple[bool, ...]  # per sample
    fingerprint: dict[str, Any]
    # "device-span" only, per sample: the call's span over all its devices (first start on
    # any device to last end on any), beside the largest per-device span that is the sample.
    all_devices_s: tuple[float, ...] = ()
    # What the timed call's matrix products computed in (kernels.core.precisions: "FP32",
    # "TF32", "BF16" ...); "" where not known (a record from before it was kept, a call
    # that is no implementation). Ratios compare equal precisions only (`speedup`).
    precision: str = ""

    @classmethod
    def from_samples(cls, samples: Sequence[float], *, clocks: Sequence[int | None] = (),
                     throttled: Sequence[bool] = (), **fields: Any) -> Measurement:
        if not samples:
            raise ValueError("samples: expected at least one, got none")
        return cls(median_s=statistics.median(samples), min_s=min(samples), max_s=max(samples),
                   cv=coefficient_of_variation(samples), repeats=len(samples),
                   samples=tuple(float(s) for s in samples),
                   sm_clock_mhz=tuple(clocks) or (None,) * len(samples),
                   throttled=tuple(throttled) or (False,) * len(samples), **fields)

    @property
    def throttled_count(self) -> int:
        return sum(self.throttled)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not np.isfinite(out["cv"]):
            out["cv"] = None  # JSON has no infinity
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        data = dict(data)
        data["cv"] = float("inf") if data["cv"] is None else data["cv"]
        for key in ("samples", "sm_clock_mhz", "throttled", "all_devices_s"):
            if key in data:  # records written before all_devices_s existed lack it
                data[key] = tuple(data[key])
        return cls(**data)


class DeviceClock:
    """A clock that advances only by device-time samples, for harnesses that read their own
    timer (asv's `timer`, pytest-benchmark's): `advance(s)` moves it by one sample;
    `load(samples)` queues a measurement's samples and each `step()` (one round of
    pytest-benchmark's `pedantic`) advances it by the next, so the round's duration, timer()
    after minus before, is exactly that sample.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._pending: list[float] = []

    def read(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def load(self, samples: Sequence[float]) -> None:
        self.now = 0.0  # small values keep (now + s) - now exact to ~1e-16 s
        self._pending = list(reversed(samples))

    def step(self) -> None:
        if not self._pending:
            raise RuntimeError("DeviceClock: no device samples left; pedantic ran more rounds "
                               "than the measurement has samples")
        self.now += self._pending.pop()

    @property
    def pending(self) -> int:
        return len(self._pending)


@dataclasses.dataclass(frozen=True)
class Timeable:
    """What to time: `fn(*args)` in `framework` ("jax" or "torch"), and whether on a GPU."""

    label: str
    framework: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    on_gpu: bool
    # Devices the work runs over (a sharded case's mesh size): also where its arguments do
    # not show it (inputs on one device, laid out over the mesh inside the call).
    devices: int = 1
    # The implementation's precision on this case here (Implementation.precision_on).
    precision: str = ""


def _cotangent(out_shape: Sequence[int], dtype: Any, seed: int) -> np.ndarray:
    from kernels.core import dtypes

    return _seeded_normal(tuple(out_shape), dtypes.short_name(dtype), seed + 1_000_003)


@functools.lru_cache(maxsize=2)
def _seeded_normal(shape: tuple[int, ...], dtype_name: str, seed: int) -> np.ndarray:
    """Standard normal values of `shape` in `dtype_name`, read-only (callers copy them onto
    their device). Kept for the next call: every implementation of a case takes the same
    cotangent, and drawing a 32768 x 4096 one took ~2 s a backward (2026-11-26, H100 host).
    Drawn in float32 unless float64 is asked for, at half the cost."""
    from kernels.core import dtypes

    draw = np.float64 if dtype_name == "f64" else np.float32
    values = np.random.default_rng(seed).standard_normal(shape, dtype=draw)
    values = values.astype(dtypes.to_numpy(dtype_name), copy=False)
    values.setflags(write=False)
    return values


def prepare(impl: registry.Implementation, case: registry.Case, *, direction: str = "fwd",
            seed: int = 0, inputs: tuple[np.ndarray, ...] | None = None) -> Timeable:
    """Inputs made and placed for `impl`; for "bwd", the forward run once and its VJP to time.

    The backward times only the pullback (jax.vjp's function / torch.autograd.grad
    over a retained graph) with a random cotangent, not the forward again.
    `inputs` (numpy, from `checking.make_inputs`) saves remaking large ones.
    """
    registry.check_direction(direction)
    op = registry.operation(impl.op)
    if not registry.has_direction(impl, direction):
        raise ValueError(f"direction: {impl.id} has no backward; expected 'fwd', got 'bwd'")
    fw = frameworks.framework(impl.framework)
    if inputs is None:
        inputs = checking.make_inputs(op, case, seed, "normal")
    args = impl.place(case, fw.from_numpy(inputs))
    kwargs = case.kwargs
    label = f"{impl.id} {case.id} {direction}"
    if impl.framework == "jax":
        import jax

        from kernels.core import compat

        forward = functools.partial(impl.fn, **kwargs)
        devices = impl.devices_for(case)
        on_gpu = compat.on_gpu()
        precision = impl.precision_on(case, "gpu" if on_gpu else "cpu")
        if direction == "fwd":
            return Timeable(label, "jax", _jit(forward), args, on_gpu, devices, precision)
        out, pullback = jax.vjp(forward, *args)
        cotangent = jax.numpy.asarray(_cotangent(out.shape, out.dtype, seed))
        return Timeable(label, "jax", _jit(_apply), (pullback, cotangent), on_gpu, devices,
                        precision)

    import torch

    on_gpu = torch.cuda.is_available()
    precision = impl.precision_on(case, "gpu" if on_gpu else "cpu")
    if direction == "fwd":
        return Timeable(label, "torch", functools.partial(impl.fn, **kwargs), args, on_gpu,
                        precision=precision)
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = impl.fn(*leaves, **kwargs)
    cotangent = frameworks.numpy_to_torch(_cotangent(out.shape, out.dtype, seed), out.device.type)
    wrt = [leaf for leaf in leaves if leaf.requires_grad]
    backward = functools.partial(torch.autograd.grad, out, wrt, cotangent, retain_graph=True)
    return Timeable(label, "torch", backward, (), on_gpu, precision=precision)


def _apply(pullback, cotangent):
    return pullback(cotangent)


def _jit(fn):
    import jax

    return fn if hasattr(fn, "lower") else jax.jit(fn)


def callable_timeable(label: str, fn: Callable[..., Any], framework: str,
                      args: tuple[Any, ...] = ()) -> Timeable:
    """`fn(*args)` in torch or JAX as a Timeable (ceilings use it). JAX arrays must come as
    `args`, never closed over: a jitted closure embeds them as constants, and XLA folds
    what it can (the negation of a captured array of ones became a write-only fill that
    read as twice the copy bandwidth)."""
    if framework == "torch":
        import torch

        return Timeable(label, "torch", fn, args, torch.cuda.is_available())
    from kernels.core import compat

    return Timeable(label, "jax", _jit(fn), args, compat.on_gpu())


def l2_bytes(device: fingerprint.Fingerprint) -> int:
    """Bytes a cold-regime flush writes: the GPU's L2, or the CPU's largest cache (at most
    CPU_FLUSH_MAX_BYTES)."""
    if device.platform == "gpu":
        if not device.l2_bytes:
            raise RuntimeError(f"cannot flush L2 on {device.name}: its L2 size is unknown "
                               f"(needs torch to read it); use regime='hot'")
        return device.l2_bytes
    sizes = []
    for index in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as size_file:
                text = size_file.read().strip()
        except OSError:
            break
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return min(max(sizes, default=CPU_CACHE_FALLBACK_BYTES), CPU_FLUSH_MAX_BYTES)


class _ClockedSampler:
    """Wraps a sampler: reads the SM clock around each batch and flags throttled samples."""

    def __init__(self, inner: Sampler, device: fingerprint.Fingerprint):
        self.inner, self.device = inner, device
        self.clocks: list[int | None] = []
        self.throttled: list[bool] = []
        self.first_clocks = self.last_clocks = None

    def take(self, n: int) -> list[float]:
        before = fingerprint.read_clocks()
        samples = self.inner.take(n)
        after = fingerprint.read_clocks()
        self.first_clocks = self.first_clocks or before
        self.last_clocks = after
        reads = [c.sm_mhz for c in (before, after) if c is not None and c.sm_mhz is not None]
        low = min(reads) if reads else None
        self.clocks += [low] * len(samples)
        self.throttled += [self.device.is_throttled(fingerprint.Clocks(sm_mhz=low))] * len(samples)
        return samples

    def reset(self) -> None:
        self.clocks, self.throttled = [], []
        self.first_clocks = self.last_clocks = None
        if hasattr(self.inner, "reset"):
            self.inner.reset()


class _HostSampler:
    """perf_counter around one call that waits for the result."""

    def __init__(self, call: Callable[[], Any], flush: Callable[[], Any] | None):
        self.call, self.flush = call, flush

    def take(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            if self.flush:
                self.flush()
            start = time.perf_counter()
            self.call()
            out.append(time.perf_counter() - start)
        return out


class _CudaEventSampler:
    """CUDA events around each call on the current stream; the flush sits before the start event."""

    def __init__(self, call: Callable[[], Any], flush: Callable[[], Any] | None):
        self.call, self.flush = call, flush

    def take(self, n: int) -> list[float]:
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for start, end in zip(starts, ends, strict=True):
            if self.flush:
                self.flush()
            start.record()
            self.call()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e-3 for start, end in zip(starts, ends, strict=True)]


class NoKernel(RuntimeError):
    """The timed call launched no kernel (a view, a host-only call): nothing on the device to
    time. The benchmarks record such a parameter set as skipped, not failed."""


class _CuptiSampler:
    """Kernel time from CUPTI: per call, the sum of the durations of the kernels it launched.

    Every sample is recorded in a session of its own, so a call may launch a
    different number of kernels each time (autograd, XLA autotuning left
    over) and torch's autograd worker thread is recorded like any other. In
    the cold regime the flush is dispatched inside the session right before
    the call, with no wait between them (as `triton.testing.do_bench` and the
    profilers run them: a pause there lets the L2 write back the flush's dirty
    lines, which changes what a kernel of a few microseconds meets); its kernels, learned by
    recording the flush alone, come first and are left out of the sum.

    call: runs the timed code once; flush: writes the L2 (or None, hot), without
    waiting; wait(last): blocks until the last dispatched work is done.
    """

    def __init__(self, call: Callable[[], Any], flush: Callable[[], Any] | None,
                 wait: Callable[[Any], Any], session, label: str = "call"):
        self.call, self.flush, self.wait, self.session = call, flush, wait, session
        self.label = label
        # Compile (and let XLA autotune, which launches kernels of its own) before any recording.
        wait(call())
        self.flush_names: list[str] = []
        if flush is not None:
            wait(flush())
            self.flush_names = [name for name, _ in self._record(flush_only=True)]
            if not self.flush_names:
                raise RuntimeError("CUPTI recorded no kernel for the L2 flush")

    def _record(self, flush_only: bool = False) -> list[tuple[str, float]]:
        self.session.start()
        try:
            last = self.flush() if self.flush is not None else None
            if not flush_only:
                last = self.call()
            self.wait(last)
        finally:
            kernels = self.session.stop()
        return kernels

    def take(self, n: int) -> list[float]:
        samples = []
        skip = len(self.flush_names)
        for _ in range(n):
            kernels = self._record()
            if [name for name, _ in kernels[:skip]] != self.flush_names:
                raise RuntimeError(f"CUPTI: expected the call to follow the flush's kernels "
                                   f"{self.flush_names}, got {[name for name, _ in kernels]}")
            if len(kernels) == skip:
                raise NoKernel(
                    f"CUPTI recorded no kernel for {self.label}: it launches none (a "
                    f"device-to-device memcpy or a host-only call is no kernel to CUPTI); time "
                    f"it with KERNELPERF_TORCH_TIMER=cuda-events or on the host clock")
            samples.append(sum(ms for _, ms in kernels[skip:]) * 1e-3)
        return samples


# -- the device clock for work over several devices -------------------------------------------

# Idle time between two calls the splitter accepts as a boundary. Between synchronous calls
# the devices idle while the host waits for the result and dispatches the next call (at least
# 40 us for a 2-GPU program on an H100 pair, /tmp/notes/sharded.md); gaps inside one call
# (kernel after kernel on a stream, a collective waiting for its peer) are the devices' own.
MIN_CALL_GAP_NS = 2_000.0
# The host pauses before each dispatch inside a trace, so that every boundary between calls is
# an idle gap longer than any inside a call: with no pause, a 2-GPU program's intra-call gaps
# (one device's launch behind the other's, a flush dispatched per device) matched the gaps
# between calls on an H100 x4 host and one cut in five landed inside a call. The pause is
# PAUSE_PER_GAP times the widest gap inside one probed call, clamped to [PAUSE_MIN_S,
# PAUSE_MAX_S]; a trace that still cannot be cut is recorded again with the pause doubled,
# SPLIT_RETRIES times, before the error is raised.
PAUSE_MIN_S = 100e-6
PAUSE_MAX_S = 20e-3
PAUSE_PER_GAP = 4.0
PAUSE_PROBE_S = 2e-3  # while the probed call is recorded
SPLIT_RETRIES = 2
# Profiler lines that carry device activity: one "Stream #N(...)" line per CUDA stream
# (compute, collectives, copies). Other lines of a device plane ("XLA Ops", "XLA Modules")
# repeat the same kernels grouped by HLO op and must not be counted twice.
DEVICE_PLANE_PREFIX = "/device:GPU:"
STREAM_LINE_PREFIX = "Stream"


class TraceSplitError(RuntimeError):
    """A device trace that cannot be cut into the calls that were made: the calls were not
    separated by idle gaps, or events went missing or were added between calls."""


class DeviceTraceUnavailable(RuntimeError):
    """No device activity was recorded: no GPU, no profiler, or another CUPTI user."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceEvent:
    """One activity on a device stream in a profiler trace: a kernel, an NCCL kernel, a memcpy
    or a memset, with its start and end on the trace's one timebase (nanoseconds)."""

    device: str  # "GPU:0"
    stream: str  # the profiler line, "Stream #13(Compute)"
    name: str
    start_ns: float
    end_ns: float

    def __post_init__(self) -> None:
        if not self.end_ns >= self.start_ns:
            raise ValueError(f"end_ns: expected >= start_ns ({self.start_ns}), got "
                             f"{self.end_ns} ({self.name} on {self.device})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CallSpan:
    """The device events of one call, and its spans: per device, first start to last end on
    that device (what the device was busy with the call, gaps between kernels included), and
    over all devices (first start anywhere to last end anywhere: launch skew included)."""

    events: tuple[DeviceEvent, ...]

    def __post_init__(self) -> None:
        if not self.events:
            raise ValueError("events: expected at least one device event per call, got none")

    @property
    def per_device_s(self) -> dict[str, float]:
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        for event in self.events:
            first[event.device] = min(first.get(event.device, math.inf), event.start_ns)
            last[event.device] = max(last.get(event.device, -math.inf), event.end_ns)
        return {device: (last[device] - first[device]) * 1e-9 for device in sorted(first)}

    @property
    def largest_s(self) -> float:
        """The call's time: its largest per-device span."""
        return max(self.per_device_s.values())

    @property
    def all_devices_s(self) -> float:
        return (max(e.end_ns for e in self.events) - min(e.start_ns for e in self.events)) * 1e-9

    def named(self, *fragments: str, device: str | None = None) -> list[DeviceEvent]:
        """Events whose name contains any of `fragments` (on `device`, if given), in time order."""
        return [e for e in self.events if any(f in e.name for f in fragments)
                and (device is None or e.device == device)]


def device_events(profile_data: Any) -> list[DeviceEvent]:
    """Every event on the stream lines of the GPU planes of a `jax.profiler.ProfileData`
    (planes > lines > events, from a trace file or an in-memory session); [] where the trace
    has no GPU plane (a CPU run)."""
    events = []
    for plane in profile_data.planes:
        if not plane.name.startswith(DEVICE_PLANE_PREFIX):
            continue
        device = plane.name.removeprefix("/device:")
        for line in plane.lines:
            if not line.name.startswith(STREAM_LINE_PREFIX):
                continue
            events += [DeviceEvent(device=device, stream=line.name, name=event.name,
                                   start_ns=float(event.start_ns), end_ns=float(event.end_ns))
                       for event in line.events]
    return events


def _idle_gaps(ordered: Sequence[DeviceEvent]) -> list[tuple[float, int]]:
    """(idle gap before it, index) of each event but the first, `ordered` by start: its start
    minus the latest end of every earlier event, on any device and stream."""
    gaps = []
    latest_end = -math.inf
    for index, event in enumerate(ordered):
        if index:
            gaps.append((event.start_ns - latest_end, index))
        latest_end = max(latest_end, event.end_ns)
    return gaps


def widest_gap_s(span: CallSpan) -> float:
    """The longest idle time inside one call (every device idle), in seconds; 0 for none."""
    ordered = sorted(span.events, key=lambda e: (e.start_ns, e.end_ns))
    return max((gap for gap, _ in _idle_gaps(ordered)), default=0.0) * 1e-9


def split_calls(events: Sequence[DeviceEvent], calls: int, *, period: int = 1,
                min_gap_ns: float = MIN_CALL_GAP_NS) -> list[CallSpan]:
    """Cut the device events of `calls` consecutive, synchronous calls into one CallSpan each.

    Algorithm: sort the events by start; each event's idle gap is its start minus the latest
    end of every earlier event, on any device and stream (so an event that overlaps earlier
    work has none); the calls - 1 largest gaps are the boundaries. Refused (TraceSplitError)
    when fewer events than calls were recorded, when a boundary's gap is under `min_gap_ns`
    (calls that overlapped or ran back to back cannot be told apart), or when the calls
    recorded different numbers of events: a boundary in the wrong place (an idle gap inside
    a call larger than one between calls) always shows as uneven counts.

    period: the calls alternate between `period` kinds (the timing loop's L2 flush, then the
    timed call: period 2); counts are compared among calls of the same kind only.
    """
    if calls < 1:
        raise ValueError(f"calls: expected >= 1, got {calls}")
    if period < 1 or calls % period:
        raise ValueError(f"period: expected >= 1 and dividing calls ({calls}), got {period}")
    ordered = sorted(events, key=lambda e: (e.start_ns, e.end_ns))
    if len(ordered) < calls:
        raise TraceSplitError(f"device trace: expected at least one event per call, {calls} "
                              f"calls, got {len(ordered)} events")
    gaps = _idle_gaps(ordered)
    cuts = sorted(index for _, index in sorted(gaps, reverse=True)[:calls - 1])
    if cuts:
        boundaries = set(cuts)
        narrowest = min(gap for gap, index in gaps if index in boundaries)
        if narrowest < min_gap_ns:
            raise TraceSplitError(
                f"device trace: expected {calls} calls separated by idle gaps of at least "
                f"{min_gap_ns:.0f} ns, got a boundary gap of {narrowest:.0f} ns: the calls "
                f"overlapped or ran back to back (was each one waited for?)")
    bounds = [0, *cuts, len(ordered)]
    groups = [tuple(ordered[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    for phase in range(period):
        counts = [len(group) for group in groups[phase::period]]
        if len(set(counts)) > 1:
            kind = f" of kind {phase + 1} of {period}" if period > 1 else ""
            raise TraceSplitError(
                f"device trace: expected every call{kind} to record the same number of device "
                f"events, got {counts}: an idle gap inside a call outlasted one between "
                f"calls, or the profiler dropped events")
    return [CallSpan(events=group) for group in groups]


# Whether this process has started a profiler session (the device-span clock). Mosaic's CUPTI
# timer, started after one, aborts the process ("activity records were dropped", seen in the
# measuring workers of a 4-GPU host): from then on make_sampler times JAX work by the device
# span and torch work by CUDA events, and the ceilings are measured by a fresh process.
_TRACED = False


def traced_here() -> bool:
    """Whether a device trace was recorded in this process (so CUPTI timing must not be)."""
    return _TRACED


class _DeviceSpanSampler:
    """Device time per call from an in-memory profiler trace (method "device-span").

    One profiler session per `take(n)` (starting one costs 19-33 ms and stopping 7-10 ms on
    an H100 pair, so many calls share it); inside it each call is dispatched after a host
    pause and waited for, which leaves the idle gap `split_calls` cuts at. The pause is set
    from one probed call (PAUSE_PER_GAP times its widest inner gap) and doubled when a trace
    cannot be cut anyway (SPLIT_RETRIES). In the cold regime each call follows
    an L2 flush of every device it runs on, waited for too, so the flush is a call of its own
    in the trace and is left out. A sample is the call's largest per-device span; the span
    over all devices is kept in `all_devices`.

    call: runs the timed code once; flush: writes every device's L2 (or None, hot);
    wait(result): blocks until it is done; start_session(): a started session whose
    `stop()` returns ProfileData; sleep(seconds): the host pause (time.sleep).
    """

    def __init__(self, call: Callable[[], Any], flush: Callable[[], Any] | None,
                 wait: Callable[[Any], Any], start_session: Callable[[], Any],
                 label: str = "call", sleep: Callable[[float], Any] = time.sleep):
        self.call, self.flush, self.wait = call, flush, wait
        self.start_session, self.label, self.sleep = start_session, label, sleep
        self.all_devices: list[float] = []
        self.last_spans: list[CallSpan] = []
        # Compile (and let XLA autotune) before anything is recorded, then check that the
        # trace holds device activity at all and find how long the pause must be.
        wait(call())
        if flush is not None:
            wait(flush())
        self.pause_s = PAUSE_PROBE_S
        probe = self._record_once(1, keep_flushes=True)
        widest = max(widest_gap_s(span) for span in probe)
        self.pause_s = min(PAUSE_MAX_S, max(PAUSE_MIN_S, PAUSE_PER_GAP * widest))

    def _record_once(self, n: int, keep_flushes: bool = False) -> list[CallSpan]:
        global _TRACED
        try:
            session = self.start_session()
        except Exception as error:  # another profiler session, a tracer that cannot start
            raise DeviceTraceUnavailable(f"cannot start a profiler session: {error}") from error
        _TRACED = True
        try:
            for _ in range(n):
                if self.flush is not None:
                    self.sleep(self.pause_s)
                    self.wait(self.flush())
                self.sleep(self.pause_s)
                self.wait(self.call())
        finally:
            profile = session.stop()
        events = device_events(profile)
        if not events:
            raise DeviceTraceUnavailable(
                f"the profiler recorded no GPU activity for {self.label} (no GPU, or another "
                f"CUPTI user holds the GPUs' activity records: Nsight Systems or Compute, or "
                f"the Mosaic CUPTI timer left attached in this process)")
        period = 1 if self.flush is None else 2
        spans = split_calls(events, n * period, period=period)
        return spans if keep_flushes else spans[period - 1::period]

    def record(self, n: int) -> list[CallSpan]:
        """n calls in one session: their CallSpans (flushes left out). A trace that cannot be
        cut is recorded again with a doubled pause, up to SPLIT_RETRIES times."""
        retries = 0
        while True:
            try:
                return self._record_once(n)
            except TraceSplitError:
                if retries == SPLIT_RETRIES:
                    raise
                retries += 1
                self.pause_s = min(PAUSE_MAX_S, 2 * self.pause_s)

    def take(self, n: int) -> list[float]:
        spans = self.record(n)
        self.last_spans = spans
        self.all_devices += [span.all_devices_s for span in spans]
        return [span.largest_s for span in spans]

    def reset(self) -> None:
        self.all_devices, self.last_spans = [], []


# torch / Triton / ctypes CUDA on a GPU: "cupti" (the default, the clock JAX is timed by) or
# "cuda-events" (asked for; also counts the GPU idling while the host launches, which
# dominates kernels of a few microseconds: a 256x1024 softmax, 2.6 us by CUPTI, 18-105 us
# by events).
TORCH_TIMER_VARIABLE = "KERNELPERF_TORCH_TIMER"
TORCH_TIMERS = ("cupti", "cuda-events")


def torch_timer() -> str:
    """The method asked for torch-side implementations on a GPU (KERNELPERF_TORCH_TIMER)."""
    choice = os.environ.get(TORCH_TIMER_VARIABLE, "") or "cupti"
    if choice not in TORCH_TIMERS:
        raise ValueError(f"{TORCH_TIMER_VARIABLE}: expected one of {TORCH_TIMERS}, got "
                         f"{choice!r}")
    return choice


def _say(message: str) -> None:
    """A clock fallback, said loudly: as a RuntimeWarning (pointing where the fallback's
    warn_* function is called from) and on stderr, so that no warning filter or captured run
    hides that the numbers are not device time."""
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    print(message, file=sys.stderr, flush=True)


@functools.cache
def _warn_no_cupti(framework: str, fallback: str) -> None:
    """Once per process and framework: loud, since the numbers are then not device time."""
    message = (f"kernelperf: CUPTI is not available here (it comes with jax's CUDA plugin, "
               f"through its Mosaic GPU extension): {framework} is timed by {fallback}, "
               f"which counts launch gaps; such results say method={fallback!r} and are not "
               f"compared with CUPTI ones")
    _say(message)


def devices_of(args: Any, at_least: int = 1) -> list[Any]:
    """The devices the JAX arrays in `args` live on, in id order (JAX's default device where
    `args` hold no array: work on closed-over data); the first `at_least` devices where the
    arrays live on fewer (work that lays its inputs out over a mesh of them itself)."""
    import jax

    found = {device for leaf in jax.tree.leaves(args) if isinstance(leaf, jax.Array)
             for device in leaf.sharding.device_set}
    if len(found) < at_least:
        return jax.devices()[:at_least]
    return sorted(found, key=lambda device: device.id) or jax.devices()[:1]


def spans_devices(args: Any) -> bool:
    """Whether any JAX array in `args` is laid out over several devices. CUPTI sums kernel
    durations over every device and stream, counting overlapped transfers and products
    twice, so such calls are timed by their device span ("device-span")."""
    import jax

    return any(len(leaf.sharding.device_set) > 1 for leaf in jax.tree.leaves(args)
               if isinstance(leaf, jax.Array))


@functools.cache
def _warn_traced(framework: str, fallback: str) -> None:
    """Once per process: CUPTI is off limits after a device trace (it would abort)."""
    message = (f"kernelperf: this process recorded a device trace, after which Mosaic's CUPTI "
               f"timer aborts it: {framework} is timed by {fallback}; such results say "
               f"method={fallback!r} and are not compared with CUPTI ones")
    _say(message)


@functools.cache
def _warn_no_trace(reason: str) -> None:
    """Once per process and reason: loud, since the numbers are then not device time."""
    message = (f"kernelperf: no device trace ({reason}): work over several devices is timed "
               f"by the host clock, which counts dispatch; such results say "
               f"method='host-clock' and are not compared with 'device-span' ones")
    _say(message)


CLOCKS = ("auto", "device-span")


def _device_span_sampler(timeable: Timeable, flush_bytes: int | None) -> _DeviceSpanSampler | None:
    """The device-span sampler for a JAX timeable, or None (with a warning, once) where no
    device trace can be had on this GPU."""
    import jax

    from kernels.core import compat

    start_session = compat.trace_session_factory()
    if start_session is None:
        _warn_no_trace("this jaxlib has no in-memory profiler session")
        return None
    call = functools.partial(timeable.fn, *timeable.args)
    flush = jax_flush_devices(flush_bytes, devices_of(timeable.args, timeable.devices)) \
        if flush_bytes else None
    try:
        return _DeviceSpanSampler(call, flush, jax.block_until_ready, start_session,
                                  timeable.label)
    except DeviceTraceUnavailable as error:
        _warn_no_trace(str(error))
        return None


def make_sampler(timeable: Timeable, regime: str, device: fingerprint.Fingerprint, *,
                 clock: str = "auto") -> tuple[_ClockedSampler, str]:
    """A sampler for `timeable` in `regime`, and the method it measures by.

    clock: "auto" picks by the work (see the module docstring); "device-span" asks for the
    device clock of several devices for any JAX work on a GPU, a single device's included,
    so that a one-device run and a mesh run are timed alike (kernels.bench.scaling). Where
    there is no device trace (a CPU) either falls back to the labelled host clock.
    """
    if regime not in REGIMES:
        raise ValueError(f"regime: expected one of {REGIMES}, got {regime!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock: expected one of {CLOCKS}, got {clock!r}")
    flush_bytes = l2_bytes(device) if regime == "cold" else None
    call = functools.partial(timeable.fn, *timeable.args)
    if timeable.framework == "jax":
        import jax

        from kernels.core import compat

        # After a device trace in this process, Mosaic's CUPTI timer would abort it: single-
        # device work is then timed by the device span too.
        if timeable.on_gpu and (clock == "device-span" or timeable.devices > 1 or _TRACED
                                or spans_devices(timeable.args)):
            spanned = _device_span_sampler(timeable, flush_bytes)
            if spanned is not None:
                return _ClockedSampler(spanned, device), "device-span"
            flush = jax_flush_devices(flush_bytes, devices_of(timeable.args, timeable.devices)) \
                if flush_bytes else None
            inner = _HostSampler(lambda: jax.block_until_ready(call()), flush)
            return _ClockedSampler(inner, device), "host-clock"
        session = None
        if timeable.on_gpu:
            session = compat.cupti_session()
            if session is None:
                _warn_no_cupti("jax", "host-clock")
        if session is not None:
            flush = jax_flush(flush_bytes, wait=False) if flush_bytes else None
            inner = _CuptiSampler(call, flush, jax.block_until_ready, session, timeable.label)
            return _ClockedSampler(inner, device), "cupti"
        flush = ((jax_flush(flush_bytes) if timeable.on_gpu else jax_host_flush(flush_bytes))
                 if flush_bytes else None)
        inner = _HostSampler(lambda: jax.block_until_ready(call()), flush)
        return _ClockedSampler(inner, device), "host-clock"
    if timeable.framework == "torch" and timeable.on_gpu:
        import torch

        from kernels.core import compat

        flush = torch_flush(flush_bytes) if flush_bytes else None
        cupti = torch_timer() == "cupti"
        session = compat.cupti_session() if cupti and not _TRACED else None
        if cupti and _TRACED:
            _warn_traced("torch", "cuda-events")
        elif cupti and session is None:
            _warn_no_cupti("torch", "cuda-events")
        if session is not None:
            inner = _CuptiSampler(call, flush, lambda _: torch.cuda.synchronize(), session,
                                  timeable.label)
            return _ClockedSampler(inner, device), "cupti"
        return _ClockedSampler(_CudaEventSampler(call, flush), device), "cuda-events"
    flush = numpy_flush(flush_bytes) if flush_bytes else None
    return _ClockedSampler(_HostSampler(call, flush), device), "host-clock"


def comparable(*measurements: Measurement) -> str | None:
    """None if every measurement was taken by the same method, else why they cannot be
    compared (a speedup or a roofline across clocks measures the clocks)."""
    methods = sorted({m.method for m in measurements})
    if len(methods) <= 1:
        return None
    labels = ", ".join(f"{m.label}: {m.method}" for m in measurements)
    return (f"taken by different clocks ({labels}); time every one by the same method "
            f"(KERNELPERF_TORCH_TIMER) to compare them")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Speedup:
    """Our median against the fastest baseline's, among the baselines of our precision timed
    by our clock.

    best: that baseline's name, None when none qualifies; value: its median over ours
    (above 1: ours is faster); other_clock: baselines of our precision timed by another
    method, left out (a ratio across clocks measures the clocks); other_precision: baselines
    that computed in another precision (a TF32 GEMM against an FP32 one measures the
    precision), shown labelled (`labelled`), never divided by; precision: ours.
    """

    best: str | None
    value: float | None
    other_clock: tuple[str, ...]
    other_precision: tuple[str, ...] = ()
    precision: str = ""

    def why_none(self) -> str:
        """Why `value` is None, in a few words for a table cell ("no TF32 baseline")."""
        if self.value is not None:
            return ""
        if self.other_clock:
            return "other clock"
        return f"no {self.precision or 'same-precision'} baseline"


def labelled(name: str, m: Measurement) -> str:
    """A baseline as a row shows it beside our kernel: "torch (FP32, 2674.00 us)"."""
    precision = m.precision or "precision unknown"
    return f"{name} ({precision}, {m.median_s * 1e6:.2f} us)"


def speedup(ours: Measurement, baselines: Mapping[str, Measurement], *,
            across_clocks: bool = False) -> Speedup:
    """The one computation of "speedup over the best baseline" (floor verdicts, the time
    table): over the fastest baseline of our precision timed by our clock. `across_clocks`
    compares those of our precision whatever their clock (the CLI's --mixed-clocks, said
    beside the number); no flag divides across precisions."""
    ours_precision = {name: m for name, m in baselines.items() if m.precision == ours.precision}
    other_precision = tuple(name for name in baselines if name not in ours_precision)
    same = {name: m for name, m in ours_precision.items()
            if across_clocks or m.method == ours.method}
    other = tuple(name for name in ours_precision if name not in same)
    common = dict(other_clock=other, other_precision=other_precision, precision=ours.precision)
    if not same:
        return Speedup(best=None, value=None, **common)
    best = min(same, key=lambda name: same[name].median_s)
    return Speedup(best=best, value=same[best].median_s / ours.median_s, **common)


def torch_flush(nbytes: int) -> Callable[[], Any]:
    import torch

    buffer = torch.empty(nbytes, dtype=torch.int8, device="cuda")
    return buffer.zero_


def jax_flush(nbytes: int, wait: bool = True) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp

    write = jax.jit(lambda token: jnp.broadcast_to(token, (nbytes // 4,)))
    if not wait:
        return functools.partial(write, jnp.int32(1))
    return lambda: jax.block_until_ready(write(jnp.int32(1)))


def jax_host_flush(nbytes: int) -> Callable[[], Any]:
    """Writes `nbytes` of a JAX CPU device's memory by an XLA program and waits: `jax_flush`
    with its buffer donated back to it, so every flush rewrites the same memory in place.
    A fresh buffer per flush (jax_flush) is a fresh 32 MiB from the allocator, page-faulted in
    and zeroed by the kernel each time: 23 ms of CPU per sample on the 2-core machine, where
    this takes 2.5 ms (the cold samples of every CPU timing, asv's included)."""
    import jax
    import jax.numpy as jnp

    write = jax.jit(lambda buffer: buffer + 1, donate_argnums=0)
    buffer = [jnp.zeros(nbytes // 4, jnp.int32)]

    def flush():
        buffer[0] = jax.block_until_ready(write(buffer[0]))
        return buffer[0]

    return flush


def jax_flush_devices(nbytes: int, devices: Sequence[Any]) -> Callable[[], Any]:
    """Writes `nbytes` on every one of `devices` and waits: the L2 flush of work that spans
    them, dispatched to all before the wait so the devices flush at once."""
    import jax
    import jax.numpy as jnp

    write = jax.jit(lambda token: jnp.broadcast_to(token, (nbytes // 4,)))
    tokens = [jax.device_put(jnp.int32(1), device) for device in devices]
    return lambda: jax.block_until_ready([write(token) for token in tokens])


def numpy_flush(nbytes: int) -> Callable[[], Any]:
    buffer = np.empty(nbytes, dtype=np.int8)
    return functools.partial(buffer.fill, 1)


def default_rule(device: fingerprint.Fingerprint) -> StoppingRule:
    """The CPU's host clock is noisier and its calls slower: a shorter budget there."""
    budget = float(os.environ.get("KERNELPERF_TIME_BUDGET", "3.0" if device.platform == "gpu"
                                  else "1.0"))
    return StoppingRule(time_budget_s=budget)


def time_timeable(timeable: Timeable, *, regime: str = "cold", rule: StoppingRule | None = None,
                  device: fingerprint.Fingerprint | None = None,
                  clock: str = "auto") -> Measurement:
    """Warm up (compiling), then sample `timeable` until `rule` stops; the Measurement.
    `clock`: as `make_sampler` takes it."""
    device = device or fingerprint.fingerprint()
    rule = rule or default_rule(device)
    sampler, method = make_sampler(timeable, regime, device, clock=clock)
    sampler.take(WARMUP_CALLS)
    sampler.reset()
    samples, reason = collect(sampler, rule)
    identity = device.to_dict()
    identity["clocks_before"] = dataclasses.asdict(sampler.first_clocks) \
        if sampler.first_clocks else None
    identity["clocks_after"] = dataclasses.asdict(sampler.last_clocks) \
        if sampler.last_clocks else None
    return Measurement.from_samples(samples, clocks=sampler.clocks, throttled=sampler.throttled,
                                    label=timeable.label, method=method, regime=regime,
                                    stop_reason=reason, fingerprint=identity,
                                    all_devices_s=tuple(getattr(sampler.inner, "all_devices",
                                                                ())),
                                    precision=timeable.precision)


def trace_calls(timeable: Timeable, calls: int = 5) -> list[CallSpan] | None:
    """`calls` calls of `timeable` (hot, each waited for) in one device trace: their
    CallSpans, every kernel, collective and copy of every device, for breakdowns (the
    bandwidth of one collective inside an operation); None where no device trace can be had
    (a CPU). Compiles first if needed."""
    if timeable.framework != "jax" or not timeable.on_gpu:
        return None
    sampler = _device_span_sampler(timeable, None)
    return None if sampler is None else sampler.record(calls)


# Calls issued back to back per launch-overhead sample: enough to amortise the timer, few
# enough that the launch queue (about a thousand launches) never fills and blocks the host.
LAUNCH_CALLS = 20


class _LaunchSampler:
    """Host seconds per call to issue `calls` calls back to back without waiting for them.

    The device is idle when each sample starts and is waited for after it, outside the timed
    span, so the number is what Python, autograd, ctypes and argument checks cost per call
    (dispatch, not device time), as a pipelined loop pays it.
    """

    def __init__(self, call: Callable[[], Any], wait: Callable[[Any], Any], calls: int):
        self.call, self.wait, self.calls = call, wait, calls

    def take(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            last = None
            start = time.perf_counter()
            for _ in range(self.calls):
                last = self.call()
            out.append((time.perf_counter() - start) / self.calls)
            self.wait(last)
        return out


def launch_overhead(timeable: Timeable, *, rule: StoppingRule | None = None,
                    device: fingerprint.Fingerprint | None = None,
                    calls: int = LAUNCH_CALLS) -> Measurement:
    """Host launch cost per call of `timeable` (method "host-launch"); never device time."""
    device = device or fingerprint.fingerprint()
    rule = rule or default_rule(device)
    if timeable.framework == "jax":
        import jax

        wait = jax.block_until_ready
    elif timeable.on_gpu:
        import torch

        def wait(_):
            torch.cuda.synchronize()
    else:
        def wait(_):
            return None
    sampler = _LaunchSampler(functools.partial(timeable.fn, *timeable.args), wait, calls)
    sampler.take(WARMUP_CALLS)
    samples, reason = collect(sampler, rule)
    return Measurement.from_samples(samples, label=timeable.label, method="host-launch",
                                    regime="hot", stop_reason=reason,
                                    fingerprint=device.to_dict(), precision=timeable.precision)


def measure(impl: registry.Implementation, case: registry.Case, direction: str = "fwd",
            regime: str = "cold", *, rule: StoppingRule | None = None, seed: int = 0,
            inputs: tuple[np.ndarray, ...] | None = None) -> Measurement:
    """Time `impl` on `case` in `direction` ("fwd" or "bwd") on this machine's device."""
    return time_timeable(prepare(impl, case, direction=direction, seed=seed, inputs=inputs),
                         regime=regime, rule=rule)
