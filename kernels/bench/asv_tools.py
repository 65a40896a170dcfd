"""asv helpers: the machine name, running commits, and comparing results the right way up.

`bench(revisions)` registers this machine with asv under its normalised GPU
(or CPU) model name, so results are kept per GPU model, and runs asv on each
revision. `run()` compares two commits' results with a verdict per row.

asv 0.6 treats a larger number as worse for every benchmark, so a drop in
TFLOP/s would read as an improvement, and `asv compare` always exits 0. Here:

  time_device   lower is better. Each row has its own gap, which a change must
                exceed to count (`threshold`): `min_gap` (1%) where the clock
                resolves it, wider where the samples' spread (4 standard errors
                of the ratio of medians) or the benchmark's learned run-to-run
                shift (its noise floor) is wider, and the table says which.
                asv's own test (`asv._stats.is_different`: Mann-Whitney U at
                p < 0.002, or 99% confidence intervals) must also tell the
                samples apart: "faster" / "slower", "same", "same (within
                sample noise)" / "same (within noise floor)", or "too noisy to
                tell" (a large change the samples cannot confirm). `python -m
                kernels bench` then confirms each "slower" row by measuring base
                and head again, interleaved (kernels.bench.confirm).
  track_*       no samples (asv keeps none for track_): higher is better for
                TFLOP/s, GB/s, roofline fraction and speedup, lower for memory;
                judged by ratio against `min_gap` and the floor alone, and
                labelled so.

Exit status of `run()`: 1 if any time_device row is slower or a benchmark that ran
on the base failed on the head, else 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
import subprocess
import time
from pathlib import Path

from kernels.bench import listing, recover
from kernels.core import environment

LOWER_IS_BETTER = {"time_device": True, "track_tflops": False, "track_gbps": False,
                   "track_roofline": False, "track_speedup": False, "track_peak_memory": True,
                   "track_launch": True}
UNITS = {"time_device": "s", "track_tflops": "TFLOP/s", "track_gbps": "GB/s",
         "track_roofline": "of roof", "track_speedup": "x", "track_peak_memory": "B",
         "track_launch": "us (host)"}
# The smallest change the gate calls where the clock resolves it: the device clock's samples
# spread 0.1-0.5% at these sizes, and a regression of 2% must be caught.
DEFAULT_MIN_GAP = 0.01
# A change must exceed this many standard errors of log(head / base), from the samples' robust
# spread on each side (kernels.core.timing.robust_cv).
NOISE_SIGMAS = 4.0
# The smallest change the gate is asked to see; rows that cannot resolve it are listed.
TARGET_CHANGE = 0.02
# Numbers computed from time_device's median (so as noisy as it, whatever their direction).
FROM_DEVICE_TIME = ("track_tflops", "track_gbps", "track_roofline", "track_speedup")
# The host's launch cost per call moves with the machine's load; it is recorded, never gated.
HOST_GAP = 0.25
# What perf_tests/benchmarks.py defines only under DASHBOARD_VARIABLE: the gate's own run
# (`kernels bench --base`) records time and memory alone unless asked (--dashboard).
DASHBOARD_METHODS = (*FROM_DEVICE_TIME, "track_launch")


@dataclasses.dataclass(frozen=True)
class Result:
    value: float | None
    samples: list[float] | None
    stats: dict | None
    # When asv started this benchmark (ms since the epoch, asv's own stamp): a results file
    # keeps every benchmark's last value, so this tells the ones a given run measured.
    started_at: float | None = None


@dataclasses.dataclass(frozen=True)
class Row:
    benchmark: str
    params: tuple[str, ...]
    base: float | None
    head: float | None
    ratio: float | None
    verdict: str
    gap: float | None = None  # the change this row had to exceed (`threshold`)
    why: str | None = None  # what set the gap above min_gap
    confirmed: str | None = None  # the interleaved re-measurement's ratios, where one ran


@dataclasses.dataclass(frozen=True)
class Threshold:
    """The relative change one row must exceed, and what set it when more than min_gap."""

    gap: float
    why: str | None = None


def _standard_error(result: Result | None) -> float | None:
    """Standard error of the log of the median of `result`'s samples (None without samples)."""
    from kernels.core import timing

    samples = result.samples if result is not None else None
    if not samples or len(samples) < 2:
        return None
    cv = timing.robust_cv(samples)
    return timing.MEDIAN_SE_FACTOR * cv / math.sqrt(len(samples)) if math.isfinite(cv) \
        else None


