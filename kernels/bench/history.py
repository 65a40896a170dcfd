"""Benchmark history of main: asv on the commits without results, kept in a git branch, published.

The nightly workflow (.github/workflows/nightly.yml) runs these steps in a checkout of main,
each a subcommand of `python -m kernels.bench.history`; correctness_tests/test_history.py runs the
same subcommands against a bare repository standing in for the remote.

  fetch    the remote's results branch (asv-results) checked out as a git worktree of the
           checkout at .asv/history; a new, empty branch when the remote has none yet
  run      asv on the newest first-parent commits of main that have no result for this
           machine yet (at most --max-commits of the last --window; with --spread, that
           many spread evenly over the window's gaps instead: a back-fill)
  push     commit this machine's result files and push them; a push rejected because another
           runner pushed first is redone on top of the remote's new tip
  publish  asv publish of every machine's results into .asv/html, scripts made local
           where Debian's copies are installed, with kernelperf's views (graphs that open on
           filters with points: kernels.bench.dashboard.prepare) and regressions searched
           with each row's threshold from its noise (dashboard.regression_settings)
  deploy   the published folder as the one commit of the pages branch (gh-pages),
           force-pushed; GitHub Pages serves that branch

Results are kept as asv keeps them, one folder per machine, and the machine name is the
normalised GPU model (kernels.bench.asv_tools.machine_name), so runners with different GPUs write
to different folders and a push never touches another machine's files; the one shared file,
benchmarks.json, is merged (a union, this run's entries winning). asv's own `NEW` range is
not per machine (it starts after the newest commit with results on any machine), so `run`
picks the commits itself and hands them to asv as a HASHFILE, with --skip-existing-commits.
The worktree shares the checkout's git configuration, so the push uses the credentials
actions/checkout stored there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels.core import vcs

RESULTS_BRANCH = "asv-results"
PAGES_BRANCH = "gh-pages"
OPTIONS_VARIABLE = "KERNELPERF_HISTORY_OPTIONS"
PUSH_ATTEMPTS = 3  # runners of different GPU models finishing within seconds of each other
# Who commits when git has no identity configured (a CI runner).
FALLBACK_IDENTITY = ("kernelperf history", "kernelperf-history@localhost")


@dataclasses.dataclass(frozen=True, kw_only=True)
class History:
    """Where the history lives and how much of main one run benchmarks."""

    root: Path = dataclasses.field(default_factory=Path.cwd)  # the checkout of the project
    remote: str = "origin"  # remote (name or URL) holding the results and pages branches
    results_branch: str = RESULTS_BRANCH
    pages_branch: str = PAGES_BRANCH
    branch: str = "main"  # the branch whose history is benchmarked (a local branch)
    results_dir: Path = Path(".asv/history")  # the results branch's worktree; relative to root
    html_dir: Path = Path(".asv/html")
    machine: str | None = None  # asv machine name; default: this device's normalised model
    max_commits: int = 4  # benchmarked per run, newest first
    window: int = 50  # how far back along main's first parents a run looks for gaps
    bench: str | None = None  # asv --bench regex
    # Pick max_commits spread evenly over the window's commits without results, newest and
    # oldest included, rather than the newest: a back-fill draws lines over the whole window.
    spread: bool = False

    def __post_init__(self) -> None:
        for name in ("remote", "results_branch", "pages_branch", "branch"):
            if not getattr(self, name):
                raise ValueError(f"{name}: expected a non-empty name, got {getattr(self, name)!r}")
        if self.results_branch in (self.branch, self.pages_branch):
            raise ValueError(f"results_branch: expected a branch of its own, got "
                             f"{self.results_branch!r} (branch {self.branch!r}, pages "
                             f"{self.pages_branch!r})")
        if self.max_commits < 1:
            raise ValueError(f"max_commits: expected at least 1, got {self.max_commits}")
        if self.window < self.max_commits:
            raise ValueError(f"window: expected at least max_commits ({self.max_commits}), "
                             f"got {self.window}")
        root = Path(self.root).resolve()
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "results_dir", root / self.results_dir)
        object.__setattr__(self, "html_dir", root / self.html_dir)

    def machine_name(self) -> str:
        from kernels.bench import asv_tools

        return self.machine or asv_tools.machine_name()


def _identity(cwd: Path) -> list[str]:
    """`-c user.name=.. -c user.email=..` for a commit where git has no identity (CI)."""
    if vcs.git(cwd, "config", "user.email", check=False).stdout.strip():
        return []
    return ["-c", f"user.name={FALLBACK_IDENTITY[0]}", "-c", f"user.email={FALLBACK_IDENTITY[1]}"]


def remote_tip(history: History) -> str | None:
    """Fetch the remote's results branch; its commit, or None if the remote has none yet."""
    branch = history.results_branch
    listed = vcs.git(history.root, "ls-remote", "--heads", history.remote, branch).stdout.split()
    if not listed:
        return None
    tracking = f"refs/remotes/{_remote_label(history)}/{branch}"
    vcs.git(history.root, "fetch", "--quiet", "--no-tags", history.remote,
            f"+{listed[0]}:{tracking}")
    return vcs.git(history.root, "rev-parse", tracking).stdout.strip()


