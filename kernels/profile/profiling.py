"""XProf traces and the top kernels by device time, read with JAX's own trace-data API.

`profile(name)` traces a block with `jax.profiler.trace` into
`traces/{YYYY-MM-DD}/{name}/` (XProf's layout: `plugins/profile/<run>/<host>.xplane.pb`
and a Chrome `trace.json.gz`), then prints the kernels that took the most
device time. `quick_profile(name, fn)` warms `fn` up outside the trace and
traces a few calls; `profile_comparison(name, (label, fn), ...)` does that per
label, each in its own trace, and prints one table per label plus a summary.

The table is built from the trace's XSpace with `jax.profiler.ProfileData`
(present in jax 0.10.2 and 0.11.2): on a GPU, the events of the device plane's
stream lines (one per kernel or memcpy, CUPTI's device timestamps); without
one, XLA's ops as executed on the host CPU (events carrying an `hlo_op` stat).
Open a trace with `make xprof-serve` (XProf on port 8791).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

TRACES_VARIABLE = "KERNELPERF_TRACES"
DEFAULT_ROOT = "traces"
# Lines XProf derives from other lines (not device activity of their own).
_DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Framework Ops",
                  "Framework Name Scope", "Source code", "Launch Stats", "TensorFlow Ops",
                  "TensorFlow Name Scope")


def trace_dir(name: str, root: str | os.PathLike | None = None,
              day: datetime.date | None = None) -> pathlib.Path:
    """traces/{YYYY-MM-DD}/{name}, under $KERNELPERF_TRACES or ./traces by default."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"name: expected a non-empty name without '/', got {name!r}")
    base = pathlib.Path(root or os.environ.get(TRACES_VARIABLE) or DEFAULT_ROOT)
    return base / (day or datetime.date.today()).isoformat() / name


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """Device time of one kernel (by name) summed over the trace."""

    name: str
    calls: int
    total_ns: float

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.calls


@dataclasses.dataclass(frozen=True)
class TopKernels:
    source: str  # which plane and lines the times came from
    kernels: tuple[KernelTime, ...]  # all of them, longest total first
    xplane: pathlib.Path

    @property
    def total_ns(self) -> float:
        return sum(k.total_ns for k in self.kernels)

    def table(self, top: int = 10, name_width: int = 72) -> str:
        from kernels.core.tables import table

        total = self.total_ns or 1.0
        rows = [[_shorten(k.name, name_width), str(k.calls), f"{k.total_ns / 1e3:.1f}",
                 f"{k.mean_ns / 1e3:.2f}", f"{100 * k.total_ns / total:.1f}"]
                for k in self.kernels[:top]]
        head = (f"top {min(top, len(self.kernels))} of {len(self.kernels)} kernels by device "
                f"time ({self.source}; {self.total_ns / 1e3:.1f} us in all)")
        return head + "\n" + table(rows, ["kernel", "calls", "total us", "mean us", "%"])


def _shorten(name: str, width: int) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def latest_xplane(directory: str | os.PathLike) -> pathlib.Path:
    """The newest `*.xplane.pb` written under `directory`."""
    found = sorted(pathlib.Path(directory).glob("plugins/profile/*/*.xplane.pb"),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"directory: expected a trace (plugins/profile/*/*.xplane.pb) "
                                f"under {directory}, found none")
    return found[-1]


def _stats(event) -> dict[str, Any]:
    return {key: value for key, value in event.stats}


