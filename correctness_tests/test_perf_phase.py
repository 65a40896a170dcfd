"""The perf phase under xdist workers (kernels/testing/perf_phase.py), part by part: the device
lock, which items take it how, the scheduler that gives the perf group a worker of its own,
the worker counts, pytest-benchmark's records shipped to the controller, and the item time
limit paused while a perf item waits. The whole of it runs in child pytest runs in
perf_tests/tests/test_perf_history.py."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
import threading
import time
import types

import pytest

from kernels.core import devices
from kernels.testing import isolation, perf_phase

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("kernelperf_root_conftest", ROOT / "conftest.py")
conftest = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(conftest)


# -- the lock ---------------------------------------------------------------------------------
# flock belongs to an open file description: two DeviceLocks on one path behave as two
# processes would, and a probe opening the file again is a third.

def _free_for(path, state: str) -> bool:
    """Whether another process could take the lock on `path` in `state` at once."""
    import fcntl

    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, (fcntl.LOCK_SH if state == "shared" else fcntl.LOCK_EX)
                        | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def test_shared_holders_hold_together_and_keep_an_exclusive_holder_out(tmp_path):
    path = tmp_path / "device.lock"
    first, second = perf_phase.DeviceLock(str(path)), perf_phase.DeviceLock(str(path))
    assert first.shared() >= 0 and second.shared() >= 0 and second.state == "shared"
    assert _free_for(path, "shared") and not _free_for(path, "exclusive")
    first.release()
    assert not _free_for(path, "exclusive")  # the second still holds it
    second.release()
    assert _free_for(path, "exclusive") and first.state is None


def test_an_exclusive_holder_waits_for_every_shared_one_and_then_excludes_all(tmp_path):
    path = tmp_path / "device.lock"
    workers = [perf_phase.DeviceLock(str(path)) for _ in range(2)]
    for worker in workers:
        worker.shared()
    perf = perf_phase.DeviceLock(str(path))
    perf.shared()
    waited = []
    taker = threading.Thread(target=lambda: waited.append(perf.exclusive()))
    taker.start()
    time.sleep(0.3)
    assert taker.is_alive()  # two others still hold it shared
    workers[0].release()
    time.sleep(0.2)
    assert taker.is_alive()
    workers[1].release()
    taker.join(timeout=10)
    assert perf.state == "exclusive" and waited[0] >= 0.4
    assert not _free_for(path, "shared")  # a worker starting now would wait
    perf.shared()  # back to shared after the perf items, as the worker plugin does
    assert _free_for(path, "shared") and not _free_for(path, "exclusive")
    perf.release()


def test_held_lets_go_when_the_body_raises(tmp_path):
    lock = perf_phase.DeviceLock(str(tmp_path / "device.lock"))
    with pytest.raises(RuntimeError, match="^a perf item failed$"):
        with lock.held("exclusive"):
            assert not _free_for(tmp_path / "device.lock", "shared")
            raise RuntimeError("a perf item failed")
    assert lock.state is None and _free_for(tmp_path / "device.lock", "exclusive")
    with pytest.raises(ValueError, match="state: expected 'shared' or 'exclusive', got 'both'"):
        with lock.held("both"):
            pass


def test_a_killed_holder_frees_the_lock(tmp_path):
    path = tmp_path / "device.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         f"handle = open({str(path)!r}, 'a'); fcntl.flock(handle, fcntl.LOCK_EX)\n"
         "print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not _free_for(path, "shared")
    finally:
        holder.kill()
        holder.wait(timeout=30)
    lock = perf_phase.DeviceLock(str(path))
    assert lock.exclusive() < 5.0 and lock.state == "exclusive"
    lock.release()


# -- which items take which lock --------------------------------------------------------------

def _item(nodeid: str, group: str | None):
    mark = types.SimpleNamespace(args=(group,)) if group else None
    return types.SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: mark
                                 if name == "xdist_group" else None)


PERF = _item("perf_tests/tests/test_performance.py::test_kernel_performance[a-fwd]",
             perf_phase.PERF_GROUP)
KERNEL = _item("correctness_tests/test_kernels.py::test_matches_reference[a-normal]",
               "softmax-f32-3x5")
OTHER = _item("correctness_tests/test_harness.py::test_something", None)


@pytest.fixture
def worker(tmp_path, monkeypatch):
    """The worker side of the plugin on a lock in tmp_path, with no isolation plugin."""
    config = types.SimpleNamespace(workeroutput={}, pluginmanager=types.SimpleNamespace(
        get_plugin=lambda name: None))
    plugin = perf_phase._Worker(config, str(tmp_path / "device.lock"))
    config.pluginmanager.get_plugin = lambda name: plugin if name == perf_phase._WORKER_NAME \
        else None
    plugin.pytest_sessionstart(None)
    yield plugin
    plugin.lock.release()


class ItemFailed(Exception):
    """What a failing item raises through the protocol wrapper (an assertion of the test
    itself is not caught)."""


def _run(plugin, item, nextitem, body=lambda: None):
    wrapper = plugin.pytest_runtest_protocol(item, nextitem)
    next(wrapper)
    try:
        body()
    except ItemFailed as error:  # what the item raised comes back through the wrapper
        with pytest.raises(ItemFailed):
            wrapper.throw(error)
        return
    with pytest.raises(StopIteration):
        wrapper.send(None)


def test_every_item_of_a_worker_runs_under_the_shared_lock(worker, tmp_path):
    path = tmp_path / "device.lock"
    for item in (KERNEL, OTHER):
        _run(worker, item, None, body=lambda: (
            assert_state(worker, "shared"), assert_other(path, shared=True, exclusive=False)))


def assert_state(plugin, state):
    assert plugin.lock.state == state


def assert_other(path, *, shared: bool, exclusive: bool):
    assert (_free_for(path, "shared"), _free_for(path, "exclusive")) == (shared, exclusive)


def test_a_perf_item_times_exclusive_and_gives_it_back_after_the_last(worker, tmp_path):
    path = tmp_path / "device.lock"
    request = types.SimpleNamespace(node=PERF, config=worker.config)

    def perf_body():
        assert perf_phase.take_device_alone(request.node, request.config) is True
        assert_state(worker, "exclusive")
        assert_other(path, shared=False, exclusive=False)

    _run(worker, PERF, PERF, perf_body)
    assert_state(worker, "exclusive")  # the next perf item keeps it: no one slips in between
    _run(worker, PERF, KERNEL, lambda: (perf_body(), _raise()))  # a failing item gives it back
    assert_state(worker, "shared")
    assert_other(path, shared=True, exclusive=False)
    assert worker.items == 2 and worker.held_s > 0
    worker.pytest_sessionfinish(None)
    assert worker.lock.state is None and _free_for(path, "exclusive")
    assert worker.config.workeroutput[perf_phase._OUTPUT_KEY]["items"] == 2


def _raise():
    raise ItemFailed("under its floor")


def test_only_perf_items_may_take_the_device_alone(worker):
    for item in (KERNEL, OTHER):
        request = types.SimpleNamespace(node=item, config=worker.config)
        with pytest.raises(RuntimeError, match="only perf items .* may take the device alone"):
            perf_phase.take_device_alone(request.node, request.config)
    assert worker.lock.state == "shared"


def test_without_the_lock_a_worker_is_not_alone_and_one_process_is(monkeypatch):
    config = types.SimpleNamespace(pluginmanager=types.SimpleNamespace(get_plugin=lambda n: None))
    request = types.SimpleNamespace(node=PERF, config=config)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    assert perf_phase.take_device_alone(request.node, request.config) is False
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    assert perf_phase.take_device_alone(request.node, request.config) is True


def test_a_perf_item_waits_without_the_item_time_limit(tmp_path, monkeypatch):
    """isolation.waiting: no limit while waiting, the whole limit again after it."""
    config = types.SimpleNamespace(getoption=lambda name, default=None: None)
    guard = isolation._Worker(config, None, None)
    config.pluginmanager = types.SimpleNamespace(
        get_plugin=lambda name: guard if name == "kernelperf-isolation-in-process" else None)
    guard.armed = isolation._Armed(time.monotonic() + 1.0, 1.0, "test", "a", "a", "a.py")
    try:
        with isolation.waiting(config):
            assert guard.armed is None
            time.sleep(0.2)
        assert guard.armed.limit == 1.0 and guard.armed.source == "test"
        assert guard.armed.deadline > time.monotonic() + 0.9
    finally:
        guard._disarm()
    with isolation.waiting(config):  # nothing armed: nothing to pause
        assert guard.armed is None


# -- which runs have a perf phase, and how many workers ---------------------------------------

@pytest.mark.parametrize("markexpr, perf", [
    ("", True), ("gpu", True), ("perf", True), ("gpu and perf", True), ("perf or small", True),
    ("cuda and not slow", True), ("gpu and not perf", False), ("not perf", False),
    ("small", False), ("multi_gpu", False)])
def test_runs_that_may_select_perf_items_get_a_worker_for_them(markexpr, perf):
    assert perf_phase.may_select_perf(markexpr) is perf
    assert perf_phase.extra_worker(markexpr) == (1 if perf else 0)
    config = types.SimpleNamespace(getoption=lambda name, default=None: markexpr
                                   if name == "markexpr" else default)
    wrapper = perf_phase.pytest_xdist_auto_num_workers(config)
    next(wrapper)
    with pytest.raises(StopIteration) as stopped:
        wrapper.send(2)  # xdist's -n auto on two CPUs
    assert stopped.value.value == (3 if perf else 2)


def test_the_controller_sets_up_the_phase_only_where_perf_items_may_run(monkeypatch):
    registered = {}
    for markexpr, workers, expected in [("gpu", 4, True), ("gpu and not perf", 4, False),
                                        ("gpu", 1, False), ("", 0, False)]:
        registered.clear()
        config = types.SimpleNamespace(
            option=types.SimpleNamespace(numprocesses=workers),
            getoption=lambda name, default=None, _m=markexpr: _m if name == "markexpr"
            else False if name == "collectonly" else default,
            pluginmanager=types.SimpleNamespace(hasplugin=lambda name: True,
                                                register=lambda p, name: registered.update(
                                                    {name: p})))
        monkeypatch.delenv(perf_phase.PERF_WORKER_VARIABLE, raising=False)
        perf_phase.pytest_configure(config)
        controller = registered.get(perf_phase._CONTROLLER_NAME)
        assert (controller is not None) is expected, (markexpr, workers)
        if controller:
            node = types.SimpleNamespace(workerinput={})
            controller.pytest_configure_node(node)
            assert node.workerinput[perf_phase._LOCK_KEY] == controller.path
            import os

            assert os.environ[perf_phase.PERF_WORKER_VARIABLE] == perf_phase.PERF_WORKER
            controller.pytest_unconfigure(config)
            assert perf_phase.PERF_WORKER_VARIABLE not in os.environ
            assert not pathlib.Path(controller.directory).exists()


# -- the scheduler ----------------------------------------------------------------------------

class _Node:
    """An xdist WorkerController as the scheduler uses it."""

    def __init__(self, name: str):
        self.gateway = types.SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True

    def __repr__(self):
        return self.gateway.id


def _scheduler(monkeypatch, nodes: int):
    pytest.importorskip("xdist")
    from correctness_tests import fakes

    monkeypatch.setattr(devices, "this_machine", lambda: fakes.cpu_machine(8))
    option = types.SimpleNamespace(numprocesses=nodes, dist="loadgroup", loadscopereorder=True,
                                   maxworkerrestart=None)
    config = types.SimpleNamespace(
        option=option, getoption=lambda name, default=None: ["popen"] * nodes if name == "tx"
        else default, pluginmanager=types.SimpleNamespace(get_plugin=lambda name: None))
    config.getvalue = config.getoption
    return conftest.pytest_xdist_make_scheduler(config, log=None)


PERF_IDS = [f"perf_tests/tests/test_performance.py::test_kernel_performance[{i}]" for i in
            ("softmax-pallas-f32-64x1000-fwd", "softmax-pallas-f32-64x1000-bwd",
             "softmax-triton-f32-64x1000-fwd")]
KERNEL_IDS = [f"correctness_tests/test_kernels.py::test_matches_reference[softmax-{impl}-{case}"
              f"-normal]" for impl in ("pallas", "xla") for case in ("f32-3x5", "f32-37x128")]
OTHER_IDS = [f"correctness_tests/test_harness.py::test_{n}" for n in range(4)]


def _schedule(scheduler, names, collection=(*KERNEL_IDS, *OTHER_IDS, *PERF_IDS)):
    collection = list(collection)
    nodes = [_Node(name) for name in names]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return {node.gateway.id: (node, [collection[i] for i in node.sent]) for node in nodes}


def test_the_perf_group_goes_first_and_whole_to_a_worker_of_its_own(monkeypatch):
    scheduler = _scheduler(monkeypatch, 3)
    assert {scheduler._split_scope(nodeid) for nodeid in PERF_IDS} == {perf_phase.PERF_GROUP}
    # The perf worker joined last: it still gets the group, and nothing else.
    sent = _schedule(scheduler, ["gw1", "gw2", perf_phase.PERF_WORKER])
    perf_node, perf_items = sent[perf_phase.PERF_WORKER]
    assert perf_items == PERF_IDS and perf_node.shutting_down
    others = [nodeid for name in ("gw1", "gw2") for nodeid in sent[name][1]]
    assert not set(others) & set(PERF_IDS) and others
    # As the others finish items they get the rest; the perf worker never does.
    for name in ("gw1", "gw2"):
        node = sent[name][0]
        for index in list(node.sent):
            scheduler.mark_test_complete(node, index)
    assert sent[perf_phase.PERF_WORKER][0].sent == [
        [*KERNEL_IDS, *OTHER_IDS, *PERF_IDS].index(n) for n in PERF_IDS]
    assert not scheduler.workqueue


def test_a_run_of_perf_items_alone_keeps_them_on_the_perf_worker(monkeypatch):
    # One unit for two workers: xdist shuts the last one to join down unused.
    sent = _schedule(_scheduler(monkeypatch, 2), ["gw1", perf_phase.PERF_WORKER],
                     collection=PERF_IDS)
    assert sent[perf_phase.PERF_WORKER][1] == PERF_IDS and sent["gw1"][1] == []


def test_with_one_worker_the_perf_group_is_work_like_any_other(monkeypatch):
    scheduler = _scheduler(monkeypatch, 1)
    (node, _), = _schedule(scheduler, [perf_phase.PERF_WORKER]).values()
    collection = [*KERNEL_IDS, *OTHER_IDS, *PERF_IDS]
    done = 0
    while done < len(node.sent):  # the worker runs what it is sent, asking for more
        scheduler.mark_test_complete(node, node.sent[done])
        done += 1
    assert sorted(collection[i] for i in node.sent) == sorted(collection)
    assert not scheduler.workqueue and node.shutting_down


# -- pytest-benchmark's records, worker to controller -----------------------------------------

def test_a_shipped_record_is_the_same_record_in_the_controller():
    pytest.importorskip("pytest_benchmark")
    from pytest_benchmark.stats import Metadata
    from pytest_benchmark.utils import SecondsDecimal, safe_dumps

    record = {"name": "test_kernel_performance[a-fwd]", "group": "softmax a fwd",
              "fullname": "perf_tests/tests/test_performance.py::test_kernel_performance[a-fwd]",
              "param": "a-fwd", "params": {"perf_id": "a-fwd"},
              "extra_info": {"clock_method": "cupti", "gbps": 3000.0}}
    original = Metadata(perf_phase._Shipped(record), 1,
                        {"timer": "device_time", "min_time": SecondsDecimal("0.000005")})
    for sample in (2.5e-4, 2.6e-4, 2.4e-4, 3.0e-4):
        original.stats.update(sample)
    shipped = json.loads(safe_dumps([original.as_dict(include_data=True)]))
    again = perf_phase._as_metadata(shipped[0])
    assert again.as_dict(include_data=True) == json.loads(safe_dumps(
        original.as_dict(include_data=True)))
    assert again.stats.median == original.stats.median and not again.has_error
    assert again.fullname == record["fullname"] and bool(again)


def _with_options(session, **options):
    """A pytest config holding pytest-benchmark's `session`, its getoption over `options`."""
    return types.SimpleNamespace(_benchmarksession=session,
                                 getoption=lambda name, default=None: options.get(name, default))


