"""pytest plugin: a kernel that crashes, hangs or leaves a sticky device fault costs only its
own items (fault containment by xdist worker replacement).

Per xdist worker:

* crash (abort, segfault, a driver's fatal error): faulthandler writes the Python stack of the
  fatal signal to a file per worker. When the worker dies, the controller fails the item it
  was running with one line made from that record, and xdist starts a fresh worker for the
  rest of the queue.
* hang: a watchdog thread gives each item a time limit (`item_limit`: from its case's size
  for kernel items). Past it, the thread writes the item's stacks and one line, and ends the
  worker, which is then handled as a crash. faulthandler's C watchdog, armed `GRACE_S` later,
  ends hangs that hold the GIL (the Python thread cannot run then).
* sticky device fault (CUDA's illegal address, launch failure, misaligned address, device
  assert ...: every later call in the process fails): after each item's call and teardown the
  device is checked (`device_health`: torch and JAX, only where already started), and the
  item's own error is matched against the sticky CUDA errors (`sticky_error`). The first item
  that shows it fails with one line; the worker then ends before starting its next item, and
  the items queued behind it go to a fresh worker, unreported until they run there.

xdist's controller blames the first item still pending on a dead worker, and its loadscope
family (loadgroup included) runs that item again on every replacement. `ReplacementFixes`,
mixed into the project's scheduler (conftest.py), blames the item that started and did not
finish, requeues the ones that never started and keeps two xdist bugs that worker
replacement exposes from losing or stalling work. Contained faults do not count against
xdist's `--max-worker-restart` budget; other worker deaths (a crash at collection) do.

Without workers (`-n 0`) nothing can be replaced: a crash ends the run (pytest's faulthandler
prints its stack), a hang ends it after the item's limit with a line naming it, and after a
sticky fault the remaining device items skip with a reason naming the fault.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator

import pytest

from kernels.core import registry
from kernels.testing import scheduling

# os._exit statuses of a worker that ended itself: past an item's limit, or before an item
# because its device context is unusable.
EXIT_TIMEOUT = 70
EXIT_POISONED = 71
POLL_S = 0.2  # the watchdog thread's poll interval
# Seconds past an item's limit before faulthandler's C watchdog ends a hang holding the GIL.
GRACE_S = 5.0
# An item that never started on this many dead workers is failed rather than requeued again:
# something between items (a fixture, a plugin) kills them.
REQUEUE_LIMIT = 2
_WORKER_KEY = "kernelperf_isolation"  # workeroutput entry: the worker's hook costs
_EXIT_WORDS = {EXIT_TIMEOUT: "ended itself at the limit",
               EXIT_POISONED: "ended itself after a device fault"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """Seconds an item may run before it is failed as hung: a kernel item `kernel_s` plus
    `per_gib_s` per GiB its case may hold on the device (scheduling.estimated_bytes: larger
    cases make larger inputs, compile longer and compare more), any other item `other_s`."""

    kernel_s: float
    per_gib_s: float
    other_s: float

    def __post_init__(self) -> None:
        if not (self.kernel_s > 0 and self.per_gib_s >= 0 and self.other_s > 0):
            raise ValueError(f"kernel_s, per_gib_s, other_s: expected > 0, >= 0, > 0, got "
                             f"{self.kernel_s}, {self.per_gib_s}, {self.other_s}")

    def for_case(self, op: registry.Operation, case: registry.Case) -> float:
        key = (self, op.name, case)
        if key not in _CASE_LIMITS:  # the work model per item cost 30 us of a 170 us hook
            _CASE_LIMITS[key] = (self.kernel_s + self.per_gib_s
                                 * scheduling.estimated_bytes(op, case) / 2**30)
        return _CASE_LIMITS[key]


_CASE_LIMITS: dict[tuple[Limits, str, registry.Case], float] = {}


# On a GPU the slowest kernel items (real-size attention: inputs, a float32 reference and its
# VJP of tens of GiB, first compiles) take about a minute; the harness's own tests that start
# child runs (perf history, asv tools) take minutes. Generous: a limit stops hangs, not slow
# items.
GPU_LIMITS = Limits(kernel_s=120.0, per_gib_s=10.0, other_s=1200.0)
# On a CPU only cases tagged "cpu" run, interpreted: seconds each on 2 cores.
CPU_LIMITS = Limits(kernel_s=300.0, per_gib_s=0.0, other_s=1200.0)
LIMIT_MARK = "item_limit"


# -- sticky device errors -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StickyError:
    """A CUDA error after which the process's context is unusable: the driver's name, the
    runtime's, and the text both give for it (cuGetErrorString)."""

    code: str
    runtime_name: str
    text: str

    def describe(self) -> str:
        return f"{self.code}: {self.text}"