def _remote_label(history: History) -> str:
    """A ref-safe name for the remote (it may be given as a URL or a path)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in history.remote)


def _empty_commit(history: History) -> str:
    """A root commit with an empty tree: the start of a results branch the remote lacks."""
    tree = vcs.git(history.root, "mktree").stdout.strip()  # from no lines: the empty tree
    return vcs.git(history.root, *_identity(history.root), "commit-tree", tree, "-m",
                "asv results: empty history").stdout.strip()


def fetch(history: History) -> str:
    """Check out the remote's results branch as a worktree at `results_dir`; its commit."""
    tip = remote_tip(history)
    start = tip or _empty_commit(history)
    path = history.results_dir
    vcs.git(history.root, "worktree", "prune")  # a worktree whose folder a clean removed
    if (path / ".git").exists():
        # Result files of an earlier run that were never pushed are untracked: they stay.
        vcs.git(path, "checkout", "--quiet", "--force", "-B", history.results_branch, start)
    elif path.exists() and any(path.iterdir()):
        raise FileExistsError(f"results_dir: expected a worktree of the {history.results_branch}"
                              f" branch or no folder, got a folder with files: {path}")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        vcs.git(history.root, "worktree", "add", "--quiet", "--force", "-B", history.results_branch,
             str(path), start)
    machines = sorted(p.name for p in path.iterdir() if (p / "machine.json").is_file())
    print(f"{history.results_branch}: {'commit ' + tip[:8] if tip else 'new, empty'} at {path}; "
          f"machines: {', '.join(machines) or 'none'}")
    return start


def benchmarked(history: History, machine: str) -> set[str]:
    """Commits (full hashes) with a result file for `machine` in the results worktree."""
    from asv import results as asv_results

    if not (history.results_dir / machine).is_dir():
        return set()
    return {result.commit_hash for result in
            asv_results.iter_results_for_machine(str(history.results_dir), machine)}


def new_commits(history: History, machine: str) -> list[str]:
    """Main's newest first-parent commits without results for `machine`, newest first."""
    ref = vcs.git(history.root, "rev-parse", "--verify", f"refs/heads/{history.branch}",
               check=False)
    if ref.returncode:
        raise ValueError(f"branch: expected a local branch of {history.root}, got "
                         f"{history.branch!r} (`git branch -f {history.branch} origin/"
                         f"{history.branch}` makes one)")
    recent = vcs.git(history.root, "rev-list", "--first-parent", f"-n{history.window}",
                  ref.stdout.strip()).stdout.split()
    done = benchmarked(history, machine)
    missing = [commit for commit in recent if commit not in done]
    if not history.spread or len(missing) <= history.max_commits:
        return missing[:history.max_commits]
    step = (len(missing) - 1) / max(1, history.max_commits - 1)
    return [missing[round(i * step)] for i in range(history.max_commits)]


def _asv_config(history: History) -> dict:
    """The checkout's asv.conf.json, results kept in the worktree, every path absolute."""
    from kernels.bench import dashboard

    return dashboard.asv_config(history.root, history.results_dir, history.html_dir,
                                branches=[history.branch], env_dir=history.root / ".asv/env")


def _asv(history: History, *args: str, settings: dict | None = None) -> int:
    """asv with the history's configuration (and `settings` over it), its output shown as it
    goes; its exit status."""
    from kernels.bench import dashboard

    with dashboard.asv_command({**_asv_config(history), **(settings or {})}, *args) as command:
        print("+ " + " ".join(command), flush=True)
        return subprocess.run(command, cwd=history.root).returncode


