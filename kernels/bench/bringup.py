"""A GPU model brought up in one run: its ceilings, floors, tuned configs, noise floors and asv
history measured on the GPU in hand and written as data, for review as a diff.

`python -m kernels bringup` (kernels/cli/bringup.py) runs the steps below in order; each
writes its result when done, into the model's folder (`kernels/models/<model>/`,
kernels.core.modeldata) and the files beside the code that have a model's key already:

  ceilings  the measured ceilings (a large copy, a large product per dtype) by the suite's
            clock (kernels.roofline.ceilings.measured), stored as `ceilings.json`
  tune      every tunable kernel (kernels.core.tuning) timed over its grid, the best config
            recorded under the model's key in kernels/ops/<op>/tuned.json (before perf, so that
            the floors measure the configs that ship)
  perf      every perf item (kernels.bench.perfcheck.perf_items) measured alone on the
            device in `runs` fresh processes, the kernel and its baselines interleaved in
            rounds (perfcheck.interleave); each item's rounds recorded as it finishes
  floors    each perf item's floor from its measured values (`derive`), written into
            `floors.json` (`decide`: a floor never goes down unless asked, `--allow-loosen`)
  noise     asv's run-to-run shift of each time_ benchmark (`kernels noise-floor`), one
            benchmark class at a time, stored as `noise-floors.json`, which the gate reads
            where a machine of this model has learned none (asv_tools.load_floors)
  history   asv on `commits` commits of main spread over `window` (kernels.bench.history
            run --spread), the results copied into perf_tests/results/asv/<model>/

What each step did is recorded in `bringup.json` (the session: its start, commit and steps
done, and every perf run's measurements, which the floor notes cite). A step cut off (a
10-minute device call, `--deadline`) keeps what it finished: perf resumes at the next item
of its run, tune at the next kernel, noise at the next benchmark class, history at the next
commit; a later invocation continues the session until every step is done, and one after
that starts a new session (a refinement: floors may rise, and only fall when asked).

Everything that touches the GPU runs in a child process (a worker: kernels.cli.bringup) that
appends one JSON line per event to a journal; this process reads the journal as it grows,
prints progress, records each finished item, and ends a worker whose item runs past its time
limit (each item's limit comes with its start event) or that outlives the deadline. So a
hang or a crash costs one item, and the parent never holds a CUDA context.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kernels.core import fingerprint, modeldata, vcs
from kernels.core.tables import table
from kernels.roofline import floors

# tune before perf: the floors are measured with the configs that ship. (The H200's first
# bring-up tuned after measuring; with its new Pallas-Triton bf16 tiles, best on the 8192^3
# tune case, the 4097x4095x4100 perf item read 1.016x XLA, where the runs before the tune
# had read 1.173-1.178x and written a floor of 1.13.)
STEPS = ("ceilings", "tune", "perf", "floors", "noise", "history")
GPU_STEPS = ("ceilings", "tune", "perf", "noise", "history")

# -- floors from measurements -------------------------------------------------------------------

# The margin under the lowest measured value: SPREAD_FACTOR times the widest relative spread
# seen (between the runs' medians, and between the rounds of one run), within
# [MIN_MARGIN, MAX_MARGIN]. The range of a few values underestimates the spread of many (six
# normal draws span about 2.5 sigma, so a floor one range under their lowest sits about 4
# sigma under their mean: one flake in ~30000 checks per item); twice the range covers a
# spread measured low by half. MIN_MARGIN: a floor closer than 4% to its values fails on an
# ordinary day's drift of clocks and temperatures, and small changes are the gate's job
# (asv, ~2% resolution). MAX_MARGIN: a 15% slowdown (the issue's planted regressions) drops a
# ratio by 13%, so a margin past 10% would let it pass; an item whose spread asks for more
# is written at 10% and flagged noisy in the table, for a reviewer to look at.
SPREAD_FACTOR = 2.0
MIN_MARGIN = 0.04
MAX_MARGIN = 0.10
MIN_RUNS = 2
# A memory-bound kernel reaching this fraction of the datasheet roof is judged against the
# roof; below it (latency-bound small cases, two-pass wide rows far from it) and for
# compute-bound work, against the best baseline timed by the same clock, as the H100's hand-
# written floors chose.
ROOFLINE_KIND_MIN = 0.5
MARGIN_RULE = (f"{SPREAD_FACTOR:g} x the widest spread (between runs' medians, between one "
               f"run's rounds) under the lowest run, within [{MIN_MARGIN:.0%}, {MAX_MARGIN:.0%}]")


@dataclasses.dataclass(frozen=True)
class Derived:
    """A floor derived from measured values (`derive`).

    fraction: the floor; base: the lowest run's median over its rounds; spread_runs: the
    runs' highest median over their lowest, minus 1; spread_rounds: the widest one run's
    rounds spread (max/min - 1); margin: how far under `base` the floor sits; noisy: the
    spread asked for a wider margin than MAX_MARGIN.
    """

    fraction: float
    base: float
    spread_runs: float
    spread_rounds: float
    margin: float
    noisy: bool

    @property
    def spread(self) -> float:
        return max(self.spread_runs, self.spread_rounds)


def derive(runs: Sequence[Sequence[float]]) -> Derived:
    """The floor for values measured in `runs` (per run, one value per round: a fraction of
    the roofline or a baseline's time over ours), with the margin of `MARGIN_RULE`."""
    runs = [list(values) for values in runs if values]
    if len(runs) < MIN_RUNS:
        raise ValueError(f"runs: expected values from at least {MIN_RUNS} runs (their spread "
                         f"is the margin), got {len(runs)}")
    if any(value <= 0 or not math.isfinite(value) for values in runs for value in values):
        raise ValueError(f"runs: expected positive finite values, got {runs}")
    medians = [statistics.median(values) for values in runs]
    base = min(medians)
    spread_runs = max(medians) / base - 1
    spread_rounds = max(max(values) / min(values) - 1 for values in runs)
    wanted = SPREAD_FACTOR * max(spread_runs, spread_rounds)
    margin = min(max(wanted, MIN_MARGIN), MAX_MARGIN)
    # Rounded down to 3 places, never above what the margin gives; within Floor's bounds.
    fraction = min(math.floor(base * (1 - margin) * 1000) / 1000, 1.5)
    return Derived(fraction=max(fraction, 0.001), base=base, spread_runs=spread_runs,
                   spread_rounds=spread_rounds, margin=margin, noisy=wanted > MAX_MARGIN)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the perf runs measured of one item, in the terms of its floor: per run, the
    value of each round (a fraction of the datasheet roofline, or the peer's median over the
    kernel's, the best same-clock baseline's of that round where `baseline` is None)."""

    item: str
    op: str
    impl: str
    case: str
    direction: str
    against: str
    baseline: str | None
    runs: tuple[tuple[float, ...], ...]
    method: str


def _round_values(record: Mapping[str, Any], against: str, peer: str | None) -> list[float]:
    values = []
    for one in record["rounds"]:
        if against == "roofline":
            if one.get("roofline"):
                values.append(float(one["roofline"]))
            continue
        peers = [s for name, s in one.get("baselines", {}).items() if peer in (None, name)]
        if peers and one.get("kernel"):
            values.append(min(peers) / one["kernel"])
    return values


def choose_kind(item: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                old: floors.Floor | None) -> tuple[str, str | None]:
    """(against, baseline) of an item's floor: its model's floor already there keeps its kind
    (a reviewed choice, and the never-loosen rule compares like with like); else the roofline
    for a memory-bound kernel at ROOFLINE_KIND_MIN of it or more, else the best baseline of
    the kernel's precision (the perf worker records no other in a round's baselines)."""
    if old is not None:
        return old.against, old.baseline
    fractions = [one["roofline"] for record in records for one in record["rounds"]
                 if one.get("roofline")]
    memory = all(record.get("bound") == "memory" for record in records)
    if memory and fractions and statistics.median(fractions) >= ROOFLINE_KIND_MIN:
        return "roofline", None
    return "baseline", None


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the floors step does with one perf item's floor.

    status: "new" (no floor before), "tightened" (higher than before), "same", "kept" (the
    derived floor is lower: the old one stays, unless `--allow-loosen`), "loosened" (lower,
    allowed), or "none" (no floor could be derived: `why`).
    """

    item: str
    status: str
    old: floors.Floor | None
    new: floors.Floor | None
    derived: Derived | None = None
    evidence: Evidence | None = None
    why: str = ""

    @property
    def written(self) -> bool:
        return self.status in ("new", "tightened", "same", "loosened")


