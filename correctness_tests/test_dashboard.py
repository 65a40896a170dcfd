"""The asv dashboard shows what was recorded: a tiny real asv run on this machine's CPU,
published by kernels.bench.dashboard alone and on top of the shipped GPU results, opened in
headless chromium (no network needed); and the merge of results folders that `make dashboard`
publishes from."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from correctness_tests import fakes
from kernels.bench import asv_tools, dashboard, listing

BENCHMARK = "benchmarks.Softmax.time_device"
LOCAL_MACHINE = "dashboard-test"
ROOT = dashboard.ROOT
# asv.js's series colours, in the order flot hands them to the series of a graph.
ASV_COLORS = ((0x24, 0x7A, 0xAD), (0xE2, 0x4A, 0x33), (0x98, 0x8E, 0xD5), (0x77, 0x77, 0x77),
              (0xFB, 0xC1, 0x5E), (0x8E, 0xBA, 0x42), (0xFF, 0xB5, 0xB8))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    """asv results of Softmax.time_device (xla and torch, forward, the CPU bench case) on this
    machine, as a plain `asv run --python=same` records them (no dashboard metrics, so its
    benchmark list lacks them), labelled with this checkout's HEAD, so they publish beside the
    shipped GPU results, whose commits are in HEAD's history."""
    reason = dashboard.unavailable_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("dashboard-local-run")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    # Branch HEAD: a clone of another branch has no local main, which asv.conf.json names.
    config = dashboard.asv_config(ROOT, tmp / "results", tmp / "html", branches=["HEAD"],
                                  env_dir=tmp / "env")
    # HOME: asv's machine file; the filters: two implementations (two series), one direction.
    env = {**os.environ, "HOME": str(tmp), "KERNELPERF_BENCH_IMPLS": "xla,torch",
           "KERNELPERF_BENCH_DIRECTIONS": "fwd"}
    env.pop(asv_tools.DASHBOARD_VARIABLE, None)
    dashboard.run_asv(config, "machine", "--yes", "--machine", LOCAL_MACHINE, env=env)
    dashboard.run_asv(config, "run", "--python=same", "--set-commit-hash", head,
                      "--machine", LOCAL_MACHINE, "--bench", r"Softmax\.time_device",
                      "--quick", "--show-stderr", env=env)
    return tmp / "results"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _color_pixels(png: Path, color: tuple[int, int, int]) -> int:
    from matplotlib import image

    rgb = (image.imread(str(png))[..., :3] * 255).round().astype(int)
    return int(np.all(np.abs(rgb - color) <= 8, axis=-1).sum())


def test_published_dashboard_draws_the_benchmark_graph(local_run, tmp_path):
    png = tmp_path / "softmax_time_device.png"  # kept under pytest's basetemp to look at
    html = tmp_path / "html"
    facts = dashboard.screenshot(local_run, BENCHMARK, png, html_dir=html, repo=ROOT,
                                 branches=["HEAD"])
    assert not facts.error_page, "asv's page fell back to error.html: a script did not load"
    assert facts.canvases >= 2, f"no flot canvases in #main-graph: {facts}"
    # One machine: the labels are the implementations, one per series with points.
    assert sorted(label for label, points in facts.series if points) == ["torch", "xla"], facts
    assert sorted(facts.legend) == ["torch", "xla"], facts
    assert len([label for label in facts.tick_labels if _number(label)]) >= 2, facts
    assert facts.drawn and facts.axes[0] == "commit", facts
    # The points themselves, in asv's first series colour, not just axes and legend.
    assert dashboard.series_pixels(png) > 20

    # Every script and style sheet from a local copy: the page needs no network.
    index = (html / "index.html").read_text()
    assert "https://cdn" not in index and "code.jquery.com" not in index
    assert f'src="{dashboard.SCRIPT_NAME}"' in index
    for name in [*dashboard.VENDOR, *dashboard.SHIMS]:
        assert (html / "vendor" / name).is_file(), name


