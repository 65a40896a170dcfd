"""The gate's measurement: base and head in one live worker each, interleaved per parameter set.

`python -m kernels bench --base BASE` (the CI path) measures here, not through `asv run`:

1. Each commit's files (kernels.bench.confirm.source_tree: `git archive`, kept) and its
   benchmarks, as asv discovers them (asv's own `benchmark.py discover` over this checkout's
   perf_tests, with the commit's `kernels` on PYTHONPATH, both commits at once); `--bench`
   selects among them as `asv run --bench` does (asv's Benchmarks).
2. One live measuring worker per commit (perf_tests/measuring.py's LiveWorker: this
   checkout's worker over that commit's `kernels`, its own process, caches warm for the
   whole gate, faults contained per parameter set), both started at once. Case by case,
   both workers make the case's inputs and compile its JAX parameter sets at once (nothing
   samples meanwhile); then each parameter set is measured on both, the order alternating
   from one parameter set to the next (B H, H B, ...), so the two commits' samples of a row
   are taken seconds apart, never minutes.
3. A row that reads "slower" or "faster" (asv_tools.compare on those samples: its per-row
   gap, noise floors, asv's Mann-Whitney) is confirmed at once (kernels.bench.confirm: B H,
   H B, B H rounds, settled early), while both workers still hold its executable and inputs:
   a round costs a warm-up and the samples. Then the parameter set is released (its device
   memory freed), and at the case's end the case.
4. asv results for both commits, written from the journals (kernels.bench.recover, as asv
   would store them: the dashboard and `asv compare` read them), and the compare table as
   kernels.bench.asv_tools.run prints it, its confirmation served from the rounds taken in
   step 3 (a row flagged only now is measured now, by the same workers).

So a confirmed verdict costs sampling, not a pass: no asv environment, install or process
per benchmark, no fresh process, backend start or compile per round.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from kernels.bench import asv_tools, breakdown, confirm, recover
from kernels.bench.listing import KEPT_LIST, keep_benchmark_list

Key = tuple[str, str, str, str]
OUTSIDE = "the gate's own work (the compare, its tables, the workers' exit)"


def _print(line: str) -> None:
    print(line, flush=True)


def _conf():
    from asv.config import Config

    return Config.load("asv.conf.json")


def discover(tree: pathlib.Path, *, dashboard: bool, benchmark_dir: pathlib.Path) -> list[dict]:
    """The benchmarks of the commit whose files are `tree`, as asv discovers them: asv's
    `benchmark.py discover` over `benchmark_dir` (this checkout's perf_tests), run by this
    Python with the commit's `kernels` first on PYTHONPATH (and the dashboard metrics
    defined if `dashboard`)."""
    from asv import runner

    path = os.pathsep.join(filter(None, [str(tree.resolve()), os.environ.get("PYTHONPATH")]))
    # asv's script takes PYTHONPATH's folders off sys.path unless ASV_PYTHONPATH names them
    # (it put them first): without it the commit's files would be passed over.
    env = {**os.environ, "PYTHONPATH": path, "ASV_PYTHONPATH": path}
    if dashboard:
        env[asv_tools.DASHBOARD_VARIABLE] = "1"
    else:
        env.pop(asv_tools.DASHBOARD_VARIABLE, None)
    with tempfile.TemporaryDirectory(prefix="kernelperf-discover-") as folder:
        out = pathlib.Path(folder) / "benchmarks.json"
        done = subprocess.run([sys.executable, runner.BENCHMARK_RUN_SCRIPT, "discover",
                               str(benchmark_dir.resolve()), str(out)], cwd=folder, env=env,
                              capture_output=True, text=True)
        try:  # a failed import leaves the list cut short ("[")
            listing = json.loads(out.read_text()) if out.exists() else []
        except json.JSONDecodeError:
            listing = []
        if done.returncode != 0 or not listing:  # asv's discovery passes over a failed import
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"discovering the benchmarks of {tree.name} failed (exit "
                               f"{done.returncode}, {len(listing)} found): " + " | ".join(tail))
        return listing


def selection(listing: list[dict], regex: str | None) -> dict[str, list[int] | None]:
    """What `asv run --bench regex` runs of `listing`: benchmark name -> the indices of its
    parameter combinations (None: unparametrized), asv's own selection."""
    from asv.benchmarks import Benchmarks

    chosen = Benchmarks(_conf(), listing, regex=regex)
    return {name: chosen.benchmark_selection[name] for name in chosen}