def _describe_values(values: Iterable[float], against: str) -> str:
    values = list(values)
    unit = " of the roof" if against == "roofline" else "x"
    return f"{min(values):.3f}-{max(values):.3f}{unit}"


def decide(item: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
           old: floors.Floor | None, *, allow_loosen: bool, date: str, commit: str,
           driver: str | None, session: str) -> Decision:
    """The floor of perf item `item` ({"id", "op", "impl", "case", "direction"}) from its
    runs' `records` (perf step, one per run that measured it), against `old`, the floor its
    model's table gives it now (None: none). A floor never goes down unless `allow_loosen`."""
    item_id = item["id"]
    ok = [record for record in records if "rounds" in record]
    if len(ok) < MIN_RUNS:
        failed = [record.get("failed", "") for record in records if "rounds" not in record]
        why = (f"measured in {len(ok)} run(s), a floor needs {MIN_RUNS}" +
               (f"; failed: {failed[0][:120]}" if failed else ""))
        return Decision(item_id, "none", old, None, why=why)
    methods = sorted({record["method"] for record in ok})
    if len(methods) > 1:
        return Decision(item_id, "none", old, None,
                        why=f"runs timed by different clocks ({', '.join(methods)})")
    against, peer = choose_kind(item, ok, old)
    runs = tuple(tuple(_round_values(record, against, peer)) for record in ok)
    evidence = Evidence(item=item_id, op=item["op"], impl=item["impl"], case=item["case"],
                        direction=item["direction"], against=against, baseline=peer,
                        runs=runs, method=methods[0])
    if sum(1 for values in runs if values) < MIN_RUNS:
        wanted = "the datasheet roofline" if against == "roofline" else \
            (f"baseline {peer}" if peer else "a baseline of its precision")
        return Decision(item_id, "none", old, None, evidence=evidence,
                        why=f"no value against {wanted} timed by {methods[0]} in "
                            f"{MIN_RUNS} runs")
    derived = derive(runs)
    fraction = derived.fraction
    if old is None:
        status = "new"
    elif math.isclose(fraction, old.fraction):
        status = "same"
    elif fraction > old.fraction:
        status = "tightened"
    else:
        status = "loosened" if allow_loosen else "kept"
    if status == "kept":
        return Decision(item_id, status, old, None, derived, evidence,
                        why=f"derived {fraction:.3f} < {old.fraction:.3f}: kept (--allow-loosen "
                            f"lowers it)")
    values = [value for values in runs for value in values]
    reason = (f"bring-up {date} ({commit[:8]}): {_describe_values(values, against)} over "
              f"{len(runs)} runs x {max(len(v) for v in runs)} rounds ({methods[0]}); "
              f"margin {derived.margin:.1%} from a {derived.spread:.1%} spread"
              + ("; noisy" if derived.noisy else ""))
    note = {"session": session, "date": date, "commit": commit, "driver": driver,
            "clock": methods[0], "measured": [list(v) for v in runs],
            "per_run": [statistics.median(v) for v in runs],
            "spread_runs": round(derived.spread_runs, 6),
            "spread_rounds": round(derived.spread_rounds, 6),
            "margin": round(derived.margin, 6), "margin_rule": MARGIN_RULE,
            "derived": fraction, "previous": old.fraction if old else None,
            "status": status, "noisy": derived.noisy}
    new = floors.Floor(op=item["op"], impl=item["impl"], against=against, fraction=fraction,
                       reason=reason, direction=item["direction"], case=item["case"],
                       baseline=peer, note=note)
    return Decision(item_id, status, old, new, derived, evidence)


