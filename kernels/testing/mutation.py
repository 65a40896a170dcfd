"""Mutation testing of the harness: `python -m kernels.testing.mutation [TARGET ...]`
(`make mutation`).

Each target is one module (or a few) of the machinery whose numbers the suite
reports, paired with the fast tests that are meant to guard it. mutmut (3.x)
rewrites the module into many single-change copies ("mutants") and runs the
tests against each: a mutant the tests do not notice "survives", which means
a bug of that shape would pass unseen. Each target runs in its own scratch
copy of the tree under `.mutation/<target>/` (mutmut reads its settings from
the working directory's pyproject.toml), so targets never share state, and a
rerun only retests mutants whose code changed, unless anything else in the tree
did (a test, a module the target's tests import): then every mutant's recorded
result is dropped and all run again (`_drop_stale_results`). The score is
killed / (killed + survived); mutants judged equivalent are listed in
`EQUIVALENT` with a one-line reason and left out of it.
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
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRATCH = ROOT / ".mutation"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """Modules to mutate (globs relative to the repository root) and the tests that guard them.

    Every mutant of every function in `modules` is run and scored, unless `functions` narrows
    the target to part of each module; then `scope` must say which part and why, and the
    report prints it beside the score.
    """

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]  # pytest arguments: files, `-k` expressions
    # mutmut mutant-name globs (a function's mutants are `<module>.x_<function>__mutmut_<n>`, a
    # method's `<module>.xǁ<Class>ǁ<method>__mutmut_<n>`); empty: every function of `modules`.
    functions: tuple[str, ...] = ()
    scope: str = ""
    # "forkserver" (default): each mutant's tests in a child forked from a server that has
    # run WARMUP (JAX, torch, the registry imported) but started no JAX backend, so each child
    # starts its own: a compile in a child forked from a process whose XLA client already runs
    # threads can deadlock, and a deadlock would read as a timeout, which scores as killed.
    # "fork": from mutmut's own process, which ran the tests once (for tests that never touch
    # a JAX backend).
    isolation: str = "forkserver"
    # Whether the fork server may also import our package (the registry and every kernel
    # module, a few seconds a mutant): only where none of the target's functions runs at
    # import, since a function the server ran at import never meets its mutants.
    preload_package: bool = True
    # Keyword arguments whose text is only shown to a reader (argparse's help=, metavar=): a
    # surviving mutant that changes nothing but such a string is counted as equivalent
    # ("text only"), so the score is about behaviour.
    text_keywords: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.modules or not self.tests:
            raise ValueError(f"{self.name}: expected modules and tests, got {self.modules!r}, "
                             f"{self.tests!r}")
        if bool(self.functions) != bool(self.scope):
            raise ValueError(f"{self.name}: functions {self.functions!r} need a scope saying "
                             f"which part of the modules they are, and only they; got "
                             f"scope {self.scope!r}")
        if self.isolation not in ("fork", "forkserver"):
            raise ValueError(f"{self.name}: isolation: expected 'fork' or 'forkserver', got "
                             f"{self.isolation!r}")

    @property
    def globs(self) -> tuple[str, ...]:
        """The mutant-name globs run and scored: `functions`, else every mutant of `modules`."""
        return self.functions or tuple(module_prefix(m) + ".*" for m in self.modules)


def module_prefix(path: str) -> str:
    """mutmut's name for a module path (glob), e.g. kernels/ops/*/spec.py -> kernels.ops.*.spec."""
    return path.removesuffix(".py").replace("/", ".")


