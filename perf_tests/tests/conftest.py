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
kernel's value against its floor.
"""

from __future__ import annotations

import pytest

from kernels.bench import perfcheck
from kernels.core import fingerprint

DEFAULT_STORAGE = "file://./.benchmarks"  # pytest-benchmark's own default
SAVED = pytest.StashKey[dict]()
VERDICTS = pytest.StashKey[list]()


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


@pytest.fixture
def saved_record(request: pytest.FixtureRequest):
    """(extra_info, device, source) of the saved run this test is compared with, or None."""
    return request.config.stash.get(SAVED, {}).get(request.node.nodeid)


@pytest.fixture
def report_verdict(request: pytest.FixtureRequest):
    """Adds (test id, verdict) to the end-of-run floor table."""
    return lambda item_id, verdict: request.config.stash[VERDICTS].append((item_id, verdict))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    verdicts = config.stash.get(VERDICTS, [])
    if not verdicts:
        return
    terminalreporter.section("kernelperf floors")
    rows = [("kernel", "value", "floor", "verdict", "speedup", "clock")]
    for item_id, verdict in verdicts:
        floor = verdict.floor
        rows.append((item_id,
                     "-" if verdict.value is None else f"{verdict.value:.3f}",
                     "-" if floor is None else floor.describe(),
                     verdict.status,
                     "-" if verdict.speedup is None else f"{verdict.speedup:.2f}x",
                     verdict.method))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        terminalreporter.write_line("  ".join(cell.ljust(w) for cell, w in zip(row, widths,
                                                                              strict=True)))