def _same_place(entry: Mapping[str, Any], floor: floors.Floor) -> bool:
    """Whether `entry` is the item-specific entry `floor` replaces (one implementation, the
    same case and direction)."""
    return (entry.get("op") == floor.op and entry.get("impl") == floor.impl
            and entry.get("case") == floor.case and entry.get("direction") == floor.direction)


def apply(data: Mapping[str, Any] | None, decisions: Sequence[Decision], *, device: str,
          model: str) -> dict[str, Any]:
    """The model's floors file `data` (None: a new one) with every written decision's floor:
    in the place of the entry for the same item, or appended. Entries no decision names stay
    as they were, word for word (the hand-written ones, shared entries, comments)."""
    data = dict(data or {"device": device, "floors": []})
    if data.get("device") != device:
        raise ValueError(f"floors of {model}: expected the file of {device!r}, got the file of "
                         f"{data.get('device')!r}")
    entries = [dict(entry) for entry in data.get("floors", [])]
    for decision in decisions:
        if not decision.written:
            continue
        entry = floors.to_entry(decision.new)
        where = next((i for i, old in enumerate(entries) if _same_place(old, decision.new)),
                     None)
        if where is None:
            entries.append(entry)
        else:
            entries[where] = entry
    return {**data, "floors": entries}


# -- the review: a table and a diff ------------------------------------------------------------

def _fraction(floor: floors.Floor | None) -> str:
    return "-" if floor is None else f"{floor.fraction:.3f}"


def floor_table(decisions: Sequence[Decision]) -> str:
    """Per perf item: its floor before and after, the status, what each run measured
    (medians over rounds), the spread and the margin."""
    rows = []
    for d in decisions:
        evidence = d.evidence
        measured = "-" if evidence is None or not any(evidence.runs) else " ".join(
            f"{statistics.median(values):.3f}" for values in evidence.runs if values)
        kind = "-" if evidence is None else (
            "roofline" if evidence.against == "roofline" else
            f"baseline {evidence.baseline}" if evidence.baseline else "best baseline")
        status = d.status + (" (noisy)" if d.derived and d.derived.noisy else "")
        rows.append([d.item, kind, _fraction(d.old),
                     _fraction(d.new) if d.new else (f"({d.derived.fraction:.3f})"
                                                     if d.derived else "-"),
                     status, measured,
                     f"{d.derived.spread:.1%}" if d.derived else "-",
                     f"{d.derived.margin:.1%}" if d.derived else "-",
                     d.why])
    return table(rows, ["floor", "against", "old", "new", "status", "measured per run",
                        "spread", "margin", "why"])


def data_paths(model: str, root: pathlib.Path) -> list[pathlib.Path]:
    """The files and folders a bring-up of `model` writes, relative to the checkout `root`."""
    models = modeldata.ROOT.relative_to(root) if modeldata.ROOT.is_relative_to(root) \
        else pathlib.Path("kernels/models")
    return [models / model, pathlib.Path("kernels/ops/*/tuned.json"),
            pathlib.Path("perf_tests/results/asv") / model,
            pathlib.Path("perf_tests/results/asv/benchmarks.json")]


def review_diff(root: pathlib.Path, paths: Sequence[pathlib.Path]) -> str:
    """What the bring-up changed under `paths`, as git shows it against HEAD: the diff of every
    tracked file, new files in full, and only a summary of asv's result files (each is
    thousands of lines of numbers). One line where `root` is not a git checkout."""
    if vcs.git(root, "rev-parse", "--git-dir", check=False).returncode:
        return (f"{root} is not a git checkout: no diff to show (.ci/device/bringup.sh packs "
                f"the files written into $OUT)")
    names = [str(p) for p in paths]
    results = [n for n in names if n.startswith("perf_tests/results/")]
    data = [n for n in names if n not in results]
    parts = []
    stat = vcs.git(root, "diff", "--stat", "HEAD", "--", *names, check=False).stdout.strip()
    untracked = vcs.git(root, "ls-files", "--others", "--exclude-standard", "--", *names,
                        check=False).stdout.split()
    if stat:
        parts.append(stat)
    if untracked:
        parts.append("new files:\n" + "\n".join(f"  {name}" for name in untracked))
    diff = vcs.git(root, "diff", "HEAD", "--", *data, check=False).stdout.strip()
    if diff:
        parts.append(diff)
    for name in untracked:
        if any(name.startswith(r) for r in results):
            continue
        shown = vcs.git(root, "diff", "--no-index", "--", "/dev/null", name,
                        check=False).stdout.strip()
        if shown:
            parts.append(shown)
    return "\n\n".join(parts) or "nothing changed in the data files"


# -- the session record --------------------------------------------------------------------------