STICKY_ERRORS = (
    StickyError("CUDA_ERROR_ILLEGAL_ADDRESS", "cudaErrorIllegalAddress",
                "an illegal memory access was encountered"),
    StickyError("CUDA_ERROR_LAUNCH_FAILED", "cudaErrorLaunchFailure",
                "unspecified launch failure"),
    StickyError("CUDA_ERROR_MISALIGNED_ADDRESS", "cudaErrorMisalignedAddress",
                "misaligned address"),
    StickyError("CUDA_ERROR_ILLEGAL_INSTRUCTION", "cudaErrorIllegalInstruction",
                "an illegal instruction was encountered"),
    StickyError("CUDA_ERROR_ASSERT", "cudaErrorAssert", "device-side assert triggered"),
    StickyError("CUDA_ERROR_HARDWARE_STACK_ERROR", "cudaErrorHardwareStackError",
                "hardware stack error"),
    StickyError("CUDA_ERROR_INVALID_PC", "cudaErrorInvalidPc", "invalid program counter"),
    StickyError("CUDA_ERROR_INVALID_ADDRESS_SPACE", "cudaErrorInvalidAddressSpace",
                "operation not supported on global/shared address space"),
    StickyError("CUDA_ERROR_LAUNCH_TIMEOUT", "cudaErrorLaunchTimeout",
                "the launch timed out and was terminated"),
    StickyError("CUDA_ERROR_ECC_UNCORRECTABLE", "cudaErrorECCUncorrectable",
                "uncorrectable ECC error encountered"),
)
_STICKY_PATTERN = re.compile("|".join(
    re.escape(word) for error in STICKY_ERRORS
    for word in (error.code, error.runtime_name, error.text)), re.IGNORECASE)
# Errors can carry whole HLO dumps: the CUDA error is near the start.
_SEARCHED_CHARS = 20_000


def sticky_error(text: str) -> str | None:
    """'CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered' where `text`
    names a sticky CUDA error by its driver name, runtime name or description; else None."""
    found = _STICKY_PATTERN.search(text[:_SEARCHED_CHARS])
    if found is None:
        return None
    word = found.group(0).lower()
    error = next(e for e in STICKY_ERRORS
                 if word in (e.code.lower(), e.runtime_name.lower(), e.text.lower()))
    return error.describe()


def _chain(error: BaseException) -> Iterable[BaseException]:
    """`error`, its causes and contexts, and the members of exception groups, each once."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__,
                 *getattr(current, "exceptions", ())]


def sticky_in_exception(error: BaseException) -> str | None:
    """The sticky CUDA error (`sticky_error`) that `error` or its chain names, else None."""
    for link in _chain(error):
        found = sticky_error(f"{type(link).__name__}: {link}")
        if found:
            return found
    return None


# -- the device check -----------------------------------------------------------------------

def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:300]


def _torch_health() -> str | None:
    """torch.cuda.synchronize() where this process's torch already started CUDA (Triton and
    the ctypes CUDA kernels run on torch's context and stream)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - any failure of the sync is the finding
        return sticky_in_exception(error) or _one_line(error)
    return None


def _jax_health() -> str | None:
    """A tiny JAX computation on the GPU where this process's JAX already started a GPU
    backend (never starts one: backends come up only from jax's own bookkeeping)."""
    if "jax" not in sys.modules:
        return None
    from kernels.core import compat

    device = compat.started_gpu_device()
    if device is None:
        return None
    import jax
    import numpy as np

    try:
        (jax.device_put(np.float32(1), device) + 1).block_until_ready()
    except Exception as error:  # noqa: BLE001 - any failure of the check is the finding
        return sticky_in_exception(error) or _one_line(error)
    return None