def threshold(benchmark: str, base: Result | None, head: Result | None,
              min_gap: float = DEFAULT_MIN_GAP, floor: float = 0.0) -> Threshold:
    """The change a row must exceed: min_gap, or wider where its samples' spread
    (NOISE_SIGMAS standard errors of the ratio of medians) or its learned noise floor is."""
    noise = 0.0
    if _method(benchmark).startswith("time_"):
        errors = [_standard_error(base), _standard_error(head)]
        if all(e is not None for e in errors):
            noise = math.expm1(NOISE_SIGMAS * math.hypot(*errors))
    gap = max(min_gap, noise, floor)
    if gap <= min_gap:
        return Threshold(gap)
    if floor >= noise:
        return Threshold(gap, f"learned run-to-run shift {floor:.1%}")
    spread = max(_spread(base), _spread(head))
    return Threshold(gap, f"sample spread {spread:.1%}" + (
        f", {_short(base, head)}" if _short(base, head) else ""))


def _spread(result: Result | None) -> float:
    from kernels.core import timing

    return timing.robust_cv(result.samples) if result and result.samples else 0.0


def _short(base: Result | None, head: Result | None) -> str:
    """A hint where the samples are few or the kernel so short that launch jitter rules."""
    values = [r.value for r in (base, head) if r is not None and r.value]
    if values and min(values) < 20e-6:
        return f"a {min(values) * 1e6:.1f} us kernel (launch-bound)"
    return ""


def machine_name(device=None) -> str:
    """asv's machine name: the normalised device model, e.g. nvidia-h100-80gb-hbm3, led by
    the GPU count where this process sees several (4x-nvidia-h100-80gb-hbm3), so results of
    multi-GPU machines are kept, and offered by the dashboard, apart."""
    from kernels.core import fingerprint

    device = device or fingerprint.identity()
    return device.model if device.devices <= 1 else f"{device.devices}x-{device.model}"


def machine_keys(device) -> dict[str, str]:
    """The device keys asv copies from the machine file into every result (dashboard filters)."""
    def text(value) -> str:
        return "n/a" if value is None else str(value)

    on_gpu = device.platform == "gpu"
    return {"gpu": device.name if on_gpu else "none", "driver": text(device.driver),
            "cuda": text(device.cuda), "sm_clock_mhz": text(device.default_sm_mhz)}


def register_machine(name: str | None = None) -> str:
    """Write (or refresh) this machine's entry in ~/.asv-machine.json; returns its name.

    Every asv entry point ends here: `python -m kernels bench` calls it, and so does the
    asv plugin (kernels/bench/asv_plugin.py) before plain `asv run` / `asv continuous` / `asv find`
    pick a machine. asv copies every key of the entry into each result's params, so the
    device keys (`machine_keys`) are in it beside asv's own six fields. Written directly,
    not through `asv machine --yes`, which asks questions at a terminal and reports the
    missing hostname entry as an error on the way.
    """
    import os
    import platform

    from asv.machine import MachineCollection

    from kernels.core import fingerprint

    device = fingerprint.identity()
    name = name or machine_name(device)
    uname = platform.uname()
    cpu = fingerprint._cpu_name()
    if device.platform == "gpu":
        cpu = f"{cpu}; {device.name}, driver {device.driver}, CUDA {device.cuda}"
    info = {"machine": name, "os": f"{uname.system} {uname.release}",
            "arch": platform.machine(), "cpu": cpu, "num_cpu": str(os.cpu_count()),
            "ram": str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
            **machine_keys(device)}
    path = MachineCollection.get_machine_file_path()
    try:
        if MachineCollection.load(name) == info:
            return name  # unchanged: leave the file alone
    except Exception:  # no file, no entry, or a file of another asv version: write it
        pass
    MachineCollection.save(name, info)
    print(f"asv machine {name!r} written to {path}", flush=True)
    return name


# asv run's exit status when it ran every benchmark and some failed (their results are kept,
# as failed: the compare says "FAILED on head").
ASV_SOME_FAILED = 2


def _asv(*args: str) -> None:
    import sys

    command = [sys.executable, "-m", "asv", *args]
    print("+ " + " ".join(command), flush=True)
    done = subprocess.run(command)
    if done.returncode not in (0, ASV_SOME_FAILED):
        raise subprocess.CalledProcessError(done.returncode, command)


# perf_tests/benchmarks.py reads it; named in the core, where kernels.bench.recover reads it too
# (recover importing this module closed an import cycle with it).
DASHBOARD_VARIABLE = environment.DASHBOARD_VARIABLE


