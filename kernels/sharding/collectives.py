"""Collective bandwidth as nccl-tests measures it: algbw and busbw of all-gather, reduce-scatter,
all-reduce, all-to-all and a ring send/recv over a range of sizes, timed by the device clock.

    python -m kernels.sharding.collectives [--ops all-gather ...] [--min-bytes 1M]
        [--max-bytes 1G] [--devices N]
    python -m kernels.sharding.collectives --check-clock [--bytes 256M]

Definitions (nccl-tests, doc/PERFORMANCE.md and src/*.cu): every collective runs over n
ranks on a buffer of S bytes per rank (all-reduce: its array; reduce-scatter: its input,
recvcount * n elements; all-gather: its output, sendcount * n; all-to-all: its buffer,
count * n; send/recv: the message). algbw = S / t; busbw = algbw * factor, with factor
2 (n - 1) / n for all-reduce, (n - 1) / n for reduce-scatter, all-gather and all-to-all, and 1
for send/recv: the rate each link must carry in a ring, comparable across n and with the
hardware's link bandwidth (its NVLink figure per direction, printed beside).

Each is a shard_map over a 1-D mesh of the first n devices, float32 (nccl-tests' default
type), timed by kernels.core.timing in the hot regime: on GPUs the device span of each call
(method "device-span", calls waited for one by one, no launch gaps counted), elsewhere the
labelled host clock. `ceiling` is the all-gather's busbw at a large size: the roofline's
interconnect roof (kernels.sharding.meshes.interconnect_ceiling).

`--check-clock` compares the device clock with a profiler trace file of the same calls
(written by jax.profiler.trace, read back with ProfileData): the per-call span cut from the
file, the NCCL kernel's own duration, and the host clock one call per sample and over calls
issued back to back; exit 1 if the device clock and the file's spans disagree by more than
CHECK_TOLERANCE.

Keep NCCL_NVLS_ENABLE=0 (NVLink SHARP multicast) in the environment: this module never asks
for multicast, and NCCL must not choose it (KINDS.md: it can take a shared host's GPUs down).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from kernels.core import environment, validation

AXIS = "ranks"
ITEMSIZE = 4  # float32
# Per collective: the nccl-tests bus-bandwidth factor as a function of the rank count n.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "send-recv": lambda n: 1.0,
}
OPS = tuple(BUS_FACTORS)
# Sizes (S per rank, bytes): on GPUs nccl-tests' usual sweep's upper part; on CPU host
# devices, small enough to run in seconds.
GPU_RANGE = (1 << 20, 1 << 30)
CPU_RANGE = (1 << 16, 1 << 22)
# Host devices share the machine's memory: no larger S per rank there.
CPU_LIMIT = 64 << 20
# The size the interconnect roof is measured at: the all-gather's busbw on an H100 pair
# still climbs from 256 MiB (242 GB/s) to 1 GiB (270 GB/s) (/tmp/notes/sharded.md).
CEILING_BYTES = {"gpu": 1 << 30, "cpu": 16 << 20}
# Sampling per size: a short budget keeps a sweep's rows coming (progress every few seconds).
SWEEP_RULE = dict(min_samples=10, time_budget_s=1.0, max_samples=200)
# --check-clock: calls in the trace file, and how far the device clock may sit from it.
CHECK_CALLS = 20
CHECK_TOLERANCE = 0.05

# Datasheet NVLink bandwidth per GPU and direction, keyed by the name the driver reports.
NVLINK_PER_DIRECTION: dict[str, tuple[float, str]] = {
    "NVIDIA H100 80GB HBM3": (450e9, "H100 SXM datasheet: NVLink 900 GB/s bidirectional "
                                     "(18 NVLink 4 links)"),
    "NVIDIA H200": (450e9, "H200 SXM datasheet: NVLink 900 GB/s bidirectional"),
    "NVIDIA H100 PCIe": (300e9, "H100 PCIe datasheet: NVLink bridge 600 GB/s bidirectional"),
    "NVIDIA A100-SXM4-40GB": (300e9, "A100 datasheet: NVLink 600 GB/s bidirectional"),
    "NVIDIA A100-SXM4-80GB": (300e9, "A100 datasheet: NVLink 600 GB/s bidirectional"),
    "NVIDIA B200": (900e9, "HGX B200 datasheet: NVLink 5 1.8 TB/s bidirectional per GPU"),
}


def bus_factor(op: str, devices: int) -> float:
    """nccl-tests' busbw / algbw for `op` over `devices` ranks."""
    if op not in BUS_FACTORS:
        raise validation.UnknownName(f"op: expected one of {list(OPS)}, got {op!r}")
    if devices < 2:
        raise ValueError(f"devices: expected at least 2 for a collective, got {devices}")
    return BUS_FACTORS[op](devices)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    """One collective at one size: nccl-tests' S (bytes per rank, as defined above), the
    median seconds per call and how they were taken."""

    op: str
    devices: int
    size_bytes: int
    seconds: float
    method: str  # "device-span" or "host-clock"
    cv: float
    repeats: int
    all_devices_s: float | None = None  # median span over all devices (device-span only)

    def __post_init__(self) -> None:
        bus_factor(self.op, self.devices)
        if self.size_bytes < 1 or not self.seconds > 0:
            raise ValueError(f"size_bytes and seconds: expected > 0, got {self.size_bytes}, "
                             f"{self.seconds}")

    @property
    def algbw(self) -> float:
        """Bytes per second: S / t."""
        return self.size_bytes / self.seconds

    @property
    def busbw(self) -> float:
        """Bytes per second: algbw times the op's bus factor."""
        return self.algbw * bus_factor(self.op, self.devices)