def _graph_points(html: Path, index: dict, benchmark: str) -> dict[tuple[str, str], list]:
    """(branch, machine) -> the published graph's rows [revision, values per combination]."""
    from asv.graph import Graph

    graphs: dict[tuple[str, str], list] = {}
    for params in index["graph_param_list"]:
        path = html / f"{Graph.get_file_path(params, benchmark)}.json"
        if path.is_file():
            graphs[(params.get("branch"), params["machine"])] = json.loads(path.read_text())
    return graphs


def _default_view_points(html: Path) -> dict[str, dict[str, int]]:
    """Per benchmark and machine, the points of the graph's default view: the published
    graphs read at the combinations the defaults in index.json select."""
    index = json.loads((html / "index.json").read_text())
    defaults = index.get("kernelperf", {}).get("defaults", {})
    found: dict[str, dict[str, int]] = {}
    for name, entry in index["benchmarks"].items():
        chosen = defaults.get(name, {})
        params, names = entry["params"], entry["param_names"]
        selected = [[i for i, value in enumerate(values)
                     if value in chosen.get(f"p-{names[k]}", values)]
                    for k, values in enumerate(params)]
        flat = [0]
        for k, values in enumerate(params):  # asv's flat order: the last parameter fastest
            flat = [f * len(values) + i for f in flat for i in selected[k]]
        for (branch, machine), rows in _graph_points(html, index, name).items():
            if branch not in chosen.get("branch", [branch]):
                continue
            count = sum(1 for _, values in rows for i in flat
                        if isinstance(values, list) and values[i] is not None)
            found.setdefault(name, {})[machine] = found.get(name, {}).get(machine, 0) + count
    return found


@dataclasses.dataclass(frozen=True)
class Published:
    """`make dashboard` after a local run, published once for the tests that open it."""

    local: Path  # the local run's results, its benchmark list edited as below
    lines: list[str]  # what the merge said
    html: Path


@pytest.fixture(scope="module")
def published(local_run, tmp_path_factory) -> Published:
    """The shipped GPU results and the local run published together, as `make dashboard`
    does after `make bench`. The local benchmark list is marked as written by other benchmark
    code (another version), as a local edit of a benchmark makes it: a run of this checkout
    beside results that older code recorded."""
    tmp = tmp_path_factory.mktemp("dashboard-published")
    local = tmp / "local"
    subprocess.run(["cp", "-r", str(local_run), str(local)], check=True)
    local_list = json.loads((local / "benchmarks.json").read_text())
    local_list[BENCHMARK]["version"] = "edited-here"
    (local / "benchmarks.json").write_text(json.dumps(local_list))
    combined = tmp / "combined"
    lines = dashboard.combine_results([dashboard.SHIPPED_RESULTS, local], combined)
    html = dashboard.publish(combined, tmp / "html", repo=ROOT, branches=["HEAD"])
    return Published(local, lines, html)


