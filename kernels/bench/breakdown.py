"""Where a benchmark run's time went: asv's own work, the measuring workers' start, backend
start, inputs, compile, warm-up, sampling, peak memory and launch cost, for the first pass
and for the confirmation's rounds apart.

The benchmarks' measuring workers (perf_tests/measuring.py) journal each phase of every
parameter set, each line tagged with its pass ("first", or "confirm" for a confirmation's
round; lines without a tag are a first pass's); a run's wall time less everything the
journals (and the phases the caller adds, `add_phase`) account for is the rest: asv's own
work (environments, builds and installs, discovery, one process per benchmark and parameter
set) after asv runs, the gate's own work after the interleaved gate. `python -m kernels
bench` prints this at the end, and the asv plugin prints it when plain `asv run` /
`asv continuous` exit.
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
PASSES = ("first", "confirm")
PASS_LABELS = {"first": "first pass", "confirm": "confirmation"}
# The interleaved gate's two workers start and compile at once: their seconds, summed above,
# exceed the wall time they took by this much (or the driver waited this much more between).
OVERLAP = "the two workers at once (their seconds above overlap)"
BETWEEN = "between the workers' phases (the driver, the pipes)"
OUTSIDE_ASV = "asv's own work (environments, installs, discovery, a process per benchmark)"
# Set by `python -m kernels bench`, which prints one breakdown over all its asv runs: the asv
# plugin then prints none per run.
QUIET_VARIABLE = "KERNELPERF_NO_BREAKDOWN"


@dataclasses.dataclass
class Breakdown:
    """Seconds per phase over some journals, and what they measured; `by_pass` splits the
    seconds between the first pass and the confirmation."""

    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    measured: int = 0
    failed: int = 0
    workers: int = 0
    samples: list[int] = dataclasses.field(default_factory=list)
    by_pass: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    rounds: int = 0  # confirmation rounds measured (one parameter set on one commit each)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)  # of add_phase's names

    def add(self, entries: Iterable[dict]) -> None:
        for entry in entries:
            event = entry.get("event")
            which = entry.get("pass") or "first"
            if event == "worker":
                self.workers += 1
                self._add("process", entry.get("process_s", 0.0), which)
                self._add("backend", entry.get("backend_s", 0.0), which)
            elif event == "ahead-done":
                self._add("ahead", entry.get("seconds", 0.0), which)
            elif event == "done":
                if which == "first":
                    self.measured += 1
                    self.samples.append(len(entry.get("samples", ())))
                else:
                    self.rounds += 1
                for phase in PHASES:
                    self._add(phase, entry.get("phases", {}).get(phase, 0.0), which)
            elif event == "failed":
                self.failed += 1

    def add_phase(self, name: str, label: str, seconds: float, which: str = "first") -> None:
        """Seconds the journals do not hold (the gate's discovery, its results written)."""
        self.labels[name] = label
        self._add(name, seconds, which)

    def _add(self, name: str, seconds: float | None, which: str) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + (seconds or 0.0)
        phases = self.by_pass.setdefault(which, {})
        phases[name] = phases.get(name, 0.0) + (seconds or 0.0)

    @property
    def accounted(self) -> float:
        return sum(self.seconds.values())

    def render(self, wall_s: float | None, outside: str = OUTSIDE_ASV,
               outside_s: float | None = None) -> str:
        """The table: a row per phase (its seconds and share of `wall_s`, or of what the
        journals measured), first `outside` (the wall time nothing else accounts for, or
        `outside_s` where the caller measured it: then a row for the workers' seconds that
        overlapped, negative, keeps the sum at the wall time); with confirmation rounds, a
        column per pass."""
        rows = []
        total = wall_s if wall_s else self.accounted
        names = ["process", "backend", "ahead", *PHASES, *self.labels]
        split = any(which != "first" and any(phases.values())
                    for which, phases in self.by_pass.items())
        passes = [which for which in PASSES if which in self.by_pass] if split else []

        def cells(name: str) -> list[str]:
            return [f"{self.by_pass.get(which, {}).get(name, 0.0):.1f}" for which in passes]
        if wall_s:
            rest = max(0.0, wall_s - self.accounted) if outside_s is None else outside_s
            rows.append([outside, *(["-"] * len(passes)), f"{rest:.1f}", f"{rest / total:.0%}"])
        rows += [[self.labels.get(name) or LABELS[name], *cells(name),
                  f"{self.seconds.get(name, 0.0):.1f}",
                  f"{self.seconds.get(name, 0.0) / total:.0%}" if total else "-"]
                 for name in names if name in self.seconds]
        overlap = wall_s - outside_s - self.accounted if wall_s and outside_s is not None else 0
        if round(overlap, 1):
            rows.append([OVERLAP if overlap < 0 else BETWEEN, *(["-"] * len(passes)),
                         f"{overlap:.1f}", f"{overlap / total:.0%}"])
        rows.append(["total" + (" (wall)" if wall_s else " (measured)"),
                     *[f"{sum(self.by_pass.get(which, {}).values()):.1f}" for which in passes],
                     f"{total:.1f}", "100%"])
        samples = (f", {statistics.median(self.samples):.0f} samples each (median; "
                   f"{min(self.samples)}-{max(self.samples)})" if self.samples else "")
        head = (f"where the time went: {self.measured} parameter sets measured, "
                f"{self.failed} failed, by {self.workers} worker process(es){samples}")
        if self.rounds:
            confirmation = sum(self.by_pass.get("confirm", {}).values())
            head += (f"; confirmation: {self.rounds} round(s) of one parameter set on one "
                     f"commit, {confirmation:.1f} s"
                     + (f" ({confirmation / total:.0%})" if total else ""))
        return head + "\n" + table(rows, ["phase", *[PASS_LABELS[w] for w in passes],
                                           "seconds", "share"])


def read(paths: Iterable[pathlib.Path]) -> Breakdown:
    """The breakdown of some journals."""
    breakdown = Breakdown()
    for path in paths:
        breakdown.add(journals.entries(path))
    return breakdown


def report(since: float, wall_s: float, also: Iterable[pathlib.Path] = ()) -> str | None:
    """The breakdown of the benchmark journals written since `since` (asv's, and any under the
    folders `also`: the confirmation's), or None if none were."""
    paths = journals.written_since(journals.env_dir(), since)
    paths += sorted(path for folder in also for path in pathlib.Path(folder).rglob("*.jsonl")
                    if path.stat().st_mtime >= since)
    if not paths:
        return None
    return read(paths).render(wall_s)