def _op_of(class_name: str, ops: dict[str, str]) -> str:
    """The operation of a benchmark class (perf_tests/benchmarks.py names it after the
    operation: row_sum -> RowSum); this checkout's registry first, else by that rule."""
    return ops.get(class_name) or re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower()


def keys_of(listing: list[dict], chosen: dict[str, list[int] | None],
            ops: dict[str, str]) -> list[Key]:
    """The parameter sets the chosen benchmarks read, each once, grouped by (operation,
    case) in the order of their benchmarks (each case's inputs are made once)."""
    keys: list[Key] = []
    for benchmark in listing:
        name = benchmark["name"]
        if name not in chosen or not benchmark.get("params"):
            continue
        op = _op_of(name.split(".")[-2], ops)
        combos = list(itertools.product(*benchmark["params"]))
        for index in chosen[name] if chosen[name] is not None else range(len(combos)):
            impl, case, direction = (p.strip("'") for p in combos[index])
            keys.append((op, impl, case, direction))
    unique = list(dict.fromkeys(keys))
    order = {case: i for i, case in enumerate(dict.fromkeys((k[0], k[2]) for k in unique))}
    return sorted(unique, key=lambda key: order[(key[0], key[2])])


def _result(record: dict | None):
    """asv_tools.Result of a done record (asv's statistics over its samples), else None."""
    if record is None or record.get("event") != "done":
        return None
    from asv_runner import statistics

    value, stats = statistics.compute_stats(list(record["samples"]), 1)
    return asv_tools.Result(value, list(record["samples"]), stats)


@dataclasses.dataclass
class Plan:
    """What one interleaved gate measures: per commit, its benchmarks and parameter sets."""

    base: str
    head: str
    listings: dict[str, list[dict]]
    chosen: dict[str, dict[str, list[int] | None]]
    keys: dict[str, list[Key]]
    discovery_s: float = 0.0

    def time_benchmark(self, key: Key, ops: dict[str, str]) -> str | None:
        """The time_device benchmark whose row `key` is, where both commits chose it."""
        for benchmark in self.listings[self.head]:
            name = benchmark["name"]
            if (name.endswith(".time_device") and name in self.chosen[self.head]
                    and name in self.chosen[self.base]
                    and _op_of(name.split(".")[-2], ops) == key[0]):
                return name
        return None


def plan(base: str, head: str, *, bench_regex: str | None, dashboard: bool,
         log: Callable[[str], None] = _print, discover_with=None) -> Plan:
    """Both commits' files, benchmarks (discovered at once) and parameter sets."""
    discover_with = discover_with or discover
    benchmark_dir = pathlib.Path(_conf().benchmark_dir)
    started = time.monotonic()
    trees = {commit: confirm.source_tree(commit) for commit in (base, head)}  # made once
    with ThreadPoolExecutor(2) as pool:
        found = {commit: pool.submit(discover_with, trees[commit], dashboard=dashboard,
                                     benchmark_dir=benchmark_dir) for commit in (base, head)}
        try:
            listings = {commit: future.result() for commit, future in found.items()}
        except RuntimeError as error:  # a commit whose benchmarks do not import: the gate fails
            raise SystemExit(f"kernels bench: {error}") from None
    ops = confirm.class_names()
    chosen = {commit: selection(listing, bench_regex) for commit, listing in listings.items()}
    keys = {commit: keys_of(listings[commit], chosen[commit], ops) for commit in listings}
    seconds = time.monotonic() - started
    log(f"interleaved gate: {len(keys[base])} parameter set(s) on {base[:8]}, "
        f"{len(keys[head])} on {head[:8]} (files and discovery {seconds:.0f} s)")
    return Plan(base, head, listings, chosen, keys, seconds)


def _quiet(line: str) -> None:
    pass


