"""Where a benchmark run's time went: asv's own work, the measuring workers' start, backend
start, inputs, compile, warm-up, sampling, peak memory and launch cost.

The benchmarks' measuring workers (perf_tests/measuring.py) journal each phase of every
parameter set; a run's wall time less everything the journals account for is asv's own
work (environments, builds and installs, discovery, one process per benchmark and parameter
set). `python -m kernels bench` prints this after its asv runs, and the asv plugin prints
it when plain `asv run` / `asv continuous` exit.
"""

from __future__ import annotations

import dataclasses
import pathlib
import statistics
from collections.abc import Iterable

from kernels.core import journals
from kernels.core.tables import table

# Phases in the order a parameter set passes through them (measuring.py's names).
PHASES = ("inputs", "compile", "warmup", "sampling", "memory", "launch")
LABELS = {"process": "worker process start (imports)", "backend": "backend start (JAX, torch)",
          "ahead": "JAX compiled ahead, per case on threads (wall)",
          "inputs": "inputs (made once per case)", "compile": "compile and first call",
          "warmup": "warm-up", "sampling": "sampling", "memory": "compiled peak memory",
          "launch": "host launch cost (dashboard)"}
# Set by `python -m kernels bench`, which prints one breakdown over all its asv runs: the asv
# plugin then prints none per run.
QUIET_VARIABLE = "KERNELPERF_NO_BREAKDOWN"


@dataclasses.dataclass
class Breakdown:
    """Seconds per phase over some journals, and what they measured."""

    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    measured: int = 0
    failed: int = 0
    workers: int = 0
    samples: list[int] = dataclasses.field(default_factory=list)

    def add(self, entries: Iterable[dict]) -> None:
        for entry in entries:
            event = entry.get("event")
            if event == "worker":
                self.workers += 1
                self._add("process", entry.get("process_s", 0.0))
                self._add("backend", entry.get("backend_s", 0.0))
            elif event == "ahead-done":
                self._add("ahead", entry.get("seconds", 0.0))
            elif event == "done":
                self.measured += 1
                self.samples.append(len(entry.get("samples", ())))
                for phase in PHASES:
                    self._add(phase, entry.get("phases", {}).get(phase, 0.0))
            elif event == "failed":
                self.failed += 1

    def _add(self, name: str, seconds: float | None) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + (seconds or 0.0)

    @property
    def accounted(self) -> float:
        return sum(self.seconds.values())

    def render(self, wall_s: float | None) -> str:
        rows = []
        total = wall_s if wall_s else self.accounted
        names = ["process", "backend", "ahead", *PHASES]
        if wall_s:
            rows.append(["asv's own work (environments, installs, discovery, a process "
                         "per benchmark)", f"{max(0.0, wall_s - self.accounted):.1f}",
                         f"{max(0.0, wall_s - self.accounted) / total:.0%}"])
        rows += [[LABELS[name], f"{self.seconds.get(name, 0.0):.1f}",
                  f"{self.seconds.get(name, 0.0) / total:.0%}" if total else "-"]
                 for name in names if name in self.seconds]
        rows.append(["total" + (" (wall)" if wall_s else " (measured)"), f"{total:.1f}", "100%"])
        samples = (f", {statistics.median(self.samples):.0f} samples each (median; "
                   f"{min(self.samples)}-{max(self.samples)})" if self.samples else "")
        head = (f"where the time went: {self.measured} parameter sets measured, "
                f"{self.failed} failed, by {self.workers} worker process(es){samples}")
        return head + "\n" + table(rows, ["phase", "seconds", "share"])


def read(paths: Iterable[pathlib.Path]) -> Breakdown:
    """The breakdown of some journals."""
    breakdown = Breakdown()
    for path in paths:
        breakdown.add(journals.entries(path))
    return breakdown


def report(since: float, wall_s: float) -> str | None:
    """The breakdown of the benchmark journals written since `since`, or None if none were."""
    paths = journals.written_since(journals.env_dir(), since)
    if not paths:
        return None
    return read(paths).render(wall_s)
