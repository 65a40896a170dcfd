"""Fault containment (kernels/testing/isolation.py): a kernel that crashes, hangs or leaves a
sticky device error fails its own items only, under xdist workers; its parts one by one, then
child pytest runs over an operation with faulty stand-ins registered beside the real
implementations (kernels/testing/faults.py's --plant-fault)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from correctness_tests import fakes
from kernels.core import registry, validation
from kernels.testing import drill, faults, isolation

ROOT = pathlib.Path(__file__).resolve().parent.parent
OP = "mlp"  # the operation with the fewest kernel items: a child run over it takes ~20 s


def _cpu_cases(op: str) -> list[str]:
    return [case.id for case in registry.operation(op).cases_tagged("cpu")]


# -- sticky errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
     "asynchronously reported", "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("INTERNAL: Failed to synchronize: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access",
     "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("Triton Error [CUDA]: unspecified launch failure", "CUDA_ERROR_LAUNCH_FAILED"),
    ("cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS"),
    ("RuntimeError: CUDA error: device-side assert triggered", "CUDA_ERROR_ASSERT"),
    ("CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
])
def test_sticky_errors_are_named_by_their_driver_code(text, expected):
    found = isolation.sticky_error(text)
    assert found is not None and found.startswith(f"{expected}: ")


@pytest.mark.parametrize("text", [
    "CUDA out of memory. Tried to allocate 2.00 GiB",  # the context stays usable
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4096 bytes",
    "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    "CUDA error: invalid argument",
    "assert 0.5 < 0.1",
])
def test_errors_that_leave_the_context_usable_are_not_sticky(text):
    assert isolation.sticky_error(text) is None


def _raised_from(outer: Exception, inner: Exception) -> Exception:
    """`outer` raised from `inner` inside `except inner`: inner is its cause and its context."""
    try:
        try:
            raise inner
        except type(inner) as caught:
            raise outer from caught
    except type(outer) as raised:
        return raised


def test_a_sticky_error_is_found_through_causes_and_groups():
    chained = _raised_from(ValueError("comparison failed"),
                           RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert isolation.sticky_in_exception(chained).startswith("CUDA_ERROR_ILLEGAL_ADDRESS")
    group = ExceptionGroup("two", [ValueError("x"), RuntimeError("misaligned address")])
    assert isolation.sticky_in_exception(group).startswith("CUDA_ERROR_MISALIGNED_ADDRESS")
    assert isolation.sticky_in_exception(ValueError("plain")) is None


@pytest.mark.parametrize("position", [0, 1, 2])
def test_a_sticky_error_is_found_in_any_member_of_a_group(position):
    members = [ValueError("x"), KeyError("y"), TypeError("z")]
    members[position] = RuntimeError("CUDA error: misaligned address")
    group = ExceptionGroup("three", members)
    assert isolation.sticky_in_exception(group).startswith("CUDA_ERROR_MISALIGNED_ADDRESS")


def test_an_exceptions_chain_holds_each_exception_once_even_when_it_is_cause_and_context():
    """`raise ... from inner` inside `except inner`: inner is both the cause and the context;
    a group may hold one exception twice."""
    chained = _raised_from(ValueError("outer"), RuntimeError("inner"))
    assert [str(e) for e in isolation._chain(chained)] == ["outer", "inner"]
    twice = KeyError("twice")
    group = ExceptionGroup("g", [twice, twice])
    assert sorted(map(repr, isolation._chain(group))) == sorted(map(repr, (group, twice)))


def test_an_exceptions_chain_ends_when_its_contexts_form_a_cycle():
    """Each exception the other's context (code that re-raises a saved exception can make
    such a loop): the chain is walked in a thread, so one that never ends fails here in a
    second, not at the run's time limit."""
    import threading

    first, second = RuntimeError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first
    walked: list = []
    walker = threading.Thread(target=lambda: walked.extend(isolation._chain(first)), daemon=True)
    walker.start()
    walker.join(timeout=1.0)
    assert not walker.is_alive() and walked == [first, second]


def test_a_sticky_error_named_only_by_the_exceptions_type_is_found():
    named = type("cudaErrorLaunchFailure", (RuntimeError,), {})
    assert isolation.sticky_in_exception(named()) == \
        "CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"


def test_the_device_check_names_a_sticky_error_by_its_code_else_gives_the_probes_own_words(
        monkeypatch):
    answers = {"healthy": None, "sticky": "RuntimeError: CUDA error: an illegal memory access "
               "was encountered", "other": "stand-in poisoned"}
    asked = []

    def health(*names):
        # Undone before the call ends: this run's own device check after it asks the probes.
        with monkeypatch.context() as patch:
            patch.setattr(isolation, "_PROBES", [
                lambda name=name: asked.append(name) or answers[name] for name in names])
            return isolation.device_health()

    assert health("healthy") is None
    assert health("healthy", "sticky", "other") == \
        "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"
    assert health("other", "sticky") == "stand-in poisoned"  # the first unhealthy probe's
    assert asked == ["healthy", "healthy", "sticky", "other"]


def test_the_device_check_starts_no_backend_and_costs_microseconds_on_a_cpu():
    """With torch and JAX imported but not started (as in a CPU test run), the check looks at
    their bookkeeping only: no backend comes up, and a call costs microseconds."""
    probe = textwrap.dedent("""
        import time
        import jax, torch
        from jax._src import xla_bridge
        from kernels.testing import isolation
        start = time.perf_counter()
        for _ in range(10000):
            assert isolation.device_health() is None
        per_call = (time.perf_counter() - start) / 10000
        print(per_call, dict(xla_bridge._backends), torch.cuda.is_initialized())
    """)
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    per_call, backends, torch_started = done.stdout.split(maxsplit=2)
    assert (backends, torch_started.strip()) == ("{}", "False")
    assert float(per_call) < 50e-6


# -- limits ---------------------------------------------------------------------------------------

def _item(kernel_item=None, mark_seconds=None):
    marks = {} if mark_seconds is None else {
        isolation.LIMIT_MARK: types.SimpleNamespace(args=(mark_seconds,))}
    params = {} if kernel_item is None else {"kernel_item": kernel_item}
    return types.SimpleNamespace(get_closest_marker=marks.get, name="test_x",
                                 callspec=types.SimpleNamespace(params=params))


def test_a_kernel_items_limit_grows_with_its_case_and_a_mark_or_the_option_wins():
    op = registry.operation("softmax")
    impl = registry.implementation("softmax", "xla")
    small, large = op.case("f32-37x128"), op.case("f32-32768x4096")

    def limit(case, **kwargs):
        item = _item(types.SimpleNamespace(impl=impl, case=case, distribution="normal"),
                     kwargs.pop("mark", None))
        return isolation.item_limit(item, kwargs.pop("fixed", None), kwargs.pop("on_gpu"))

    gpu_small, gpu_large = limit(small, on_gpu=True)[0], limit(large, on_gpu=True)[0]
    assert gpu_small == pytest.approx(isolation.GPU_LIMITS.kernel_s, rel=1e-3)
    assert gpu_large > gpu_small + isolation.GPU_LIMITS.per_gib_s  # a GiB or more
    assert limit(small, on_gpu=False) == (isolation.CPU_LIMITS.kernel_s,
                                          "the limit for this case's size")
    assert limit(large, on_gpu=True, fixed=7.0) == (7.0, "--item-limit")
    assert limit(large, on_gpu=True, fixed=7.0, mark=3) == (3.0, "its item_limit mark")
    assert isolation.item_limit(_item(), None, False) == (isolation.CPU_LIMITS.other_s,
                                                           "the default limit")


def test_a_kernel_items_limit_grows_by_the_per_gib_seconds_for_each_gib_its_case_may_hold(
        monkeypatch):
    from kernels.testing import scheduling

    held = {"f32-37x128": 3 * 2**30, "f32-32768x4096": 2**29}
    monkeypatch.setattr(scheduling, "estimated_bytes", lambda op, case: held[case.id])
    op = registry.operation("softmax")
    limits = isolation.Limits(kernel_s=7.25, per_gib_s=4.0, other_s=1.0)  # a key no run made
    assert limits.for_case(op, op.case("f32-37x128")) == 7.25 + 3 * 4.0
    assert limits.for_case(op, op.case("f32-32768x4096")) == 7.25 + 0.5 * 4.0