def bench(revisions: list[str], *, bench_regex: str | None = None,
          dashboard: bool = True) -> str:
    """Run asv's benchmarks on each revision on this machine, the dashboard metrics included
    if `dashboard`; returns the machine name."""
    import os

    from kernels.bench import breakdown

    name = register_machine()
    # asv passes the environment to the benchmarks.
    if dashboard:
        os.environ[DASHBOARD_VARIABLE] = "1"
    else:
        os.environ.pop(DASHBOARD_VARIABLE, None)
    os.environ[breakdown.QUIET_VARIABLE] = "1"  # the caller prints one over all runs
    for revision in revisions:
        # --record-samples (asv continuous's default, not asv run's) keeps the samples that
        # asv's Mann-Whitney test needs; without them only the 99% intervals are compared.
        args = ["run", "--machine", name, "--show-stderr", "--record-samples",
                f"{full_hash(revision)}^!"]
        if bench_regex:
            args += ["--bench", bench_regex]
        try:
            _asv(*args)
        except (KeyboardInterrupt, subprocess.CalledProcessError):
            # asv writes a commit's results only at its end: keep what the journals hold.
            recover.recover_all(name)
            raise
        # asv's list now names the dashboard metrics; a later plain `asv run` rewrites it
        # without them, so the dashboard keeps this one (kernels.bench.listing.KEPT_LIST).
        listing.keep_benchmark_list(Path(".asv/results"), listing.KEPT_LIST)
    return name


def full_hash(revision: str) -> str:
    return subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
                          check=True, capture_output=True, text=True).stdout.strip()


def load(results_dir: str, machine: str, commit: str) -> dict[tuple[str, tuple[str, ...]], Result]:
    """Every (benchmark, parameters) result asv stored for `commit` on `machine`."""
    from asv import results as asv_results

    found: dict[tuple[str, tuple[str, ...]], Result] = {}
    for res in asv_results.iter_results_for_machine_and_hash(results_dir, machine, commit):
        found.update(_rows(res))
    return found


def _rows(res) -> dict[tuple[str, tuple[str, ...]], Result]:
    """Every (benchmark, parameters) result of one asv Results object."""
    found: dict[tuple[str, tuple[str, ...]], Result] = {}
    for key in res.get_all_result_keys():
        started_at = res.started_at.get(key)
        params = res.get_result_params(key)
        combos = list(itertools.product(*params)) if params else [()]
        values = res.get_result_value(key, params)
        samples = res.get_result_samples(key, params)
        stats = res.get_result_stats(key, params)
        # An unparametrized benchmark's fields come as one-element lists too (asv's
        # _compatible_results), matching its one combination, ().
        for combo, value, sample, stat in zip(combos, values, samples, stats, strict=True):
            if value is not None and isinstance(value, float) and math.isnan(value):
                value = None
            found[(key, tuple(combo))] = Result(value, sample, stat, started_at)
    return found


def history(results_dir: str | Path, machine: str) -> list[dict[tuple[str, tuple[str, ...]],
                                                                Result]]:
    """Every result asv stored for `machine`, one dict per commit (as `load`), oldest commit
    first (asv's commit date; the history of main is linear, so this is its order)."""
    from asv import results as asv_results

    runs = sorted(asv_results.iter_results_for_machine(str(results_dir), machine),
                  key=lambda res: (res.date or 0, res.commit_hash))
    return [_rows(res) for res in runs]


def _method(benchmark: str) -> str:
    return benchmark.rsplit(".", 1)[-1]


def verdict(benchmark: str, base: Result | None, head: Result | None,
            min_gap: float = DEFAULT_MIN_GAP, floor: float = 0.0,
            gap: Threshold | None = None) -> tuple[float | None, str]:
    """(head / base, verdict) for one row. A change counts only beyond the row's threshold:
    `min_gap`, the samples' spread and `floor`, the largest shift this benchmark showed
    between runs of one commit (`threshold`, unless given as `gap`)."""
    from asv import _stats

    if base is None or base.value is None:
        return None, "new" if head is not None and head.value is not None else "n/a"
    if head is None or head.value is None:
        return None, "FAILED on head"
    ratio = head.value / base.value if base.value else math.inf
    bar = gap or threshold(benchmark, base, head, min_gap, floor)

    def beyond(limit: float) -> bool:
        return ratio > 1 + limit or ratio < 1 / (1 + limit)

    changed = beyond(bar.gap)
    if not changed and bar.gap > min_gap and beyond(min_gap):
        why = bar.why or ""
        return ratio, ("same (within noise floor)" if "learned" in why else
                       "same (within host noise)" if why.startswith("host") else
                       "same (within sample noise)")
    method = _method(benchmark)
    lower_better = LOWER_IS_BETTER.get(method, True)
    if method.startswith("time_"):
        if base.stats and head.stats:  # Mann-Whitney on samples, else the 99% intervals
            different = _stats.is_different(base.samples or None, head.samples or None,
                                            base.stats, head.stats)
        else:
            different = changed
        if not changed:
            return ratio, "same"
        if not different:
            return ratio, "too noisy to tell"
        return ratio, "slower" if ratio > 1 else "faster"
    if not changed:
        return ratio, "same (no samples)"
    better = ratio < 1 if lower_better else ratio > 1
    return ratio, ("better" if better else "worse") + " (no samples)"


