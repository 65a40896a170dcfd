"""A slowdown confirmed before it fails the gate: base and head measured again, interleaved.

A first pass can be fooled by what differs between two processes or two stretches of time: a
throttled spell, a busy neighbour on a shared GPU, buffers placed differently. So each row
the compare calls "slower" (or "faster": a chance reading must not pass for a speed-up
either) is measured again in `rounds` rounds of base and head alternately (B H, H B, B H,
...), by one long-lived measuring worker per commit (perf_tests/measuring.py's LiveWorker,
this checkout's, over that commit's `kernels`: a `git archive` of the commit on PYTHONPATH,
so both commits are at hand at once, as asv's one environment per run cannot give). A worker
keeps each parameter set's executable and inputs between rounds, so a round costs its
warm-up and samples, not a process start, a backend start and compiles (`Pool`; the
interleaved gate, kernels.bench.interleaved, measures the rounds while the first pass has the
parameter set open, and hands them over).

The slowdown stands only if every round reads the head slower than its base by more than
half the row's gap and the rounds' geometric mean exceeds the whole gap (a speed-up, the same
the other way); otherwise the row becomes "same (not confirmed)". A parameter set that one
round reads at or under half its gap is settled there and measured no more, so an A/A run's
chance flags cost one round, not three. A real regression shows in every round; a process or
a spell that happened to be slow shows in one. The per-round ratios go in the compare table.

Clocks: each sample carries the SM clock it ran at. Where the side that reads slower (or, for
a speed-up, the base) ran at a clock more than CLOCK_TOLERANCE lower than the other, its
round counts the change as if the kernel were bound by the SM clock: the ratio divided by the
clocks' ratio (cycle space, as nvbench judges throttled runs). That can only weaken a
round's evidence, never make one (a memory-bound kernel does not slow with the SM clock, so
the adjustment is not applied the other way): a throttled stretch cannot confirm a
regression.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

ROUNDS = 3
# Two sides' SM clocks this far apart mark a round as throttled on one side (a GPU's boost steps
# are ~15 MHz, under 1% of an H200's 1980 MHz; a throttled spell costs hundreds of MHz).
CLOCK_TOLERANCE = 0.02
CONFIRMED_VERDICTS = ("slower", "faster")  # the first pass's verdicts measured again
ROOT_VARIABLE = "KERNELPERF_CONFIRM_DIR"  # where commit trees and journals go (.asv/confirm)


def _print(line: str) -> None:
    print(line, flush=True)


def confirm_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(ROOT_VARIABLE, ".asv/confirm"))


def source_tree(commit: str, root: pathlib.Path | None = None) -> pathlib.Path:
    """A copy of `commit`'s files (git archive), made once and kept under confirm_dir()."""
    root = root or confirm_dir()
    target = root / "trees" / commit[:12]
    if (target / "kernels").is_dir():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
    os.replace(partial, target)
    return target


def class_names() -> dict[str, str]:
    """asv class name -> operation name (perf_tests/benchmarks.py names a class after its
    operation: softmax -> Softmax, row_sum -> RowSum)."""
    from kernels.core import registry

    return {registry.benchmark_class(op.name): op.name for op in registry.operations()}


def key_of(benchmark: str, params: Sequence[str], ops: dict[str, str]):
    """(operation, implementation, case, direction) of a compare row."""
    class_name = benchmark.split(".")[-2]
    impl, case, direction = (p.strip("'") for p in params)
    return ops[class_name], impl, case, direction


@dataclasses.dataclass(frozen=True)
class Decision:
    confirmed: bool
    ratios: tuple[float, ...]  # head / base, per round
    text: str


def _held(ratio: float, slower: bool) -> float:
    """A round's head / base the way the first pass read the row: > 1 where its change held."""
    return ratio if slower else 1 / ratio


def sm_clock(record: dict) -> float | None:
    """The median SM clock (MHz) a record's samples ran at; None where none was read."""
    known = [mhz for mhz in record.get("clocks") or () if mhz]
    return statistics.median(known) if known else None


def clock_factor(base: dict, head: dict, slower: bool = True) -> float:
    """How much of a round's change its clocks could explain: for a slowdown, the base's SM
    clock over the head's where the head ran more than CLOCK_TOLERANCE lower (for a speed-up,
    the head's over the base's); else 1."""
    base_mhz, head_mhz = sm_clock(base), sm_clock(head)
    if not base_mhz or not head_mhz:
        return 1.0
    factor = base_mhz / head_mhz if slower else head_mhz / base_mhz
    return factor if factor > 1 + CLOCK_TOLERANCE else 1.0


