"""Results an interrupted benchmark run took, written into asv's results from its journals.

asv writes a commit's results file once, after every benchmark of that commit ran: a run cut
short (Ctrl-C, a killed process, a time limit) loses everything measured for the commit in
progress. The measuring journals (perf_tests/measuring.py) keep each parameter set's record
the moment it is taken, so `recover` writes what asv would have stored for them: it replays
each benchmark of the suite (perf_tests/benchmarks.py, the same methods asv runs) on the
journal's records, in this process, and adds the results to the commit's asv results file
with the versions of the run's benchmarks.json. Parameter sets the journal does not hold
stay absent; failed ones are recorded as failed, skipped ones as skipped (n/a), as asv does.

`python -m kernels recover` runs it over every journal of this checkout's asv environments
whose commit has no results file yet; `python -m kernels bench` runs it itself when its asv
run was interrupted or failed.
"""

from __future__ import annotations

import datetime
import importlib
import itertools
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Callable

from kernels.core import environment, journals

JOURNAL_VARIABLE = "KERNELPERF_JOURNAL_DIR"  # perf_tests/benchmarks.py reads records there only


def _print(line: str) -> None:
    print(line, flush=True)


def _commit(prefix: str) -> str | None:
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{prefix}^{{commit}}"],
                          capture_output=True, text=True)
    return done.stdout.strip() or None


def _commit_date_ms(commit: str) -> int:
    seconds = subprocess.run(["git", "log", "-1", "--format=%ct", commit], check=True,
                             capture_output=True, text=True).stdout.strip()
    return int(seconds) * 1000


def _suite(journal_dir: pathlib.Path, dashboard: bool):
    """perf_tests.benchmarks imported to read `journal_dir` (with the dashboard metrics where
    the run recorded them)."""
    os.environ[JOURNAL_VARIABLE] = str(journal_dir)
    # Every class, whatever this machine runs: the records may come from another machine.
    os.environ["KERNELPERF_BENCH_FULL"] = "1"
    for narrowing in ("KERNELPERF_BENCH_IMPLS", "KERNELPERF_BENCH_CASES",
                      "KERNELPERF_BENCH_DIRECTIONS"):
        os.environ.pop(narrowing, None)
    if dashboard:
        os.environ[environment.DASHBOARD_VARIABLE] = "1"
    else:
        os.environ.pop(environment.DASHBOARD_VARIABLE, None)
    import perf_tests.benchmarks as benchmarks

    benchmarks = importlib.reload(benchmarks)
    benchmarks._records.cache_clear()
    return benchmarks


def _value(benchmarks, cls, method: str, params: tuple) -> tuple[float | None, list | None]:
    """(value, samples) of one benchmark method on one parameter combination: NaN where
    asv would skip, None where it would fail."""
    instance = cls()
    try:
        instance.setup(*params)
    except NotImplementedError:
        return math.nan, None
    except RuntimeError:
        return None, None
    except KeyError:  # a name this checkout does not register (a base's, removed since)
        return _record_only(benchmarks, cls, method, params)
    if method == "time_device":
        return math.nan, list(instance.record["samples"])
    try:
        return float(getattr(instance, method)(*params)), None
    except NotImplementedError:
        return math.nan, None
    finally:
        benchmarks._REPLAY.clear()


def _record_only(benchmarks, cls, method: str, params: tuple) -> tuple[float | None, list | None]:
    """(value, samples) read from the record alone, for an implementation or case this
    checkout's registry does not know: the samples and memory are the record's own, the
    numbers computed from the registry's work model are left out (NaN)."""
    found = benchmarks._records(cls).get((cls.op_name, *params))
    if found is None or found["event"] == "failed":
        return None, None
    if found["event"] != "done":
        return math.nan, None
    if method == "time_device":
        return math.nan, list(found["samples"])
    if method == "track_peak_memory" and found.get("peak_bytes") is not None:
        return float(found["peak_bytes"]), None
    return math.nan, None


# What _suite sets for a replay, and recover() puts back after it: left behind, the journal
# folder made every later benchmark of the process replay it (seen in the test suite:
# test_asv_tools after test_recover read "not measured").
_REPLAY_VARIABLES = (JOURNAL_VARIABLE, "KERNELPERF_BENCH_FULL", "KERNELPERF_BENCH_IMPLS",
                     "KERNELPERF_BENCH_CASES", "KERNELPERF_BENCH_DIRECTIONS",
                     environment.DASHBOARD_VARIABLE)


