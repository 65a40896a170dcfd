"""Mutation testing of the harness: `python -m kernels.testing.mutation [TARGET ...]`
(`make mutation`).

Each target is one module (or a few) of the machinery whose numbers the suite
reports, paired with the fast tests that are meant to guard it. mutmut (3.x)
rewrites the module into many single-change copies ("mutants") and runs the
tests against each: a mutant the tests do not notice "survives", which means
a bug of that shape would pass unseen. Each target runs in its own scratch
copy of the tree under `.mutation/<target>/` (mutmut reads its settings from
the working directory's pyproject.toml), so targets never share state, and a
rerun only retests mutants whose code changed. The score is killed / (killed
+ survived); mutants judged equivalent are listed in `EQUIVALENT` with a
one-line reason and left out of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRATCH = ROOT / ".mutation"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """Modules to mutate (globs relative to the repository root) and the tests that guard them."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]  # pytest arguments: files, `-k` expressions
    # mutmut mutant-name globs: the functions whose mutants are run (each function's mutants are
    # named `<module>.x_<function>__mutmut_<n>`, a method's `<module>.xǁ<Class>ǁ<method>__...`).
    functions: tuple[str, ...]
    # "fork": each mutant's tests in a child forked from a process that ran them all once (fast;
    # right for tests that compile nothing: a JAX compile in a child forked from a process with
    # JAX's threads can deadlock). "forkserver": from a server that has not imported JAX (each
    # mutant then pays JAX's import, seconds).
    isolation: str = "fork"

    def __post_init__(self) -> None:
        if not self.modules or not self.tests or not self.functions:
            raise ValueError(f"{self.name}: expected modules, tests and functions, got "
                             f"{self.modules!r}, {self.tests!r}, {self.functions!r}")


# The functions that compute what the suite reports or decides; two CPU cores run a target in
# minutes, so each names the functions that matter rather than whole modules, and tests that
# compile nothing (see `isolation`).
TARGETS = (
    Target(name="checking", modules=("kernels/core/checking.py",),
           tests=("correctness_tests/test_harness.py::test_compare_reports_errors",
                  "correctness_tests/test_harness.py::test_compare_requires_matching_infinities",
                  "correctness_tests/test_harness.py::"
                  "test_magnitude_forgives_cancellation_only_up_to_its_size",
                  "correctness_tests/test_harness.py::"
                  "test_tolerance_grows_with_reduction_length_and_dtype",
                  # compare's device branch (a GPU's arrays), run on JAX's CPU device
                  "correctness_tests/test_harness.py::"
                  "test_device_comparison_judges_like_the_host",
                  "correctness_tests/test_harness.py::test_shape_mismatch_is_named_on_both_paths",
                  "correctness_tests/test_tolerances.py", "correctness_tests/test_compare.py",
                  "-k", "not through_the_harness"),
           functions=("kernels.core.checking.x_compare__*",
                      "kernels.core.checking.x_relative_tolerance__*"),
           isolation="forkserver"),  # the device branch compiles (jit) its reduction
    Target(name="timing", modules=("kernels/core/timing.py",),
           tests=("correctness_tests/test_timing.py", "correctness_tests/test_measurement.py",
                  "-k", "(test_timing and not jax) or samples or stopping or measurement_ "
                  "or speedup"),
           functions=("kernels.core.timing.x_collect__*",
                      "kernels.core.timing.x_coefficient_of_variation__*",
                      "kernels.core.timing.x_speedup__*",
                      "kernels.core.timing.xǁStoppingRuleǁ__post_init____*",
                      "kernels.core.timing.xǁMeasurementǁfrom_samples__*",
                      "kernels.core.timing.xǁ_HostSamplerǁtake__*")),
    Target(name="roofline", modules=("kernels/roofline/model.py",),
           tests=("correctness_tests/test_measurement.py", "correctness_tests/test_work_models.py",
                  "correctness_tests/test_roofline_model.py", "-k", "place or roof"),
           functions=("kernels.roofline.model.*",)),
    Target(name="work-models", modules=("kernels/ops/*/spec.py",),
           tests=("correctness_tests/test_work_models.py", "correctness_tests/test_registry.py",
                  "-k", "(work or complete) and not formula"),
           functions=("kernels.ops.*.spec.x_work__*", "kernels.ops.*.spec.x_attended_pairs__*",
                      "kernels.ops.*.spec.x_capacity__*")),
    Target(name="asv-verdicts", modules=("kernels/bench/asv_tools.py",),
           tests=("correctness_tests/test_asv_tools.py", "correctness_tests/test_asv_verdicts.py",
                  "-k", "not machine"),
           functions=("kernels.bench.asv_tools.x_verdict__*",
                      "kernels.bench.asv_tools.x_exit_status__*",
                      "kernels.bench.asv_tools.x_compare__*")),
    Target(name="bottleneck", modules=("kernels/profile/bottleneck.py",),
           tests=("correctness_tests/test_bottleneck.py", "-k", "not the_command"),
           functions=("kernels.profile.bottleneck.x_parse_raw_csv__*",
                      "kernels.profile.bottleneck.x__parse_long__*",
                      "kernels.profile.bottleneck.x__number__*",
                      "kernels.profile.bottleneck.x_rows__*",
                      "kernels.profile.bottleneck.xǁKernelǁ*")),
    Target(name="validation", modules=("kernels/core/validation.py",),
           tests=("correctness_tests/test_registry.py", "correctness_tests/test_cli_errors.py",
                  "correctness_tests/test_validation.py",
                  "correctness_tests/test_api_inputs.py", "-k",
                  "check_ or number or index_range or config or interpret_flag or refuses"),
           functions=("kernels.core.validation.*",)),
)