def top_kernels(xplane: str | os.PathLike) -> TopKernels:
    """Kernels by total device time, from a trace's XSpace (`jax.profiler.ProfileData`)."""
    from kernels.core import compat

    data = compat.profile_data(pathlib.Path(xplane))
    totals: dict[str, list[float]] = {}
    device_planes = [p for p in data.planes if p.name.startswith("/device:GPU")]
    if device_planes:
        lines = [line for plane in device_planes for line in plane.lines
                 if line.name not in _DERIVED_LINES]
        streams = [line for line in lines if line.name.startswith("Stream")]
        lines = streams or lines
        source = (f"{', '.join(sorted({p.name for p in device_planes}))}: "
                  f"{len(lines)} stream line(s)")
        for line in lines:
            for event in line.events:
                entry = totals.setdefault(event.name, [0, 0.0])
                entry[0] += 1
                entry[1] += event.duration_ns
    else:
        source = "no GPU in the trace: XLA ops on host CPU threads (/host:CPU, hlo_op events)"
        for plane in data.planes:
            if not plane.name.startswith("/host:CPU"):
                continue
            for line in plane.lines:
                for event in line.events:
                    # Control ops (while, conditional, call) contain the ops they run:
                    # counting them too would count that time twice.
                    if "hlo_op" in _stats(event) and \
                            event.name.split(".")[0] not in ("while", "conditional", "call"):
                        entry = totals.setdefault(event.name, [0, 0.0])
                        entry[0] += 1
                        entry[1] += event.duration_ns
    kernels = sorted((KernelTime(name, int(calls), total) for name, (calls, total)
                      in totals.items()), key=lambda k: -k.total_ns)
    return TopKernels(source=source, kernels=tuple(kernels), xplane=pathlib.Path(xplane))


@dataclasses.dataclass
class Trace:
    """Where a trace went, and (after the block) its top kernels."""

    directory: pathlib.Path
    top: TopKernels | None = None


@contextlib.contextmanager
def _traced(directory: pathlib.Path, top: int, report: bool) -> Iterator[Trace]:
    import jax

    trace = Trace(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(directory)):
        yield trace
    trace.top = top_kernels(latest_xplane(directory))
    if report:
        print(f"trace: {trace.top.xplane}")
        print(trace.top.table(top))


@contextlib.contextmanager
def profile(name: str, *, root: str | os.PathLike | None = None, top: int = 10,
            report: bool = True) -> Iterator[Trace]:
    """Trace the block into traces/{date}/{name}/; then print its top `top` kernels.

    Work inside the block should end with `jax.block_until_ready`, or the
    device may still run it when the trace stops.
    """
    with _traced(trace_dir(name, root), top, report) as trace:
        yield trace


def _trace_calls(directory: pathlib.Path, label: str, fn: Callable[[], Any], iterations: int,
                 warmup: int, top: int, report: bool) -> Trace:
    import jax

    if iterations < 1:
        raise ValueError(f"iterations: expected >= 1, got {iterations}")
    for _ in range(warmup):
        jax.block_until_ready(fn())
    with _traced(directory, top, report) as trace:
        for step in range(iterations):
            with jax.profiler.StepTraceAnnotation(label, step_num=step):
                jax.block_until_ready(fn())
    return trace


def quick_profile(name: str, fn: Callable[[], Any], *, iterations: int = 5,
                  warmup: int = 2, root: str | os.PathLike | None = None, top: int = 10,
                  report: bool = True) -> Trace:
    """Call `fn()` `warmup` times untraced (compiles, autotuning), then trace `iterations` calls
    into traces/{date}/{name}/ and print the top kernels."""
    return _trace_calls(trace_dir(name, root), name, fn, iterations, warmup, top, report)


def profile_comparison(name: str, *labelled: tuple[str, Callable[[], Any]],
                       iterations: int = 5, warmup: int = 2,
                       root: str | os.PathLike | None = None, top: int = 10,
                       report: bool = True) -> dict[str, Trace]:
    """`quick_profile` of each (label, fn) into traces/{date}/{name}/{label}/, then a summary:
    device time per call and the longest kernel of each."""
    from kernels.core.tables import table

    if not labelled:
        raise ValueError("labelled: expected at least one (label, fn) pair, got none")
    base = trace_dir(name, root)
    traces = {}
    for label, fn in labelled:
        trace_dir(label, base.parent)  # validates the label as a directory name
        if report:
            print(f"== {name}: {label}")
        traces[label] = _trace_calls(base / label, label, fn, iterations, warmup, top, report)
    if report:
        rows = []
        for label, trace in traces.items():
            kernels = trace.top.kernels
            rows.append([label, f"{trace.top.total_ns / iterations / 1e3:.1f}",
                         str(len(kernels)), _shorten(kernels[0].name, 48) if kernels else "-"])
        print(f"== {name}: device time per call ({iterations} calls traced each)")
        print(table(rows, ["label", "device us/call", "kernels", "longest kernel"]))
    return traces
