"""kernels.profile.gpu_sweep's verdicts, on any machine: a sanitizer run that dies fails the
sweep and says where it stopped."""

import pytest

from kernels.profile import gpu_sweep


def test_a_run_killed_by_a_signal_fails_the_sweep(tmp_path, monkeypatch, capsys):
    rows = [["pytest under memcheck", "cold cache", "killed by SIGSEGV", "31 s"],
            ["pytest under memcheck", "warm cache", "exit 0", "64 s"]]
    monkeypatch.setattr(gpu_sweep, "part_sanitizer", lambda out, minutes, repeats, jobs, arms: rows)
    assert gpu_sweep.main(["--part", "sanitizer", "--out", str(tmp_path)]) == 1
    assert "killed by SIGSEGV" in (tmp_path / "gpu_sweep.txt").read_text()
    rows[0][2] = "exit 0"
    assert gpu_sweep.main(["--part", "sanitizer", "--out", str(tmp_path)]) == 0
    # The kernel log's rows are context, never a failure of their own.
    rows.append([gpu_sweep.KERNEL_LOG, "-", "-", "no segmentation fault logged during the runs"])
    rows.append(["pytest under memcheck", "all runs", "0 of 1 did not exit 0", ""])
    assert gpu_sweep.main(["--part", "sanitizer", "--out", str(tmp_path)]) == 0
    rows[-1][2] = "1 of 1 did not exit 0"
    assert gpu_sweep.main(["--part", "sanitizer", "--out", str(tmp_path)]) == 1
    capsys.readouterr()


