"""The asv dashboard without network, views that open on data, and a picture of one graph.

asv 0.6.6's `index.html` loads jQuery, flot, bootstrap, md5 and stupidtable
from CDNs (and sends the page to error.html when one fails), so on a machine
with no internet access (the GPU machine, CI) the published dashboard draws
nothing. `localize(html_dir)` points those tags at copies under `vendor/`,
taken from Debian packages (`APT_PACKAGES`: jQuery 3.3.1 and flot 0.8.3, the
versions asv asks for; bootstrap 3.4.1 for asv's 3.1.1); the two plug-ins
Debian lacks get stand-ins (`SHIMS`: no table sorting; flot's orderBars is
written anew in dashboard.js).

`prepare(html_dir)` (every publish here, and the nightly's) localizes, then
adds `dashboard.js` (`SCRIPT`) after asv.js and, in index.json, the filters each
graph opens with (`view_defaults`: read from the published graphs, so a graph
never opens on parameters without points). dashboard.js keeps series without
points out of the graph and its legend, draws the legend beside the plot,
labels the commit axis with hashes, writes units as us/ms, GB/s or TFLOP/s
in plain decimals, leaves a margin at the frame, and sets the bars of one
slot side by side.

`publish_all(html_dir)` (`make dashboard`, `make bench`) publishes the
results the repository ships (`perf_tests/results/asv/`, one folder per GPU
model) together with this machine's (`.asv/results/`), merged by
`combine_results`, for the branch checked out (first: asv's default view) and
main. The merged benchmark list takes every list there is, so a local run
that rewrote `.asv/results/benchmarks.json` (plain `asv run` lists no
dashboard metrics) hides nothing, and each machine's results are shown under
the version they were recorded with (see `combine_results`).

`screenshot(results_dir, benchmark, png)` publishes a results folder into a
dashboard, serves it on 127.0.0.1 (asv's pages fetch their JSON, which file://
does not allow), and has headless Chromium draw the benchmark's page into a
PNG; it returns what the page drew (`GraphFacts`).

    python -m kernels.bench.dashboard perf_tests/results/asv benchmarks.Softmax.time_device \\
        --png traces/softmax.png
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import html
import http.server
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from kernels.bench.listing import KEPT_LIST, merge_entry, union
from kernels.core import vcs

ROOT = Path(__file__).resolve().parents[2]
# Results kept in the repository (recorded on GPU machines), and this machine's asv results.
SHIPPED_RESULTS = ROOT / "perf_tests" / "results" / "asv"
LOCAL_RESULTS = ROOT / ".asv" / "results"

# File name in asv's CDN address -> (Debian package, its copies of the same library; first
# found wins). jQuery's is byte-identical to the CDN's file.
_JQUERY, _FLOT = "/usr/share/haskell-js-jquery", "/usr/share/haskell-js-flot"
_BOOTSTRAP = "/usr/share/javascript/bootstrap"
VENDOR = {
    "jquery-3.3.1.min.js": ("libghc-js-jquery-data", [f"{_JQUERY}/jquery-3.3.1.min.js",
                                                      "/usr/share/javascript/jquery/jquery.min.js"]),
    **{name: ("libghc-js-flot-data", [f"{_FLOT}/{name}"]) for name in (
        "jquery.flot.min.js", "jquery.flot.time.min.js", "jquery.flot.selection.min.js",
        "jquery.flot.categories.min.js")},
    "md5.min.js": ("node-blueimp-md5", ["/usr/share/javascript/blueimp-md5/md5.min.js"]),
    # 1.1.3 for asv's 1.0.1: the API asv's benchmark list and regressions page call,
    # $table.stupidtable(sorters) and $th.stupidsort(direction) (their first sort on open).
    "stupidtable.min.js": ("libjs-jquery-stupidtable",
                           ["/usr/share/javascript/jquery-stupidtable/stupidtable.min.js"]),
    "bootstrap.min.js": ("libjs-bootstrap", [f"{_BOOTSTRAP}/js/bootstrap.min.js"]),
    "bootstrap.min.css": ("libjs-bootstrap", [f"{_BOOTSTRAP}/css/bootstrap.min.css"]),
}
# The plug-in with no Debian copy: flot's orderBars, written anew in dashboard.js (loaded
# later, so this file only has to exist).
SHIMS = {
    "jquery.flot.orderBars.js": "/* kernelperf: orderBars is in kernelperf.js (dashboard.js) */\n",
}
# kernelperf's script (dashboard.js), published as kernelperf.js and loaded right after asv.js.
SCRIPT = Path(__file__).with_name("dashboard.js")
SCRIPT_NAME = "kernelperf.js"
# Each searched row's regression threshold and what set it, beside the published pages.
THRESHOLDS_NAME = "regression-thresholds.json"
_ASV_SCRIPT = re.compile(r'(<script[^>]*src="asv\.js"[^>]*>\s*</script>)')
# Machine keys that describe the host rather than the device: asv draws one line per
# distinct set of a result's params, and the lent VMs of one GPU model differ in these
# (cores, memory, the form of the CPU and OS strings), which would cut that model's history
# into one short line per host. The device's own keys (gpu, driver, cuda, sm_clock_mhz)
# still split it.
HOST_KEYS = ("cpu", "num_cpu", "ram", "os")
# The browser and the Debian packages holding VENDOR's files.
APT_PACKAGES = ("chromium", *dict.fromkeys(package for package, _ in VENDOR.values()))
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# asv.js's series colours, first two: the graph's points and lines are drawn in these.
SERIES_COLORS = ((0x24, 0x7A, 0xAD), (0xE2, 0x4A, 0x33))
_CDN_TAG = re.compile(r'<(script|link)\b[^>]*?(?:src|href)="https://[^"]*/([^"/]+)"[^>]*>')


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def _vendor_source(name: str) -> str | None:
    return next((path for path in VENDOR[name][1] if os.path.isfile(path)), None)


def missing_packages() -> list[str]:
    """The Debian packages (APT_PACKAGES) whose files are not here."""
    missing = [] if browser() else ["chromium"]
    for name, (package, _) in VENDOR.items():
        if _vendor_source(name) is None and package not in missing:
            missing.append(package)
    return missing


def unavailable_reason() -> str | None:
    """Why the dashboard cannot be drawn here (None when it can)."""
    missing = missing_packages()
    if not missing:
        return None
    what = ("headless chromium" if missing == ["chromium"] else
            "headless chromium and asv's JavaScript" if "chromium" in missing else
            "asv's JavaScript (needed with chromium)")
    return (f"dashboard rendering needs {what}: `apt-get install {' '.join(missing)}` "
            "(`make install` does this where apt-get can)")


def localize(html_dir: str | os.PathLike) -> list[str]:
    """Point index.html's CDN tags at vendor/ copies; returns the file names replaced."""
    html_dir = Path(html_dir)
    vendor = html_dir / "vendor"
    vendor.mkdir(exist_ok=True)
    replaced: list[str] = []

    def local_tag(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        if name in SHIMS:
            (vendor / name).write_text(SHIMS[name])
        elif name in VENDOR and (source := _vendor_source(name)):
            shutil.copyfile(source, vendor / name)
        else:
            why = unavailable_reason() or "unknown to kernels.bench.dashboard"
            raise FileNotFoundError(f"asv's index.html loads {name} from a CDN; no local copy "
                                    f"({why})")
        replaced.append(name)
        if kind == "script":
            return f'<script src="vendor/{name}">'  # its "</script>" follows
        return f'<link rel="stylesheet" href="vendor/{name}">'

    index = html_dir / "index.html"
    index.write_text(_CDN_TAG.sub(local_tag, index.read_text()))
    return replaced


def asv_config(repo: Path, results_dir: Path, html_dir: Path, branches: list[str] | None = None,
               **paths: Path) -> dict:
    """asv.conf.json with absolute paths: `repo`, the folders, and any other `paths` keys."""
    config = json.loads((ROOT / "asv.conf.json").read_text())
    config.update(repo=str(repo), results_dir=str(results_dir), html_dir=str(html_dir),
                  benchmark_dir=str(ROOT / "perf_tests"),
                  **{key: str(path) for key, path in paths.items()})
    if branches:
        config["branches"] = branches
    return config


@contextlib.contextmanager
def asv_command(config: dict, *args: str) -> Iterator[list[str]]:
    """`python -m asv ARGS --config FILE`, FILE holding `config` for the with-block. Run it from
    a checkout's root: asv imports the ".kernels.asv_plugin" plug-in relative to it."""
    with tempfile.TemporaryDirectory(prefix="kernelperf-asv-conf-") as tmp:
        path = Path(tmp) / "asv.conf.json"
        path.write_text(json.dumps(config))
        yield [sys.executable, "-m", "asv", *args, "--config", str(path)]


def run_asv(config: dict, *args: str, env: dict | None = None) -> str:
    """asv with `config` from the repository root, its output returned; raises if it fails."""
    with asv_command(config, *args) as command:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def regression_settings(results_dir: str | os.PathLike) -> tuple[dict, dict]:
    """The Regressions page's asv settings for `results_dir`, and the thresholds they hold:
    each searched row's threshold from its measured noise (asv's `regressions_thresholds`,
    keyed by the row's escaped entry name, which asv matches against the name and
    "@branch"; it takes the largest match) and the other benchmarks left out of the search
    (`regressions_first_commits` null). asv_tools.regression_thresholds says how."""
    from kernels.bench import asv_tools

    found = asv_tools.regression_thresholds(results_dir)
    searched = "|".join(asv_tools.REGRESSION_SEARCHED)
    return {"regressions_thresholds": {re.escape(name): bar.gap for name, bar in found.items()},
            "regressions_first_commits": {
                rf"benchmarks\.[^.(]+\.(?!({searched})([(@]|$))": None}}, found


def write_thresholds(html_dir: str | os.PathLike, found: dict) -> Path:
    """The thresholds (`regression_settings`) beside the published pages, with what set each."""
    path = Path(html_dir) / THRESHOLDS_NAME
    path.write_text(json.dumps({name: {"threshold": round(bar.gap, 5), "why": bar.why}
                                for name, bar in sorted(found.items())}, indent=1))
    return path


def publish(results_dir: str | os.PathLike, html_dir: str | os.PathLike, *,
            repo: str | os.PathLike = ROOT, branches: list[str] | None = None) -> Path:
    """`asv publish` of `results_dir` into `html_dir`, regressions searched with thresholds
    from the results' noise (`regression_settings`); it then works offline (`prepare`)."""
    html_dir = Path(html_dir).resolve()
    settings, found = regression_settings(results_dir)
    run_asv({**asv_config(Path(repo).resolve(), Path(results_dir).resolve(), html_dir, branches),
             **settings}, "publish", "--no-pull")
    write_thresholds(html_dir, found)
    prepare(html_dir)
    return html_dir


def prepare(html_dir: str | os.PathLike, *,
            offline: bool = True) -> dict[str, dict[str, list[str]]]:
    """Make an `asv publish` output work offline (`localize`; not with `offline=False`), load
    kernelperf.js after asv.js, and put each graph's default filters (`view_defaults`) into
    index.json; returns those."""
    html_dir = Path(html_dir)
    if offline:
        localize(html_dir)
    shutil.copyfile(SCRIPT, html_dir / SCRIPT_NAME)
    index_html = html_dir / "index.html"
    page, found = _ASV_SCRIPT.subn(rf'\1\n    <script src="{SCRIPT_NAME}"></script>',
                                   index_html.read_text(), count=1)
    if not found:  # another asv version's page: say so rather than publish without the views
        raise RuntimeError(f"{index_html}: no asv.js script tag to load {SCRIPT_NAME} after")
    index_html.write_text(page)
    defaults = view_defaults(html_dir)
    index_json = html_dir / "index.json"
    index = json.loads(index_json.read_text())
    index["kernelperf"] = {"defaults": defaults,
                           "list": {"machine": list_machine(html_dir, defaults)},
                           "regressions": _thresholds_summary(html_dir)}
    index_json.write_text(json.dumps(index, separators=(",", ":")))
    return defaults


def _thresholds_summary(html_dir: Path) -> dict:
    """What the Regressions page says of its thresholds (THRESHOLDS_NAME, where written)."""
    from kernels.bench import asv_tools

    path = html_dir / THRESHOLDS_NAME
    found = json.loads(path.read_text()) if path.is_file() else {}
    gaps = sorted(entry["threshold"] for entry in found.values())
    return {"file": THRESHOLDS_NAME if path.is_file() else None, "rows": len(gaps),
            "min": gaps[0] if gaps else None, "max": gaps[-1] if gaps else None,
            "median": statistics.median(gaps) if gaps else None,
            "searched": list(asv_tools.REGRESSION_SEARCHED)}


def _flat_combinations(shape: list[int]) -> list[tuple[int, ...]]:
    """Parameter index tuples in asv's flat order (the last parameter varies fastest)."""
    combos: list[tuple[int, ...]] = [()]
    for size in shape:
        combos = [(*combo, index) for combo in combos for index in range(size)]
    return combos


def _points(graph: list) -> set[int]:
    """Flat parameter indices with at least one value in a published graph file."""
    found: set[int] = set()
    for _, values in graph:
        if isinstance(values, list):
            found.update(i for i, value in enumerate(values) if value is not None)
        elif values is not None:
            found.add(0)
    return found


def view_defaults(html_dir: str | os.PathLike) -> dict[str, dict[str, list[str]]]:
    """The filters each benchmark's graph opens with, from the published graphs themselves.

    asv opens a graph on every machine, the first branch and the first values of
    each parameter (up to 8 lines), whether or not they have points: a GPU
    case for a CPU machine, or a branch the results are not on. Here, per
    benchmark: the branch whose graphs have points on the most machines
    (ties: asv's order, the checked-out branch first); for every parameter
    after the first (case, direction), the first value with points on each
    machine, the union over machines; for the first (implementation), every
    value with points among those. Series left without points are dropped by
    kernelperf.js, so each machine shows its own case. Keys are the page's URL
    filters (`branch`, `p-<parameter>`); values asv's (quoted reprs).
    """
    from asv.graph import Graph

    html_dir = Path(html_dir)
    index = json.loads((html_dir / "index.json").read_text())
    branches = index["params"].get("branch") or [None]
    defaults: dict[str, dict[str, list[str]]] = {}
    for name, entry in index["benchmarks"].items():
        params, names = entry.get("params") or [], entry.get("param_names") or []
        if not params or len(params) != len(names):
            continue
        combos = _flat_combinations([len(values) for values in params])
        # (branch, machine) -> flat indices with points
        seen: dict[tuple[str | None, str], set[int]] = {}
        for graph_params in index["graph_param_list"]:
            path = html_dir / f"{Graph.get_file_path(graph_params, name)}.json"
            if path.is_file():
                key = (graph_params.get("branch"), graph_params["machine"])
                seen.setdefault(key, set()).update(_points(json.loads(path.read_text())))
        if not any(seen.values()):
            continue
        branch = max(branches, key=lambda b: (sum(bool(flat) for (on, _), flat in seen.items()
                                                  if on == b), -branches.index(b)))
        per_machine = [flat for (on, _), flat in seen.items() if on == branch and flat]
        rest = [set() for _ in params[1:]]
        for flat in per_machine:
            first = min((combos[i][1:], combos[i]) for i in flat)[0]
            for chosen, index_ in zip(rest, first, strict=True):
                chosen.add(index_)
        lines = {combos[i][0] for flat in per_machine for i in flat
                 if all(index_ in chosen for chosen, index_ in zip(rest, combos[i][1:],
                                                                   strict=True))}
        chosen_values = {f"p-{names[0]}": [params[0][i] for i in sorted(lines)]}
        for param_names_index, chosen in enumerate(rest, start=1):
            chosen_values[f"p-{names[param_names_index]}"] = [params[param_names_index][i]
                                                              for i in sorted(chosen)]
        if branch is not None:
            chosen_values["branch"] = [branch]
        # Only machines with points: asv would fetch this graph for every machine, and a
        # machine without it (a multi-GPU one has only the sharded operations) is a 404.
        chosen_values["machine"] = [m for m in index["params"].get("machine", [])
                                    if seen.get((branch, m))]
        defaults[name] = chosen_values
    return defaults


def list_machine(html_dir: str | os.PathLike, defaults: dict[str, dict[str, list[str]]]
                 ) -> list[str]:
    """The machine the benchmark list opens on: the one with points for the most benchmarks
    (`view_defaults`), asv's order breaking ties; asv would open on its first machine."""
    machines = json.loads((Path(html_dir) / "index.json").read_text())["params"].get(
        "machine", [])
    counts = {m: sum(m in chosen.get("machine", []) for chosen in defaults.values())
              for m in machines}
    return [max(machines, key=lambda m: (counts[m], -machines.index(m)))] if machines else []


def _column(result: dict, name: str) -> int | None:
    columns = result.get("result_columns") or []
    return columns.index(name) if name in columns else None


def combine_results(sources: list[str | os.PathLike], into: str | os.PathLike, *,
                    lists: tuple[str | os.PathLike, ...] = ()) -> list[str]:
    """Merge asv results folders into `into` (emptied first) for one `asv publish`.

    Machine folders are copied (a machine found in several sources gets every
    file, a later source winning on the same file name). The benchmark list
    is every list there is, `lists` (other benchmarks.json files, e.g.
    KEPT_LIST) first, then each source's, a later one winning on an entry's
    fields; each parameter's values are the union over the lists and the
    result files, so results recorded on a GPU (real-size cases) and on a
    CPU (tiny cases) are both shown.

    asv publish shows a result only under the benchmark version it was recorded
    with. Per machine the version of its newest run of a benchmark is the one
    shown (asv's rule, applied to each machine alone): its results are
    relabelled, in this copy only, with the merged list's version, so a local
    run under other benchmark code never hides a GPU machine's results; that
    machine's results under older versions stay hidden. Both are named in the
    lines returned, with one line per source saying what it contributed.

    Results of one machine (one GPU model) taken on several hosts are drawn as one line:
    their HOST_KEYS are set, in this copy only, to the machine.json's.
    """
    into = Path(into)
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    merged: dict[str, dict] = {}
    listed: list[Path] = [Path(path) for path in lists]
    lines = []
    for source in map(Path, sources):
        machines = sorted(p.name for p in source.iterdir() if (p / "machine.json").is_file()) \
            if source.is_dir() else []
        if (source / "benchmarks.json").is_file():
            listed.append(source / "benchmarks.json")
        elif not machines:
            continue
        for machine in machines:
            shutil.copytree(source / machine, into / machine, dirs_exist_ok=True)
        lines.append(f"{source}: {', '.join(machines) or 'no machines'}")
    for listing in listed:
        if listing.is_file():
            for name, entry in json.loads(listing.read_text()).items():
                if isinstance(entry, dict):
                    merge_entry(merged, name, entry)
    # Every result file of every machine: the parameters it holds, and per (machine,
    # benchmark) the version of the newest run.
    files = result_files(into)
    newest: dict[tuple[str, str], tuple[float, str]] = {}
    unlisted: set[str] = set()
    for path, result in files.items():
        at_params, at_version, at_start = (_column(result, c) for c in
                                           ("params", "version", "started_at"))
        for name, row in result.get("results", {}).items():
            if name not in merged:
                unlisted.add(name)
                continue
            stored = row[at_params] if at_params is not None and len(row) > at_params else None
            if stored and len(stored) == len(merged[name].get("params") or []):
                merged[name]["params"] = [union([a, b]) for a, b in
                                          zip(merged[name]["params"], stored, strict=True)]
            version = row[at_version] if at_version is not None and len(row) > at_version \
                else None
            started = row[at_start] if at_start is not None and len(row) > at_start else None
            key = (path.parent.name, name)
            if key not in newest or (started or 0) >= newest[key][0]:
                newest[key] = (started or 0, version)
    relabelled: dict[tuple[str, str], str] = {}
    hidden: dict[tuple[str, str], int] = {}
    hosts: dict[str, int] = {}
    for path, result in files.items():
        at_version = _column(result, "version")
        machine = json.loads((path.parent / "machine.json").read_text())
        host = {key: machine[key] for key in HOST_KEYS if key in machine}
        params = result.setdefault("params", {})
        changed = any(params.get(key) != value for key, value in host.items())
        if changed:
            params.update(host)
            hosts[path.parent.name] = hosts.get(path.parent.name, 0) + 1
        for name, row in result.get("results", {}).items():
            if name not in merged or at_version is None or len(row) <= at_version:
                continue
            version, wanted = row[at_version], merged[name].get("version")
            if version == wanted:
                continue
            key = (path.parent.name, name)
            if version == newest[key][1]:
                row[at_version] = wanted
                relabelled[key] = version
                changed = True
            else:
                hidden[key] = hidden.get(key, 0) + 1
        if changed:
            path.write_text(json.dumps(result))
    for (machine, name), version in sorted(relabelled.items()):
        lines.append(f"{machine}: {name} recorded by other benchmark code (version "
                     f"{str(version)[:12]}, this list's {str(merged[name].get('version'))[:12]}):"
                     " shown")
    for machine, count in sorted(hosts.items()):
        lines.append(f"{machine}: {count} result(s) taken on other hosts of this machine drawn "
                     f"on its line ({', '.join(HOST_KEYS)} as in its machine.json)")
    for (machine, name), count in sorted(hidden.items()):
        lines.append(f"{machine}: {count} older result(s) of {name} not shown (recorded by an "
                     "earlier version of the benchmark than that machine's newest)")
    if unlisted:
        lines.append(f"not in any benchmark list, not shown: {', '.join(sorted(unlisted))}")
    merged["version"] = 2  # asv's benchmarks.json format
    (into / "benchmarks.json").write_text(json.dumps(merged, indent=1))
    return lines


def _current_branch(repo: Path) -> str | None:
    result = vcs.git(repo, "rev-parse", "--abbrev-ref", "HEAD", check=False)
    branch = result.stdout.strip()
    return branch if result.returncode == 0 and branch != "HEAD" else None


def published_branches(repo: Path) -> list[str]:
    """The branch checked out, then asv.conf.json's. A configured branch this clone has no
    local branch of (`main` in a clone of another branch) is taken from `origin/`; one it
    has nowhere is left out: asv publish fails on a name git does not know."""
    def known(name: str) -> bool:
        return vcs.git(repo, "rev-parse", "--verify", "-q", f"{name}^{{commit}}",
                       check=False).returncode == 0

    branches = [b for b in [_current_branch(repo)] if b]
    for branch in json.loads((ROOT / "asv.conf.json").read_text())["branches"]:
        name = branch if known(branch) else f"origin/{branch}"
        if known(name) and name not in branches:
            branches.append(name)
    return branches


def publish_all(html_dir: str | os.PathLike = ROOT / ".asv" / "html", *,
                sources: tuple[Path, ...] = (SHIPPED_RESULTS, LOCAL_RESULTS),
                lists: tuple[Path, ...] = (KEPT_LIST,)) -> Path:
    """The shipped results and this machine's, published together into `html_dir`, offline,
    for commits on the branch checked out (listed first: asv's default view) and
    asv.conf.json's branches."""
    combined = ROOT / ".asv" / "dashboard-results"
    for line in combine_results(list(sources), combined, lists=lists):
        print(f"dashboard: {line}", flush=True)
    branches = published_branches(ROOT)
    html_dir = publish(combined, html_dir, branches=branches)
    print(f"dashboard: published {html_dir} (branches {', '.join(branches)})")
    return html_dir


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    failed: list[str] | None = None  # where a request the server could not answer is noted

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass

    def log_request(self, code="-", size="-") -> None:
        if self.failed is not None and str(code).isdigit() and int(code) >= 400:
            self.failed.append(f"{int(code)} {self.path}")


@contextlib.contextmanager
def serve(directory: str | os.PathLike, failed: list[str] | None = None) -> Iterator[str]:
    """Serve `directory` on a free 127.0.0.1 port in a thread; yields its base URL. Each
    request it cannot answer ("404 /graphs/...") is appended to `failed`, if given."""
    handler = functools.partial(type("_Handler", (_QuietHandler,), {"failed": failed}),
                                directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# Headless chromium now and then never returns from a run with a virtual time budget (seen on
# the 2-core machine: a screenshot of the benchmark list hung past 60 s, then past 300 s, at
# loads of 10 and 5; then 8 s by hand and 14 s here): a run past its time limit is tried afresh.
CHROMIUM_ATTEMPTS = 2
# What chromium's log (--enable-logging=stderr) says of a message a page wrote to its console
# or an error it did not catch: '[...:INFO:CONSOLE:432] "Uncaught TypeError: ...", source:
# http://.../summarylist.js (432)' (older versions: CONSOLE(432)). Every level logs as INFO.
_CONSOLE_LINE = re.compile(r':CONSOLE[^\]]*\] "(?P<message>.*)", source: (?P<source>\S*) '
                           r'\((?P<line>\d+)\)\s*$')


def _chromium(url: str, *action: str, size: tuple[int, int], budget_ms: int,
              timeout: float, console: list[str] | None = None) -> str:
    """Headless chromium on `url` with `action` (--dump-dom or --screenshot=PATH); stdout.
    Each console message of the page ("message (source:line)") is appended to `console`."""
    executable = browser()
    if executable is None:
        raise FileNotFoundError(unavailable_reason())
    with tempfile.TemporaryDirectory(prefix="kernelperf-chromium-") as profile:
        command = [executable, "--headless", "--no-sandbox", "--disable-gpu",
                   "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
                   f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                   f"--virtual-time-budget={budget_ms}", "--enable-logging=stderr", "--v=0",
                   *action, url]
        for attempt in range(CHROMIUM_ATTEMPTS):
            try:
                result = subprocess.run(command, capture_output=True, text=True,
                                        timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                if attempt == CHROMIUM_ATTEMPTS - 1:
                    raise RuntimeError(f"chromium did not finish {url} within {timeout:g} s, "
                                       f"{CHROMIUM_ATTEMPTS} times ({' '.join(action)})"
                                       ) from None
    if result.returncode:
        raise RuntimeError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")
    if console is not None:
        for line in result.stderr.splitlines():
            if found := _CONSOLE_LINE.search(line):
                source = found["source"].rsplit("/", 1)[-1]
                console.append(f"{found['message']} ({source}:{found['line']})")
    return result.stdout


# The pages asv publishes, by the name check_pages gives them: the address fragment of each
# (the graph page's is the benchmark's, DEFAULT_GRAPH unless told).
DEFAULT_GRAPH = "benchmarks.Softmax.time_device"
PAGES = {"grid": "", "graph": None, "list": "summarylist", "regressions": "regressions"}
# One chromium run of a page takes 2-8 s on a 2-core machine.
CHECK_TIMEOUT_S = 90.0


def page_content(name: str, dom: str) -> str:
    """What one of PAGES shows, in a few words (what check_pages prints beside it)."""
    if name == "grid":
        tiles = dom.count('class="btn benchmark-container"')
        drawn = len(re.findall(r'id="summarygrid-[^"]*" class="[^"]*"[^>]*>\s*<canvas', dom))
        return f"{tiles} benchmarks, {drawn} tiles drawn in the window"
    if name == "list":
        rows = dom.count('<td class="value"')
        valued = len(re.findall(r'<td class="value"[^>]*><span', dom))
        return f"{rows} rows, {valued} with a value"
    if name == "regressions":
        found = re.search(r'id="regressions-body"[^>]*data-kernelperf="([^"]*)"', dom) or \
            re.search(r'data-kernelperf="([^"]*)"[^>]*id="regressions-body"', dom)
        if not found:
            return "no regression table"
        rows = json.loads(html.unescape(found.group(1)))["rows"]
        none = " (\"No regression\" said)" if "kernelperf-none" in dom else ""
        return "regressions listed: " + ", ".join(
            f"{count} on {branch or 'the branch'}" for branch, count in rows.items()) + none
    facts = graph_facts(dom)
    return (f"{sum(points for _, points in facts.series)} points in {len(facts.series)} series, "
            f"{facts.hidden_empty} without points left out; x ticks "
            f"{', '.join(text for _, text in facts.x_ticks) or '-'}")


def check_pages(html_dir: str | os.PathLike, out: str | os.PathLike | None = None, *,
                graph: str = DEFAULT_GRAPH, size: tuple[int, int] = (1400, 900),
                opening: Callable[[str], None] | None = None,
                done: Callable[[str, PageFacts, str], None] | None = None,
                timeout: float = CHECK_TIMEOUT_S) -> dict[str, tuple[PageFacts, str]]:
    """Open every page asv publishes (PAGES) of a published dashboard in headless chromium;
    per page, (what chromium saw, `page_content`), each also handed to `done` as it is
    seen (and its name to `opening` before chromium starts on it). With `out`: <page>.png and
    <page>.console.txt (its console messages and failed requests, or that there were none)
    written there."""
    found = {}
    for name, page in PAGES.items():
        page = graph if page is None else page
        png = Path(out) / f"{name}.png" if out is not None else None
        if opening is not None:
            opening(name)
        facts = open_page(html_dir, page, png, size=size, timeout=timeout)
        found[name] = (facts, page_content(name, facts.dom))
        if out is not None:
            lines = [f"page: {facts.url}", *(f"console: {line}" for line in facts.console),
                     *(f"request failed: {line}" for line in facts.failed)]
            if not facts.console and not facts.failed:
                lines.append("no console messages, no failed requests")
            (Path(out) / f"{name}.console.txt").write_text("\n".join(lines) + "\n")
        if done is not None:
            done(name, *found[name])
    return found


def page_url(base: str, benchmark: str, params: dict[str, str] | None = None) -> str:
    """The dashboard address of `benchmark`'s graph, e.g. benchmarks.Softmax.time_device."""
    query = "&".join(f"{key}={value}" for key, value in (params or {}).items())
    return f"{base}#{benchmark}" + (f"?{query}" if query else "")


@dataclasses.dataclass(frozen=True)
class PageFacts:
    """What headless chromium saw of one dashboard page."""

    url: str
    dom: str  # the page's DOM once its scripts ran (the virtual time budget)
    console: tuple[str, ...]  # every console message and uncaught error, "text (file:line)"
    failed: tuple[str, ...]  # requests the server could not answer, "404 /path"

    @property
    def loading(self) -> bool:
        """The page still says "Loading..." (its data never arrived or a script died)."""
        return "Loading..." in self.dom

    @property
    def error_page(self) -> bool:
        """asv sent the page to error.html (a script did not load)."""
        return _error_page(self.dom)

    def problems(self) -> list[str]:
        """What is wrong with the page; empty when it loaded cleanly."""
        found = ["asv's error page: a script did not load"] if self.error_page else []
        found += ["still says Loading..."] if self.loading else []
        return (found + [f"console: {line}" for line in self.console]
                + [f"request failed: {line}" for line in self.failed])


def _error_page(dom: str) -> bool:
    # error.html's title; asv's pages all carry the graph page's #main-graph.
    return "airspeed velocity error" in dom or 'id="main-graph"' not in dom


def open_page(html_dir: str | os.PathLike, page: str = "", png: str | os.PathLike | None = None,
              *, params: dict[str, str] | None = None, size: tuple[int, int] = (1400, 900),
              budget_ms: int = 10000, timeout: float = 60.0) -> PageFacts:
    """Open a page of a published dashboard in headless chromium: "" the grid, a benchmark
    (benchmarks.Softmax.time_device) its graph, "summarylist" the benchmark list,
    "regressions" the regressions; a PNG of it to `png` if given. What it saw, with the page's
    console messages and the requests it made that the server could not answer."""
    console: list[str] = []
    failed: list[str] = []
    with serve(html_dir, failed) as base:
        url = page_url(base, page, params)
        shot = []
        if png is not None:
            png = Path(png).resolve()
            png.parent.mkdir(parents=True, exist_ok=True)
            png.unlink(missing_ok=True)
            shot = [f"--screenshot={png}"]
        # One run dumps the DOM and takes the screenshot (chromium 150 does both; each run
        # costing seconds of two cores); a chromium that does one action only gets a second.
        dom = _chromium(url, "--dump-dom", *shot, size=size, budget_ms=budget_ms,
                        timeout=timeout, console=console)
        if png is not None and not png.is_file():
            _chromium(url, *shot, size=size, budget_ms=budget_ms, timeout=timeout,
                      console=console)
            if not png.is_file():
                raise RuntimeError(f"chromium wrote no screenshot to {png}")
    return PageFacts(url.removeprefix(base), dom, tuple(dict.fromkeys(console)),
                     tuple(dict.fromkeys(failed)))


def render(html_dir: str | os.PathLike, benchmark: str, png: str | os.PathLike | None = None, *,
           params: dict[str, str] | None = None, size: tuple[int, int] = (1400, 900),
           budget_ms: int = 10000, timeout: float = 60.0) -> str:
    """Open `benchmark`'s page of a published dashboard in headless chromium; write a PNG of it
    to `png` if given; returns the page's DOM once its scripts have run (`open_page`)."""
    return open_page(html_dir, benchmark, png, params=params, size=size, budget_ms=budget_ms,
                     timeout=timeout).dom


@dataclasses.dataclass(frozen=True)
class GraphFacts:
    """What a dumped dashboard page shows of its main graph."""

    error_page: bool  # asv sent the page to error.html (a script failed to load)
    canvases: int  # flot's canvases in #main-graph (flot-base, flot-overlay)
    tick_labels: tuple[str, ...]  # the axes' tick labels flot drew as text
    legend: tuple[str, ...]  # the legend's labels (kernelperf.js: one per series with points)
    # (label, points) of each series drawn, as kernelperf.js recorded them
    series: tuple[tuple[str, int], ...] = ()
    hidden_empty: int = 0  # series of the selection without a point, left out
    axes: tuple[str, str] = ("", "")  # the x and y axis labels
    # (left edge in pixels, text) of each x-axis tick label, left to right
    x_ticks: tuple[tuple[int, str], ...] = ()

    @property
    def drawn(self) -> bool:
        """flot drew the graph's axes and at least one point (pixels: `series_pixels`)."""
        return (not self.error_page and self.canvases >= 2 and len(self.tick_labels) >= 2
                and any(points for _, points in self.series))


def graph_facts(dom: str) -> GraphFacts:
    start = dom.find('id="main-graph"')
    graph = dom[start:dom.find('id="overview"', start)] if start >= 0 else ""
    recorded = re.search(r'data-kernelperf="([^"]*)"', dom)
    drawn = json.loads(html.unescape(recorded.group(1))) if recorded else {}
    return GraphFacts(
        error_page=_error_page(dom),
        canvases=len(re.findall(r'<canvas class="flot-(?:base|overlay)"', graph)),
        tick_labels=tuple(re.findall(r'class="flot-tick-label[^"]*"[^>]*>([^<]*)<', graph)),
        legend=tuple(html.unescape(label) for label in
                     re.findall(r'class="legendLabel"[^>]*>(?:<span>)?([^<]*)<', dom)),
        series=tuple((s["label"], s["points"]) for s in drawn.get("series", [])),
        hidden_empty=drawn.get("hidden_empty", 0),
        axes=(drawn.get("xaxis", ""), drawn.get("yaxis", "")),
        x_ticks=tuple(sorted((int(left), html.unescape(text)) for left, text in re.findall(
            r'class="flot-tick-label[^"]*" style="[^"]*left: (\d+)px[^"]*">([^<]*)<',
            _x_axis(graph)))))


def _x_axis(graph: str) -> str:
    """The part of a graph's DOM holding flot's x-axis labels."""
    start = graph.find('class="flot-x-axis')
    return graph[start:graph.find('class="flot-y-axis', start)] if start >= 0 else ""


def series_pixels(png: str | os.PathLike) -> int:
    """Pixels of the PNG in asv's first two series colours (points and lines of the graph)."""
    import numpy as np
    from matplotlib import image

    rgb = (image.imread(str(png))[..., :3] * 255).round().astype(int)
    return int(sum(np.all(np.abs(rgb - color) <= 8, axis=-1).sum() for color in SERIES_COLORS))


def screenshot(results_dir: str | os.PathLike, benchmark: str, png: str | os.PathLike, *,
               html_dir: str | os.PathLike | None = None, branches: list[str] | None = None,
               params: dict[str, str] | None = None, size: tuple[int, int] = (1400, 900),
               repo: str | os.PathLike = ROOT) -> GraphFacts:
    """Publish `results_dir` and draw `benchmark`'s graph into `png`; what the page shows."""
    with contextlib.ExitStack() as stack:
        if html_dir is None:
            html_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kernelperf-html-"))
        publish(results_dir, html_dir, repo=repo, branches=branches)
        dom = render(html_dir, benchmark, png, params=params, size=size)
    return graph_facts(dom)


def results_problem(results_dir: str | os.PathLike) -> str | None:
    """Why `results_dir` is not an asv results folder (None when it is one)."""
    path = Path(results_dir)
    if not path.is_dir():
        return "which is a file" if path.exists() else "which does not exist"
    if not (path / "benchmarks.json").is_file():
        return "which has no benchmarks.json"
    if not any((p / "machine.json").is_file() for p in path.iterdir()):
        return "which has no machine folder (<machine>/machine.json)"
    return None


def benchmark_names(results_dir: str | os.PathLike) -> list[str]:
    """The benchmarks a results folder's benchmarks.json lists."""
    listing = json.loads((Path(results_dir) / "benchmarks.json").read_text())
    return sorted(name for name, entry in listing.items() if isinstance(entry, dict))


def result_files(results_dir: str | os.PathLike) -> dict[Path, dict]:
    """Every result file of every machine in an asv results folder (<machine>/<commit>-...
    .json, not machine.json), read, in path order."""
    return {path: json.loads(path.read_text())
            for path in sorted(Path(results_dir).glob("*/*.json"))
            if path.name != "machine.json"}


def machines_with(results_dir: str | os.PathLike, benchmark: str) -> list[str]:
    """The machines of an asv results folder whose results hold `benchmark` (a multi-GPU
    machine's shipped results hold only the sharded operations)."""
    return sorted({path.parent.name for path, result in result_files(results_dir).items()
                   if benchmark in result.get("results", {})})


class _Mistake(Exception):
    """A user's mistake on the command line: one line, exit 2."""


def _screenshot_arguments(args: argparse.Namespace) -> tuple[str, tuple[int, int], dict]:
    """(benchmark, window size, page filters) from the command line, or _Mistake."""
    problem = results_problem(args.results_dir)
    if problem:
        raise _Mistake(f"results_dir: expected an asv results folder (benchmarks.json and "
                       f"machine folders), got {args.results_dir!r}, {problem}")
    benchmark = args.benchmark if args.benchmark.startswith("benchmarks.") \
        else f"benchmarks.{args.benchmark}"
    names = benchmark_names(args.results_dir)
    if benchmark not in names:
        shown = ", ".join(n.removeprefix("benchmarks.") for n in names[:8])
        raise _Mistake(f"benchmark: expected one of {args.results_dir}'s benchmarks ({shown}"
                       f"{', ...' if len(names) > 8 else ''}), got {args.benchmark!r}")
    width, _, height = args.size.lower().partition("x")
    if not (width.isdigit() and height.isdigit() and int(width) >= 200 and int(height) >= 200):
        raise _Mistake(f"--size: expected WIDTHxHEIGHT in pixels, each at least 200, got "
                       f"{args.size!r}")
    bad = [p for p in args.param if "=" not in p or not p.split("=", 1)[0]]
    if bad:
        raise _Mistake(f"--param: expected KEY=VALUE (e.g. x-axis=implementation), got {bad[0]!r}")
    return benchmark, (int(width), int(height)), dict(p.split("=", 1) for p in args.param)


def _check_pages_command(prog: str, args: argparse.Namespace) -> int:
    if not all((Path(args.check_pages) / name).is_file() for name in ("index.html",
                                                                       "index.json")):
        print(f"{prog}: error: --check-pages: expected a published dashboard folder, got "
              f"{args.check_pages!r}, which has no index.html and index.json", file=sys.stderr)
        return 2
    graph = args.graph if args.graph.startswith("benchmarks.") else f"benchmarks.{args.graph}"
    names = sorted(json.loads((Path(args.check_pages) / "index.json").read_text())["benchmarks"])
    if graph not in names:
        shown = ", ".join(n.removeprefix("benchmarks.") for n in names[:8])
        print(f"{prog}: error: --graph: expected one of the dashboard's benchmarks ({shown}"
              f"{', ...' if len(names) > 8 else ''}), got {args.graph!r}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    def say(name: str, facts: PageFacts, content: str) -> None:
        problems = facts.problems()
        print(f"{'FAILED' if problems else 'ok':6s} #{facts.url.partition('#')[2]}: {content}",
              flush=True)
        for problem in problems:
            print(f"    {problem}", flush=True)

    try:
        # The page's name as chromium starts on it, its verdict on the same line once seen:
        # a page takes seconds, the benchmark list the most.
        pages = check_pages(args.check_pages, args.out, graph=graph, done=say,
                            opening=lambda name: print(f"{name:12s} ", end="", flush=True))
    except RuntimeError as error:  # chromium failed or hung on a page
        print(flush=True)  # ends the line of the page it was opening
        print(f"{prog}: {error}", file=sys.stderr)
        return 1
    failed = sum(bool(facts.problems()) for facts, _ in pages.values())
    if args.out:
        print(f"wrote {args.out}/<page>.png and <page>.console.txt")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", nargs="?", help="asv results folder (machine folders "
                        "and benchmarks.json), e.g. perf_tests/results/asv")
    parser.add_argument("benchmark", nargs="?", help="e.g. benchmarks.Softmax.time_device "
                        "(the benchmarks. prefix may be left out)")
    parser.add_argument("--png", help="where to write the screenshot")
    parser.add_argument("--html-dir", help="keep the published dashboard here (default: temp)")
    parser.add_argument("--branch", action="append", help="branches to show (default: "
                        "asv.conf.json's); results on no listed branch are left out")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="page filter, e.g. x-axis=implementation, "
                        "p-implementation='pallas' or machine=... (unset ones take the "
                        "defaults that have points)")
    parser.add_argument("--size", default="1400x900", help="window WIDTHxHEIGHT")
    parser.add_argument("--missing-packages", action="store_true",
                        help="print the Debian packages this needs and lacks, then exit")
    parser.add_argument("--localize", metavar="HTML_DIR", help="only make an `asv publish` "
                        "output work offline, with kernelperf's views (`prepare`), then exit")
    parser.add_argument("--check-pages", metavar="HTML_DIR", help="open every page of a "
                        "published dashboard (grid, a graph, benchmark list, regressions) in "
                        "headless chromium; exit 1 if one fails to load, logs to its console "
                        "or asks for a file the folder lacks")
    parser.add_argument("--graph", default=DEFAULT_GRAPH, help="the graph page --check-pages "
                        f"opens (default {DEFAULT_GRAPH})")
    parser.add_argument("--out", help="where --check-pages writes <page>.png and "
                        "<page>.console.txt")
    parser.add_argument("--publish", metavar="HTML_DIR", help="publish the shipped results "
                        f"({SHIPPED_RESULTS.relative_to(ROOT)}) and this machine's "
                        f"({LOCAL_RESULTS.relative_to(ROOT)}) together into HTML_DIR, then exit")
    args = parser.parse_args(argv)
    if args.publish:
        reason = unavailable_reason() if missing_packages() != ["chromium"] else None
        if reason:  # publishing needs the JavaScript copies, not the browser
            print(reason, file=sys.stderr)
            return 2
        try:
            publish_all(args.publish)
        except RuntimeError as error:  # asv publish failed: its own output says why
            print(f"{parser.prog}: {error}", file=sys.stderr)
            return 1
        return 0
    if args.missing_packages:
        print(" ".join(missing_packages()))
        return 0
    if args.check_pages:
        return _check_pages_command(parser.prog, args)
    if args.localize:
        if not (Path(args.localize) / "index.html").is_file():
            print(f"{parser.prog}: error: --localize: expected an `asv publish` output folder, "
                  f"got {args.localize!r}, which has no index.html", file=sys.stderr)
            return 2
        defaults = prepare(args.localize)
        print(f"{args.localize}: scripts served locally, {SCRIPT_NAME} loaded, default "
              f"filters for {len(defaults)} graphs")
        return 0
    if not (args.results_dir and args.benchmark and args.png):
        print(f"{parser.prog}: error: results_dir, benchmark and --png: expected all three "
              f"(or --publish, --localize, --missing-packages), got "
              f"{[a for a in (args.results_dir, args.benchmark) if a]}"
              f"{' and --png' if args.png else ''}", file=sys.stderr)
        return 2
    try:
        benchmark, size, params = _screenshot_arguments(args)
    except _Mistake as mistake:
        print(f"{parser.prog}: error: {mistake}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    facts = screenshot(args.results_dir, benchmark, args.png, html_dir=args.html_dir,
                       branches=args.branch, size=size, params=params)
    pixels = series_pixels(args.png)
    drawn = facts.drawn and pixels > 0
    labels = [f"{label} ({points})" for label, points in facts.series]
    print(f"wrote {args.png}: {'graph drawn' if drawn else 'NO GRAPH DRAWN'}; "
          f"{len(labels)} series with points ({', '.join(labels[:6])}"
          f"{', ...' if len(labels) > 6 else ''}), {facts.hidden_empty} without points left "
          f"out; axes {facts.axes[0] or '-'} / {facts.axes[1] or '-'}; {pixels} pixels in "
          f"series colours; {len(facts.tick_labels)} tick labels")
    return 0 if drawn else 1


if __name__ == "__main__":
    raise SystemExit(main())