@pytest.mark.parametrize("kernel_s,per_gib_s,other_s,ok", [
    (1, 0, 1, True), (0, 1, 1, False), (1, -1, 1, False), (1, 1, 0, False), (-1, 1, 1, False),
    (1, 1, -1, False),
])
def test_bad_limits_are_refused(kernel_s, per_gib_s, other_s, ok):
    """A kernel item and any other item need a positive limit; the per-GiB part may be 0."""
    if ok:
        isolation.Limits(kernel_s=kernel_s, per_gib_s=per_gib_s, other_s=other_s)
        return
    with pytest.raises(ValueError, match=r"kernel_s, per_gib_s, other_s: expected > 0, >= 0, > 0, "
                       rf"got {kernel_s}, {per_gib_s}, {other_s}"):
        isolation.Limits(kernel_s=kernel_s, per_gib_s=per_gib_s, other_s=other_s)


@pytest.mark.parametrize("text,seconds", [("0", 0.0), ("2.5", 2.5), ("30", 30.0)])
def test_item_limit_option_reads_seconds(text, seconds):
    assert isolation._seconds(text) == seconds


@pytest.mark.parametrize("text", ["-1", "-0.5", "inf", "nan", "soon", ""])
def test_item_limit_option_refuses_what_is_not_a_finite_duration(text):
    with pytest.raises(pytest.UsageError) as refused:
        isolation._seconds(text)
    assert str(refused.value) == f"--item-limit: expected seconds >= 0, got {text!r}"


def test_a_kernel_item_a_bad_input_item_and_a_gpu_marked_test_are_device_items():
    kernel = _item(types.SimpleNamespace())
    bad_input = types.SimpleNamespace(get_closest_marker={}.get, callspec=types.SimpleNamespace(
        params={"bad_input_item": (types.SimpleNamespace(id="softmax-xla"),
                                   types.SimpleNamespace(label="a NaN"))}))
    gpu = types.SimpleNamespace(get_closest_marker={"gpu": object()}.get)
    plain = types.SimpleNamespace(get_closest_marker={}.get, name="test_plain")
    assert [isolation.is_device_item(i) for i in (kernel, bad_input, gpu, plain)] == \
        [True, True, True, False]
    assert isolation.describe_item(bad_input) == "softmax-xla given a NaN"
    assert isolation.describe_item(plain) == "test_plain"


def test_a_kernel_item_is_described_as_the_controller_labels_its_node_id(tmp_path):
    """The worker's words for an item and the controller's for the same node id (a dead
    worker's item, never collected there) agree: the implementation, case and inputs."""
    impl = registry.implementation("softmax", "xla")
    case = registry.operation("softmax").case("f32-37x128")
    item = _item(types.SimpleNamespace(impl=impl, case=case, distribution="large"))
    nodeid = f"correctness_tests/test_kernels.py::test_matches_reference[{impl.id}-{case.id}-large]"
    assert isolation.describe_item(item) == _controller(tmp_path).label(nodeid) == \
        "softmax-xla f32-37x128 (large inputs)"


def test_an_errors_one_line_is_its_first_line_with_its_type_cut_at_300_characters():
    assert isolation._one_line(RuntimeError("\n\n  first line  \nsecond")) == \
        "RuntimeError: \n\n  first line".splitlines()[0].strip()
    assert isolation._one_line(ValueError("x" * 400)) == ("ValueError: " + "x" * 400)[:300]
    assert isolation._one_line(KeyError()) == "KeyError:"


def test_where_names_the_tests_frame_and_the_innermost_one():
    """The stack of a hang, as a watchdog reads it: this test's line, then the innermost."""
    here = os.path.abspath(__file__)
    namespace = {"sys": sys, "isolation": isolation, "caught": {}}
    # The innermost frame in another file (a kernel module), called from this test; read while
    # the call is in progress, as the watchdog thread reads it.
    exec(compile("def inner(test_file):\n"
                 "    caught[test_file] = isolation._where(sys._getframe(), test_file)\n",
                 "/x/kernel_mod.py", "exec"), namespace)
    line = sys._getframe().f_lineno + 1
    namespace["inner"](here)
    namespace["inner"]("/elsewhere/test_other.py")
    assert namespace["caught"] == {
        here: f"test_isolation.py:{line} test_where_names_the_tests_frame_and_the_innermost_one "
              "-> kernel_mod.py:2 inner",
        # No frame of the test file on the stack: the innermost alone.
        "/elsewhere/test_other.py": "kernel_mod.py:2 inner"}
    # The innermost frame is the test's own: it alone.
    own = sys._getframe()
    line, where = own.f_lineno, isolation._where(own, here)  # one line: one f_lineno
    assert where == \
        f"test_isolation.py:{line} test_where_names_the_tests_frame_and_the_innermost_one"


# -- the controller's one line from a dead worker's fault record ----------------------------------

def _controller(tmp_path, plugins: dict | None = None) -> isolation._Controller:
    """The controller-side plugin as pytest_configure leaves it, its records in `tmp_path`,
    `plugins` what its plugin manager holds (xdist's dsession, the scheduler's lookups)."""
    controller = isolation._Controller.__new__(isolation._Controller)
    lookup = {} if plugins is None else plugins
    config = types.SimpleNamespace(pluginmanager=types.SimpleNamespace(get_plugin=lookup.get),
                                   option=types.SimpleNamespace(loadscopereorder=False))
    controller.__dict__.update(config=config, directory=str(tmp_path), started=set(),
                               finished=set(), requeued={}, contained=[], between=[],
                               user_restarts=True, _labels=None)
    return controller


def test_a_fatal_signal_record_becomes_one_line_with_the_test_and_the_innermost_frame(tmp_path):
    controller = _controller(tmp_path)
    (tmp_path / "fault-gw3.txt").write_text(textwrap.dedent("""\
        Fatal Python error: Aborted

        Thread 0x00007f (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 324 in wait

        Current thread 0x00007e (most recent call first):
          File "/repo/kernels/ops/softmax/xla.py", line 40 in planted
          File "/repo/kernels/core/checking.py", line 200 in check
          File "/repo/correctness_tests/test_kernels.py", line 26 in test_matches_reference
          File "/venv/_pytest/runner.py", line 170 in pytest_runtest_call
        """))
    line = controller._fault_record("gw3", "correctness_tests/test_kernels.py::test_x[a]")
    assert line == ("Fatal Python error: Aborted at test_kernels.py:26 test_matches_reference "
                    "-> xla.py:40 planted")
    (tmp_path / "fault-gw4.txt").write_text(textwrap.dedent("""\
        Timeout (0:00:13)!
        Thread 0x00007f (most recent call first):
          File "/usr/lib/python3.11/re/__init__.py", line 166 in match
          File "/repo/correctness_tests/test_kernels.py", line 26 in test_matches_reference
          File "/venv/_pytest/runner.py", line 170 in pytest_runtest_call
        """))
    line = controller._fault_record("gw4", "correctness_tests/test_kernels.py::test_x[a]")
    assert line.startswith("no result after 0:00:13 with the GIL held")
    assert line.endswith("at test_kernels.py:26 test_matches_reference -> __init__.py:166 match")


_RUNNER = '  File "/venv/_pytest/runner.py", line 170 in pytest_runtest_call\n'
_TEST = '  File "/repo/correctness_tests/test_kernels.py", line 26 in test_matches_reference\n'
_NODE = "correctness_tests/test_kernels.py::test_matches_reference[a]"


def _thread(header: str, *frames: str) -> str:
    return f"{header} 0x00007e (most recent call first):\n" + "".join(frames)


@pytest.mark.parametrize("current_first", [True, False])
def test_a_fatal_signal_is_placed_in_the_thread_that_faulted_whatever_the_threads_order(
        tmp_path, current_first):
    """A crash in a thread the test started: the faulting ('Current') thread is named, not
    the main thread that waits inside pytest's runner."""
    current = _thread("Current thread",
                      '  File "/repo/kernels/ops/softmax/pool.py", line 9 in work\n',
                      '  File "/usr/lib/python3.11/threading.py", line 975 in run\n')
    main = _thread("Thread", '  File "/usr/lib/python3.11/threading.py", line 324 in wait\n',
                   _TEST, _RUNNER)
    threads = [current, main] if current_first else [main, current]
    (tmp_path / "fault-gw1.txt").write_text("Fatal Python error: Segmentation fault\n\n"
                                            + "\n".join(threads))
    assert _controller(tmp_path)._fault_record("gw1", _NODE) == \
        "Fatal Python error: Segmentation fault at pool.py:9 work"