# Mutants no test can kill because the program means the same with or without the change:
# "module.function__mutmut_N": why. Reviewed by hand; keep the reason to one line. N is
# mutmut's numbering, which changes between its releases (pyproject.toml pins the one these
# were read with: `mutmut show NAME` in .mutation/<target> prints a mutant's change).
EQUIVALENT: dict[str, str] = {
    **{f"kernels.core.checking.x_compare__mutmut_{n}":
       "astype's copy=False, None, True or left out: a copy or not, the same values"
       for n in (40, 42, 43, 46, 48, 49, 55, 57, 59)},
    **{f"kernels.core.checking.x_compare__mutmut_{n}":
       "astype(None) (float64) of one side: float32 values exactly, the verdict the same"
       for n in (39, 45, 54)},
    "kernels.profile.bottleneck.xǁKernelǁverdict__mutmut_18":
        "stalls(None) for stalls(1): only the first, the largest, is read",
    "kernels.profile.bottleneck.xǁKernelǁverdict__mutmut_19":
        "stalls(2) for stalls(1): only the first, the largest, is read",
    "kernels.profile.bottleneck.x_rows__mutmut_6":
        "total 'or 2.0': reached only when no kernel has a time, and every share is then 0",
    "kernels.ops.attention.spec.x_attended_pairs__mutmut_3":
        "/ for //: seq (seq + 1) is even, so the halves are equal",
    "kernels.ops.attention.spec.x_work__mutmut_21":
        "get('causal', None): None is falsy, as False is",
    "kernels.ops.attention.spec.x_work__mutmut_23":
        "get('causal'): None when absent, falsy as False is",
    **{f"kernels.core.validation.x_check_index_range__mutmut_{n}":
       "zip's strict: shape and strides always have one length" for n in (30, 33, 34)},
    "kernels.core.validation.x_check_index_range__mutmut_40":
        "max's default is read only for a scalar, whose offset is 0",
    "kernels.core.validation.x_check_x64_for__mutmut_14":
        "getattr default None: str(None) is no wide dtype, as '' is not",
    "kernels.core.validation.x_check_x64_for__mutmut_20":
        "getattr default 'XXXX': no wide dtype, as '' is not",
    "kernels.core.validation.x_positive_float__mutmut_4":
        "inclusive=None is falsy, as False is",
    "kernels.bench.asv_tools.x_verdict__mutmut_88":
        "ratio >= 1 for > 1: a ratio of exactly 1 is never a change, so never reaches here",
    "kernels.bench.asv_tools.x_verdict__mutmut_98":
        "ratio <= 1 for < 1: a ratio of exactly 1 is never a change, so never reaches here",
    "kernels.bench.asv_tools.x_verdict__mutmut_100":
        "ratio >= 1 for > 1: a ratio of exactly 1 is never a change, so never reaches here",
    "kernels.core.timing.x_coefficient_of_variation__mutmut_5":
        'float("INF") is float("inf"): Python parses the name case-insensitively',
    "kernels.core.timing.x_coefficient_of_variation__mutmut_16":
        'float("INF") is float("inf"): Python parses the name case-insensitively',
    "kernels.bench.asv_tools.x_verdict__mutmut_42":
        "floor >= min_gap: at floor == min_gap the gap is min_gap, so nothing lies between",
    "kernels.core.checking.x_compare__mutmut_1":
        "work dtype None: astype(None) is float64, the same verdicts, only slower",
    "kernels.core.checking.x_compare__mutmut_3":
        "always float64: the same verdicts, only slower",
    "kernels.core.checking.x_compare__mutmut_8":
        "astype(None) is float64: the same verdicts, only slower",
    "kernels.core.checking.x_compare__mutmut_15":
        "astype(None) is float64: the same verdicts, only slower",
    "kernels.core.checking.x_compare__mutmut_65":
        "astype(None) is float64: the same verdicts, only slower",
    "kernels.core.checking.x_compare__mutmut_9":
        "copy=None instead of False: a copy or not, the same values",
    "kernels.core.checking.x_compare__mutmut_11":
        "copy left at its default: a copy or not, the same values",
    "kernels.core.checking.x_compare__mutmut_13":
        "copy=True: a copy, the same values",
    "kernels.core.checking.x_compare__mutmut_16":
        "copy=None instead of False: a copy or not, the same values",
    "kernels.core.checking.x_compare__mutmut_18":
        "copy left at its default: a copy or not, the same values",
    "kernels.core.checking.x_compare__mutmut_20":
        "copy=True: a copy, the same values",
    "kernels.core.checking.x_compare__mutmut_66":
        "copy=None instead of False: a copy or not, the same values",
    "kernels.core.checking.x_compare__mutmut_68":
        "copy left at its default: a copy or not, the same values",
    "kernels.core.checking.x_compare__mutmut_70":
        "copy=True: a copy, the same values",
    "kernels.core.checking.x_compare__mutmut_25":
        "all_finite None: the general (masked) path, which gives the fast path's results",
    "kernels.core.checking.x_compare__mutmut_26":
        "all_finite False: the general (masked) path, which gives the fast path's results",
    "kernels.core.checking.x_compare__mutmut_28":
        "the masked NaN test on all-finite data: finite & x is x",
    "kernels.core.checking.x_compare__mutmut_84":
        "peak of an empty comparison only divides a zero max error",
    "kernels.core.checking.x_compare__mutmut_89":
        "'>=' for '>' at max|e| == tol * peak exactly: the boundary, a tolerance of 1",
    "kernels.core.checking.x_compare__mutmut_152":
        "'<' for '<=' at relative error == tolerance exactly: the boundary",
    "kernels.core.checking.x_compare__mutmut_153":
        "'<' for '<=' at max error == tolerance exactly: the boundary",
    "kernels.core.checking.x_compare__mutmut_95":
        "size >= 1: one element has ptp 0, so the constant guard is false either way",
    "kernels.core.checking.x_compare__mutmut_106":
        "a constant array's element 1 is its element 0",
    "kernels.core.checking.x_compare__mutmut_132":
        "worst_flat is read only where diff has elements",
    "kernels.core.checking.x_compare__mutmut_157":
        "argwhere of an all-True mask lists positions as unravel_index does",
}


