"""`list` and `check`: what is registered and runs here, and every implementation against its
reference through the harness the tests use."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from kernels.core import validation
from kernels.core.tables import table


def _cpu_mode(impl) -> str:
    """How a GPU kernel runs on a machine without one: in Pallas's or Triton's interpreter."""
    if impl.fn.__module__.rsplit(".", 1)[-1].startswith("pallas"):
        return " (Pallas interpreted)"
    if "triton" in impl.requires.modules:
        return " (TRITON_INTERPRET=1)"
    return ""


def _float32_precision(impl) -> str:
    """What `impl` computes float32 cases in, GPU/CPU ("TF32/FP32"; one name where both are
    the same; "-" where it takes no float32): docs/precision.md."""
    declared = impl.precision
    if declared is None:
        return "FP32"
    if declared.gpu is None and declared.cpu is None:
        return "-"
    if declared.gpu == declared.cpu:
        return declared.gpu
    return f"{declared.gpu or '-'}/{declared.cpu or '-'}"


def cmd_list(args: argparse.Namespace) -> int:
    from kernels.core import devices, registry

    machine = devices.this_machine()
    print(f"machine: {machine.describe()}")
    rows = []
    for op in registry.operations():
        for impl in registry.implementations(op.name):
            reason = devices.unavailable_reason(impl, machine)
            if reason is None and not machine.has_gpu:
                # An implementation may refuse every CPU case (a Mosaic GPU kernel the
                # interpreter cannot run): say so with its reason, not "runs here".
                refusals = [impl.supports(case) for case in op.cases_tagged("cpu")]
                if refusals and all(refusals):
                    # What the machine lacks ("needs ...") before a case-specific refusal.
                    reason = min(refusals, key=lambda why: not why.startswith("needs"))
            if reason is None:
                status = "runs here" + ("" if machine.has_gpu else _cpu_mode(impl))
            else:
                status = f"no: {reason}"
            rows.append([op.name, impl.name, "baseline" if impl.baseline else "kernel",
                         impl.framework, _float32_precision(impl),
                         f"{len(op.cases_tagged('cpu'))}/{len(op.cases_tagged('gpu'))}",
                         status])
    print(table(rows, ["operation", "implementation", "role", "framework", "f32 in gpu/cpu",
                        "cases cpu/gpu", "status"]))
    for name, why in registry.import_failures().items():
        print(f"not registered: {name}: {why}")
    return 0


def margin(results) -> float:
    """How far below its tolerance the worst comparison stayed: tolerance / error, over the
    output and every gradient and over both error measures (inf where nothing differed)."""
    worst = min((c.tolerance / max(c.relative_error, c.max_error)
                 if max(c.relative_error, c.max_error) > 0 else float("inf")) for c in results)
    return worst


def cmd_check(args: argparse.Namespace) -> int:
    """Correctness table with error norms: the same harness the tests use."""
    from kernels.core import checking, devices, registry

    ops = [registry.operation(args.op)] if args.op else registry.operations()
    for op in ops:
        for name in args.impl or ():
            registry.implementation(op.name, name)
    registry.check_tags(args.tags, ops)
    machine = devices.this_machine()
    print(f"machine: {machine.describe()}", flush=True)
    rows, failed = [], 0
    for op in ops:
        impls = [registry.implementation(op.name, n) for n in args.impl] if args.impl \
            else registry.implementations(op.name)
        for impl in impls:
            for case in registry.select_cases(op, args.tags):
                reason = devices.case_unavailable_reason(impl, case, machine)
                if reason:
                    rows.append([impl.id, case.id, "-", "-", "-", "-", f"skipped: {reason}"])
                    continue
                for distribution in op.distributions:
                    try:
                        results = checking.check(impl, case, seed=args.seed,
                                                 distribution=distribution)
                    except checking.CheckFailure as error:
                        failed += 1
                        rows.append([impl.id, case.id, distribution, "-", "-", "-",
                                 f"FAIL {error}"])
                        continue
                    out, grads = results[0], results[1:]
                    grad = max((g.relative_error for g in grads), default=float("nan"))
                    rows.append([impl.id, case.id, distribution, f"{out.relative_error:.1e}",
                                 f"{grad:.1e}", f"{margin(results):.3g}x",
                                 f"ok (tol {out.tolerance:.1e})"])
                print(f"  checked {impl.id} {case.id}", file=sys.stderr, flush=True)
    print(table(rows, ["implementation", "case", "inputs", "rel err out", "rel err grad",
                        "margin", "result"]))
    return 1 if failed else 0


def add_commands(sub) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `list` and `check` on `sub`; returns name -> handler."""
    sub.add_parser("list", help="operations, implementations, and whether each runs here")
    check = sub.add_parser("check", help="compare implementations with the reference")
    check.add_argument("op", nargs="?", help="operation (default: all)")
    check.add_argument("--impl", action="append", help="implementation name (repeatable)")
    check.add_argument("--tags", nargs="+", default=["cpu", "gpu"],
                       help="case sets to run (default: cpu gpu)")
    check.add_argument("--seed", type=validation.nonnegative_int, default=0,
                       help="seed of the inputs' random generator (default 0)")
    return {"list": cmd_list, "check": cmd_check}