def compare(base: dict, head: dict, min_gap: float = DEFAULT_MIN_GAP,
            floors: dict[str, float] | None = None) -> list[Row]:
    rows = []
    time_bars = {}
    for key in sorted(set(base) | set(head), key=lambda k: not _method(k[0]).startswith("time_")):
        b, h = base.get(key), head.get(key)
        bar = threshold(key[0], b, h, min_gap, (floors or {}).get(floor_key(key), 0.0))
        method, suite = _method(key[0]), key[0].rsplit(".", 1)[0]
        if method == "time_device":
            time_bars[(suite, key[1])] = bar
        elif method in FROM_DEVICE_TIME and (suite, key[1]) in time_bars:
            timed = time_bars[(suite, key[1])]
            if method == "track_speedup":
                timed = _with_baselines(timed, suite, key[1], time_bars)
            if timed.gap > bar.gap:
                bar = Threshold(timed.gap, f"device time's: {timed.why}")
        elif method == "track_launch" and HOST_GAP > bar.gap:
            bar = Threshold(HOST_GAP, "host clock, moves with the machine's load")
        ratio, word = verdict(key[0], b, h, min_gap, gap=bar)
        if word == "n/a":
            continue
        if method == "track_launch" and word.endswith("(no samples)") and \
                not word.startswith("same"):
            word = word.replace("(no samples)", "(host clock, not gated)")
        rows.append(Row(key[0], key[1], b.value if b else None, h.value if h else None, ratio,
                        word, gap=bar.gap, why=bar.why))
    return sorted(rows, key=lambda row: (row.benchmark, row.params))


def _with_baselines(timed: Threshold, suite: str, params: tuple[str, ...],
                    time_bars: dict) -> Threshold:
    """A speed-up's gap: a baseline's time over ours moves by both relative changes, so its
    device time's gap plus the widest of the other implementations' of that case and
    direction (the best baseline is one of them; which one can change between runs)."""
    peers = [bar for (other_suite, other), bar in time_bars.items()
             if other_suite == suite and other[1:] == params[1:] and other[:1] != params[:1]]
    widest = max(peers, key=lambda bar: bar.gap, default=None)
    if widest is None:
        return timed
    own = timed.why or f"its own {timed.gap:.1%}"
    return Threshold(timed.gap + widest.gap, f"{own} plus the baselines' {widest.gap:.1%}")


def _format(value: float | None, benchmark: str) -> str:
    if value is None:
        return "-"
    unit = UNITS.get(_method(benchmark), "")
    if unit == "s":
        return f"{value * 1e6:.2f} us"
    return f"{value:.3g} {unit}".strip()


def _floor_text(row: Row, floors: dict[str, float]) -> str:
    if not _method(row.benchmark).startswith("time_"):
        return "-"  # track_ rows keep no samples to learn a floor from
    floor = floors.get(floor_key((row.benchmark, row.params)))
    return "none" if floor is None else f"{floor:.1%}"


def _gap_text(row: Row) -> str:
    if row.gap is None:
        return "-"
    return f"{row.gap:.1%}" + (f" ({row.why})" if row.why else "")


def render(rows: list[Row], floors: dict[str, float] | None = None) -> str:
    """The compare table: each row's gap (what set it, when wider than min_gap), with
    `floors` a column with each time_ row's noise floor ("none" where none was learned), and
    the interleaved re-measurement's ratios where one ran."""
    from kernels.core.tables import table

    confirmed = any(row.confirmed for row in rows)
    body = [[row.benchmark.removeprefix("benchmarks."), ", ".join(p.strip("'") for p in row.params),
             _format(row.base, row.benchmark), _format(row.head, row.benchmark),
             f"{row.ratio:.3f}" if row.ratio is not None else "-", _gap_text(row),
             *([_floor_text(row, floors)] if floors else []),
             *([row.confirmed or "-"] if confirmed else []), row.verdict] for row in rows]
    return table(body, ["benchmark", "parameters", "base", "head", "head/base", "gap",
                        *(["noise floor"] if floors else []),
                        *(["re-measured (head/base per round)"] if confirmed else []),
                        "verdict"])


