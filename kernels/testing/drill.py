"""`python -m kernels fault-drill`: faults planted in a scratch clone, and what pytest and asv
make of each.

In a scratch clone of this repository's HEAD (uncommitted changes are not in it), the drill
commits one fault at a time on top of HEAD (kernels/testing/faults.py: on a GPU an
out-of-bounds store in the CUDA softmax, an endless loop in a Triton kernel and a Pallas
kernel waiting on a barrier nobody arrives at; on a CPU the last two run in their
interpreters, and stand-ins abort the process or raise a sticky CUDA error) and runs, against
each:

  pytest  the softmax kernel items of a small case over xdist workers (`-n`), every
          implementation: the planted one's items must fail, each with one line, and
          every other item must pass (isolation, kernels/testing/isolation.py);
  asv     `asv run` of Softmax.time_device on the planted implementation and a control,
          forward, one case: the planted row must fail and the control's result be kept
          (perf_tests/measuring.py's supervisor).

Each run has a time limit of its own, so a fault that is not contained shows as a run that
did not end. It prints one row per fault and tool: the planted implementation's items that
failed (all should), other items that failed (none should), the results kept of the
others, the wall time, and the first failure's line. Exit 1 if a fault was not contained.
`without_isolation` adds a pytest run per fault with --no-isolation, for comparison.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable

from kernels.core import journals, registry, validation, vcs
from kernels.core.tables import table
from kernels.testing import faults

OP = "softmax"
TOOLS = ("pytest", "asv")
# The softmax items the pytest runs check (a -k expression) and the case asv times, per
# platform: small, as a hang costs each of the planted implementation's items its whole limit
# (on a GPU one item per implementation, on a CPU both input distributions), and on a CPU
# cases it interprets ("bench": asv's CPU case).
PYTEST_ITEMS = {"gpu": "f32-256x1024 and normal", "cpu": "f32-37x128"}
BENCH_CASE = {"gpu": "f32-256x1024", "cpu": "f32-64x1000"}
# Per-item limit: a CPU interprets these cases in seconds; a GPU's first item on a fresh
# worker also starts JAX and torch and compiles.
ITEM_LIMIT_S = {"gpu": 120.0, "cpu": 30.0}
RUN_LIMIT_S = 900.0  # one pytest or asv run, whatever it does
NO_ISOLATION_RUN_LIMITS = 6  # item limits a --no-isolation comparison run may take
# While a tool runs, a line this often with its latest output: a hang being waited out reads
# as a hang, not as a drill that stopped.
HEARTBEAT_S = 5.0
# The tools run in the scratch clone: a relative interpreter path (a relative PATH entry)
# would name nothing there.
PYTHON = os.path.abspath(sys.executable)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What one drill does; validated so a bad flag fails before any clone."""

    platform: str
    faults: tuple[str, ...] = ()  # empty: faults.DRILL_DEFAULTS[platform]
    tools: tuple[str, ...] = TOOLS
    workers: int = 2
    item_limit_s: float | None = None  # None: ITEM_LIMIT_S[platform]
    run_limit_s: float = RUN_LIMIT_S
    without_isolation: bool = False

    def __post_init__(self) -> None:
        if self.platform not in ("gpu", "cpu"):
            raise ValueError(f"platform: expected 'gpu' or 'cpu', got {self.platform!r}")
        for name in self.chosen_faults:
            planted = faults.fault(name)  # ValueError naming the faults there are
            if self.platform not in planted.platforms:
                here = [f.name for f in faults.FAULTS if self.platform in f.platforms]
                raise ValueError(f"faults: {name} cannot run on a {self.platform} "
                                 f"({planted.summary}); here: {here}")
        if not self.tools or set(self.tools) - set(TOOLS):
            raise ValueError(f"tools: expected some of {list(TOOLS)}, got {list(self.tools)}")
        if self.workers < 1:
            raise ValueError(f"workers: expected >= 1 (isolation replaces workers), got "
                             f"{self.workers}")
        if self.item_limit_s is not None and not 0 < self.item_limit_s < math.inf:
            raise ValueError(f"item_limit_s: expected seconds > 0, got {self.item_limit_s}")
        if not self.item_limit < self.run_limit_s < math.inf:
            raise ValueError(f"run_limit_s: expected more than the item limit "
                             f"({self.item_limit:g} s), got {self.run_limit_s}")

    @property
    def chosen_faults(self) -> tuple[str, ...]:
        return self.faults or faults.DRILL_DEFAULTS[self.platform]

    @property
    def item_limit(self) -> float:
        return self.item_limit_s or ITEM_LIMIT_S[self.platform]


