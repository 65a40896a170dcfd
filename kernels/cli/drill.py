"""`fault-drill`: faults planted in a scratch clone (a crash, hangs, a sticky device error) and
what pytest's isolation and asv's supervisor make of each (kernels/testing/drill.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kernels.core import environment, validation
from kernels.testing import drill, faults


def cmd_fault_drill(args: argparse.Namespace) -> int:
    platform = "gpu" if environment.nvidia_gpu_present() else "cpu"
    settings = drill.settings_from(
        platform, faults=tuple(args.faults or ()), tools=tuple(args.tools),
        workers=args.workers, item_limit_s=args.item_limit, run_limit_s=args.run_limit,
        without_isolation=args.without_isolation)
    return drill.main_flow(settings, keep=args.keep)


def _others() -> str:
    chosen = set(faults.DRILL_DEFAULTS["gpu"] + faults.DRILL_DEFAULTS["cpu"])
    return " ".join(f.name for f in faults.FAULTS if f.name not in chosen)


def add_commands(sub) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `fault-drill` on `sub`."""
    parser = sub.add_parser(
        "fault-drill", help="plant a crash, hangs and a sticky device fault in a scratch clone; "
        "check that pytest and asv fail only the planted implementation's items")
    parser.add_argument(
        "--faults", action="extend", nargs="+", metavar="FAULT",
        help="faults to plant (default: on a GPU "
        f"{' '.join(faults.DRILL_DEFAULTS['gpu'])}; on a CPU "
        f"{' '.join(faults.DRILL_DEFAULTS['cpu'])}; also: "
        f"{_others()})")
    parser.add_argument("--tools", nargs="+", default=list(drill.TOOLS), choices=drill.TOOLS,
                        help="what runs against each fault (default: pytest asv)")
    parser.add_argument("--workers", type=validation.positive_int, default=2,
                        help="pytest's xdist workers (default 2)")
    parser.add_argument("--item-limit", type=validation.positive_float, default=None,
                        help=f"seconds per pytest item and asv parameter set (default: "
                        f"{drill.ITEM_LIMIT_S['gpu']:g} on a GPU, "
                        f"{drill.ITEM_LIMIT_S['cpu']:g} on a CPU)")
    parser.add_argument("--run-limit", type=validation.positive_float,
                        default=drill.RUN_LIMIT_S,
                        help=f"seconds per pytest or asv run (default {drill.RUN_LIMIT_S:g})")
    parser.add_argument("--without-isolation", action="store_true",
                        help="also run pytest with --no-isolation against each fault, to compare")
    parser.add_argument("--keep", action="store_true", help="keep the scratch clone and logs")
    return {"fault-drill": cmd_fault_drill}