def resolution(rows: list[Row], target: float = TARGET_CHANGE) -> str:
    """The smallest change each time_ row can call: the median over rows, and every row that
    cannot call `target` with what stops it."""
    timed = [row for row in rows if _method(row.benchmark).startswith("time_")
             and row.gap is not None]
    if not timed:
        return "smallest change callable: no time_ rows with results on both sides"
    gaps = sorted(row.gap for row in timed)
    middle = gaps[len(gaps) // 2] if len(gaps) % 2 else (gaps[len(gaps) // 2 - 1]
                                                          + gaps[len(gaps) // 2]) / 2
    coarse = [row for row in timed if row.gap > target]
    lines = [f"smallest change callable: median {middle:.1%} over {len(timed)} time_ rows "
             f"(range {gaps[0]:.1%}-{gaps[-1]:.1%}); {len(coarse)} cannot call {target:.0%}"
             + (":" if coarse else "")]
    lines += [f"  {row.benchmark.removeprefix('benchmarks.')}("
              f"{', '.join(p.strip(chr(39)) for p in row.params)}): {row.gap:.1%}, "
              f"{row.why or 'the gap asked for (--min-gap)'}" for row in coarse]
    return "\n".join(lines)


# The order rows take in the Markdown summary: what a reviewer must look at first.
VERDICT_ORDER = ("FAILED on head", "slower", "worse (no samples)", "too noisy to tell",
                 "faster", "better (no samples)", "worse (host clock, not gated)",
                 "better (host clock, not gated)", "new", "same (not confirmed)",
                 "same (within noise floor)", "same (within sample noise)",
                 "same (within host noise)",
                 "same (no samples)", "same")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(rows: list[Row], heading: str) -> str:
    """The verdict table as GitHub Markdown, for a pull request's job summary.

    A count per verdict, then the rows that changed (failed and slower first) in one table,
    then the unchanged rows folded in a <details> block, so a suite of hundreds of rows
    still shows its few changes at once.
    """
    def rank(verdict: str) -> int:
        return VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else len(VERDICT_ORDER)

    def table(selected: list[Row]) -> list[str]:
        lines = ["| verdict | benchmark | parameters | base | head | head/base |",
                 "|---|---|---|---:|---:|---:|"]
        for row in sorted(selected, key=lambda r: (rank(r.verdict), r.benchmark, r.params)):
            verdict = f"**{row.verdict}**" if row.verdict in ("FAILED on head", "slower") \
                else row.verdict
            params = ", ".join(p.strip("'") for p in row.params)
            lines.append(f"| {verdict} | {_cell(row.benchmark.removeprefix('benchmarks.'))} | "
                         f"{_cell(params)} | {_format(row.base, row.benchmark)} | "
                         f"{_format(row.head, row.benchmark)} | "
                         + (f"{row.ratio:.3f}" if row.ratio is not None else "-") + " |")
        return lines

    counts = {word: sum(row.verdict == word for row in rows)  # unknown verdicts by name
              for word in sorted({row.verdict for row in rows}, key=lambda w: (rank(w), w))}
    lines = [f"### {heading}", "",
             ", ".join(f"**{n} {word}**" if word in ("FAILED on head", "slower") else
                       f"{n} {word}" for word, n in counts.items()) or "no results", ""]
    changed = [row for row in rows if not row.verdict.startswith("same")]
    same = [row for row in rows if row.verdict.startswith("same")]
    if changed:
        lines += [*table(changed), ""]
    if same:
        lines += [f"<details><summary>{len(same)} unchanged</summary>", "", *table(same), "",
                  "</details>", ""]
    return "\n".join(lines)


def exit_status(rows: list[Row]) -> int:
    """1 if any row is slower or failed on the head (a benchmark that ran on the base), else 0:
    both fail the gate; exit status 2 stays a user's mistake on the command line."""
    if any(row.verdict in ("FAILED on head", "slower") for row in rows):
        return 1
    return 0


def run(base_rev: str, head_rev: str, *, machine: str, results_dir: str = ".asv/results",
        min_gap: float = DEFAULT_MIN_GAP, summary_md: str | None = None,
        confirm_rounds: int = 0, json_path: str | None = None,
        base_since_ms: float | None = None, confirm_measure=None) -> int:
    """Compare two commits' results on `machine` and print the verdict table; its exit status.
    With `confirm_rounds`, every "slower" and "faster" row is measured again in that many
    interleaved rounds of base and head before it counts (kernels.bench.confirm). With
    `summary_md`, the table is also appended to that file as Markdown (render_markdown; the
    pull-request workflow passes $GITHUB_STEP_SUMMARY). `confirm_measure`: how the
    confirmation measures a round (kernels.bench.confirm.confirm's `measure`; default: live
    workers over the commits' source trees)."""
    base_hash, head_hash = full_hash(base_rev), full_hash(head_rev)
    if base_hash == head_hash:
        return _same_commit(base_rev, head_rev, head_hash, machine, results_dir)
    base = load(results_dir, machine, base_hash)
    head = load(results_dir, machine, head_hash)
    if not base or not head:
        missing = [rev for rev, found in ((base_rev, base), (head_rev, head)) if not found]
        raise SystemExit(f"no asv results on machine {machine!r} for {', '.join(missing)} in "
                         f"{results_dir}; run `make bench-compare BASE={base_rev}` first")
    earlier = earlier_runs_only(base, head, base_since_ms)
    unrecorded = unrecorded_metrics(base, head) - earlier
    base = {key: result for key, result in base.items()
            if key not in earlier and key not in unrecorded}
    floors = load_floors(machine, results_dir)
    rows = compare(base, head, min_gap, floors)
    if confirm_rounds and any(row.verdict in ("slower", "faster") for row in rows):
        from kernels.bench import confirm

        rows = confirm.confirm(rows, base_hash, head_hash, rounds=confirm_rounds,
                               measure=confirm_measure)
    print(f"machine {machine}: {base_rev} ({base_hash[:8]}) -> {head_rev} ({head_hash[:8]}); "
          f"changes under each row's gap count as same: {min_gap:.0%}, or wider where its "
          f"samples spread or its learned run-to-run shift is" +
          (f" ({len(floors)} noise floors learned)" if floors else
           "; no noise floors learned here (`python -m kernels noise-floor`)"))
    print(render(rows, floors))
    if earlier:
        names = sorted({key[0].removeprefix("benchmarks.").rsplit(".", 1)[0]
                        for key in earlier})
        print(f"left out: {len(earlier)} rows of {base_rev} that only an earlier asv run "
              f"measured and {head_rev}'s run did not select ({', '.join(names[:6])}"
              f"{', ...' if len(names) > 6 else ''})")
    if unrecorded:
        methods = sorted({_method(key[0]) for key in unrecorded})
        print(f"left out: {len(unrecorded)} rows of {base_rev}'s dashboard metrics "
              f"({', '.join(methods)}) that {head_rev}'s run did not record "
              f"(`kernels bench --dashboard` records them)")
    print(resolution(rows))
    if json_path:
        Path(json_path).write_text(json.dumps([dataclasses.asdict(row) for row in rows],
                                              indent=1))
    words = sorted({row.verdict for row in rows})
    counts = {word: sum(row.verdict == word for row in rows) for word in words}
    print("summary: " + ", ".join(f"{n} {word}" for word, n in counts.items()))
    if summary_md:
        heading = (f"asv on {machine}: {base_rev} ({base_hash[:8]}) -> {head_rev} "
                   f"({head_hash[:8]})")
        note = (f"Changes under each row's gap count as same ({min_gap:.0%}, or wider where "
                f"its noise is)" + (f"; {len(floors)} noise floors learned." if floors else
                                    ".") + "\n\n" + resolution(rows).replace("\n", "  \n"))
        with open(summary_md, "a") as out:
            out.write(render_markdown(rows, heading) + "\n" + note + "\n\n")
    return exit_status(rows)


def unrecorded_metrics(base: dict, head: dict) -> set:
    """The rows of `base` of dashboard metrics of which the head has no row at all: its run
    did not record them (the gate's own run, without --dashboard), which fails nothing. One
    missing beside others of its method still counts as failed."""
    recorded = {_method(key[0]) for key in head}
    return {key for key in base if key not in head
            and _method(key[0]) in DASHBOARD_METHODS and _method(key[0]) not in recorded}


def earlier_runs_only(base: dict, head: dict, since_ms: float | None) -> set:
    """The rows of `base` that the head lacks and that asv measured before `since_ms`, when
    this invocation measured the base from `since_ms` on: an earlier run's, under another
    selection (--bench, KERNELPERF_BENCH_*), not failures of the head. Without `since_ms` (a
    reused base, `kernels compare`) none: every row the head lacks counts as failed, since an
    operation whose module no longer imports drops out of the head's benchmarks altogether."""
    if since_ms is None:
        return set()
    return {key for key, result in base.items()
            if key not in head and (result.started_at is None or result.started_at < since_ms)}


def _same_commit(base_rev: str, head_rev: str, commit: str, machine: str,
                 results_dir: str) -> int:
    """Base and head are one commit: asv keeps one result per commit, so there is nothing to
    compare (every ratio would read 1.000). Say so and list the commit's values."""
    from kernels.core.tables import table

    print(f"machine {machine}: {base_rev} and {head_rev} are the same commit ({commit[:8]}): "
          "nothing to compare (asv keeps one result per commit); its values follow. "
          "`make noise-floor` compares runs of one commit.")
    results = load(results_dir, machine, commit)
    if not results:
        raise SystemExit(f"no asv results on machine {machine!r} for {head_rev} in "
                         f"{results_dir}; run `make bench` first")
    print(table([[key[0].removeprefix("benchmarks."), ", ".join(p.strip("'") for p in key[1]),
                  _format(result.value, key[0])]
                 for key, result in sorted(results.items()) if result.value is not None],
                ["benchmark", "parameters", "value"]))
    return 0


# Noise floors: the largest relative shift of each time_ benchmark's value between asv runs of
# one commit on this machine, learned by `python -m kernels noise-floor` and kept beside the
# results. Processes on a shared machine can differ by 10-25% (seen on a 2-core CPU VM, where
# asv's tests on 100 samples a side then call an unchanged commit slower); a change must
# exceed the floor to count. A floor comes only from runs that measured that benchmark: asv's
# results file for a commit keeps the last value of every benchmark, so a run narrowed by
# --bench would otherwise read the others' unchanged values as a 0.0% floor.

def floor_key(key: tuple[str, tuple[str, ...]]) -> str:
    return f"{key[0]}({', '.join(key[1])})"


def floors_path(machine: str, results_dir: str = ".asv/results") -> Path:
    """Beside asv's results folder, not in it: asv reads every JSON file there as a result."""
    return Path(results_dir).parent / "noise-floors" / f"{machine}.json"


def measured_since(results: dict, since_ms: float) -> dict:
    """The rows of `results` (from `load`) that asv started at or after `since_ms`."""
    return {key: result for key, result in results.items()
            if result.started_at is not None and result.started_at >= since_ms}


def floors_from_runs(runs: list[dict]) -> dict[str, float]:
    """Per time_ benchmark row, max/min - 1 of its values over `runs` (results of one commit,
    each holding only the rows that run measured); rows measured fewer than twice get none."""
    values: dict[str, list[float]] = {}
    for results in runs:
        for key, result in results.items():
            if _method(key[0]).startswith("time_") and result.value:
                values.setdefault(floor_key(key), []).append(result.value)
    return {name: max(v) / min(v) - 1 for name, v in values.items() if len(v) > 1}


def _floors_file(machine: str, results_dir: str) -> dict:
    path = floors_path(machine, results_dir)
    return json.loads(path.read_text()) if path.exists() else {"floors": {}}


def load_floors(machine: str, results_dir: str = ".asv/results") -> dict[str, float]:
    """This machine's noise floors; where it has learned none, those the repository ships for
    its model (kernels/models/<machine>/noise-floors.json, written by `python -m kernels
    bringup` on that model), never another model's; {} where neither is."""
    if floors_path(machine, results_dir).exists():
        return _floors_file(machine, results_dir)["floors"]
    return shipped_floors(machine)


def shipped_floors(machine: str, root: Path | None = None) -> dict[str, float]:
    """The noise floors shipped for the asv machine `machine` (a one-GPU machine is named by
    its model), or {}."""
    from kernels.core import fingerprint, modeldata

    if fingerprint.normalise(machine) != machine:
        return {}
    data = modeldata.read(machine, modeldata.NOISE_FLOORS, root)
    return dict(data["floors"]) if data else {}


def learn_floors(revision: str, runs: int, *, bench_regex: str | None = None,
                 results_dir: str = ".asv/results") -> dict[str, float]:
    """Run asv `runs` times on `revision` and store the noise floor of each time_ row measured
    in at least two of the runs; floors learned before for other rows are kept as they were.
    Returns the floors learned by this call."""
    if runs < 2:
        raise ValueError(f"runs: expected at least 2 runs of one commit, got {runs}")
    commit = full_hash(revision)
    seen = []
    for index in range(runs):
        print(f"noise floor: run {index + 1} of {runs} on {revision} ({commit[:8]})", flush=True)
        since_ms = int(time.time() * 1000)
        machine = bench([revision], bench_regex=bench_regex)
        seen.append(measured_since(load(results_dir, machine, commit), since_ms))
    floors = floors_from_runs(seen)
    stored = _floors_file(machine, results_dir)
    kept = {name: floor for name, floor in stored["floors"].items() if name not in floors}
    learned = {name: entry for name, entry in stored.get("learned", {}).items() if name in kept}
    learned.update({name: {"commit": commit, "runs": runs} for name in floors})
    path = floors_path(machine, results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"floors": {**kept, **floors}, "learned": learned}, indent=1))
    from kernels.core.tables import table

    timed = sorted({floor_key(key) for run in seen for key in run
                    if _method(key[0]).startswith("time_")})
    rows = [[name.removeprefix("benchmarks."),
             f"{floors[name]:.1%}" if name in floors else "none (measured in fewer than 2 runs)",
             "learned now" if name in floors else "-"] for name in timed if name not in kept]
    rows += [[name.removeprefix("benchmarks."), f"{floor:.1%}",
              f"kept (commit {str(learned.get(name, {}).get('commit', '?'))[:8]})"]
             for name, floor in sorted(kept.items())]
    print(table(rows, ["benchmark", "noise floor", "source"]))
    print(f"wrote {path}: {len(floors)} learned now, {len(kept)} kept from earlier runs")
    return floors


