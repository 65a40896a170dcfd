"""The gate's confirmation (kernels.bench.confirm): a "slower" row stands only if base and
head, measured again in interleaved rounds, show it in every round."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

if importlib.util.find_spec("asv") is None:  # third-party only: see test_test_hygiene
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from kernels.bench import asv_tools, confirm  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIME = "benchmarks.Softmax.time_device"
PARAMS = ("'xla'", "'f32-64x1000'", "'fwd'")
KEY = ("softmax", "xla", "f32-64x1000", "fwd")


@pytest.mark.parametrize(("ratios", "confirmed"), [
    ((1.02, 1.021, 1.019), True),  # a real 2% regression, every round
    ((1.03, 1.0, 1.0), False),  # one slow process or spell
    ((1.004, 1.004, 1.045), False),  # a round under half the gap
    ((1.0055, 1.0055, 1.0055), False),  # every round over half the gap, the mean under it
    ((1.02, 1.02), True),  # a round missing: nothing was disproved, the first pass stands
    ((1.0,), False),  # one round at the base's time decides, the others unmeasured
])
def test_decide(ratios, confirmed):
    assert confirm.decide(ratios, gap=0.01, rounds=3).confirmed is confirmed


def _row(verdict: str, params=PARAMS) -> asv_tools.Row:
    return asv_tools.Row(TIME, params, 1e-3, 1.02e-3, 1.02, verdict, gap=0.01)


def _fake(medians: dict[str, list[float]]):
    """measure(commit, keys, journal): the next of each commit's medians per round."""
    order = []

    def measure(commit, keys, index):
        order.append(commit)
        value = medians[commit][sum(c == commit for c in order) - 1]
        return {key: {"event": "done", "samples": [value] * 10} for key in keys}
    return measure, order


def test_only_flagged_time_rows_are_measured_again_and_rounds_alternate():
    measure, order = _fake({"base": [1.0, 1.0, 1.0], "head": [1.02, 1.021, 1.019]})
    rows = [_row("slower"), _row("same", ("'torch'", "'f32-64x1000'", "'fwd'")),
            asv_tools.Row("benchmarks.Softmax.track_gbps", PARAMS, 1.0, 0.5, 0.5,
                          "worse (no samples)")]
    out = confirm.confirm(rows, "base", "head", rounds=3, measure=measure,
                          log=lambda _: None)
    assert order == ["base", "head", "head", "base", "base", "head"]
    assert out[0].verdict == "slower" and out[0].confirmed.startswith("1.020 1.021 1.019")
    assert out[1:] == rows[1:]
    assert asv_tools.exit_status(out) == 1


def test_a_slowdown_one_round_shows_is_not_confirmed():
    measure, _ = _fake({"base": [1.0, 1.0, 1.0], "head": [1.03, 1.0, 1.001]})
    out = confirm.confirm([_row("slower")], "base", "head", rounds=3, measure=measure,
                          log=lambda _: None)
    assert out[0].verdict == "same (not confirmed)"
    assert asv_tools.exit_status(out) == 0


def test_rows_name_their_operation_by_the_benchmark_class():
    assert confirm.key_of("benchmarks.RowSum.time_device", PARAMS, confirm.class_names()) == \
        ("row_sum", "xla", "f32-64x1000", "fwd")


BASE, HEAD = "b" * 40, "c" * 40  # full hashes, as `kernels bench` passes them


def _recording(medians: dict[str, list[float]], fail: set[tuple[str, int]] = frozenset(),
               mhz: dict[str, float] | None = None):
    """measure(...) as _fake, also recording each call's journal; a (commit, round) in `fail`
    has its key's measurement fail; with `mhz`, each commit's samples ran at that SM clock."""
    calls = []

    def measure(commit, keys, index):
        calls.append((commit, index))
        index = sum(c == commit for c, _ in calls) - 1
        if (commit, index) in fail:
            return {key: {"event": "failed", "reason": "worker killed by SIGSEGV"}
                    for key in keys}
        clocks = {"clocks": [mhz[commit]] * 10} if mhz else {}
        return {key: {"event": "done", "samples": [medians[commit][index]] * 10, **clocks}
                for key in keys}
    return measure, calls


