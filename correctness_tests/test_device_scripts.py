"""The device scripts select what they say: .ci/device/kernel_tables.sh's arguments, read
from the script by bash, name exactly issue 51's cases and implementations to compare with
(a renamed case or implementation would otherwise be found on the GPU, in a lost call)."""

from __future__ import annotations

import argparse
import pathlib
import subprocess

import pytest

from kernels.cli import measure
from kernels.core import tuning

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "device" / "kernel_tables.sh"


def _arguments(dry_run: str, tune: str) -> dict[str, list[str]]:
    """The script's per-step argument arrays under DRY_RUN and TUNE, as bash expands them."""
    lines = SCRIPT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# The cases of each step"))
    end = next(i for i, line in enumerate(lines) if line.startswith("TUNE_MATMUL="))
    names = ("ATTENTION", "SOFTMAX", "MATMUL", "TUNE_MATMUL")
    program = "\n".join([f"DRY_RUN={dry_run}; TUNE={tune}", *lines[start:end + 1], *(
        f'echo "{name}=${{{name}[*]}}"' for name in names)])
    out = subprocess.run(["bash", "-c", program], check=True, capture_output=True,
                         text=True).stdout
    return {name: values.split() for name, _, values in
            (line.partition("=") for line in out.splitlines())}


def _selected(op: str, arguments: list[str]):
    parser = argparse.ArgumentParser()
    measure.add_commands(parser.add_subparsers())
    args = parser.parse_args(["time", op, *arguments])
    selected_op, impls, cases = measure.select(args)
    measure.check_versus(selected_op, impls, args.versus)
    return [impl.name for impl in impls], [case.id for case in cases], args.versus


ISSUE_51 = {
    "ATTENTION": ("attention", ["bf16-4x4096x16x128", "bf16-4x4096x16x128-causal",
                                "bf16-4x4096x8x64", "bf16-4x4096x8x64-causal"], "cudnn"),
    "SOFTMAX": ("softmax", ["f32-4096x32768", "f32-2048x50257"], "copy"),
    "MATMUL": ("matmul", ["f32-4096x4096x4096", "bf16-4096x4096x4096",
                          "bf16-8192x8192x8192"], "xla"),
}


@pytest.mark.parametrize("step", sorted(ISSUE_51))
def test_kernel_tables_time_issue_51s_cases_against_its_references(step):
    op, cases, versus = ISSUE_51[step]
    impls, selected, compared = _selected(op, _arguments("0", "0")[step])
    assert selected == cases
    assert versus in compared and versus in (*impls, "copy")
    assert len(impls) >= 5  # every implementation, none named away


def test_kernel_tables_with_tune_time_the_tuned_paths_and_a_dry_run_cpu_cases():
    tuned = _arguments("0", "1")
    assert _selected("matmul", tuned["MATMUL"])[1] == ["f32-4096x4096x4096"]
    assert tuned["TUNE_MATMUL"] == ["--impl", "triton:f32", "--impl", "pallas_triton:f32"]
    assert set(tuned["TUNE_MATMUL"][1::2]) <= set(tuning.tunables("matmul"))
    dry = _arguments("1", "0")
    for step, (op, _, _) in ISSUE_51.items():
        _, cases, _ = _selected(op, dry[step])
        assert cases and all(c.startswith("f32-") for c in cases), (step, cases)
