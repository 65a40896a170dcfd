"""`python -m kernels profile | memory | hlo | bottleneck`: XProf traces, peak memory and HLO
guards of any registered JAX implementation; Nsight Compute's verdict on any GPU one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def _case(op, case_id: str):
    from kernels.core import validation

    try:
        return op.case(case_id)
    except ValueError as error:
        raise validation.UserError(f"--{error}") from None


def _impls(op_name: str, names: list[str] | None, jax_only: bool = True) -> list:
    from kernels.core import registry, validation

    impls = [registry.implementation(op_name, n) for n in dict.fromkeys(names)] if names \
        else registry.implementations(op_name)
    if jax_only:
        others = [impl.id for impl in impls if impl.framework != "jax"]
        if others and names:
            raise validation.UserError(f"--impl: expected JAX implementations (XLA compiles "
                                       f"and traces them), got {others}")
        impls = [impl for impl in impls if impl.framework == "jax"]
    return impls


def _default_tags() -> list[str]:
    from kernels.core import devices

    return ["gpu"] if devices.this_machine().has_gpu else ["cpu"]


def _directions(impl, direction: str | None) -> list[str]:
    from kernels.core import registry

    if direction:
        return [direction]
    return [d for d in registry.DIRECTIONS if registry.has_direction(impl, d)]


def cmd_profile(args: argparse.Namespace) -> int:
    """Trace an implementation (or several, side by side) on one case; print the top kernels."""
    import jax

    from kernels.core import devices, registry, validation
    from kernels.guards import memory
    from kernels.profile import profiling

    op = registry.operation(args.op)
    case = _case(op, args.case)
    machine = devices.this_machine()
    if not machine.has_gpu and "cpu" not in case.tags:
        cpu_cases = [c.id for c in op.cases_tagged("cpu")]
        example = next((c.id for c in op.cases_tagged("bench") if c.id in cpu_cases),
                       cpu_cases[0] if cpu_cases else "none")
        raise validation.UserError(f"--case: expected a CPU case here (no GPU), e.g. "
                                   f"{example}; got {case.id}, a real-size GPU case")
    impls = _impls(op.name, args.impl)
    print(f"machine: {machine.describe()}", flush=True)
    labelled: list[tuple[str, Callable[[], Any]]] = []
    for impl in impls:
        reason = devices.case_unavailable_reason(impl, case)
        if reason:
            print(f"skipped {impl.id}: {reason}")
            continue
        fn, call_args = memory.program(impl, case, args.direction)
        compiled = jax.jit(fn)
        labelled.append((impl.name, lambda compiled=compiled, call_args=call_args:
                         compiled(*call_args)))
    if not labelled:
        print("nothing to profile here")
        return 1
    name = f"{op.name}-{case.id}-{args.direction}"
    if len(labelled) == 1:
        profiling.quick_profile(name, labelled[0][1], iterations=args.iterations,
                                root=args.traces, top=args.top)
    else:
        profiling.profile_comparison(name, *labelled, iterations=args.iterations,
                                     root=args.traces, top=args.top)
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    """Compiled peak (XLA's memory analysis) and, on GPU, the live high-water mark."""
    from kernels.core import devices, registry
    from kernels.core.tables import table
    from kernels.guards import memory

    machine = devices.this_machine()
    op = registry.operation(args.op)
    if args.tags:
        registry.check_tags(args.tags, [op])
    print(f"machine: {machine.describe()}", flush=True)
    cases = [_case(op, c) for c in args.case] if args.case \
        else registry.select_cases(op, args.tags or _default_tags())
    rows = []
    for impl in _impls(op.name, args.impl):
        for case in cases:
            reason = devices.case_unavailable_reason(impl, case, machine)
            if reason:
                rows.append([impl.name, case.id, "-", "-", "-", f"skipped: {reason}"])
                continue
            for direction in _directions(impl, args.direction):
                # A fresh process per row on GPU: the device's high-water mark cannot be reset.
                use = memory.measure_isolated(impl, case, direction) if machine.has_gpu \
                    else memory.measure(impl, case, direction, live=False)
                rows.append([impl.name, case.id, direction, memory.human(use.compiled_peak_bytes),
                             memory.human(use.live_peak_bytes),
                             f"temp {memory.human(use.temp_bytes)}"])
                print(f"  measured {impl.id} {case.id} {direction}", file=sys.stderr, flush=True)
    print(table(rows, ["implementation", "case", "direction", "compiled peak",
                       "live peak (GPU)", "note"]))
    return 0


def cmd_hlo(args: argparse.Namespace) -> int:
    """The HLO guard's report per case; exit status 1 if a rule is broken."""
    from kernels.core import devices, registry
    from kernels.guards import hlo

    op = registry.operation(args.op)
    registry.check_tags(args.tags, [op])
    cases = [_case(op, c) for c in args.case] if args.case \
        else registry.select_cases(op, args.tags)
    impls = [impl for impl in _impls(op.name, args.impl)
             if impl.hlo is not None or args.impl]
    broken = 0
    for impl in impls:
        if impl.hlo is None:
            print(f"{impl.id}: declares no HLO expectation")
            continue
        for case in cases:
            reason = devices.case_unavailable_reason(impl, case)
            if reason:
                print(f"{impl.id} {case.id}: skipped: {reason}")
                continue
            report = hlo.check(impl, case)
            if report is None:
                print(f"{impl.id} {case.id}: no rules for {hlo.platform()}")
                continue
            broken += not report.ok
            print(report, flush=True)
    return 1 if broken else 0


def cmd_bottleneck(args: argparse.Namespace) -> int:
    """Nsight Compute over one call of each implementation and direction: a line per kernel
    saying what bounds it (kernels.profile.bottleneck)."""
    import pathlib

    from kernels.core import devices, registry, validation
    from kernels.core.tables import table
    from kernels.profile import bottleneck, crosscheck

    op = registry.operation(args.op)
    case = op.case(args.case)
    impls = [registry.implementation(op.name, n) for n in args.impl]
    machine = devices.this_machine()
    if not machine.has_gpu:
        raise validation.UserError("expected a machine with a CUDA GPU (ncu reads its "
                                   "counters), got none")
    ncu = crosscheck.ncu_path()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine.describe()}", flush=True)
    rows, failed = [], 0
    blank = ["-"] * (len(bottleneck.HEADER) - 2)
    for impl in impls:
        unavailable = devices.case_unavailable_reason(impl, case, machine)
        for direction in args.direction:
            reason = unavailable or (None if registry.has_direction(impl, direction)
                                     else f"has no {direction}")
            if reason:
                rows.append([impl.name, f"skipped: {reason}"] + blank)
                continue
            print(f"  ncu: {impl.name} {case.id} {direction} ...", file=sys.stderr, flush=True)
            try:
                report, kernels = bottleneck.profile(op.name, impl.name, case.id, direction,
                                                     out, ncu)
            except RuntimeError as error:
                failed += 1
                rows.append([impl.name, f"FAILED: {error}"[:200]] + blank)
                continue
            rows.extend(bottleneck.rows(f"{impl.name} {direction}", kernels))
            print(f"  report: {report}", file=sys.stderr, flush=True)
    print(table(rows, bottleneck.HEADER))
    return 1 if failed else 0


