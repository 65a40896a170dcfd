"""pytest plugin: under xdist workers the perf items time the device alone, in the same run.

`pytest -m gpu` as typed runs over several xdist workers that share one GPU; its perf items
(perf_tests/tests/test_performance.py, the `PERF_GROUP` xdist group) time kernels, which
needs the device to themselves. docs/perf-in-pytest.md tells the whole story; in short:

* The device lock (`DeviceLock`): a file lock of the run, made by the controller and named
  to its workers. Every worker holds it shared from the start of its session to its end; a
  perf item takes it exclusive before it samples (the `device_alone` fixture), which it gets
  once every other worker has ended its session, that is once the rest of the run is done,
  and gives it back (shared again) after the last perf item of a stretch of them. The kernel
  frees a dead process's lock, so a crashed worker never holds the perf items up.
* The perf worker: the scheduler (`PerfFirst`, mixed into conftest.py's) sends the whole
  perf group first, to a worker of its own (`PERF_WORKER`, gw0), and shuts that worker down
  at once so it gets nothing else. There the first perf item warms every perf item up
  (inputs, compiles, autotuning, a first call; perf_tests/tests/conftest.py) while the other
  workers run the rest of the suite, then waits for the device: the run's serial share is
  the sampling alone. A worker count the run chooses itself (the GPU plan, `-n auto`) has
  one worker more for it (`extra_worker`); `-n N` counts it among the N.
* pytest-benchmark turns itself off in every process of an xdist run. The workers record
  again (`_record_here`), ship their records to the controller in `workeroutput`, and the
  controller's pytest-benchmark takes them as its own (`_as_metadata`): saving,
  `--benchmark-json`, `--benchmark-compare(-fail)` and the table happen there, once for the
  run, as in one process.

Runs that cannot select a perf item (`-m "gpu and not perf"`) get none of this: no lock, no
perf worker. Without workers (`-n 0`, `pytest -m perf`) nothing changes: one process has the
device to itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kernels.core import compat, environment

PERF_GROUP = "kernelperf-perf"
# The worker the perf group goes to. The controller sets the variable for its workers, which
# read it before starting JAX: that worker allocates as a one-process run does (conftest.py).
PERF_WORKER = "gw0"
PERF_WORKER_VARIABLE = environment.PERF_WORKER_VARIABLE
_LOCK_KEY = "kernelperf_device_lock"  # workerinput: the lock file's path
_OUTPUT_KEY = "kernelperf_perf_phase"  # workeroutput: records and times
_WORKER_NAME = "kernelperf-perf-phase-worker"
_CONTROLLER_NAME = "kernelperf-perf-phase-controller"
# The markers a perf item may carry beside `perf` (kernels.testing.marks: never multi_gpu,
# the perf items being one-device cases): whether a -m expression can select a perf item is
# decided over them.
_PERF_ITEM_MARKERS = ("gpu", "cuda")


class DeviceLock:
    """This process's hold on the device lock of one run: none, "shared" or "exclusive".

    flock(2) on `path`: shared holders run together, an exclusive holder runs alone, and the
    kernel drops a dead process's hold. A held lock is converted in place; a conversion is
    not atomic (flock drops the old hold first), which costs nothing here: a process wanting
    the lock exclusive waits for every shared holder anyway. There is no writer preference:
    processes take the lock shared only as they start (a worker, or a fresh one after a
    crash), so a waiting exclusive holder waits at most for the work of the processes
    there are, which has to run before it anyway.
    """

    def __init__(self, path: str):
        self.path = path
        self.state: str | None = None
        self._handle = None

    def shared(self) -> float:
        """Hold it shared; the seconds this waited."""
        return self._take(fcntl.LOCK_SH, "shared")

    def exclusive(self) -> float:
        """Hold it exclusive; the seconds this waited (for every other holder to let go)."""
        return self._take(fcntl.LOCK_EX, "exclusive")

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
        self.state = None

    def _take(self, operation: int, state: str) -> float:
        if self.state == state:
            return 0.0
        if self._handle is None:
            self._handle = open(self.path, "a")  # noqa: SIM115 - held across calls
        start = time.monotonic()
        fcntl.flock(self._handle, operation)
        self.state = state
        return time.monotonic() - start

    @contextlib.contextmanager
    def held(self, state: str) -> Iterator[float]:
        """The lock held shared or exclusive for the body (the seconds waited), let go after
        it, also when the body raises."""
        if state not in ("shared", "exclusive"):
            raise ValueError(f"state: expected 'shared' or 'exclusive', got {state!r}")
        try:
            yield self.shared() if state == "shared" else self.exclusive()
        finally:
            self.release()


def in_perf_group(item: pytest.Item | None) -> bool:
    """Whether `item` is a perf item: one of the xdist group PERF_GROUP."""
    if item is None:
        return False
    mark = item.get_closest_marker("xdist_group")
    return mark is not None and bool(mark.args) and mark.args[0] == PERF_GROUP


def may_select_perf(markexpr: str) -> bool:
    """Whether `-m markexpr` can select a perf item (marked `perf`, maybe `gpu` and `cuda`):
    `-m gpu` can, `-m "gpu and not perf"` and `-m small` cannot. An expression pytest's
    parser (private) cannot read counts as selecting them: the phase is then set up for
    nothing, which costs one idle worker, while leaving it out would skip the perf items."""
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
    except (ImportError, AttributeError, SyntaxError):
        return True
    for count in range(len(_PERF_ITEM_MARKERS) + 1):
        for names in itertools.combinations(_PERF_ITEM_MARKERS, count):
            marked = {"perf", *names}
            if expression.evaluate(lambda name, *_, _marked=marked, **__: name in _marked):
                return True
    return False


def extra_worker(markexpr: str) -> int:
    """Workers to add to a count the run chooses itself: one for the perf items where they
    may run (they keep it to themselves), else none."""
    return 1 if may_select_perf(markexpr) else 0


# -- the controller ---------------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if _LOCK_KEY in workerinput:
            config.pluginmanager.register(_Worker(config, workerinput[_LOCK_KEY]), _WORKER_NAME)
        return
    workers = getattr(config.option, "numprocesses", None)
    if config.pluginmanager.hasplugin("xdist") and isinstance(workers, int) and workers > 1 \
            and not config.getoption("collectonly") \
            and may_select_perf(config.getoption("markexpr", "") or ""):
        config.pluginmanager.register(_Controller(config), _CONTROLLER_NAME)


class _Controller:
    """The xdist controller's side: the lock file, the perf worker's name, the workers'
    records taken into pytest-benchmark, and the phase's line at the end."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.directory = tempfile.mkdtemp(prefix="kernelperf-device-lock-")
        self.path = os.path.join(self.directory, "device.lock")
        self.phases: list[dict[str, Any]] = []  # per worker that held the device alone
        self.machine_info: dict[str, Any] | None = None
        # Workers start after pytest_configure: they inherit it.
        os.environ[PERF_WORKER_VARIABLE] = PERF_WORKER

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[_LOCK_KEY] = self.path

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return [f"kernelperf: perf items, if any, on worker {PERF_WORKER} alone: warmed up "
                f"beside the other workers, timed once they are done (docs/perf-in-pytest.md)"]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        shipped = getattr(node, "workeroutput", {}).get(_OUTPUT_KEY)
        if not shipped:
            return
        if shipped.get("held_s") is not None:
            self.phases.append({"worker": node.gateway.id, **shipped})
        session = getattr(self.config, "_benchmarksession", None)
        if session is not None and shipped.get("benchmarks"):
            session.benchmarks.extend(_as_metadata(record)
                                      for record in json.loads(shipped["benchmarks"]))
            if shipped.get("machine_info"):
                self.machine_info = json.loads(shipped["machine_info"])

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config: pytest.Config,
                                             machine_info: dict) -> None:
        """The machine of the process that timed (its device fingerprint included), not the
        controller's, which never touches the device."""
        if self.machine_info is not None:
            machine_info.update(self.machine_info)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for phase in self.phases:
            terminalreporter.write_line(describe_phase(phase))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        if os.environ.get(PERF_WORKER_VARIABLE) == PERF_WORKER:
            del os.environ[PERF_WORKER_VARIABLE]


