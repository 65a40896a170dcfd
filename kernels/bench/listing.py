"""The benchmark lists the dashboard publishes from: merged entry by entry, and the one
`python -m kernels bench` wrote kept beside asv's folders (a plain `asv run` rewrites asv's
own list without the dashboard metrics). asv_tools keeps it after each run; dashboard
publishes from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCAL_RESULTS = ROOT / ".asv" / "results"
# The benchmark list `python -m kernels bench` last wrote (dashboard metrics included), kept
# beside asv's folders: a plain `asv run` rewrites .asv/results/benchmarks.json without them.
KEPT_LIST = ROOT / ".asv" / "dashboard-benchmarks.json"


def union(lists: list[list]) -> list:
    return list(dict.fromkeys(item for values in lists for item in values))


def merge_entry(merged: dict[str, dict], name: str, entry: dict) -> None:
    """Lay `entry` over the merged list's entry of `name`, each parameter's values the union."""
    before = merged.get(name)
    merged[name] = dict(entry)
    if before and before.get("params") and entry.get("params") and \
            len(before["params"]) == len(entry["params"]):
        merged[name]["params"] = [union([a, b]) for a, b in zip(before["params"],
                                                                 entry["params"], strict=True)]


def keep_benchmark_list(results_dir: str | os.PathLike = LOCAL_RESULTS,
                        kept: str | os.PathLike = KEPT_LIST) -> None:
    """Merge the benchmark list asv just wrote into `kept` (newer entries win), which
    publishing reads: the list of a `python -m kernels bench` run names the dashboard metrics,
    and the next plain `asv run` rewrites asv's own list without them."""
    listing, kept = Path(results_dir) / "benchmarks.json", Path(kept)
    if not listing.is_file():
        return
    merged: dict[str, dict] = {}
    for path in (kept, listing):
        if path.is_file():
            for name, entry in json.loads(path.read_text()).items():
                if isinstance(entry, dict):
                    merge_entry(merged, name, entry)
    merged["version"] = 2
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(merged, indent=1))