@dataclasses.dataclass(frozen=True)
class Row:
    """What one tool made of one fault."""

    fault: str
    tool: str
    planted_failed: int  # the planted implementation's items (rows) that failed ...
    planted_ran: int  # ... of those that ran
    wrong_failed: int  # other implementations' items (rows) that failed
    kept: int  # other implementations' results kept (passed items, measured rows) ...
    others: int  # ... of those that ran
    wall_s: float
    ended: bool  # ended by itself, within the run limit
    message: str  # the planted implementation's first failure, one line

    @property
    def contained(self) -> bool:
        return (self.ended and self.planted_ran > 0 and self.planted_failed == self.planted_ran
                and self.wrong_failed == 0 and self.kept == self.others)


# -- one run --------------------------------------------------------------------------------

def _print(line: str) -> None:
    print(line, flush=True)


def _run(command: list[str], cwd: pathlib.Path, env: dict[str, str], limit_s: float,
         log_path: pathlib.Path, label: str = "",
         log: Callable[[str], None] = _print) -> tuple[int | None, float]:
    """`command` in its own process group, output to `log_path`; (exit status or None when
    it was killed at `limit_s`, wall seconds). Every HEARTBEAT_S, `label`'s seconds so far
    and the last line the command wrote go to `log`."""
    start = time.monotonic()
    with open(log_path, "w") as output:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=output,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        code = None
        try:
            while (left := limit_s - (time.monotonic() - start)) > 0:
                try:
                    code = process.wait(timeout=min(HEARTBEAT_S, left))
                    break
                except subprocess.TimeoutExpired:
                    log(f"  {label or command[0]}: {time.monotonic() - start:.0f} s of at most "
                        f"{limit_s:.0f} s; last output: {_last_line(log_path) or '(none yet)'}")
        except BaseException:
            _kill_group(process)
            raise
        if code is None:
            _kill_group(process)
    return code, time.monotonic() - start


def _last_line(path: pathlib.Path, width: int = 120) -> str:
    """The last non-blank line of a log being written (its last 4 KiB read), shortened."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in re.split(r"[\r\n]", tail) if line.strip()]
    return _shorten(lines[-1], width) if lines else ""


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def junit_outcomes(path: pathlib.Path) -> dict[str, tuple[str, str]]:
    """test id (the part in brackets) -> (passed | failed | skipped, first line of the
    failure) from a pytest --junitxml file."""
    found: dict[str, tuple[str, str]] = {}
    if not path.exists():
        return found
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if "[" not in name:
            continue
        test_id = name[name.index("[") + 1:name.rindex("]")]
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            found[test_id] = ("failed", (failure.get("message") or "").splitlines()[0]
                              if failure.get("message") else "")
        elif case.find("skipped") is not None:
            found.setdefault(test_id, ("skipped", ""))
        else:
            found.setdefault(test_id, ("passed", ""))
    return found


def pytest_row(name: str, impl: str, outcomes: dict[str, tuple[str, str]], wall_s: float,
               ended: bool, tool: str = "pytest") -> Row:
    """The row of one pytest run: items of softmax-`impl` against the others."""
    planted = {k: v for k, v in outcomes.items() if k.startswith(f"{OP}-{impl}-")}
    others = {k: v for k, v in outcomes.items() if k not in planted}
    ran = {k: v for k, v in planted.items() if v[0] != "skipped"}
    ran_others = [v for v in others.values() if v[0] != "skipped"]
    messages = [v[1] for _, v in sorted(ran.items()) if v[0] == "failed"]
    return Row(name, tool, sum(v[0] == "failed" for v in ran.values()), len(ran),
               sum(v[0] == "failed" for v in ran_others),
               sum(v[0] == "passed" for v in ran_others), len(ran_others), wall_s, ended,
               messages[0] if messages else "")


def asv_values(results_dir: pathlib.Path, commit: str, benchmark: str) -> dict[str, float | None]:
    """implementation -> value (None: failed, NaN: skipped) of `benchmark` in asv's results
    file of `commit` (the first parameter is the implementation)."""
    values: dict[str, float | None] = {}
    for path in sorted(results_dir.glob(f"*/{commit[:8]}-*.json")):
        data = json.loads(path.read_text())
        entry = data.get("results", {}).get(benchmark)
        if not entry:
            continue
        columns = data["result_columns"]
        result, params = entry[columns.index("result")], entry[columns.index("params")]
        implementations = [p.strip("'") for p in params[0]]
        per_impl = len(result) // max(1, len(implementations))
        for i, impl in enumerate(implementations):
            chunk = result[i * per_impl:(i + 1) * per_impl]
            values[impl] = None if any(v is None for v in chunk) else \
                float(chunk[0]) if chunk else float("nan")
    return values


def journal_failures(clone: pathlib.Path, commit: str) -> dict[str, str]:
    """implementation -> the reason measuring.py's supervisor recorded for its failure."""
    reasons: dict[str, str] = {}
    env = clone / journals.env_dir(clone / "asv.conf.json")
    for path in env.glob(f"*/{journals.MEASUREMENTS}/{commit[:12]}-*/{OP}.jsonl"):
        for entry in journals.entries(path):
            if entry.get("event") == "failed":
                reasons.setdefault(entry["key"].split("/")[1], entry.get("reason", ""))
    return reasons


