"""A comparison of one commit with itself says so before anything is measured, in both entry
points: `kernels bench --base` (`make bench-compare BASE=main`) and plain `asv continuous BASE
HEAD` (through the asv plugin). Before, the first said "same commit" only after its asv run
(16 s on a 2-core CPU) and asv benchmarked the commit twice without a word."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from kernels import cli

# Skip only when the third-party package is missing (the GPU machine has no asv); an import
# error in our own modules must fail the module, never turn it into a skip.
if importlib.util.find_spec("asv") is None or importlib.util.find_spec("asv_runner") is None:
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from kernels.bench import asv_plugin, asv_tools, breakdown, interleaved  # noqa: E402


@pytest.fixture
def measured(monkeypatch, capsys):
    """asv and the interleaved gate stood in for: each run records what had been printed when
    it started and the revisions it was given; the compare and the breakdown do nothing."""
    runs = []

    def fake_bench(revisions, **_):
        runs.append((capsys.readouterr().out, list(revisions)))
        print("ASV MEASURING")
        return "test-gpu"

    def fake_gate(base, head, **_):
        runs.append((capsys.readouterr().out, [base, head]))
        print("GATE MEASURING")
        return 0

    monkeypatch.setattr(asv_tools, "bench", fake_bench)
    monkeypatch.setattr(asv_tools, "register_machine", lambda *args: "test-gpu")
    monkeypatch.setattr(interleaved, "gate", fake_gate)
    monkeypatch.setattr(asv_tools, "run", lambda *args, **kwargs: 0)
    monkeypatch.setattr(breakdown, "report", lambda *args, **kwargs: "")
    return runs


def test_kernels_bench_says_same_commit_before_asv_measures(measured, monkeypatch):
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: "a" * 40)
    assert cli.main(["bench", "--base", "main"]) == 0
    ((before, revisions),) = measured
    assert "kernels bench: main and HEAD are the same commit (aaaaaaaa): nothing to compare" \
        in before
    assert revisions == ["HEAD"]  # measured once


def test_kernels_bench_of_two_commits_says_nothing_of_the_kind(measured, monkeypatch, capsys):
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: (revision[0] * 40)[:40])
    assert cli.main(["bench", "--base", "main"]) == 0
    ((before, revisions),) = measured
    assert revisions == ["main", "HEAD"]
    assert "same commit" not in before + capsys.readouterr().out


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A git repository with one commit on `main` and an asv.conf.json naming this plugin, as
    the current directory (where asv reads its configuration)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "asv.conf.json").write_text(json.dumps({
        "version": 1, "project": "p", "repo": ".", "branches": ["main"], "dvcs": "git",
        "environment_type": "kernelperf", "plugins": [".kernels.asv_plugin"],
        "benchmark_dir": "benchmarks", "env_dir": "env", "results_dir": "results",
        "html_dir": "html"}))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.chdir(repo)
    return repo


def _continuous(*revisions: str) -> list[str]:
    return ["asv", "continuous", "--machine", "box", *revisions]


def test_the_plugin_names_one_commit_compared_with_itself(project):
    head = _git(project, "rev-parse", "HEAD")
    note = asv_plugin.same_commit_note(_continuous("main", "HEAD"))
    assert note is not None and note.startswith(
        f"asv continuous: main and HEAD are the same commit ({head[:8]}): asv will benchmark "
        "it twice")
    assert asv_plugin.same_commit_note(_continuous("-f", "1.02", "main", head)) is not None


def test_the_plugin_is_silent_for_two_commits_other_commands_and_unknown_names(project):
    _git(project, "checkout", "-q", "-b", "change")
    _git(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
         "--allow-empty", "-m", "two")
    assert asv_plugin.same_commit_note(_continuous("main", "HEAD")) is None
    assert asv_plugin.same_commit_note(_continuous("change", "main")) is None
    assert asv_plugin.same_commit_note(_continuous("HEAD~1", "main")) is not None  # one commit
    assert asv_plugin.same_commit_note(_continuous("HEAD")) is None  # the base: HEAD's parent
    assert asv_plugin.same_commit_note(["asv", "run", "HEAD^!"]) is None
    assert asv_plugin.same_commit_note(_continuous("no-such-branch", "HEAD")) is None


def test_plain_asv_continuous_says_same_commit_before_it_builds_or_measures(
        project, monkeypatch, capsys):
    """asv's own entry point, as `python -m asv continuous main HEAD` runs it: the line is out
    before asv's Run (environments, builds, benchmarks) starts."""
    from asv import main
    from asv.commands.run import Run

    started = []

    def fake_run(cls, conf, range_spec=None, **_):
        started.append((capsys.readouterr().out, list(range_spec)))
        return 3  # asv's continuous stops at a run's non-zero status

    monkeypatch.setattr(Run, "run", classmethod(fake_run))
    monkeypatch.setenv(breakdown.QUIET_VARIABLE, "1")  # no exit report registered here
    monkeypatch.setattr(sys, "argv", _continuous("main", "HEAD"))
    with pytest.raises(SystemExit) as stop:
        main.main()
    assert stop.value.code == 3
    ((before, commits),) = started
    head = _git(project, "rev-parse", "HEAD")
    assert commits == [head, head]  # what asv was about to benchmark twice
    assert f"main and HEAD are the same commit ({head[:8]})" in before
