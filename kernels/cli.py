"""The kernelperf command line: `python -m kernels COMMAND` (list, check, time, roofline,
bench, compare, profile, memory, hlo, tune, ...; `--help` lists them all)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from kernels import environment, validation


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line (argparse prints the usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def revision(text: str) -> str:
    """argparse type: a git revision that names a commit here."""
    from kernels import asv_tools

    try:
        asv_tools.full_hash(text)
    except subprocess.CalledProcessError:
        raise argparse.ArgumentTypeError(f"expected a git revision of this repository (a branch, "
                                         f"tag or commit), got {text!r}") from None
    return text


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _cpu_mode(impl) -> str:
    """How a GPU kernel runs on a machine without one: in Pallas's or Triton's interpreter."""
    if impl.fn.__module__.rsplit(".", 1)[-1].startswith("pallas"):
        return " (Pallas interpreted)"
    if "triton" in impl.requires.modules:
        return " (TRITON_INTERPRET=1)"
    return ""


def cmd_list(args: argparse.Namespace) -> int:
    from kernels import devices, registry

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
                         impl.framework, f"{len(op.cases_tagged('cpu'))}/"
                         f"{len(op.cases_tagged('gpu'))}", status])
    print(table(rows, ["operation", "implementation", "role", "framework", "cases cpu/gpu",
                        "status"]))
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
    from kernels import checking, devices, registry

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


def cmd_bench(args: argparse.Namespace) -> int:
    """asv on HEAD (and the base, if given), then the compare table; its exit status."""
    from kernels import asv_tools

    revisions = [args.base, args.head] if args.base else [args.head]
    if args.base and asv_tools.full_hash(args.base) == asv_tools.full_hash(args.head):
        revisions = [args.head]  # a second asv run of one commit would overwrite the first
    machine = asv_tools.bench(revisions, bench_regex=args.bench)
    if not args.base:
        return 0
    return asv_tools.run(args.base, args.head, machine=machine, min_gap=args.min_gap,
                         summary_md=args.summary_md)


def cmd_compare(args: argparse.Namespace) -> int:
    from kernels import asv_tools

    machine = args.machine or asv_tools.machine_name()
    return asv_tools.run(args.base, args.head, machine=machine, min_gap=args.min_gap,
                         summary_md=args.summary_md)


def cmd_noise_floor(args: argparse.Namespace) -> int:
    from kernels import asv_tools

    asv_tools.learn_floors(args.revision, args.runs, bench_regex=args.bench)
    return 0


def main(argv: list[str] | None = None) -> int:
    environment.configure()
    parser = Parser(prog="python -m kernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="operations, implementations, and whether each runs here")
    check = sub.add_parser("check", help="compare implementations with the reference")
    check.add_argument("op", nargs="?", help="operation (default: all)")
    check.add_argument("--impl", action="append", help="implementation name (repeatable)")
    check.add_argument("--tags", nargs="+", default=["cpu", "gpu"],
                       help="case sets to run (default: cpu gpu)")
    check.add_argument("--seed", type=validation.nonnegative_int, default=0)
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
    from kernels import gate, measure_cli, profiling_cli, tuning

    extra_commands = {**measure_cli.add_commands(sub), **profiling_cli.add_commands(sub),
                      **tuning.add_commands(sub), **gate.add_commands(sub)}
    args = parser.parse_args(argv)
    commands = {"list": cmd_list, "check": cmd_check, "bench": cmd_bench, "compare": cmd_compare,
                "noise-floor": cmd_noise_floor, **extra_commands}
    try:
        return commands[args.command](args)
    except validation.UserError as error:
        # A user's mistake, not a bug: one line, no traceback.
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return 2
