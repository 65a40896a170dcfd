"""The documents stay true: their commands run as shown, and GPU-only ones refuse a CPU in one
line.

`test_every_cpu_command_in_the_readme_runs` (marker `readme`; run by `make readme-check`, part
of `make test`, which sets KERNELPERF_README_CHECK=1) clones the committed HEAD into a
temporary folder, gives it an empty home directory, and runs every command of the ```bash
blocks of README.md and then of every docs/*.md (by name; correctness_tests/documents.py), in
order, each in its own shell with the project's .venv first on PATH. A command shown again in
a later document is run once, where it first appears. Commands labelled `# GPU`/`# GPUs` (need
a CUDA GPU) or `# needs ...` (a remote host) are not run; `NOT_RUN` names the others left out
and why.
asv runs are narrowed to `KERNELPERF_BENCH_IMPLS=xla` (the README's own knob) to keep CI short.
Servers (`make dashboard`, `make xprof-serve`) count as working once they answer over HTTP;
`make dashboard` must also list every shipped GPU machine and draw their time_device points
(of the machines whose results hold the graph's benchmark).
Each command's output is read as it comes: the table at the end gives its exit status, wall
time and longest silence (no output at all), and a silence over SILENCE_LIMIT_S (scaled by
the machine's load, as other processes stretch it) fails the check, as does a traceback.
At the end the clone must have no untracked files: outputs go to ignored folders.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from correctness_tests import documents
from kernels import cli
from kernels.core import devices, tables

ROOT = Path(__file__).resolve().parent.parent
GPU_LABEL = re.compile(r"^GPUs?\b")
NEEDS_LABEL = re.compile(r"^needs\b")
# CPU commands the check does not run, and why.
_NIGHTLY = ("the nightly workflow's step, against a remote's asv-results and gh-pages branches "
            "(push would write to the repository cloned from): test_history.py rehearses it")
NOT_RUN = {
    "make test": "the README check runs inside it",
    **{f"python -m kernels.bench.history {step}": _NIGHTLY
       for step in ("fetch", "run", "push", "fetch publish", "deploy")},
    "python -m asv preview": "serves on 8080 until stopped; `make dashboard` is checked",
}
# Commands whose exit 1 is a verdict, not a failure to run: the last line that marks the verdict.
# gate-power on a shared CPU (the host clock's noise) may miss its plant or call a control row
# slower; it works as shown when it gets to its verdict.
VERDICTS = {"python -m kernels gate-power --families xla --ops softmax --sizes 50% --trials 1 "
            "--confirm-rounds 1": re.compile(r"^gate-power: (FAILED for|every plant)")}
# Commands that serve until stopped: (what they print once serving, the path to fetch).
SERVERS = {"make dashboard": ("Serving at", "index.json"), "make xprof-serve": ("xprof", "")}
# No command may print nothing for longer than this on an idle machine (progress per item or
# per phase); the limit grows with the load average per core, other users' processes
# stretching every silence alike.
SILENCE_LIMIT_S = 10.0
COMMAND_TIMEOUT_S = 900
SERVER_START_S = 120


@dataclasses.dataclass(frozen=True)
class Command:
    """One documented command: its text (continuation lines joined), its trailing comment and
    the document that shows it."""

    text: str
    comment: str
    document: str = "README.md"

    @property
    def label(self) -> str:
        """"gpu", "needs" (an outside resource) or "cpu" (runs on any machine)."""
        if GPU_LABEL.match(self.comment):
            return "gpu"
        return "needs" if NEEDS_LABEL.match(self.comment) else "cpu"


def readme_commands(text: str, document: str = "README.md") -> list[Command]:
    """The commands of every ```bash block of `text` (the document `document`), in order;
    comment lines dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S):
        pending = ""
        for line in block.splitlines():
            if pending == "" and line.lstrip().startswith("#") or not line.strip():
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1].strip() + " "
                continue
            command, _, comment = (pending + line.strip()).partition(" #")
            commands.append(Command(" ".join(command.split()), comment.strip(), document))
            pending = ""
    return commands


def documented_commands(root: Path) -> list[Command]:
    """The commands of README.md, then of every docs/*.md by name, each in its document's
    order; a command a later document shows again is left to its first showing."""
    commands, seen = [], set()
    for path in documents.paths(root):
        for command in readme_commands(path.read_text(), path.relative_to(root).as_posix()):
            if command.text not in seen:
                seen.add(command.text)
                commands.append(command)
    return commands


def test_every_document_with_commands_is_read_in_order_each_command_once(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("```bash\nmake a      # one\nmake b\n```\n")
    (tmp_path / "docs" / "z.md").write_text("```bash\nmake z\nmake a      # again\n```\n")
    (tmp_path / "docs" / "m.md").write_text("text\n```bash\nmake \\\n  m  # GPU\n```\n"
                                            "```python\nnot_a_command()\n```\n")
    (tmp_path / "docs" / "notes.txt").write_text("```bash\nmake txt\n```\n")
    assert [(c.text, c.document, c.label) for c in documented_commands(tmp_path)] == [
        ("make a", "README.md", "cpu"), ("make b", "README.md", "cpu"),
        ("make m", "docs/m.md", "gpu"), ("make z", "docs/z.md", "cpu")]