def run(history: History) -> int:
    """asv on `new_commits`; asv's exit status (2: some benchmark failed), 0 if none was new."""
    from kernels.bench import asv_tools

    machine = asv_tools.register_machine(history.machine)
    # The dashboard's throughput, roofline and launch graphs too, as `kernels bench` records.
    os.environ[asv_tools.DASHBOARD_VARIABLE] = "1"
    commits = new_commits(history, machine)
    if not commits:
        print(f"every one of the last {history.window} commits of {history.branch} has results "
              f"for {machine}: nothing to run")
        return 0
    for commit in commits:
        subject = vcs.git(history.root, "log", "-1", "--format=%h %s", commit).stdout.strip()
        print(f"to benchmark on {machine}: {subject}")
    with tempfile.TemporaryDirectory(prefix="kernelperf-history-") as tmp:
        hashes = Path(tmp) / "commits.txt"
        hashes.write_text("\n".join(commits) + "\n")
        # --record-samples keeps the samples asv's Mann-Whitney test reads (asv_tools.verdict).
        args = ["run", "--machine", machine, "--show-stderr", "--record-samples",
                "--skip-existing-commits", f"HASHFILE:{hashes}"]
        return _asv(history, *args, *(["--bench", history.bench] if history.bench else []))


def _merged_benchmarks(history: History, tip: str | None) -> dict | None:
    """benchmarks.json of the remote's tip with this run's entries over it (None: neither)."""
    path = history.results_dir / "benchmarks.json"
    ours = json.loads(path.read_text()) if path.is_file() else {}
    theirs = {}
    if tip:
        shown = vcs.git(history.results_dir, "show", f"{tip}:benchmarks.json", check=False)
        theirs = json.loads(shown.stdout) if shown.returncode == 0 else {}
    merged = {**theirs, **ours}
    return merged or None


def push(history: History) -> str | None:
    """Commit this machine's new result files on top of the remote's tip and push them.

    Only `<machine>/` and the merged benchmarks.json are staged, so other machines' files are
    whatever the remote has. A rejected push (another runner pushed meanwhile) is redone from
    the new tip. Returns the commit pushed, or None when there was nothing new.
    """
    machine = history.machine_name()
    worktree = history.results_dir
    if not (worktree / ".git").exists():
        raise FileNotFoundError(f"results_dir: expected the worktree made by `fetch`, got "
                                f"nothing at {worktree}")
    for attempt in range(1, PUSH_ATTEMPTS + 1):
        tip = remote_tip(history)
        if tip:  # the index becomes the remote's tip; the files on disk stay as they are
            vcs.git(worktree, "reset", "--quiet", "--mixed", tip)
        if (worktree / machine).is_dir():
            vcs.git(worktree, "add", "--all", "--", machine)
        merged = _merged_benchmarks(history, tip)
        if merged:
            (worktree / "benchmarks.json").write_text(json.dumps(merged, indent=4,
                                                                 sort_keys=True) + "\n")
            vcs.git(worktree, "add", "--", "benchmarks.json")
        staged = vcs.git(worktree, "diff", "--cached", "--name-only").stdout.split()
        new = sorted({Path(name).name.split("-")[0] for name in staged
                      if name.startswith(f"{machine}/") and Path(name).name != "machine.json"})
        if not new:
            print(f"no new results for {machine} to push")
            return None
        vcs.git(worktree, *_identity(worktree), "commit", "--quiet", "-m",
             f"asv results for {machine}: {len(new)} commit(s) {' '.join(new)}")
        pushed = vcs.git(worktree, "push", "--quiet", history.remote,
                      f"HEAD:refs/heads/{history.results_branch}", check=False)
        if pushed.returncode == 0:
            vcs.git(worktree, "reset", "--quiet", "--hard", "HEAD")  # other machines' files too
            commit = vcs.git(worktree, "rev-parse", "HEAD").stdout.strip()
            print(f"pushed {commit[:8]} to {history.results_branch}: results of {machine} "
                  f"for {' '.join(new)}")
            return commit
        print(f"push {attempt} of {PUSH_ATTEMPTS} rejected ({pushed.stderr.strip()}); "
              "again on the remote's new tip", flush=True)
    raise RuntimeError(f"could not push to {history.remote} {history.results_branch} after "
                       f"{PUSH_ATTEMPTS} attempts")


