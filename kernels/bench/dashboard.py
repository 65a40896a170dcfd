"""The asv dashboard without network, and a picture of one benchmark's graph.

asv 0.6.6's `index.html` loads jQuery, flot, bootstrap, md5 and stupidtable
from CDNs (and sends the page to error.html when one fails), so on a machine
with no internet access (the GPU machine, CI) the published dashboard draws
nothing. `localize(html_dir)` points those tags at copies under `vendor/`,
taken from Debian packages (`APT_PACKAGES`: jQuery 3.3.1 and flot 0.8.3, the
versions asv asks for; bootstrap 3.4.1 for asv's 3.1.1); the two plug-ins
Debian lacks get one-line stand-ins (`SHIMS`: no table sorting, bars drawn
unordered). Line graphs, the dashboard's graphs, need neither.

`publish_all(html_dir)` (`make dashboard`, `make bench`) publishes the
results the repository ships (`perf_tests/results/asv/`, one folder per GPU
model) together with this machine's (`.asv/results/`), merged by
`combine_results`, for commits on main and on the branch checked out.

`screenshot(results_dir, benchmark, png)` publishes a results folder into a
dashboard, serves it on 127.0.0.1 (asv's pages fetch their JSON, which file://
does not allow), and has headless Chromium draw the benchmark's page into a
PNG; it returns the page's DOM after the scripts ran, for `graph_facts`.

    python -m kernels.bench.dashboard perf_tests/results/asv benchmarks.Softmax.time_device \\
        --png traces/softmax.png
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from kernels.bench import vcs

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
    "bootstrap.min.js": ("libjs-bootstrap", [f"{_BOOTSTRAP}/js/bootstrap.min.js"]),
    "bootstrap.min.css": ("libjs-bootstrap", [f"{_BOOTSTRAP}/css/bootstrap.min.css"]),
}
# Plug-ins with no Debian copy; what stands in for them.
SHIMS = {
    "jquery.flot.orderBars.js": "/* kernelperf: orderBars left out; bars drawn in place */\n",
    "stupidtable.min.js": "/* kernelperf: stupidtable left out; tables not sortable */\n"
                          "jQuery.fn.stupidtable = function () { return this; };\n",
}
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


def publish(results_dir: str | os.PathLike, html_dir: str | os.PathLike, *,
            repo: str | os.PathLike = ROOT, branches: list[str] | None = None) -> Path:
    """`asv publish` of `results_dir` into `html_dir`, which then works offline."""
    html_dir = Path(html_dir).resolve()
    run_asv(asv_config(Path(repo).resolve(), Path(results_dir).resolve(), html_dir, branches),
         "publish", "--no-pull")
    localize(html_dir)
    return html_dir


def _union(lists: list[list]) -> list:
    return list(dict.fromkeys(item for values in lists for item in values))


def combine_results(sources: list[str | os.PathLike], into: str | os.PathLike) -> list[str]:
    """Merge asv results folders into `into` (emptied first) for one `asv publish`.

    Machine folders are copied (a machine found in several sources gets every
    file, a later source winning on the same file name). benchmarks.json takes
    each benchmark from the last source that has it, with each parameter's
    values the union over the sources, so results recorded on a GPU (real-size
    cases) and on a CPU (tiny cases) are both shown. asv publish leaves out
    results whose benchmark version (a hash of its code) differs from the
    merged one; those are named in the lines returned.

    Returns one line per source saying what it contributed.
    """
    into = Path(into)
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    merged: dict[str, dict] = {}
    found: list[tuple[Path, dict, list[str]]] = []
    for source in map(Path, sources):
        listing = source / "benchmarks.json"
        if not listing.is_file():
            continue
        benchmarks = json.loads(listing.read_text())
        machines = sorted(p.name for p in source.iterdir() if (p / "machine.json").is_file())
        found.append((source, benchmarks, machines))
        for name, entry in benchmarks.items():
            if not isinstance(entry, dict):
                continue
            before = merged.get(name)
            merged[name] = dict(entry)
            if before and before.get("params") and entry.get("params"):
                merged[name]["params"] = [_union([a, b]) for a, b in
                                          zip(before["params"], entry["params"], strict=True)]
        for machine in machines:
            shutil.copytree(source / machine, into / machine, dirs_exist_ok=True)
    lines = []
    for source, benchmarks, machines in found:
        stale = sorted(name for name, entry in benchmarks.items() if isinstance(entry, dict)
                       and entry.get("version") != merged[name].get("version"))
        lines.append(f"{source}: {', '.join(machines) or 'no machines'}" +
                     (f"; not shown, recorded by other code: {', '.join(stale)}" if stale else ""))
    merged["version"] = 2  # asv's benchmarks.json format
    (into / "benchmarks.json").write_text(json.dumps(merged, indent=1))
    return lines


def _current_branch(repo: Path) -> str | None:
    result = vcs.git(repo, "rev-parse", "--abbrev-ref", "HEAD", check=False)
    branch = result.stdout.strip()
    return branch if result.returncode == 0 and branch != "HEAD" else None


def publish_all(html_dir: str | os.PathLike = ROOT / ".asv" / "html", *,
                sources: tuple[Path, ...] = (SHIPPED_RESULTS, LOCAL_RESULTS)) -> Path:
    """The shipped results and this machine's, published together into `html_dir`, offline,
    for commits on asv.conf.json's branches and the branch checked out."""
    combined = ROOT / ".asv" / "dashboard-results"
    for line in combine_results(list(sources), combined):
        print(f"dashboard: {line}")
    branches = json.loads((ROOT / "asv.conf.json").read_text())["branches"]
    current = _current_branch(ROOT)
    if current and current not in branches:
        branches = [*branches, current]
    html_dir = publish(combined, html_dir, branches=branches)
    print(f"dashboard: published {html_dir} (branches {', '.join(branches)})")
    return html_dir


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass


