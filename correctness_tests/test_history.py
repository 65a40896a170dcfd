"""The nightly workflow rehearsed on this machine's CPU: its own `kernels.bench.history` steps, read
from .github/workflows/nightly.yml, run twice against a bare repository standing in for GitHub."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from correctness_tests import fakes
from kernels.bench import history

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github/workflows/nightly.yml"
MACHINE = "cpu-rehearsal"
BENCHMARK = "benchmarks.Softmax.time_device"
BENCH_REGEX = shlex.quote(r"Softmax\.time_device")
# One tiny benchmark: Softmax by XLA, forward, on the CPU bench case (about 20 s a commit).
BENCH_ENV = {"KERNELPERF_BENCH_IMPLS": "xla", "KERNELPERF_BENCH_DIRECTIONS": "fwd",
             "KERNELPERF_BENCH_CASES": "f32"}
GIT = ["git", "-c", "user.name=rehearsal", "-c", "user.email=rehearsal@localhost"]


def workflow_steps() -> dict[str, list[str]]:
    """Per job of the nightly workflow, the `run:` lines of its kernels.bench.history steps."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return {name: [step["run"] for step in job["steps"] if "kernels.bench.history" in
                   step.get("run", "")] for name, job in jobs.items()}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def files_on(remote: Path, branch: str) -> dict[str, str]:
    """path -> blob hash of every file on `branch` of the bare repository."""
    listing = git(remote, "ls-tree", "-r", branch)
    return {line.split("\t")[1]: line.split()[2] for line in listing.splitlines()}


def show(remote: Path, branch: str, path: str) -> str:
    return git(remote, "show", f"{branch}:{path}")


class Rehearsal:
    """A bare remote with main, and fresh clones of it that run the workflow's steps."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.remote = tmp / "remote.git"
        self.seed = tmp / "seed"
        subprocess.run([*GIT, "init", "-q", "--bare", "-b", "main", str(self.remote)], check=True)
        # The project as it is in this working tree (tracked and new files), as main's start.
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached",
                                 "--others", "--exclude-standard"], check=True,
                                capture_output=True, text=True).stdout.split("\0")
        for name in filter(None, listed):
            if (ROOT / name).is_file():
                (self.seed / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, self.seed / name)
        git(self.seed, "init", "-q", "-b", "main")
        git(self.seed, "remote", "add", "origin", str(self.remote))
        self.commit("the project")
        # `python3` in the workflow's run lines is this interpreter.
        shims = tmp / "bin"
        shims.mkdir()
        # (a script, not a link: a venv's python finds its packages from its own path)
        (shims / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        (shims / "python3").chmod(0o755)
        self.env = {**os.environ, **BENCH_ENV, "HOME": str(tmp / "home"),
                    "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
                    history.OPTIONS_VARIABLE: f"--machine {MACHINE} --bench {BENCH_REGEX}"}
        self.env.pop("PYTHONPATH", None)  # the checkout's own `kernels`, as in the workflow
        (tmp / "home").mkdir()
        self.runs = 0

    def commit(self, message: str) -> str:
        """Commit the seed's files to main and push: a new commit of main on the remote."""
        (self.seed / "NIGHTLY.txt").write_text(message + "\n")
        git(self.seed, "add", "--all")
        git(self.seed, "commit", "-q", "-m", message)
        git(self.seed, "push", "-q", "origin", "main")
        return git(self.seed, "rev-parse", "HEAD")

    def job(self, name: str, before: dict[str, object] | None = None) -> str:
        """Run one job's kernels.bench.history steps in a fresh clone (a runner's checkout); their
        output. `before` maps a step ("push") to a callable run just before it."""
        self.runs += 1
        checkout = self.tmp / f"{name}-{self.runs}"
        subprocess.run(["git", "clone", "-q", str(self.remote), str(checkout)], check=True)
        output = []
        for line in workflow_steps()[name]:
            for step, hook in (before or {}).items():
                if f"kernels.bench.history {step}" in line:
                    hook()
            start = time.monotonic()
            result = subprocess.run(["bash", "-c", line], cwd=checkout, env=self.env,
                                    capture_output=True, text=True)
            output.append(f"$ {line}  # {time.monotonic() - start:.1f} s\n"
                          f"{result.stdout}{result.stderr}")
            assert result.returncode == 0, "\n".join(output)[-6000:]
        return "\n".join(output)

    def nightly(self, **hooks) -> str:
        return self.job("bench", hooks) + self.job("pages")


def other_runner_pushes(remote: Path, tmp: Path) -> None:
    """Another GPU model's runner pushes its results to the results branch."""
    clone = tmp / "other-runner"
    subprocess.run(["git", "clone", "-q", "-b", history.RESULTS_BRANCH, str(remote), str(clone)],
                   check=True)
    shutil.copytree(clone / MACHINE, clone / "other-gpu")
    machine_file = clone / "other-gpu" / "machine.json"
    machine_file.write_text(machine_file.read_text().replace(MACHINE, "other-gpu"))
    for result in (clone / "other-gpu").glob("*-*.json"):
        result.write_text(result.read_text().replace(f'"{MACHINE}"', '"other-gpu"'))
    git(clone, "add", "--all")
    git(clone, "commit", "-q", "-m", "results of another GPU model")
    git(clone, "push", "-q", "origin", f"HEAD:{history.RESULTS_BRANCH}")