@pytest.mark.parametrize("runner_first", [True, False])
def test_a_watchdog_record_is_placed_in_the_thread_inside_pytests_runner_whatever_the_order(
        tmp_path, runner_first):
    main = _thread("Thread", '  File "/repo/kernels/k.py", line 5 in spin\n', _TEST, _RUNNER)
    other = _thread("Thread", '  File "/usr/lib/python3.11/threading.py", line 324 in wait\n')
    threads = [main, other] if runner_first else [other, main]
    (tmp_path / "fault-gw1.txt").write_text("Timeout (0:00:09)!\n" + "\n".join(threads))
    assert _controller(tmp_path)._fault_record("gw1", _NODE) == (
        "no result after 0:00:09 with the GIL held, ended by faulthandler's watchdog at "
        "test_kernels.py:26 test_matches_reference -> k.py:5 spin")


def test_a_watchdog_record_with_no_thread_in_pytests_runner_names_the_last_thread(tmp_path):
    (tmp_path / "fault-gw1.txt").write_text("Timeout (0:00:09)!\n" + "\n".join([
        _thread("Thread", '  File "/repo/a.py", line 1 in first\n'),
        _thread("Thread", '  File "/repo/b.py", line 2 in last\n')]))
    assert _controller(tmp_path)._fault_record("gw1", _NODE).endswith(" at b.py:2 last")


@pytest.mark.parametrize("frames, where", [
    ("", ""),  # no Python frame on the faulting thread
    ('  File "/repo/kernels/k.py", line 5 in kernel\n', " at k.py:5 kernel"),  # no test frame
    (_TEST, " at test_kernels.py:26 test_matches_reference"),  # it faulted in the test itself
    ('  File "/repo/kernels/k.py", line 5 in kernel\n' + _TEST,
     " at test_kernels.py:26 test_matches_reference -> k.py:5 kernel"),
])
def test_a_fault_records_line_names_the_test_and_the_innermost_frame_only_where_they_are(
        tmp_path, frames, where):
    (tmp_path / "fault-gw1.txt").write_text(
        "Fatal Python error: Aborted\n\n" + _thread("Current thread", frames))
    assert _controller(tmp_path)._fault_record("gw1", _NODE) == \
        f"Fatal Python error: Aborted{where}"


def test_a_record_without_a_fatal_error_line_is_named_by_its_first_line_less_its_colon(
        tmp_path):
    """A bare traceback dump (faulthandler.dump_traceback), no 'Fatal Python error' first."""
    (tmp_path / "fault-gw1.txt").write_text(_thread("Current thread", _TEST))
    assert _controller(tmp_path)._fault_record("gw1", _NODE) == (
        "Current thread 0x00007e (most recent call first) at test_kernels.py:26 "
        "test_matches_reference")
    (tmp_path / "fault-gw2.txt").write_text("\n \n")  # made, nothing written
    assert _controller(tmp_path)._fault_record("gw2", _NODE) is None
    assert _controller(tmp_path)._fault_record("gw3", _NODE) is None  # never made


# -- the scheduler fixes --------------------------------------------------------------------------

class _Node:
    def __init__(self, name: str):
        self.gateway = types.SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices):
        self.sent.append(list(indices))

    def shutdown(self):
        self.shutting_down = True

    def __repr__(self):
        return self.gateway.id


def _scheduler(tmp_path, isolating: bool = True):
    """A loadgroup scheduler with the project's fixes, one item per group (as kernel items of
    a case under -k can be), and a controller registered where it looks for one."""
    from xdist.scheduler import LoadGroupScheduling

    class Scheduling(isolation.ReplacementFixes, LoadGroupScheduling):
        def _split_scope(self, nodeid):
            return nodeid

    plugins: dict = {}
    controller = _controller(tmp_path, plugins)
    if isolating:
        plugins["kernelperf-isolation-controller"] = controller
    sched = Scheduling.__new__(Scheduling)
    sched.__dict__.update(numnodes=2, collection=None, workqueue={}, assigned_work={},
                          registered_collections={}, config=controller.config,
                          log=lambda *a: None)
    from collections import OrderedDict

    sched.workqueue = OrderedDict()
    return sched, controller


def _start(sched, items, nodes):
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, items)
    sched.schedule()


def test_a_crashed_item_fails_once_and_what_never_started_is_requeued(tmp_path):
    items = [f"t.py::test[{i}]" for i in range(8)]
    sched, controller = _scheduler(tmp_path)
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    _start(sched, items, [gw0, gw1])
    first, second = sched.assigned_work[gw0]  # two one-item units each
    controller.started.add(first)  # gw0 dies inside its first item
    crashed = sched.remove_node(gw0)
    assert crashed == first
    queued = [nodeid for unit in sched.workqueue.values() for nodeid in unit]
    assigned = [nodeid for unit in sched.assigned_work[gw1].values() for nodeid, done
                in unit.items() if not done]
    assert first not in queued + assigned  # xdist ran it again on every replacement
    assert second in queued + assigned


def test_a_retired_workers_finished_item_is_not_blamed(tmp_path):
    items = [f"t.py::test[{i}]" for i in range(4)]
    sched, controller = _scheduler(tmp_path)
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    _start(sched, items, [gw0, gw1])
    first, second = sched.assigned_work[gw0]
    controller.started.add(first)
    controller.finished.add(first)  # reported, then the worker retired before the next
    isolation._write_json(os.path.join(str(tmp_path), f"reason-{isolation._key(second)}.json"),
                          {"kind": "retired", "message": "x faulted (CUDA_ERROR_...)"})
    assert sched.remove_node(gw0) is None
    assert controller.contained == ["x faulted (CUDA_ERROR_...)"]
    # A unit with nothing left is not requeued: it would go out as an empty batch, on which
    # the worker that takes it waits for ever.
    assert all(not all(unit.values()) for unit in sched.workqueue.values())
    left = [n for unit in [*sched.workqueue.values(), *sched.assigned_work[gw1].values()]
            for n, done in unit.items() if not done]
    assert first not in left and second in left


def test_a_joining_worker_gets_no_work_before_its_collection_then_two_items(tmp_path):
    items = [f"t.py::test[{i}]" for i in range(10)]
    sched, controller = _scheduler(tmp_path)
    gw0, gw1, gw2 = _Node("gw0"), _Node("gw1"), _Node("gw2")
    _start(sched, items, [gw0, gw1])
    sched.add_node(gw2)  # a replacement, at workerready: no collection yet
    controller.started.add(next(iter(sched.assigned_work[gw0])))
    sched.remove_node(gw0)  # reschedules every node, gw2 included: no KeyError, nothing lost
    assert sched.assigned_work[gw2] == {}
    sched.add_node_collection(gw2, items)
    sched.schedule()
    pending = sum(not done for unit in sched.assigned_work[gw2].values() for done in unit.values())
    assert pending == 2  # one would leave it waiting for the next index (xdist remote.py)


def test_without_isolation_the_scheduler_is_xdists_own(tmp_path):
    items = [f"t.py::test[{i}]" for i in range(4)]
    sched, _ = _scheduler(tmp_path, isolating=False)
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    _start(sched, items, [gw0, gw1])
    first = next(iter(sched.assigned_work[gw0]))
    assert sched.remove_node(gw0) == first
    assert first in sched.workqueue  # xdist's behaviour: the crashed item runs again


def test_a_worker_that_died_between_items_is_recorded_and_its_queue_goes_to_a_live_worker(
        tmp_path):
    items = [f"t.py::test[{i}]" for i in range(6)]
    sched, controller = _scheduler(tmp_path)
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    _start(sched, items, [gw0, gw1])
    lost = [nodeid for unit in sched.assigned_work[gw0].values() for nodeid in unit]
    for unit in sched.assigned_work[gw1].values():  # gw1 is through its own
        unit.update(dict.fromkeys(unit, True))
    sent = len(gw1.sent)
    assert sched.remove_node(gw0) is None  # nothing of it had started
    assert controller.between == [
        f"worker gw0 died between items (no Python fault record; exit status unknown); its "
        f"queue, from {lost[0]}, was requeued"]
    assert gw1.sent[sent:]  # the idle worker is given work at once, not at its next report
    pending = {nodeid for unit in [*sched.workqueue.values(), *sched.assigned_work[gw1].values()]
               for nodeid, done in unit.items() if not done}
    assert set(lost) <= pending


