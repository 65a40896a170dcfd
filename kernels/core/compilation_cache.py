"""JAX's persistent compilation cache for test and benchmark runs, and its hit rate.

`enable()` points JAX at a cache folder before anything compiles: by default
~/.cache/kernelperf/jax-compilation; `KERNELPERF_COMPILATION_CACHE=<dir>`
chooses another, `=off` disables it (and a cache JAX was already given through
JAX_COMPILATION_CACHE_DIR is left as it is). Every compilation is cached, not
only those over JAX's default one second: a suite of small kernels is mostly
short compiles, and the Pallas and Triton ones are not.

`Stats` counts, through JAX's monitoring events, the compiles that asked the
cache and those it answered; the pytest plugin
(kernels/testing/compilation_cache_plugin.py) prints the hit rate after a test run,
summed over xdist workers.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from kernels.core import compat

VARIABLE = "KERNELPERF_COMPILATION_CACHE"
DEFAULT_DIR = pathlib.Path.home() / ".cache" / "kernelperf" / "jax-compilation"
_OFF = ("off", "0", "false", "no", "none")


def configured_dir() -> pathlib.Path | None:
    """The cache folder asked for by $KERNELPERF_COMPILATION_CACHE; None when it says off."""
    value = os.environ.get(VARIABLE, "").strip()
    if value.lower() in _OFF:
        return None
    return pathlib.Path(value).expanduser() if value else DEFAULT_DIR


def enable() -> pathlib.Path | None:
    """Turn the persistent cache on (unless configured off); the folder in use, or None.

    Call before the first compilation: JAX decides once per process whether it uses
    the cache.
    """
    import jax

    existing = jax.config.jax_compilation_cache_dir
    if existing:  # set by the user (JAX_COMPILATION_CACHE_DIR): theirs to keep
        return pathlib.Path(existing)
    path = configured_dir()
    if path is None:
        return None
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path


@dataclasses.dataclass
class Stats:
    """Compiles that consulted the persistent cache, and how many it answered."""

    requests: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.requests if self.requests else None

    def add(self, other: Stats) -> None:
        self.requests += other.requests
        self.hits += other.hits

    def listen(self) -> Stats:
        """Start counting this process's cache requests and hits; returns self."""

        def listener(event: str, **metadata) -> None:
            if event == compat.CACHE_REQUEST_EVENT:
                self.requests += 1
            elif event == compat.CACHE_HIT_EVENT:
                self.hits += 1

        self._remove = compat.add_event_listener(listener)
        return self

    def stop(self) -> None:
        remove = getattr(self, "_remove", None)
        if remove:
            remove()
            self._remove = None

    def summary(self, path: pathlib.Path | None) -> str:
        if path is None:
            return f"compilation cache off ({VARIABLE}=off)"
        if not self.requests:
            return f"compilation cache {path}: no compile consulted it"
        return (f"compilation cache {path}: {self.hits} of {self.requests} compiles read from "
                f"the cache ({100 * self.hit_rate:.0f}% hit rate)")
