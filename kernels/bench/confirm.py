"""A slowdown confirmed before it fails the gate: base and head measured again, interleaved.

A first pass (asv on the base, then on the head) can be fooled by what differs between two
processes or two stretches of minutes: a throttled spell, a busy neighbour on a shared GPU,
buffers placed differently. So each row the compare calls "slower" (or "faster": a chance
reading must not pass for a speed-up either) is measured again in
`rounds` rounds of base and head alternately (B H, H B, B H, ...), every measurement a fresh
worker process of the benchmark suite's own measuring code (perf_tests/measuring.py, this
checkout's) over that commit's `kernels` (a `git archive` of the commit on PYTHONPATH, so
both commits are at hand at once, as asv's one environment per run cannot give).

The slowdown stands only if every round reads the head slower than its base by more than
half the row's gap and the rounds' geometric mean exceeds the whole gap (a speed-up, the same
the other way); otherwise the row
becomes "same (not confirmed)". A parameter set that one round reads at or under half its
gap is settled there and measured no more, so an A/A run's chance flags cost one round (two
worker processes), not three. A real regression shows in every round; a process or a spell
that happened to be slow shows in one. The per-round ratios go in the compare table.
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


def decide(ratios: Sequence[float], gap: float, rounds: int, slower: bool = True) -> Decision:
    """Confirmed when every one of `rounds` rounds (head / base) reads the head slower (or,
    with `slower` False, faster) by more than half the gap and their geometric mean by more
    than the gap. One round at or under half the gap decides it (not confirmed), however many
    are missing; otherwise a missing round confirms nothing, so the first pass's verdict
    stands (see `confirm`)."""
    shown, given = " ".join(f"{r:.3f}" for r in ratios), tuple(ratios)
    ratios = [_held(r, slower) for r in ratios]
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

    measure(commit, keys, journal) -> {key: record} takes one round's measurement of one
    commit (default: measuring.ensure_measured in a worker over the commit's source tree).
    """
    flagged = [row for row in rows if row.verdict in CONFIRMED_VERDICTS
               and row.benchmark.rsplit(".", 1)[-1].startswith("time_")]
    if not flagged or rounds < 1:
        return rows
    ops = class_names()
    keys = list(dict.fromkeys(key_of(row.benchmark, row.params, ops) for row in flagged))
    measure = measure or _measure_in_tree
    gaps, slower = {}, {}
    for row in flagged:
        key = key_of(row.benchmark, row.params, ops)
        gaps[key] = row.gap or 0.0  # one time_ row per parameter set
        slower[key] = row.verdict == "slower"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    counts = ", ".join(f"{n} {word}" for word in CONFIRMED_VERDICTS
                       if (n := sum(row.verdict == word for row in flagged)))
    log(f"confirming {counts} row(s): {rounds} interleaved round(s) of "
        f"{base[:8]} and {head[:8]}, {len(keys)} parameter set(s) each")
    started = time.monotonic()
    # medians[commit][key][round]: a side that failed in a round leaves that round out.
    medians: dict[str, dict[tuple, dict[int, float]]] = {base: {}, head: {}}
    active = list(keys)
    for index in range(rounds):
        for commit in ((base, head) if index % 2 == 0 else (head, base)):
            journal = confirm_dir() / "journals" / stamp / f"round{index + 1}-{commit[:12]}.jsonl"
            log(f"  round {index + 1}: {commit[:8]}")
            for key, record in measure(commit, active, journal).items():
                if record.get("event") == "done":
                    medians[commit].setdefault(key, {})[index] = _median(record["samples"])
        # A round at or under half the gap already decides (see decide): measure it no more.
        settled = [key for key in active if index in medians[base].get(key, {})
                   and index in medians[head].get(key, {})
                   and _held(medians[head][key][index] / medians[base][key][index],
                             slower[key]) <= 1 + gaps[key] / 2]
        active = [key for key in active if key not in settled]
        if not active:
            if index + 1 < rounds:
                log(f"  every parameter set read under half its gap by round {index + 1}: "
                    f"no more rounds")
            break
    log(f"confirmation took {time.monotonic() - started:.0f} s")
    out = []
    for row in rows:
        if row not in flagged:
            out.append(row)
            continue
        key = key_of(row.benchmark, row.params, ops)
        measured_base, measured_head = medians[base].get(key, {}), medians[head].get(key, {})
        ratios = [measured_head[i] / measured_base[i] for i in sorted(measured_base)
                  if i in measured_head]
        decision = decide(ratios, row.gap or 0.0, rounds, slower=row.verdict == "slower")
        out.append(dataclasses.replace(
            row, confirmed=decision.text,
            verdict=row.verdict if decision.confirmed else "same (not confirmed)"))
    return out


def _measure_in_tree(commit: str, keys: list, journal: pathlib.Path) -> dict:
    """One round of one commit: this checkout's measuring worker over the commit's files."""
    from perf_tests import measuring

    tree = source_tree(commit)
    path = os.pathsep.join(filter(None, [str(tree.resolve()), os.environ.get("PYTHONPATH")]))
    return measuring.ensure_measured(keys, journal, python=sys.executable,
                                     env={**os.environ, "PYTHONPATH": path})