# pytest-benchmark 5.3 (this machine's) says in `xdist_warning` that xdist turned it off; 5.2.3
# (the GPU machine's) has no such attribute and only sets `disabled` (its first GPU run of
# `pytest -m gpu` with perf items broke on the attribute in every worker).
@pytest.mark.parametrize("version", ["5.3", "5.2"])
def test_a_worker_records_again_where_only_xdist_turned_benchmarks_off(version):
    def session(disabled, skip=False, warned=None):
        fields = {"disabled": disabled, "skip": skip, "save": "s", "autosave": True,
                  "json": "j", "compare_fail": ["min:5%"], "quiet": False}
        if version == "5.3":
            fields["xdist_warning"] = warned if warned is not None else disabled and not skip
        return types.SimpleNamespace(**fields)

    off_by_xdist = session(disabled=True)
    perf_phase._record_here(_with_options(off_by_xdist))
    assert not off_by_xdist.disabled and off_by_xdist.quiet
    assert off_by_xdist.save is off_by_xdist.json is off_by_xdist.compare_fail is None
    # --benchmark-disable, --benchmark-skip: the user's choice stands (5.2 sets `disabled` for
    # either, as xdist does)
    for options in ({"benchmark_disable": True}, {"benchmark_skip": True}):
        skip = options.get("benchmark_skip", False)
        kept = session(disabled=version == "5.2" or not skip, skip=skip, warned=False)
        before = dict(vars(kept))
        perf_phase._record_here(_with_options(kept, **options))
        assert vars(kept) == before, (version, options)