def describe_phase(phase: dict[str, Any]) -> str:
    """The run's line on its perf phase: how long the device was held alone (the serial
    share of the run), how long the worker waited for it and what it warmed up meanwhile."""
    warm = phase.get("warm_s")
    warmed = (f"; meanwhile it warmed up {phase.get('warmed', 0)} measurements in {warm:.1f} s"
              if warm is not None else "")
    return (f"kernelperf: perf phase: {phase['items']} perf items on {phase['worker']} held "
            f"the device alone for {phase['held_s']:.1f} s, after waiting "
            f"{phase['waited_s']:.1f} s for the other workers to finish{warmed}")


class _Shipped:
    """A worker's pytest-benchmark fixture as the controller's Metadata reads it."""

    has_error = False
    cprofile_stats = None

    def __init__(self, record: dict[str, Any]):
        for key in ("name", "fullname", "group", "param", "params", "extra_info"):
            setattr(self, key, record[key])


def _as_metadata(record: dict[str, Any]):
    """pytest-benchmark's Metadata again from a worker's record (`as_dict(include_data=True)`):
    its statistics recomputed from the same per-round durations."""
    from pytest_benchmark.stats import Metadata

    metadata = Metadata(_Shipped(record), record["stats"]["iterations"], record["options"])
    for duration in record["stats"]["data"]:
        metadata.stats.update(duration)
    return metadata