def test_local_run_keeps_every_shipped_result_in_view(local_run, published, tmp_path):
    """`make dashboard` after a local run: the local benchmark list was written by other
    benchmark code (another version) and names no dashboard metric; every shipped machine's
    time_device points are still drawn beside this machine's, and every graph opens on
    filters with points for each machine that has any."""
    local_list = json.loads((local_run / "benchmarks.json").read_text())
    assert GBPS not in local_list, "a plain run lists no dashboard metric"
    shipped = dashboard.machines_with(dashboard.SHIPPED_RESULTS, BENCHMARK)
    assert shipped, "the repository ships GPU results"
    # The multi-GPU machines ship the sharded operations only.
    assert not {"2x-nvidia-h100-80gb-hbm3", "4x-nvidia-h100-80gb-hbm3"} & set(shipped)

    local, lines, html = published.local, published.lines, published.html
    assert any("recorded by other benchmark code" in line for line in lines), lines
    png = tmp_path / "after_local_run.png"
    facts = dashboard.graph_facts(dashboard.render(html, BENCHMARK, png))
    drawn = {label.split(" · ")[0] for label, points in facts.series if points}
    assert set(shipped) | {LOCAL_MACHINE} <= drawn, facts
    assert facts.hidden_empty >= 0 and all(points for _, points in facts.series), facts
    assert set(facts.legend) == {label for label, _ in facts.series}, facts
    # The commit axis names commits: its ticks (flot picks some where there are many) are
    # commits of the results drawn.
    commits = {result["commit_hash"][:8] for folder in (dashboard.SHIPPED_RESULTS, local)
               for result in dashboard.result_files(folder).values()
               if BENCHMARK in result["results"]}
    named = {tick for tick in facts.tick_labels if re.fullmatch(r"[0-9a-f]{8}", tick)}
    assert len(named) >= 2 and named <= commits, (facts.tick_labels, commits)
    # Device time in us or ms (on a log scale when a CPU's milliseconds sit beside a GPU's
    # microseconds), never asv's "microseconds" with e-notation ticks.
    assert facts.axes[1].split(",")[0] in ("µs", "ms", "s"), facts
    assert not [t for t in facts.tick_labels if "e+" in t or "e-" in t], facts

    # Every graph's default view has points on each machine that has any for it.
    index = json.loads((html / "index.json").read_text())
    defaults = _default_view_points(html)
    for name in index["benchmarks"]:
        for (branch, machine), rows in _graph_points(html, index, name).items():
            if any(v is not None for _, values in rows for v in values or []):
                assert defaults.get(name, {}).get(machine, 0) > 0, (name, branch, machine)

    # A metric recorded only on a GPU draws in plain numbers (no 4.00e+3).
    gbps = dashboard.render(html, "benchmarks.Softmax.track_gbps", tmp_path / "gbps.png")
    gbps_facts = dashboard.graph_facts(gbps)
    assert gbps_facts.drawn and gbps_facts.axes[1].split(",")[0] == "GB/s", gbps_facts
    assert not [t for t in gbps_facts.tick_labels if "e+" in t or "e-" in t], gbps_facts

    # Bars per implementation: each machine's bar of a slot beside the others, none hidden:
    # every series' fill (flot: its colour at 40% over white) shows (a hidden bar shows none;
    # a 2 us GPU kernel beside 350 us ones is a short bar of a few hundred pixels).
    bars_png = tmp_path / "bars.png"
    bars = dashboard.graph_facts(dashboard.render(
        html, BENCHMARK, bars_png, params={"x-axis": "implementation"}))
    assert bars.drawn and bars.axes[0] == "implementation", bars
    for color, (label, _) in zip(ASV_COLORS, bars.series, strict=False):
        fill = tuple(round(255 - 0.4 * (255 - c)) for c in color)
        assert _color_pixels(bars_png, fill) > 100, (label, fill, bars)


def _entry(params: list, version: str, name: str = BENCHMARK) -> dict:
    return {"name": name, "params": params, "version": version,
            "param_names": ["implementation", "case", "direction"]}


GPU_PARAMS = [["'pallas'", "'xla'"], ["'f32-32768x4096'"], ["'fwd'"]]
CPU_PARAMS = [["'pallas'", "'torch'"], ["'f32-64x1000'"], ["'fwd'"]]
GBPS = "benchmarks.Softmax.track_gbps"


def test_dashboard_publishes_shipped_and_local_results_together(tmp_path):
    """`make dashboard`: the GPU results the repository ships and this machine's CPU results in
    one published folder, each benchmark's parameters the union of both."""
    shipped = fakes.asv_results_folder(tmp_path / "shipped", "nvidia-h100-80gb-hbm3",
                                       {BENCHMARK: _entry(GPU_PARAMS, "1")},
                                       {"c0ffee": {BENCHMARK: (GPU_PARAMS, "1", 10)}})
    local = fakes.asv_results_folder(tmp_path / "local", "amd-epyc",
                                     {BENCHMARK: _entry(CPU_PARAMS, "1")},
                                     {"beef": {BENCHMARK: (CPU_PARAMS, "1", 20)}})
    lines = dashboard.combine_results([shipped, tmp_path / "absent", local], tmp_path / "both")
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == [
        "amd-epyc", "benchmarks.json", "nvidia-h100-80gb-hbm3"]
    assert (tmp_path / "both" / "nvidia-h100-80gb-hbm3" / "c0ffee-env.json").is_file()
    merged = json.loads((tmp_path / "both" / "benchmarks.json").read_text())
    assert merged[BENCHMARK]["params"] == [["'pallas'", "'xla'", "'torch'"],
                                           ["'f32-32768x4096'", "'f32-64x1000'"], ["'fwd'"]]
    assert len(lines) == 2 and "not shown" not in " ".join(lines), lines