# Every module whose numbers the suite reports or whose verdicts it gives, whole; each target
# runs alone (`python -m kernels.testing.mutation checking`). The CLI and the operation specs
# are the two narrowed ones: a command's handler runs GPUs, asv or ncu, and a spec's reference
# and inputs are what every correctness test runs against every kernel.
TARGETS = (
    Target(name="checking", modules=("kernels/core/checking.py",),
           tests=("correctness_tests/test_harness.py", "correctness_tests/test_tolerances.py",
                  "correctness_tests/test_compare.py", "-k", "not through_the_harness")),
    # The device-span clock's trace splitting and the gate's stopping statistics are timing.py
    # too: their own test files belong to it (the measuring worker's real run excepted).
    Target(name="timing", modules=("kernels/core/timing.py",),
           tests=("correctness_tests/test_timing.py", "correctness_tests/test_measurement.py",
                  "correctness_tests/test_device_clock.py", "correctness_tests/test_measuring.py",
                  "-k", "not real_worker")),
    Target(name="roofline", modules=("kernels/roofline/model.py", "kernels/roofline/floors.py",
                                     "kernels/roofline/ceilings.py"),
           tests=("correctness_tests/test_roofline_model.py",
                  "correctness_tests/test_measurement.py", "perf_tests/tests/test_perfcheck.py",
                  # The floors' data files (kernels/models/) and the shipped ceilings.
                  "correctness_tests/test_model_data.py",
                  # Not the roofline chart's test (1.5 s, matplotlib): the other tests alone
                  # kill all 139 killed mutants of place, the ceilings and the datasheet that it
                  # reaches (2026-11-27); it checks report.py's drawing, not these numbers.
                  "-k", "(place or roof or ceiling or datasheet or floor) and not roofline_chart"),
           preload_package=False),  # the datasheet and the floor tables are built at import
    Target(name="perfcheck", modules=("kernels/bench/perfcheck.py",),
           tests=("perf_tests/tests/test_perfcheck.py",
                  # The interleaved measurement's own tests (the bring-up's file holds them).
                  *(f"correctness_tests/test_bringup.py::{name}" for name in (
                      "test_interleaved_rounds_keep_a_throttled_stretch_out_of_the_ratio",
                      "test_each_round_reverses_the_order_after_one_warm_up_each",
                      "test_a_failing_baseline_is_named_and_dropped_and_a_failing_kernel_raises",
                      "test_a_baseline_of_another_clock_is_never_a_ratios_peer",
                      "test_a_perf_session_measures_an_item_interleaved_once")))),
    # Forked from mutmut's own process (a tenth of a second a mutant, against the fork
    # server's half): none of its tests compiles a JAX program.
    # The regressions page's thresholds (asv_tools.regression_thresholds, 2026-12-01) are
    # tested beside the dashboard: that one test, not the pages it opens in a browser.
    Target(name="asv-verdicts", modules=("kernels/bench/asv_tools.py",),
           tests=("correctness_tests/test_asv_tools.py", "correctness_tests/test_asv_verdicts.py",
                  "correctness_tests/test_asv_results.py", "correctness_tests/test_job_summary.py",
                  "correctness_tests/test_dashboard.py", "-k",
                  "not machine and (not test_dashboard or regression_thresholds)"),
           isolation="fork"),
    # test_cli_errors.py builds every parser in most of its 73 tests (7 s a mutant here): the
    # defaults' own tests alone keep this target to minutes.
    Target(name="cli-defaults", modules=("kernels/cli/*.py",),
           tests=("correctness_tests/test_cli_defaults.py",), isolation="fork",  # no JAX program
           functions=("kernels.cli.*.x_add_commands__*", "kernels.cli.*.x__add_gate_power__*",
                      "kernels.cli.*.x__selection_arguments__*"),
           text_keywords=("help", "metavar", "description"),
           scope="the functions that build the parsers (every option, default and type); the "
                 "handlers run asv, GPUs or ncu"),
    Target(name="work-models", modules=("kernels/ops/*/spec.py",),
           tests=("correctness_tests/test_work_models.py", "correctness_tests/test_registry.py",
                  "-k", "(work or complete) and not formula"),
           functions=("kernels.ops.*.spec.x_work__*", "kernels.ops.*.spec.x_attended_pairs__*",
                      "kernels.ops.*.spec.x_capacity__*"),
           scope="the work models (work and the counts it is built from); references, inputs "
                 "and cases are what the correctness suite checks every kernel against"),
    Target(name="bottleneck", modules=("kernels/profile/bottleneck.py",),
           tests=("correctness_tests/test_bottleneck.py", "-k", "not the_command"),
           isolation="fork"),
    Target(name="validation", modules=("kernels/core/validation.py",),
           tests=("correctness_tests/test_registry.py", "correctness_tests/test_cli_errors.py",
                  "correctness_tests/test_validation.py",
                  "correctness_tests/test_api_inputs.py", "-k",
                  "check_ or number or index_range or config or interpret_flag or refuses"),
           preload_package=False),  # positive_int and friends are made at import
    # The gate's own logic (2026-11-26): the confirmation's decision and bookkeeping, the
    # benchmarks' sampling rule and fault-containing supervisor, and the time breakdown.
    Target(name="gate-confirm", modules=("kernels/bench/confirm.py",),
           tests=("correctness_tests/test_confirm.py", "correctness_tests/test_interleaved.py"),
           isolation="fork"),
    # The supervisor's, the worker's and one parameter set's logic, driven in-process through
    # fakes (test_measuring_fakes.py): the slow tests run real worker processes, seconds a
    # mutant each, whose code mutmut never sees. None starts a JAX backend: fork is safe.
    Target(name="gate-measuring", modules=("perf_tests/measuring.py",),
           tests=("correctness_tests/test_measuring.py",
                  "correctness_tests/test_measuring_fakes.py",
                  "correctness_tests/test_interleaved.py", "-m", "not slow"),
           isolation="fork"),
    # gate-power (2026-11-27): the planted slowdowns' text, the settings, the trial verdicts
    # and the report that fails a run; its clone-and-run flow drives asv on a GPU.
    Target(name="gate-power", modules=("kernels/bench/gate.py",),
           tests=("correctness_tests/test_gate.py",)),  # forkserver: its tests run JAX
    Target(name="gate-breakdown", modules=("kernels/bench/breakdown.py",
                                           "kernels/core/journals.py"),
           tests=("correctness_tests/test_breakdown.py",), isolation="fork",
           # The package's warm-up imports core.journals unmutated (through the asv plugin's
           # imports): with it, all 21 of journals' mutants survived untested.
           preload_package=False),
    # Fault containment (2026-11-27): the sticky-error table, the item limits, the
    # controller's reading of a dead worker and its blame and requeue, and the drill's
    # verdicts. The plugin's hooks and the drill's clone-and-run flow run in the xdist workers
    # and child runs of the slow tests (10-60 s each, a planted fault apiece), out of mutmut's
    # sight and time: the whole module scored 5% (isolation.py) and 0% (drill.py), nearly all
    # of it unreached.
    Target(name="isolation", modules=("kernels/testing/isolation.py", "kernels/testing/drill.py"),
           # Not the device check's cost (a child that imports JAX and torch, 8 s; the check
           # runs in-process after every test here, with the mutant) nor the drill's real tool
           # run (a child killed at its 1.5 s limit; its stand-in tests kill _run's mutants).
           tests=("correctness_tests/test_isolation.py", "-m", "not slow",  # they run JAX
                  "-k", "not costs_microseconds and not drill_waits_on"),
           functions=tuple(f"kernels.testing.isolation.x{name}__*" for name in (
               "_sticky_error", "__chain", "_sticky_in_exception", "__one_line",
               "_device_health", "__kernel_param", "_describe_item", "_is_device_item",
               "_item_limit", "__seconds", "__where", "ǁLimitsǁ*", "ǁReplacementFixesǁ*",
               *(f"ǁ_Controllerǁ{method}" for method in (
                   "label", "_reason_file", "_fault_record", "_exit_status", "blame",
                   "settle", "_contained")))) + tuple(
               f"kernels.testing.drill.x{name}__*" for name in (
                   "ǁSettingsǁ*", "ǁRowǁ*", "_junit_outcomes", "_pytest_row", "_asv_values",
                   "_journal_failures", "_report", "__shorten", "__last_line", "__run",
                   "_settings_from")),
           scope="the decisions: sticky errors, item limits, the controller's blame, requeue "
                 "and reading of a dead worker's records, the drill's settings, outcomes and "
                 "verdicts; the hooks and the drill's flow run in child processes"),
)

# What the fork server does before any mutant runs (mutmut's "import" warm-up, through a
# module written into the scratch tree's mutants/, which is on its path), so a mutant pays
# pytest's start and its own tests, not the imports of JAX, torch, Triton and our kernels
# (seconds a mutant). Where a target's functions run at import (`preload_package=False`), our
# package is left to each mutant's tests to import, so the tables it builds at import see the
# mutant. It starts no JAX backend; `check_warmup` checks that it stays so.
WARMUP = """\
from kernels.core import environment

environment.configure()  # Triton's interpreter and JAX's host devices, before they import
import flax.nnx  # noqa: E402
import jax.experimental.pallas  # noqa: E402
import jax.numpy  # noqa: E402
import numpy  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
# What each mutant's pytest would otherwise import again (a fresh pytest in every child): the
# plugins its entry points name, and asv (the verdicts' statistics), about 0.15 s a mutant.
import asv._stats  # noqa: E402
import asv.machine  # noqa: E402
import asv.results  # noqa: E402
import pytest_benchmark.plugin  # noqa: E402
import xdist.looponfail  # noqa: E402
import xdist.plugin  # noqa: E402
"""
# With Target.preload_package: the registry, every kernel module, and the test plugins.
WARMUP_PACKAGE = """\
from kernels.core import devices, registry  # noqa: E402
from kernels.testing import compilation_cache_plugin, phases_plugin, scheduling  # noqa: E402

registry.load()
"""
# Without: forget `environment` too (no target mutates it), so the tests import the package
# as if nothing had.
WARMUP_FORGET = """\
import sys  # noqa: E402

for name in [n for n in sys.modules if n == "kernels" or n.startswith("kernels.")]:
    del sys.modules[name]
"""
WARMUP_MODULE = "mutation_warmup"

# Reasons that recur across the modules.
_INF = 'float("INF") is float("inf"): Python parses the name case-insensitively'
_NAN = 'float("NAN") is float("nan"): Python parses the name case-insensitively'
_FLUSH = "print's flush: when a line reaches a pipe, not what it says"
_STACKLEVEL = "stacklevel: which caller's line the warning names, not whether or what it says"