def _now(clock) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.time()))


def new_session(state: Mapping[str, Any] | None, *, device: str, commit: str, runs: int,
                rounds: int, clock) -> dict[str, Any]:
    """A fresh session record, keeping a line for each earlier session."""
    previous = list((state or {}).get("previous", []))
    session = (state or {}).get("session")
    if session:
        previous.append({"id": session["id"], "commit": session["commit"],
                         "steps": sorted(session.get("steps", {}))})
    return {"device": device, "previous": previous,
            "session": {"id": _now(clock), "commit": commit, "runs": runs, "rounds": rounds,
                        "steps": {}, "perf": {"items": {}, "runs": {}}, "tune": {},
                        "noise": {}, "history": {}}}


def session_for(state: Mapping[str, Any] | None, *, device: str, commit: str, runs: int,
                rounds: int, restart: bool, clock) -> tuple[dict[str, Any], str]:
    """(state, what happened): the open session continued, or a new one where there is none,
    the last one finished every step, `restart` asks, or the record is another device's."""
    if state and state.get("device") not in (None, device):
        raise ValueError(f"bring-up record of {state.get('device')!r} cannot be continued on "
                         f"{device!r}")
    session = (state or {}).get("session")
    if session and not restart and set(session.get("steps", {})) < set(STEPS):
        state = dict(state)
        # More runs asked for than the session planned: the perf step is open again.
        if runs > session["runs"]:
            session["runs"] = runs
            session["steps"].pop("perf", None)
            session["steps"].pop("floors", None)
        done = ", ".join(s for s in STEPS if s in session["steps"]) or "none"
        return state, f"continuing the session of {session['id']} (steps done: {done})"
    why = "restart asked" if restart and session else \
        ("the last session finished: refining" if session else "first bring-up of this model")
    return new_session(state, device=device, commit=commit, runs=runs, rounds=rounds,
                       clock=clock), f"new session ({why})"


# -- running workers ------------------------------------------------------------------------------

POLL_S = 0.5
GRACE_S = 30.0  # between the SIGINT that asks a worker (and asv under it) to stop, and SIGKILL


def write_event(path: pathlib.Path, event: Mapping[str, Any]) -> None:
    """Append one event to a worker's journal, flushed to disk before it returns (what was
    measured survives the worker being killed the next moment)."""
    with open(path, "a") as journal:
        journal.write(json.dumps(event) + "\n")
        journal.flush()
        os.fsync(journal.fileno())


class _Reader:
    """The events appended to a journal since the last read (a line still being written is
    left for the next read)."""

    def __init__(self, path: pathlib.Path):
        self.path, self.offset = path, 0

    def events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path) as journal:
            journal.seek(self.offset)
            text = journal.read()
        complete = text[:text.rfind("\n") + 1]
        self.offset += len(complete.encode())
        found = []
        for line in complete.splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return found


def _interruptible() -> None:
    """In the child before it runs: SIGINT at its default. A command started in the background
    by a shell (`make bringup &`, nohup, CI) inherits SIGINT ignored, and Python keeps it
    ignored: the SIGINT `_stop` sends would then wait GRACE_S for nothing (seen: 31 s for a
    worker hung in a sleep)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(command: Sequence[str], *, cwd: pathlib.Path, log: pathlib.Path):
    output = open(log, "a")
    try:
        return subprocess.Popen(list(command), cwd=cwd, stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_interruptible)
    finally:
        output.close()


def _stop(process, clock, signals: Callable[[Any, int], None]) -> None:
    """SIGINT to the worker's process group, SIGKILL after GRACE_S."""
    signals(process, signal.SIGINT)
    waited = 0.0
    while process.poll() is None and waited < GRACE_S:
        clock.sleep(POLL_S)
        waited += POLL_S
    if process.poll() is None:
        signals(process, signal.SIGKILL)
        process.wait()


def _signal_group(process, number: int) -> None:
    try:
        os.killpg(process.pid, number)
    except ProcessLookupError:  # it ended meanwhile
        pass


@dataclasses.dataclass
class Outcome:
    """How a worker ended: `cut` (the deadline), `hung` (the item past its limit), or exit."""

    status: int | None
    cut: bool = False
    hung: str | None = None  # the item that ran past its limit
    running: str | None = None  # the item started and not finished when the worker ended
    seconds: float = 0.0
    limit_s: float | None = None  # the hung item's limit


@dataclasses.dataclass
class Runner:
    """Starts workers and watches them: `clock` (the time module; tests give a fake),
    `spawn(command, cwd=, log=)` (subprocess.Popen-like; tests give fake processes) and
    `signals(process, number)`."""

    clock: Any = time
    spawn: Callable[..., Any] = _spawn
    signals: Callable[[Any, int], None] = _signal_group

    def run(self, command: Sequence[str], *, cwd: pathlib.Path, log: pathlib.Path,
            journal: pathlib.Path | None, on_event: Callable[[dict[str, Any]], None],
            deadline: float | None, limit_s: float | None = None) -> Outcome:
        """Run `command` until it exits, an item runs past the limit its start event gave
        (`limit_s` for the whole run where no journal is kept), or `deadline` (the clock's
        monotonic time) passes; every journal event goes to `on_event` as it comes."""
        started = self.clock.monotonic()
        reader = _Reader(journal) if journal else None
        process = self.spawn(command, cwd=cwd, log=log)
        current: tuple[str, float, float] | None = None  # item, started, limit
        outcome = Outcome(status=None)

        def drain() -> None:
            nonlocal current
            for event in reader.events() if reader else ():
                if event.get("event") == "start":
                    current = (event["id"], self.clock.monotonic(),
                               float(event.get("limit_s") or math.inf))
                elif event.get("id") is not None and current and event["id"] == current[0]:
                    current = None
                on_event(event)

        while True:
            status = process.poll()
            drain()
            if status is not None:
                outcome.status = status
                break
            now = self.clock.monotonic()
            if deadline is not None and now >= deadline:
                _stop(process, self.clock, self.signals)
                drain()
                outcome.cut, outcome.status = True, process.poll()
                break
            if current and now - current[1] > current[2]:
                outcome.hung, outcome.limit_s = current[0], current[2]
                _stop(process, self.clock, self.signals)
                drain()
                outcome.status = process.poll()
                break
            if limit_s is not None and now - started > limit_s:
                outcome.hung = "(the whole run)"
                _stop(process, self.clock, self.signals)
                outcome.status = process.poll()
                break
            self.clock.sleep(POLL_S)
        outcome.running = current[0] if current else None
        outcome.seconds = self.clock.monotonic() - started
        return outcome


