"""The command line meets user mistakes with one line naming what exists, and a non-zero exit."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from kernels import cli
from kernels.core import validation

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(capsys, *argv: str) -> tuple[int, str]:
    """Exit status and stderr of `python -m kernels ARGV`, run in this process."""
    try:
        status = cli.main(list(argv))
    except SystemExit as exit_:  # argparse's own exit
        status = exit_.code
    err = capsys.readouterr().err
    return status, err


def roofline_data(**changes) -> dict:
    """A roofline data file's contents as `python -m kernels roofline` writes them (one point,
    no ceilings), with top-level `changes`."""
    point = {"op": "softmax", "impl": "xla", "case": "f32-64x1000", "direction": "fwd",
             "dtype": "f32", "flops": 3.2e5, "bytes": 5.1e5, "median_s": 2e-5, "placement": {}}
    return {"model": "cpu", "timestamp": "20261125-000000", "fingerprint": {"name": "cpu"},
            "ceilings": {"datasheet": None, "measured": None}, "points": [point], **changes}


def _files(tmp_path: pathlib.Path) -> dict[str, str]:
    point = roofline_data()["points"][0]
    contents = {
        "bad.json": '{"model": ',
        "nokeys.json": json.dumps({"model": "x"}),
        "a-file": "",
        "ints.json": json.dumps(roofline_data(model=1, points=4)),
        "nopoints.json": json.dumps(roofline_data(points=[])),
        "noceilings.json": json.dumps(roofline_data(ceilings={})),
        "textflops.json": json.dumps(roofline_data(points=[{**point, "flops": "abc"}])),
        "noflops.json": json.dumps(roofline_data(points=[{**point, "flops": 0}])),
        "valid.json": json.dumps(roofline_data()),
    }
    for name, text in contents.items():
        (tmp_path / name).write_text(text)
    return {name: str(tmp_path / name) for name in [*contents, "missing.json"]}


# (argv, words the one line must contain). `{name}` is a file made by _files.
MISTAKES = [
    (["check", "nosuchop"], ["unknown operation 'nosuchop'", "softmax"]),
    (["check", "softmax", "--impl", "nosuch"], ["unknown implementation 'nosuch'", "pallas"]),
    (["check", "softmax", "--tags", "nosuchtag"], ["tags", "'cpu'", "nosuchtag"]),
    (["check", "softmax", "--seed", "-1"], ["--seed", ">= 0", "'-1'"]),
    (["time", "nosuchop"], ["unknown operation 'nosuchop'"]),
    (["time", "softmax", "--impl", "pallas", "--dims", "rows=4", "cols=8", "--dtype", "f64"],
     ["--dtype", "'f32'", "f64"]),
    (["time", "softmax", "--dtype", "fp32"], ["--dtype", "'fp32'", "f32"]),
    (["time", "softmax", "--versus", "cudnn"], ["--versus", "'copy'", "'fastest'", "'cudnn'",
                                                "not an implementation of softmax"]),
    (["time", "softmax", "--impl", "xla", "--versus", "torch"],
     ["--versus", "['xla']", "'torch'", "not among those timed (--impl)"]),
    (["time", "softmax", "--dims", "rows=0", "cols=8"], ["--dims", ">= 1", "'0'"]),
    (["time", "softmax", "--dims", "rows=-3", "cols=8"], ["--dims", ">= 1", "'-3'"]),
    (["time", "softmax", "--dims", "rows=4", "depth=8"], ["--dims", "['rows', 'cols']",
                                                         "depth"]),
    (["time", "softmax", "--budget", "nan"], ["--budget", "> 0", "'nan'"]),
    (["time", "softmax", "--budget", "0"], ["--budget", "> 0", "'0'"]),
    (["time", "softmax", "--budget", "-1"], ["--budget", "> 0", "'-1'"]),
    (["time", "softmax", "--budget", "inf"], ["--budget", "finite", "'inf'"]),
    (["time", "softmax", "--case", "nosuchcase"], ["nosuchcase", "f32-37x128"]),
    (["time", "softmax", "--tags", "nosuchtag"], ["tags", "nosuchtag"]),
    (["roofline", "softmax", "--out", "{a-file}"], ["--out", "directory", "a-file"]),
    (["plot-roofline", "{missing.json}"], ["json", "does not exist"]),
    (["plot-roofline", "{bad.json}"], ["json", "not JSON"]),
    (["plot-roofline", "{nokeys.json}"], ["json", "lacks", "'points'"]),
    (["plot-roofline", "{ints.json}"], ["json", "not one", "'model' a string", "1"]),
    (["plot-roofline", "{nopoints.json}"], ["json", "'points' a non-empty list", "[]"]),
    (["plot-roofline", "{noceilings.json}"], ["json", "'ceilings' an object", "{}"]),
    (["plot-roofline", "{textflops.json}"], ["json", "points[0]['flops'] a number", "'abc'"]),
    (["plot-roofline", "{noflops.json}"], ["json", "no point with FLOPs to draw"]),
    (["plot-roofline", "{valid.json}", "--out", "{a-file}"], ["--out", "directory"]),
    (["compare", "nosuchrev"], ["base", "git revision", "'nosuchrev'"]),
    (["bench", "--base", "nosuchrev"], ["--base", "git revision", "'nosuchrev'"]),
    (["compare", "HEAD", "--min-gap", "nan"], ["--min-gap", ">= 0", "'nan'"]),
    (["noise-floor", "--runs", "1"], ["--runs", ">= 2", "'1'"]),
    (["time", "softmax", "--dims", "rows=4", "cols=8", "rows=5"],
     ["--dims", "each dimension once", "['rows']"]),
    (["time", "softmax", "--dims", "rows=4,,8", "cols=8"], ["--dims", ">= 1", "'4,,8'"]),
    (["time", "softmax", "--case", ""], ["--case", "empty", "every case"]),
    (["verify-timing", "--repeats", "1"], ["--repeats", ">= 2", "'1'"]),
    (["verify-timing", "--calls", "0"], ["--calls", ">= 1", "'0'"]),
    (["verify-timing", "--impl", "nosuch"], ["--impl/--case", "'triton'", "nosuch"]),
    (["verify-timing", "--case", "nosuchcase"], ["--impl/--case", "f32-256x1024",
                                                 "nosuchcase"]),
    (["profile", "softmax", "--case", "f32-37x128", "--iterations", "0"],
     ["--iterations", ">= 1", "'0'"]),
    (["profile", "softmax", "--case", "f32-37x128", "--top", "-5"], ["--top", ">= 1", "'-5'"]),
    (["profile", "softmax", "--case", "f32-37x128", "--traces", "{a-file}"],
     ["--traces", "directory", "a-file"]),
    (["profile", "softmax", "--case", "nosuchcase"], ["--case: expected one of", "nosuchcase"]),
    (["profile", "softmax", "--impl", "torch", "--case", "f32-37x128"],
     ["--impl", "JAX implementations", "softmax-torch"]),
    (["memory", "softmax", "--tags", "nosuchtag"], ["tags", "'cpu'", "nosuchtag"]),
    (["hlo", "softmax", "--tags", "nosuchtag"], ["tags", "'cpu'", "nosuchtag"]),
    (["tune", "nosuchop"], ["op", "tunable", "'matmul'", "'nosuchop'"]),
    (["gate-power", "--sizes", ""], ["sizes", "fractions", "[]"]),
    (["gate-power", "--factor", "inf"], ["factor", "finite", "inf"]),
    (["gate-power", "--trials", "0", "--aa-trials", "0", "--no-speedup"],
     ["trials", "something to run"]),
    (["profile", "nosuchop", "--case", "x"], ["unknown operation 'nosuchop'"]),
    (["hlo", "softmax", "--impl", "nosuch"], ["unknown implementation 'nosuch'"]),
    (["bottleneck", "attention", "--impl", "nosuch", "--case", "bf16-4x4096x16x128"],
     ["unknown implementation 'nosuch'"]),
    (["bottleneck", "attention", "--impl", "triton", "--case", "nosuch"],
     ["case: expected one of", "'nosuch'"]),
    (["nosuchcommand"], ["invalid choice", "'nosuchcommand'", "check"]),
]


@pytest.mark.parametrize("argv,words", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_user_mistake_is_one_line_and_a_nonzero_exit(capsys, tmp_path, argv, words):
    files = _files(tmp_path)
    argv = [files[arg[1:-1]] if arg.startswith("{") else arg for arg in argv]
    status, err = _run(capsys, *argv)
    assert status == 2, (status, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_the_checked_data_file_layout_is_what_plot_roofline_draws(capsys, tmp_path):
    files = _files(tmp_path)
    assert _run(capsys, "plot-roofline", files["valid.json"], "--out", str(tmp_path / "png")) \
        == (0, "")
    assert [p.name for p in (tmp_path / "png").iterdir()] == \
        ["roofline_fwd_cpu_20261125-000000.png"]


def test_roofline_that_measured_nothing_writes_no_data_file(capsys, tmp_path):
    from kernels.core import devices

    if devices.this_machine().has_gpu:
        pytest.skip("the CUDA softmax runs on a GPU")
    status, err = _run(capsys, "roofline", "softmax", "--impl", "cuda", "--out", str(tmp_path))
    assert status == 1 and "nothing measured" in err
    assert list(tmp_path.iterdir()) == []


def test_a_real_bug_keeps_its_traceback(monkeypatch):
    from kernels.cli import measure as measure_cli

    def broken(args):
        raise ZeroDivisionError("a bug, not a user mistake")

    monkeypatch.setattr(measure_cli, "cmd_ceilings", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(["ceilings"])


def test_unknown_names_are_user_errors_and_still_key_errors():
    from kernels.core import registry

    with pytest.raises(validation.UnknownName) as caught:
        registry.operation("nope")
    assert isinstance(caught.value, KeyError)
    assert str(caught.value).startswith("unknown operation 'nope'")  # not quoted like a key


@pytest.mark.parametrize("convert,text,message", [
    (validation.positive_float, "nan", "expected a finite number > 0, got 'nan'"),
    (validation.positive_float, "0", "expected a finite number > 0, got '0'"),
    (validation.positive_float, "x", "expected a finite number > 0, got 'x'"),
    (validation.nonnegative_float, "-0.1", "expected a finite number >= 0, got '-0.1'"),
    (validation.positive_int, "0", "expected an integer >= 1, got '0'"),
    (validation.positive_int, "1.5", "expected an integer >= 1, got '1.5'"),
    (validation.nonnegative_int, "-1", "expected an integer >= 0, got '-1'"),
    (validation.int_at_least(2), "1", "expected an integer >= 2, got '1'"),
    (validation.int_at_least(2), "inf", "expected an integer >= 2, got 'inf'"),
])
def test_number_arguments_refuse_what_they_cannot_use(convert, text, message):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=message.replace(".", r"\.")):
        convert(text)


@pytest.mark.parametrize("convert,text,value", [
    (validation.positive_float, "0.5", 0.5), (validation.nonnegative_float, "0", 0.0),
    (validation.positive_int, "1", 1), (validation.nonnegative_int, "0", 0),
    (validation.int_at_least(2), "2", 2),
])
def test_number_arguments_take_their_edge_values(convert, text, value):
    assert convert(text) == value


def test_output_directory_refuses_a_file_and_takes_a_new_or_existing_folder(tmp_path):
    import argparse

    (tmp_path / "a-file").write_text("")
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"expected a directory \(existing or new\), got '.*a-file', which "
                             r"is a file"):
        validation.output_directory(str(tmp_path / "a-file"))
    for folder in (tmp_path, tmp_path / "new" / "nested"):
        assert validation.output_directory(str(folder)) == str(folder)


def test_the_process_prints_no_traceback():
    done = subprocess.run([sys.executable, "-m", "kernels", "check", "nosuchop"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m kernels check: error: unknown operation 'nosuchop'; known: ['attention', "
        "'matmul', 'mlp', 'moe', 'row_sum', 'sharded_matmul', 'sharded_vmap', 'softmax', "
        "'transformer_block']"]


@pytest.mark.parametrize("argv, words", [
    (["--m", "-5"], ["--m", ">= 1", "'-5'"]),
    (["--k", "0"], ["--k", ">= 1", "'0'"]),
    (["--mesh", "3"], ["--mesh 3", "DATAxMODEL"]),
    (["--m", "100", "--mesh", "1x8"], ["--mesh 1x8", "divisible by data*model = 8"]),
])
def test_overlap_script_mistakes_get_one_line(argv, words, capsys):
    """The overlap script's mistakes (`--m -5` was a traceback): one line, exit 2."""
    from kernels.ops.sharded_matmul import overlap

    try:
        code = overlap.main(argv)
    except SystemExit as stop:  # argparse's own exit
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and all(w in err[0] for w in words), (code, err)


def test_an_interrupted_command_says_so_in_one_line_and_exits_130(capsys, monkeypatch):
    """Ctrl-C, or a watchdog's SIGINT (the device scripts send one), during a command: one
    line, exit 130 (the shell's 128 + SIGINT), no traceback."""
    from kernels.cli import bench

    def interrupted(args):
        raise KeyboardInterrupt

    real = bench.add_commands

    def add_commands(sub):
        commands = real(sub)
        commands["bench"] = interrupted
        return commands

    monkeypatch.setattr(bench, "add_commands", add_commands)
    assert cli.main(["bench"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "python -m kernels bench: interrupted" and "Traceback" not in err