# Mutants no test can kill because the program means the same with or without the change:
# "module.function__mutmut_N": why. Reviewed by hand; keep the reason to one line. N is
# mutmut's numbering, which changes between its releases (pyproject.toml pins the one these
# were read with: `mutmut show NAME` in .mutation/<target> prints a mutant's change).
EQUIVALENT: dict[str, str] = {
    **{f"kernels.cli.bench.x_add_commands__mutmut_{n}":
       "metavar left out: only the placeholder --help shows (PATH or JSON) changes"
       for n in (158, 173)},
    **{f"kernels.cli.bench.x_add_commands__mutmut_{n}":
       "the command listing's help text of bench or compare, reworded"
       for n in (3, 4, 8)},
    "kernels.cli.drill.x_add_commands__mutmut_20":
        "fault-drill's --faults without metavar: only the placeholder --help shows changes",
    "kernels.cli.measure.x__selection_arguments__mutmut_83":
        "--dims without metavar: only the placeholder --help shows changes",
    "kernels.cli.drill.x_add_commands__mutmut_74":
        "--item-limit's default=None left out: argparse's default is None",
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
    **{name: _INF
       for name in ("kernels.core.timing.x_coefficient_of_variation__mutmut_5",
                    "kernels.core.timing.x_coefficient_of_variation__mutmut_16",
                    "kernels.core.timing.x_robust_cv__mutmut_5",
                    "kernels.core.timing.x_robust_cv__mutmut_12",
                    "kernels.core.timing.x_median_halfwidth__mutmut_12",
                    "kernels.core.timing.xǁMeasurementǁfrom_dict__mutmut_10")},
    # zip's strict on two lists built to one length (starts and ends, n each; a list's
    # bounds[:-1] and bounds[1:]): it could only ever raise on lengths that differ.
    **{f"kernels.core.timing.xǁ_CudaEventSamplerǁtake__mutmut_{n}":
       "zip's strict dropped: starts and ends are both made n long"
       for n in (11, 14, 15, 21, 24, 25)},
    **{f"kernels.core.timing.x_split_calls__mutmut_{n}":
       "zip's strict dropped: bounds[:-1] and bounds[1:] are one shorter than bounds each"
       for n in (42, 45, 49)},
    **{f"kernels.core.timing.x_torch_timer__mutmut_{n}":
       "environ.get's default None or left out for '': both falsy, so unset reads 'cupti'"
       for n in (4, 6)},
    **{f"kernels.core.timing.x__say__mutmut_{n}":
       "print's flush=True dropped: sys.stderr is line-buffered (always, since Python 3.9) "
       "and the message ends in a newline"
       for n in (10, 13, 14)},
    "kernels.core.timing.x_l2_bytes__mutmut_35":
        "rstrip('XXKMXX') for rstrip('KM'): a sysfs cache size is digits and a K or M, no X",
    "kernels.core.timing.x_jax_flush__mutmut_22":
        "the flush writes 2 for 1: a flush is its bytes written, whatever they hold",
    "kernels.core.timing.x_jax_flush_devices__mutmut_16":
        "the flush writes 2 for 1: a flush is its bytes written, whatever they hold",
    "kernels.core.timing.x_devices_of__mutmut_11":
        "jax.devices()[:2] for [:1]: reached only with no array and at_least < 1; every "
        "caller passes a timeable's device count, at least 1",
    "kernels.core.timing.xǁ_ClockedSamplerǁ__init____mutmut_4":
        "first/last clocks '' for None: both falsy, and the first take or reset replaces them "
        "before anything reads them",
    "kernels.core.timing.xǁ_LaunchSamplerǁtake__mutmut_3":
        "last = '' for None: the first of `calls` calls overwrites it (calls=0 divides by zero "
        "before the wait)",
    "kernels.core.timing.xǁ_DeviceSpanSamplerǁ__init____mutmut_6":
        "last_spans None for [] before the first take: nothing reads it before a take sets it",
    **{name: "the default label 'call' changed: it is only error text, and every caller in "
             "the package (make_sampler, _device_span_sampler) passes the timeable's label"
       for name in ("kernels.core.timing.xǁ_CuptiSamplerǁ__init____mutmut_1",
                    "kernels.core.timing.xǁ_CuptiSamplerǁ__init____mutmut_2",
                    "kernels.core.timing.xǁ_DeviceSpanSamplerǁ__init____mutmut_1",
                    "kernels.core.timing.xǁ_DeviceSpanSamplerǁ__init____mutmut_2")},
    "kernels.bench.asv_tools.x_verdict__mutmut_42":
        "floor >= min_gap: at floor == min_gap the gap is min_gap, so nothing lies between",
    **{f"kernels.roofline.ceilings.xǁCeilingǁpeak__mutmut_{n}":
       "the chain's f32 for f32 and tf32: the loop tries f32 after the chain anyway"
       for n in (10, 11, 16, 17)},
    **{f"kernels.roofline.ceilings.xǁCeilingǁpeak__mutmut_{n}":
       "no 'tf32' entry: get's default (tf32,) then the loop's f32 is the same chain"
       for n in (12, 13)},
    **{f"kernels.roofline.ceilings.x__copy_kernels__mutmut_{n}":
       "dtype left to its default: torch's and jnp's default dtype is float32 (no x64)"
       for n in (3, 6, 29, 31)},
    **{f"kernels.roofline.ceilings.{name}": _STACKLEVEL
       for name in ("x_for_device__mutmut_19", "x_for_device__mutmut_20",
                    "x_measured__mutmut_19", "x_measured__mutmut_25", "x_measured__mutmut_41",
                    "x_measured__mutmut_42", "x__measured_elsewhere__mutmut_23",
                    "x__measured_elsewhere__mutmut_24")},
    **{f"kernels.core.checking.x_check__mutmut_{n}":
       "has_direction(impl, d) for any d but 'fwd' asks for the backward, as 'bwd' does"
       for n in (14, 17, 18)},
    # checking, reviewed 2026-11-27 (after the host norm squares in float64 and float64 is
    # recognised by name).
    **{f"kernels.core.checking.x__host_norm__mutmut_{n}":
       "reshape(None) or (-2) of an array _stats already flattened: the same 1-D array "
       "(NumPy reads a negative size as the rest)" for n in (2, 4)},
    "kernels.core.checking.x__host_norm__mutmut_6": "astype(None) is astype(float64)",
    **{f"kernels.core.checking.x__host_norm__mutmut_{n}":
       "the chunk count (at least 2, a float count, 2^21 a chunk): every chunk is squared and "
       "summed in float64 either way" for n in (15, 16, 19)},
    "kernels.core.checking.x__device_norm__mutmut_10":
        "2.0 for 1.0 as the scale under a peak of 0: scaling by a power of two is exact",
    "kernels.core.checking.x__device_arrays__mutmut_11":
        "getattr without its default: compare takes NumPy, JAX or torch arrays, all with a dtype",
    "kernels.core.checking.x__device_arrays__mutmut_30":
        "the reference's size for the result's: they differ only with the shapes, and both "
        "paths then fail alike on the shape",
    "kernels.core.checking.x__sharded_like__mutmut_18":
        "getattr without its default: NumPy, JAX and torch arrays all have a shape",
    "kernels.core.checking.x__sharded_like__mutmut_28":
        "device_put of the sharded array onto its own sharding: the same array",
    **{f"kernels.core.checking.x__to_stats__mutmut_{n}":
       "a bool field read through int(): 0 or 1, and only its truth is read" for n in (6, 10, 11)},
    "kernels.core.checking.x__judge__mutmut_40":
        "finite_count >= 1: with one finite entry the reference's spread is 0, never above "
        "tolerance x peak",
    "kernels.core.checking.x__judge__mutmut_64":
        "worst_diff read with no finite entry: every difference is masked to 0 then",
    **{name: "None for False (with_grad): falsy, the same forward-only program"
       for name in ("kernels.core.checking.x__run_reference__mutmut_6",
                    "kernels.core.checking.x_compute_reference__mutmut_24")},
    "kernels.core.checking.xǁReferenceCacheǁ_make_room__mutmut_4":
        "popitem(last=None): falsy, as False is",
    "kernels.core.checking.x__unchanged__mutmut_2":
        "pristine is None only for references made off the device, where _device_arrays "
        "declines too (no platform)",
    "kernels.core.checking.xǁChunkedGeneratorǁ__init____mutmut_3":
        "draws numbered from 2: still one stream per draw, from the seed alone",
    "kernels.core.checking.xǁChunkedGeneratorǁ_fill__mutmut_38":
        "reshape(-2) is reshape(-1): NumPy reads a negative size as the rest",
    "kernels.core.checking.x_check__mutmut_23":
        "ReferenceCache(1): no reference fits in one byte, so it keeps nothing, as 0 does",
    "kernels.core.checking.x_check__mutmut_123":
        "the `or` is dead: references always carry one magnitude (or None) per gradient",
    "kernels.core.checking.xǁChunkedGeneratorǁ_fill__mutmut_22":
        "draws numbered 2, 4, ...: still one stream per draw, from the seed alone",
    **{name: "a constant off by one part in 10^9 or more: below any digit shown or compared"
       for name in ("kernels.bench.perfcheck.x_extra_info__mutmut_23",
                    "kernels.bench.perfcheck.x_extra_info__mutmut_28",
                    "kernels.bench.perfcheck.x_judge__mutmut_17",
                    "kernels.bench.perfcheck.x_judge__mutmut_19")},
    **{f"kernels.bench.perfcheck.x_stopping_rule__mutmut_{n}":
       "environ.get's default None: falsy, as '' is" for n in (10, 12)},
    "kernels.bench.perfcheck.xǁPerfSessionǁ_inputs_for__mutmut_6":
        "'' for None while the next case's inputs are made: either frees the previous arrays",
    **{f"kernels.bench.confirm.x_confirm__mutmut_{n}":
       "rsplit('.') or rsplit('.', 2) for rsplit('.', 1): the last part is the method either way"
       for n in (8, 11)},
    "kernels.bench.confirm.x_confirm__mutmut_12":
        "[1] for [-1] of rsplit('.', 1): asv names every benchmark module.Class.method, two parts",
    "kernels.bench.confirm.x_key_of__mutmut_8":
        "strip('XX\\'XX') also strips capital X: no implementation, case or direction has one "
        "at an end",
    **{f"kernels.bench.gate.x_plant_source__mutmut_{n}":
       "the case of a comment line in the planted text: Python skips it"
       for n in (3, 4, 9, 10)},
    **{f"kernels.bench.gate.x__commit__mutmut_{n}": "git's -q: what it prints, not what it does"
       for n in (9, 39)},
    "kernels.bench.gate.x_main_flow__mutmut_212": "git's -q: what it prints, not what it does",
    "kernels.bench.gate.x__commit__mutmut_19":
        "the name of the branch each trial commits on: nothing else reads it",
    "kernels.bench.gate.x__commit__mutmut_60":
        "rev-parse 'head' for 'HEAD': the branch just committed on, the same commit",
    **{f"kernels.bench.gate.x_main_flow__mutmut_{n}":
       "the speed-up's branch name, or -b for -B: the scratch clone has no such branch yet"
       for n in (221, 222, 223)},
    **{f"kernels.bench.gate.x_main_flow__mutmut_{n}":
       "rmtree's ignore_errors: the scratch clone is ours and removable; it differs only "
       "when the removal fails" for n in (286, 288, 289)},
    **{f"kernels.bench.gate.x_main_flow__mutmut_{n}":
       "a plant trial's kind: report reads a kind only as 'A/A' or 'speed-up', anything else "
       "is a plant" for n in (181, 182)},
    "kernels.bench.gate.x_main_flow__mutmut_109":
        "an A/A trial's size: report reads a size only for plants and the speed-up",
    **{f"kernels.bench.gate.x_run_trial__mutmut_{n}":
       "the rows file's name: any name unique per trial label does (the trial's own --json)"
       for n in (13, 14, 15)},
    "kernels.bench.gate.x_run_trial__mutmut_165":
        "strip('XX\\'XX') also strips capital X: no implementation's name starts or ends "
        "with one",
    **{f"kernels.bench.{module}.x__print__mutmut_{n}": _FLUSH
       for module in ("confirm", "gate") for n in (2, 4, 5)},
    **{f"kernels.bench.asv_tools.x_compare__mutmut_{n}":
       "sorted by name alone: each suite's time_ rows still come before its track_ rows "
       "('time_' < 'track_'), so a derived row finds its time gap either way" for n in (4, 6)},
    **{f"kernels.bench.asv_tools.x_compare__mutmut_{n}":
       ">= for > at equal gaps: the same gap either way, a tie in which reason is shown"
       for n in (75, 85)},
    "kernels.bench.asv_tools.x_threshold__mutmut_25":
        ">= for > at a floor equal to the noise: the same gap, a tie in which reason is shown",
    **{f"kernels.bench.asv_tools.x__method__mutmut_{n}":
       "rsplit at every dot, or the last two: the last part is the same" for n in (4, 7)},
    "kernels.bench.asv_tools.x__short__mutmut_10":
        "1000001 for 1e6 us per second: under 20 us it moves the value by under 0.00002 us, "
        "below the one decimal shown",
    **{f"kernels.bench.asv_tools.x_load__mutmut_{n}":
       "zip's strict off: asv gives one value, sample list and stats per combination, so "
       "the lengths always match" for n in (35, 40, 41)},
    "kernels.bench.asv_tools.x_load__mutmut_14":
        "product() of no parameter lists is [()], what the else gives",
    **{f"kernels.bench.asv_tools.x_{function}__mutmut_{n}":
       "the JSON file's indentation: the same data" for function, n in (
           ("learn_floors", 82), ("run", 137), ("run", 139), ("run", 141))},
    **{f"kernels.bench.asv_tools.x_verdict__mutmut_{n}":
       "a boundary at ratio 1, which a row past its gap never has" for n in (105, 115, 117)},
    "kernels.bench.asv_tools.x_verdict__mutmut_50":
        ">= for >: at a gap equal to min_gap, 'changed' is beyond(min_gap), so the branch "
        "(not changed, yet beyond min_gap) cannot be taken either way",
    "kernels.bench.asv_tools.x_verdict__mutmut_54":
        "'' or 'XXXX' for a missing reason: neither holds 'learned' nor starts with 'host', "
        "so the verdict is the same",
    "kernels.bench.asv_tools.x_register_machine__mutmut_4":
        "machine_name(None) reads fingerprint.identity() itself: the cached identity "
        "register_machine has just read",
    "kernels.bench.asv_tools.x_floor_key__mutmut_3":
        "the separator inside a floor's key: floor_key writes and reads it alike",
    **{f"kernels.bench.confirm.x_source_tree__mutmut_{n}":
       "git archive's check and tar's back each other up: with either off, a failed archive "
       "still raises CalledProcessError (tar refuses the empty input; git fails before tar)"
       for n in (26, 29, 37, 41, 44, 52)},
    # gate-breakdown, renumbered 2026-12-02 after the confirmation column
    **{f"kernels.bench.breakdown.xǁBreakdownǁadd__mutmut_{n}":
       "a missing time read as None, not 0.0: _add counts None as 0.0"
       for n in (27, 29, 42, 44, 60, 62, 86, 88)},
    **{f"kernels.bench.breakdown.xǁBreakdownǁrender__mutmut_{n}":
       "seconds.get's default: only phases in seconds are rendered, so it is never read"
       for n in (52, 54, 55, 60, 62, 63)},
    **{f"kernels.bench.breakdown.xǁBreakdownǁrender__mutmut_{n}":
       "by_pass.get's default: the passes drawn are by_pass's own keys, so it is never read"
       for n in (28, 30, 99, 101)},
    **{f"kernels.bench.breakdown.xǁBreakdownǁrender__mutmut_{n}":
       "by_pass.get('confirm')'s default: a round counted has added its phases to that pass"
       for n in (114, 116)},
    "kernels.bench.breakdown.xǁBreakdownǁrender__mutmut_82":
        "overlap <= 0 for < 0: an overlap of 0 rounds to 0.0 and draws no row at all",
    # isolation, reviewed 2026-11-27 (fourth session)
    **{f"kernels.testing.isolation.x__one_line__mutmut_{n}":
       "next's default dropped or None: the text starts with the exception's type name, so "
       "a line with text always exists and the default is never read" for n in (4, 6)},
    "kernels.testing.isolation.x__seconds__mutmut_5":
        "-2.0 for -1.0 as an unreadable number's value: any negative is refused alike",
    "kernels.testing.isolation.x__seconds__mutmut_12": _INF,
    "kernels.testing.isolation.xǁ_Controllerǁlabel__mutmut_13":
        "the bracket slice of an id that does not end in ']': pytest puts parameters only "
        "at the end, so the slice holds the path or '::' and names no kernel item",
    "kernels.testing.isolation.xǁ_Controllerǁlabel__mutmut_23":
        "'XXXX' for '' as a plain id's parameters: no kernel item's are either, the lookup "
        "misses alike",
    **{f"kernels.testing.isolation.xǁ_Controllerǁlabel__mutmut_{n}":
       "rsplit('::') with no or another maxsplit: its last part is the same"
       for n in (29, 32)},
    "kernels.testing.isolation.xǁ_Controllerǁlabel__mutmut_33":
        "[1] for [-1]: an item's node id always holds '::', so the one split has two parts",
    "kernels.testing.isolation.xǁ_Controllerǁ_fault_record__mutmut_66":
        "rstrip(':X') for rstrip(':'): faulthandler's first lines never end in an 'X'",
    "kernels.testing.isolation.xǁReplacementFixesǁschedule__mutmut_1":
        "the top-up on the first schedule too: xdist's first leaves each node two units "
        "(two items or more) or an empty queue, so it adds nothing",
    "kernels.testing.drill.x_junit_outcomes__mutmut_14":
        "'XXXX' for a nameless test case's name: no brackets, skipped as '' is",
    "kernels.testing.drill.x_junit_outcomes__mutmut_48":
        "the message's 'or' fallback: read only for an empty message, which the conditional "
        "around it has already sent to ''",
    "kernels.testing.drill.x_asv_values__mutmut_31":
        "strip(\"X'\") for strip(\"'\"): implementation names are lower case",
    "kernels.testing.drill.x_asv_values__mutmut_57": _NAN,
    # gate-measuring, reviewed 2026-11-27 (fourth session)
    **{f"perf_tests.measuring.x_ensure_measured__mutmut_{n}":
       "print's flush=True dropped: sys.stderr is line-buffered (always, since Python 3.9) "
       "and the line ends in a newline" for n in (14, 17, 18)},
    "perf_tests.measuring.x_ensure_measured__mutmut_19":
        "serial = None for False: falsy, as False is, wherever it is read",
    **{f"perf_tests.measuring.x_ensure_measured__mutmut_{n}":
       "unlink's missing_ok off: the loop wrote the keys file just before, and only it removes "
       "it" for n in (89, 90)},
    "perf_tests.measuring.x__watch__mutmut_7":
        "ready = progressed = None for False: falsy, as False is, wherever they are read",
    "perf_tests.measuring.x__watch__mutmut_9":
        "allowed_now's first value is never read: it is read only with a key in flight, and "
        "every event that puts one in flight sets it",
    **{f"perf_tests.measuring.x__compile_ahead__mutmut_{n}":
       "zip's strict dropped: futures is made from keys, one per key" for n in (31, 34, 35)},
    **{f"perf_tests.measuring.x__one_line__mutmut_{n}":
       "next's default is never reached: the text starts with the exception's type name, so "
       "its first line is never blank" for n in (5, 7)},
    **{f"perf_tests.measuring.x_worker__mutmut_{n}":
       "environ.get's default None or 'XXXX' for '': neither is '0', so unset still compiles "
       "ahead" for n in (34, 36, 37)},
    "perf_tests.measuring.x_worker__mutmut_67":
        "inputs_s's first value per case is never read: the case's inputs are made (and "
        "inputs_s set) before any record takes it",
    # perfcheck, roofline, bottleneck, reviewed 2026-11-27 (fourth session). mutmut renumbered
    # perfcheck's record (its getattr and NAN mutants were 15 and 45) and ceilings' measured.
    "kernels.bench.perfcheck.x_record__mutmut_16": "getattr's default None: falsy, as False is",
    "kernels.bench.perfcheck.x_record__mutmut_46": _NAN,
    **{f"kernels.roofline.ceilings.x_measured__mutmut_{n}":
       "indent: the cache file's layout, not what it holds" for n in (53, 55, 60)},
    **{f"kernels.roofline.ceilings.x__measured_elsewhere__mutmut_{n}":
       "the child's stderr inherited, not joined to its stdout: both reach our stderr, since "
       "its stdout is sys.stderr (fd 2 unless a caller swaps sys.stderr in Python)"
       for n in (5, 9)},
    **{f"kernels.roofline.ceilings.x__measured_elsewhere__mutmut_{n}":
       "subprocess.run's check None or left out: falsy, as False is" for n in (6, 10)},
    **{f"kernels.roofline.ceilings.x__progress__mutmut_{n}": _FLUSH for n in (3, 6, 7)},
}