# -- the drill ------------------------------------------------------------------------------

def _plant(clone: pathlib.Path, name: str) -> str:
    """Commit fault `name` on a branch from main in `clone`; returns the commit."""
    op, impl = faults.fault(name).target
    vcs.output(clone, "checkout", "-q", "-B", f"fault-{name}", "main")
    with open(clone / registry.module_path(op, impl), "a") as module:
        module.write(faults.plant_source(name, op, impl))
    vcs.output(clone, "commit", "-q", "-a", "-m", f"fault drill: {name} in {op}-{impl}")
    return vcs.output(clone, "rev-parse", "HEAD")


def _environment(clone: pathlib.Path) -> dict[str, str]:
    """This environment, with the clone's kernels first on the path: before an editable
    install's, and instead of another checkout named on PYTHONPATH (whose other entries,
    asv's wheels on the GPU machine for one, stay)."""
    kept = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if entry and not (pathlib.Path(entry) / "kernels" / "__init__.py").exists()]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(clone), *kept]),
                PYTHONUNBUFFERED="1")


def run_pytest(clone: pathlib.Path, name: str, settings: Settings, out: pathlib.Path,
               isolation: bool = True, log: Callable[[str], None] = _print) -> Row:
    """The softmax kernel items of the drill's cases under `settings.workers` workers."""
    _, impl = faults.fault(name).target
    suffix = "" if isolation else "-no-isolation"
    junit = out / f"{name}{suffix}.xml"
    command = [PYTHON, "-m", "pytest", "-p", "xdist", "-n", str(settings.workers),
               "-p", "no:cacheprovider", "-q", "correctness_tests/test_kernels.py",
               "-k", f"test_matches_reference and {OP}- and {PYTEST_ITEMS[settings.platform]}",
               "--item-limit", f"{settings.item_limit:g}", f"--junitxml={junit}",
               *([] if isolation else ["--no-isolation"])]
    # Without isolation a hang never ends: a few item limits show that well enough.
    limit = settings.run_limit_s if isolation else \
        min(settings.run_limit_s, NO_ISOLATION_RUN_LIMITS * settings.item_limit)
    tool = "pytest" if isolation else "pytest --no-isolation"
    code, wall = _run(command, clone, _environment(clone), limit,
                      out / f"{name}-pytest{suffix}.log", tool, log)
    return pytest_row(name, impl, junit_outcomes(junit), wall, code is not None, tool=tool)


