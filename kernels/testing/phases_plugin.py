"""pytest plugin: the phase breakdown of the kernel checks, the reference cache's hit rate and
each process's peak device memory, printed at the end of a run.

Items report their phases through `record_property(PROPERTY, {...})`; pytest ships
user properties from xdist workers to the controller with every report, so the
controller sums them whether or not the run is distributed. Workers hand their
cache counts and memory peaks over when they finish (`workeroutput`).
$KERNELPERF_PHASES_JSONL names a file that gets one JSON line per item as it
finishes (a run stopped half-way still leaves its breakdown there).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from kernels.core import phases

PROPERTY = "kernelperf_phases"
JSONL_VARIABLE = "KERNELPERF_PHASES_JSONL"
_KEY = "kernelperf_phases_worker"


class _State:
    def __init__(self) -> None:
        self.records: list[phases.ItemRecord] = []
        self.workers: list[dict] = []
        self.local: dict | None = None
        self.start = time.perf_counter()
        self.jsonl = os.environ.get(JSONL_VARIABLE) or None


# The run's state: pytest_runtest_logreport receives no config to hang it on.
_STATE: _State | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _STATE
    _STATE = config._kernelperf_phases = _State()


def _process_report() -> dict:
    """This process's reference-cache counts and peak device memory (JAX's allocator and
    torch's), where a GPU was used."""
    from kernels.core import checking, compat

    cache = checking.shared_references()
    report = {"cache_hits": cache.hits, "cache_misses": cache.misses, "pid": os.getpid()}
    if compat.on_gpu():
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        report["jax_peak_bytes"] = int(stats.get("peak_bytes_in_use", 0))
        report["jax_pool_bytes"] = int(stats.get("pool_bytes", stats.get("bytes_reserved", 0)))
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                report["torch_peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        except ImportError:
            pass
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    report = _process_report()
    if hasattr(config, "workeroutput"):  # an xdist worker: report to the controller
        config.workeroutput[_KEY] = json.dumps(report)
    else:  # counted only where no worker reports (a run in this one process)
        config._kernelperf_phases.local = report


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    text = getattr(node, "workeroutput", {}).get(_KEY)
    if text:
        node.config._kernelperf_phases.workers.append(json.loads(text))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    values = dict(report.user_properties).get(PROPERTY) if report.when == "call" else None
    if not values or _STATE is None:
        return
    record = phases.ItemRecord(nodeid=report.nodeid, op=values.get("op", "?"),
                               duration=report.duration, seconds=values.get("seconds", {}))
    _STATE.records.append(record)
    if _STATE.jsonl:
        with open(_STATE.jsonl, "a") as f:
            f.write(json.dumps({"nodeid": record.nodeid, "op": record.op,
                                "duration": record.duration,
                                "seconds": dict(record.seconds)}) + "\n")


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state: _State = config._kernelperf_phases
    workers = state.workers or ([state.local] if state.local else [])
    wall = time.perf_counter() - state.start
    lines = phases.summarize(state.records, wall=wall, workers=max(1, len(workers)))
    if workers:
        hits = sum(w.get("cache_hits", 0) for w in workers)
        misses = sum(w.get("cache_misses", 0) for w in workers)
        if hits + misses:
            lines.append(f"  references: {misses} computed, {hits} reused from the cache "
                         f"({hits / (hits + misses):.0%})")
        peaks = [w.get("jax_peak_bytes", 0) + w.get("torch_peak_reserved_bytes", 0)
                 for w in workers]
        if any(peaks):
            lines.append(f"  device memory, peak per process (JAX in use + torch reserved): "
                         f"max {_gib(max(peaks))}, sum over {len(peaks)} processes "
                         f"{_gib(sum(peaks))}")
    for line in lines:
        terminalreporter.write_line(line)