def test_the_check_reads_every_document_under_docs():
    """Each docs/*.md's commands are among those the check runs: a document added under docs/
    is checked with no other edit, and the README alone is not all of it."""
    shown = {c.document for c in documented_commands(ROOT)}
    with_commands = {path.relative_to(ROOT).as_posix() for path in documents.paths(ROOT)
                     if readme_commands(path.read_text())}
    assert shown == with_commands and "README.md" in shown and len(shown) >= 3, shown


def test_readme_commands_are_parsed_and_gpu_ones_labelled():
    commands = {c.text: c for c in documented_commands(ROOT)}
    assert commands["python -m kernels list"].label == "cpu"
    assert commands["make dashboard-screenshot RESULTS=perf_tests/results/asv "
                    "BENCH=Softmax.time_device PNG=traces/softmax.png "
                    "XAXIS=implementation"].label == "cpu"
    for gpu_only in ("python3 -m pytest -m gpu", "python3 -m kernels.ops.sharded_matmul.overlap",
                     "python -m kernels gate-power",
                     "KERNELPERF_BENCH_IMPLS=pallas KERNELPERF_BENCH_CASES=f32-32768x4096 "
                     "KERNELPERF_BENCH_DIRECTIONS=fwd python -m asv find main~8..main "
                     "'Softmax\\.time_device'",
                     "python -m kernels profile softmax --impl xla --impl pallas "
                     "--case f32-32768x4096 --top 8",
                     'make roofline op=softmax dims="rows=4096 cols=1024,4096,16384" dtype=bf16',
                     "make roofline op=attention batch=4 heads=8 head-dim=64 "
                     "seq-lengths=128,256,512,1024,2048,4096"):
        assert commands[gpu_only].label == "gpu", gpu_only
    assert commands["make download-traces h=user@gpu-box k=~/.ssh/id"].label == "needs"
    # Their CPU-sized forms are run by the check.
    assert commands["KERNELPERF_BENCH_IMPLS=xla KERNELPERF_BENCH_CASES=f32-64x1000 "
                    "KERNELPERF_BENCH_DIRECTIONS=fwd python -m asv find main~2..main "
                    "'Softmax\\.time_device'"].label == "cpu"
    assert set(NOT_RUN) | set(VERDICTS) | set(SERVERS) <= set(commands), \
        "NOT_RUN, VERDICTS or SERVERS names a command no document shows"