_PROBES: list[Callable[[], str | None]] = [_torch_health, _jax_health]


def add_health_probe(probe: Callable[[], str | None]) -> None:
    """Also ask `probe` (None: healthy, else a one-line reason) in every device check: test
    stand-ins for a device (kernels/testing/faults.py) say there that they were poisoned."""
    _PROBES.append(probe)


def device_health() -> str | None:
    """None where every started device backend works, else why not, in one line. Starts no
    backend; where none is started (a CPU run) it costs a few dictionary lookups."""
    for probe in _PROBES:
        reason = probe()
        if reason:
            return sticky_error(reason) or reason
    return None


# -- items ----------------------------------------------------------------------------------

def _kernel_param(item: pytest.Item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("kernel_item"), params.get("bad_input_item")


def _kernel_label(impl_id: str, case_id: str, distribution: str) -> str:
    return f"{impl_id} {case_id} ({distribution} inputs)"


def describe_item(item: pytest.Item) -> str:
    """'softmax-cuda f32-37x128 (normal inputs)' for a kernel item, the implementation and
    the bad input for a bad-input item, else the test's name."""
    kernel_item, bad_input = _kernel_param(item)
    if kernel_item is not None:
        return _kernel_label(kernel_item.impl.id, kernel_item.case.id, kernel_item.distribution)
    if bad_input is not None:
        impl, bad = bad_input
        return f"{impl.id} given {bad.label}"
    return item.name


def is_device_item(item: pytest.Item) -> bool:
    """Whether the item runs kernels: kernel and bad-input items, and anything marked gpu."""
    return any(p is not None for p in _kernel_param(item)) or \
        item.get_closest_marker("gpu") is not None


def item_limit(item: pytest.Item, fixed: float | None, on_gpu: bool) -> tuple[float, str]:
    """(seconds, where the limit comes from) for `item`: its `item_limit(seconds)` mark, else
    `fixed` (--item-limit), else its case's (`Limits.for_case`), else the platform's default;
    0 means no limit."""
    mark = item.get_closest_marker(LIMIT_MARK)
    if mark is not None:
        return float(mark.args[0]), "its item_limit mark"
    if fixed is not None:
        return fixed, "--item-limit"
    limits = GPU_LIMITS if on_gpu else CPU_LIMITS
    kernel_item, _ = _kernel_param(item)
    if kernel_item is not None:
        op = registry.operation(kernel_item.impl.op)
        return limits.for_case(op, kernel_item.case), "the limit for this case's size"
    return limits.other_s, "the default limit"


def _key(nodeid: str) -> str:
    return hashlib.sha1(nodeid.encode()).hexdigest()[:16]


def _write_json(path: str, data: dict) -> None:
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as out:
        json.dump(data, out)
    os.replace(partial, path)


def _frame_text(filename: str, line: int | str, function: str) -> str:
    return f"{os.path.basename(filename)}:{line} {function}"


def _where(frame, test_file: str | None) -> str:
    """'test_kernels.py:27 test_matches_reference -> pallas.py:88 kernel': the test's frame and
    the innermost one."""
    inner = _frame_text(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    outer = frame
    while outer is not None and os.path.abspath(outer.f_code.co_filename) != test_file:
        outer = outer.f_back
    if outer is None or outer is frame:
        return inner
    test = _frame_text(outer.f_code.co_filename, outer.f_lineno, outer.f_code.co_name)
    return f"{test} -> {inner}"


# -- options ---------------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("isolation", "fault containment (kernels/testing/isolation.py)")
    group.addoption("--no-isolation", action="store_true", dest="no_isolation",
                    help="no per-item time limit, device check or worker replacement after a "
                    "fault (a crash, hang or sticky device fault then costs what it costs)")
    group.addoption("--item-limit", type=_seconds, default=None, dest="item_limit",
                    metavar="SECONDS", help="one time limit for every item, instead of the "
                    "per-case ones (0: none); an item_limit(seconds) mark still wins")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value < float("inf")):
        raise pytest.UsageError(f"--item-limit: expected seconds >= 0, got {text!r}")
    return value


def _on_gpu() -> bool:
    from kernels.core import environment

    return environment.nvidia_gpu_present()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("no_isolation"):
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if "kernelperf_isolation_dir" in workerinput:
            config.pluginmanager.register(
                _Worker(config, workerinput["kernelperf_isolation_dir"],
                        workerinput["workerid"]), "kernelperf-isolation-worker")
        return
    if config.getoption("collectonly"):
        return
    if getattr(config.option, "numprocesses", None) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Controller(config), "kernelperf-isolation-controller")
    else:
        config.pluginmanager.register(_Worker(config, None, None),
                                      "kernelperf-isolation-in-process")