def first_pass(plan_: Plan, pool: confirm.Pool, *, rounds: int, min_gap: float,
               floors: dict[str, float], log: Callable[[str], None] = _print) -> None:
    """Every parameter set of both commits, case by case, alternating which commit goes first;
    a row flagged slower or faster confirmed while its case is open (see the module
    docstring). The records go to the pool's journals (and the rounds to its memory)."""
    base, head = plan_.base, plan_.head
    ops = confirm.class_names()
    sides = {commit: set(plan_.keys[commit]) for commit in (base, head)}
    union = list(dict.fromkeys([*plan_.keys[head], *plan_.keys[base]]))
    cases = list(dict.fromkeys((key[0], key[2]) for key in union))
    for commit in (base, head):
        pool.worker(commit).start("first")  # both start (imports, backends) at once
    turn = itertools.count()
    done = itertools.count(1)
    with ThreadPoolExecutor(2) as threads:
        for op, case_id in cases:
            group = [key for key in union if (key[0], key[2]) == (op, case_id)]
            held = {commit: [key for key in group if key in sides[commit]]
                    for commit in (base, head)}
            # Both workers make the case's inputs and compile it at once: nothing samples.
            asked = {commit: threads.submit(pool.worker(commit).case, held[commit],
                                            pool.journal(commit, group[0], "first"), "first")
                     for commit in (base, head) if held[commit]}
            skipped = {commit: future.result() for commit, future in asked.items()}
            for key in group:
                order = (base, head) if next(turn) % 2 == 0 else (head, base)
                records = {}
                for commit in order:
                    if key in held[commit] and key not in skipped.get(commit, {}):
                        records[commit] = pool.worker(commit).measure(
                            key, pool.journal(commit, key, "first"), "first", 0)
                log(f"  [{next(done)}/{len(union)}] {'/'.join(key)}: "
                    + _said(records.get(base), records.get(head)))
                _confirm_now(plan_, pool, key, records, rounds=rounds, min_gap=min_gap,
                             floors=floors, ops=ops, log=log)
                for commit in records:  # its rounds are kept: its executable is done with
                    pool.worker(commit).release([key])
            for commit in (base, head):
                if held[commit]:
                    pool.worker(commit).end_case(held[commit])


def _said(base: dict | None, head: dict | None) -> str:
    """One parameter set's first pass in words: each side's median (or what became of it)
    and head / base."""
    def side(record: dict | None) -> str:
        if record is None:
            return "-"
        if record.get("event") != "done":
            return record.get("event", "?")
        return f"{statistics.median(record['samples']) * 1e6:.2f} us"
    text = f"base {side(base)}, head {side(head)}"
    if all(r is not None and r.get("event") == "done" for r in (base, head)):
        text += (f" ({statistics.median(head['samples']) / statistics.median(base['samples']):.3f}"
                 ")")
    return text


def first_row(plan_: Plan, key: Key, records: dict[str, dict], *, min_gap: float,
              floors: dict[str, float], ops: dict[str, str]) -> asv_tools.Row | None:
    """The compare's time_device row of `key` from the first pass's records, exactly as
    asv_tools.compare reads it from the asv results written later (None without a time row
    or a result on both sides)."""
    name = plan_.time_benchmark(key, ops)
    base, head = (_result(records.get(commit)) for commit in (plan_.base, plan_.head))
    if name is None or base is None or head is None:
        return None
    params = tuple(f"'{part}'" for part in key[1:])
    (row,) = asv_tools.compare({(name, params): base}, {(name, params): head}, min_gap, floors)
    return row


def _confirm_now(plan_: Plan, pool: confirm.Pool, key: Key, records: dict[str, dict], *,
                 rounds: int, min_gap: float, floors: dict[str, float], ops: dict[str, str],
                 log: Callable[[str], None]) -> None:
    row = first_row(plan_, key, records, min_gap=min_gap, floors=floors, ops=ops)
    if row is None or rounds < 1 or row.verdict not in confirm.CONFIRMED_VERDICTS:
        return
    (out,) = confirm.confirm([row], plan_.base, plan_.head, rounds=rounds,
                             measure=pool.measure, log=_quiet)
    log(f"  re-measured {'/'.join(key)} ({row.verdict} by {row.ratio:.3f}, gap "
        f"{row.gap:.1%}): {out.confirmed} -> {out.verdict}")


