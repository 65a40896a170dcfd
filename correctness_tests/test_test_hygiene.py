"""Rules for the tests themselves: a broken import of our own code is a failure, never a skip."""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
OUR_PACKAGES = ("kernels", "perf_tests", "correctness_tests", "conftest")


def _skipped_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) for every `pytest.importorskip("module")` call in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "importorskip" and node.args
                and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def test_importorskip_names_only_third_party_modules():
    test_files = sorted(TESTS.glob("*.py")) + [TESTS.parent / "conftest.py"]
    assert len(test_files) > 5  # the glob found the suite
    ours = [f"{path.name}:{line}: importorskip({module!r})"
            for path in test_files for line, module in _skipped_imports(path)
            if module.split(".")[0] in OUR_PACKAGES]
    assert not ours, ("an import error in our own code must fail, not skip; import it "
                      "directly and skip on the third-party module it needs:\n" + "\n".join(ours))


def test_the_scan_sees_importorskip_calls(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text('import pytest\nx = pytest.importorskip("kernels.bench.asv_tools")\n'
                      'y = pytest.importorskip("torch")\n')
    assert _skipped_imports(sample) == [(2, "kernels.bench.asv_tools"), (3, "torch")]


def test_cpu_runs_compile_with_the_fast_flags_only_where_jaxlib_knows_them():
    """conftest adds those of compat.CPU_FAST_COMPILE_FLAGS this jaxlib accepts on a CPU run; a
    flag it does not know is refused by the probe, not handed to XLA (which ends the process).
    jaxlib 0.10.2 knows both; 0.11.2 only the second."""
    import os

    import pytest

    from kernels.core import compat, environment

    unknown = "--xla_cpu_no_such_flag_here=true"
    assert not compat.xla_flags_accepted(unknown)
    known = "--xla_cpu_parallel_codegen_split_count=1"
    assert compat.accepted_xla_flags("", (unknown, known)) == [known]
    if environment.nvidia_gpu_present():
        pytest.skip("a GPU run keeps XLA's default flags")
    flags = os.environ.get("XLA_FLAGS", "").split()
    assert known in flags
    fusion = compat.CPU_FAST_COMPILE_FLAGS[0]
    assert (fusion in flags) == compat.xla_flags_accepted(fusion), flags