# -- the workers ------------------------------------------------------------------------------

class _Worker:
    """An xdist worker's side: the lock held shared for the session, exclusive for the perf
    items (`device_alone`), and the records and times shipped to the controller."""

    def __init__(self, config: pytest.Config, path: str):
        self.config = config
        self.lock = DeviceLock(path)
        self.items = 0
        self.waited_s = 0.0
        self.held_s: float | None = None
        self._held_since: float | None = None
        self.warm: dict[str, Any] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.lock.shared()
        _record_here(self.config)

    def take_device(self) -> None:
        """The lock exclusive (a no-op while held so), waiting without the item's time limit."""
        if self.lock.state == "exclusive":
            return
        from kernels.testing import isolation  # a plugin module: imported once pytest runs

        with isolation.waiting(self.config):
            self.waited_s += self.lock.exclusive()
        self._held_since = time.monotonic()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        try:
            return (yield)
        finally:
            if in_perf_group(item):
                self.items += 1
            if self.lock.state == "exclusive" and not in_perf_group(nextitem):
                self._give_back()
                self.lock.shared()

    def _give_back(self) -> None:
        if self._held_since is not None:
            self.held_s = (self.held_s or 0.0) + time.monotonic() - self._held_since
            self._held_since = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._give_back()
        self.lock.release()
        shipped = {"items": self.items, "waited_s": self.waited_s, "held_s": self.held_s,
                   **self.warm}
        shipped.update(_records(self.config))
        self.config.workeroutput[_OUTPUT_KEY] = shipped


def _record_here(config: pytest.Config) -> None:
    """pytest-benchmark on again in this worker, where only xdist turned it off (not the
    user's --benchmark-disable or --benchmark-skip); the controller saves, compares and
    shows the run's records, so this worker does none of that."""
    session = getattr(config, "_benchmarksession", None)
    if session is None or not compat.benchmark_off_for_xdist_only(session, config):
        return
    session.disabled = session.xdist_warning = False  # (5.2 has no xdist_warning: unread)
    session.save = session.autosave = session.json = None
    session.compare_fail = None
    session.quiet = True