def run_asv(clone: pathlib.Path, name: str, commit: str, settings: Settings,
            out: pathlib.Path, log: Callable[[str], None] = _print) -> Row:
    """asv run of time_device on the planted implementation and a control, on `commit`."""
    _, impl = faults.fault(name).target
    control = "torch" if impl == "xla" else "xla"
    env = dict(_environment(clone), KERNELPERF_BENCH_FULL="1",
               KERNELPERF_BENCH_IMPLS=f"{impl},{control}",
               KERNELPERF_BENCH_CASES=BENCH_CASE[settings.platform],
               KERNELPERF_BENCH_DIRECTIONS="fwd",
               KERNELPERF_ITEM_LIMIT_S=f"{settings.item_limit:g}")
    benchmark = f"benchmarks.{registry.benchmark_class(OP)}.time_device"
    command = [PYTHON, "-m", "asv", "run", "--show-stderr", "--bench",
               f"{registry.benchmark_class(OP)}\\.time_device", f"{commit}^!"]
    code, wall = _run(command, clone, env, settings.run_limit_s, out / f"{name}-asv.log",
                      "asv", log)
    values = asv_values(clone / ".asv" / "results", commit, benchmark)
    reasons = journal_failures(clone, commit)
    # Implementations whose names contain the other's ("xla" in "xla_remat") are told apart
    # by exact name: asv's params are exact.
    planted, other = values.get(impl, "missing"), values.get(control, "missing")

    def failed(value) -> bool:
        return value is None

    def measured(value) -> bool:
        return isinstance(value, float) and not math.isnan(value)

    return Row(name, "asv", int(failed(planted)), int(planted != "missing"),
               int(failed(other)), int(measured(other)), int(other != "missing"), wall,
               code in (0, 2), reasons.get(impl, ""))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main_flow(settings: Settings, *, source: pathlib.Path | None = None, keep: bool = False,
              log: Callable[[str], None] = _print) -> int:
    """Clone, plant each fault, run the tools, print the table; exit 1 if a fault was not
    contained (the --no-isolation rows are for comparison and never fail the drill)."""
    source = source or pathlib.Path(vcs.output(pathlib.Path.cwd(), "rev-parse", "--show-toplevel"))
    head = vcs.output(source, "rev-parse", "HEAD")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="kernelperf-drill-"))
    out = scratch / "drill-logs"
    clone = scratch / "clone"
    log(f"fault-drill: scratch clone {clone} of {head[:8]} ({settings.platform}); faults: "
        f"{', '.join(settings.chosen_faults)}; tools: {', '.join(settings.tools)}; "
        f"{settings.workers} workers, {settings.item_limit:g} s per item")
    vcs.scratch_clone(source, head, clone, "fault-drill")
    out.mkdir()
    rows: list[Row] = []
    # A TERM (a time limit around the drill) reports what ran and kills the run in flight.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for name in settings.chosen_faults:
            planted = faults.fault(name)
            commit = _plant(clone, name)
            log(f"[{name}] {planted.summary} ({'-'.join(planted.target)}, {commit[:8]})")
            runs = []
            if "pytest" in settings.tools:
                runs.append((run_pytest, (clone, name, settings, out)))
                if settings.without_isolation:
                    runs.append((run_pytest, (clone, name, settings, out, False)))
            if "asv" in settings.tools:
                runs.append((run_asv, (clone, name, commit, settings, out)))
            for run, arguments in runs:
                row = run(*arguments, log=log)
                rows.append(row)
                log(f"  {row.tool}: {row.planted_failed}/{row.planted_ran} planted failed, "
                    f"{row.wrong_failed} others failed, {row.kept}/{row.others} kept, "
                    f"{row.wall_s:.0f} s{'' if row.ended else ' (did not end: killed)'}")
    except KeyboardInterrupt:
        log(f"fault-drill: interrupted after {len(rows)} run(s); reporting those")
    finally:
        signal.signal(signal.SIGTERM, previous)
    status = report(rows, log)
    if keep:
        log(f"kept {scratch} (clone, logs in drill-logs/)")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return status


def report(rows: list[Row], log: Callable[[str], None] = _print) -> int:
    """The table, each failure's first line, and the verdict (1 if a fault escaped)."""
    body = [[row.fault, row.tool, f"{row.planted_failed}/{row.planted_ran}",
             str(row.wrong_failed), f"{row.kept}/{row.others}",
             f"{row.wall_s:.0f} s" + ("" if row.ended else " (killed)"),
             ("contained" if row.contained else "NOT CONTAINED")
             if "no-isolation" not in row.tool else "(comparison)"] for row in rows]
    log(table(body, ["fault", "run", "planted failed", "others failed", "others kept", "wall",
                     "result"]))
    for row in rows:
        if row.message:
            log(f"  {row.fault} / {row.tool}: {_shorten(row.message)}")
    escaped = [f"{row.fault} ({row.tool})" for row in rows
               if not row.contained and "no-isolation" not in row.tool]
    if escaped:
        log(f"fault-drill: NOT CONTAINED: {', '.join(escaped)}")
        return 1
    log("fault-drill: every fault failed its own items only; the others' results were kept")
    return 0


def _shorten(text: str, width: int = 300) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= width else text[:width - 3] + "..."


def settings_from(platform: str, **flags) -> Settings:
    """Settings, with a bad flag reported as the user's mistake (one line, exit 2)."""
    try:
        return Settings(platform=platform, **flags)
    except ValueError as error:
        raise validation.UserError(str(error)) from None