def test_without_isolation_a_joining_worker_gets_what_xdist_gives_it(tmp_path):
    """xdist's loadscope gives a replacement one unit (with one-item units, the stall the
    isolating scheduler's top-up mends); without isolation that stays xdist's."""
    items = [f"t.py::test[{i}]" for i in range(10)]
    sched, _ = _scheduler(tmp_path, isolating=False)
    gw0, gw1, gw2 = _Node("gw0"), _Node("gw1"), _Node("gw2")
    _start(sched, items, [gw0, gw1])
    sched.add_node(gw2)
    sched.add_node_collection(gw2, items)
    sched.schedule()
    assert sum(not done for unit in sched.assigned_work[gw2].values()
               for done in unit.values()) == 1


def test_a_contained_fault_is_counted_without_xdists_session_or_its_restart_budget(tmp_path):
    controller = _controller(tmp_path)
    controller.user_restarts = False
    controller._contained("one")  # no dsession plugin (-p no:xdist)
    controller.config.pluginmanager.get_plugin = {"dsession": object()}.get
    controller._contained("two")  # a dsession without the budget (another xdist version)
    assert controller.contained == ["one", "two"]


def test_a_contained_fault_costs_no_restart_of_xdists_budget_unless_the_user_set_it(tmp_path):
    sched, controller = _scheduler(tmp_path)
    dsession = types.SimpleNamespace(_max_worker_restart=4)
    controller.config.pluginmanager.get_plugin = {"dsession": dsession}.get
    controller.user_restarts = False
    controller._contained("one")
    assert dsession._max_worker_restart == 5 and controller.contained == ["one"]
    controller.user_restarts = True  # --max-worker-restart given: the user's number holds
    controller._contained("two")
    assert dsession._max_worker_restart == 5


def test_under_xdists_load_scheduler_an_item_that_never_started_is_requeued(tmp_path):
    """--dist load: xdist blames the first pending item, which never started when the worker
    retired before it; it is handed back (shown as a rerun), not failed."""
    _, controller = _scheduler(tmp_path)
    pending = []
    sched = types.SimpleNamespace(mark_test_pending=pending.append)
    def report():
        return types.SimpleNamespace(node=_Node("gw0"), outcome="failed", when="???",
                                     longrepr="worker 'gw0' crashed while running ...",
                                     location=("t.py", None, "t.py"))

    isolation._write_json(os.path.join(str(tmp_path), f"reason-{isolation._key('t.py::b')}.json"),
                          {"kind": "retired", "message": "t.py::a faulted"})
    retired = report()
    controller.pytest_handlecrashitem("t.py::b", retired, sched)
    assert pending == ["t.py::b"] and retired.outcome == "rerun"
    controller.started.add("t.py::c")  # it died inside this one: failed, with its line
    crashed = report()
    controller.pytest_handlecrashitem("t.py::c", crashed, sched)
    assert pending == ["t.py::b"] and crashed.outcome == "failed" and crashed.when == "call"
    assert crashed.longrepr.startswith("crash in c: no Python fault record (worker gw0 ")
    assert crashed.location == ("t.py", None, "c")


# -- the stand-ins ------------------------------------------------------------------------------

def test_the_sticky_stand_in_fails_every_implementation_of_its_operation_after_it(monkeypatch):
    registry.load()  # the planted source reads the registry's table: filled, however run alone
    saved = dict(registry._IMPLEMENTATIONS)
    monkeypatch.setattr(registry, "register_implementation", registry.register_implementation)
    try:
        namespace = {"registry": registry}
        exec(faults.plant_source("sticky", "softmax", "xla", register_as="fault_sticky"),
             namespace)
        x = np.ones((2, 3), np.float32)
        assert registry.implementation("softmax", "xla").fn(x) is not None  # not yet
        with pytest.raises(RuntimeError, match="an illegal memory access"):
            registry.implementation("softmax", "fault_sticky").fn(x)
        with pytest.raises(RuntimeError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
            registry.implementation("softmax", "xla").fn(x)
        assert registry.implementation("row_sum", "xla").fn(x) is not None  # other operations
    finally:
        registry._IMPLEMENTATIONS.clear()
        registry._IMPLEMENTATIONS.update(saved)


def test_unknown_faults_and_cases_are_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"fault: expected one of \[.*'abort'"):
        faults.fault("segfault")
    with pytest.raises(KeyError, match="case: expected one of"):
        faults.register_stand_in("softmax", "abort", "f32-1x1")


# -- child runs: the faults contained, end to end ---------------------------------------------

def _child_pytest(tmp_path, *args: str, timeout: float = 300):
    """pytest over test_kernels.py in a child process; (exit status or None if it had to be
    killed, outcomes by test id, output)."""
    junit = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "pytest", "correctness_tests/test_kernels.py",
               "-p", "no:cacheprovider", f"--junitxml={junit}", "-q", *args]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as error:
        return None, drill.junit_outcomes(junit), str(error.stdout)
    return done.returncode, drill.junit_outcomes(junit), done.stdout + done.stderr


def _planted(outcomes, names) -> set[str]:
    """Ids of the stand-ins `names` that ran."""
    return {k for k, (outcome, _) in outcomes.items()
            if outcome != "skipped" and any(f"{OP}-{name}-" in k for name in names)}


def _split(outcomes, names):
    """(failed ids, ids of the stand-ins `names` that ran, other ids that ran but did not
    pass)."""
    failed = {k for k, (outcome, _) in outcomes.items() if outcome == "failed"}
    planted = _planted(outcomes, names)
    wrong = {k for k, (outcome, _) in outcomes.items()
             if outcome not in ("passed", "skipped") and k not in planted}
    return failed, planted, wrong


# The stand-ins of the isolated child run below: the hang and the abort on every case, and two
# sticky errors, each on a case of its own (one raised in the call, one only the device check
# after the call sees).
_CONTAINED = ("fault_hang", "fault_abort", "fault_sticky", "fault_sticky_async")
_CHILD_GROUP = "isolation-child-run"  # its two tests on one worker: the child run made once


@pytest.fixture(scope="module")
def contained_run(tmp_path_factory):
    """`pytest -n 2` over mlp with every stand-in of _CONTAINED beside the real implementations
    (one child run for the two tests that read it: each restart after a fault costs a
    worker's collection); (exit status, outcomes, output)."""
    first, second = _cpu_cases(OP)[:2]
    return _child_pytest(
        tmp_path_factory.mktemp("contained"), "-n", "2", "-k", f"{OP}-",
        "--plant-fault", f"{OP}:hang", "--plant-fault", f"{OP}:abort",
        "--plant-fault", f"{OP}:sticky:{first}", "--plant-fault", f"{OP}:sticky-async:{second}",
        "--item-limit", "8")


@pytest.mark.slow
@pytest.mark.xdist_group(_CHILD_GROUP)
def test_a_hang_and_an_abort_beside_the_real_implementations_fail_only_their_own_items(
        contained_run):
    """The issue's test: stand-ins that never return and that abort their process, registered
    beside mlp's real implementations; `pytest -n 2` over mlp ends by itself, fails exactly
    their items (one line each: the implementation, the case, what happened) and passes the
    rest."""
    code, outcomes, output = contained_run
    assert code == 1, output[-3000:]
    failed, _, wrong = _split(outcomes, _CONTAINED)
    planted = _planted(outcomes, ("fault_hang", "fault_abort"))
    assert len(planted) == 4 and planted <= failed, output[-3000:]  # normal and large inputs
    assert not wrong
    assert sum(outcome == "passed" for outcome, _ in outcomes.values()) >= 16
    case = _cpu_cases(OP)[0]
    for test_id in planted:
        message = outcomes[test_id][1]
        assert "\n" not in message
        if "fault_hang" in test_id:
            assert message.startswith(f"timeout in {OP}-fault_hang {case} (")
            assert "no result after 8 s (--item-limit)" in message
        else:
            assert message.startswith(f"crash in {OP}-fault_abort {case} (")
            assert "Fatal Python error: Aborted" in message and "SIGABRT" in message


