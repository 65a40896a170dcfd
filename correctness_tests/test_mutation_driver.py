"""`make mutation`'s own bookkeeping (kernels/testing/mutation.py), without running mutmut: what
counts as text only, how a module is scored, what a target must say."""

from __future__ import annotations

import pytest

from kernels.testing import mutation

ORIGINAL = '''
def x_add__mutmut_orig(sub):
    p = sub.add_parser("gate", help="plant slowdowns")
    p.add_argument("--trials", type=int, default=3, help=f"trials ({' '.join(NAMES)})")
'''


@pytest.mark.parametrize("mutant, text", [
    (ORIGINAL.replace('help="plant slowdowns"', 'help="XXplant slowdownsXX"'), True),
    (ORIGINAL.replace('help="plant slowdowns"', "help=None"), True),
    (ORIGINAL.replace("' '.join", "'XX XX'.join"), True),  # inside an f-string's help
    (ORIGINAL.replace("default=3", "default=4"), False),
    (ORIGINAL.replace('"--trials"', '"XX--trialsXX"'), False),
    (ORIGINAL.replace('"gate"', '"GATE"'), False),
    (ORIGINAL.replace(', help="plant slowdowns"', ""), False),  # an argument gone is code
    (ORIGINAL.replace("type=int, ", ""), False),
])
def test_text_only_is_a_change_to_shown_text_and_nothing_else(mutant, text):
    mutant = mutant.replace("mutmut_orig", "mutmut_7")
    assert mutation.text_only(ORIGINAL, mutant, ("help", "metavar")) is text


def test_a_module_is_scored_over_every_mutant():
    """Unreached ('no tests') and surviving mutants count against the score, equivalents
    (listed or text only) leave it, a survivor with a reason stays in it but is listed."""
    statuses = {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "timeout",
                "m.x_f__mutmut_3": "survived", "m.x_f__mutmut_4": "no tests",
                "m.x_f__mutmut_5": "survived", "m.x_f__mutmut_6": "not checked"}
    scored = mutation.score_module("m", statuses, text=frozenset({"m.x_f__mutmut_5"}))
    assert (scored.total, scored.killed, scored.scored) == (6, 2, 5)
    assert scored.equivalent == ("m.x_f__mutmut_5",)
    assert scored.survivors == ("m.x_f__mutmut_3", "m.x_f__mutmut_4")
    assert scored.not_run == ("m.x_f__mutmut_6 (not checked)",)
    assert scored.percent == "40%"


def test_a_target_names_its_part_when_it_is_not_whole_modules():
    with pytest.raises(ValueError, match="need a scope"):
        mutation.Target(name="t", modules=("kernels/core/timing.py",), tests=("a.py",),
                        functions=("kernels.core.timing.x_collect__*",))
    whole = mutation.Target(name="t", modules=("kernels/ops/*/spec.py",), tests=("a.py",))
    assert whole.globs == ("kernels.ops.*.spec.*",)


def test_every_target_runs_tests_that_exist():
    import pathlib

    root = pathlib.Path(mutation.ROOT)
    for target in mutation.TARGETS:
        files = [arg.split("::")[0] for arg in target.tests if arg.endswith(".py")]
        assert files and all((root / f).exists() for f in files), target.name


def test_every_targets_modules_lie_where_mutmut_mutates():
    """mutmut mutates only under its source paths: gate-measuring's perf_tests/measuring.py
    was copied as it was, and the target scored nothing (0 files mutated) without failing."""
    for target in mutation.TARGETS:
        sources, copied = mutation.mutmut_paths(target)
        assert all(module.split("/", 1)[0] in sources for module in target.modules), target
        assert not set(sources) & set(copied)
    measuring = next(t for t in mutation.TARGETS if t.name == "gate-measuring")
    assert mutation.mutmut_paths(measuring) == (
        ["kernels", "perf_tests"], ["correctness_tests", "conftest.py", "asv.conf.json",
                                    "README.md", "docs"])


def test_a_target_that_mutated_nothing_fails_saying_so(monkeypatch, capsys):
    """A target whose modules mutmut never mutated scored nothing and used to pass."""
    monkeypatch.setattr(mutation, "check_warmup", lambda: None)
    monkeypatch.setattr(mutation, "_prepare",
                        lambda target, **_: mutation.SCRATCH / target.name)
    monkeypatch.setattr(mutation, "_mutmut", lambda *args, **kwargs: "")
    monkeypatch.setattr(mutation, "results", lambda work: {})
    assert mutation.main(["gate-breakdown"]) == 1
    assert "gate-breakdown: NO MUTANTS of kernels/bench/breakdown.py" in capsys.readouterr().out