# -- the steps -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Context:
    """One invocation of the bring-up.

    worker: the command that starts a worker (`[python, -m, kernels, bringup, --worker]`);
    the step, its options and a journal path follow it. root: the checkout (asv, git);
    data_root: the models' folder (kernels/models). deadline: the clock's monotonic time
    after which no work starts and running workers are cut.
    """

    model: str
    device: str
    driver: str | None
    commit: str
    root: pathlib.Path
    worker: list[str]
    runs: int = 2
    rounds: int = 3
    budget_s: float = 1.0
    allow_loosen: bool = False
    deadline: float | None = None
    history_commits: int = 12
    history_window: int = 140
    history_bench: str = "time_device"
    noise_runs: int = 2
    runner: Runner = dataclasses.field(default_factory=Runner)
    data_root: pathlib.Path | None = None
    log: Callable[[str], None] = print
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    decisions: list[Decision] = dataclasses.field(default_factory=list)

    @property
    def clock(self):
        return self.runner.clock

    @property
    def session(self) -> dict[str, Any]:
        return self.state["session"]

    @property
    def work_dir(self) -> pathlib.Path:
        """Journals and worker logs (git-ignored): `.bringup/<model>/`."""
        path = self.root / ".bringup" / self.model
        path.mkdir(parents=True, exist_ok=True)
        return path

    def save(self) -> None:
        modeldata.write(self.model, modeldata.BRINGUP, self.state, self.data_root)

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock.monotonic()

    def out_of_time(self) -> bool:
        left = self.time_left()
        return left is not None and left <= 0


def _journal(ctx: Context, name: str) -> pathlib.Path:
    path = ctx.work_dir / f"{name}-{os.getpid()}-{int(ctx.clock.monotonic() * 1000)}.jsonl"
    path.unlink(missing_ok=True)
    return path


def run_items(ctx: Context, step: str, pending: list[str] | None, args: Sequence[str],
              on_done: Callable[[dict[str, Any]], None],
              on_failed: Callable[[str, str], None],
              on_items: Callable[[dict[str, Any]], None] | None = None) -> bool:
    """Workers of `step` over `pending` item ids (None: every item the worker knows) until
    each is done or failed, replacing a worker that hangs or dies; False if cut first."""
    pending = None if pending is None else list(pending)
    while pending is None or pending:
        if ctx.out_of_time():
            return False
        journal = _journal(ctx, step)
        only = journal.with_suffix(".only.json")  # the items this worker is to measure
        only.write_text(json.dumps(pending))
        settled: set[str] = set()

        def on_event(event: dict[str, Any], settled=settled) -> None:
            nonlocal pending
            kind = event.get("event")
            if kind == "items":
                if on_items:
                    on_items(event)
                if pending is None:
                    pending = [item["id"] for item in event["items"] if not item.get("skip")]
            elif kind == "done":
                on_done(event)
                settled.add(event["id"])
            elif kind == "failed":
                on_failed(event["id"], event.get("reason", "failed"))
                settled.add(event["id"])

        outcome = ctx.runner.run([*ctx.worker, step, "--journal", str(journal), "--only",
                                  str(only), *args], cwd=ctx.root,
                                 log=ctx.work_dir / f"{step}.log", journal=journal,
                                 on_event=on_event, deadline=ctx.deadline)
        if pending is None:
            raise RuntimeError(f"bringup {step}: the worker ended (exit {outcome.status}) before "
                               f"listing its items; see {ctx.work_dir / (step + '.log')}")
        if outcome.hung and outcome.hung in pending:
            on_failed(outcome.hung, f"ran past its time limit of {outcome.limit_s:.0f} s; the "
                                    f"worker was ended")
            settled.add(outcome.hung)
        elif outcome.running and not outcome.cut:
            on_failed(outcome.running, f"the worker died while measuring it (exit "
                                       f"{outcome.status}); see {step}.log")
            settled.add(outcome.running)
        pending = [item for item in pending if item not in settled]
        if outcome.cut:
            return False
        if pending and not settled:  # a worker that settles nothing would be started forever
            raise RuntimeError(f"bringup {step}: the worker ended (exit {outcome.status}) "
                               f"without measuring any of {len(pending)} item(s), first "
                               f"{pending[0]}; see {ctx.work_dir / (step + '.log')}")
    return True