# Mutants left alive on purpose, by mutant-name glob: each reason says why no CPU test of the
# target can (or should yet) kill them. They are scored as not killed, listed with
# --verbose, and do not fail the run.
SURVIVORS: dict[str, str] = {
    "kernels.bench.perfcheck.x_baselines_for__mutmut_7":
        "has_direction(peer, None) reads as the backward: differs only for a baseline without "
        "one, which no operation registers today",
    "kernels.profile.bottleneck.x_profile__*": "runs ncu on a GPU (`kernels bottleneck`)",
    "kernels.profile.bottleneck.x_profile_command__*": "the ncu command line, run on a GPU",
    "kernels.bench.gate.x_main_flow__mutmut_230":
        "git revert without --no-edit opens an editor only when run from a terminal; the "
        "tests have none",
    **{f"kernels.core.timing.x__say__mutmut_{n}":
        "the warning's stacklevel (where it points): mutmut's trampolines add frames to "
        "every call, so no test of it passes mutmut's unmutated run; seen by a reader of a "
        "real run's warning"
       for n in (6, 7)},
    "kernels.core.timing.x_l2_bytes__mutmut_8":
        "range(9) for range(8): reads a ninth cache index too; sysfs lists 4 or 5 (L1d, L1i, "
        "L2, L3, an L4 at most), so only a test that pins the loop's bound could tell",
    "kernels.core.timing.x_prepare__mutmut_115":
        "the torch cotangent left on the host (.to(None)): on a CPU that is the output's "
        "device; on a GPU autograd.grad refuses a host cotangent for a CUDA output, which any "
        "torch backward benchmark there (perf gate, `kernels time --direction bwd`) catches",
    **{f"kernels.core.checking.x_check__mutmut_{n}":
       "zip's strict dropped: differs only where prepare or the VJP hands back another number "
       "of arguments or gradients than the operation has inputs, which JAX's and torch's "
       "VJPs refuse first; no CPU kernel does"
       for n in (80, 85, 86, 131, 136, 137)},
    **{f"kernels.core.checking.x__stats__mutmut_{n}":
       "a float64 zero or inf promotes the host's masked copies to float64: the same float32 "
       "values, differences and spreads rounded less; a verdict moves only at a rounding tie"
       for n in (25, 27, 63, 65)},
    **{f"kernels.core.checking.x_compute_reference__mutmut_{n}":
       "the cotangent drawn as float64, then rounded to the case dtype: another standard "
       "normal from the seed alone; nothing relies on which" for n in (32, 34)},
    "kernels.core.checking.xǁChunkedGeneratorǁ_fill__mutmut_36":
        "a large draw cut into its 16 pieces by rows, not flat: other values, still from the "
        "seed alone and whatever the threads; nothing relies on which cut",
    **{f"kernels.core.checking.x__host_norm__mutmut_{n}":
       "the host norm's chunk count at its extremes (more chunks than elements; one chunk up "
       "to 3^20 elements): the same sum, the cost (10^9 views, or a float64 copy of the whole "
       "array) shows only at sizes no CPU test makes" for n in (17, 18)},
    # isolation, reviewed 2026-11-27 (fourth session)
    "kernels.testing.isolation.xǁ_Controllerǁ_exit_status__mutmut_3":
        "3 s for 2 of waiting on a dead worker's exit status: it has exited; only a hung one "
        "would show the second, and a test would have to wait it out",
    "kernels.testing.drill.x__last_line__mutmut_20":
        "4097 bytes of the log's end read for 4096: one more character only of a last line "
        "longer than the read, which is cut anyway",
}