# The dashboard's Regressions page (asv publish's step detection, kernels.bench.dashboard):
# the relative step a row's history must take to be listed, per row from its measured noise,
# instead of asv's 5% for every row. Searched: the lower-is-better rows the gate judges; not
# the higher-is-better metrics, which asv reads upside down (a rise in TFLOP/s would be
# listed; their drops are time_device's), nor the host launch cost, which is never gated.
REGRESSION_SEARCHED = ("time_device", "track_peak_memory")
# Commits of a row a machine needs before the row's scatter between commits counts as noise
# (three steps between commits: fewer give no median worth the name).
MIN_HISTORY = 4
# The median |log step| between commits of a series of pure noise is 0.6745 standard
# deviations of one step (normal); 1 / 0.6745, as in robust_cv's MAD.
_MAD_TO_SD = 1.4826


def regression_thresholds(results_dir: str | Path) -> dict[str, Threshold]:
    """Per row of the searched benchmarks (asv's entry name, `floor_key`), the relative step
    its history must exceed to count as a regression, and what set it; the largest over the
    machines of `results_dir` that have the row.

    time_device, on each machine, the largest of: the gate's gap between consecutive commits
    (`threshold`: 1%, 4 standard errors of the ratio of medians from the samples' spread, the
    machine's learned noise floor), the largest over the pairs; and NOISE_SIGMAS standard
    deviations of a step between commits, estimated from the median |log step| (a real step
    is one among many, so it hardly moves the median): from the row's own steps where it has
    MIN_HISTORY commits, else from the steps of every row that has (runs on other hosts and
    days scatter more than one run's samples say, and a short history cannot tell by itself).
    track_peak_memory: compiled bytes, the same on every run, so the gate's 1%.
    """
    from asv import util as asv_util

    root = Path(results_dir)
    machines = sorted(p.name for p in root.iterdir() if (p / "machine.json").is_file()) \
        if root.is_dir() else []
    series: dict[tuple[str, tuple[str, tuple[str, ...]]], list[Result]] = {}
    floors: dict[str, dict[str, float]] = {}
    for machine in machines:
        floors[machine] = load_floors(machine, str(root))
        try:
            runs = history(root, machine)
        except asv_util.UserError:  # a results file asv cannot read: nothing to learn from
            continue
        for run in runs:
            for key, result in run.items():
                if _method(key[0]) in REGRESSION_SEARCHED and result.value:
                    series.setdefault((machine, key), []).append(result)
    long = [results for (_, key), results in series.items()
            if _method(key[0]).startswith("time_") and len(results) >= MIN_HISTORY]
    pooled = _scatter([step for results in long for step in _steps(results)])
    found: dict[str, Threshold] = {}
    for (machine, key), results in series.items():
        name = floor_key(key)
        if _method(key[0]) == "track_peak_memory":
            bar = Threshold(DEFAULT_MIN_GAP, "compiled bytes, the same every run: 1%")
        else:
            bar = _row_noise(key[0], results, floors[machine].get(name, 0.0), machine,
                             (pooled, len(long)))
        if name not in found or bar.gap > found[name].gap:
            found[name] = bar
    return found


