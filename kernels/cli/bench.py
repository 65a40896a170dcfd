"""`bench`, `compare`, `noise-floor` and `gate-power`: asv on commits, the direction-aware
verdict per row, each benchmark's run-to-run shift, and the gate's power on planted
slowdowns."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from kernels.bench import asv_tools, breakdown, confirm, gate, interleaved
from kernels.cli.arguments import revision
from kernels.core import validation


def cmd_bench(args: argparse.Namespace) -> int:
    """With --base, the interleaved gate (kernels.bench.interleaved: base and head measured
    side by side by a live worker each, slower rows confirmed there), or with --sequential
    asv on each commit then the compare; without, asv on HEAD. The compare table and where
    the time went; its exit status."""
    revisions = [args.base, args.head] if args.base else [args.head]
    if args.base and asv_tools.full_hash(args.base) == (commit := asv_tools.full_hash(args.head)):
        # Said before asv starts (its run of a commit takes seconds on a CPU, minutes on a
        # GPU); a second asv run of one commit would only overwrite the first.
        print(f"kernels bench: {args.base} and {args.head} are the same commit "
              f"({commit[:8]}): nothing to compare (asv keeps one result per commit), so it "
              f"is measured once and its values listed. Commit the change to gate it; "
              f"`make noise-floor` compares runs of one commit.", flush=True)
        revisions = [args.head]
    sequential = args.sequential or args.reuse_base
    if len(revisions) == 2 and not sequential:
        started = time.time()
        status = interleaved.gate(args.base, args.head, machine=asv_tools.register_machine(),
                                  bench_regex=args.bench, min_gap=args.min_gap,
                                  rounds=args.confirm_rounds, dashboard=args.dashboard,
                                  summary_md=args.summary_md, json_path=args.json)
        print(f"kernels bench: {time.time() - started:.0f} s in all", flush=True)
        return status
    if args.base and args.reuse_base and len(revisions) == 2 and asv_tools.load(
            ".asv/results", asv_tools.machine_name(), asv_tools.full_hash(args.base)):
        print(f"kernels bench: the base {args.base}'s asv results are reused (--reuse-base); "
              f"a slower row's confirmation still measures it again", flush=True)
        revisions = [args.head]
    # The gate (--base) records time and memory, the rows it judges: the dashboard metrics
    # are five more asv processes per parameter set (about half of an H100 gate's time
    # outside compiles). Without --base the run is for the dashboard, and records them.
    dashboard = args.dashboard or not args.base
    if not dashboard:
        print("kernels bench: time and peak memory, the gate's rows (--dashboard also records "
              "TFLOP/s, GB/s, roofline, speed-up and launch cost)", flush=True)
    started = time.time()
    machine = asv_tools.bench(revisions, bench_regex=args.bench, dashboard=dashboard)
    asv_wall = time.time() - started
    status = 0
    if args.base:
        # The base measured here: its rows from earlier runs (other selections) are not the
        # head's failures. asv stamps benchmarks in ms since the epoch.
        since_ms = started * 1000.0 if len(revisions) == 2 else None
        status = asv_tools.run(args.base, args.head, machine=machine, min_gap=args.min_gap,
                               summary_md=args.summary_md, confirm_rounds=args.confirm_rounds,
                               json_path=args.json, base_since_ms=since_ms)
    report = breakdown.report(started, time.time() - started,
                              also=[confirm.confirm_dir() / "journals"])
    if report:
        print(f"asv on {len(revisions)} commit(s) took {asv_wall:.0f} s; " + report)
    print(f"kernels bench: {time.time() - started:.0f} s in all", flush=True)
    return status


def cmd_compare(args: argparse.Namespace) -> int:
    machine = args.machine or asv_tools.machine_name()
    return asv_tools.run(args.base, args.head, machine=machine, min_gap=args.min_gap,
                         summary_md=args.summary_md, confirm_rounds=args.confirm_rounds,
                         json_path=args.json)


def cmd_recover(args: argparse.Namespace) -> int:
    """asv results from the measuring journals of runs that were cut short."""
    from kernels.bench import recover

    recover.recover_all(args.machine or asv_tools.machine_name())
    return 0


# Floors are learned for device time only (the track_ rows keep no samples), so noise-floor
# runs only the time_ methods: on a CPU the five dashboard metrics and the memory row were
# two thirds of each run's benchmark processes.
TIMED_ONLY = r"\.time_"


def floor_regex(bench: str | None) -> str:
    """asv's --bench for noise-floor: the time_ methods of what `bench` selects (all without)."""
    return TIMED_ONLY if not bench else rf"^(?=.*(?:{bench})).*{TIMED_ONLY}"


def cmd_noise_floor(args: argparse.Namespace) -> int:
    asv_tools.learn_floors(args.revision, args.runs, bench_regex=floor_regex(args.bench))
    return 0


def cmd_gate_power(args: argparse.Namespace) -> int:
    try:
        settings = gate.Settings(families=tuple(args.families), ops=tuple(args.ops),
                                 sizes=args.sizes, trials=args.trials,
                                 aa_trials=args.aa_trials, factor=args.factor,
                                 speedup=not args.no_speedup,
                                 confirm_rounds=args.confirm_rounds,
                                 sequential=args.sequential,
                                 reuse_base=not args.fresh_base)
    except ValueError as error:
        raise validation.UserError(str(error)) from None
    return gate.main_flow(settings, keep=args.keep)


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v.rstrip("%")) / (100 if v.endswith("%") else 1)
                       for v in text.split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated fractions or percentages (0.02,3%), got {text!r}") \
            from None
    return values