def _prepare(target: Target) -> pathlib.Path:
    """A scratch copy of the tree with a pyproject.toml that tells mutmut what to do."""
    work = SCRATCH / target.name
    work.mkdir(parents=True, exist_ok=True)
    for name in ("kernels", "correctness_tests", "perf_tests"):
        if (work / name).exists():
            shutil.rmtree(work / name)
        shutil.copytree(ROOT / name, work / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    for name in ("conftest.py", "asv.conf.json"):  # asv's tests find the project by its conf
        shutil.copy2(ROOT / name, work / name)
    # mutmut's test processes put mutants/ on sys.path; made now, so it exists when they start.
    (work / "mutants").mkdir(exist_ok=True)
    project = (ROOT / "pyproject.toml").read_text()
    settings = {
        "source_paths": ["kernels"],
        "only_mutate": list(target.modules),
        "also_copy": ["correctness_tests", "perf_tests", "conftest.py", "asv.conf.json"],
        # One worker: the machine is shared, and each test process imports JAX.
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-p", "no:xdist", "-q"],
        "pytest_add_cli_args_test_selection": _existing(target.tests),
        "use_git_change_detection": False,
        "process_isolation": target.isolation,
        "forkserver_warmup": "none",
        "debug": bool(os.environ.get("MUTATION_DEBUG")),
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}"
                                     for key, value in settings.items()]
    (work / "pyproject.toml").write_text(project + "\n".join(lines) + "\n")
    return work