def test_where_a_dead_run_stopped(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("$ compute-sanitizer ... pytest -v\n"
                   "correctness_tests/test_a.py::test_one[x] PASSED      [ 10%]\n"
                   "correctness_tests/test_b.py::test_two[y] \n"
                   "========= Invalid __global__ read of size 4 bytes\n"
                   "========= ERROR SUMMARY: 1 error\n")
    where = gpu_sweep._where_it_stopped(log, "killed by SIGSEGV")
    assert "last test started: correctness_tests/test_b.py::test_two[y]" in where
    assert "sanitizer errors: 1" in where
    log.write_text("correctness_tests/test_b.py::test_two[y] \n")
    assert "no sanitizer error summary" in gpu_sweep._where_it_stopped(log, "killed by SIGSEGV")
    assert gpu_sweep._where_it_stopped(log, "exit 0") == ""


def test_where_a_segfault_struck_in_python(tmp_path):
    """faulthandler's report (PYTHONFAULTHANDLER=1 in the sanitizer runs) names the innermost
    Python frame of the current thread, not another thread's."""
    log = tmp_path / "run.log"
    log.write_text("correctness_tests/test_b.py::test_two[y] \n"
                   "Fatal Python error: Segmentation fault\n\n"
                   "Current thread 0x00007f (most recent call first):\n"
                   '  File "/x/jax/_src/compiler.py", line 335 in backend_compile\n'
                   '  File "/x/jax/_src/pjit.py", line 10 in _pjit_call\n\n'
                   "Thread 0x00007e (most recent call first):\n"
                   '  File "/x/threading.py", line 1 in wait\n')
    where = gpu_sweep._where_it_stopped(log, "killed by SIGSEGV")
    assert where.endswith('Segmentation fault in File "/x/jax/_src/compiler.py", line 335 in '
                          "backend_compile"), where
    log.write_text("Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call "
                   "first):\n  <no Python frame>\n")
    assert "Aborted in no Python frame" in gpu_sweep._where_it_stopped(log, "exit 134")


def test_repeats_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        gpu_sweep.main(["--part", "sanitizer", "--repeats", "0"])
    assert "--repeats: expected at least 1, got 0" in capsys.readouterr().err


@pytest.fixture
def commands(monkeypatch):
    """part_sanitizer with a stand-in sanitizer (/bin/true) whose runs all exit 0 at once:
    the commands it would have run, in order."""
    ran = []
    monkeypatch.setattr(gpu_sweep.shutil, "which", lambda name: "/bin/true")
    monkeypatch.setattr(gpu_sweep, "_run",
                        lambda command, *a, **k: (ran.append(command), ("exit 0", 1.0))[1])
    return ran


def test_kernel_log_rows_name_only_new_faults(tmp_path, monkeypatch, commands):
    """The dmesg rows: faults logged during the runs, not before; an unreadable log says so."""
    logs = iter([["old: python3[1]: segfault at 0"],
                 ["old: python3[1]: segfault at 0",
                  "compute-sanitiz[7]: segfault at 8 ip 1 sp 2 error 4 in libTreeLauncher.so"]])
    monkeypatch.setattr(gpu_sweep, "_kernel_segfaults", lambda: next(logs))
    arm = gpu_sweep.SanitizerArm("tests, memcheck", "tests", gpu_sweep.MEMCHECK)
    rows = gpu_sweep.part_sanitizer(tmp_path, 1.0, repeats=2, jobs=1, arms=(arm,))
    assert [r[2] for r in rows if r[0] == "tests, memcheck"] == [
        "exit 0", "exit 0", "0 of 2 did not exit 0"]
    assert [r[3] for r in rows if r[0] == "kernel log (dmesg)"] == [
        "compute-sanitiz[7]: segfault at 8 ip 1 sp 2 error 4 in libTreeLauncher.so"]
    monkeypatch.setattr(gpu_sweep, "_kernel_segfaults",
                        lambda: ["dmesg unreadable: Operation not permitted"])
    rows = gpu_sweep.part_sanitizer(tmp_path, 1.0, repeats=1, jobs=1, arms=(arm,))
    assert rows[-1][3] == "dmesg unreadable: Operation not permitted"


def test_every_arm_runs_a_program_that_exists_and_parses():
    """The probes are Python source run with `python -c` on the GPU machine: a syntax error
    would show there only, as a failed arm that looks like the fault."""
    for arm in gpu_sweep.SANITIZER_ARMS:
        assert arm.program == "tests" or arm.program in gpu_sweep.PROBES, arm
    for name, source in gpu_sweep.PROBES.items():
        compile(source, name, "exec")
    labels = [arm.label for arm in gpu_sweep.SANITIZER_ARMS]
    assert len(set(labels)) == len(labels)  # --arm picks by label
    # The defaults are picked by label too: a renamed arm must not drop out silently.
    assert [arm.program for arm in gpu_sweep.DEFAULT_SANITIZER_ARMS] == ["tests"] * 3
    assert {arm.tests_k for arm in gpu_sweep.DEFAULT_SANITIZER_ARMS} == {
        "", "test_softmax_versions"}


def test_an_arm_can_select_tests(monkeypatch, tmp_path, commands):
    """An arm's tests_k reaches pytest as -k (the sweep halves the tests to find the fault)."""
    monkeypatch.setattr(gpu_sweep, "_kernel_segfaults", lambda: [])
    arm = gpu_sweep.SanitizerArm("some", "tests", gpu_sweep.MEMCHECK, tests_k="test_x")
    gpu_sweep.part_sanitizer(tmp_path, 1.0, repeats=1, jobs=1, arms=(arm,))
    assert commands[0][:len(gpu_sweep.MEMCHECK) + 1] == ["/bin/true", *gpu_sweep.MEMCHECK]
    assert commands[0][-2:] == ["-k", "test_x"]


def _torch_formula(op: str, args):
    """The sweep's expected results before it took the registered references: torch's own
    formulas, an independent check that the sweep calls each row's own reference."""
    import torch

    xs = [a.float() for a in args]
    if op == "softmax":
        return torch.softmax(xs[0], dim=-1)
    if op == "row_sum":
        return xs[0].sum(dim=-1)
    if op == "matmul":
        return xs[0] @ xs[1]
    q, k, v = (x.transpose(1, 2) for x in xs)  # (b, h, s, d)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)


@pytest.mark.parametrize("op,impl,shapes", [pytest.param(*row, id=f"{row[0]}-{row[1]}")
                                            for row in gpu_sweep.KERNELS])
def test_expected_is_the_operations_reference(op, impl, shapes):
    """Every row's expected result is its operation's registered reference, on the row's own
    (CPU) inputs in the row's dtype: the same as torch's formula for it, shape included."""
    torch = pytest.importorskip("torch")  # third-party
    args = gpu_sweep._make("cpu", shapes, gpu_sweep._dtype_for(impl))
    want = gpu_sweep._expected(op, args)
    assert want.dtype == torch.float32 and want.device.type == "cpu"
    torch.testing.assert_close(want, _torch_formula(op, args), rtol=1e-4, atol=1e-4)