# README.md and docs/: the defaults' tests read the documents' sentences (wherever they stand).
COPIED = ("correctness_tests", "perf_tests", "conftest.py", "asv.conf.json", "README.md", "docs")


def mutmut_paths(target: Target) -> tuple[list[str], list[str]]:
    """(source paths, paths copied as they are) for mutmut: it mutates only under its source
    paths, so they are the top folder of every module of the target (perf_tests' too)."""
    sources = sorted({"kernels", *(module.split("/", 1)[0] for module in target.modules)})
    return sources, [name for name in COPIED if name not in sources]


def _tree_digest(target: Target) -> str:
    """SHA-256 over every copied file but the target's own modules (whose mutants mutmut
    tracks itself): the tests, the rest of `kernels` and what they read."""
    import hashlib

    digest = hashlib.sha256()
    own = {ROOT / module for module in target.modules}
    for name in ("kernels", *COPIED, "pyproject.toml"):
        top = ROOT / name
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.is_file() and path not in own and "__pycache__" not in path.parts \
                    and path.suffix not in (".so", ".o", ".pyc"):
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _drop_stale_results(work: pathlib.Path, target: Target, keep: bool = False) -> bool:
    """Forget every mutant and its recorded result (mutmut's mutants/) when anything but
    the target's modules changed since they were recorded: mutmut retests only mutants whose
    own function changed, so a test added to kill a survivor left it reported as surviving
    (gate-confirm, 2026-11-27). `keep` (--rerun-survivors: tests were added, what they
    killed stays killed) keeps them. True if results were dropped."""
    stamp = work / "tree.sha256"
    digest = _tree_digest(target)
    # Results without a stamp come from a driver before this one: of an unknown tree.
    recorded = (work / "mutants").is_dir()
    stale = recorded and not keep and (not stamp.exists() or stamp.read_text() != digest)
    if stale:  # the mutated copies too: mutmut lists a module's mutants in its .meta
        shutil.rmtree(work / "mutants", ignore_errors=True)
    stamp.write_text(digest)
    return stale


