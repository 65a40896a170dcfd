"""How the kernel items share a GPU: groups, memory estimates, the worker count, the order
items run in, and the phase breakdown printed at the end."""

import importlib.util
import pathlib
import sys
import types

import pytest

from correctness_tests import fakes
from kernels.core import devices, environment, fingerprint, phases, registry
from kernels.testing import scheduling

# The repository's conftest by path: `import conftest` gets whichever conftest pytest loaded
# last under that name (perf_tests/tests has one too).
_spec = importlib.util.spec_from_file_location(
    "kernelperf_root_conftest", pathlib.Path(__file__).parents[1] / "conftest.py")
conftest = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(conftest)

CPU = fakes.cpu_machine(device_count=8)
GIB = 2**30


def _case(op_name, case_id):
    return registry.operation(op_name).case(case_id)


def test_only_real_size_attention_needs_the_heavy_group():
    heavy = {(op.name, case.id) for op in registry.operations() for case in op.cases
             if scheduling.group(op, registry.implementations(op.name)[0], case, fakes.H100)
             == scheduling.HEAVY_GROUP}
    assert heavy == {("attention", "bf16-4x4096x16x128"),
                     ("attention", "bf16-4x4096x16x128-causal"),
                     ("attention", "bf16-4x4096x8x64"),
                     ("attention", "bf16-4x4096x8x64-causal")}


def test_groups_per_case_and_for_several_devices():
    softmax = registry.operation("softmax")
    xla = registry.implementation("softmax", "xla")
    case = _case("softmax", "f32-32768x4096")
    assert scheduling.group(softmax, xla, case, fakes.H100) == "softmax-f32-32768x4096"
    sharded = registry.operation("sharded_matmul")
    collective = registry.implementation("sharded_matmul", "collective")
    mesh = sharded.cases_tagged("gpu")[0]
    assert scheduling.group(sharded, collective, mesh, fakes.H100) == scheduling.MULTI_DEVICE_GROUP
    # On CPU every case is its own group: the sharded ones run on host devices, in parallel.
    assert scheduling.group(sharded, collective, mesh, CPU) == f"sharded_matmul-{mesh.id}"
    attention = registry.operation("attention")
    big = _case("attention", "bf16-4x4096x16x128")
    assert scheduling.group(attention, registry.implementation("attention", "xla"), big,
                            CPU) == f"attention-{big.id}"


def test_estimates_follow_the_arrays():
    softmax = registry.operation("softmax")
    f32 = scheduling.estimated_bytes(softmax, _case("softmax", "f32-32768x4096"))
    bf16 = scheduling.estimated_bytes(softmax, _case("softmax", "bf16-32768x4096"))
    # Three 512 MiB arrays in the backward, four float32 copies of each; bf16 upcast too.
    assert f32 == pytest.approx(scheduling.COPIES * 3 * 512 * 2**20)
    assert bf16 == pytest.approx(f32)
    attention = registry.operation("attention")
    big = _case("attention", "bf16-4x4096x16x128")
    assert scheduling.estimated_bytes(attention, big) > attention.reference_bytes(big) == \
        pytest.approx(7 * 4 * GIB)


