"""`bench`, `compare`, `noise-floor` and `gate-power`: asv on commits, the direction-aware
verdict per row, each benchmark's run-to-run shift, and the gate's power on planted
slowdowns."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kernels.bench import asv_tools, gate
from kernels.cli.arguments import revision
from kernels.core import validation


def cmd_bench(args: argparse.Namespace) -> int:
    """asv on HEAD (and the base, if given), then the compare table; its exit status."""
    revisions = [args.base, args.head] if args.base else [args.head]
    if args.base and asv_tools.full_hash(args.base) == asv_tools.full_hash(args.head):
        revisions = [args.head]  # a second asv run of one commit would overwrite the first
    machine = asv_tools.bench(revisions, bench_regex=args.bench)
    if not args.base:
        return 0
    return asv_tools.run(args.base, args.head, machine=machine, min_gap=args.min_gap,
                         summary_md=args.summary_md)


def cmd_compare(args: argparse.Namespace) -> int:
    machine = args.machine or asv_tools.machine_name()
    return asv_tools.run(args.base, args.head, machine=machine, min_gap=args.min_gap,
                         summary_md=args.summary_md)


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


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v.rstrip("%")) / (100 if v.endswith("%") else 1)
                       for v in text.split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated fractions or percentages (0.05,10%), got {text!r}") \
            from None
    return values


def cmd_gate_power(args: argparse.Namespace) -> int:
    families = args.families
    if families is None:  # the families that run here; cuda needs a GPU
        families, why = gate.runnable_families(args.case)  # an unknown case: UserError
        if why:
            print("gate-power: planting " + " ".join(families) + "; not " +
                  "; ".join(f"{family} ({reason})" for family, reason in why.items()),
                  flush=True)
    try:
        settings = gate.Settings(families=tuple(families), sizes=args.sizes,
                                 trials=args.trials, aa_trials=args.aa_trials,
                                 factor=args.factor, speedup=not args.no_speedup, case=args.case)
    except ValueError as error:
        raise validation.UserError(str(error)) from None
    return gate.main_flow(settings, keep=args.keep)


def _add_gate_power(sub) -> None:
    gate_power = sub.add_parser("gate-power", help="plant slowdowns in a scratch clone and measure "
                          "what asv continuous and the compare catch")
    gate_power.add_argument("--families", nargs="+",
                      help=f"kernel families to plant in (default: those of "
                           f"{' '.join(gate.FAMILIES)} that run here)")
    gate_power.add_argument("--sizes", type=_fractions, default=gate.DEFAULT_SIZES,
                      help="planted slowdowns, e.g. 5%%,10%% (default)")
    gate_power.add_argument("--trials", type=int, default=3, help="trials per plant size")
    gate_power.add_argument("--aa-trials", dest="aa_trials", type=int, default=5)
    gate_power.add_argument("--factor", type=float, default=1.05, help="asv continuous -f")
    gate_power.add_argument("--case", help=f"softmax case (default: {gate.BENCH_CASE})")
    gate_power.add_argument("--no-speedup", dest="no_speedup", action="store_true",
                      help="skip the reverted-plant speed-up trial")
    gate_power.add_argument("--keep", action="store_true", help="keep the scratch clone")


def add_commands(sub) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `bench`, `compare`, `noise-floor` and `gate-power` on `sub`."""
    for name, help_text in (("bench", "run asv on HEAD (and --base), then compare"),
                            ("compare", "compare two commits' asv results, verdict per row")):
        sub_parser = sub.add_parser(name, help=help_text)
        if name == "bench":
            sub_parser.add_argument("--base", type=revision,
                                    help="revision to compare against (e.g. main)")
            sub_parser.add_argument("--head", type=revision, default="HEAD")
            sub_parser.add_argument("--bench", help="asv benchmark regex (e.g. Softmax)")
        else:
            sub_parser.add_argument("base", type=revision)
            sub_parser.add_argument("head", type=revision, nargs="?", default="HEAD")
            sub_parser.add_argument("--machine", help="asv machine (default: this device model)")
        sub_parser.add_argument("--min-gap", type=validation.nonnegative_float, default=0.05,
                                help="relative change below which rows count as same")
        sub_parser.add_argument("--summary-md", metavar="PATH", help="also append the verdict "
                                "table as Markdown to PATH (e.g. $GITHUB_STEP_SUMMARY)")
    floor = sub.add_parser("noise-floor", help="run asv repeatedly on one commit; store each "
                           "benchmark's run-to-run shift, which compare then requires a change "
                           "to exceed")
    floor.add_argument("--revision", type=revision, default="HEAD")
    floor.add_argument("--runs", type=validation.int_at_least(2), default=3,
                       help="asv runs of the commit, whose spread is the floor (>= 2)")
    floor.add_argument("--bench", help="asv benchmark regex (e.g. Softmax.time_device)")
    _add_gate_power(sub)
    return {"bench": cmd_bench, "compare": cmd_compare, "noise-floor": cmd_noise_floor,
            "gate-power": cmd_gate_power}