def _prepare(target: Target, keep_results: bool = False) -> pathlib.Path:
    """A scratch copy of the tree with a pyproject.toml that tells mutmut what to do; the
    results recorded there dropped if the tree around the target changed (unless
    `keep_results`)."""
    work = SCRATCH / target.name
    work.mkdir(parents=True, exist_ok=True)
    if _drop_stale_results(work, target, keep=keep_results):
        print(f"mutation: {target.name}: the tests or the code around the target changed; "
              f"every mutant runs again", file=sys.stderr)
    for name in ("kernels", "correctness_tests", "perf_tests", "docs"):
        if (work / name).exists():
            shutil.rmtree(work / name)
        shutil.copytree(ROOT / name, work / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    # asv's tests find the project by its conf; the defaults' tests read the documents'
    # sentences (README.md and docs/, copied above).
    for name in ("conftest.py", "asv.conf.json", "README.md"):
        shutil.copy2(ROOT / name, work / name)
    # mutmut's test processes put mutants/ on sys.path; made now, so it exists when they start.
    (work / "mutants").mkdir(exist_ok=True)
    warmup = WARMUP + (WARMUP_PACKAGE if target.preload_package else WARMUP_FORGET)
    (work / "mutants" / f"{WARMUP_MODULE}.py").write_text(warmup)
    (work / "preload.txt").write_text(WARMUP_MODULE + "\n")
    project = (ROOT / "pyproject.toml").read_text()
    sources, copied = mutmut_paths(target)
    settings = {
        "source_paths": sources,
        "only_mutate": list(target.modules),
        "also_copy": copied,
        # One worker per child: the machine is shared, and each test process imports JAX.
        # unraisableexception: its gc.collect() at exit walks JAX's and torch's heap, most of a
        # second per mutant.
        # --assert=plain: pytest would rewrite and compile each test module's asserts again in
        # every child (0.06 s a mutant); a failing plain assert fails the test all the same.
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-p", "no:xdist", "-p",
                                "no:unraisableexception", "-q", "--assert=plain"],
        "pytest_add_cli_args_test_selection": _existing(target.tests),
        "use_git_change_detection": False,
        "process_isolation": target.isolation,
        "forkserver_warmup": "import",
        "preload_modules_file": str(work / "preload.txt"),
        # A mutant's tests may run (their own time + 20 s) x 1.5 of wall time before they
        # count as hung (and killed); mutmut allows that x 2 of CPU time. mutmut's own 1 s let
        # a busy machine's slow start read as a kill; its multiplier of 15 let each hung
        # mutant hold a child for 7.5 minutes or more (2026-11-27: the isolation target sat
        # 7 minutes on one mutant of a loop over an exception's causes).
        "timeout_constant": 20.0,
        "timeout_multiplier": 1.5,
        "debug": bool(os.environ.get("MUTATION_DEBUG")),
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}"
                                     for key, value in settings.items()]
    mutmut_settings = "\n".join(lines[2:]) + "\n"
    recorded = work / "settings.toml"
    if keep_results and recorded.exists() and recorded.read_text() != mutmut_settings:
        # mutmut forgets every recorded result when its own settings change (2026-11-27: a
        # rerun after the pytest arguments changed found 766 of 859 mutants "not checked").
        print(f"mutation: {target.name}: mutmut's settings changed since the last run (the "
              f"test selection or pytest's arguments), so mutmut runs every mutant again, "
              f"not only the survivors", file=sys.stderr)
    recorded.write_text(mutmut_settings)
    (work / "pyproject.toml").write_text(project + "\n".join(lines) + "\n")
    return work