def _steps(results: list[Result]) -> list[float]:
    return [abs(math.log(b.value / a.value)) for a, b in itertools.pairwise(results)]


def _scatter(steps: list[float]) -> float | None:
    """NOISE_SIGMAS standard deviations of a step, from the median of `steps` (relative)."""
    return math.expm1(NOISE_SIGMAS * _MAD_TO_SD * statistics.median(steps)) if steps else None


def _row_noise(benchmark: str, results: list[Result], floor: float, machine: str,
               pooled: tuple[float | None, int]) -> Threshold:
    """One time_ row's regression threshold on one machine (see regression_thresholds);
    `pooled`: the scatter of every row with a history, and how many rows those are."""
    pairs = list(itertools.pairwise(results)) or [(results[0], results[0])]
    bar = max((threshold(benchmark, a, b, floor=floor) for a, b in pairs), key=lambda t: t.gap)
    bar = Threshold(bar.gap, f"{machine}: {bar.why or f'min gap {DEFAULT_MIN_GAP:.0%}'}")
    if len(results) >= MIN_HISTORY:
        scatter = _scatter(_steps(results))
        why = f"{machine}: its scatter between {len(results)} commits"
    else:
        scatter, rows = pooled
        why = (f"{machine}: {len(results)} commit(s); the scatter between commits of the "
               f"{rows} rows with {MIN_HISTORY} or more")
    return Threshold(scatter, why) if scatter is not None and scatter > bar.gap else bar