@pytest.mark.parametrize("gpu_gib, cpus", [(80, 16), (80, 4), (141, 16), (40, 16), (24, 8)])
def test_worker_count_fits_the_gpu(gpu_gib, cpus):
    estimates = scheduling.runnable_estimates(fakes.H100)
    plan = scheduling.plan(gpu_gib * GIB, estimates, cpus)
    light = max(b for g, b in estimates if g != scheduling.HEAVY_GROUP)
    heavy = max(b for g, b in estimates if g == scheduling.HEAVY_GROUP)
    assert plan.heavy_bytes == heavy and plan.light_bytes == light
    assert 1 <= plan.workers <= min(max(1, cpus // 2), scheduling.MAX_WORKERS)
    held = heavy + (plan.workers - 1) * light + plan.workers * scheduling.CONTEXT_BYTES
    if plan.workers > 1:
        assert held <= scheduling.CAPACITY_FRACTION * gpu_gib * GIB
        one_more = held + light + scheduling.CONTEXT_BYTES
        assert one_more > scheduling.CAPACITY_FRACTION * gpu_gib * GIB \
            or plan.workers == min(cpus // 2, scheduling.MAX_WORKERS)
    assert str(plan.workers) in plan.describe()


@pytest.mark.parametrize("gpu_gib", [141, 80, 40])
def test_the_plan_keeps_room_for_the_perf_worker(gpu_gib):
    """With the perf worker's room kept, the kernel-check workers and it fit the GPU together
    (the perf worker at the largest perf case or light estimate, whichever is more)."""
    estimates = scheduling.runnable_estimates(fakes.H100)
    perf = scheduling.perf_estimate(fakes.H100)
    plan = scheduling.plan(gpu_gib * GIB, estimates, 16, perf=perf)
    heavy, light = plan.heavy_bytes, plan.light_bytes
    held = heavy + (plan.workers - 1) * light + (plan.workers + 1) * scheduling.CONTEXT_BYTES \
        + max(perf, light)
    if plan.workers > 1:
        assert held <= scheduling.CAPACITY_FRACTION * gpu_gib * GIB
    assert plan.workers <= scheduling.plan(gpu_gib * GIB, estimates, 16).workers
    # The largest perf case: softmax f32 32768x4096, whose backward moves 1.5 GiB.
    assert perf == pytest.approx(scheduling.PERF_COPIES * 1.5 * GIB)


def test_worker_count_without_heavy_items():
    plan = scheduling.plan(80 * GIB, [("a", 2 * GIB), ("b", 1 * GIB)], cpus=64)
    assert plan.workers == scheduling.MAX_WORKERS and plan.heavy_bytes == 0
    assert scheduling.plan(4 * GIB, [("a", 8 * GIB)], cpus=64).workers == 1


def _item(op_name, impl_name, case_id, distribution, name):
    kernel_item = conftest.KernelItem(registry.implementation(op_name, impl_name),
                                      _case(op_name, case_id), distribution)
    return types.SimpleNamespace(callspec=types.SimpleNamespace(
        params={"kernel_item": kernel_item}), name=name)


def test_items_of_a_case_run_together_one_distribution_at_a_time():
    other = types.SimpleNamespace(name="test_rejects_bad_input")
    items = [other]
    for impl in ("pallas", "xla", "torch"):
        for case in ("f32-3x5", "f32-37x128"):
            for distribution in ("normal", "large"):
                items.append(_item("softmax", impl, case, distribution,
                                   f"{impl}-{case}-{distribution}"))
    items.append(other)
    conftest._schedule_order(items)
    assert items[0] is other and items[-1] is other
    assert [item.name for item in items[1:-1]] == [
        f"{impl}-{case}-{distribution}" for case in ("f32-3x5", "f32-37x128")
        for distribution in ("normal", "large") for impl in ("pallas", "xla", "torch")]


def test_phase_summary_adds_up():
    records = [phases.ItemRecord("a[1]", "softmax", 3.0, {"reference": 1.0, "forward": 1.5,
                                                          "jax_compile": 2.0}),
               phases.ItemRecord("b[2]", "matmul", 1.0, {"forward": 0.5, "compare": 0.25})]
    lines = phases.summarize(records, wall=2.5, workers=2)
    assert lines[0] == "kernelperf phases: 2 kernel items, 4.0 s of item time over 2 workers " \
        "in 2.5 s wall"
    text = "\n".join(lines)
    assert "forward            2.0 s   50.0%" in text
    assert "untimed            0.8 s" in text  # 4.0 - (1 + 2 + 0.25), jax_compile overlaps
    assert "softmax 3.0 (1 items), matmul 1.0 (1 items)" in text
    assert text.index("a[1]") < text.index("b[2]")
    with pytest.raises(ValueError, match="duration: expected >= 0"):
        phases.ItemRecord("c", "softmax", -1.0, {})


def _config(numprocesses, dist="no", collectonly=False, markexpr=""):
    option = types.SimpleNamespace(numprocesses=numprocesses, dist=dist, collectonly=collectonly,
                                   markexpr=markexpr)
    return types.SimpleNamespace(option=option, getoption=lambda name, default=None: default,
                                 pluginmanager=types.SimpleNamespace(hasplugin=lambda n: True))


@pytest.fixture
def on_h100(monkeypatch):
    """The H100's plans: (kernel-check workers with room for a perf worker, without)."""
    monkeypatch.setattr(devices, "this_machine", lambda: fakes.H100)
    monkeypatch.setattr(fingerprint, "gpu_memory_bytes", lambda: 80 * GIB)
    monkeypatch.setattr(environment, "cpu_count", lambda: 16)
    monkeypatch.delenv(scheduling.WORKERS_VARIABLE, raising=False)
    estimates = scheduling.runnable_estimates(fakes.H100)
    return (scheduling.plan(80 * GIB, estimates, 16,
                            perf=scheduling.perf_estimate(fakes.H100)).workers,
            scheduling.plan(80 * GIB, estimates, 16).workers)


def test_plain_command_on_a_gpu_takes_the_planned_workers_by_group(on_h100):
    # The plan's workers for the kernel checks, and one more for the perf items.
    config = _config(None)
    conftest.pytest_cmdline_main(config)
    assert on_h100[0] > 1 and config.option.numprocesses == on_h100[0] + 1
    assert config.option.dist == "loadgroup"
    assert config._kernelperf_plan[2] == on_h100[0] + 1
    assert "one more worker for the perf items" in config._kernelperf_plan[0].describe()


@pytest.mark.parametrize("asked", [2, 64, "auto"])
def test_asking_for_workers_on_a_gpu_never_exceeds_the_plan(on_h100, asked):
    config = _config(asked)
    conftest.pytest_cmdline_main(config)
    expected = {2: 2, 64: on_h100[1], "auto": on_h100[0] + 1}[asked]
    assert config.option.numprocesses == expected and config.option.dist == "loadgroup"


@pytest.mark.parametrize("markexpr, serial, perf_worker", [
    ("perf", True, False), ("gpu and perf", True, False), ("cuda and perf", True, False),
    ("gpu", False, True), ("gpu and not perf", False, False), ("perf or small", False, True),
    ("", False, True)])
def test_performance_only_runs_get_no_automatic_workers(on_h100, markexpr, serial,
                                                        perf_worker):
    # A run of perf items alone stays in one process (it has the device to itself); a run
    # that may select them among others gets the plan and a worker for them; a run that
    # cannot, the plan alone. Asking still wins.
    config = _config(None, markexpr=markexpr)
    conftest.pytest_cmdline_main(config)
    expected = None if serial else on_h100[0] + 1 if perf_worker else on_h100[1]
    assert config.option.numprocesses == expected
    asked = _config(2, markexpr=markexpr)
    conftest.pytest_cmdline_main(asked)
    assert asked.option.numprocesses == 2


def test_one_process_when_asked(on_h100, monkeypatch):
    config = _config(0)
    conftest.pytest_cmdline_main(config)
    assert config.option.numprocesses == 0 and config.option.dist == "no"
    monkeypatch.setenv(scheduling.WORKERS_VARIABLE, "0")
    config = _config(None)
    conftest.pytest_cmdline_main(config)
    assert config.option.numprocesses == 0 and config.option.dist == "no"
    monkeypatch.setenv(scheduling.WORKERS_VARIABLE, "many")
    with pytest.raises(pytest.UsageError, match="expected a whole number of workers"):
        conftest.pytest_cmdline_main(_config(None))


def test_cpu_runs_keep_their_worker_count_but_go_by_group(monkeypatch):
    monkeypatch.setattr(devices, "this_machine", lambda: CPU)
    monkeypatch.delenv(scheduling.WORKERS_VARIABLE, raising=False)
    for asked in (None, 2, "auto"):
        config = _config(asked)
        conftest.pytest_cmdline_main(config)
        assert config.option.numprocesses == asked
        assert config.option.dist == ("no" if asked is None else "loadgroup")
    explicit = _config(2, dist="load")
    conftest.pytest_cmdline_main(explicit)
    assert explicit.option.dist == "load"


def test_scheduler_groups_kernel_items_by_case_from_their_test_ids(monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setattr(devices, "this_machine", lambda: CPU)
    config = _config(2, dist="loadgroup")
    config.getoption = lambda name, default=None: ["popen", "popen"] if name == "tx" else default
    config.getvalue = config.getoption
    scheduler = conftest.pytest_xdist_make_scheduler(config, log=None)
    base = "correctness_tests/test_kernels.py::test_matches_reference"
    scopes = {scheduler._split_scope(f"{base}[softmax-{impl}-f32-37x128-{dist}]{suffix}")
              for impl in ("pallas", "xla", "triton") for dist in ("normal", "large")
              for suffix in ("", "@softmax-f32-37x128")}
    assert scopes == {"softmax-f32-37x128"}
    assert scheduler._split_scope(f"{base}[softmax-xla-f32-3x5-normal]") == "softmax-f32-3x5"
    other = "correctness_tests/test_harness.py::test_compare_reports_errors"
    assert scheduler._split_scope(other) == other
    assert conftest.pytest_xdist_make_scheduler(_config(2, dist="load"), log=None) is None


def _held_elsewhere(directory) -> bool:
    """Whether another open file description (as another process would have) is refused
    the lock several_devices_held takes in `directory`."""
    import fcntl
    import os

    path = pathlib.Path(directory) / f"kernelperf-several-devices-{os.getuid()}.lock"
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_work_over_several_devices_holds_a_lock_the_workers_share(tmp_path, monkeypatch):
    """Held for the body alone, and given back when the body raises; the holder's children
    (its environment) run without it."""
    import os

    monkeypatch.delenv(scheduling.HELD_VARIABLE, raising=False)
    assert not _held_elsewhere(tmp_path)
    with scheduling.several_devices_held(str(tmp_path)):
        assert _held_elsewhere(tmp_path)
        assert os.environ[scheduling.HELD_VARIABLE] == str(os.getpid())
        with scheduling.several_devices_held(str(tmp_path)):  # as a child would: no wait
            assert _held_elsewhere(tmp_path)
    assert not _held_elsewhere(tmp_path) and scheduling.HELD_VARIABLE not in os.environ
    with pytest.raises(RuntimeError, match="^a sharded test failed$"):
        with scheduling.several_devices_held(str(tmp_path)):
            raise RuntimeError("a sharded test failed")
    assert not _held_elsewhere(tmp_path)


@pytest.mark.parametrize(("shared_gpu", "marked", "locks"), [
    (True, True, True), (True, False, False), (False, True, False)])
def test_a_multi_gpu_item_runs_under_the_lock_on_a_shared_gpu_machine(
        shared_gpu, marked, locks, tmp_path, monkeypatch):
    """Only an xdist worker on a GPU machine (_SHARED_GPU) takes the lock, and only for an
    item marked multi_gpu; the item's outcome comes back through the wrapper either way."""
    monkeypatch.delenv(scheduling.HELD_VARIABLE, raising=False)
    monkeypatch.setattr(conftest, "_SHARED_GPU", shared_gpu)
    monkeypatch.setattr(scheduling.tempfile, "gettempdir", lambda: str(tmp_path))
    item = types.SimpleNamespace(get_closest_marker=lambda name: name == "multi_gpu" and marked
                                 or None)
    wrapper = conftest.pytest_runtest_protocol(item, None)
    next(wrapper)
    assert _held_elsewhere(tmp_path) is locks
    with pytest.raises(StopIteration) as stopped:
        wrapper.send(True)
    assert stopped.value.value is True
    assert not _held_elsewhere(tmp_path)


@pytest.mark.parametrize("workers, cores, user, expected", [
    ("2", 2, None, "1"),  # two workers on two cores: one thread each
    ("3", 8, None, "2"),  # the cores shared out, rounded down
    ("4", 2, None, "1"),  # never fewer than one
    ("2", 2, "3", "3"),  # a value the user set is kept
    (None, 2, None, None),  # no workers (-n 0, or outside pytest): the libraries' defaults
])
def test_xdist_workers_share_the_cores_between_their_blas_and_openmp_threads(
        monkeypatch, workers, cores, user, expected):
    """NumPy's OpenBLAS and torch's OpenMP start a thread per core in every process; in xdist
    workers each gets its share of the cores (on 2 cores two workers' threads waited on each
    other), set by environment.configure before either library loads."""
    if workers is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    monkeypatch.setattr(environment, "cpu_count", lambda: cores)
    for variable in environment.HOST_THREAD_VARIABLES:
        if user is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, user)
    environment.configure()
    assert {v: environment.os.environ.get(v) for v in environment.HOST_THREAD_VARIABLES} == \
        dict.fromkeys(("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"), expected)