def check_warmup() -> None:
    """Raise if the fork server's warm-up fails or starts a JAX backend (its children would
    then share its XLA threads, see Target.isolation)."""
    code = (WARMUP + WARMUP_PACKAGE + "from jax._src import xla_bridge\n"
            "import sys\n"
            "sys.exit(3 if xla_bridge._backends else 0)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False,
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if done.returncode:
        raise RuntimeError("WARMUP " + ("started a JAX backend" if done.returncode == 3 else
                                        f"failed: {done.stderr[-1000:]}"))


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


# What mutmut prints when the selected tests fail with no mutant active (it then exits 1,
# as it does when mutants survive).
CLEAN_RUN_FAILED = "Failed to run clean test"


def _mutmut(work: pathlib.Path, *args: str, capture: bool = False) -> str:
    """mutmut's output; shown as it comes unless `capture` (its spinner rewrites a line)."""
    command = [sys.executable, "-m", "mutmut", *args]
    env = dict(os.environ, PYTHONPATH=str(work / "mutants"))
    if capture:
        done = subprocess.run(command, cwd=work, env=env, text=True, check=False,
                              capture_output=True)
        returncode, output, errors = done.returncode, done.stdout, done.stderr
    else:
        process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        chunks = []
        for chunk in iter(lambda: process.stdout.read1(4096), b""):
            chunks.append(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        returncode = process.wait()
        output = errors = b"".join(chunks).decode(errors="replace")
    if returncode not in (0, 1) or (capture and not output and errors):
        raise RuntimeError(f"{' '.join(command)} in {work} exited {returncode}: "
                           f"{(errors or '')[-2000:]}")
    return output or ""


def results(work: pathlib.Path) -> dict[str, str]:
    """mutant name -> status ("killed", "survived", "no tests", "timeout", ...), from
    `mutmut results`."""
    out = _mutmut(work, "results", "--all", "true", capture=True)
    statuses = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name:
            statuses[name] = status.strip()
    return statuses


# Prints, for each mutant name read from stdin, the original and the mutated function's source
# (mutmut's own reading of its mutants/ tree), as JSON.
_SOURCES = """\
import json, sys
import libcst
from mutmut.mutation import diff_apply

modules, out = {}, {}
for name in sys.stdin.read().split():
    path = diff_apply.find_mutant(name).path
    if path not in modules:
        modules[path] = diff_apply.read_mutants_module(path)
    module = modules[path]
    out[name] = [libcst.Module([f]).code for f in (diff_apply.read_original_function(module, name),
                                                   diff_apply.read_mutant_function(module, name))]
print(json.dumps(out))
"""


def sources(work: pathlib.Path, names: list[str]) -> dict[str, tuple[str, str]]:
    """mutant name -> (original function source, mutated function source)."""
    if not names:
        return {}
    done = subprocess.run([sys.executable, "-c", _SOURCES], cwd=work, input=" ".join(names),
                          text=True, capture_output=True, check=False,
                          env=dict(os.environ, PYTHONPATH=str(work / "mutants")))
    if done.returncode:
        raise RuntimeError(f"reading mutants in {work}: {done.stderr[-2000:]}")
    return {name: tuple(pair) for name, pair in json.loads(done.stdout).items()}


def text_only(original: str, mutant: str, keywords: tuple[str, ...]) -> bool:
    """Whether `mutant` differs from `original` (two versions of one function) only in string
    constants passed as one of `keywords` (or that text replaced by None): the same program
    but for what it shows a reader. Compared as syntax trees, the functions' names aside."""
    import ast

    def same(a, b, keyword: str | None) -> bool:
        if type(a) is not type(b):
            return (keyword in keywords and isinstance(a, ast.Constant)
                    and isinstance(b, ast.Constant)
                    and all(isinstance(c.value, (str, type(None))) for c in (a, b)))
        if isinstance(a, ast.Constant):
            return a.value == b.value or (keyword in keywords and all(
                isinstance(c.value, (str, type(None))) for c in (a, b)))
        if isinstance(a, ast.keyword):
            return a.arg == b.arg and same(a.value, b.value, a.arg)
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y, keyword)
                                            for x, y in zip(a, b, strict=True))
        if isinstance(a, ast.AST):
            return all(same(getattr(a, f), getattr(b, f), keyword) for f in a._fields)
        return a == b

    first, second = (ast.parse(textwrap.dedent(code)).body[0] for code in (original, mutant))
    return all(same(getattr(first, f), getattr(second, f), None)
               for f in ("args", "body", "decorator_list", "returns"))


KILLED = ("killed", "timeout", "segfault")  # a timeout: the mutant hung the tests
# Not killed: it ran and passed, or no test of the target reached it (which is a survivor
# too: a bug there would pass the target's tests).
NOT_KILLED = ("survived", "no tests")