@pytest.mark.slow
@pytest.mark.xdist_group(_CHILD_GROUP)
def test_sticky_faults_fail_the_item_that_showed_them_and_the_rest_run_on_fresh_workers(
        contained_run):
    """A sticky error raised in a call, and one only the device check after the call sees
    (the call itself returned the right result): each fails its item with one line; the
    items queued behind them on the poisoned worker pass on a fresh one."""
    code, outcomes, output = contained_run
    failed, planted, wrong = _split(outcomes, _CONTAINED)
    sticky = _planted(outcomes, ("fault_sticky", "fault_sticky_async"))
    assert len(sticky) == 4 and failed == planted and not wrong, output[-3000:]
    for test_id in sticky:
        message = outcomes[test_id][1]
        assert "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered" in message
        found = "found by the device check after its call" if "async" in test_id else \
            "raised in its call"
        assert found in message, message


@pytest.mark.slow
def test_without_isolation_the_sticky_stand_in_fails_the_items_after_it(tmp_path):
    """What the tests above guard against: the stand-in poisons its process as a CUDA context
    does, so without isolation the real implementations' items after it fail too."""
    case = _cpu_cases(OP)[0]
    code, outcomes, output = _child_pytest(
        tmp_path, "-n", "2", "-k", f"{OP}- and test_matches_reference and {case}",
        "--plant-fault", f"{OP}:sticky", "--no-isolation")
    failed, planted, wrong = _split(outcomes, ("fault_sticky",))
    assert failed >= planted and wrong, output[-3000:]


@pytest.mark.slow
def test_a_hang_that_holds_the_gil_is_ended_by_the_c_watchdog(tmp_path):
    case = _cpu_cases(OP)[0]
    code, outcomes, output = _child_pytest(
        tmp_path, "-n", "1", "-k", f"{OP}- and test_matches_reference and {case} and normal",
        "--plant-fault", f"{OP}:gil-hang", "--item-limit", "3", timeout=150)
    failed, planted, wrong = _split(outcomes, ("fault_gil_hang",))
    assert len(planted) == 1 and failed == planted and not wrong, output[-3000:]
    message = outcomes[planted.pop()][1]
    assert "with the GIL held, ended by faulthandler's watchdog" in message


@pytest.mark.slow
def test_in_one_process_a_sticky_fault_skips_the_device_items_after_it(tmp_path):
    case = _cpu_cases(OP)[0]
    code, outcomes, output = _child_pytest(
        tmp_path, "-n", "0", "-k", f"{OP}- and test_matches_reference",
        "--plant-fault", f"{OP}:sticky:{case}")
    failed, planted, wrong = _split(outcomes, ("fault_sticky",))
    assert len(failed) == 1 and failed <= planted and not wrong, output[-3000:]
    skipped_for_it = [k for k, (outcome, _) in outcomes.items() if outcome == "skipped"]
    assert skipped_for_it  # the device items after it
    assert f"not run: the device is unusable since {OP}-fault_sticky {case}" in output


@pytest.mark.slow
def test_in_one_process_a_hang_ends_the_run_naming_the_item(tmp_path):
    case = _cpu_cases(OP)[0]
    code, _, output = _child_pytest(
        tmp_path, "-n", "0", "-k", f"{OP}- and test_matches_reference and {case}",
        "--plant-fault", f"{OP}:hang", "--item-limit", "3", timeout=120)
    assert code == isolation.EXIT_TIMEOUT, output[-3000:]
    assert f"timeout in {OP}-fault_hang {case} (normal inputs): no result after 3 s" in output


# -- the drill ---------------------------------------------------------------------------------

