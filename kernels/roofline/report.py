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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from kernels.core import registry
from kernels.roofline import ceilings, model

TRACES = pathlib.Path("traces")


def progress(items: Sequence[Any], description: str,
             label: Callable[[Any], str] | None = None) -> Iterator[Any]:
    """Iterate with a progress bar (tqdm; a plain count on stderr where tqdm is missing),
    naming each item (`label`) as it starts: one item can take seconds (a compile)."""
    try:
        from tqdm import tqdm
    except ImportError:
        for index, item in enumerate(items):
            print(f"{description}: {index + 1}/{len(items)}" +
                  (f" {label(item)}" if label else ""), file=sys.stderr, flush=True)
            yield item
        return
    bar = tqdm(items, desc=description, unit="point")
    for item in bar:
        if label:
            bar.set_postfix_str(label(item), refresh=True)
        yield item


def sharding_ceiling(impl: registry.Implementation, case: registry.Case,
                     work: registry.Work) -> float | None:
    """Measured all-gather bandwidth per device over the case's devices, where the work
    crosses devices (the third roof); None otherwise."""
    devices = impl.devices_for(case)
    if work.comm_bytes <= 0 or devices < 2:
        return None
    from kernels.sharding import meshes

    return meshes.interconnect_ceiling(devices)