def known_survivor(name: str) -> str | None:
    """The reason a mutant is left alive (`SURVIVORS`), or None."""
    for glob, reason in SURVIVORS.items():
        if fnmatch.fnmatchcase(name, glob):
            return reason
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModuleScore:
    """One module's mutants in one target: every one is killed, equivalent (`EQUIVALENT`, not
    scored), a survivor with a reason (`SURVIVORS`, scored as not killed), a survivor without
    one, or not run (mutmut did not get to it; scored as not killed)."""

    module: str
    total: int
    killed: int
    equivalent: tuple[str, ...]
    explained: tuple[tuple[str, str], ...]  # (mutant, reason)
    survivors: tuple[str, ...]
    not_run: tuple[str, ...]

    @property
    def scored(self) -> int:
        return self.total - len(self.equivalent)

    @property
    def percent(self) -> str:
        return f"{100.0 * self.killed / self.scored:.0f}%" if self.scored else "-"


TEXT_ONLY = "text only: changes nothing but a string shown to a reader (help, metavar)"


def equivalent_reason(name: str, text: frozenset[str] = frozenset()) -> str | None:
    """Why `name` is equivalent: its line in EQUIVALENT, or TEXT_ONLY; None if it is not."""
    return EQUIVALENT.get(name) or (TEXT_ONLY if name in text else None)


def score_module(module: str, statuses: dict[str, str],
                 text: frozenset[str] = frozenset()) -> ModuleScore:
    """Score every mutant in `statuses` (all of one module's, in one target); `text`: the
    survivors found to change only text (`text_only`), counted as equivalent."""
    killed, equivalent, explained, survivors, not_run = 0, [], [], [], []
    for name, status in sorted(statuses.items()):
        if equivalent_reason(name, text) and status not in KILLED:
            equivalent.append(name)
        elif status in KILLED:
            killed += 1
        elif status in NOT_KILLED:
            reason = known_survivor(name)
            if reason:
                explained.append((name, reason))
            else:
                survivors.append(name)
        else:
            not_run.append(f"{name} ({status})")
    return ModuleScore(module=module, total=len(statuses), killed=killed,
                       equivalent=tuple(equivalent), explained=tuple(explained),
                       survivors=tuple(survivors), not_run=tuple(not_run))


def score(target: Target, statuses: dict[str, str],
          text: frozenset[str] = frozenset()) -> list[ModuleScore]:
    """The target's mutants (those its globs select), scored per module."""
    by_module: dict[str, dict[str, str]] = {}
    for name, status in statuses.items():
        if any(fnmatch.fnmatchcase(name, glob) for glob in target.globs):
            module = name.split(".x", 1)[0]
            by_module.setdefault(module, {})[name] = status
    return [score_module(module, found, text) for module, found in sorted(by_module.items())]


def text_survivors(target: Target, work: pathlib.Path, statuses: dict[str, str]) -> frozenset[str]:
    """The target's mutants left alive that change only `target.text_keywords` text."""
    if not target.text_keywords:
        return frozenset()
    alive = [name for name, status in statuses.items() if status in NOT_KILLED
             and any(fnmatch.fnmatchcase(name, glob) for glob in target.globs)]
    return frozenset(name for name, (original, mutant) in sources(work, alive).items()
                     if text_only(original, mutant, target.text_keywords))


def report(target: Target, modules: list[ModuleScore], minutes: float | None,
           verbose: bool, text: frozenset[str] = frozenset()) -> list[str]:
    """The lines printed for one target: a score per module, then what is left alive."""
    took = f", {minutes:.1f} min" if minutes is not None else ""
    lines = [f"{target.name}{took}" + (f" (only {target.scope})" if target.scope else "")]
    for m in modules:
        lines.append(f"  {m.module:34s} {m.killed:4d}/{m.scored:<4d} killed  {m.percent:>4s}  "
                     f"({m.total} mutants, {len(m.equivalent)} equivalent, "
                     f"{len(m.explained)} left with a reason, {len(m.survivors)} survived, "
                     f"{len(m.not_run)} not run)")
        for name in m.survivors:
            lines.append(f"    survived: {name}")
        for name in m.not_run:
            lines.append(f"    not run: {name}")
        if verbose:
            lines += [f"    left: {name}: {reason}" for name, reason in m.explained]
            lines += [f"    equivalent: {name}: {equivalent_reason(name, text)}"
                      for name in m.equivalent]
    return lines


def main(argv: list[str] | None = None) -> int:
    names = [t.name for t in TARGETS]
    parser = argparse.ArgumentParser(prog="python -m kernels.testing.mutation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"default: all of {', '.join(names)}")
    parser.add_argument("--report-only", action="store_true",
                        help="print the scores of the last run without running mutmut")
    parser.add_argument("--verbose", action="store_true",
                        help="also list the equivalent mutants and the survivors left with "
                             "a reason")
    parser.add_argument("--rerun-survivors", action="store_true",
                        help="rerun only the mutants the last run left alive (after tests were "
                             "added: a mutant a kept test killed stays killed; mutmut itself "
                             "runs every mutant again if the target's tests or pytest "
                             "arguments changed)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1,
                        help="mutants run at once (default: one per CPU)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.targets) - set(names))
    if unknown:
        parser.error(f"TARGET: expected some of {names}, got {unknown}")
    chosen = [t for t in TARGETS if not args.targets or t.name in args.targets]
    if not args.report_only:
        check_warmup()
    failed = False
    for target in chosen:
        minutes = None
        if args.report_only:
            work = SCRATCH / target.name
            if not work.is_dir():
                print(f"{target.name}: no run to report ({work} is missing): "
                      f"`python -m kernels.testing.mutation {target.name}` runs it", flush=True)
                failed = True
                continue
        else:
            start = time.monotonic()
            work = _prepare(target, keep_results=args.rerun_survivors)
            names = target.globs
            if args.rerun_survivors:
                names = tuple(name for name, status in results(work).items()
                              if status not in KILLED
                              and any(fnmatch.fnmatchcase(name, g) for g in target.globs))
            output = _mutmut(work, "run", "--max-children", str(args.max_children),
                             *names) if names else ""
            minutes = (time.monotonic() - start) / 60
            if CLEAN_RUN_FAILED in output:
                # mutmut stops before any mutant; the results left from an earlier run would
                # read as this run's score.
                print(f"{target.name}: NO SCORE: mutmut's clean run (the target's tests on "
                      f"unmutated code, in {work}) failed; its output is above. Run the tests "
                      f"({' '.join(target.tests)}), or `rm -rf {work}` and run the target "
                      f"again", flush=True)
                failed = True
                continue
        statuses = results(work)
        text = text_survivors(target, work, statuses)
        modules = score(target, statuses, text)
        failed |= any(m.survivors or m.not_run for m in modules)
        if not modules:  # nothing mutated scores nothing: a target that tests no code
            print(f"{target.name}: NO MUTANTS of {', '.join(target.modules)} (mutmut mutated "
                  f"nothing: see its log above)", flush=True)
            failed = True
            continue
        # Printed as each target ends: a whole run takes most of an hour.
        print("\n".join(report(target, modules, minutes, args.verbose, text)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
