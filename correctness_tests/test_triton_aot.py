"""kernels.profile.triton_aot's command line refuses what it cannot compile in one line (the Hopper
kernels it compiles are checked in test_triton_attention.py)."""

import pytest

from kernels.profile import triton_aot


@pytest.mark.parametrize(("argv", "message"), [
    (["kernels.ops.attention.triton_gluon:example_launch"],
     "usage: python -m kernels.profile.triton_aot"),
    (["kernels.no_such_module:f", "{}"], "MODULE:FUNCTION: expected an importable function, "
                                         "got 'kernels.no_such_module:f'"),
    (["kernels.profile.triton_aot:no_such_function", "{}"],
     "MODULE:FUNCTION: expected an importable function"),
    (["kernels.profile.triton_aot:main", "[1]"], "arguments: expected a JSON object of keyword "
                                         "arguments, got list"),
    (["kernels.profile.triton_aot:main", "{head_dim: 1}"], "arguments: expected a JSON object"),
], ids=["no-arguments", "no-module", "no-function", "not-an-object", "not-json"])
def test_bad_command_lines_get_one_line_and_exit_2(argv, message, capsys):
    assert triton_aot.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_failed_compile_reports_the_child_error():
    with pytest.raises(RuntimeError, match="compiling kernels.profile.triton_aot:no_such_function"):
        triton_aot.report("kernels.profile.triton_aot:no_such_function")