def reject_next_push(remote: Path) -> None:
    """The remote refuses the next push to the results branch once, as GitHub does a push
    that is no longer a fast-forward when another runner pushed between fetch and push."""
    marker = remote / "reject-once"
    marker.touch()
    hook = remote / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\nif [ -e {marker} ]; then rm {marker}; "
                    "echo 'rejected once by the rehearsal' >&2; exit 1; fi\n")
    hook.chmod(0o755)


def test_workflow_runs_every_history_step():
    steps = workflow_steps()
    found = [word for line in steps["bench"] + steps["pages"] for word in line.split()
             if word in history.STEPS]
    assert found == ["fetch", "run", "push", "fetch", "publish", "deploy"], steps


def test_two_nightly_runs_keep_and_publish_the_history(tmp_path):
    rehearsal = Rehearsal(tmp_path)
    first = git(rehearsal.seed, "rev-parse", "HEAD")

    output = rehearsal.nightly()
    print("\n".join(line for line in output.splitlines() if line.startswith("$")))
    results = files_on(rehearsal.remote, history.RESULTS_BRANCH)
    ours = {path: blob for path, blob in results.items()
            if path.startswith(f"{MACHINE}/") and not path.endswith("machine.json")}
    assert [Path(p).name[:8] for p in ours] == [first[:8]], (results, output[-3000:])
    index = json.loads(show(rehearsal.remote, history.PAGES_BRANCH, "index.json"))
    assert set(index["revision_to_hash"].values()) == {first}, output[-3000:]

    second = rehearsal.commit("a new commit of main")
    output = rehearsal.nightly(push=lambda: (other_runner_pushes(rehearsal.remote, tmp_path),
                                             reject_next_push(rehearsal.remote)))
    assert f"to benchmark on {MACHINE}: {second[:7]}" in output
    assert f"{first[:7]} the project" not in output.split("== run")[1].split("== push")[0], \
        "the second night benchmarked the first night's commit again"
    assert "push 1 of 3 rejected" in output, output[-3000:]
    print("\n".join(line for line in output.splitlines() if line.startswith("$")))

    results = files_on(rehearsal.remote, history.RESULTS_BRANCH)
    kept = {path: blob for path, blob in results.items() if path.startswith(f"{MACHINE}/")}
    assert sorted(Path(p).name[:8] for p in kept if not p.endswith("machine.json")) == \
        sorted([first[:8], second[:8]]), results
    assert all(kept[path] == blob for path, blob in ours.items()), "first night's file changed"
    assert any(path.startswith("other-gpu/") for path in results), "other runner clobbered"

    # The deployed dashboard: both commits, both machines, and two points on the graph.
    index = json.loads(show(rehearsal.remote, history.PAGES_BRANCH, "index.json"))
    assert set(index["revision_to_hash"].values()) == {first, second}
    assert sorted(index["params"]["machine"]) == sorted([MACHINE, "other-gpu"])
    pages = files_on(rehearsal.remote, history.PAGES_BRANCH)
    graphs = [path for path in pages if path.endswith(f"/{BENCHMARK}.json")
              and f"machine-{MACHINE}" in path]
    assert graphs, sorted(pages)[:40]
    points = json.loads(show(rehearsal.remote, history.PAGES_BRANCH, graphs[0]))
    assert len([p for p in points if p[1] is not None]) == 2, points
    assert ".nojekyll" in pages


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match=r"max_commits: expected at least 1, got 0"):
        history.History(max_commits=0)
    with pytest.raises(ValueError, match=r"results_branch: expected a branch of its own"):
        history.History(results_branch="main")


@pytest.mark.parametrize("spread,expected", [
    (False, [9, 8, 6, 5]),  # the newest without results, newest first
    (True, [9, 6, 2, 0]),  # newest, oldest and evenly between (of 9 8 6 5 3 2 1 0)
])
def test_a_run_picks_the_newest_gaps_or_spreads_over_the_window(tmp_path, spread, expected):
    """Ten commits of main, two of them (7 and 4) with results already: `run` never picks
    those, takes --max-commits of the rest, and with --spread covers the whole window."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commits = []
    for number in range(10):
        (repo / "n.txt").write_text(f"{number}\n")
        git(repo, "add", "n.txt")
        git(repo, "commit", "-q", "-m", f"commit {number}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    for number in (7, 4):
        fakes.asv_result_file(tmp_path / "results", MACHINE, commits[number], {})
    settings = history.History(root=repo, results_dir=tmp_path / "results", max_commits=4,
                               window=10, spread=spread)
    assert history.benchmarked(settings, MACHINE) == {commits[7], commits[4]}
    picked = history.new_commits(settings, MACHINE)
    assert picked == [commits[number] for number in expected]
    one = dataclasses.replace(settings, max_commits=1)
    assert history.new_commits(one, MACHINE) == [commits[9]]