def test_a_failed_clean_run_gives_no_score(monkeypatch, capsys):
    """mutmut exits 1 both when mutants survive and when the tests fail unmutated; the
    results an earlier run left were then printed as this run's score."""
    monkeypatch.setattr(mutation, "check_warmup", lambda: None)
    monkeypatch.setattr(mutation, "_prepare",
                        lambda target, **_: mutation.SCRATCH / target.name)
    monkeypatch.setattr(mutation, "_mutmut",
                        lambda *args, **kwargs: f"    done\n{mutation.CLEAN_RUN_FAILED}\n")
    earlier = {f"kernels.bench.confirm.x_decide__mutmut_{n}": "killed" for n in range(1, 9)}
    monkeypatch.setattr(mutation, "results", lambda work: earlier)
    assert mutation.main(["gate-confirm"]) == 1
    out = capsys.readouterr().out
    assert "gate-confirm: NO SCORE: mutmut's clean run" in out
    assert "killed" not in out


def test_recorded_results_are_dropped_when_anything_but_the_targets_modules_changes(
        tmp_path, monkeypatch):
    """mutmut retests a mutant only when its own function changed: a test added to kill a
    survivor must make every mutant run again, a change to the target's module alone not."""
    root = tmp_path / "root"
    (root / "kernels").mkdir(parents=True)
    (root / "correctness_tests").mkdir()
    (root / "kernels" / "target.py").write_text("def f():\n    return 1\n")
    (root / "kernels" / "other.py").write_text("X = 1\n")
    (root / "correctness_tests" / "test_target.py").write_text("def test_f(): pass\n")
    monkeypatch.setattr(mutation, "ROOT", root)
    target = mutation.Target(name="t", modules=("kernels/target.py",),
                             tests=("correctness_tests/test_target.py",))
    work = tmp_path / "work"
    meta = work / "mutants" / "kernels" / "target.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text("{}")

    def dropped() -> bool:
        was = mutation._drop_stale_results(work, target)
        assert was is not meta.exists()
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text("{}")
        return was

    assert dropped()  # results recorded before any stamp: of an unknown tree
    assert not dropped()  # stamped now, nothing changed
    (root / "kernels" / "target.py").write_text("def f():\n    return 2\n")
    assert not dropped()  # mutmut follows its own module's changes
    (root / "correctness_tests" / "test_target.py").write_text("def test_f(): assert 1\n")
    assert dropped()
    (root / "kernels" / "other.py").write_text("X = 2\n")
    assert dropped()
    assert not dropped()  # nothing changed since
    (root / "correctness_tests" / "test_target.py").write_text("def test_f(): assert 2\n")
    assert not mutation._drop_stale_results(work, target, keep=True) and meta.exists()
    assert not dropped()  # --rerun-survivors kept them, and the tree is stamped as seen


def test_a_rerun_of_survivors_says_when_mutmut_will_run_every_mutant_again(
        tmp_path, monkeypatch, capsys):
    """mutmut forgets every recorded result when its settings change (the test selection,
    pytest's arguments): --rerun-survivors then reruns everything, and says so; with the same
    settings it stays quiet."""
    root = tmp_path / "root"
    for folder in ("kernels", "correctness_tests", "perf_tests", "docs"):
        (root / folder).mkdir(parents=True)
    for name in ("conftest.py", "asv.conf.json", "README.md"):
        (root / name).write_text("")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "kernels" / "target.py").write_text("def f():\n    return 1\n")
    (root / "correctness_tests" / "test_target.py").write_text("def test_f(): pass\n")
    monkeypatch.setattr(mutation, "ROOT", root)
    monkeypatch.setattr(mutation, "SCRATCH", tmp_path / "scratch")
    target = mutation.Target(name="t", modules=("kernels/target.py",),
                             tests=("correctness_tests/test_target.py",))
    mutation._prepare(target)
    mutation._prepare(target, keep_results=True)
    assert "runs every mutant again" not in capsys.readouterr().err
    narrower = mutation.dataclasses.replace(target, tests=(*target.tests, "-k", "f"))
    mutation._prepare(narrower, keep_results=True)
    assert "t: mutmut's settings changed" in capsys.readouterr().err
    mutation._prepare(narrower, keep_results=True)  # recorded: the same settings again
    assert "runs every mutant again" not in capsys.readouterr().err


def test_the_documents_the_defaults_tests_read_go_into_the_scratch_copy():
    """cli-defaults' tests read the documented defaults from README.md and docs/*.md: a copy
    without docs/ fails every mutant's tests alike, and every mutant reads as killed."""
    from correctness_tests import documents

    tops = {path.relative_to(documents.ROOT).parts[0] for path in documents.paths()}
    assert "docs" in tops and tops <= set(mutation.COPIED), (tops, mutation.COPIED)