def step_ceilings(ctx: Context) -> bool:
    found: dict[str, Any] = {}
    done = run_items(ctx, "ceilings", ["ceilings"], [],
                     on_done=lambda event: found.update(event),
                     on_failed=lambda item, why: found.update(failed=why))
    if not done:
        return False
    if "ceiling" not in found:
        raise RuntimeError(f"bringup ceilings: not measured ({found.get('failed')})")
    ceiling = found["ceiling"]
    if ceiling["device"] != ctx.device:
        raise RuntimeError(f"bringup ceilings: measured on {ceiling['device']!r}, not "
                           f"{ctx.device!r}")
    modeldata.write(ctx.model, modeldata.CEILINGS, {
        "device": ctx.device, "ceiling": ceiling, "fingerprint": found.get("fingerprint"),
        "date": _now(ctx.clock), "commit": ctx.commit, "session": ctx.session["id"]},
        ctx.data_root)
    bandwidth = ceiling["bandwidth"] / 1e9
    flops = ", ".join(f"{d} {v / 1e12:.0f} TFLOP/s" for d, v in sorted(ceiling["flops"].items()))
    ctx.log(f"ceilings of {ctx.device} ({ceiling.get('method')}): copy {bandwidth:.0f} GB/s; "
            f"{flops}")
    ctx.session["steps"]["ceilings"] = {"done": _now(ctx.clock)}
    return True


def _perf_summary(event: Mapping[str, Any]) -> str:
    rounds = event.get("rounds", [])
    if not rounds:
        return ""
    fractions = [r["roofline"] for r in rounds if r.get("roofline")]
    ratios = [min(r["baselines"].values()) / r["kernel"] for r in rounds if r.get("baselines")]
    parts = [f"{statistics.median(r['kernel'] for r in rounds) * 1e6:.1f} us"]
    if fractions:
        parts.append(f"{statistics.median(fractions):.3f} of the roof")
    if ratios:
        parts.append(f"{statistics.median(ratios):.3f}x the best baseline")
    return ", ".join(parts)


def step_perf(ctx: Context) -> bool:
    perf = ctx.session["perf"]
    runs = ctx.session["runs"]
    items = perf["items"]
    for run in range(1, runs + 1):
        done = perf["runs"].setdefault(str(run), {})
        pending = None if not items else [i for i, item in items.items()
                                          if not item.get("skip") and i not in done]
        if pending == []:
            continue
        count = [len(done)]

        def on_items(event: dict[str, Any]) -> None:
            for item in event["items"]:
                items.setdefault(item["id"], {k: item.get(k) for k in (
                    "op", "impl", "case", "direction", "skip", "limit_s")})
            ctx.save()

        def on_done(event: dict[str, Any], done=done, count=count, run=run) -> None:
            done[event["id"]] = {k: event[k] for k in ("method", "rounds", "bound", "errors",
                                                       "throttled", "seconds") if k in event}
            ctx.save()
            count[0] += 1
            total = sum(1 for item in items.values() if not item.get("skip"))
            ctx.log(f"perf run {run}/{runs} [{count[0]}/{total}] {event['id']}: "
                    f"{_perf_summary(event)} ({event.get('seconds', 0):.1f} s)")

        def on_failed(item: str, why: str, done=done, run=run) -> None:
            done[item] = {"failed": why}
            ctx.save()
            ctx.log(f"perf run {run}/{runs} {item}: FAILED {why}")

        finished = run_items(ctx, "perf", pending,
                             ["--run", str(run), "--rounds", str(ctx.session["rounds"]),
                              "--budget", str(ctx.budget_s)],
                             on_done=on_done, on_failed=on_failed, on_items=on_items)
        if not finished:
            return False
    ctx.session["steps"]["perf"] = {"done": _now(ctx.clock)}
    return True


def item_decisions(ctx: Context) -> list[Decision]:
    """Every measured perf item's decision, against this model's own floors (its file only)."""
    data = modeldata.read(ctx.model, modeldata.FLOORS, ctx.data_root)
    table_ = floors.parse(data, ctx.model)[1] if data else ()
    if data and data.get("device") != ctx.device:
        raise ValueError(f"floors of {ctx.model}: the file is {data.get('device')!r}'s, this is "
                         f"{ctx.device!r}")
    perf = ctx.session["perf"]
    decisions = []
    for item_id, item in perf["items"].items():
        if item.get("skip"):
            continue
        records = [run[item_id] for _, run in sorted(perf["runs"].items()) if item_id in run]
        old = floors.most_specific([f for f in table_ if f.matches(
            item["op"], item["impl"], item["case"], item["direction"])], item_id)
        decisions.append(decide({**item, "id": item_id}, records, old,
                                allow_loosen=ctx.allow_loosen, date=_now(ctx.clock)[:10],
                                commit=ctx.commit, driver=ctx.driver,
                                session=ctx.session["id"]))
    return decisions