@contextlib.contextmanager
def serve(directory: str | os.PathLike) -> Iterator[str]:
    """Serve `directory` on a free 127.0.0.1 port in a thread; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _chromium(url: str, *action: str, size: tuple[int, int], budget_ms: int,
              timeout: float) -> str:
    """Headless chromium on `url` with `action` (--dump-dom or --screenshot=PATH); stdout."""
    executable = browser()
    if executable is None:
        raise FileNotFoundError(unavailable_reason())
    with tempfile.TemporaryDirectory(prefix="kernelperf-chromium-") as profile:
        command = [executable, "--headless", "--no-sandbox", "--disable-gpu",
                   "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
                   f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                   f"--virtual-time-budget={budget_ms}", *action, url]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode:
        raise RuntimeError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")
    return result.stdout


def page_url(base: str, benchmark: str, params: dict[str, str] | None = None) -> str:
    """The dashboard address of `benchmark`'s graph, e.g. benchmarks.Softmax.time_device."""
    query = "&".join(f"{key}={value}" for key, value in (params or {}).items())
    return f"{base}#{benchmark}" + (f"?{query}" if query else "")


def render(html_dir: str | os.PathLike, benchmark: str, png: str | os.PathLike | None = None, *,
           params: dict[str, str] | None = None, size: tuple[int, int] = (1400, 900),
           budget_ms: int = 10000, timeout: float = 60.0) -> str:
    """Open `benchmark`'s page of a published dashboard in headless chromium; write a PNG of it
    to `png` if given; returns the page's DOM once its scripts have run."""
    with serve(html_dir) as base:
        url = page_url(base, benchmark, params)
        dom = _chromium(url, "--dump-dom", size=size, budget_ms=budget_ms, timeout=timeout)
        if png is not None:
            png = Path(png).resolve()
            png.parent.mkdir(parents=True, exist_ok=True)
            _chromium(url, f"--screenshot={png}", size=size, budget_ms=budget_ms,
                      timeout=timeout)
            if not png.is_file():
                raise RuntimeError(f"chromium wrote no screenshot to {png}")
    return dom


@dataclasses.dataclass(frozen=True)
class GraphFacts:
    """What a dumped dashboard page shows of its main graph."""

    error_page: bool  # asv sent the page to error.html (a script failed to load)
    canvases: int  # flot's canvases in #main-graph (flot-base, flot-overlay)
    tick_labels: list[str]  # the axes' tick labels flot drew as text
    legend: list[str]  # one label per plotted series; none when there is one series

    @property
    def drawn(self) -> bool:
        """flot drew the graph's axes; whether points were drawn: `series_pixels`."""
        return not self.error_page and self.canvases >= 2 and len(self.tick_labels) >= 2


def graph_facts(dom: str) -> GraphFacts:
    start = dom.find('id="main-graph"')
    graph = dom[start:dom.find('id="overview"', start)] if start >= 0 else ""
    return GraphFacts(
        error_page="Can not load required JavaScript" in dom or 'id="main-graph"' not in dom,
        canvases=len(re.findall(r'<canvas class="flot-(?:base|overlay)"', graph)),
        tick_labels=re.findall(r'class="flot-tick-label[^"]*"[^>]*>([^<]*)<', graph),
        legend=re.findall(r'class="legendLabel"[^>]*>(?:<span>)?([^<]*)<', graph))


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
                        help="page filter, e.g. p-implementation=pallas or machine=...")
    parser.add_argument("--size", default="1400x900", help="window WIDTHxHEIGHT")
    parser.add_argument("--missing-packages", action="store_true",
                        help="print the Debian packages this needs and lacks, then exit")
    parser.add_argument("--localize", metavar="HTML_DIR", help="only point an `asv publish` "
                        "output's CDN scripts at local copies, then exit")
    parser.add_argument("--publish", metavar="HTML_DIR", help="publish the shipped results "
                        f"({SHIPPED_RESULTS.relative_to(ROOT)}) and this machine's "
                        f"({LOCAL_RESULTS.relative_to(ROOT)}) together into HTML_DIR, then exit")
    args = parser.parse_args(argv)
    if args.publish:
        reason = unavailable_reason() if missing_packages() != ["chromium"] else None
        if reason:  # publishing needs the JavaScript copies, not the browser
            print(reason, file=sys.stderr)
            return 2
        publish_all(args.publish)
        return 0
    if args.missing_packages:
        print(" ".join(missing_packages()))
        return 0
    if args.localize:
        print(f"{args.localize}: {len(localize(args.localize))} scripts served locally")
        return 0
    if not (args.results_dir and args.benchmark and args.png):
        parser.error("results_dir, benchmark and --png are required")
    reason = unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    width, height = (int(n) for n in args.size.lower().split("x"))
    benchmark = args.benchmark if args.benchmark.startswith("benchmarks.") \
        else f"benchmarks.{args.benchmark}"
    facts = screenshot(args.results_dir, benchmark, args.png, html_dir=args.html_dir,
                       branches=args.branch, size=(width, height),
                       params=dict(p.split("=", 1) for p in args.param))
    pixels = series_pixels(args.png)
    drawn = facts.drawn and pixels > 0
    print(f"wrote {args.png}: {'graph drawn' if drawn else 'NO GRAPH DRAWN'}; "
          f"{len(facts.legend) or 'one'} series ({', '.join(facts.legend[:6])}"
          f"{', ...' if len(facts.legend) > 6 else ''}), {pixels} pixels in their colours; "
          f"{len(facts.tick_labels)} tick labels")
    return 0 if drawn else 1

if __name__ == "__main__":
    raise SystemExit(main())
