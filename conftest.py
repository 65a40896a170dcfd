"""pytest set-up: process environment first, then tests generated from the registry.

Before anything imports JAX or Triton, `kernels.core.environment.configure()` puts
Triton in its interpreter and gives JAX 8 host devices when there is no GPU.
Tests that take a `kernel_item` or `bad_input_item` argument are parametrized
over the registry, with ids like `softmax-pallas-f32-37x128-normal`. On a GPU
machine every kernel item is marked `gpu` (so `pytest -m gpu` runs them
compiled); without one, items that need a GPU are marked `gpu` and skip with
the reason, and the rest run interpreted.

Kernel items of one case share their inputs and reference (kernels.core.checking's
cache): they carry the case's xdist group and run back to back, one
distribution at a time. On a GPU machine a plain `pytest` runs distributed over
as many xdist workers as the GPU's memory holds (kernels/testing/scheduling.py), with
`--dist loadgroup`, and one more for the perf items, which run on it with the
device to themselves once the rest is done (kernels/testing/perf_phase.py; `-n
auto` gets that worker too); `-n N` asks for fewer, `-n 0` or
KERNELPERF_TEST_WORKERS=0 runs in one process. At the end the run prints where
the kernel checks spent their time (kernels/testing/phases_plugin.py).
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import os
import shutil
import sys
import tempfile

from kernels.core import environment

environment.configure()

# xdist workers share one GPU. JAX's default (BFC) allocator keeps every worker's peak for
# the rest of the run, and five workers' peaks added up past an H100's 80 GiB (2026-11-24:
# 32 items out of memory); the platform allocator hands memory back as arrays die, so the
# workers together hold what is live, which is what the worker plan budgets. Set before
# anything starts JAX's backend (collection does). A value the user set is kept. The perf
# items' worker (kernels/testing/perf_phase.py) times kernels with JAX's default allocator, as
# `pytest -m perf` in one process does (preallocation is off on a GPU either way:
# environment.configure): it holds one perf case at a time, and the plan keeps room for it.
_SHARED_GPU = bool(os.environ.get("PYTEST_XDIST_WORKER")) and environment.nvidia_gpu_present()
if _SHARED_GPU and environment.device_shared():
    os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")

# Without a GPU, most of the suite's time was XLA compiling for the CPU (74% of the kernel
# checks' time in a cold run, 2026-11-26), and most of a compile is LLVM optimizing machine
# code that runs a few times on inputs of a few kilobytes. The tests check results, HLO and
# compiled memory, which LLVM's optimization level does not change (HLO passes still run),
# so they compile at -O0 (a third less CPU in the kernel checks). Set before any JAX backend
# starts; the subprocesses the tests start (CLI, asv) inherit it. Benchmarks and the CLI
# outside pytest keep XLA's default, and so do the README check's commands (run as a user
# runs them); a GPU run keeps it too (PTX, not LLVM's CPU code).
# The flags of compat.CPU_FAST_COMPILE_FLAGS cut XLA's compile time to a third again, those this
# jaxlib knows (asked once, by the first process; the rest inherit the result). They
# change which fusions XLA:CPU forms, so the HLO and memory guards compile with XLA's default
# emitters (compat.guard_compile_options); results and everything else are unchanged.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if not environment.nvidia_gpu_present() and os.environ.get("KERNELPERF_README_CHECK") != "1" \
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    from kernels.core import compat

    _flags = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
    os.environ["XLA_FLAGS"] = " ".join(
        [_flags, *compat.accepted_xla_flags(_flags, compat.CPU_FAST_COMPILE_FLAGS)])

# The run measures this machine's ceilings (kernels/roofline/ceilings.py, $KERNELPERF_CACHE)
# into a cache of its own, made by the first process (the controller) and inherited by its
# workers and every process its tests start: once a run, not once per test giving its
# commands a fresh home, and never into the user's cache (a measurement under the run's load,
# its workers' threads limited: environment.configure). Not for the README check, whose
# commands run as a user's do. A cache the user named is kept.
if "KERNELPERF_CACHE" not in os.environ and os.environ.get("KERNELPERF_README_CHECK") != "1":
    os.environ["KERNELPERF_CACHE"] = tempfile.mkdtemp(prefix="kernelperf-test-cache-")
    atexit.register(shutil.rmtree, os.environ["KERNELPERF_CACHE"], ignore_errors=True)

import pytest  # noqa: E402

from kernels.core import devices, registry  # noqa: E402
from kernels.testing import scheduling  # noqa: E402
from kernels.testing.marks import kernel_marks  # noqa: E402

# The persistent compilation cache for the run and its hit rate in the summary; the phase
# breakdown of the kernel checks; fault containment (a kernel that crashes, hangs or poisons
# the device fails its own items only); test-only faulty implementations (--plant-fault); the
# perf items on the device alone under xdist workers (the perf phase).
pytest_plugins = ("kernels.testing.compilation_cache_plugin", "kernels.testing.phases_plugin",
                  "kernels.testing.isolation", "kernels.testing.faults",
                  "kernels.testing.perf_phase")


@dataclasses.dataclass(frozen=True)
class KernelItem:
    impl: registry.Implementation
    case: registry.Case
    distribution: str

    @property
    def id(self) -> str:
        return f"{self.impl.id}-{self.case.id}-{self.distribution}"


def kernel_params() -> list:
    machine = devices.this_machine()
    params = []
    for op in registry.operations():
        for impl in registry.implementations(op.name):
            for case in op.cases:
                reason = devices.case_unavailable_reason(impl, case, machine)
                marks = kernel_marks(impl, reason, machine)
                if "cpu" in case.tags:
                    marks.append(pytest.mark.small)
                marks.append(pytest.mark.xdist_group(scheduling.group(op, impl, case, machine)))
                for distribution in op.distributions:
                    item = KernelItem(impl, case, distribution)
                    params.append(pytest.param(item, id=item.id, marks=marks))
    return params


def bad_input_params() -> list:
    params = []
    for op in registry.operations():
        for impl in registry.implementations(op.name):
            if impl.baseline:
                continue  # peers are not ours to fix
            missing = [m for m in impl.requires.modules if not devices.module_available(m)]
            marks = [pytest.mark.skip(reason=f"needs {', '.join(missing)}")] if missing else []
            for bad in op.bad_inputs:
                params.append(pytest.param((impl, bad), id=f"{impl.id}-{bad.label}", marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel_item" in metafunc.fixturenames:
        metafunc.parametrize("kernel_item", kernel_params())
    if "bad_input_item" in metafunc.fixturenames:
        metafunc.parametrize("bad_input_item", bad_input_params())


def _schedule_order(items: list[pytest.Item]) -> None:
    """Kernel items of one case next to each other, one distribution at a time, so the
    reference cache holds the references of one case and distribution at a time; the
    slots they occupy and everything else stay where they were."""
    slots = [i for i, item in enumerate(items)
             if "kernel_item" in getattr(getattr(item, "callspec", None), "params", {})]
    if not slots:
        return
    kernel_items = [items[i] for i in slots]
    first_seen: dict = {}
    for position, item in enumerate(kernel_items):
        kernel_item = item.callspec.params["kernel_item"]
        first_seen.setdefault((kernel_item.impl.op, kernel_item.case), position)

    def key(pair):
        position, item = pair
        kernel_item = item.callspec.params["kernel_item"]
        op = registry.operation(kernel_item.impl.op)
        return (first_seen[(op.name, kernel_item.case)],
                op.distributions.index(kernel_item.distribution), position)

    for slot, (_, item) in zip(slots, sorted(enumerate(kernel_items), key=key), strict=True):
        items[slot] = item


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _schedule_order(items)


def pytest_configure(config: pytest.Config) -> None:
    # Without xdist (`-p no:xdist`, or not installed) nobody declares its group mark, and
    # --strict-markers would reject the items that carry one.
    config.addinivalue_line("markers", "xdist_group(name): items xdist runs on one worker")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under --dist loadgroup, the kernel items' groups read from the registry by test id.

    xdist groups by an `@group` suffix it writes into each worker's node ids, which pytest
    9.2 no longer reads back (node ids are derived, not stored); the controller can name
    every kernel item's group itself, from the same parameters the workers collect. This
    scheduler and loadscope's and loadfile's take isolation.ReplacementFixes: after a worker
    dies, xdist would run its crashed item again on every replacement, and could lose or
    stall work while a replacement joins."""
    from xdist.scheduler import LoadFileScheduling, LoadGroupScheduling, LoadScopeScheduling

    from kernels.bench import perfcheck

    # Imported here, not above: a plugin module imported before pytest registers it (see
    # pytest_plugins) misses pytest's assertion rewriting, with a warning.
    from kernels.testing import isolation, perf_phase

    if config.option.dist in ("loadscope", "loadfile"):
        base = LoadScopeScheduling if config.option.dist == "loadscope" else LoadFileScheduling
        return type(f"Replacing{base.__name__}", (isolation.ReplacementFixes, base), {})(
            config, log)
    if config.option.dist != "loadgroup":
        return None

    groups = {}
    for param in kernel_params():
        for mark in param.marks:
            if mark.name == "xdist_group":
                groups[param.id] = mark.args[0]
    # The perf items, by test name and id: one group, first on a worker of their own.
    perf_names = {f"{perfcheck.PERF_TEST}[{item.id}]" for item in perfcheck.perf_items()}

    class KernelGroupScheduling(isolation.ReplacementFixes, perf_phase.PerfFirst,
                                LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rpartition("::")[2] in perf_names:
                return perf_phase.PERF_GROUP
            test_id = nodeid[nodeid.rfind("[") + 1:nodeid.rfind("]")] if "[" in nodeid else ""
            return groups.get(test_id) or super()._split_scope(nodeid)

    return KernelGroupScheduling(config, log)


# Markers a non-performance item can carry: a -m expression none of their combinations
# satisfies selects performance items only.
_OTHER_MARKERS = ("gpu", "small", "cuda", "slow", "multi_gpu", "readme")


def _selects_perf_only(markexpr: str) -> bool:
    """Whether `-m markexpr` selects the performance items alone (`-m perf`, `-m "gpu and
    perf"`): they time the device, so such a run gets no automatic workers (workers would
    share the device, and the items would skip)."""
    if not markexpr:
        return False
    try:  # pytest's own parser (private): a pytest without it keeps the worker plan
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
    except (ImportError, AttributeError, SyntaxError):
        return False
    for count in range(len(_OTHER_MARKERS) + 1):
        for names in itertools.combinations(_OTHER_MARKERS, count):
            if expression.evaluate(lambda name, *_, _names=set(names), **__: name in _names):
                return False
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A worker on a shared GPU machine runs an item marked `multi_gpu` holding the lock the
    workers share (scheduling.several_devices_held): two processes' collectives on the same
    GPUs can wait on each other forever."""
    if not (_SHARED_GPU and item.get_closest_marker("multi_gpu")):
        return (yield)
    with scheduling.several_devices_held():
        return (yield)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A worker on a shared GPU gives torch's cached blocks back after each item (see
    _SHARED_GPU): the others may need them."""
    torch = sys.modules.get("torch")
    if _SHARED_GPU and torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Choose the xdist workers before xdist reads -n: on a GPU machine, as many as the GPU
    holds (fewer if asked), grouped by case."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    option = config.option
    override = os.environ.get(scheduling.WORKERS_VARIABLE, "").strip()
    if override:
        try:
            option.numprocesses = int(override)
        except ValueError:
            raise pytest.UsageError(f"{scheduling.WORKERS_VARIABLE}: expected a whole number "
                                    f"of workers, got {override!r}") from None
    elif option.numprocesses != 0 and not option.collectonly and \
            not config.getoption("usepdb", False) and not _selects_perf_only(option.markexpr) \
            and devices.this_machine().has_gpu:
        # Where the run may select perf items, a count chosen here has one worker more for
        # them (kernels/testing/perf_phase.py), and the plan keeps room for it.
        requested = option.numprocesses
        automatic = requested in (None, "auto", "logical")
        extra = _perf_phase().extra_worker(option.markexpr) if automatic else 0
        plan = scheduling.auto_workers(devices.this_machine(), perf=bool(extra))
        if plan is not None:
            chosen = plan.workers + extra if automatic else min(int(requested), plan.workers)
            option.numprocesses = chosen if chosen > 1 else 0
            config._kernelperf_plan = (plan, requested, chosen)
    if option.numprocesses and option.dist == "no":  # "auto" included: xdist resolves it
        option.dist = "loadgroup"


def _perf_phase():
    # Imported when used: a plugin module imported before pytest registers it (see
    # pytest_plugins) misses pytest's assertion rewriting, with a warning.
    from kernels.testing import perf_phase

    return perf_phase


def pytest_report_header(config: pytest.Config) -> list[str]:
    machine = devices.this_machine()
    failures = registry.import_failures()
    lines = [f"kernelperf: {machine.describe()}; Pallas "
             f"{'compiled' if machine.has_gpu else 'interpreted'}"]
    chosen = getattr(config, "_kernelperf_plan", None)
    if chosen:
        plan, requested, workers = chosen
        asked = "" if requested in (None, "auto", "logical") else f" (asked for -n {requested})"
        lines.append(f"kernelperf: {workers} workers{asked}, --dist {config.option.dist}; "
                     f"room for {plan.describe()}")
    lines += [f"kernelperf: not registered: {name}: {why}" for name, why in failures.items()]
    return lines