# GPU-only commands of the README, as the CLI receives them, and the one line each must print
# on a CPU instead of running for hours.
REFUSALS = [
    (["roofline", "softmax", "--dims", "rows=4096", "cols=1024,4096,16384", "--dtype", "bf16"],
     "--dims: expected CPU sizes here (no GPU; at most"),
    (["roofline", "attention", "--batch", "4", "--heads", "8", "--head-dim", "64",
      "--seq-lengths", "128,256,512,1024,2048,4096"],
     "--batch/--heads/--head-dim/--seq-lengths: expected CPU sizes here"),
    (["profile", "softmax", "--impl", "xla", "--impl", "pallas", "--case", "f32-32768x4096"],
     "--case: expected a CPU case here (no GPU), e.g. f32-64x1000; got f32-32768x4096"),
    (["plot-roofline", "traces/no-such-file.json"],
     "json: expected a roofline data file"),
]


@pytest.mark.parametrize("argv, line", REFUSALS, ids=[" ".join(a[:2]) for a, _ in REFUSALS])
def test_gpu_sizes_refused_on_cpu_in_one_line(argv, line, capsys):
    if argv[0] != "plot-roofline" and devices.this_machine().has_gpu:
        pytest.skip("runs the real sizes on a GPU")
    try:  # a refusal in the command's own code returns 2; one at parse time is argparse's
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and line in err[0], (code, err)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _clone(tmp: Path) -> Path:
    """HEAD committed, cloned; `main` as a local branch (bench-compare's BASE); .venv the
    project's, with pyproject.toml older than its install stamp so `make install` keeps it."""
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    has_main = subprocess.run(["git", "-C", str(clone), "rev-parse", "--verify", "-q",
                               "origin/main"], capture_output=True).returncode == 0
    if subprocess.run(["git", "-C", str(clone), "rev-parse", "--abbrev-ref", "HEAD"],
                      capture_output=True, text=True).stdout.strip() != "main":
        subprocess.run(["git", "-C", str(clone), "branch", "-f", "main",
                        "origin/main" if has_main else head], check=True)
    (clone / ".venv").symlink_to(Path(sys.prefix))
    stamp = Path(sys.prefix) / ".installed"
    if stamp.exists():
        old = stamp.stat().st_mtime - 10
        os.utime(clone / "pyproject.toml", (old, old))
    return clone


def _environment(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("KERNELPERF_BENCH", "PYTEST_", "ASV"))}
    env.update(HOME=str(home), PATH=f"{Path(sys.prefix) / 'bin'}:{env.get('PATH', '')}",
               KERNELPERF_BENCH_IMPLS="xla", DASHBOARD_PORT=str(_free_port()),
               XPROF_PORT=str(_free_port()), PYTHONUNBUFFERED="1")
    return env


@dataclasses.dataclass(frozen=True)
class Run:
    """One command's run: how it ended, what it printed, and its longest silence."""

    returncode: int | None  # None: stopped at the time limit
    output: str  # stdout and stderr, as they came
    seconds: float
    silence_s: float  # the longest stretch with no output at all (start and exit included)
    silence_at: str  # where that was: "start", "before <line>" or "before exit"

    def limit_exceeded(self, limit: float) -> bool:
        return self.silence_s > limit