def test_one_gpu_models_results_from_several_hosts_draw_one_line(tmp_path):
    """Results of one GPU model taken on a 16-core and a 64-core host get one set of params in
    the published copy (asv draws a line per set), so its history is one line; a driver
    change still starts another, and the shipped files are untouched."""
    model, shipped = "nvidia-h100-80gb-hbm3", tmp_path / "shipped"
    small = {"cpu": "Xeon; NVIDIA H100", "num_cpu": "16", "ram": "135", "os": "Linux 6.18"}
    big = {**small, "num_cpu": "64", "ram": "540", "os": "Linux-6.18-x86_64"}
    hosts = (("c0ffee", small), ("beef", big), ("dead", {**big, "driver": "590"}))
    for at, (commit, host) in enumerate(hosts):
        fakes.asv_result_file(shipped, model, commit,
                              {BENCHMARK: [[1.0, 1.0], GPU_PARAMS, "1", at]},
                              params={"driver": "580", **host})
    (shipped / model / "machine.json").write_text(json.dumps(
        {"machine": model, **small, "driver": "580", "version": 1}))
    (shipped / "benchmarks.json").write_text(json.dumps(
        {BENCHMARK: _entry(GPU_PARAMS, "1"), "version": 2}))

    lines = dashboard.combine_results([shipped], tmp_path / "both")

    def params(root: Path, commit: str) -> dict:
        return json.loads((root / model / f"{commit}-env.json").read_text())["params"]

    assert params(tmp_path / "both", "c0ffee") == params(tmp_path / "both", "beef")
    assert params(tmp_path / "both", "dead") == {**params(tmp_path / "both", "beef"),
                                                 "driver": "590"}
    assert params(shipped, "beef")["num_cpu"] == "64"
    assert f"{model}: 2 result(s) taken on other hosts of this machine drawn on its line " \
           "(cpu, num_cpu, ram, os as in its machine.json)" in lines, lines


def test_results_of_other_benchmark_versions_are_shown_per_machine(tmp_path):
    """A local list under another version (a benchmark edited here) hides no shipped result:
    each machine shows its newest run's version; that machine's older versions stay hidden,
    and both are said."""
    shipped = fakes.asv_results_folder(tmp_path / "shipped", "nvidia-h200",
                                       {BENCHMARK: _entry(GPU_PARAMS, "1")},
                                       {"c0ffee": {BENCHMARK: (GPU_PARAMS, "1", 10)}})
    local = fakes.asv_results_folder(tmp_path / "local", "amd-epyc",
                                     {BENCHMARK: _entry(CPU_PARAMS, "2")},
                                     {"beef": {BENCHMARK: (CPU_PARAMS, "2", 30)},
                                      "dead": {BENCHMARK: (CPU_PARAMS, "1", 20)}})
    lines = dashboard.combine_results([shipped, local], tmp_path / "both")

    def stored_version(machine: str, commit: str) -> str:
        result = json.loads((tmp_path / "both" / machine / f"{commit}-env.json").read_text())
        return result["results"][BENCHMARK][2]

    assert stored_version("nvidia-h200", "c0ffee") == "2"  # shown under the merged version
    assert stored_version("amd-epyc", "beef") == "2"
    assert stored_version("amd-epyc", "dead") == "1"  # older than this machine's newest: hidden
    assert f"nvidia-h200: {BENCHMARK} recorded by other benchmark code (version 1, this " \
           "list's 2): shown" in lines, lines
    assert any(line.startswith("amd-epyc: 1 older result(s)") for line in lines), lines
    # The shipped files themselves are untouched.
    original = json.loads((shipped / "nvidia-h200" / "c0ffee-env.json").read_text())
    assert original["results"][BENCHMARK][2] == "1"


