"""Where the benchmarks' measuring workers keep their journals, and their lines, for the
tools that read them after a run: the time breakdown, the recovery of an interrupted run,
the fault drill.

perf_tests/measuring.py writes them (`read_journal` there is its own reader: the benchmarks
run against every commit's kernels, older ones without this module) under asv's environment
folder: <env_dir>/<environment>/kernelperf-measurements/<commit>-<run>/<operation>.jsonl,
one JSON object a line.
"""

from __future__ import annotations

import json
import pathlib

MEASUREMENTS = "kernelperf-measurements"


def env_dir(config: pathlib.Path = pathlib.Path("asv.conf.json")) -> pathlib.Path:
    """asv's environment folder, from the configuration in the current folder."""
    try:
        return pathlib.Path(json.loads(config.read_text()).get("env_dir", ".asv/env"))
    except (OSError, json.JSONDecodeError):
        return pathlib.Path(".asv/env")


def written_since(env: pathlib.Path, since: float) -> list[pathlib.Path]:
    """The measuring journals asv's benchmarks wrote under `env` since `since` (epoch s)."""
    found = env.glob(f"*/{MEASUREMENTS}/*/*.jsonl")
    return sorted(path for path in found if path.stat().st_mtime >= since)


def entries(path: pathlib.Path) -> list[dict]:
    """The lines of one journal (a line cut short by a killed writer is skipped)."""
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found