def _confirm(rows, measure, rounds=3, log=None):
    return confirm.confirm(rows, BASE, HEAD, rounds=rounds, measure=measure,
                           log=log or (lambda _: None))


def test_the_ratio_is_head_over_base_whatever_the_base_reads():
    measure, calls = _recording({BASE: [2e-3] * 3, HEAD: [2.04e-3] * 3})
    out = _confirm([_row("slower")], measure)
    assert out[0].verdict == "slower" and out[0].confirmed.startswith("1.020 1.020 1.020")
    assert len(calls) == 6  # slower in every round: measured in every round


def test_a_slowdown_under_half_the_rows_gap_in_every_round_is_not_confirmed():
    # 0.4% every round: confirmed by a gap of 0, not by this row's 1%
    measure, _ = _recording({BASE: [1.0] * 3, HEAD: [1.004] * 3})
    assert _confirm([_row("slower")], measure)[0].verdict == "same (not confirmed)"


def test_a_row_without_a_gap_needs_only_every_round_slower():
    measure, calls = _recording({BASE: [1.0] * 3, HEAD: [1.004] * 3})
    row = asv_tools.Row(TIME, PARAMS, 1e-3, 1.004e-3, 1.004, "slower")  # gap None
    assert _confirm([row], measure)[0].verdict == "slower" and len(calls) == 6


@pytest.mark.parametrize("lost", [0, 1])
def test_a_round_lost_on_one_side_leaves_the_first_pass_standing(lost):
    """A measurement that failed (a crashed worker) disproves nothing: the rounds that have
    both sides are too few, so the row stays slower and says why (the first round lost too)."""
    measure, _ = _recording({BASE: [1.0] * 3, HEAD: [1.02] * 3}, fail={(HEAD, lost)})
    out = _confirm([_row("slower")], measure)
    assert out[0].verdict == "slower" and "incomplete: 2 of 3" in out[0].confirmed


def test_a_round_under_half_the_gap_settles_the_row_and_it_is_measured_no_more():
    """An A/A run's chance flag costs one round: the first round reads it the same."""
    lines = []
    measure, calls = _recording({BASE: [1.0] * 3, HEAD: [1.004] * 3})
    out = _confirm([_row("slower")], measure, log=lines.append)
    assert [commit for commit, _ in calls] == [BASE, HEAD]
    assert out[0].verdict == "same (not confirmed)" and "under half the gap" in out[0].confirmed
    assert any("by round 1: no more rounds" in line for line in lines)


@pytest.mark.parametrize(("head", "rounds", "calls", "said"), [
    ([1.005] * 3, 3, 2, "by round 1"),  # exactly half the gap settles it
    ([1.02, 1.0, 1.0], 3, 4, "by round 2"),
    ([1.0], 1, 2, None),  # settled in the last round: nothing left to skip
])
def test_settling_says_when_rounds_are_skipped(head, rounds, calls, said):
    lines = []
    measure, made = _recording({BASE: [1.0] * 3, HEAD: head})
    out = _confirm([_row("slower")], measure, rounds=rounds, log=lines.append)
    assert len(made) == calls and out[0].verdict == "same (not confirmed)"
    skipped = [line for line in lines if "no more rounds" in line]
    assert (skipped == []) if said is None else (len(skipped) == 1 and said in skipped[0])


@pytest.mark.parametrize(("head", "verdict"), [
    ([0.97, 0.975, 0.97], "faster"),  # a real 3% speed-up, every round
    ([0.97, 1.0, 0.97], "same (not confirmed)"),  # one fast process
])
def test_a_faster_row_is_confirmed_the_other_way(head, verdict):
    """A chance reading must not pass for a speed-up either: a faster row stays faster only if
    every round reads the head faster by half the gap and their mean by the whole gap; the
    table keeps head/base."""
    measure, calls = _recording({BASE: [1.0] * 3, HEAD: head})
    row = asv_tools.Row(TIME, PARAMS, 1e-3, 0.97e-3, 0.97, "faster", gap=0.01)
    out = _confirm([row], measure)
    assert out[0].verdict == verdict and out[0].confirmed.startswith(f"{head[0]:.3f} ")
    assert len(calls) == (6 if verdict == "faster" else 4)
    if verdict == "faster":
        assert out[0].confirmed.endswith("(mean 0.972)")  # head/base, as the column says