def test_dashboard_metrics_survive_a_plain_asv_run(tmp_path):
    """`python -m kernels bench` lists the dashboard metrics; a plain `asv run` rewrites asv's
    list without them. The kept list still names them, and results' own parameters (a case no
    list names) are shown too."""
    results = tmp_path / "results"
    fakes.asv_results_folder(
        results, "amd-epyc",
        {BENCHMARK: _entry(CPU_PARAMS, "1"), GBPS: _entry(CPU_PARAMS, "1", GBPS)},
        {"beef": {GBPS: (CPU_PARAMS, "1", 10)}})
    kept = tmp_path / "kept.json"
    listing.keep_benchmark_list(results, kept)
    wider = [CPU_PARAMS[0], ["'f32-64x1000'", "'f32-8x128'"], CPU_PARAMS[2]]
    (results / "benchmarks.json").write_text(json.dumps({BENCHMARK: _entry(CPU_PARAMS, "1"),
                                                          "version": 2}))
    (results / "amd-epyc" / "beef-env.json").write_text(json.dumps({
        "commit_hash": "beef", "params": {"machine": "amd-epyc"}, "version": 2,
        "result_columns": ["result", "params", "version", "started_at"],
        "results": {GBPS: [[1.0, 2.0, 3.0, 4.0], wider, "1", 10],
                    BENCHMARK: [[1.0, 2.0], CPU_PARAMS, "1", 10]}}))
    listing.keep_benchmark_list(results, kept)  # the plain run's list merged, metrics kept
    lines = dashboard.combine_results([results], tmp_path / "both", lists=(kept,))
    merged = json.loads((tmp_path / "both" / "benchmarks.json").read_text())
    assert GBPS in merged and "not in any benchmark list" not in " ".join(lines), lines
    assert merged[GBPS]["params"][1] == ["'f32-64x1000'", "'f32-8x128'"], merged[GBPS]
    # Without the kept list, the metric is named as not shown.
    lines = dashboard.combine_results([results], tmp_path / "both")
    assert lines[-1] == f"not in any benchmark list, not shown: {GBPS}", lines


