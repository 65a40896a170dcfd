"""git, run for the tools that make commits, plant changes, fetch and publish results
(gate-power, find_planted, the fault drill, the nightly history, the dashboard): one
wrapper, whose failures carry git's own message, and the scratch clone the planting tools
work in."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(cwd: Path, *args: str, check: bool = True, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    """git in `cwd`; RuntimeError with git's message if it fails and `check`."""
    result = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                            env=env, stdin=subprocess.DEVNULL)
    if check and result.returncode:
        raise RuntimeError(f"git {' '.join(args)} (in {cwd}) failed ({result.returncode}): "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def output(cwd: Path, *args: str) -> str:
    """What `git args` prints in `cwd`, stripped; RuntimeError if it fails."""
    return git(cwd, *args).stdout.strip()


def scratch_clone(source: Path, commit: str, into: Path, who: str) -> None:
    """A clone of `source` in `into` with branch main at `commit`, committing as `who`
    (gate-power and the fault drill plant their changes there)."""
    output(into.parent, "clone", "-q", str(source), str(into))
    output(into, "checkout", "-q", "-B", "main", commit)
    output(into, "config", "user.email", f"{who}@kernelperf")
    output(into, "config", "user.name", f"kernelperf {who}")