def test_only_the_rows_still_open_are_measured_in_later_rounds():
    slow, chance = _row("slower"), _row("slower", ("'torch'", "'f32-64x1000'", "'fwd'"))
    asked = []

    def measure(commit, keys, index):
        asked.append((commit, sorted(key[1] for key in keys)))
        head = commit == HEAD
        return {key: {"event": "done", "samples": [1.02 if head and key[1] == "xla" else 1.0]}
                for key in keys}
    out = _confirm([slow, chance], measure)
    assert asked[:2] == [(BASE, ["torch", "xla"]), (HEAD, ["torch", "xla"])]
    assert all(keys == ["xla"] for _, keys in asked[2:]) and len(asked) == 6
    assert [row.verdict for row in out] == ["slower", "same (not confirmed)"]


@pytest.mark.parametrize("sides", [(BASE, HEAD), (HEAD,)])
def test_a_row_no_round_measured_stays_slower(sides):
    measure, _ = _recording({BASE: [1.0] * 3}, fail={(c, i) for c in sides for i in range(3)})
    out = _confirm([_row("slower")], measure)
    assert out[0].verdict == "slower" and "incomplete: 0 of 3" in out[0].confirmed


def test_no_rounds_measure_nothing_and_one_round_measures_each_side_once():
    measure, calls = _recording({BASE: [1.0], HEAD: [1.05]})
    assert _confirm([_row("slower")], measure, rounds=0) == [_row("slower")] and not calls
    out = _confirm([_row("slower")], measure, rounds=1)
    assert [c for c, _ in calls] == [BASE, HEAD] and out[0].verdict == "slower"


def test_each_round_is_asked_by_its_index_in_the_interleaved_order():
    measure, calls = _recording({BASE: [1.0] * 3, HEAD: [1.02] * 3})
    _confirm([_row("slower")], measure)
    assert calls == [(BASE, 0), (HEAD, 0), (HEAD, 1), (BASE, 1), (BASE, 2), (HEAD, 2)]


def test_the_log_names_each_round_and_commit_and_the_time_taken():
    lines = []
    measure, _ = _recording({BASE: [1.0] * 3, HEAD: [1.02] * 3})
    _confirm([_row("slower")], measure, log=lines.append)
    assert all(isinstance(line, str) for line in lines)
    text = "\n".join(lines)
    # commits by their 8-character short hash, as the compare's header names them
    assert f"of {BASE[:8]} and {HEAD[:8]}," in text and BASE[:9] not in text
    assert "confirming 1 slower row(s):" in text
    both = []
    confirm.confirm([_row("slower"), _row("faster", ("'torch'", "'f32-64x1000'", "'fwd'"))],
                    BASE, HEAD, rounds=1, measure=_recording({BASE: [1.0], HEAD: [1.0]})[0],
                    log=both.append)
    assert both[0].startswith("confirming 1 slower, 1 faster row(s):")
    rounds = [line.split() for line in lines if line.strip().startswith("round ")]
    assert [(words[1], words[2]) for words in rounds] == [
        (f"{i}:", commit[:8]) for i, commit in
        [(1, BASE), (1, HEAD), (2, HEAD), (2, BASE), (3, BASE), (3, HEAD)]]
    took = next(line for line in lines if line.startswith("confirmation took"))
    assert 0 <= float(took.split()[2]) < 60


def test_the_default_log_prints_each_line(capsys):
    measure, _ = _recording({BASE: [1.0] * 3, HEAD: [1.02] * 3})
    confirm.confirm([_row("slower")], BASE, HEAD, rounds=3, measure=measure)
    assert capsys.readouterr().out.count("\n  round ") == 6