def add_commands(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace],
                                                                         int]]:
    """Add `profile`, `memory`, `hlo` and `bottleneck` to the CLI's subparsers; their handlers
    by name."""
    from kernels.core import validation

    profile = sub.add_parser("profile", help="XProf trace of implementations on one case, "
                                             "and the top kernels by device time")
    profile.add_argument("op", help="operation, e.g. softmax")
    profile.add_argument("--impl", action="append", help="implementation (repeatable; "
                                                         "default: every JAX one)")
    profile.add_argument("--case", required=True, help="case id, e.g. f32-32768x4096")
    profile.add_argument("--direction", choices=("fwd", "bwd"), default="fwd",
                         help="forward or backward (default fwd)")
    profile.add_argument("--top", type=validation.positive_int, default=10,
                         help="kernels to list (default 10)")
    profile.add_argument("--iterations", type=validation.positive_int, default=5,
                         help="calls traced (default 5)")
    profile.add_argument("--traces", type=validation.output_directory,
                         help="root folder (default: $KERNELPERF_TRACES or traces)")

    memory = sub.add_parser("memory", help="peak device memory per implementation and case")
    memory.add_argument("op", help="operation, e.g. mlp")
    memory.add_argument("--impl", action="append",
                        help="implementation (repeatable; default: every JAX one)")
    memory.add_argument("--case", action="append", help="case id (repeatable)")
    memory.add_argument("--tags", action="extend", nargs="+",
                        help="case sets (default: gpu on a GPU, else cpu)")
    memory.add_argument("--direction", choices=("fwd", "bwd"),
                        help="forward or backward (default: each the implementation has)")

    hlo = sub.add_parser("hlo", help="the HLO guard's report (fusions, custom calls, copies)")
    hlo.add_argument("op", help="operation, e.g. softmax")
    hlo.add_argument("--impl", action="append",
                     help="implementation (repeatable; default: every one with an HLO guard)")
    hlo.add_argument("--case", action="append", help="case id (repeatable)")
    hlo.add_argument("--tags", nargs="+", default=["cpu"], help="case sets (default: cpu)")

    neck = sub.add_parser("bottleneck", help="Nsight Compute over one call: what bounds each "
                                             "kernel (GPU)")
    neck.add_argument("op", help="operation, e.g. attention")
    neck.add_argument("--impl", action="extend", nargs="+", required=True,
                      help="implementation names")
    neck.add_argument("--case", required=True, help="case id, e.g. bf16-4x4096x16x128")
    neck.add_argument("--direction", nargs="+", choices=("fwd", "bwd"), default=["fwd"],
                      help="forward, backward or both (default fwd)")
    neck.add_argument("--out", default="traces/bottleneck", type=validation.output_directory,
                      help="folder for the .ncu-rep reports and ncu's rule text "
                      "(default traces/bottleneck)")
    return {"profile": cmd_profile, "memory": cmd_memory, "hlo": cmd_hlo,
            "bottleneck": cmd_bottleneck}