def elements_per_rank(op: str, devices: int, size_bytes: int) -> int:
    """float32 elements of each rank's S-byte buffer, rounded down to a multiple of the rank
    count (all-gather, reduce-scatter and all-to-all split it in n equal parts)."""
    bus_factor(op, devices)
    count = size_bytes // ITEMSIZE // devices * devices
    if count < devices:
        raise ValueError(f"size_bytes: expected at least {devices * ITEMSIZE} bytes "
                         f"({devices} float32 per rank) for {op}, got {size_bytes}")
    return count


def _body(op: str, devices: int) -> Callable[[Any], Any]:
    """Per rank: the collective on its block."""
    import jax

    ring = [(i, (i + 1) % devices) for i in range(devices)]
    return {
        "all-gather": lambda x: jax.lax.all_gather(x, AXIS, tiled=True),
        "reduce-scatter": lambda x: jax.lax.psum_scatter(x, AXIS, tiled=True),
        "all-reduce": lambda x: jax.lax.psum(x, AXIS),
        "all-to-all": lambda x: jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True),
        "send-recv": lambda x: jax.lax.ppermute(x, AXIS, ring),
    }[op]


def build(op: str, devices: int, size_bytes: int) -> tuple[Callable[..., Any], Any]:
    """(jitted collective, its input laid out over the first `devices` devices) for S =
    `size_bytes` per rank; the input is made on the devices, never copied from the host."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from kernels.core import compat

    count = elements_per_rank(op, devices, size_bytes)
    if devices > jax.device_count():
        raise ValueError(f"devices: expected at most the {jax.device_count()} devices here, "
                         f"got {devices}")
    mesh = compat.make_mesh((devices,), (AXIS,), devices=jax.devices()[:devices])
    layout = NamedSharding(mesh, PartitionSpec(AXIS))
    # Each rank's block: S / n for the all-gather (its output is S), S for the others.
    block = count // devices if op == "all-gather" else count
    x = jax.jit(lambda: jnp.ones((devices * block,), jnp.float32), out_shardings=layout)()
    fn = jax.jit(compat.shard_map(_body(op, devices), mesh=mesh, in_specs=PartitionSpec(AXIS),
                                  out_specs=PartitionSpec(AXIS)))
    return fn, x


def measure(op: str, devices: int, size_bytes: int, *,
            rule: Any = None) -> Result:
    """Time `op` over the first `devices` devices at S = `size_bytes` per rank."""
    from kernels.core import timing

    fn, x = build(op, devices, size_bytes)
    rule = rule or timing.StoppingRule(**SWEEP_RULE)
    m = timing.time_timeable(timing.callable_timeable(f"{op} x{devices}", fn, "jax", (x,)),
                             regime="hot", rule=rule)
    count = elements_per_rank(op, devices, size_bytes)
    return Result(op=op, devices=devices, size_bytes=count * ITEMSIZE, seconds=m.median_s,
                  method=m.method, cv=m.cv, repeats=m.repeats,
                  all_devices_s=statistics.median(m.all_devices_s) if m.all_devices_s else None)


def platform() -> str:
    import jax

    return "gpu" if jax.default_backend() == "gpu" else "cpu"


@functools.cache
def ceiling(op: str, devices: int) -> Result:
    """`op` measured once per process at a large size (1 GiB per rank on GPUs): the roof a
    collective of that kind can reach over `devices` devices."""
    return measure(op, devices, CEILING_BYTES[platform()])


def sizes(low: int, high: int) -> list[int]:
    """Powers of two from `low` to `high` bytes (nccl-tests' -b low -e high -f 2)."""
    if not 0 < low <= high:
        raise ValueError(f"sizes: expected 0 < min <= max, got {low}, {high}")
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= 2
    return out


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """argparse type: a byte count such as 1048576, 64K, 256M or 1G (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"expected a byte count >= 1 such as 1048576, 64K, "
                                         f"256M or 1G, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def human(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]} {unit}iB"
    return f"{size} B"


def nvlink_figure(device_kind: str) -> tuple[float, str] | None:
    """(datasheet NVLink bytes/s per GPU and direction, its source), or None if unknown."""
    return NVLINK_PER_DIRECTION.get(device_kind)


HEADER = (f"{'op':<15} {'n':>2} {'size':>9} {'time us':>10} {'algbw GB/s':>10} "
          f"{'busbw GB/s':>10} {'% NVLink':>8} {'all-dev us':>10}  clock")


def row(result: Result, link: float | None) -> str:
    share = f"{100 * result.busbw / link:7.1f}%" if link else f"{'-':>8}"
    span = f"{result.all_devices_s * 1e6:10.1f}" if result.all_devices_s else f"{'-':>10}"
    return (f"{result.op:<15} {result.devices:>2} {human(result.size_bytes):>9} "
            f"{result.seconds * 1e6:10.1f} {result.algbw / 1e9:10.2f} {result.busbw / 1e9:10.2f} "
            f"{share} {span}  {result.method}, n={result.repeats}, CV {100 * result.cv:.1f}%")


def sweep(ops: Sequence[str], devices: int, size_list: Sequence[int],
          out=None) -> list[Result]:
    """Every op at every size, a table row printed as each is measured (progress)."""
    import jax

    out = out or sys.stdout
    kind = jax.devices()[0].device_kind
    figure = nvlink_figure(kind)
    link = figure[0] if figure and platform() == "gpu" else None
    print(f"{devices} x {kind} ({platform()}), jax {jax.__version__}, "
          f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', '(unset)')}", file=out)
    described = f"{link / 1e9:.0f} GB/s ({figure[1]})" if link else "unknown here"
    print(f"NVLink per GPU and direction: {described}; busbw (nccl-tests) is comparable with it",
          file=out)
    print(HEADER, file=out, flush=True)
    results = []
    for op in ops:
        for size in size_list:
            try:
                result = measure(op, devices, size)
            except RuntimeError as error:  # a device trace that cannot be cut into calls
                print(f"{op:<15} {devices:>2} {human(size):>9}  not timed: {error}", file=out,
                      flush=True)
                continue
            results.append(result)
            print(row(result, link), file=out, flush=True)
    return results


# -- the clock against a trace file ------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class ClockReading:
    """One way of timing the same calls: median seconds per call and its spread."""

    clock: str
    median_s: float
    cv: float
    samples: int


def _summary(clock: str, values: Sequence[float]) -> ClockReading:
    from kernels.core import timing

    return ClockReading(clock=clock, median_s=statistics.median(values),
                        cv=timing.coefficient_of_variation(values), samples=len(values))


def kernel_durations(events: Sequence[Any], fragment: str, calls: int) -> list[float]:
    """Per call, the longest duration over devices of the one event named like `fragment`
    that each device ran per call (the NCCL kernel): an estimate that does not depend on
    cutting the trace into calls. [] unless every device ran exactly `calls` of them."""
    per_device: dict[str, list[Any]] = {}
    for event in sorted(events, key=lambda e: e.start_ns):
        if fragment in event.name:
            per_device.setdefault(event.device, []).append(event)
    if not per_device or any(len(found) != calls for found in per_device.values()):
        return []
    return [max((found[i].end_ns - found[i].start_ns) * 1e-9 for found in per_device.values())
            for i in range(calls)]


def _trace_file_events(fn: Callable[..., Any], x: Any, calls: int) -> list[Any]:
    """Device events of `calls` waited-for calls, through a trace file on disk."""
    import jax

    from kernels.core import compat, timing

    with tempfile.TemporaryDirectory(prefix="kernelperf-clock-") as directory:
        with jax.profiler.trace(directory):
            for _ in range(calls):
                jax.block_until_ready(fn(x))
        files = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)
        if not files:
            raise RuntimeError(f"jax.profiler.trace wrote no .xplane.pb under {directory}")
        return timing.device_events(compat.profile_data(files[0]))


def check_clock(devices: int, size_bytes: int, calls: int = CHECK_CALLS,
                out=None) -> int:
    """The all-gather at `size_bytes` per rank timed by the device clock and by the other
    ways; prints a table and returns the exit status (1: device clock and trace disagree)."""
    import jax

    out = out or sys.stdout
    from kernels.core import timing

    fn, x = build("all-gather", devices, size_bytes)
    jax.block_until_ready(fn(x))
    rule = timing.StoppingRule(min_samples=calls, max_samples=calls)
    device = timing.time_timeable(timing.callable_timeable("all-gather", fn, "jax", (x,)),
                                  regime="hot", rule=rule)
    readings = [ClockReading(clock=f"timing ({device.method})", median_s=device.median_s,
                             cv=device.cv, samples=device.repeats)]
    if device.all_devices_s:
        readings.append(_summary("timing, span over all devices", device.all_devices_s))
    events = _trace_file_events(fn, x, calls)
    trace = None
    if events:
        spans = timing.split_calls(events, calls)
        trace = _summary("trace file: largest per-device span", [s.largest_s for s in spans])
        readings.append(trace)
        kernels = kernel_durations(events, "AllGather", calls)
        if kernels:
            readings.append(_summary("trace file: NCCL all-gather kernel", kernels))

    def one_call():
        jax.block_until_ready(fn(x))

    host = timing.time_timeable(timing.Timeable("host", "host", one_call, (), False),
                                regime="hot", rule=rule)
    readings.append(ClockReading(clock="host clock, 1 call per sample", median_s=host.median_s,
                                 cv=host.cv, samples=host.repeats))

    batched = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            last = fn(x)
        jax.block_until_ready(last)
        batched.append((time.perf_counter() - start) / calls)
    readings.append(_summary(f"host clock, {calls} calls back to back", batched))
    reference = trace.median_s if trace else None
    print(f"all-gather of {human(elements_per_rank('all-gather', devices, size_bytes) * 4)} "
          f"over {devices} x {jax.devices()[0].device_kind}; {calls} calls per reading", file=out)
    print(f"{'clock':<40} {'median us':>10} {'CV':>6} {'samples':>7} {'vs trace':>8}", file=out)
    for reading in readings:
        ratio = f"{reading.median_s / reference:8.3f}" if reference else f"{'-':>8}"
        print(f"{reading.clock:<40} {reading.median_s * 1e6:10.1f} {100 * reading.cv:5.1f}% "
              f"{reading.samples:>7} {ratio}", file=out)
    if reference is None:
        print("no GPU activity in the trace file (no GPU here): the device clock falls back to "
              "the labelled host clock; nothing to compare", file=out)
        return 0
    gap = abs(device.median_s / reference - 1)
    verdict = "agree" if gap <= CHECK_TOLERANCE else "DISAGREE"
    print(f"device clock vs trace file: {100 * gap:.1f}% apart ({verdict}; tolerance "
          f"{100 * CHECK_TOLERANCE:.0f}%)", file=out)
    return 0 if gap <= CHECK_TOLERANCE else 1


def main(argv: list[str] | None = None) -> int:
    parser = validation.ArgumentParser(prog="python -m kernels.sharding.collectives",
                                       description=__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--min-bytes", type=parse_bytes,
                        help=f"S per rank, smallest (default {human(GPU_RANGE[0])} on GPUs, "
                             f"{human(CPU_RANGE[0])} on CPU)")
    parser.add_argument("--max-bytes", type=parse_bytes,
                        help=f"S per rank, largest (default {human(GPU_RANGE[1])} on GPUs, "
                             f"{human(CPU_RANGE[1])} on CPU)")
    parser.add_argument("--devices", type=validation.int_at_least(2),
                        help="ranks: the first N devices (default: all)")
    parser.add_argument("--check-clock", action="store_true",
                        help="compare the device clock with a trace file (all-gather)")
    parser.add_argument("--bytes", type=parse_bytes, default=256 << 20,
                        help="--check-clock's S per rank (default 256 MiB)")
    args = parser.parse_args(argv)
    environment.configure()
    import jax

    devices = args.devices or jax.device_count()
    if devices > jax.device_count() or devices < 2:
        parser.error(f"--devices: expected 2 to {jax.device_count()} (the devices here), "
                     f"got {devices}")
    if args.check_clock:
        size = args.bytes if platform() == "gpu" else min(args.bytes, CPU_LIMIT)
        return check_clock(devices, size)
    low, high = GPU_RANGE if platform() == "gpu" else CPU_RANGE
    low, high = args.min_bytes or low, args.max_bytes or high
    if low > high:
        parser.error(f"--min-bytes: expected at most --max-bytes ({human(high)}), got "
                     f"{human(low)}")
    if platform() == "cpu" and high > CPU_LIMIT:
        parser.error(f"--max-bytes: expected at most {human(CPU_LIMIT)} per rank on CPU host "
                     f"devices (they share this machine's memory: an all-gather over N of "
                     f"them holds N x S), got {human(high)}")
    sweep(args.ops, devices, sizes(low, high))
    return 0


if __name__ == "__main__":
    sys.exit(main())
