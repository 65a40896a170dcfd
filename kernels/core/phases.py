"""Where a correctness run spends its time: wall seconds per named phase, per item and summed.

`PhaseTimer` times the phases of one check (`with timer.phase("reference"):`); JAX's own
compile events (tracing, lowering to MLIR, the backend compile) are added under
`jax_compile` while `timer.active()` is in force, so the breakdown can say how much of a
phase was compilation. `summarize` turns the records of many items into the table pytest
prints at the end of a run (kernels/testing/phases_plugin.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator, Mapping

from kernels.core import compat

# Display order. Each check times these; "jax_compile" overlaps the others (it is the part
# of them JAX spent compiling), so it is not added into the total.
PHASES = ("inputs", "reference", "place", "forward", "compare", "gradients")
OVERLAPPING = ("jax_compile",)
DESCRIPTIONS = {
    "inputs": "input generation (host RNG)",
    "reference": "float32 reference, VJP and gradient magnitudes (compile included)",
    "place": "inputs onto the device / into the framework",
    "forward": "implementation forward (compile included)",
    "compare": "comparisons: output, gradients, inputs untouched",
    "gradients": "implementation VJP (compile included)",
    "jax_compile": "of the above, JAX tracing + lowering + XLA compile",
}
# JAX's compile events, all of which count as compilation time.
_COMPILE_EVENTS = (compat.TRACE_EVENT, compat.BACKEND_COMPILE_EVENT,
                   "/jax/core/compile/jaxpr_to_mlir_module_duration")

_CURRENT: contextvars.ContextVar[PhaseTimer | None] = contextvars.ContextVar(
    "kernelperf_phase_timer", default=None)
_listening = False
_listening_lock = threading.Lock()


@dataclasses.dataclass
class PhaseTimer:
    """Wall seconds per phase name for one test item; a phase entered twice adds up."""

    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    @contextlib.contextmanager
    def active(self) -> Iterator[PhaseTimer]:
        """Route JAX's compile-time events to this timer while the block runs."""
        _listen_to_jax_compiles()
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    @property
    def total(self) -> float:
        return sum(s for name, s in self.seconds.items() if name not in OVERLAPPING)


def _on_duration(event: str, seconds: float, **_: object) -> None:
    timer = _CURRENT.get()
    if timer is not None and event in _COMPILE_EVENTS:
        timer.add("jax_compile", seconds)


def _listen_to_jax_compiles() -> None:
    """Register the duration listener once per process (JAX keeps listeners for good)."""
    global _listening
    with _listening_lock:
        if not _listening:
            compat.add_duration_listener(_on_duration)
            _listening = True


@dataclasses.dataclass(frozen=True)
class ItemRecord:
    """One test item's phases, as the pytest plugin collects them from every worker."""

    nodeid: str
    op: str
    duration: float  # pytest's own wall time of the call
    seconds: Mapping[str, float]

    def __post_init__(self) -> None:
        if self.duration < 0:
            raise ValueError(f"duration: expected >= 0 seconds, got {self.duration}")


def summarize(records: Iterable[ItemRecord], *, wall: float | None = None, workers: int = 1,
              slowest: int = 8) -> list[str]:
    """Lines of the end-of-run table: seconds per phase (summed over items and workers), the
    same per operation, and the slowest items with their split."""
    records = list(records)
    if not records:
        return []
    names = [p for p in PHASES if any(p in r.seconds for r in records)]
    names += sorted({p for r in records for p in r.seconds} - set(PHASES) - set(OVERLAPPING))
    overlapping = [p for p in OVERLAPPING if any(p in r.seconds for r in records)]
    totals = {p: sum(r.seconds.get(p, 0.0) for r in records) for p in names + overlapping}
    busy = sum(r.duration for r in records)
    timed = sum(totals[p] for p in names)
    header = f"kernelperf phases: {len(records)} kernel items, {busy:.1f} s of item time"
    if wall is not None:
        header += f" over {workers} worker{'s' if workers != 1 else ''} in {wall:.1f} s wall"
    lines = [header]
    for p in names + overlapping:
        share = totals[p] / busy if busy else 0.0
        lines.append(f"  {p:<12} {totals[p]:9.1f} s  {share:6.1%}  {DESCRIPTIONS.get(p, '')}")
    lines.append(f"  {'untimed':<12} {busy - timed:9.1f} s  "
                 f"{(busy - timed) / busy if busy else 0.0:6.1%}  fixtures, pytest, set-up")
    by_op: dict[str, list[ItemRecord]] = {}
    for r in records:
        by_op.setdefault(r.op, []).append(r)
    lines.append("  per operation (s): " + ", ".join(
        f"{op} {sum(r.duration for r in rs):.1f} ({len(rs)} items)"
        for op, rs in sorted(by_op.items(), key=lambda kv: -sum(r.duration for r in kv[1]))))
    lines.append(f"  slowest {min(slowest, len(records))}:")
    for r in sorted(records, key=lambda r: -r.duration)[:slowest]:
        split = " ".join(f"{p} {r.seconds[p]:.1f}" for p in names + overlapping
                         if r.seconds.get(p, 0.0) >= 0.05)
        lines.append(f"    {r.duration:7.1f} s  {r.nodeid}  ({split})")
    return lines
