"""The kernelperf command line: `python -m kernels COMMAND` (list, check, time, roofline,
bench, compare, profile, memory, hlo, tune, ...; `--help` lists them all).

One module per command group, each with an `add_commands(sub)` that registers its commands
and returns name -> handler: check (list, check), bench (bench, compare, noise-floor,
gate-power), measure (time, roofline, plot-roofline, ceilings, verify-timing), profile
(profile, memory, hlo, bottleneck), tune, bringup, and drill (fault-drill). Nothing in the package
below imports this one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from kernels.cli import arguments
from kernels.core import environment, validation


def build_parser() -> tuple[arguments.Parser, dict[str, Callable[[argparse.Namespace], int]]]:
    """The parser of `python -m kernels`, every command group on it, and command -> handler."""
    from kernels.cli import bench, bringup, check, drill, measure, profile, tune

    parser = arguments.Parser(prog="python -m kernels", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for group in (check, bench, measure, profile, tune, bringup, drill):
        commands.update(group.add_commands(sub))
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    environment.configure()
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    try:
        return commands[args.command](args)
    except validation.UserError as error:
        # A user's mistake, not a bug: one line, no traceback.
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C or a watchdog's SIGINT: what the command keeps on the way out (kernels bench
        # recovers the measuring journals' results) it has said; no traceback.
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return 130