def step_floors(ctx: Context) -> bool:
    if "perf" not in ctx.session["steps"]:
        raise ValueError("floors: needs the perf step's runs of this session first "
                         "(--steps perf)")
    decisions = item_decisions(ctx)
    data = modeldata.read(ctx.model, modeldata.FLOORS, ctx.data_root)
    written = apply(data, decisions, device=ctx.device, model=ctx.model)
    written.setdefault("sources", f"written by python -m kernels bringup on {ctx.device}: each "
                                  f"floor's note gives what every run measured")
    modeldata.write(ctx.model, modeldata.FLOORS, written, ctx.data_root)
    floors.reload(ctx.data_root)
    ctx.decisions = decisions
    counts = {}
    for d in decisions:
        counts[d.status] = counts.get(d.status, 0) + 1
    ctx.session["steps"]["floors"] = {"done": _now(ctx.clock), "counts": counts,
                                      "table": floor_table(decisions).splitlines()}
    ctx.log(floor_table(decisions))
    ctx.log("floors: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    return True


def _failure_recorder(ctx: Context, record: dict[str, Any], label: str
                      ) -> Callable[[str, str], None]:
    """A step's on_failed: the item's failure kept in the step's `record` and said."""
    def on_failed(item: str, why: str) -> None:
        record[item] = {"failed": why}
        ctx.save()
        ctx.log(f"{label} {item}: FAILED {why}")
    return on_failed


def _pending(record: dict[str, Any]) -> list[str] | None:
    """The items a step listed (`_items`) that its record has no result for yet; None
    before the step's worker first listed them (every item)."""
    return None if not record.get("_items") else \
        [i for i in record["_items"] if i not in record]


def step_tune(ctx: Context) -> bool:
    tune = ctx.session["tune"]
    known: list[str] = []

    def on_items(event: dict[str, Any]) -> None:
        known.extend(item["id"] for item in event["items"])

    def on_done(event: dict[str, Any]) -> None:
        tune[event["id"]] = {k: event.get(k) for k in ("config", "time_ms", "case", "path")}
        ctx.save()
        ctx.log(f"tune {event['id']}: best {event.get('config')} {event.get('time_ms', 0):.4f} "
                f"ms -> {event.get('path')}")

    finished = run_items(ctx, "tune", _pending(tune), [], on_done=on_done,
                         on_failed=_failure_recorder(ctx, tune, "tune"), on_items=on_items)
    if known:
        tune["_items"] = known
    if not finished:
        return False
    ctx.session["steps"]["tune"] = {"done": _now(ctx.clock)}
    return True


def step_noise(ctx: Context) -> bool:
    noise = ctx.session["noise"]

    def on_done(event: dict[str, Any]) -> None:
        noise[event["id"]] = {"floors": len(event.get("floors", {}))}
        shipped = modeldata.read(ctx.model, modeldata.NOISE_FLOORS, ctx.data_root) or {
            "device": ctx.device, "floors": {}, "learned": {}}
        shipped["floors"].update(event.get("floors", {}))
        for name in event.get("floors", {}):
            shipped["learned"][name] = {"commit": event.get("commit"), "runs": ctx.noise_runs,
                                        "date": _now(ctx.clock)[:10]}
        modeldata.write(ctx.model, modeldata.NOISE_FLOORS, shipped, ctx.data_root)
        ctx.save()
        widest = max(event.get("floors", {}).values(), default=0.0)
        ctx.log(f"noise floors of {event['id']}: {len(event.get('floors', {}))} rows, widest "
                f"{widest:.1%}")

    on_failed = _failure_recorder(ctx, noise, "noise floors of")
    pending = _pending(noise)
    known: list[str] = []
    finished = run_items(ctx, "noise", pending, ["--runs", str(ctx.noise_runs)],
                         on_done=on_done, on_failed=on_failed,
                         on_items=lambda event: known.extend(i["id"] for i in event["items"]))
    if known:
        noise["_items"] = known
    if not finished:
        return False
    ctx.session["steps"]["noise"] = {"done": _now(ctx.clock)}
    return True


def complete_commits(folder: pathlib.Path) -> tuple[int, int, list[str]]:
    """(commits with every benchmark class, commits with any, those classes) among asv's
    result files in `folder`: every class that any of its commits measured (an operation that
    did not exist yet, or failed to build, leaves a commit incomplete)."""
    files = sorted(p for p in folder.glob("*.json") if p.name != "machine.json") \
        if folder.is_dir() else []
    if not files:
        return 0, 0, []

    def classes(path: pathlib.Path) -> set[str]:
        results = json.loads(path.read_text()).get("results", {})
        return {name.split(".")[1] for name, row in results.items()
                if name.count(".") >= 2 and row and row[0] is not None
                and any(value is not None for value in (row[0] if isinstance(row[0], list)
                                                        else [row[0]]))}

    measured = [classes(path) for path in files]
    wanted = set().union(*measured)
    complete = sum(1 for found in measured if wanted <= found)
    return complete, len(files), sorted(wanted)


def shipped_results(root: pathlib.Path, model: str) -> pathlib.Path:
    return root / "perf_tests" / "results" / "asv" / model


def copy_results(source: pathlib.Path, target: pathlib.Path, listing_from: pathlib.Path,
                 listing_to: pathlib.Path) -> list[str]:
    """asv's result files of one machine from `source` to `target` (those it lacks or that
    differ), and the benchmark listing merged (a union, the new entries winning)."""
    copied = []
    if not source.is_dir():
        return copied
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.json")):
        into = target / path.name
        if not into.exists() or into.read_bytes() != path.read_bytes():
            shutil.copyfile(path, into)
            copied.append(path.name)
    if listing_from.is_file():
        merged = {**(json.loads(listing_to.read_text()) if listing_to.is_file() else {}),
                  **json.loads(listing_from.read_text())}
        listing_to.write_text(json.dumps(merged, indent=4, sort_keys=True) + "\n")
    return copied


def step_history(ctx: Context) -> bool:
    if vcs.git(ctx.root, "rev-parse", "--verify", "refs/heads/main", check=False).returncode:
        raise ValueError(f"history: needs a git checkout with a branch main (asv builds its "
                         f"commits); {ctx.root} has none")
    shipped = shipped_results(ctx.root, ctx.model)
    worktree = ctx.root / ".asv" / "history"
    listing = ctx.root / "perf_tests" / "results" / "asv" / "benchmarks.json"
    while True:
        complete, present, wanted = complete_commits(shipped)
        if complete >= ctx.history_commits:
            break
        if ctx.out_of_time():
            return False
        missing = ctx.history_commits - complete
        ctx.log(f"history of {ctx.model}: {complete} of {present} shipped commit(s) have every "
                f"benchmark class{' (' + ', '.join(wanted) + ')' if wanted else ''}; running "
                f"{missing} more")
        history = [sys.executable, "-m", "kernels.bench.history"]
        log = ctx.work_dir / "history.log"
        fetched = ctx.runner.run([*history, "fetch"], cwd=ctx.root, log=log, journal=None,
                                 on_event=lambda event: None, deadline=ctx.deadline)
        if fetched.cut:
            return False
        if fetched.status:
            raise RuntimeError(f"history: fetch failed (exit {fetched.status}); see {log}")
        # The shipped results into the fresh worktree, so their commits are not run again.
        copy_results(shipped, worktree / ctx.model, listing, worktree / "benchmarks.json")
        command = [*history, "run", "--spread", "--machine", ctx.model,
                   "--max-commits", str(missing), "--window", str(ctx.history_window)]
        if ctx.history_bench:
            command += ["--bench", ctx.history_bench]
        outcome = ctx.runner.run(command, cwd=ctx.root, log=log, journal=None,
                                 on_event=lambda event: None, deadline=ctx.deadline)
        copied = copy_results(worktree / ctx.model, shipped, worktree / "benchmarks.json",
                              listing)
        ctx.session["history"].setdefault("copied", []).extend(copied)
        ctx.save()
        ctx.log(f"history: asv exit {outcome.status} after {outcome.seconds:.0f} s; "
                f"{len(copied)} result file(s) copied into {shipped}")
        if outcome.cut:
            return False
        if complete_commits(shipped)[1] <= present:
            # Nothing new (every commit of the window has a result, or none builds): running
            # again would pick the same commits.
            raise RuntimeError(f"history: asv added no commit (exit {outcome.status}); "
                               f"{complete} of {ctx.history_commits} have every class; see "
                               f"{log} (a wider --history-window offers more commits)")
    ctx.session["steps"]["history"] = {"done": _now(ctx.clock), "complete": complete}
    return True


STEP_FUNCTIONS: dict[str, Callable[[Context], bool]] = {
    "ceilings": step_ceilings, "perf": step_perf, "floors": step_floors, "tune": step_tune,
    "noise": step_noise, "history": step_history}


def run(ctx: Context, steps: Sequence[str], *, restart: bool = False) -> bool:
    """The bring-up's `steps` (in STEPS order) on `ctx`'s model, each recorded when done; True
    when every one asked for is done, False when the deadline cut one (run again to go on)."""
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"steps: expected some of {', '.join(STEPS)}, got {unknown}")
    state = modeldata.read(ctx.model, modeldata.BRINGUP, ctx.data_root)
    ctx.state, said = session_for(state, device=ctx.device, commit=ctx.commit, runs=ctx.runs,
                                  rounds=ctx.rounds, restart=restart, clock=ctx.clock)
    ctx.log(f"bringup of {ctx.device} ({ctx.model}): {said}")
    ctx.save()
    for step in STEPS:
        if step not in steps:
            continue
        if step in ctx.session["steps"]:
            ctx.log(f"== {step}: done at {ctx.session['steps'][step]['done']} (this session)")
            continue
        if ctx.out_of_time():
            ctx.log(f"== {step}: not started, the deadline passed; run again to go on")
            return False
        ctx.log(f"== {step}")
        started = ctx.clock.monotonic()
        finished = STEP_FUNCTIONS[step](ctx)
        ctx.save()
        took = ctx.clock.monotonic() - started
        if not finished:
            ctx.log(f"== {step}: cut at the deadline after {took:.0f} s; what it finished is "
                    f"kept, run again to go on")
            return False
        ctx.log(f"== {step}: done in {took:.0f} s")
    return True