def test_the_drill_reads_pytests_and_asvs_results(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase classname="t" name="test_matches_reference[softmax-xla-f32-37x128-normal]">
            <failure message="crash in softmax-xla f32-37x128 (normal inputs): Aborted&#10;more"/>
          </testcase>
          <testcase classname="t" name="test_matches_reference[softmax-torch-f32-37x128-normal]"/>
          <testcase classname="t" name="test_matches_reference[softmax-cuda-f32-37x128-normal]">
            <skipped message="needs a CUDA GPU"/>
          </testcase>
          <testcase classname="t" name="test_matches_reference[softmax-pallas-f32-37x128-normal]">
            <error message="worker crashed"/>
          </testcase>
        </testsuite></testsuites>"""))
    row = drill.pytest_row("abort", "xla", drill.junit_outcomes(junit), 12.0, True)
    assert (row.planted_failed, row.planted_ran, row.wrong_failed, row.kept, row.others) == \
        (1, 1, 1, 1, 2)
    assert row.message == "crash in softmax-xla f32-37x128 (normal inputs): Aborted"
    assert not row.contained  # the pallas item failed too
    results = tmp_path / "results" / "machine"
    results.mkdir(parents=True)
    (results / "abcdef12-kernelperf-py3.11.json").write_text(
        '{"result_columns": ["result", "params"], "results": {"benchmarks.Softmax.time_device": '
        '[[null, 0.001], [["\'torch\'", "\'xla\'"], ["\'f32-64x1000\'"], ["\'fwd\'"]]]}}')
    assert drill.asv_values(tmp_path / "results", "abcdef1234", "benchmarks.Softmax.time_device") \
        == {"torch": None, "xla": 0.001}


def test_the_drill_fails_when_a_fault_escapes_and_not_for_its_comparison_runs():
    lines = []
    escaped = drill.Row("sticky", "pytest", 2, 2, 3, 3, 6, 30.0, True, "device fault in ...")
    comparison = drill.Row("sticky", "pytest --no-isolation", 2, 2, 5, 1, 6, 26.0, True, "")
    assert drill.report([comparison], lines.append) == 0
    assert drill.report([escaped, comparison], lines.append) == 1
    assert lines[-1] == "fault-drill: NOT CONTAINED: sticky (pytest)"


def test_the_drills_table_gives_each_run_its_counts_wall_and_result():
    lines: list[str] = []
    rows = [drill.Row("abort", "pytest", 1, 1, 0, 4, 4, 41.4, True, "crash in x:\n  Aborted"),
            drill.Row("hang", "asv", 1, 1, 0, 1, 1, 900.2, False, ""),
            drill.Row("sticky", "pytest --no-isolation", 1, 1, 4, 0, 4, 21.0, True, "")]
    assert drill.report(rows, lines.append) == 1  # the hang's run was killed at its limit
    table = [line.split("  ") for line in lines[0].splitlines()[2:]]
    cells = [[cell.strip() for cell in row if cell.strip()] for row in table]
    assert cells == [["abort", "pytest", "1/1", "0", "4/4", "41 s", "contained"],
                     ["hang", "asv", "1/1", "0", "1/1", "900 s (killed)", "NOT CONTAINED"],
                     ["sticky", "pytest --no-isolation", "1/1", "4", "0/4", "21 s",
                      "(comparison)"]]
    assert lines[0].splitlines()[0].split() == [
        "fault", "run", "planted", "failed", "others", "failed", "others", "kept", "wall",
        "result"]
    # Each failure's first words on one line (whitespace folded), then the verdict.
    assert lines[1:] == ["  abort / pytest: crash in x: Aborted",
                         "fault-drill: NOT CONTAINED: hang (asv)"]
    lines.clear()
    assert drill.report(rows[:1], lines.append) == 0
    assert lines[-1] == ("fault-drill: every fault failed its own items only; the others' "
                         "results were kept")
    assert drill._shorten("a  b\n c " + "x" * 400, 20) == "a b c xxxxxxxxxxx..."


@pytest.mark.parametrize("row,contained", [
    (drill.Row("f", "pytest", 2, 2, 0, 3, 3, 1.0, True, ""), True),
    (drill.Row("f", "pytest", 1, 2, 0, 3, 3, 1.0, True, ""), False),  # a planted item passed
    (drill.Row("f", "pytest", 0, 0, 0, 3, 3, 1.0, True, ""), False),  # the planted never ran
    (drill.Row("f", "pytest", 2, 2, 1, 3, 3, 1.0, True, ""), False),  # another one failed
    (drill.Row("f", "pytest", 2, 2, 0, 2, 3, 1.0, True, ""), False),  # a result was lost
    (drill.Row("f", "pytest", 2, 2, 0, 3, 3, 1.0, False, ""), False),  # killed at its limit
])
def test_a_fault_is_contained_only_when_every_part_of_the_row_says_so(row, contained):
    assert row.contained is contained


def test_the_drill_reads_the_supervisors_reason_for_each_failed_implementation(tmp_path):
    from kernels.core import journals

    (tmp_path / "asv.conf.json").write_text(json.dumps({"env_dir": "envs"}))
    commit = "0123456789abcdef"
    journal = tmp_path / "envs" / "e1" / journals.MEASUREMENTS / f"{commit[:12]}-77"
    journal.mkdir(parents=True)
    (journal / f"{drill.OP}.jsonl").write_text("\n".join(json.dumps(e) for e in (
        {"event": "failed", "key": "softmax/xla/f32-64x1000/fwd", "reason": "timed out"},
        {"event": "failed", "key": "softmax/xla/f32-64x1000/bwd", "reason": "later"},
        {"event": "measured", "key": "softmax/torch/f32-64x1000/fwd"},
        {"event": "failed", "key": "softmax/cuda/f32-64x1000/fwd"})) + "\n")
    # Another commit's journal and another operation's are not read.
    other = tmp_path / "envs" / "e1" / journals.MEASUREMENTS / "fedcba987654-1"
    other.mkdir()
    (other / f"{drill.OP}.jsonl").write_text(json.dumps(
        {"event": "failed", "key": "softmax/pallas/c/fwd", "reason": "x"}) + "\n")
    (journal / "matmul.jsonl").write_text(json.dumps(
        {"event": "failed", "key": "matmul/triton/c/fwd", "reason": "x"}) + "\n")
    assert drill.journal_failures(tmp_path, commit) == {"xla": "timed out", "cuda": ""}


def _node(worker_id="gw2", code=None, raises=False):
    def wait(timeout):
        assert timeout > 0
        if raises:
            raise OSError("gone")
        return code

    popen = types.SimpleNamespace(wait=wait)
    return types.SimpleNamespace(gateway=types.SimpleNamespace(
        id=worker_id, _io=types.SimpleNamespace(popen=popen)))


@pytest.mark.parametrize("code,words", [
    (-6, "killed by SIGABRT"), (-9, "killed by SIGKILL"), (-1, "killed by SIGHUP"),
    (-200, "killed by signal 200"),
    (isolation.EXIT_TIMEOUT, "ended itself at the limit"),
    (isolation.EXIT_POISONED, "ended itself after a device fault"), (3, "exit 3"),
    (0, "exit 0"), (None, "exit None"),
])
def test_a_dead_workers_exit_is_named(code, words):
    assert isolation._Controller._exit_status(_node(code=code)) == words


def test_a_dead_worker_whose_status_cannot_be_read_says_so():
    assert isolation._Controller._exit_status(_node(raises=True)) == "exit status unknown"


def test_a_node_id_is_labelled_as_its_kernel_item_or_by_its_test_name(tmp_path):
    controller = _controller(tmp_path)
    node = "correctness_tests/test_kernels.py::test_matches_reference"
    assert controller.label(f"{node}[softmax-xla-f32-37x128-normal]") == \
        "softmax-xla f32-37x128 (normal inputs)"
    assert controller.label(f"{node}[softmax-nope-f32-37x128-normal]") == \
        "test_matches_reference[softmax-nope-f32-37x128-normal]"
    assert controller.label("correctness_tests/test_x.py::TestY::test_z") == "test_z"
    # The parameters are the last brackets' (a folder's name may hold brackets too), and only
    # real items are labelled (an implementation with another operation's case is none).
    assert controller.label("tests/[gpu]/test_k.py::test_k[softmax-xla-f32-37x128-normal]") == \
        "softmax-xla f32-37x128 (normal inputs)"
    other_case = registry.operation("matmul").cases[0].id
    assert controller.label(f"{node}[softmax-xla-{other_case}-normal]") == \
        f"test_matches_reference[softmax-xla-{other_case}-normal]"


def test_blame_takes_a_hangs_own_line_else_builds_one_from_the_fault_record(tmp_path):
    controller = _controller(tmp_path)
    node = "correctness_tests/test_x.py::test_y"
    key = isolation._key(node)
    (tmp_path / f"reason-{key}.json").write_text(json.dumps(
        {"kind": "timeout", "message": "timeout in test_y: no result after 30 s"}))
    assert controller.blame(node, _node(code=-9)) == "timeout in test_y: no result after 30 s"
    assert not (tmp_path / f"reason-{key}.json").exists()  # read once
    # No note: a crash, named with the worker's record and how it ended.
    assert controller.blame(node, _node("gw5", code=-6)) == (
        "crash in test_y: no Python fault record (worker gw5 killed by SIGABRT; replaced)")
    (tmp_path / "fault-gw5.txt").write_text(
        'Timeout (0:00:35)!\n\nThread 0x1 (most recent call first):\n'
        '  File "/r/kernels/k.py", line 9 in spin\n'
        '  File "/r/correctness_tests/test_x.py", line 4 in test_y\n'
        '  File "/usr/lib/_pytest/runner.py", line 1 in call\n')
    assert controller.blame(node, _node("gw5", code=isolation.EXIT_TIMEOUT)) == (
        "timeout in test_y: no result after 0:00:35 with the GIL held, ended by faulthandler's"
        " watchdog at test_x.py:4 test_y -> k.py:9 spin (worker gw5 ended itself at the "
        "limit; replaced)")
    # Every line blamed is also the run's record of a contained fault.
    assert len(controller.contained) == 3 and controller.contained[:2] == [
        "timeout in test_y: no result after 30 s",
        "crash in test_y: no Python fault record (worker gw5 killed by SIGABRT; replaced)"]
    assert controller.contained[2].startswith("timeout in test_y: no result after 0:00:35")


def test_settle_closes_what_finished_returns_the_item_that_died_and_requeues_the_rest(
        tmp_path):
    """A dead worker's queue: its reported items stay done, the one it died in goes to xdist
    to report, an item retired after another showed a fault is contained, and one that never
    started is requeued, REQUEUE_LIMIT times at most, then returned to be failed."""
    controller = _controller(tmp_path)
    controller.finished, controller.started = {"t::b"}, {"t::c"}
    controller.requeued, controller.between = {}, []
    for nodeid, kind, message in (("t::b", "timeout", "poisoned after b"),
                                  ("t::d", "retired", "d retired: a fault in c")):
        (tmp_path / f"reason-{isolation._key(nodeid)}.json").write_text(
            json.dumps({"kind": kind, "message": message}))
    unit = {"t::a": True, "t::b": False, "t::c": False}
    assert controller.settle(_node(), {"scope": unit}) == "t::c"
    assert unit == {"t::a": True, "t::b": True, "t::c": True}
    assert controller.contained == ["poisoned after b"]
    assert controller.settle(_node(), {"scope": unit}) is None  # nothing left open

    retired = {"t::d": False}
    assert controller.settle(_node(), {"scope": retired}) is None
    assert retired == {"t::d": False} and controller.requeued == {}
    assert controller.contained[-1] == "d retired: a fault in c"

    never = {"t::e": False, "t::f": False}
    for attempt in range(1, isolation.REQUEUE_LIMIT + 1):
        assert controller.settle(_node("gw7", code=-11), {"scope": never}) is None
        assert never == {"t::e": False, "t::f": False}
        assert controller.requeued == {"t::e": attempt}
    assert controller.between[-1] == (
        "worker gw7 died between items (no Python fault record; killed by SIGSEGV); its "
        "queue, from t::e, was requeued")
    assert len(controller.between) == isolation.REQUEUE_LIMIT
    assert controller.settle(_node("gw7", code=-11), {"scope": never}) == "t::e"
    assert never == {"t::e": True, "t::f": False}
    # The worker's fault record, where it left one (a fixture's crash), is in the line.
    (tmp_path / "fault-gw8.txt").write_text(
        "Fatal Python error: Segmentation fault\n\n" + _thread(
            "Current thread", '  File "/r/correctness_tests/conftest.py", line 12 in device\n'))
    assert controller.settle(_node("gw8", code=-11), {"scope": {"t::g": False}}) is None
    assert controller.between[-1] == (
        "worker gw8 died between items (Fatal Python error: Segmentation fault at "
        "conftest.py:12 device; killed by SIGSEGV); its queue, from t::g, was requeued")


@pytest.mark.parametrize("flags,message", [
    (dict(platform="tpu"), "platform: expected 'gpu' or 'cpu', got 'tpu'"),
    (dict(tools=()), "tools: expected some of ['pytest', 'asv'], got []"),
    (dict(tools=("pytest", "ctest")), "tools: expected some of ['pytest', 'asv'], got "
                                      "['pytest', 'ctest']"),
    (dict(workers=0), "workers: expected >= 1 (isolation replaces workers), got 0"),
    (dict(item_limit_s=0.0), "item_limit_s: expected seconds > 0, got 0.0"),
    (dict(item_limit_s=math.inf), "item_limit_s: expected seconds > 0, got inf"),
    (dict(item_limit_s=10.0, run_limit_s=10.0),
     "run_limit_s: expected more than the item limit (10 s), got 10.0"),
    (dict(item_limit_s=10.0, run_limit_s=math.inf),
     "run_limit_s: expected more than the item limit (10 s), got inf"),
])
def test_drill_settings_refuse_each_bad_value_naming_it(flags, message):
    flags = {"platform": "cpu", **flags}
    with pytest.raises(ValueError) as refused:
        drill.Settings(**flags)
    assert str(refused.value) == message
    with pytest.raises(validation.UserError, match=re.escape(message)):
        drill.settings_from(**flags)


def test_drill_settings_take_the_platforms_defaults_and_the_smallest_valid_values():
    for platform in ("cpu", "gpu"):
        settings = drill.Settings(platform=platform, workers=1)
        assert settings.chosen_faults == faults.DRILL_DEFAULTS[platform]
        assert settings.item_limit == drill.ITEM_LIMIT_S[platform]
        assert settings.tools == drill.TOOLS
    chosen = drill.Settings(platform="cpu", faults=("abort",), item_limit_s=5.0,
                            run_limit_s=5.5)
    assert (chosen.chosen_faults, chosen.item_limit) == (("abort",), 5.0)


def test_the_drill_shows_the_last_written_line_of_a_growing_log(tmp_path):
    log = tmp_path / "tool.log"
    assert drill._last_line(log) == ""  # not written yet
    log.write_bytes(b"")
    assert drill._last_line(log) == ""
    # Progress redrawn with carriage returns, blank lines after it, and an early part of the
    # log beyond the 4 KiB read: the last line with text, its whitespace folded, shortened.
    log.write_bytes(b"x" * 10_000 + b"\nfirst\r[ 10%]  a   b\r\n\n  \n")
    assert drill._last_line(log) == "[ 10%] a b"
    log.write_bytes(b"start" + b"y" * 5000)  # a line longer than the 4 KiB read: its end
    assert drill._last_line(log, width=20) == "y" * 17 + "..."
    log.write_bytes("\u00e9t\u00e9 \xff".encode("latin-1"))  # not UTF-8: replaced, not raised
    assert drill._last_line(log).startswith("\ufffdt\ufffd")


def test_junit_outcomes_keep_a_failure_over_a_pass_of_the_same_item(tmp_path):
    """An item's teardown error comes as a second testcase of the same name: failed wins,
    whichever comes first; only parametrized items (a test id in brackets) are read."""
    junit = tmp_path / "j.xml"
    assert drill.junit_outcomes(junit) == {}
    junit.write_text(textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase name="test_plain"><failure message="not a kernel item"/></testcase>
          <testcase name="test_k[softmax-xla-a]"/>
          <testcase name="test_k[softmax-xla-a]"><error message="teardown: sticky&#10;more"/>
          </testcase>
          <testcase name="test_k[softmax-torch-a]"><failure message="wrong&#10;values"/></testcase>
          <testcase name="test_k[softmax-torch-a]"/>
          <testcase name="test_k[softmax-cuda-a]"><skipped message="no GPU"/></testcase>
          <testcase name="test_k[softmax-triton-a]"><failure/></testcase>
          <testcase name="test_k[softmax-pallas-[x]]"/>
        </testsuite></testsuites>"""))
    assert drill.junit_outcomes(junit) == {
        "softmax-xla-a": ("failed", "teardown: sticky"),
        "softmax-torch-a": ("failed", "wrong"),
        "softmax-cuda-a": ("skipped", ""),
        "softmax-triton-a": ("failed", ""),
        "softmax-pallas-[x]": ("passed", "")}