@pytest.mark.parametrize("argv, line", [
    (["no/such/dir", "Softmax.time_device", "--png", "x.png"],
     "results_dir: expected an asv results folder (benchmarks.json and machine folders), got "
     "'no/such/dir', which does not exist"),
    ([str(dashboard.SHIPPED_RESULTS), "NoSuch.time_device", "--png", "x.png"],
     "benchmark: expected one of "),
    ([str(dashboard.SHIPPED_RESULTS), "Softmax.time_device", "--png", "x.png", "--size", "9x"],
     "--size: expected WIDTHxHEIGHT"),
    ([str(dashboard.SHIPPED_RESULTS), "Softmax.time_device", "--png", "x.png", "--param", "x"],
     "--param: expected KEY=VALUE"),
    (["perf_tests"], "results_dir, benchmark and --png: expected all three"),
    (["--check-pages", "no/such/html"], "--check-pages: expected a published dashboard "
     "folder, got 'no/such/html', which has no index.html and index.json"),
])
def test_screenshot_mistakes_get_one_line(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = dashboard.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and line in err[0], (code, err)
    assert not (ROOT / "x.png").exists()


def _published(html: Path, graphs: dict[tuple[str, str], dict[str, list]],
               benchmarks: dict[str, list]) -> None:
    """A published dashboard's index.json and graph files: `graphs` maps (machine, branch)
    to {benchmark: [[revision, [value per flat parameter combination]], ...]}."""
    from asv.graph import Graph

    param_list = [{"machine": machine, "branch": branch} for machine, branch in graphs]
    index = {"params": {"machine": sorted({m for m, _ in graphs}),
                        "branch": list(dict.fromkeys(b for _, b in graphs))},
             "graph_param_list": param_list,
             "benchmarks": {name: {"params": params, "param_names": ["implementation", "case",
                                                                     "direction"][:len(params)]}
                            for name, params in benchmarks.items()}}
    html.mkdir(parents=True, exist_ok=True)
    (html / "index.json").write_text(json.dumps(index))
    for params in param_list:
        for name, rows in graphs[(params["machine"], params["branch"])].items():
            path = html / f"{Graph.get_file_path(params, name)}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rows))


def test_default_filters_follow_each_benchmark_and_machine(tmp_path):
    """Nothing assumes Softmax or one case: an operation with several cases and directions
    opens, per machine, on the first case and direction that machine has points for (the
    GPU's real size, the CPU's tiny case, backward only on the CPU), with every
    implementation that has points there, on the branch with points on the most machines."""
    attention = "benchmarks.Attention.time_device"
    params = [["'cudnn'", "'pallas'", "'xla'"], ["'bf16-4x4096'", "'bf16-8x8192'", "'f32-2x64'"],
              ["'fwd'", "'bwd'"]]

    def values(points: dict[tuple[int, int, int], float]) -> list:
        flat = [None] * 18  # 3 x 3 x 2, the last parameter fastest
        for (i, c, d), value in points.items():
            flat[(i * 3 + c) * 2 + d] = value
        return flat

    gpu = {attention: [[1, values({(0, 1, 0): 2.0, (1, 1, 0): 3.0})],
                       [2, values({(0, 0, 0): 1.0, (1, 0, 0): 1.5, (0, 1, 0): 2.0})]]}
    cpu = {attention: [[2, values({(2, 2, 1): 5.0, (1, 2, 1): 9.0})]]}
    # A machine of several GPUs has results of other benchmarks only: no graph file of this
    # one (asv would fetch it, a 404), so it is not among the machines the graph opens on.
    softmax = {BENCHMARK: [[2, [1.0]]]}  # one combination, on the H100 only
    _published(tmp_path, {("h100", "main"): gpu, ("h100", "dash"): {**gpu, **softmax},
                           ("cpu", "dash"): cpu, ("4x-h100", "dash"): {}},
               {attention: params, BENCHMARK: [["'xla'"], ["'f32-64x1000'"], ["'fwd'"]]})
    defaults = dashboard.view_defaults(tmp_path)
    assert defaults[attention] == {
        "p-implementation": ["'cudnn'", "'pallas'", "'xla'"],
        "p-case": ["'bf16-4x4096'", "'f32-2x64'"], "p-direction": ["'fwd'", "'bwd'"],
        "branch": ["dash"], "machine": ["cpu", "h100"]}, defaults
    assert defaults[BENCHMARK]["machine"] == ["h100"], defaults
    # The benchmark list opens on the machine with points for the most benchmarks (asv: the
    # first machine, here the one with none).
    assert dashboard.list_machine(tmp_path, defaults) == ["h100"]


def _samples(value: float, spread: float, count: int = 20) -> list[float]:
    """`count` samples evenly over +-`spread` around `value`."""
    return [value * (1 + spread * (2 * i / (count - 1) - 1)) for i in range(count)]


def _history(root: Path, machine: str, commits: list[str],
             rows: dict[str, dict[tuple[str, str, str], list]], spread: float = 0.001) -> None:
    """`machine`'s results of `commits` (oldest first): rows maps a benchmark to {params:
    [value per commit, None where that commit has none]}; a time_ value comes with samples
    spread +-`spread` around it."""
    columns = ("result", "params", "version", "started_at", "samples")
    for at, commit in enumerate(commits):
        found = {}
        for name, series in rows.items():
            present = {combo: values[at] for combo, values in series.items()
                       if values[at] is not None}
            if not present:
                continue
            params = [sorted({combo[k] for combo in present}) for k in range(3)]
            combos = list(itertools.product(*params))
            samples = [None if combo not in present else
                       _samples(present[combo], spread)
                       for combo in combos] if ".time_" in name else None
            found[name] = [[present.get(combo) for combo in combos],
                           [[repr(p) for p in values] for values in params], "1", at, samples]
        fakes.asv_result_file(root, machine, commit, found, columns=columns, date=at + 1)


def test_regression_thresholds_come_from_each_rows_measured_noise(tmp_path):
    """A row's threshold: its own scatter between commits where it has enough of them, the
    scatter of the rows that have where it has not, its samples' spread where that is wider,
    the largest over machines; memory's is the gate's 1%; higher-is-better metrics get none
    (asv would read their gains as regressions)."""
    timed, memory, gbps = BENCHMARK, "benchmarks.Softmax.track_peak_memory", GBPS
    commits = [f"{n:08x}" * 5 for n in range(1, 7)]  # asv names a file by 8 characters
    wobbly = [100e-6, 102e-6] * 3  # +-2% back and forth on every commit
    _history(tmp_path, "gpu", commits, {
        timed: {("xla", "big", "fwd"): wobbly,
                ("xla", "small", "fwd"): [None] * 4 + [5e-6, 5e-6],
                ("xla", "shared", "fwd"): [None] * 5 + [7e-6]},
        memory: {("xla", "big", "fwd"): [4096.0] * 6},
        gbps: {("xla", "big", "fwd"): [900.0] * 6}})
    _history(tmp_path, "gpu2", commits[-1:], {timed: {("xla", "shared", "fwd"): [7e-6]}},
             spread=0.1)
    found = asv_tools.regression_thresholds(tmp_path)

    def row(*params: str, name: str = timed) -> asv_tools.Threshold:
        return found[f"{name}({', '.join(repr(p) for p in params)})"]

    big = row("xla", "big", "fwd")
    assert big.gap > 0.05 and "its scatter between 6 commits" in big.why, big
    assert row("xla", "small", "fwd").gap == big.gap, found  # too short: the pooled scatter
    assert "the scatter between commits of the 1 rows" in row("xla", "small", "fwd").why
    shared = row("xla", "shared", "fwd")  # the largest over machines: gpu2's wide samples
    assert shared.gap > big.gap and shared.why.startswith("gpu2: sample spread"), shared
    assert row("xla", "big", "fwd", name=memory).gap == asv_tools.DEFAULT_MIN_GAP
    assert not [name for name in found if name.startswith(gbps)], found


def test_every_page_opens_offline_on_data_with_a_clean_console(published, tmp_path):
    """`make bench`'s dashboard (the shipped GPU results and a local run) in headless chromium:
    the grid, a graph, the benchmark list and the regressions page each load (none left on
    "Loading..."), write nothing to the console and ask for no file the folder lacks; each
    shows what it should (PNGs and console logs under tmp_path, to look at)."""
    html = published.html
    pages = dashboard.check_pages(html, tmp_path)
    for name, (facts, content) in pages.items():
        assert facts.problems() == [], (name, facts.problems(), content)
        assert (tmp_path / f"{name}.png").is_file(), name
    index = json.loads((html / "index.json").read_text())
    assert dashboard.page_content("grid", pages["grid"][0].dom).startswith(
        f"{len(index['benchmarks'])} benchmarks"), pages["grid"][1]
    assert re.search(r" [1-9]\d* with a value", pages["list"][1]), pages["list"][1]
    # The page lists what asv found, every one (the table's rows, nothing lost on the way).
    found = len(json.loads((html / "regressions.json").read_text())["regressions"])
    assert pages["regressions"][1].startswith(f"regressions listed: {found} on HEAD"), \
        (found, pages["regressions"][1])
    # The graph: the newest commit drawn (this checkout's, the local run) has its label, and
    # no two labels overlap (a commit hash is 8 characters, under 60 pixels at flot's 12px).
    graph = dashboard.graph_facts(pages["graph"][0].dom)
    assert graph.drawn and graph.x_ticks, graph
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert graph.x_ticks[-1][1] == head[:8], graph.x_ticks
    lefts = [left for left, _ in graph.x_ticks]
    assert all(b - a >= 60 for a, b in itertools.pairwise(lefts)), graph.x_ticks


def _first_parent_commits(count: int) -> list[str]:
    """The newest `count` first-parent commits of this checkout's HEAD, oldest first."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-list", "--first-parent",
                           f"--max-count={count}", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.split()[::-1]


def test_the_regressions_page_lists_a_real_step_and_not_noise(tmp_path):
    """Over real commits of this checkout, each row judged by its own noise, not asv's 5%: a
    tight row that steps up 3% and stays there is listed; one that wobbles 10% on every
    commit is not, nor a row of two commits 8% apart (too short to know its own noise, it
    takes the wobbling row's); with no step anywhere the page says there is no regression."""
    reason = dashboard.unavailable_reason()
    if reason:
        pytest.skip(reason)
    commits = _first_parent_commits(6)
    if len(commits) < 6:
        pytest.skip("needs 6 first-parent commits of HEAD (a shallow clone has fewer)")
    cases = ["'step'", "'short'", "'wobbly'"]
    listing = {BENCHMARK: {**_entry([["'xla'"], cases, ["'fwd'"]], "1"),
                           "unit": "seconds", "type": "time"}}

    def page(name: str, step: list[float], short: list[float | None]) -> tuple[str, list]:
        results = tmp_path / name / "results"
        _history(results, "gpu", commits, {BENCHMARK: {
            ("xla", "step", "fwd"): step, ("xla", "short", "fwd"): short,
            ("xla", "wobbly", "fwd"): [100e-6, 110e-6] * 3}})
        (results / "benchmarks.json").write_text(json.dumps({**listing, "version": 2}))
        html = dashboard.publish(results, tmp_path / name / "html", repo=ROOT,
                                 branches=["HEAD"])
        facts = dashboard.open_page(html, "regressions", tmp_path / f"{name}.png")
        assert facts.problems() == [], facts.problems()
        return (dashboard.page_content("regressions", facts.dom),
                json.loads((html / "regressions.json").read_text())["regressions"])

    content, found = page("step", [100e-6] * 3 + [103e-6] * 3, [None] * 4 + [100e-6, 108e-6])
    assert [entry[0] for entry in found] == [f"{BENCHMARK}('xla', 'step', 'fwd')"], found
    assert content == "regressions listed: 1 on HEAD", content
    content, found = page("flat", [100e-6] * 6, [None] * 4 + [100e-6] * 2)
    assert found == [] and content == 'regressions listed: 0 on HEAD ("No regression" said)', \
        content


def test_make_install_gets_every_script_asv_loads_from_a_cdn(monkeypatch):
    """Every script and style sheet asv's index.html loads from a CDN has a local copy from a
    Debian package (`make install` apt-gets those missing: --missing-packages), or, for flot's
    orderBars alone, kernelperf.js's own; none is a stand-in for a library a page calls."""
    asv_index = (Path(__import__("asv").__file__).parent / "www" / "index.html").read_text()
    loaded = {match.group(2) for match in dashboard._CDN_TAG.finditer(asv_index)}
    assert loaded == set(dashboard.VENDOR) | set(dashboard.SHIMS), loaded
    assert set(dashboard.SHIMS) == {"jquery.flot.orderBars.js"}
    assert dashboard.VENDOR["stupidtable.min.js"][0] == "libjs-jquery-stupidtable"
    # Where the package's file is missing, make install is told to get that package.
    wanted = dashboard.VENDOR["stupidtable.min.js"][1][0]
    real = os.path.isfile
    monkeypatch.setattr(os.path, "isfile", lambda path: path != wanted and real(path))
    assert "libjs-jquery-stupidtable" in dashboard.missing_packages()
    assert "libjs-jquery-stupidtable" in dashboard.APT_PACKAGES


def test_check_pages_names_a_graph_the_dashboard_lacks_in_one_line(tmp_path, capsys):
    (tmp_path / "index.html").write_text("<html></html>")
    (tmp_path / "index.json").write_text(json.dumps({"benchmarks": {BENCHMARK: {}}}))
    code = dashboard.main(["--check-pages", str(tmp_path), "--graph", "NoSuch.time_device"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    assert "--graph: expected one of the dashboard's benchmarks (Softmax.time_device), got " \
           "'NoSuch.time_device'" in err[0], err
