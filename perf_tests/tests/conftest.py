"""pytest set-up of the performance tests: device, measurements, pytest-benchmark's storage.

This folder has no __init__.py on purpose: asv imports every module of the
perf_tests package while discovering benchmarks, and these are pytest's, not
asv's. Its name starts with "test" so pytest loads this conftest before
pytest-benchmark opens its storage (pytest's initial conftests include the
test* folders of each testpath).

History is kept per device model: unless `--benchmark-storage` is given, runs are
saved under `.benchmarks/<model>/` (e.g. `.benchmarks/nvidia-h100-80gb-hbm3/`),
and every saved run carries the device fingerprint in its machine_info. When a
run is compared with a saved one (`--benchmark-compare`), the saved records'
clock methods and device model are kept here so each test can refuse a
comparison across clocks or models. After the run, a table gives every
kernel's value against its floor, and one line says what the perf items judged
(`perfcheck.finding`: a GPU model without floors is named with the bring-up command).

Under xdist workers (kernels/testing/perf_phase.py) the perf items run on one worker: the
first warms them all up while the other workers run (`warmed_perf_items`), and the worker
hands its table rows and device to the controller, which prints them.
"""

from __future__ import annotations

import time

import pytest

from kernels.bench import perfcheck
from kernels.core import fingerprint
from kernels.roofline import floors
from kernels.testing import perf_phase

DEFAULT_STORAGE = "file://./.benchmarks"  # pytest-benchmark's own default
SAVED = pytest.StashKey[dict]()
VERDICTS = pytest.StashKey[list]()  # table rows: (kernel, value, floor, verdict, speedup, clock)
DEVICE = pytest.StashKey[dict]()  # the timed device: name, platform, floors or not, CPU kernels
_OUTPUT_KEY = "kernelperf_perf_verdicts"  # an xdist worker's rows and device


def pytest_configure(config: pytest.Config) -> None:
    # Runs before pytest-benchmark's own pytest_configure (trylast), which opens the storage.
    # The device is read only when history is saved or compared: on a GPU, reading it here
    # would give pytest's own process (an xdist controller, say) a CUDA context.
    history = any(config.getoption(name, None) for name in
                  ("benchmark_save", "benchmark_autosave", "benchmark_compare"))
    if history and config.getoption("benchmark_storage", None) == DEFAULT_STORAGE:
        config.option.benchmark_storage = perfcheck.default_storage(
            fingerprint.fingerprint().model)
    config.stash[VERDICTS] = []


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    # An xdist controller has the timing worker's already (perf_phase); reading the device
    # there would start a CUDA context in a process that never times.
    if "kernelperf" not in machine_info:
        machine_info["kernelperf"] = fingerprint.fingerprint().to_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_compare_machine_info(config: pytest.Config, benchmarksession,
                                          machine_info: dict, compared_benchmark: dict) -> None:
    """Keep, per test, the clock method and device of the saved run it is compared with."""
    saved = config.stash.setdefault(SAVED, {})
    device = compared_benchmark.get("machine_info", {}).get("kernelperf")
    source = f"{compared_benchmark.get('commit_info', {}).get('id', '?')[:12]} " \
             f"({compared_benchmark.get('datetime', '?')})"
    for bench in compared_benchmark.get("benchmarks", []):
        saved[bench["fullname"]] = (bench.get("extra_info", {}), device, source)


@pytest.fixture(scope="session")
def perf_session() -> perfcheck.PerfSession:
    device = fingerprint.fingerprint()
    return perfcheck.PerfSession(device, perfcheck.stopping_rule(device))


@pytest.fixture(scope="session")
def warmed_perf_items(request: pytest.FixtureRequest, perf_session: perfcheck.PerfSession
                      ) -> None:
    """In an xdist worker that will wait for the device (perf_phase.will_wait), every perf
    item of this session warmed up first, with its baselines (`PerfSession.warm_up`), while
    the other workers still run: compiling, autotuning and making inputs then cost the run
    nothing, and the wait for the device is the sampling alone. Elsewhere, nothing."""
    config = request.config
    if not perf_phase.will_wait(config):
        return
    items = {item.id: item for item in perfcheck.perf_items()}
    start, ran = time.monotonic(), 0
    for node in request.session.items:
        perf_id = getattr(getattr(node, "callspec", None), "params", {}).get("perf_id")
        if perf_id in items and perf_phase.in_perf_group(node) \
                and node.get_closest_marker("skip") is None:
            item = items[perf_id]
            ran += perf_session.warm_up(item.impl, item.case, item.direction)
    perf_phase.note_warm_up(config, time.monotonic() - start, ran)


@pytest.fixture
def saved_record(request: pytest.FixtureRequest):
    """(extra_info, device, source) of the saved run this test is compared with, or None."""
    return request.config.stash.get(SAVED, {}).get(request.node.nodeid)


def table_row(item_id: str, verdict: perfcheck.Verdict) -> tuple[str, ...]:
    """One row of the `kernelperf floors` table."""
    floor = verdict.floor
    return (item_id,
            "-" if verdict.value is None else f"{verdict.value:.3f}",
            "-" if floor is None else floor.describe(),
            verdict.status,
            "-" if verdict.speedup is None else f"{verdict.speedup:.2f}x",
            verdict.method)


@pytest.fixture
def report_verdict(request: pytest.FixtureRequest, perf_session: perfcheck.PerfSession):
    """Adds (test id, verdict) to the end-of-run floor table, and the device to its line."""
    return _reporter(request.config, perf_session)


def _reporter(config: pytest.Config, perf_session: perfcheck.PerfSession):
    def report(item_id: str, verdict: perfcheck.Verdict) -> None:
        device = perf_session.device
        config.stash[VERDICTS].append(table_row(item_id, verdict))
        config.stash[DEVICE] = {
            "name": device.name, "platform": device.platform,
            "has_floors": device.platform == "gpu" and floors.table(device.name) is not None,
            "timed": ", ".join(f"{o}-{i}" for o, i in sorted(perfcheck.CPU_IMPLEMENTATIONS))}

    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workeroutput") and config.stash.get(VERDICTS, []):
        config.workeroutput[_OUTPUT_KEY] = {"rows": config.stash[VERDICTS],
                                            "device": config.stash[DEVICE]}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    shipped = getattr(node, "workeroutput", {}).get(_OUTPUT_KEY)
    if shipped:
        node.config.stash.setdefault(VERDICTS, []).extend(tuple(row) for row in shipped["rows"])
        node.config.stash[DEVICE] = shipped["device"]


@pytest.hookimpl(trylast=True)  # the finding is the run's last line before pytest's own
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    verdicts = config.stash.get(VERDICTS, [])
    if not verdicts:
        return
    terminalreporter.section("kernelperf floors")
    rows = [("kernel", "value", "floor", "verdict", "speedup", "clock"), *verdicts]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        terminalreporter.write_line("  ".join(cell.ljust(w) for cell, w in zip(row, widths,
                                                                              strict=True)))
    device = config.stash[DEVICE]
    statuses: dict[str, int] = {}
    for row in verdicts:
        statuses[row[3]] = statuses.get(row[3], 0) + 1
    terminalreporter.write_line(perfcheck.finding(
        device_name=device["name"], platform=device["platform"],
        has_floors=device["has_floors"], statuses=statuses, timed=device["timed"]))