def decide(ratios: Sequence[float], gap: float, rounds: int, slower: bool = True,
           factors: Sequence[float] = ()) -> Decision:
    """Confirmed when every one of `rounds` rounds (head / base) reads the head slower (or,
    with `slower` False, faster) by more than half the gap and their geometric mean by more
    than the gap, each round's change first divided by its clock factor (`clock_factor`, 1
    where not given). One round at or under half the gap decides it (not confirmed), however
    many are missing; otherwise a missing round confirms nothing, so the first pass's verdict
    stands (see `confirm`)."""
    factors = list(factors) + [1.0] * (len(ratios) - len(factors))
    shown, given = " ".join(f"{r:.3f}" for r in ratios), tuple(ratios)
    pairs = list(zip(ratios, factors, strict=True))
    clocked = [f"round {i + 1} counted as {_held(r, slower) / f:.3f} in cycles (clocks "
               f"{f - 1:.0%} apart)" for i, (r, f) in enumerate(pairs) if f > 1]
    if clocked:
        shown += " [" + "; ".join(clocked) + "]"
    ratios = [_held(r, slower) / f for r, f in pairs]
    if any(r <= 1 + gap / 2 for r in ratios) and len(ratios) < rounds:
        return Decision(False, given,
                        f"{shown} (a round under half the gap: not measured further)")
    if len(ratios) < rounds:
        return Decision(True, given, f"{shown} (re-measurement incomplete: "
                                     f"{len(ratios)} of {rounds} rounds)".strip())
    mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
    confirmed = min(ratios) > 1 + gap / 2 and mean > 1 + gap
    return Decision(confirmed, given, f"{shown} (mean {mean if slower else 1 / mean:.3f})")


def _median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def confirm(rows: list, base: str, head: str, *, rounds: int = ROUNDS,
            log: Callable[[str], None] = _print, measure=None) -> list:
    """`rows` with each "slower" and "faster" time_ row measured again in `rounds`
    interleaved rounds of base and head; a row not confirmed becomes "same (not confirmed)"
    (a faster row is confirmed as a slower one is, the other way: a chance reading must not
    pass for a speed-up either).

    measure(commit, keys, index) -> {key: record} takes round `index` (from 0) of one
    commit's keys (default: a Pool of live workers over the commits' source trees, closed at
    the end). A record {"stored": True} was measured earlier (beside the first pass).
    """
    flagged = [row for row in rows if row.verdict in CONFIRMED_VERDICTS
               and row.benchmark.rsplit(".", 1)[-1].startswith("time_")]
    if not flagged or rounds < 1:
        return rows
    ops = class_names()
    keys = list(dict.fromkeys(key_of(row.benchmark, row.params, ops) for row in flagged))
    pool = None
    if measure is None:
        pool = Pool(confirm_dir() / "journals" / time.strftime("%Y%m%d-%H%M%S"), log=log,
                    keys={base: keys, head: keys})
        measure = pool.measure
    gaps, slower = {}, {}
    for row in flagged:
        key = key_of(row.benchmark, row.params, ops)
        gaps[key] = row.gap or 0.0  # one time_ row per parameter set
        slower[key] = row.verdict == "slower"
    counts = ", ".join(f"{n} {word}" for word in CONFIRMED_VERDICTS
                       if (n := sum(row.verdict == word for row in flagged)))
    log(f"confirming {counts} row(s): {rounds} interleaved round(s) of "
        f"{base[:8]} and {head[:8]}, {len(keys)} parameter set(s) each")
    started = time.monotonic()
    # records[commit][key][round]: a side that failed in a round leaves that round out.
    records: dict[str, dict[tuple, dict[int, dict]]] = {base: {}, head: {}}
    taken = stored = 0
    active = list(keys)
    try:
        for index in range(rounds):
            for commit in ((base, head) if index % 2 == 0 else (head, base)):
                log(f"  round {index + 1}: {commit[:8]}")
                for key, record in measure(commit, active, index).items():
                    stored += bool(record.get("stored"))
                    taken += not record.get("stored")
                    if record.get("event") == "done":
                        records[commit].setdefault(key, {})[index] = record
            # A round at or under half the gap already decides (see decide): no more rounds.
            settled = [key for key in active if index in records[base].get(key, {})
                       and index in records[head].get(key, {})
                       and _round_change(records[base][key][index], records[head][key][index],
                                         slower[key]) <= 1 + gaps[key] / 2]
            active = [key for key in active if key not in settled]
            if not active:
                if index + 1 < rounds:
                    log(f"  every parameter set read under half its gap by round {index + 1}: "
                        f"no more rounds")
                break
    finally:
        if pool is not None:
            pool.close()
    log(f"confirmation took {time.monotonic() - started:.0f} s: {taken} measurement(s) now"
        + (f", {stored} taken beside the first pass" if stored else ""))
    out = []
    for row in rows:
        if row not in flagged:
            out.append(row)
            continue
        key = key_of(row.benchmark, row.params, ops)
        measured_base, measured_head = records[base].get(key, {}), records[head].get(key, {})
        both = [i for i in sorted(measured_base) if i in measured_head]
        ratios = [_median(measured_head[i]["samples"]) / _median(measured_base[i]["samples"])
                  for i in both]
        factors = [clock_factor(measured_base[i], measured_head[i], row.verdict == "slower")
                   for i in both]
        decision = decide(ratios, row.gap or 0.0, rounds, slower=row.verdict == "slower",
                          factors=factors)
        out.append(dataclasses.replace(
            row, confirmed=decision.text,
            verdict=row.verdict if decision.confirmed else "same (not confirmed)"))
    return out