def test_the_phase_line_names_the_serial_share_and_the_wait():
    line = perf_phase.describe_phase({"worker": "gw0", "items": 90, "held_s": 104.26,
                                      "waited_s": 180.0, "warm_s": 150.5, "warmed": 185})
    assert line == ("kernelperf: perf phase: 90 perf items on gw0 held the device alone for "
                    "104.3 s, after waiting 180.0 s for the other workers to finish; meanwhile "
                    "it warmed up 185 measurements in 150.5 s")


def test_on_a_shared_gpu_only_the_perf_worker_allocates_and_keeps_autotune_choices_alone():
    """conftest.py at import in an xdist worker on a GPU machine (faked): the platform
    allocator for every worker but the perf worker, which allocates as one process does; and
    only the perf worker keeps the Triton matmul's autotune choices on disk, for its choice
    alone is timed on an idle GPU (a choice the checks time beside 8 workers ran the perf item
    at 0.84x XLA where 0.90x was measured)."""
    script = f"""
import importlib, importlib.util, os, sys
sys.path.insert(0, {str(ROOT)!r})
from kernels.core import environment
environment.nvidia_gpu_present = lambda: True
os.environ["TRITON_INTERPRET"] = "0"  # the interpreter never keeps a choice
os.environ.update(PYTEST_XDIST_WORKER=sys.argv[1], PYTEST_XDIST_WORKER_COUNT="9",
                  {perf_phase.PERF_WORKER_VARIABLE}="gw0")
spec = importlib.util.spec_from_file_location("conftest", {str(ROOT / "conftest.py")!r})
spec.loader.exec_module(sys.modules.setdefault("conftest", importlib.util.module_from_spec(spec)))
matmul = importlib.import_module("kernels.ops.matmul.triton")
print(os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR"), matmul.matmul_kernel.cache_results)
"""
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith(("PYTEST_XDIST", "XLA_PYTHON_CLIENT", "TRITON_INTERPRET"))}
    found = {}
    for worker in ("gw0", "gw3"):  # a process each: the module registers its kernel once
        done = subprocess.run([sys.executable, "-c", script, worker], capture_output=True,
                              text=True, timeout=300, env=env, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        found[worker] = done.stdout.strip()
    assert found == {"gw0": "None True", "gw3": "platform False"}, found
