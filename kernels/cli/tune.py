"""`tune OP`: time a grid of block configs on this GPU and record the best per GPU model."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kernels.core import devices, tuning, validation


def cmd_tune(args: argparse.Namespace) -> int:
    machine = devices.this_machine()
    available = tuning.tunables(args.op)
    if not available:  # tunables() loaded every module
        tunable_ops = sorted({op for op, _ in tuning._TUNABLES})
        raise validation.UserError(f"op: expected an operation with tunable kernels, one of "
                                   f"{tunable_ops}, got {args.op!r}")
    # An implementation's name selects each of its grids ("triton": "triton:f32" too); a
    # tunable's own name ("triton:f32") just that one.
    wanted = args.impl or sorted(available)
    unknown = [name for name in wanted if name not in available
               and name not in {tuning.impl_of(n) for n in available}]
    if unknown:
        raise validation.UserError(f"--impl: expected one of {sorted(available)} (or an "
                                   f"implementation of them), got {unknown}")
    names = [n for n in sorted(available) if n in wanted or tuning.impl_of(n) in wanted]
    if not machine.has_gpu:
        raise validation.UserError(f"expected a machine with a CUDA GPU (tune times configs "
                                   f"on it), got {machine.describe()}")
    model = tuning.model_key(machine.device_kind)
    timer_name = tuning.TIMER_NAME
    for name in names:
        tunable = available[name]()
        print(f"{args.op}/{name} on {model}: {len(tunable.candidates)} configs, "
              f"case {tunable.case_id} {'+'.join(tunable.directions)}, timer: {timer_name}")
        best, _ = tuning.tune(tunable, tuning.device_timer)
        if best is None:
            print("  every config failed; nothing recorded")
            continue
        path = tuning.record(args.op, name, model, best.config, time_ms=best.time_ms,
                      case_id=tunable.case_id, timer=timer_name,
                      fields=tuning.chosen_fields(tunable.candidates))
        print(f"  best {best.config}: {best.time_ms:.4f} ms -> {path}")
    return 0


def add_commands(subparsers) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `tune OP [--impl NAME ...]` on `subparsers`."""
    parser = subparsers.add_parser("tune", help="time a grid of block configs on this GPU and "
                                                "record the best in kernels/ops/OP/tuned.json")
    parser.add_argument("op", help="operation, e.g. matmul or attention")
    parser.add_argument("--impl", action="append",
                        help="implementation, every grid of it, or one grid as IMPL:VARIANT "
                             "(triton:f32); repeatable; default all")
    return {"tune": cmd_tune}