def _existing(tests: tuple[str, ...]) -> list[str]:
    """The test selection less files not written yet (a baseline run before new tests exist)."""
    kept = []
    for arg in tests:
        if arg.endswith(".py") and not (ROOT / arg).exists():
            print(f"mutation: {arg} does not exist; left out of the selection", file=sys.stderr)
            continue
        kept.append(arg)
    if not any(arg.endswith(".py") for arg in kept):
        raise FileNotFoundError(f"tests: none of {tests} exists (pytest would run everything)")
    return kept


def _mutmut(work: pathlib.Path, *args: str, capture: bool = False) -> str:
    command = [sys.executable, "-m", "mutmut", *args]
    env = dict(os.environ, PYTHONPATH=str(work / "mutants"))
    done = subprocess.run(command, cwd=work, env=env, text=True, check=False,
                          capture_output=capture)
    if done.returncode not in (0, 1) or (capture and not done.stdout and done.stderr):
        raise RuntimeError(f"{' '.join(command)} in {work} exited {done.returncode}: "
                           f"{(done.stderr or '')[-2000:]}")
    return done.stdout or ""


def results(work: pathlib.Path) -> dict[str, str]:
    """mutant name -> status ("killed", "survived", "timeout", ...), from `mutmut results`."""
    out = _mutmut(work, "results", "--all", "true", capture=True)
    statuses = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name:
            statuses[name] = status.strip()
    return statuses


def score(statuses: dict[str, str]) -> tuple[int, int, list[str]]:
    """(killed, scored, survivors not explained in EQUIVALENT). Timeouts count as killed
    (the mutant hung the tests), equivalent mutants are not scored."""
    killed = sum(s in ("killed", "timeout", "segfault") for s in statuses.values())
    survivors = sorted(n for n, s in statuses.items() if s == "survived" and n not in EQUIVALENT)
    return killed, killed + len(survivors), survivors


def main(argv: list[str] | None = None) -> int:
    names = [t.name for t in TARGETS]
    parser = argparse.ArgumentParser(prog="python -m kernels.testing.mutation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"default: all of {', '.join(names)}")
    parser.add_argument("--report-only", action="store_true",
                        help="print the scores of the last run without running mutmut")
    parser.add_argument("--max-children", type=int, default=1)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.targets) - set(names))
    if unknown:
        parser.error(f"TARGET: expected some of {names}, got {unknown}")
    chosen = [t for t in TARGETS if not args.targets or t.name in args.targets]
    rows = []
    for target in chosen:
        work = SCRATCH / target.name if args.report_only else _prepare(target)
        if not args.report_only:
            _mutmut(work, "run", "--max-children", str(args.max_children), *target.functions)
        statuses = {name: status for name, status in results(work).items()
                    if any(fnmatch.fnmatchcase(name, glob) for glob in target.functions)}
        killed, scored, survivors = score(statuses)
        rows.append((target.name, killed, scored, survivors))
    for name, killed, scored, survivors in rows:
        percent = f"{100.0 * killed / scored:.0f}%" if scored else "-"
        print(f"{name:14s} {killed:4d}/{scored:<4d} killed  {percent}")
        for survivor in survivors:
            print(f"    survived: {survivor}")
    return 1 if any(survivors for *_, survivors in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