def _round_change(base: dict, head: dict, slower: bool) -> float:
    """A round's change the way the first pass read it, its clock factor taken out."""
    ratio = _median(head["samples"]) / _median(base["samples"])
    return _held(ratio, slower) / clock_factor(base, head, slower)


class Pool:
    """One live measuring worker per commit (perf_tests/measuring.py's LiveWorker over the
    commit's source tree, this interpreter), each started at its first measurement and kept
    for every later one; journals under `root`/<commit>/. `keys[commit]`: what each may be
    asked (it starts the backends they need). Rounds measured elsewhere (`keep`) are served
    from memory, marked {"stored": True}."""

    def __init__(self, root: pathlib.Path, *, keys: dict[str, list], dashboard: bool = False,
                 log: Callable[[str], None] = _print, spawn=None,
                 worker_command: Sequence[str] | None = None):
        self.root, self.keys, self.dashboard, self.log = root, keys, dashboard, log
        self.spawn, self.worker_command = spawn, worker_command
        self.workers: dict[str, object] = {}
        self.kept: dict[tuple[str, tuple, int], dict] = {}

    def worker(self, commit: str):
        """`commit`'s live worker (made, not yet started, on first use)."""
        if commit not in self.workers:
            from perf_tests import measuring

            tree = source_tree(commit)
            path = os.pathsep.join(filter(None, [str(tree.resolve()),
                                                 os.environ.get("PYTHONPATH")]))
            self.workers[commit] = measuring.LiveWorker(
                commit[:8], self.root / commit[:12], self.keys[commit], python=sys.executable,
                env={**os.environ, "PYTHONPATH": path}, dashboard=self.dashboard,
                log=self.log, spawn=self.spawn, worker_command=self.worker_command)
        return self.workers[commit]

    def journal(self, commit: str, key: tuple, pass_name: str) -> pathlib.Path:
        """Where `pass_name`'s records of `key` go: the first pass's beside the operation's
        name (what kernels.bench.recover writes asv results from), the rounds' apart."""
        folder = self.root / commit[:12] / ("rounds" if pass_name == "confirm" else "")
        folder.mkdir(parents=True, exist_ok=True)  # the worker appends, never makes folders
        return folder / f"{key[0]}.jsonl"

    def keep(self, commit: str, key: tuple, index: int, record: dict) -> None:
        self.kept[(commit, key, index)] = {**record, "stored": True}

    def measure(self, commit: str, keys: list, index: int) -> dict:
        """Round `index` of `keys` on `commit`: each kept record, else measured now (and
        kept: asked again, the same round is served, not measured twice)."""
        out = {}
        for key in keys:
            kept = self.kept.get((commit, key, index))
            if kept is None:
                kept = self.worker(commit).measure(key, self.journal(commit, key, "confirm"),
                                                   "confirm", index + 1)
                self.keep(commit, key, index, kept)
                out[key] = kept
            else:
                out[key] = kept
        return out

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
