"""Roofline data files and charts: one chart per device model and direction.

`collect()` times (implementation, case, direction) triples and places each
under the device's ceilings; `write_data()` saves them as
`traces/roofline_data_{MODEL}_{timestamp}.json`; `plot_data()` draws
`traces/roofline_{fwd,bwd}_{MODEL}_{timestamp}.png` from such a file:
log-log axes (FLOP/byte, TFLOP/s), the datasheet roofs dashed and the
measured roofs solid, one compute roof per dtype among the points, every point
labelled with its implementation and case.
"""

from __future__ import annotations

import datetime
import json
import math
import pathlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from kernels import registry
from kernels.roofline import ceilings, model

TRACES = pathlib.Path("traces")


def progress(items: Sequence[Any], description: str) -> Iterator[Any]:
    """Iterate with a progress bar (tqdm; a plain count on stderr where tqdm is missing)."""
    try:
        from tqdm import tqdm
    except ImportError:
        for index, item in enumerate(items):
            print(f"{description}: {index + 1}/{len(items)}", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, desc=description, unit="point")


def point(impl: registry.Implementation, case: registry.Case, direction: str,
          measurement, sheet: ceilings.Ceiling | None,
          measured: ceilings.Ceiling | None) -> dict[str, Any]:
    """One roofline point: work, timing summary, and its placement under each ceiling."""
    work = registry.operation(impl.op).work(case, direction)
    placements = {}
    for ceiling in (measured, sheet):
        if ceiling is not None:
            placements[ceiling.kind] = model.place(work, measurement.median_s, ceiling,
                                                   case.dtype,
                                                   devices=impl.requires.devices).to_dict()
    return {
        "op": impl.op, "impl": impl.name, "baseline": impl.baseline, "case": case.id,
        "direction": direction, "dtype": case.dtype, "devices": impl.requires.devices,
        "flops": work.flops, "bytes": work.bytes,
        "median_s": measurement.median_s, "cv": measurement.to_dict()["cv"],
        "repeats": measurement.repeats, "method": measurement.method,
        "regime": measurement.regime, "stop_reason": measurement.stop_reason,
        "throttled": measurement.throttled_count, "placement": placements,
    }


def write_data(points: list[dict[str, Any]], device, sheet, measured,
               directory: pathlib.Path = TRACES) -> pathlib.Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"roofline_data_{device.model}_{stamp}.json"
    data = {"model": device.model, "timestamp": stamp, "fingerprint": device.to_dict(),
            "ceilings": {"datasheet": sheet.to_dict() if sheet else None,
                         "measured": measured.to_dict() if measured else None},
            "points": points}
    path.write_text(json.dumps(data, indent=1))
    return path


def _roof(axes, ceiling: ceilings.Ceiling, dtypes: Iterable[str], x_range, style: str,
          colors: dict[str, str]) -> None:
    import numpy as np

    x = np.geomspace(*x_range, 200)
    for dtype in dtypes:
        peak = ceiling.peak(dtype)
        axes.plot(x, np.minimum(peak, x * ceiling.bandwidth) / 1e12, style, color=colors[dtype],
                  linewidth=1.2,
                  label=f"{ceiling.kind} {dtype}: {peak / 1e12:.0f} TFLOP/s, "
                        f"{ceiling.bandwidth / 1e9:.0f} GB/s")


def plot(data: dict[str, Any], direction: str, path: pathlib.Path) -> pathlib.Path | None:
    """Draw the `direction` points of a roofline data dict to `path`; None if there are none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in data["points"] if p["direction"] == direction and p["flops"] > 0]
    if not points:
        return None
    roofs = [ceilings.Ceiling.from_dict(c) for c in (data["ceilings"]["datasheet"],
                                                     data["ceilings"]["measured"]) if c]
    dtypes = sorted({p["dtype"] for p in points})
    colors = {d: f"C{i}" for i, d in enumerate(dtypes)}
    intensities = [p["flops"] / p["bytes"] for p in points]
    ridges = [c.peak(d) / c.bandwidth for c in roofs for d in dtypes]
    x_range = (min(intensities + ridges) / 4, max(intensities + ridges) * 4)

    figure, axes = plt.subplots(figsize=(11, 7))
    for ceiling in roofs:
        _roof(axes, ceiling, dtypes, x_range, "--" if ceiling.kind == "datasheet" else "-",
              colors)
    markers = "os^vD<>pP*Xh"
    impls = sorted({(p["op"], p["impl"]) for p in points})
    for p, x in zip(points, intensities, strict=True):
        index = impls.index((p["op"], p["impl"]))
        y = p["flops"] / p["median_s"] / 1e12
        axes.scatter([x], [y], marker=markers[index % len(markers)], color=colors[p["dtype"]],
                     edgecolor="black", zorder=3, s=45)
        flag = " (!>roof)" if any(pl["suspicious"] for pl in p["placement"].values()) else ""
        fraction = p["placement"].get("measured", p["placement"].get("datasheet", {}))
        label = f"{p['impl']} {p['case']}"
        if fraction:
            label += f" {100 * fraction['fraction']:.0f}%{flag}"
        axes.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlim(*x_range)
    axes.set_xlabel("arithmetic intensity (FLOP/byte)")
    axes.set_ylabel("TFLOP/s")
    ops = ", ".join(sorted({p["op"] for p in points}))
    axes.set_title(f"{ops} {direction} on {data['fingerprint']['name']} "
                   f"({data['timestamp']}); % of measured roof")
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=130)
    plt.close(figure)
    return path


def plot_data(json_path: pathlib.Path, directory: pathlib.Path | None = None) -> list[pathlib.Path]:
    """Charts (one per direction present) for a roofline data file, beside it by default."""
    data = json.loads(pathlib.Path(json_path).read_text())
    directory = directory or pathlib.Path(json_path).parent
    written = []
    for direction in registry.DIRECTIONS:
        path = directory / f"roofline_{direction}_{data['model']}_{data['timestamp']}.png"
        if plot(data, direction, path):
            written.append(path)
    return written


def fraction_text(placement: model.Placement | None) -> str:
    if placement is None or math.isnan(placement.fraction):
        return "-"
    text = f"{100 * placement.fraction:.0f}% {placement.bound[:3]}"
    return text + " (!>roof: work model?)" if placement.suspicious else text