def test_a_pytest_row_counts_the_planted_implementation_against_the_others():
    outcomes = {"softmax-xla-a": ("failed", "first"), "softmax-xla-b": ("failed", "second"),
                "softmax-xla-c": ("skipped", ""), "softmax-xla_fused-a": ("passed", ""),
                "softmax-torch-a": ("passed", ""), "softmax-torch-b": ("failed", "x"),
                "softmax-cuda-a": ("skipped", "")}
    row = drill.pytest_row("abort", "xla", outcomes, 12.5, False, tool="pytest --no-isolation")
    assert row == drill.Row("abort", "pytest --no-isolation", 2, 2, 1, 2, 3, 12.5, False,
                            "first")
    assert drill.pytest_row("abort", "nope", outcomes, 1.0, True).planted_ran == 0


def test_a_tool_the_drill_waits_on_shows_its_latest_output_and_is_killed_at_its_limit(
        tmp_path, monkeypatch):
    monkeypatch.setattr(drill, "HEARTBEAT_S", 0.2)
    lines: list[str] = []
    script = "import time\nprint('....F [ 50%]', flush=True)\ntime.sleep(30)\n"
    code, wall = drill._run([sys.executable, "-c", script], tmp_path, dict(os.environ), 1.5,
                            tmp_path / "t.log", "pytest", lines.append)
    assert code is None and wall < 10  # killed at its limit, not left running
    assert len(lines) >= 3, lines
    assert all(line.startswith("  pytest: ") and "of at most 2 s" in line for line in lines)
    assert lines[-1].endswith("last output: ....F [ 50%]"), lines
    lines.clear()
    code, _ = drill._run([sys.executable, "-c", "print('done')"], tmp_path, dict(os.environ), 30,
                         tmp_path / "t.log", "asv", lines.append)
    assert code == 0 and lines == []  # a quick tool says nothing while it runs


@pytest.mark.parametrize("flags, match", [
    (dict(faults=("cuda-oob",)), "cuda-oob cannot run on a cpu"),
    (dict(faults=("nope",)), "fault: expected one of"),
    (dict(tools=("ctest",)), "tools: expected some of"),
    (dict(workers=0), "workers: expected >= 1"),
    (dict(item_limit_s=100.0, run_limit_s=50.0), "run_limit_s: expected more than"),
])
def test_bad_drill_settings_are_refused_before_any_clone(flags, match):
    with pytest.raises(ValueError, match=match):
        drill.Settings(platform="cpu", **flags)


@pytest.mark.slow
def test_the_drill_contains_an_abort_in_asv_on_a_cpu():
    """The drill end to end on a CPU, narrowed to one fault and to asv: it plants the abort in
    softmax-xla in a scratch clone of HEAD (committed code only), runs asv against it, and
    finds it contained. Its pytest half is docs/testing.md's `fault-drill --faults abort
    --tools pytest`, which the README check runs (exit 1 unless contained); pytest's
    containment of an abort beside the real implementations is the issue's test above."""
    lines: list[str] = []
    settings = drill.Settings(platform="cpu", faults=("abort",), tools=("asv",))
    assert drill.main_flow(settings, source=ROOT, log=lines.append) == 0, "\n".join(lines)
    printed = "\n".join(lines).splitlines()
    rows = [line.split() for line in printed if line.startswith("abort ")]
    assert [row[1:5] for row in rows] == [["asv", "1/1", "0", "1/1"]], "\n".join(lines)


@pytest.mark.parametrize("platform, refused", [("cpu", "cuda-oob"), ("gpu", "sticky")])
def test_a_fault_refused_on_a_platform_is_told_with_every_fault_that_runs_there(platform,
                                                                                refused):
    def runs_here(name):
        try:
            drill.Settings(platform=platform, faults=(name,))
        except ValueError:
            return False
        return True

    with pytest.raises(ValueError) as error:
        drill.Settings(platform=platform, faults=(refused,))
    named = json.loads(str(error.value).rsplit("; here: ", 1)[1].replace("'", '"'))
    assert named == [f.name for f in faults.FAULTS if runs_here(f.name)] and refused not in named