def run_command(text: str, cwd: Path, env: dict[str, str], timeout: float) -> Run:
    """`bash -c text`, its output read as it comes (a chunk, even a progress bar's carriage
    return, ends a silence); the whole process group stopped at `timeout`."""
    process = subprocess.Popen(["bash", "-c", text], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    start = last = time.monotonic()
    chunks: list[bytes] = []
    silence, silence_at = 0.0, "start"
    timed_out = False
    while True:
        now = time.monotonic()
        if now - start > timeout:
            os.killpg(process.pid, signal.SIGKILL)
            timed_out = True
            break
        if not selector.select(timeout=1.0):
            continue
        chunk = os.read(process.stdout.fileno(), 65536)
        now = time.monotonic()
        if not chunk:
            break
        if now - last > silence:
            said = [line for line in chunk.decode(errors="replace").replace("\r", "\n")
                    .splitlines() if line.strip()]
            silence, silence_at = now - last, f"before {said[0][:80]!r}" if said else "?"
        last = now
        chunks.append(chunk)
    returncode = process.wait()
    end = time.monotonic()
    if not timed_out and end - last > silence:
        silence, silence_at = end - last, "before exit"
    selector.close()
    process.stdout.close()
    return Run(None if timed_out else returncode, b"".join(chunks).decode(errors="replace"),
               end - start, silence, silence_at)


def silence_limit() -> float:
    """SILENCE_LIMIT_S, stretched by the load average per core above 1 (other engineers'
    processes on a shared machine)."""
    return SILENCE_LIMIT_S * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


# The graph `make dashboard` is checked on.
GRAPH = "benchmarks.Softmax.time_device"


def _drawn_machines(port: str, benchmark: str) -> set[str] | None:
    """The machines whose series have points in `benchmark`'s default view of the dashboard
    served on `port` (headless chromium); None where chromium is missing."""
    from kernels.bench import dashboard

    if dashboard.browser() is None:
        return None
    facts = dashboard.graph_facts(dashboard._chromium(
        dashboard.page_url(f"http://127.0.0.1:{port}/", benchmark), "--dump-dom",
        size=(1400, 900), budget_ms=10000, timeout=60))
    return {label.split(" · ")[0] for label, points in facts.series if points}


def _serve(command: Command, clone: Path, env: dict, shipped: list[str],
           local: str | None = None) -> tuple[bool, str]:
    """Start a server command; working once it answers over HTTP (or, missing its tool, says
    so in one line); stopped afterwards. `make dashboard` must list every shipped machine
    (and `local`, this machine, once it has results) and draw the time_device points of each
    that has GRAPH's."""
    from kernels.bench import dashboard

    ready, path = SERVERS[command.text]
    port = env["DASHBOARD_PORT"] if command.text == "make dashboard" else env["XPROF_PORT"]
    process = subprocess.Popen(["bash", "-c", command.text], cwd=clone, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=5).read()
            except OSError:
                if process.poll() is not None:
                    break
                time.sleep(2)
                continue
            if command.text != "make dashboard":
                return True, "served"
            wanted = set(shipped) | ({local} if local else set())
            machines = json.loads(body)["params"]["machine"]
            drawn = _drawn_machines(port, GRAPH)
            missing = sorted(wanted - set(machines))
            # This machine's own run holds GRAPH; a shipped machine may not (sharded only).
            holding = set(dashboard.machines_with(clone / "perf_tests" / "results" / "asv",
                                                  GRAPH)) | {local}
            undrawn = sorted((wanted & holding) - drawn) if drawn is not None else []
            return not missing and not undrawn, (
                f"served; machines {machines}" + (f"; MISSING {missing}" if missing else "") +
                ("" if drawn is None else f"; time_device points drawn for {sorted(drawn)}") +
                (f"; NONE for {undrawn}" if undrawn else ""))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 15)
        out = process.communicate(timeout=30)[0]
        lines = out.splitlines()
    said = [line for line in lines if not line.startswith("make: ***")]
    if process.returncode == 2 and len(said) == 1 and "needs" in said[0]:
        return True, f"tool missing, said in one line: {said[0]}"
    return False, "did not serve: " + " | ".join(lines[-5:])


def _outcome(command: Command, run: Run, log: Path, limit: float) -> tuple[bool, str]:
    """Whether `run` worked as the README shows, and a line saying how it ended."""
    if run.returncode is None:
        return False, f"still running after {COMMAND_TIMEOUT_S} s (output: {log})"
    lines = run.output.strip().splitlines()
    ok = run.returncode == 0
    verdict = VERDICTS.get(command.text)
    if verdict and run.returncode == 1:
        said = [line for line in lines if verdict.match(line)]
        ok = bool(said)
        lines = said or lines
    outcome = f"exit {run.returncode}" + (f" (its verdict: {lines[-1]})" if ok and run.returncode
                                          else "" if ok else
                                          f" (output: {log}): " + " | ".join(lines[-3:]))
    if "Traceback (most recent call last)" in run.output:
        ok, outcome = False, f"{outcome}; a TRACEBACK in its output ({log})"
    if run.limit_exceeded(limit):
        ok, outcome = False, (f"{outcome}; SILENT for {run.silence_s:.0f} s {run.silence_at} "
                              f"(limit {limit:.0f} s here)")
    return ok, outcome