def controller(config: pytest.Config) -> _Controller | None:
    """The run's controller-side plugin, when isolation is on under xdist workers."""
    return config.pluginmanager.get_plugin("kernelperf-isolation-controller")


@contextlib.contextmanager
def waiting(config: pytest.Config) -> Iterator[None]:
    """No time limit while the body runs, and the item's whole limit again after it: an item
    waiting its turn on the device (kernels/testing/perf_phase.py) is not hung, however long
    the rest of the run takes."""
    worker = config.pluginmanager.get_plugin("kernelperf-isolation-worker") or \
        config.pluginmanager.get_plugin("kernelperf-isolation-in-process")
    armed = worker.armed if worker is not None else None
    if armed is None:
        yield
        return
    worker._disarm()
    try:
        yield
    finally:
        worker._rearm(armed)


# -- the process that runs items (an xdist worker, or the only process with -n 0) -----------

@dataclasses.dataclass(frozen=True)
class _Armed:
    deadline: float
    limit: float
    source: str
    nodeid: str
    label: str
    test_file: str


class _Worker:
    """Runs in the process that runs the items: the watchdog, the device check, and the
    retirement of a poisoned xdist worker. `directory` is None without workers (-n 0)."""

    def __init__(self, config: pytest.Config, directory: str | None, worker_id: str | None):
        self.config = config
        self.directory = directory
        self.worker_id = worker_id
        self.on_gpu = _on_gpu()
        self.fixed_limit = config.getoption("item_limit")
        self.poisoned: str | None = None  # what faulted: "softmax-cuda ... faulted (...)"
        self.poisoned_by: str | None = None  # the node id of the item that showed it
        self.armed: _Armed | None = None
        self.main_thread = threading.main_thread().ident
        self.cost_s = 0.0  # CPU time of this plugin's per-item hooks
        self.items = 0
        self.fault_file = None
        # Without workers, the watchdog's line goes to the terminal: a dup of stderr taken
        # now, while pytest's capture is suspended (as its faulthandler plugin does).
        self.stderr_fd = os.dup(2) if directory is None else None

    @property
    def replaceable(self) -> bool:
        return self.directory is not None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # After pytest's faulthandler plugin: a worker's fatal-signal record goes to a file
        # the controller reads when the worker dies (a worker's stderr does not reach it).
        if self.replaceable:
            self.fault_file = open(os.path.join(self.directory, f"fault-{self.worker_id}.txt"),
                                   "w")
            faulthandler.enable(file=self.fault_file, all_threads=True)
        threading.Thread(target=self._watch, name="kernelperf-isolation-watchdog",
                         daemon=True).start()

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        if self.replaceable:
            return []
        return ["kernelperf: fault isolation needs xdist workers (-n N): in one process a "
                "crash ends the run, a hang ends it after the item's limit (naming the item), "
                "and after a sticky device fault the remaining device items skip, naming it"]

    # -- the watchdog ----------------------------------------------------------------------

    def _watch(self) -> None:
        # Polls rather than waits on a condition: arming is then one attribute store on the
        # main thread (a notify per item woke this thread and convoyed on the GIL).
        while True:
            time.sleep(POLL_S)
            armed = self.armed
            if armed is not None and time.monotonic() > armed.deadline:
                self._expire(armed)

    def _expire(self, armed: _Armed) -> None:
        frames = sys._current_frames()
        stacks = "".join(
            f"--- thread {ident}{' (main)' if ident == self.main_thread else ''}\n"
            + "".join(traceback.format_stack(frame))
            for ident, frame in frames.items() if ident != threading.get_ident())
        main = frames.get(self.main_thread)
        where = _where(main, armed.test_file) if main is not None else "an unknown frame"
        line = (f"timeout in {armed.label}: no result after {armed.limit:g} s "
                f"({armed.source}), at {where}")
        if self.replaceable:
            path = os.path.join(self.directory, f"stacks-{_key(armed.nodeid)}.txt")
            with open(path, "w") as out:
                out.write(stacks)
            _write_json(os.path.join(self.directory, f"reason-{_key(armed.nodeid)}.json"),
                        {"nodeid": armed.nodeid, "kind": "timeout",
                         "message": f"{line}; worker {self.worker_id} ended (stacks: {path})"})
        else:
            os.write(self.stderr_fd, (
                f"\n{stacks}\nkernelperf: {armed.nodeid}: {line}\nkernelperf: the run ends "
                f"here: a hung kernel cannot be stopped inside its process; under xdist "
                f"workers (-n N) the item fails and the run goes on\n").encode())
        os._exit(EXIT_TIMEOUT)

    def _arm(self, item: pytest.Item) -> None:
        limit, source = item_limit(item, self.fixed_limit, self.on_gpu)
        if limit <= 0:
            return
        self.armed = _Armed(time.monotonic() + limit, limit, source, item.nodeid,
                            describe_item(item), os.path.abspath(str(item.path)))
        # The C watchdog writes its stacks where the controller reads them, then exits.
        faulthandler.dump_traceback_later(
            limit + GRACE_S, exit=True,
            file=self.fault_file if self.replaceable else self.stderr_fd)

    def _rearm(self, armed: _Armed) -> None:
        """`armed` again, its whole limit from now."""
        self.armed = dataclasses.replace(armed, deadline=time.monotonic() + armed.limit)
        faulthandler.dump_traceback_later(
            armed.limit + GRACE_S, exit=True,
            file=self.fault_file if self.replaceable else self.stderr_fd)

    def _disarm(self) -> None:
        if self.armed is not None:
            self.armed = None
            faulthandler.cancel_dump_traceback_later()

    @pytest.hookimpl(tryfirst=True)
    def pytest_enter_pdb(self) -> None:
        self._disarm()  # a person at the debugger is not a hang

    # -- per item --------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        start = time.thread_time()
        if self.poisoned:
            if self.replaceable:
                # Nothing of this item ran or was reported (pytest_runtest_logstart comes
                # later): the controller hands it, and the rest of this worker's queue, to a
                # fresh worker.
                self._retire(item.nodeid)
            if is_device_item(item):
                item.add_marker(pytest.mark.skip(reason=(
                    f"not run: the device is unusable since {self.poisoned}; only xdist "
                    f"workers (-n N) can replace the process and go on")))
        self._arm(item)
        self.cost_s += time.thread_time() - start
        try:
            return (yield)
        finally:
            start = time.thread_time()
            self._disarm()
            self.items += 1
            self.cost_s += time.thread_time() - start
            if self.poisoned and self.replaceable and nextitem is None:
                # The last item of this worker: end it before session teardown and the
                # other plugins' end-of-run work touch the poisoned context. Its reports
                # are in; the controller only notes it finished.
                self._retire(item.nodeid)

    def _retire(self, nodeid: str) -> None:
        """End this poisoned worker, leaving the controller a note keyed by `nodeid`."""
        _write_json(os.path.join(self.directory, f"reason-{_key(nodeid)}.json"),
                    {"nodeid": nodeid, "kind": "retired",
                     "message": f"{self.poisoned}, worker {self.worker_id} replaced"})
        os._exit(EXIT_POISONED)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        start = time.thread_time()
        if self.poisoned:
            if report.failed and call.when == "teardown" and self.poisoned_by == item.nodeid:
                # The teardown of the item that faulted fails on the same dead context:
                # its one line already says why.
                report.outcome, report.longrepr = "passed", None
        else:
            reason, found = None, ""
            if call.excinfo is not None and not call.excinfo.errisinstance(
                    pytest.skip.Exception):
                reason = sticky_in_exception(call.excinfo.value)
                found = f"raised in its {call.when}"
            if reason is None and call.when in ("call", "teardown"):
                reason = device_health()
                found = f"found by the device check after its {call.when}"
            if reason:
                self._poison(item, report, reason, found)
        self.cost_s += time.thread_time() - start
        return report

    def _poison(self, item: pytest.Item, report: pytest.TestReport, reason: str,
                found: str) -> None:
        label = describe_item(item)
        self.poisoned, self.poisoned_by = f"{label} faulted ({reason})", item.nodeid
        after = (f"worker {self.worker_id} replaced, the items queued behind it run on a "
                 f"fresh one" if self.replaceable else
                 "the remaining device items skip (one process: -n 0)")
        if self.replaceable and report.longrepr is not None:
            # The traceback where the error surfaced, for whoever wants more than the line.
            path = os.path.join(self.directory, f"traceback-{_key(item.nodeid)}.txt")
            with open(path, "w") as out:
                out.write(str(report.longrepr))
            after += f"; traceback: {path}"
        report.outcome = "failed"
        report.longrepr = f"device fault in {label}: {reason}, {found}; {after}"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[_WORKER_KEY] = json.dumps({"items": self.items, "cost_s": self.cost_s})

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
            self.stderr_fd = None

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.items:
            terminalreporter.write_line(
                f"kernelperf isolation: {self.cost_s / self.items * 1e6:.0f} us of CPU per "
                f"item for the time limit and device check ({self.items} items)")
        if self.poisoned:
            terminalreporter.write_line(f"kernelperf isolation: {self.poisoned}; the device "
                                        f"items after it were skipped")