def recover(journal_dir: pathlib.Path, results_dir: pathlib.Path, benchmarks_json: pathlib.Path,
            machine: str, commit: str, *, python: str | None = None,
            log: Callable[[str], None] = _print, selection: dict | None = None,
            verb: str = "recovered") -> int:
    """Add the journal's records of `commit` to its asv results file in `results_dir` (for
    the environment of `python`, "3.12", by default this interpreter's); returns how many
    benchmarks were written. `selection` (benchmark name -> the indices of its parameter
    combinations measured, or None for all; asv's Benchmarks.benchmark_selection): a
    benchmark's other combinations keep the values the file held, as `asv run --bench` keeps
    them. The process's environment is as it was afterwards."""
    saved = {name: os.environ.get(name) for name in _REPLAY_VARIABLES}
    try:
        return _recover(journal_dir, results_dir, benchmarks_json, machine, commit,
                        python=python, log=log, selection=selection, verb=verb)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _recover(journal_dir: pathlib.Path, results_dir: pathlib.Path, benchmarks_json: pathlib.Path,
             machine: str, commit: str, *, python: str | None,
             log: Callable[[str], None], selection: dict | None = None,
             verb: str = "recovered") -> int:
    from asv import results as asv_results
    from asv import runner as asv_runner

    entries = [entry for path in sorted(journal_dir.glob("*.jsonl"))
               for entry in journals.entries(path)]
    dashboard = any(entry.get("launch_us") is not None for entry in entries
                    if entry.get("event") == "done")
    measured_ops = {entry["key"].split("/")[0] for entry in entries if "key" in entry}
    benchmarks = _suite(journal_dir, dashboard)
    known = json.loads(benchmarks_json.read_text())
    machine_file = pathlib.Path(results_dir) / machine / "machine.json"
    machine_params = {key: value for key, value in json.loads(machine_file.read_text()).items()
                      if key != "version"} if machine_file.exists() else {"machine": machine}
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    env_name = f"kernelperf-py{python}"
    path = pathlib.Path(results_dir) / asv_results.get_filename(machine, commit, env_name)
    if path.exists():
        results = asv_results.Results.load(str(path), machine)
    else:
        results = asv_results.Results({**machine_params, "python": python}, {}, commit,
                                      _commit_date_ms(commit), python, env_name, {})
    written = 0
    for name, benchmark in sorted(known.items()):
        parts = name.split(".")
        if len(parts) != 3 or not hasattr(benchmarks, parts[1]):
            continue
        cls, method = getattr(benchmarks, parts[1]), parts[2]
        if cls.op_name not in measured_ops or not hasattr(cls, method):
            continue
        if selection is not None and name not in selection:
            continue
        chosen = selection.get(name) if selection is not None else None
        values, samples, numbers = [], [], []
        for combo in itertools.product(*[[json.loads(p.replace("'", '"')) for p in values]
                                         for values in benchmark["params"]]):
            value, taken = _value(benchmarks, cls, method, combo)
            # A timed row's value comes from its samples (asv's statistics, number 1).
            values.append(statistics.median(taken) if taken else value)
            samples.append(taken)
            numbers.append(1 if taken else None)
        if all(value is None for value in values):
            continue
        results.add_result(benchmark, asv_runner.BenchmarkResult(
            result=values, samples=samples, number=numbers, errcode=0, stderr="",
            profile=None), record_samples=True,
            started_at=datetime.datetime.now(datetime.UTC),
            selected_idx=None if chosen is None else set(chosen))
        written += 1
    results.save(str(results_dir))
    log(f"{verb} {written} benchmark(s) of {commit[:8]} from {journal_dir} into {path}")
    return written


def interrupted_runs(results_dir: pathlib.Path, machine: str) -> list[tuple[pathlib.Path, str]]:
    """(journal folder, commit) of every measuring run here whose commit has no results file
    on `machine`, newest run of each commit."""
    from asv import results as asv_results

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    newest: dict[str, pathlib.Path] = {}
    for folder in sorted(journals.env_dir().glob(f"*/{journals.MEASUREMENTS}/*"),
                         key=lambda p: p.stat().st_mtime):
        commit = _commit(folder.name.split("-")[0])
        if commit is None:
            continue
        name = asv_results.get_filename(machine, commit, f"kernelperf-py{python}")
        if not (pathlib.Path(results_dir) / name).exists():
            newest[commit] = folder
    return [(folder, commit) for commit, folder in newest.items()]


def recover_all(machine: str, results_dir: str = ".asv/results", *,
                log: Callable[[str], None] = _print) -> int:
    """Recover every interrupted run of asv machine `machine` here (see `interrupted_runs`);
    how many commits."""
    benchmarks_json = pathlib.Path(results_dir) / "benchmarks.json"
    runs = interrupted_runs(pathlib.Path(results_dir), machine)
    if not runs or not benchmarks_json.exists():
        log("recover: no interrupted run to recover here" if not runs else
            f"recover: {benchmarks_json} is missing (asv writes it when a run starts)")
        return 0
    for folder, commit in runs:
        recover(folder, pathlib.Path(results_dir), benchmarks_json, machine, commit, log=log)
    return len(runs)