def test_drill_settings_take_an_item_limit_under_a_second():
    assert drill.Settings(platform="cpu", item_limit_s=0.5).item_limit == 0.5


class _Tool:
    """subprocess.Popen for drill._run: it ends `ends_after_s` after its start (None: never),
    with `code`; each wait moves the clock on, and writes `output` to the log at its second."""

    def __init__(self, clock, ends_after_s=None, code=0, output="", raises=None):
        self.clock, self.ends_after_s, self.code, self.output = clock, ends_after_s, code, output
        self.raises, self.waits, self.started, self.limit_s = raises, [], None, 11.0

    def __call__(self, command, **kwargs):
        self.command, self.kwargs, self.started = command, kwargs, self.clock.now
        return self

    def wait(self, timeout):
        self.waits.append(timeout)
        # Never a wait for nothing, nor past the run's limit (either would go on without end
        # here, as the clock moves only with the waits).
        assert 0 < timeout and self.clock.now + timeout <= self.started + self.limit_s, \
            self.waits
        if self.raises:
            raise self.raises
        if len(self.waits) == 2 and self.output:
            self.kwargs["stdout"].write(self.output)
            self.kwargs["stdout"].flush()
        end = None if self.ends_after_s is None else self.started + self.ends_after_s
        if end is not None and end <= self.clock.now + timeout:
            self.clock.now = max(self.clock.now, end)
            return self.code
        self.clock.now += timeout
        raise subprocess.TimeoutExpired(self.command, timeout)


def _run_tool(tmp_path, monkeypatch, tool, clock, killed=None, **kwargs):
    """drill._run of `tool` against `clock`, with an 11 s limit: ((code, wall), the lines it
    logged, the processes whose group it killed)."""
    killed = [] if killed is None else killed
    monkeypatch.setattr(drill, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(drill, "subprocess", types.SimpleNamespace(
        Popen=tool, STDOUT=subprocess.STDOUT, DEVNULL=subprocess.DEVNULL,
        TimeoutExpired=subprocess.TimeoutExpired))
    monkeypatch.setattr(drill, "_kill_group", killed.append)
    monkeypatch.setattr(drill, "HEARTBEAT_S", 5.0)
    lines: list[str] = []
    result = drill._run(["prog", "-q"], tmp_path, {"A": "1"}, 11.0, tmp_path / "t.log",
                        log=lines.append, **kwargs)
    return result, lines, killed


def test_a_tool_that_never_ends_is_waited_on_to_its_limit_then_its_group_is_killed(
        tmp_path, monkeypatch):
    clock = fakes.Clock()
    tool = _Tool(clock, output="....F [ 50%]\n")
    (code, wall), lines, killed = _run_tool(tmp_path, monkeypatch, tool, clock)
    assert (code, wall, killed) == (None, 11.0, [tool])
    assert tool.waits == [5.0, 5.0, 1.0]  # the heartbeat, the last one cut at the limit
    # Without a label the heartbeat names the program; the seconds are since the start.
    assert lines == ["  prog: 5 s of at most 11 s; last output: (none yet)",
                     "  prog: 10 s of at most 11 s; last output: ....F [ 50%]",
                     "  prog: 11 s of at most 11 s; last output: ....F [ 50%]"]


def test_a_tool_runs_in_its_own_session_in_the_clone_with_both_streams_in_its_log(
        tmp_path, monkeypatch):
    clock = fakes.Clock()
    tool = _Tool(clock, ends_after_s=7.0, code=3)
    (code, wall), lines, killed = _run_tool(tmp_path, monkeypatch, tool, clock, label="asv")
    assert (code, wall, killed) == (3, 7.0, [])  # ended by itself: nothing to kill
    assert tool.command == ["prog", "-q"]
    assert lines == ["  asv: 5 s of at most 11 s; last output: (none yet)"]
    options = dict(tool.kwargs, stdout=tool.kwargs["stdout"].name)
    assert options == {"cwd": tmp_path, "env": {"A": "1"}, "stdout": str(tmp_path / "t.log"),
                       "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL,
                       "start_new_session": True}


def test_an_interrupted_wait_kills_the_tools_group_and_is_raised(tmp_path, monkeypatch):
    clock = fakes.Clock()
    tool = _Tool(clock, raises=KeyboardInterrupt())
    killed: list = []
    with pytest.raises(KeyboardInterrupt):
        _run_tool(tmp_path, monkeypatch, tool, clock, killed)
    assert killed == [tool]


def test_the_drill_shows_at_most_120_characters_of_a_tools_last_line(tmp_path):
    log = tmp_path / "tool.log"
    log.write_text("z" * 500 + "\n")
    assert drill._last_line(log) == "z" * 117 + "..."


def test_a_last_line_that_fills_the_4_kib_read_is_shown_from_its_start(tmp_path):
    log = tmp_path / "tool.log"
    log.write_text("earlier\n" + "start" + "y" * (4096 - 5))
    assert drill._last_line(log, width=10) == "startyy..."


def test_junit_outcomes_read_test_cases_only_and_skip_one_without_a_name(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(textwrap.dedent("""\
        <testsuites><testsuite name="kernels[cpu]">
          <properties><property name="case[f32]" value="x"/></properties>
          <testcase classname="t"/>
          <testcase name="test_k[softmax-xla-a]"/>
        </testsuite></testsuites>"""))
    assert drill.junit_outcomes(junit) == {"softmax-xla-a": ("passed", "")}


def test_a_pytest_row_is_the_plain_runs_and_has_no_message_when_nothing_planted_failed():
    row = drill.pytest_row("hang", "xla", {"softmax-xla-a": ("passed", ""),
                                           "softmax-torch-a": ("failed", "other's")}, 3.0, True)
    assert (row.tool, row.planted_failed, row.message) == ("pytest", 0, "")


def _asv_results(directory, *, machine="m", env="py3.11", impls=("torch", "xla"), result=(),
                 benchmark="benchmarks.Softmax.time_device"):
    """An asv results file of commit abcdef12...: `result` over `impls` x one case x fwd."""
    folder = directory / machine
    folder.mkdir(parents=True, exist_ok=True)
    params = [[f"'{impl}'" for impl in impls], ["'f32-64x1000'"], ["'fwd'"]]
    data = {"result_columns": ["result", "params"]}
    if benchmark is not None:  # None: a run that measured nothing, without "results"
        data["results"] = {benchmark: [list(result), params]}
    (folder / f"abcdef12-kernelperf-{env}.json").write_text(json.dumps(data))


@pytest.mark.parametrize("result, values", [
    ([0.001, None], {"torch": 0.001, "xla": None}),  # a failure stays its own
    ([None, 0.002], {"torch": None, "xla": 0.002}),
    ([], {"torch": "nan", "xla": "nan"}),  # no result at all: skipped
])
def test_asv_values_give_each_implementation_its_own_result(tmp_path, result, values):
    _asv_results(tmp_path, result=result)
    found = drill.asv_values(tmp_path, "abcdef1234", "benchmarks.Softmax.time_device")
    assert {k: "nan" if isinstance(v, float) and math.isnan(v) else v
            for k, v in found.items()} == values


def test_asv_values_read_a_lone_implementation_and_every_results_file_of_the_commit(tmp_path):
    _asv_results(tmp_path, machine="a", benchmark=None)  # measured nothing
    _asv_results(tmp_path, machine="b", benchmark="benchmarks.Other.time_device", result=[1.0])
    _asv_results(tmp_path, machine="c", impls=("xla",), result=[0.003])
    assert drill.asv_values(tmp_path, "abcdef1234", "benchmarks.Softmax.time_device") == \
        {"xla": 0.003}


def test_the_drill_names_every_fault_that_escaped_and_shows_300_characters_of_a_message():
    lines: list[str] = []
    rows = [drill.Row("abort", "pytest", 0, 1, 0, 1, 1, 1.0, True, "m" * 400),
            drill.Row("hang", "asv", 1, 1, 0, 1, 1, 9.0, False, "t" * 300)]
    assert drill.report(rows, lines.append) == 1
    assert lines[1:] == ["  abort / pytest: " + "m" * 297 + "...",
                         "  hang / asv: " + "t" * 300,  # exactly the width: whole
                         "fault-drill: NOT CONTAINED: abort (pytest), hang (asv)"]