def test_the_decision_keeps_its_ratios_and_says_why():
    done = confirm.decide((1.02, 1.03, 1.01), gap=0.01, rounds=3)
    assert done.ratios == (1.02, 1.03, 1.01) and "mean 1.020" in done.text
    short = confirm.decide((1.02, 1.03), gap=0.01, rounds=3)
    assert short.ratios == (1.02, 1.03) and "incomplete: 2 of 3 rounds" in short.text
    settled = confirm.decide((1.0,), gap=0.01, rounds=3)
    assert settled.ratios == (1.0,) and "under half the gap" in settled.text
    assert "(mean 1.013)" in confirm.decide((1.0, 1.02, 1.02), gap=0.01, rounds=3).text


def test_a_change_exactly_at_the_bar_is_not_beyond_it():
    # every round exactly at half the gap (1.005), the mean beyond it
    assert not confirm.decide((1.005, 1.02, 1.05), gap=0.01, rounds=3).confirmed
    assert not confirm.decide((1.005,), gap=0.01, rounds=3).confirmed  # and when settling
    # every round beyond half the gap, the mean exactly at it (2.0 = 1 + 1.0)
    assert not confirm.decide((2.0, 2.0, 2.0), gap=1.0, rounds=3).confirmed


# -- the SM clock in a round (confirm.clock_factor, from the samples' "clocks")

@pytest.mark.parametrize(("verdict", "head", "mhz"), [
    ("slower", 1.05, {BASE: 1980.0, HEAD: 1860.0}),  # the head throttled 6%: 1.05 / 1.065
    ("faster", 0.95, {BASE: 1860.0, HEAD: 1980.0}),  # the base throttled: the other way
])
def test_a_change_its_clocks_explain_settles_in_the_first_round(verdict, head, mhz):
    """In cycles the round reads the same (under half the gap), so the row is measured no
    more and is not confirmed; without the clocks it would read 5% and be measured again."""
    lines = []
    measure, calls = _recording({BASE: [1.0] * 3, HEAD: [head] * 3}, mhz=mhz)
    out = _confirm([_row(verdict)], measure, log=lines.append)
    assert [commit for commit, _ in calls] == [BASE, HEAD]
    assert out[0].verdict == "same (not confirmed)"
    assert "counted as 0.98" in out[0].confirmed
    assert any("by round 1: no more rounds" in line for line in lines)


def test_a_clock_gap_at_the_tolerance_explains_nothing():
    at = 1 + confirm.CLOCK_TOLERANCE
    assert confirm.clock_factor({"clocks": [100.0 * at]}, {"clocks": [100.0]}) == 1.0
    assert confirm.clock_factor({"clocks": [100.0 * at * 1.001]}, {"clocks": [100.0]}) > at


def test_a_clocked_decision_shows_its_ratios_then_each_clocked_round():
    done = confirm.decide((1.05, 1.02), gap=0.01, rounds=2, factors=(1.05,))
    assert done.text == ("1.050 1.020 [round 1 counted as 1.000 in cycles (clocks 5% apart)] "
                         "(mean 1.010)")
    two = confirm.decide((1.05, 1.06), gap=0.01, rounds=2, factors=(1.05, 1.03))
    assert two.text.startswith("1.050 1.060 [round 1 counted as 1.000 in cycles (clocks 5% "
                               "apart); round 2 counted as 1.029 in cycles (clocks 3% apart)]")
    with pytest.raises(ValueError):  # a factor for a round that has no ratio
        confirm.decide((1.05,), gap=0.01, rounds=2, factors=(1.05, 1.0))


