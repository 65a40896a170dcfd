"""pytest plugin: the persistent compilation cache on for the run, its hit rate at the end.

With xdist, each worker counts its own compiles and hands the counts to the
controller when it finishes (`workeroutput`), which sums them.
"""

from __future__ import annotations

import pytest

from kernels.core import compilation_cache

_KEY = "kernelperf_compilation_cache"


def pytest_configure(config: pytest.Config) -> None:
    config._kernelperf_cache_dir = compilation_cache.enable()
    config._kernelperf_cache_stats = compilation_cache.Stats().listen()


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    stats = config._kernelperf_cache_stats
    stats.stop()
    if hasattr(config, "workeroutput"):  # an xdist worker: report to the controller
        config.workeroutput[_KEY] = {"requests": stats.requests, "hits": stats.hits}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    counts = getattr(node, "workeroutput", {}).get(_KEY)
    if counts:
        node.config._kernelperf_cache_stats.add(compilation_cache.Stats(**counts))


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    stats = config._kernelperf_cache_stats
    terminalreporter.write_line(f"kernelperf: {stats.summary(config._kernelperf_cache_dir)}")