@pytest.mark.readme
@pytest.mark.slow
# One item runs every command (each under COMMAND_TIMEOUT_S): more than the default limit
# of kernels/testing/isolation.py allows a test on a slow machine.
@pytest.mark.item_limit(3 * COMMAND_TIMEOUT_S)
@pytest.mark.skipif(os.environ.get("KERNELPERF_README_CHECK") != "1",
                    reason="minutes on 2 cores: run by `make readme-check` (in make test)")
def test_every_cpu_command_in_the_readme_runs(tmp_path):
    from kernels.bench import asv_tools

    clone = _clone(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = _environment(home)
    shipped = sorted(p.name for p in (clone / "perf_tests" / "results" / "asv").iterdir()
                     if p.is_dir())
    report, failures = [], []
    logs = tmp_path / "logs"
    logs.mkdir()
    commands = documented_commands(clone)
    # `make dashboard` once more at the end, on top of every local asv run above (plain asv
    # continuous and asv find among them): the shipped results must still be drawn.
    dashboard = next((c for c in commands if c.text == "make dashboard"), None)
    for index, command in enumerate([*commands, *([dashboard] if dashboard else [])]):
        if command.label != "cpu" or command.text in NOT_RUN:
            why = NOT_RUN.get(command.text, f"labelled # {command.comment}")
            report.append((command.text, command.document, "-", "-", "-", f"not run: {why}"))
            continue
        again = index >= len(commands)
        print(f"readme-check: {command.text} ({command.document})"
              f"{' (again, after the local runs)' if again else ''}", flush=True)
        start = time.monotonic()
        silence = "-"
        if command.text in SERVERS:
            ok, outcome = _serve(command, clone, env, shipped,
                                 asv_tools.machine_name() if again else None)
            status = "served" if ok else "-"
        else:
            run = run_command(command.text, clone, env, COMMAND_TIMEOUT_S)
            log = logs / f"{index:02d}.log"
            log.write_text(f"$ {command.text}\n{run.output}")
            ok, outcome = _outcome(command, run, log, silence_limit())
            status = "-" if run.returncode is None else str(run.returncode)
            silence = f"{run.silence_s:.0f} s"
        seconds = time.monotonic() - start
        report.append((command.text + (" (again)" if again else ""), command.document, status,
                       f"{seconds:.0f} s", silence, outcome if ok else f"FAILED {outcome}"))
        print(f"readme-check:   {seconds:.0f} s, silent at most {silence}, "
              f"{'ok' if ok else 'FAILED'}: {outcome}"[:400], flush=True)
        if status == "1" and command.text in VERDICTS:
            # What led to the verdict (a gate's table), kept in the check's own output: the
            # command's log goes with pytest's temporary folder.
            print("\n".join(f"    | {line}" for line in run.output.strip().splitlines()[-12:]),
                  flush=True)
        if not ok:
            failures.append(f"{command.text} ({command.document}): {outcome}")
    untracked = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"],
                               capture_output=True, text=True, check=True).stdout.split("\n")
    untracked = [line for line in untracked if line.strip() and not line.endswith(".venv")]
    if untracked:
        failures.append(f"files left in the clone outside ignored folders: {untracked}")
    print(tables.table([list(row) for row in report],
                       ["command", "document", "exit", "time", "longest silence", "outcome"]))
    shutil.rmtree(clone / ".asv", ignore_errors=True)
    assert not failures, "documented commands that no longer work as shown:\n" + \
        "\n".join(failures)