def _records(config: pytest.Config) -> dict[str, str]:
    """This worker's pytest-benchmark records for the controller (as JSON text, as they are
    saved), with its machine info where the run saves them."""
    session = getattr(config, "_benchmarksession", None)
    if session is None:
        return {}
    from pytest_benchmark.utils import safe_dumps

    records = [bench.as_dict(include_data=True) for bench in session.benchmarks
               if bench and not bench.has_error]
    if not records:
        return {}
    shipped = {"benchmarks": safe_dumps(records)}
    if any(config.getoption(name, None) for name in
           ("benchmark_save", "benchmark_autosave", "benchmark_json")):
        shipped["machine_info"] = safe_dumps(session.get_machine_info())
    return shipped


def _worker(config: pytest.Config) -> _Worker | None:
    return config.pluginmanager.get_plugin(_WORKER_NAME)


def will_wait(config: pytest.Config) -> bool:
    """Whether a perf item here will wait for the device (an xdist worker of a run with the
    lock, not holding it exclusive yet): the time to warm the perf items up."""
    worker = _worker(config)
    return worker is not None and worker.lock.state != "exclusive"


def note_warm_up(config: pytest.Config, seconds: float, measurements: int) -> None:
    """What the perf items warmed up before waiting, for the phase's line."""
    worker = _worker(config)
    if worker is not None:
        worker.warm = {"warm_s": worker.warm.get("warm_s", 0.0) + seconds,
                       "warmed": worker.warm.get("warmed", 0) + measurements}


def take_device_alone(item: pytest.Item, config: pytest.Config) -> bool:
    """Whether this process has the device to itself for `item`'s body. Without xdist
    workers it has; in a worker of a run with the device lock, once it holds the lock
    exclusive (this waits for every other worker to finish); in a worker without the lock,
    not. Only a perf item (the PERF_GROUP group) may ask: the lock goes back to shared after
    the last perf item of a stretch, which is how the other items are kept off the device."""
    if not in_perf_group(item):
        raise RuntimeError(f"{item.nodeid}: only perf items (xdist group {PERF_GROUP!r}) may "
                           f"take the device alone; mark it xdist_group({PERF_GROUP!r})")
    worker = _worker(config)
    if worker is None:
        return environment.xdist_workers() <= 1
    worker.take_device()
    return True


@pytest.fixture
def device_alone(request: pytest.FixtureRequest) -> bool:
    """`take_device_alone` for this test: True once it has the device to itself."""
    return take_device_alone(request.node, request.config)


# -- the scheduler ----------------------------------------------------------------------------

class PerfFirst:
    """Mixin for xdist's loadgroup scheduler (conftest.py's): the perf group goes first, whole,
    to the perf worker (PERF_WORKER, else the first worker asking), which is shut down at
    once, so that it gets nothing else. With one worker, or where it is gone (a crash
    requeues its unfinished perf items), the group is a unit of work like any other; it
    still waits for the device alone (`device_alone`)."""

    _perf_node = None

    def schedule(self) -> None:
        if self.collection is None:
            # With fewer units than workers xdist shuts the last workers down unused: the perf
            # worker goes first, so it is kept (a run of perf items alone still gets it).
            perf = [node for node in self.assigned_work if node.gateway.id == PERF_WORKER]
            if perf:
                self.assigned_work = {perf[0]: self.assigned_work[perf[0]],
                                      **self.assigned_work}
        super().schedule()

    def _assign_work_unit(self, node) -> None:
        if self._perf_node is None and PERF_GROUP in self.workqueue and len(self.nodes) > 1:
            target = next((n for n in self.nodes if n.gateway.id == PERF_WORKER
                           and n in self.registered_collections), node)
            self._perf_node = target
            unit = self.workqueue.pop(PERF_GROUP)
            self.assigned_work[target][PERF_GROUP] = unit
            collection = self.registered_collections[target]
            target.send_runtest_some([collection.index(nodeid)
                                      for nodeid, done in unit.items() if not done])
            target.shutdown()
            if target is node:
                return
        if node.shutting_down or not self.workqueue:
            return
        super()._assign_work_unit(node)


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config):
    """`-n auto` (xdist's count, from the CPUs) and one worker more for the perf items,
    where the run may select them (conftest.py adds it to the GPU plan the same way)."""
    workers = yield
    if not workers:
        return workers
    return workers + extra_worker(config.getoption("markexpr", "") or "")