def publish(history: History) -> list[str]:
    """asv publish of every machine's kept results into html_dir; the commits it lists."""
    from kernels.bench import dashboard

    if not (history.results_dir / "benchmarks.json").is_file():
        raise FileNotFoundError(f"results_dir: expected asv results (benchmarks.json) in "
                                f"{history.results_dir}; run `fetch` (and `run`) first")
    # The Regressions page's thresholds from the kept results' own noise.
    settings, thresholds = dashboard.regression_settings(history.results_dir)
    status = _asv(history, "publish", "--no-pull", settings=settings)
    if status:
        raise RuntimeError(f"asv publish failed ({status})")
    dashboard.write_thresholds(history.html_dir, thresholds)
    try:
        dashboard.prepare(history.html_dir)
    except FileNotFoundError as error:  # on GitHub Pages the CDNs are reachable anyway
        print(f"dashboard scripts left on their CDNs: {error}")
        dashboard.prepare(history.html_dir, offline=False)
    index = json.loads((history.html_dir / "index.json").read_text())
    commits = list(index["revision_to_hash"].values())
    print(f"published {history.html_dir}: {len(commits)} commits of {history.branch}, "
          f"machines {', '.join(sorted(index['params'].get('machine', [])))}")
    return commits


def deploy(history: History) -> str:
    """Force-push html_dir as the one commit of the pages branch; that commit.

    The commit is built in the checkout's own object store with a throw-away index, so the
    push uses the checkout's remote and credentials and no clone of the pages branch is made.
    """
    if not (history.html_dir / "index.html").is_file():
        raise FileNotFoundError(f"html_dir: expected a published dashboard, got no index.html in"
                                f" {history.html_dir}; run `publish` first")
    (history.html_dir / ".nojekyll").touch()  # serve the folder as it is, no Jekyll
    with tempfile.TemporaryDirectory(prefix="kernelperf-pages-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        tree_args = ["--work-tree", str(history.html_dir)]
        vcs.git(history.root, *tree_args, "add", "--all", "--force", ".", env=env)
        tree = vcs.git(history.root, "write-tree", env=env).stdout.strip()
    results = vcs.git(history.results_dir, "rev-parse", "--short", "HEAD", check=False)
    commit = vcs.git(history.root, *_identity(history.root), "commit-tree", tree, "-m",
                  f"asv dashboard of {history.results_branch} {results.stdout.strip()}"
                  ).stdout.strip()
    vcs.git(history.root, "push", "--quiet", "--force", history.remote,
         f"{commit}:refs/heads/{history.pages_branch}")
    print(f"deployed {commit[:8]} to {history.pages_branch}")
    return commit


STEPS = {"fetch": fetch, "run": run, "push": push, "publish": publish, "deploy": deploy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernels.bench.history",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__,
        epilog=f"Options may also come from ${OPTIONS_VARIABLE} (shell words, read before "
        "the command line's).")
    parser.add_argument("steps", nargs="+", choices=list(STEPS), metavar="STEP",
                        help=f"one or more of {', '.join(STEPS)}, run in the order given")
    parser.add_argument("--remote", default="origin")
    parser.add_argument("--results-branch", default=RESULTS_BRANCH)
    parser.add_argument("--pages-branch", default=PAGES_BRANCH)
    parser.add_argument("--branch", default="main", help="the branch benchmarked (local)")
    parser.add_argument("--machine", help="asv machine name (default: this device's model)")
    parser.add_argument("--max-commits", type=int, default=History.max_commits)
    parser.add_argument("--window", type=int, default=History.window)
    parser.add_argument("--bench", help="asv benchmark regex (e.g. Softmax.time_device)")
    parser.add_argument("--spread", action="store_true",
                        help="run: --max-commits spread evenly over the window's commits "
                        "without results (a back-fill), not the newest")
    # The workflow sets its options once, in the environment, for every step; the command
    # line's come after them, so they win.
    options = shlex.split(os.environ.get(OPTIONS_VARIABLE, ""))
    args = parser.parse_args([*options, *(sys.argv[1:] if argv is None else argv)])
    try:
        history = History(remote=args.remote, results_branch=args.results_branch,
                          pages_branch=args.pages_branch, branch=args.branch,
                          machine=args.machine, max_commits=args.max_commits,
                          window=args.window, bench=args.bench, spread=args.spread)
    except ValueError as error:
        parser.error(str(error))
    status = 0
    for step in args.steps:
        print(f"== {step}", flush=True)
        result = STEPS[step](history)
        if step == "run" and result:
            status = result  # a failed benchmark: still push and publish the rest
    return status


if __name__ == "__main__":
    raise SystemExit(main())