# -- who can be brought up ---------------------------------------------------------------------

PCI_DEVICES = pathlib.Path("/sys/bus/pci/devices")
VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD", "0x8086": "Intel"}
# PCI class 0x03xxxx: display controllers (VGA, 3D, other); 0x1200: processing accelerators.
GPU_CLASSES = ("0x03", "0x1200")


def gpu_vendors(devices: pathlib.Path = PCI_DEVICES) -> list[str]:
    """The vendors of this machine's display controllers and accelerators by their PCI vendor
    id (`NVIDIA`, `AMD`, `Intel`, else the id), from sysfs; [] where it cannot be read."""
    found = []
    if not devices.is_dir():
        return found
    for device in sorted(devices.iterdir()):
        try:
            kind = (device / "class").read_text().strip()
            vendor = (device / "vendor").read_text().strip()
        except OSError:
            continue
        if kind.startswith(GPU_CLASSES):
            found.append(VENDORS.get(vendor, f"vendor {vendor}"))
    return found


def refusal(*, nvidia: bool, vendors: Sequence[str], description: str) -> str | None:
    """Why the bring-up cannot serve this machine (one line), or None: it measures NVIDIA GPUs
    (CUPTI, NVML, nvcc). `nvidia`: the driver shows an NVIDIA GPU; `vendors`: gpu_vendors();
    `description`: the machine as a line names it."""
    if nvidia:
        return None
    others = sorted({vendor for vendor in vendors if vendor != "NVIDIA"})
    if others:
        return (f"needs an NVIDIA GPU (it measures through CUPTI and NVML); this machine's GPU "
                f"is {' and '.join(others)}, not NVIDIA ({description}): nothing brought up")
    return (f"needs an NVIDIA GPU (it measures through CUPTI and NVML); this machine has no GPU "
            f"({description}): nothing brought up")


def model_of(name: str) -> str:
    return fingerprint.normalise(name)