def test_the_default_measure_is_a_pool_of_live_workers_under_the_confirm_folder(monkeypatch,
                                                                               tmp_path):
    """Without `measure`: one Pool for both commits, journals in a dated folder under
    confirm_dir()/journals, the log and every key passed on, closed at the end."""
    made = []

    class FakePool:
        def __init__(self, root, *, keys, log):
            self.root, self.keys, self.log, self.closed = root, keys, log, False
            made.append(self)

        def measure(self, commit, keys, index):
            value = 1.02 if commit == HEAD else 1.0
            return {key: {"event": "done", "samples": [value] * 10} for key in keys}

        def close(self):
            self.closed = True

    monkeypatch.setenv(confirm.ROOT_VARIABLE, str(tmp_path))
    monkeypatch.setattr(confirm, "Pool", FakePool)
    lines = []
    log = lines.append
    out = confirm.confirm([_row("slower")], BASE, HEAD, rounds=3, log=log)
    assert out[0].verdict == "slower" and len(made) == 1
    pool = made[0]
    assert pool.closed and pool.log is log
    assert pool.keys == {BASE: [KEY], HEAD: [KEY]}
    assert pool.root.parent == confirm.confirm_dir() / "journals"
    assert re.fullmatch(r"\d{8}-\d{6}", pool.root.name), pool.root.name
    assert lines[-1].startswith("confirmation took") and lines[-1].endswith(
        ": 6 measurement(s) now")


def test_a_pools_worker_runs_the_commits_tree_with_this_interpreter(monkeypatch, tmp_path):
    from perf_tests import measuring

    made = {}

    class FakeWorker:
        def __init__(self, name, root, keys, **options):
            made.update(name=name, root=root, keys=keys, **options)

    monkeypatch.setattr(measuring, "LiveWorker", FakeWorker)
    monkeypatch.setattr(confirm, "source_tree", lambda commit: tmp_path / "tree")
    spawn, command = object(), ["python", "w.py"]
    pool = confirm.Pool(tmp_path / "j", keys={HEAD: [KEY]}, dashboard=True, log=print,
                        spawn=spawn, worker_command=command)
    assert pool.worker(HEAD) is pool.worker(HEAD)  # made once
    assert made["name"] == HEAD[:8] and made["root"] == tmp_path / "j" / HEAD[:12]
    assert made["keys"] == [KEY] and made["python"] == sys.executable
    assert made["dashboard"] is True and made["log"] is print and made["spawn"] is spawn
    assert made["worker_command"] == command
    assert made["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(
        (tmp_path / "tree").resolve())
    confirm.Pool(tmp_path / "k", keys={HEAD: [KEY]}).worker(HEAD)
    assert made["dashboard"] is False  # the gate's rounds time the kernel, no dashboard extras


def test_commit_trees_go_beside_asvs_own_folders_by_default(monkeypatch):
    """In the checkout's asv folder (where asv.conf.json keeps environments and results, and
    .gitignore keeps git out), not in a folder of its own that git status would list."""
    monkeypatch.delenv(confirm.ROOT_VARIABLE, raising=False)
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    asv_folder = pathlib.Path(conf["results_dir"]).parts[0]
    assert pathlib.Path(conf["env_dir"]).parts[0] == asv_folder
    assert not confirm.confirm_dir().is_absolute()
    assert confirm.confirm_dir().parts[0] == asv_folder


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_a_commits_tree_is_its_files_made_once(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "version.py").write_text("V = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "kernels" / "version.py").write_text("V = 2\n")
    _git(repo, "commit", "-q", "-am", "two")
    monkeypatch.chdir(repo)
    monkeypatch.setenv(confirm.ROOT_VARIABLE, str(tmp_path / "confirm"))
    leftover = tmp_path / "confirm" / "trees" / (first[:12] + ".partial")
    leftover.mkdir(parents=True)
    (leftover / "junk").write_text("an interrupted archive")
    tree = confirm.source_tree(first)
    assert tree.parent == tmp_path / "confirm" / "trees"
    assert (tree / "kernels" / "version.py").read_text() == "V = 1\n"  # the commit's, not HEAD's
    assert sorted(p.name for p in tree.parent.iterdir()) == [tree.name]  # the partial is gone
    # kept: asked again, it is not archived again (git could not: the repository is gone)
    shutil.rmtree(repo / ".git")
    assert confirm.source_tree(first) == tree
    # a tree elsewhere when asked
    other = tmp_path / "elsewhere"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(subprocess.CalledProcessError):
        confirm.source_tree(first, root=other)  # no repository here: git's error, not a tree
    assert not (other / "trees" / first[:12]).exists()