# -- the xdist controller ---------------------------------------------------------------------

class _Controller:
    """Runs in the xdist controller: names the fault of a dead worker's item in one line and
    decides which of its items are failed and which requeued (ReplacementFixes asks)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.directory = tempfile.mkdtemp(prefix="kernelperf-isolation-")
        self.started: set[str] = set()
        self.finished: set[str] = set()
        self.requeued: dict[str, int] = {}
        self.contained: list[str] = []  # one line per fault failed here
        self.between: list[str] = []  # deaths between items, with what is known
        self.workers: list[dict] = []
        self._labels: dict[str, str] | None = None
        # xdist's own default, kept for deaths that are not contained faults (a worker that
        # crashes while collecting would otherwise be restarted without end).
        self.user_restarts = config.option.maxworkerrestart is not None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput["kernelperf_isolation_dir"] = self.directory

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        fixed = config.getoption("item_limit")
        limits = GPU_LIMITS if _on_gpu() else CPU_LIMITS
        limit = ("none, --item-limit 0" if fixed == 0 else
                 f"{fixed:g} s per item (--item-limit)" if fixed is not None else
                 f"kernel items {limits.kernel_s:g} s + {limits.per_gib_s:g} s per GiB of "
                 f"their case, other items {limits.other_s:g} s")
        return [f"kernelperf: fault isolation: a crash, a hang past its limit ({limit}) or a "
                f"sticky device fault fails its own item, and a fresh worker takes the rest "
                f"(--no-isolation: off)"]

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.started.add(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        self.finished.add(nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        text = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if text:
            self.workers.append(json.loads(text))

    # -- what a dead worker's items become ---------------------------------------------------

    def label(self, nodeid: str) -> str:
        """describe_item's words for a node id the controller never collected."""
        if self._labels is None:
            self._labels = {}
            for op in registry.operations():
                for impl in registry.implementations(op.name):
                    for case in op.cases:
                        for distribution in op.distributions:
                            self._labels[f"{impl.id}-{case.id}-{distribution}"] = \
                                _kernel_label(impl.id, case.id, distribution)
        param = nodeid[nodeid.rfind("[") + 1:-1] if nodeid.endswith("]") else ""
        return self._labels.get(param) or nodeid.rsplit("::", 1)[-1]

    def _reason_file(self, nodeid: str) -> dict | None:
        """The note a worker left about `nodeid` before it ended ("timeout" or "retired"),
        read once."""
        path = os.path.join(self.directory, f"reason-{_key(nodeid)}.json")
        try:
            with open(path) as source:
                reason = json.load(source)
        except (OSError, ValueError):
            return None
        os.unlink(path)
        return reason

    def _fault_record(self, worker_id: str, nodeid: str) -> str | None:
        """One line from the worker's faulthandler file: 'Fatal Python error: Aborted at
        test_x.py:22 test_y -> lib.py:40 f', or for its C watchdog 'no result after
        0:00:25 with the GIL held ... at ...'."""
        try:
            with open(os.path.join(self.directory, f"fault-{worker_id}.txt")) as source:
                text = source.read().strip()
        except OSError:
            return None
        if not text:
            return None
        head, blocks = text.splitlines()[0], text.split("\n\n")
        # The thread that ran the item: 'Current thread' for a fatal signal; for the C
        # watchdog (which has no current thread) the one inside pytest's runner.
        block = next((b for b in blocks if b.startswith("Current thread")), None) or \
            next((b for b in blocks if "_pytest/runner.py" in b), blocks[-1])
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        where = ""
        if frames:
            test_file = nodeid.split("::")[0]
            test = next((f for f in frames if f[0].endswith(test_file)), None)
            inner = _frame_text(*frames[0])
            where = f" at {inner}" if test in (None, frames[0]) else \
                f" at {_frame_text(*test)} -> {inner}"
        if head.startswith("Timeout ("):
            return (f"no result after {head[len('Timeout ('):].split(')')[0]} with the GIL "
                    f"held, ended by faulthandler's watchdog{where}")
        return f"{head.rstrip(':')}{where}"

    @staticmethod
    def _exit_status(node) -> str:
        try:  # execnet's Popen of the worker (private: execnet/gateway_io.py)
            code = node.gateway._io.popen.wait(timeout=2)
        except Exception:  # noqa: BLE001 - no status is not worth failing the report for
            return "exit status unknown"
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return _EXIT_WORDS.get(code, f"exit {code}")

    def blame(self, nodeid: str, node) -> str:
        """The one line for `nodeid`, which started on the dead worker `node` and did not
        finish."""
        worker_id = node.gateway.id
        reason = self._reason_file(nodeid)
        if reason is not None and reason["kind"] == "timeout":
            line = reason["message"]
        else:
            fault = self._fault_record(worker_id, nodeid)
            how = self._exit_status(node)
            line = (f"{'timeout' if fault and fault.startswith('no result') else 'crash'} in "
                    f"{self.label(nodeid)}: {fault or 'no Python fault record'} "
                    f"(worker {worker_id} {how}; replaced)")
        self._contained(line)
        return line

    def settle(self, node, workload: dict[str, dict[str, bool]]) -> str | None:
        """Mark in `workload` (scope -> {nodeid: completed}) of the dead worker `node` what
        must not run again: items whose reports are all in, and the item it died in, which
        is returned for xdist to report (handle_crashitem). Items that never started stay
        pending and are requeued; one that has killed REQUEUE_LIMIT workers before starting
        is returned instead."""
        for unit in workload.values():
            for nodeid, completed in unit.items():
                if completed:
                    continue
                if nodeid in self.finished:  # ended after its reports (a poisoned last item)
                    unit[nodeid] = True
                    reason = self._reason_file(nodeid)
                    if reason is not None:
                        self._contained(reason["message"])
                    continue
                if nodeid in self.started:
                    unit[nodeid] = True
                    return nodeid  # reported by pytest_handlecrashitem, with blame()'s line
                reason = self._reason_file(nodeid)
                if reason is not None and reason["kind"] == "retired":
                    # The item that showed the fault reported it; this one never started.
                    self._contained(reason["message"])
                    return None
                self.requeued[nodeid] = self.requeued.get(nodeid, 0) + 1
                fault = self._fault_record(node.gateway.id, nodeid) or "no Python fault record"
                if self.requeued[nodeid] > REQUEUE_LIMIT:
                    unit[nodeid] = True
                    return nodeid
                self.between.append(f"worker {node.gateway.id} died between items "
                                    f"({fault}; {self._exit_status(node)}); its queue, from "
                                    f"{nodeid}, was requeued")
                return None
        return None

    def _contained(self, line: str) -> None:
        """Count a contained fault. It costs no restart of xdist's --max-worker-restart budget
        (unless the user set it): that budget is for workers that die for other reasons."""
        self.contained.append(line)
        dsession = self.config.pluginmanager.get_plugin("dsession")
        if not self.user_restarts and getattr(dsession, "_max_worker_restart", None) is not None:
            dsession._max_worker_restart += 1

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report, sched) -> None:
        node = report.node
        if not isinstance(sched, ReplacementFixes):
            # xdist's load and worksteal schedulers: they requeued the rest themselves.
            if crashitem not in self.started:
                reason = self._reason_file(crashitem)
                self.requeued[crashitem] = self.requeued.get(crashitem, 0) + 1
                if reason is not None and reason["kind"] == "retired":
                    self._contained(reason["message"])
                if (reason and reason["kind"] == "retired") or \
                        self.requeued[crashitem] <= REQUEUE_LIMIT:
                    try:
                        sched.mark_test_pending(crashitem)
                    except NotImplementedError:  # --dist each: no requeue there
                        pass
                    else:
                        report.outcome = "rerun"  # not a result: it runs on a fresh worker
                        report.longrepr = f"not started on worker {node.gateway.id}; requeued"
                        return
        line = self.blame(crashitem, node) if crashitem in self.started else (
            f"{self.label(crashitem)}: killed {self.requeued.get(crashitem, 0)} workers "
            f"before it started ({self._fault_record(node.gateway.id, crashitem)})")
        report.longrepr = line
        # xdist says "???", which junitxml files as an error in setup; the header names the
        # test, not its file.
        report.when = "call"
        report.location = (report.location[0], None, crashitem.split("::", 1)[-1])

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        if report.outcome == "rerun":
            return "rerun", "R", ("RERUN", {"yellow": True})
        return None

    def pytest_terminal_summary(self, terminalreporter) -> None:
        items = sum(w["items"] for w in self.workers)
        if items:
            cost = sum(w["cost_s"] for w in self.workers)
            terminalreporter.write_line(
                f"kernelperf isolation: {cost / items * 1e6:.0f} us of CPU per item for the "
                f"time limit and device check ({items} items of workers that ended normally)")
        for line in self.between:
            terminalreporter.write_line(f"kernelperf isolation: {line}")
        if self.contained or self.between:
            first = f" (first: {self.contained[0]})" if self.contained else ""
            terminalreporter.write_line(
                f"kernelperf isolation: {len(self.contained)} fault(s) contained, each failing "
                f"its own item{first}; records kept in {self.directory}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if not (self.contained or self.between):
            shutil.rmtree(self.directory, ignore_errors=True)


# -- scheduling ---------------------------------------------------------------------------------

class ReplacementFixes:
    """Mixin for xdist's LoadScopeScheduling family (loadscope, loadfile, loadgroup; xdist
    3.8.0) where workers are replaced after faults; without the isolation controller (with
    --no-isolation) it leaves xdist's behaviour as it is, bugs included.

    * remove_node: the controller (`_Controller.settle`) marks the dead worker's finished
      items and the item it died in as done, so loadscope's requeue of the worker's whole
      workload does not run the crashed item again on every replacement; units with nothing
      left are dropped (they would be sent as empty batches, on which a worker waits).
    * _reschedule skips a replacement whose collection has not arrived: it joins
      `sched.nodes` at workerready, and assigning it a unit then raised KeyError after the
      unit was recorded as its own (the unit was lost; the run ended in an INTERNALERROR).
    * schedule() tops each node up to two pending items: a joining worker got one unit, and
      a worker starts an item only once it holds the next one too (xdist remote.py), so with
      one-item units the run stalled.
    """

    def _isolating(self) -> bool:
        return controller(self.config) is not None

    def remove_node(self, node) -> str | None:
        if not self._isolating():
            return super().remove_node(node)
        workload = self.assigned_work.pop(node)
        if not self._pending_of(workload):
            return None
        crashitem = controller(self.config).settle(node, workload)
        for scope in [scope for scope, unit in workload.items() if all(unit.values())]:
            del workload[scope]
        self.workqueue.update(workload)
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node) -> None:
        if self._isolating() and node not in self.registered_collections:
            return
        super()._reschedule(node)

    def schedule(self) -> None:
        initial = self.collection is None
        super().schedule()
        if initial or not self._isolating():
            return
        for node in self.nodes:
            while (node in self.registered_collections and self.workqueue
                   and not node.shutting_down and self._pending_of(self.assigned_work[node]) < 2):
                self._assign_work_unit(node)