def point(impl: registry.Implementation, case: registry.Case, direction: str,
          measurement, sheet: ceilings.Ceiling | None,
          measured: ceilings.Ceiling | None) -> dict[str, Any]:
    """One roofline point: work, timing summary, and its placement under each ceiling."""
    work = registry.operation(impl.op).work(case, direction)
    placements = {}
    for ceiling in (measured, sheet):
        if ceiling is not None:
            placements[ceiling.kind] = model.place(
                work, measurement.median_s, ceiling, case.dtype, devices=impl.devices_for(case),
                interconnect=sharding_ceiling(impl, case, work)).to_dict()
    return {
        "op": impl.op, "impl": impl.name, "baseline": impl.baseline, "case": case.id,
        "direction": direction, "dtype": case.dtype, "devices": impl.devices_for(case),
        "comm_bytes": work.comm_bytes,
        "flops": work.flops, "bytes": work.bytes,
        "median_s": measurement.median_s, "cv": measurement.to_dict()["cv"],
        "repeats": measurement.repeats, "method": measurement.method,
        "regime": measurement.regime, "stop_reason": measurement.stop_reason,
        "throttled": measurement.throttled_count, "placement": placements,
        "precision": measurement.precision or None,
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


_DATA_KEYS = ("model", "timestamp", "fingerprint", "ceilings", "points")
_POINT_TEXT = ("op", "impl", "case", "dtype")
_POINT_NUMBERS = ("flops", "bytes", "median_s")  # each > 0, but FLOPs may be 0 (a broadcast)


def data_problem(data: Any) -> str | None:
    """What keeps `data` from being drawn as a roofline data file (`write_data`'s layout), in
    words naming the field; None if nothing does."""
    if not isinstance(data, dict):
        return f"an object, got {type(data).__name__}"
    missing = [key for key in _DATA_KEYS if key not in data]
    if missing:
        return f"keys {list(_DATA_KEYS)}, lacks {missing}"
    for key in ("model", "timestamp"):
        if not isinstance(data[key], str):
            return f"{key!r} a string, got {data[key]!r}"
    if not isinstance(data["fingerprint"], dict) or \
            not isinstance(data["fingerprint"].get("name"), str):
        return f"'fingerprint' an object with a 'name', got {data['fingerprint']!r:.80}"
    roofs = data["ceilings"]
    if not isinstance(roofs, dict) or set(roofs) != {"datasheet", "measured"}:
        return f"'ceilings' an object of 'datasheet' and 'measured', got {roofs!r:.80}"
    built = []
    for kind, roof in roofs.items():
        if roof is None:
            continue
        try:
            ceiling = ceilings.Ceiling.from_dict(roof)
        except TypeError as error:
            return f"ceilings[{kind!r}] a ceiling's fields, got {roof!r:.80} ({error})"
        numbers = [ceiling.bandwidth, *ceiling.flops.values()] \
            if isinstance(ceiling.flops, dict) else []
        if not numbers or not all(_positive(v) for v in numbers):
            return f"ceilings[{kind!r}] a bandwidth and FLOP/s per dtype > 0, got {roof!r:.80}"
        built.append(ceiling)
    points = data["points"]
    if not isinstance(points, list) or not points:
        return f"'points' a non-empty list, got {points!r:.80}"
    for i, point in enumerate(points):
        if not isinstance(point, dict):
            return f"points[{i}] an object, got {point!r:.80}"
        for key in _POINT_TEXT:
            if not isinstance(point.get(key), str):
                return f"points[{i}][{key!r}] a string, got {point.get(key)!r:.80}"
        if point.get("direction") not in registry.DIRECTIONS:
            return (f"points[{i}]['direction'] one of {registry.DIRECTIONS}, got "
                    f"{point.get('direction')!r:.80}")
        for key in _POINT_NUMBERS:
            value = point.get(key)
            if not (_positive(value) or (key == "flops" and value == 0)):
                return f"points[{i}][{key!r}] a number > 0, got {value!r:.80}"
        if not isinstance(point.get("placement"), dict):
            return f"points[{i}]['placement'] an object, got {point.get('placement')!r:.80}"
        for ceiling in built:
            try:
                ceiling.peak(point["dtype"])
            except KeyError as error:
                return f"points[{i}]['dtype'] one its ceilings know: {error}"
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


def _roofs(axes, ceiling: ceilings.Ceiling, dtypes: Iterable[str], x_range, scale: float,
           unit: str, colors: dict[str, str]) -> None:
    """Draw `ceiling`'s roofs: one per distinct compute peak among `dtypes`, in its color."""
    import numpy as np

    by_peak: dict[float, list[str]] = {}
    for dtype in dtypes:
        by_peak.setdefault(ceiling.peak(dtype), []).append(dtype)
    x = np.geomspace(*x_range, 200)
    for peak, names in sorted(by_peak.items()):
        axes.plot(x, np.minimum(peak, x * ceiling.bandwidth) / scale,
                  "--" if ceiling.kind == "datasheet" else "-", color=colors[names[0]],
                  linewidth=1.3, alpha=0.6 if ceiling.kind == "datasheet" else 1.0,
                  label=f"{ceiling.kind} {'/'.join(names)}: {peak / scale:.3g} {unit}, "
                        f"{ceiling.bandwidth / 1e9:.0f} GB/s")


def _clusters(xs: list[float], ys: list[float]) -> list[list[int]]:
    """Indices of points that sit on top of each other (same intensity, within 15% in rate)."""
    order = sorted(range(len(xs)), key=lambda i: (xs[i], ys[i]))
    groups: list[list[int]] = []
    for i in order:
        last = groups[-1][-1] if groups else None
        if last is not None and math.isclose(xs[i], xs[last], rel_tol=0.01) \
                and ys[i] <= ys[last] * 1.15:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _label(p: dict[str, Any]) -> str:
    label = f"{p['impl']} {p['case']}"
    if p.get("dtype") == "f32" and p.get("precision"):
        # float32 points of one chart may be FP32 and TF32 products: said on each.
        label += f" {p['precision']}"
    placement = p["placement"].get("measured") or p["placement"].get("datasheet")
    if placement:
        label += f" {100 * placement['fraction']:.0f}%"
        if placement.get("warning"):
            label += f" ({placement['warning']})"
    return label


def _cluster_label(points: list[dict[str, Any]], ys: list[float], group: list[int]) -> str:
    """One line per point of a cluster, the fastest first: the lines stack top-down as the
    points do (ascending, the top line named the lowest point)."""
    return "\n".join(_label(points[i]) for i in sorted(group, key=lambda i: -ys[i]))


def plot(data: dict[str, Any], direction: str, path: pathlib.Path) -> pathlib.Path | None:
    """Draw the `direction` points of a roofline data dict to `path`; None if there are none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    points = [p for p in data["points"] if p["direction"] == direction and p["flops"] > 0]
    if not points:
        return None
    roofs = [ceilings.Ceiling.from_dict(c) for c in (data["ceilings"]["datasheet"],
                                                     data["ceilings"]["measured"]) if c]
    dtypes = sorted({p["dtype"] for p in points})
    colors = {d: f"C{i}" for i, d in enumerate(dtypes)}
    xs = [p["flops"] / p["bytes"] for p in points]
    ridges = [c.peak(d) / c.bandwidth for c in roofs for d in dtypes]
    x_range = (min(xs + ridges) / 4, max(xs + ridges) * 4)
    top = max([c.peak(d) for c in roofs for d in dtypes] +
              [p["flops"] / p["median_s"] for p in points])
    scale, unit = (1e12, "TFLOP/s") if top >= 1e12 else (1e9, "GFLOP/s")
    ys = [p["flops"] / p["median_s"] / scale for p in points]

    figure, axes = plt.subplots(figsize=(12, 7.5))
    for ceiling in roofs:
        _roofs(axes, ceiling, dtypes, x_range, scale, unit, colors)
    markers = "os^vD<>pP*Xh"
    impls = sorted({(p["op"], p["impl"]) for p in points})
    for p, x, y in zip(points, xs, ys, strict=True):
        axes.scatter([x], [y], marker=markers[impls.index((p["op"], p["impl"])) % len(markers)],
                     color=colors[p["dtype"]], edgecolor="black", zorder=3, s=50)
    # One label per cluster of overlapping points. Labels go right of their column, or left
    # where another column of points lies close to the right; a cluster close above another
    # in the same column puts its label above its point instead of beside it.
    columns = sorted({round(x, 9) for x in xs})
    previous: dict[float, float] = {}
    for group in _clusters(xs, ys):
        x = round(xs[group[0]], 9)
        y = math.exp(sum(math.log(ys[i]) for i in group) / len(group))
        right = not any(x < other <= 4 * x for other in columns)
        crowded = x in previous and y < previous[x] * 1.6
        previous[x] = y
        axes.annotate(_cluster_label(points, ys, group), (x, y),
                      textcoords="offset points", xytext=(8 if right else -8, 4 if crowded else 0),
                      ha="left" if right else "right", va="bottom" if crowded else "center",
                      fontsize=7.5)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlim(*x_range)
    axes.set_xlabel("arithmetic intensity (FLOP/byte)")
    axes.set_ylabel(unit)
    ops = ", ".join(sorted({p["op"] for p in points}))
    axes.set_title(f"{ops} {direction} on {data['fingerprint']['name']} ({data['timestamp']})\n"
                   f"points: % of the measured roof (datasheet where none); "
                   f"solid: measured roofs, dashed: datasheet", fontsize=10)
    axes.grid(True, which="both", alpha=0.25)
    if roofs:  # a data file may carry no ceilings (an unknown device measured none)
        axes.add_artist(axes.legend(fontsize=7.5, loc="upper left"))
    handles = [Line2D([], [], linestyle="", marker=markers[k % len(markers)], color="gray",
                      markeredgecolor="black", label=f"{op}-{impl}")
               for k, (op, impl) in enumerate(impls)]
    handles += [Line2D([], [], linestyle="", marker="s", color=colors[d], label=d)
                for d in dtypes]
    axes.legend(handles=handles, fontsize=7.5, loc="lower right", title="implementation / dtype",
                title_fontsize=7.5)
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
    return f"{text} (!{placement.warning})" if placement.suspicious else text
