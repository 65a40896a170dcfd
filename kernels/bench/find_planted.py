"""`asv find` with the kernelperf environment on a planted slowdown: which commit, how long.

Builds a scratch git repository from this checkout's files: a base commit, then --commits
more, each touching a note file, and the one at --plant-at also making the XLA softmax
compute its softmax --repeats times in a chain (each pass reads the previous one's output,
so XLA cannot drop it). Then runs, from this checkout, with asv's `kernelperf` environment:

    python -m asv find BASE..LAST Softmax.time_device

narrowed to XLA's forward (KERNELPERF_BENCH_IMPLS=xla, KERNELPERF_BENCH_DIRECTIONS=fwd,
KERNELPERF_BENCH_CASES=--case), with no --machine (the kernelperf plug-in names the machine
by its device model, as for any plain asv command), and reports whether asv named the
planted commit, how many commits it benchmarked and the wall time. asv find bisects: it
builds and benchmarks about log2(commits) + 2 commits, each an install of that commit into
the environment.

    python3 -m kernels.bench.find_planted                          # CPU: the CPU bench case
    python3 -m kernels.bench.find_planted --case f32-32768x4096 --out "$OUT"   # on the H100

Needs asv (on a machine without network: carried wheels on PYTHONPATH, which the kernelperf
environment passes through). Writes find_report.json, asv's log and job_summary.md (the
pull-request job summary of the range's first and last commits, from the results asv find
saved) to --out. Exit status 0 when asv found the planted commit, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kernels.bench import asv_tools, dashboard
from kernels.core import vcs

ROOT = Path(__file__).resolve().parents[2]

# Never copied into the scratch repository: build outputs, environments, results.
SKIP = {".git", ".asv", ".venv", ".whl", "__pycache__", ".pytest_cache", ".ruff_cache", "build",
        "traces", "results"}
XLA_SOFTMAX = Path("kernels/ops/softmax/xla.py")
LINE = "    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)\n"
IDENTITY = ("-c", "user.name=asv-find", "-c", "user.email=asv-find@localhost")


def planted(repeats: int) -> str:
    """The XLA softmax's return line replaced by `repeats` chained softmaxes."""
    return ("    y = jax.nn.softmax(x.astype(jnp.float32), axis=-1)\n"
            f"    for _ in range({repeats - 1}):  # planted slowdown (asv find check)\n"
            "        y = jax.nn.softmax(x.astype(jnp.float32) + y * 1e-30, axis=-1)\n"
            "    return y.astype(x.dtype)\n")


def git(repo: Path, *args: str) -> str:
    return vcs.output(repo, *IDENTITY, *args)


def scratch_repo(repo: Path, commits: int, plant_at: int, repeats: int) -> list[str]:
    """The scratch repository; its commits, base first."""
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if path.is_file() and not SKIP.intersection(relative.parts):
            (repo / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, repo / relative)
    source = (repo / XLA_SOFTMAX).read_text()
    if LINE not in source:
        raise SystemExit(f"{XLA_SOFTMAX}: expected the line {LINE.strip()!r} to plant the "
                         "slowdown in; the file changed, update this script")
    git(repo, "init", "-q", "-b", "main")
    hashes = []
    for index in range(commits + 1):
        (repo / "FIND_NOTE.txt").write_text(f"step {index}\n")
        message = "base" if index == 0 else f"step {index}"
        if index == plant_at:
            (repo / XLA_SOFTMAX).write_text(source.replace(LINE, planted(repeats)))
            message += f": planted slowdown, {repeats} chained softmaxes"
        git(repo, "add", "--all")
        git(repo, "commit", "-q", "-m", message)
        hashes.append(git(repo, "rev-parse", "HEAD"))
    return hashes


def job_summary(results: Path, machine: str, base: str, head: str) -> str | None:
    """The pull-request job summary (asv_tools.render_markdown) for the searched range's ends,
    from the results asv find saved; None when either end has none."""
    before, after = (asv_tools.load(str(results), machine, commit) for commit in (base, head))
    if not before or not after:
        return None
    rows = asv_tools.compare(before, after)
    heading = f"asv on {machine}: {base[:8]} (first of the range) -> {head[:8]} (last)"
    return asv_tools.render_markdown(rows, heading) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=8, help="commits after the base")
    parser.add_argument("--plant-at", type=int, default=5, help="1..commits")
    parser.add_argument("--repeats", type=int, default=2, help="softmax passes when planted")
    parser.add_argument("--case", help="KERNELPERF_BENCH_CASES (default: every bench case)")
    parser.add_argument("--out", default=os.environ.get("OUT") or ".", help="report folder")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args(argv)
    if not 1 <= args.plant_at <= args.commits:
        parser.error(f"--plant-at: expected 1..{args.commits} (--commits), got {args.plant_at}")
    if args.repeats < 2:
        parser.error(f"--repeats: expected at least 2 softmax passes, got {args.repeats}")

    work = Path(tempfile.mkdtemp(prefix="kernelperf-asv-find-"))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    hashes = scratch_repo(repo, args.commits, args.plant_at, args.repeats)
    machine = asv_tools.machine_name()  # the plug-in registers it for asv find (setup hook)
    config = dashboard.asv_config(repo, work / "results", work / "html", branches=["main"],
                                  env_dir=work / "env")
    env = {**os.environ, "KERNELPERF_BENCH_IMPLS": "xla", "KERNELPERF_BENCH_DIRECTIONS": "fwd"}
    if args.case:
        env["KERNELPERF_BENCH_CASES"] = args.case
    start = time.monotonic()
    # Written as asv goes, so a run cut short by a time limit still shows how far it got.
    with dashboard.asv_command(config, "find", "--show-stderr", f"{hashes[0]}..{hashes[-1]}",
                               r"Softmax\.time_device") as command, \
            open(out / "asv_find.log", "w") as log_file:
        print("+ " + " ".join(command), flush=True)
        result = subprocess.run(command, cwd=ROOT, env=env, stdout=log_file,
                                stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    log = (out / "asv_find.log").read_text()
    print(log[-4000:])
    found = re.search(r"Greatest regression found: ([0-9a-f]+)", log)
    benchmarked = len(re.findall(r"For kernelperf commit", log))
    planted_hash = hashes[args.plant_at]
    report = {
        "machine": machine, "commits_searched": args.commits, "planted": planted_hash,
        "found": found.group(1) if found else None,
        "found_planted": bool(found) and planted_hash.startswith(found.group(1)),
        "commits_benchmarked": benchmarked, "wall_s": round(seconds, 1),
        "asv_exit_status": result.returncode, "case": args.case, "repeats": args.repeats,
        "command": " ".join(command),
    }
    (out / "find_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    # BASE..LAST excludes BASE, as in git: the range's ends are the first and last steps.
    summary = job_summary(work / "results", machine, hashes[1], hashes[-1])
    if summary:
        (out / "job_summary.md").write_text(summary)
        print(summary)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if report["found_planted"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