def _add_gate_power(sub) -> None:
    gate_power = sub.add_parser("gate-power", help="plant slowdowns in a scratch clone and "
                                "measure what kernels bench (and asv's own test) catch")
    gate_power.add_argument("--families", nargs="+", default=list(gate.FAMILIES),
                            help=f"kernel families to plant in (default: "
                            f"{' '.join(gate.FAMILIES)})")
    gate_power.add_argument("--ops", nargs="+", default=list(gate.OPS),
                            help=f"operations to plant in (default: {' '.join(gate.OPS)})")
    gate_power.add_argument("--sizes", type=_fractions, default=gate.DEFAULT_SIZES,
                            help="planted slowdowns, e.g. 2%%,3%% (default)")
    gate_power.add_argument("--trials", type=int, default=3,
                            help="trials per plant size (default 3)")
    gate_power.add_argument("--aa-trials", type=int, default=1,
                            help="A/A trials, a README whitespace commit each (default 1)")
    gate_power.add_argument("--factor", type=float, default=1.02,
                            help="the asv continuous -f whose marks are shown beside "
                            "(default 1.02)")
    gate_power.add_argument("--confirm-rounds", type=int, default=3,
                            help="kernels bench's interleaved re-measurements, 0 for none "
                            "(default 3)")
    gate_power.add_argument("--no-speedup", action="store_true",
                            help="skip the reverted-plant speed-up trial")
    gate_power.add_argument("--sequential", action="store_true",
                            help="run the gate as it was, kernels bench --sequential (asv run "
                            "on each commit; default: the interleaved gate)")
    gate_power.add_argument("--fresh-base", action="store_true",
                            help="with --sequential, run asv on the base in every trial "
                            "(default: once; the interleaved gate measures it every trial)")
    gate_power.add_argument("--keep", action="store_true", help="keep the scratch clone")


def add_commands(sub) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `bench`, `compare`, `noise-floor` and `gate-power` on `sub`."""
    for name, help_text in (("bench", "run asv on HEAD (and --base), then compare"),
                            ("compare", "compare two commits' asv results, verdict per row")):
        sub_parser = sub.add_parser(name, help=help_text)
        if name == "bench":
            sub_parser.add_argument("--base", type=revision,
                                    help="revision to compare against (e.g. main)")
            sub_parser.add_argument("--head", type=revision, default="HEAD",
                                    help="revision measured (default HEAD)")
            sub_parser.add_argument("--bench", help="asv benchmark regex (e.g. Softmax)")
            sub_parser.add_argument("--dashboard", action="store_true",
                                    help="with --base, also record the dashboard metrics "
                                    "(always recorded without --base)")
            sub_parser.add_argument("--sequential", action="store_true",
                                    help="with --base, the gate as it was: asv run on each "
                                    "commit, then the compare, slower rows confirmed by live "
                                    "workers (default: both commits measured interleaved, "
                                    "without asv run)")
            sub_parser.add_argument("--reuse-base", action="store_true",
                                    help="with --sequential (implied), keep the base's asv "
                                    "results where this machine has them")
        else:
            sub_parser.add_argument("base", type=revision, help="revision compared against")
            sub_parser.add_argument("head", type=revision, nargs="?", default="HEAD",
                                    help="revision compared (default HEAD)")
            sub_parser.add_argument("--machine", help="asv machine (default: this device model)")
        sub_parser.add_argument("--min-gap", type=validation.nonnegative_float,
                                default=asv_tools.DEFAULT_MIN_GAP,
                                help="relative change below which time rows count as same "
                                "where their noise allows (default 1%%; each row's gap widens "
                                "with its samples' spread and learned noise floor)")
        sub_parser.add_argument("--confirm-rounds", type=validation.nonnegative_int,
                                default=confirm.ROUNDS if name == "bench" else 0,
                                help="interleaved re-measurements of base and head that a "
                                "slower row must survive (default: 3 for bench, 0 for "
                                "compare; 0 skips)")
        sub_parser.add_argument("--json", metavar="PATH", help="also write every row (verdict, "
                                "gap, re-measured ratios) to PATH as JSON")
        sub_parser.add_argument("--summary-md", metavar="PATH", help="also append the verdict "
                                "table as Markdown to PATH (e.g. $GITHUB_STEP_SUMMARY)")
    floor = sub.add_parser("noise-floor", help="run asv repeatedly on one commit; store each "
                           "benchmark's run-to-run shift, which compare then requires a change "
                           "to exceed")
    floor.add_argument("--revision", type=revision, default="HEAD",
                       help="the commit run again and again (default HEAD)")
    floor.add_argument("--runs", type=validation.int_at_least(2), default=3,
                       help="asv runs of the commit, whose spread is the floor, at least 2 "
                       "(default 3)")
    floor.add_argument("--bench", help="asv benchmark regex (e.g. Softmax.time_device)")
    _add_gate_power(sub)
    recover = sub.add_parser("recover", help="write asv results from the measuring journals "
                             "of benchmark runs that were interrupted (asv keeps a commit's "
                             "results only once it finished)")
    recover.add_argument("--machine", help="asv machine (default: this device model)")
    return {"bench": cmd_bench, "compare": cmd_compare, "noise-floor": cmd_noise_floor,
            "gate-power": cmd_gate_power, "recover": cmd_recover}