def write_results(plan_: Plan, pool: confirm.Pool, machine: str, results_dir: str,
                  log: Callable[[str], None] = _print) -> None:
    """asv results of both commits from the first pass's journals (kernels.bench.recover),
    machine.json beside them, and the head's benchmark list as asv's benchmarks.json."""
    from asv.benchmarks import Benchmarks
    from asv.machine import Machine, MachineCollection

    entry = Machine()
    try:  # the entry register_machine wrote, as `asv run` copies it
        entry.__dict__.update(MachineCollection.load(machine))
    except Exception:  # no entry (a test, a machine file of another asv): the name alone
        entry.__dict__.update({"machine": machine})
    entry.save(results_dir)
    for commit in (plan_.base, plan_.head):
        folder = pool.root / commit[:12]
        if not folder.is_dir():
            continue
        listing = folder / "benchmarks.json"
        listing.write_text(json.dumps({b["name"]: b for b in plan_.listings[commit]}))
        recover.recover(folder, pathlib.Path(results_dir), listing, machine, commit, log=log,
                        selection=plan_.chosen[commit], verb="asv results: wrote")
    conf = _conf()
    conf.results_dir = results_dir
    Benchmarks(conf, plan_.listings[plan_.head]).save()
    keep_benchmark_list(pathlib.Path(results_dir), KEPT_LIST)


def gate(base_rev: str, head_rev: str, *, machine: str, bench_regex: str | None = None,
         min_gap: float = asv_tools.DEFAULT_MIN_GAP, rounds: int = confirm.ROUNDS,
         dashboard: bool = False, results_dir: str = ".asv/results",
         summary_md: str | None = None, json_path: str | None = None,
         log: Callable[[str], None] = _print, spawn=None,
         worker_command: Sequence[str] | None = None, discover_with=None) -> int:
    """The interleaved gate of `head_rev` against `base_rev` on this machine: measured (see
    the module docstring), asv results written, the compare table and where the time went
    printed; asv_tools.run's exit status."""
    started = time.time()
    base, head = asv_tools.full_hash(base_rev), asv_tools.full_hash(head_rev)
    plan_ = plan(base, head, bench_regex=bench_regex, dashboard=dashboard, log=log,
                 discover_with=discover_with)
    root = confirm.confirm_dir() / "journals" / time.strftime("%Y%m%d-%H%M%S")
    pool = confirm.Pool(root, keys=plan_.keys, dashboard=dashboard, log=log, spawn=spawn,
                        worker_command=worker_command)
    floors = asv_tools.load_floors(machine, results_dir)
    measuring_s = written_s = 0.0
    timed = _Timed(pool.measure)
    try:
        try:
            began = time.monotonic()
            first_pass(plan_, pool, rounds=rounds, min_gap=min_gap, floors=floors, log=log)
            measuring_s = time.monotonic() - began
        finally:  # interrupted too: what was measured is kept as asv results
            writing = time.monotonic()
            write_results(plan_, pool, machine, results_dir, log=log)
            written_s = time.monotonic() - writing
        status = asv_tools.run(base_rev, head_rev, machine=machine, results_dir=results_dir,
                               min_gap=min_gap, summary_md=summary_md, confirm_rounds=rounds,
                               json_path=json_path, base_since_ms=started * 1000.0,
                               confirm_measure=timed)
    finally:
        pool.close()
    found = breakdown.read(sorted(root.rglob("*.jsonl")))
    found.add_phase("discovery", "commits' files and benchmarks (asv's discovery, both at "
                    "once)", plan_.discovery_s)
    found.add_phase("results", "asv results written from the journals", written_s)
    wall = time.time() - started
    outside = wall - plan_.discovery_s - measuring_s - timed.seconds - written_s
    log(f"interleaved gate on 2 commits took {wall:.0f} s; "
        + found.render(wall, OUTSIDE, outside_s=max(0.0, outside)))
    return status


class _Timed:
    """A measure function, and the wall seconds spent in it."""

    def __init__(self, measure):
        self.measure, self.seconds = measure, 0.0

    def __call__(self, *args):
        began = time.monotonic()
        try:
            return self.measure(*args)
        finally:
            self.seconds += time.monotonic() - began
