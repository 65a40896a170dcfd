"""Commands of the measurement core: time, roofline, plot-roofline, ceilings, verify-timing.

  python -m kernels time softmax --tags gpu --direction fwd bwd --versus copy fastest
  python -m kernels roofline softmax --dims rows=4096 cols=1024,4096 --dtype bf16
  python -m kernels roofline attention --batch 4 --heads 8 --head-dim 64 \
      --seq-lengths 128,256,512
  python -m kernels plot-roofline traces/roofline_data_<model>_<stamp>.json
  python -m kernels ceilings
  python -m kernels verify-timing
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib
import statistics
import sys
from collections.abc import Callable
from typing import Any

from kernels.core import dtypes, validation

# Attention-style flags and the dimension names they set (the first name an operation has).
ATTENTION_FLAGS = {
    "batch": ("batch", "b"),
    "heads": ("heads", "num_heads", "h"),
    "head_dim": ("head_dim", "d"),
    "seq_lengths": ("seq", "seq_len", "seq_q", "seq_kv", "s"),
}


def _int_list(text: str) -> list[int]:
    """Comma-separated sizes, each an integer >= 1."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:  # not a number, or an empty item ("4,,8", "8,")
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1, got {text!r}")
    return values


def _dims(text: str) -> tuple[str, list[int]]:
    name, sep, values = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected name=v1,v2, got {text!r}")
    return name, _int_list(values)


def cases_from_dims(op, dims: dict[str, list[int]], dtypes: list[str]) -> list:
    """Cases of `op` over the product of `dims` (every dimension of the op must be given).

    Parameters (e.g. `causal`) come from the operation's first "gpu" case; the
    new cases are tagged "custom", "cpu" and "gpu" so they run on any machine.
    """
    from kernels.core import registry

    template = (op.cases_tagged("gpu") or op.cases)[0]
    names = [name for name, _ in template.dims]
    unknown = sorted(set(dims) - set(names))
    missing = [name for name in names if name not in dims]
    if unknown or missing:
        raise validation.UserError(f"--dims: {op.name} has dimensions {names}; got unknown "
                                   f"{unknown}, missing {missing}")
    cases = []
    for dtype in dtypes:
        for values in itertools.product(*(dims[name] for name in names)):
            cases.append(registry.make_case(op.name, dtype, dict(zip(names, values, strict=True)),
                                            params=dict(template.params),
                                            tags=("custom", "cpu", "gpu")))
    return cases


def _attention_dims(op, args) -> dict[str, list[int]]:
    template = (op.cases_tagged("gpu") or op.cases)[0]
    names = [name for name, _ in template.dims]
    dims: dict[str, list[int]] = {}
    for flag, aliases in ATTENTION_FLAGS.items():
        values = getattr(args, flag, None)
        if values is None:
            continue
        if isinstance(values, int):
            values = [values]
        matched = [n for n in names if n in aliases] if flag != "seq_lengths" else \
            [n for n in names if n.startswith("seq") or n == "s"]
        if not matched:
            raise validation.UserError(f"--{flag.replace('_', '-')}: {op.name} has no such "
                                       f"dimension; its dimensions are {names}")
        for name in matched:
            dims[name] = list(values)
    return dims


def _fwd_bytes(op, case) -> float:
    return op.work(case, "fwd").bytes


def refuse_gpu_sizes(op, cases: list, flag: str) -> None:
    """On a machine without a GPU, stop (one line) if a case built from `flag` moves more bytes
    than the operation's largest "cpu" case: interpreted kernels take hours at real sizes."""
    from kernels.guards import memory

    cpu_cases = op.cases_tagged("cpu")
    cap = max((_fwd_bytes(op, c) for c in cpu_cases), default=0.0)
    large = [c for c in cases if _fwd_bytes(op, c) > cap]
    if large:
        raise validation.UserError(
            f"{flag}: expected CPU sizes here (no GPU; at most {memory.human(cap)} moved, "
            f"{op.name}'s largest \"cpu\" case), got {large[0].id} "
            f"({memory.human(_fwd_bytes(op, large[0]))}){' and more' if len(large) > 1 else ''}"
            f"; run it on a GPU, or pass --any-size")


def select(args) -> tuple[Any, list, list]:
    """(operation, implementations, cases) named by the common arguments.

    Without a GPU: cases built from --dims or the attention flags must be CPU-sized
    (`refuse_gpu_sizes`, unless --any-size), and with no --tags or --case the
    operation's "bench" CPU case stands for its CPU set (the quick default)."""
    from kernels.core import devices, registry

    op = registry.operation(args.op)
    impls = [registry.implementation(op.name, n) for n in dict.fromkeys(args.impl)] \
        if args.impl else registry.implementations(op.name)
    if any(not pattern for pattern in args.case or ()):
        raise validation.UserError(f"--case: expected parts of case ids, got {args.case} (an "
                                   f"empty one matches every case)")
    named = [name for name, _ in args.dims or ()]
    repeated = sorted({name for name in named if named.count(name) > 1})
    if repeated:
        raise validation.UserError(f"--dims: expected each dimension once (values go "
                                   f"comma-separated: rows=4,8), got {repeated} more than once")
    declared = sorted({c.dtype for c in op.cases})
    refused = [d for d in args.dtype or () if d not in declared]
    if refused:
        # No implementation of this operation is declared (or checked) in that dtype; JAX
        # would also narrow float64 to float32 and report the result as f64.
        raise validation.UserError(f"--dtype: {op.name} is declared in {declared}, got "
                                   f"{refused}")
    if args.tags:
        registry.check_tags(args.tags, [op])
    on_gpu = devices.this_machine().has_gpu
    dims = dict(args.dims or [])
    dims.update(_attention_dims(op, args))
    if dims:
        dtypes = args.dtype or sorted({c.dtype for c in op.cases_tagged("gpu")},
                                      key=["bf16", "f16", "f32"].index)
        cases = cases_from_dims(op, dims, dtypes)
        if not on_gpu and not args.any_size:
            refuse_gpu_sizes(op, cases, "--dims" if args.dims else
                             "--batch/--heads/--head-dim/--seq-lengths")
    else:
        tags = args.tags or ["gpu" if on_gpu else "cpu"]
        cases = registry.select_cases(op, tags)
        if args.dtype:
            cases = [c for c in cases if c.dtype in args.dtype]
        quick = [c for c in cases if registry.BENCH_TAG in c.tags]
        if not (on_gpu or args.tags or args.case) and quick and len(quick) < len(cases):
            print(f"no GPU: {op.name}'s bench case ({', '.join(c.id for c in quick)}) only; "
                  f"--tags cpu for all {len(cases)} CPU cases", flush=True)
            cases = quick
    if args.case:
        cases = [c for c in cases if any(pattern in c.id for pattern in args.case)]
    if not cases:
        raise validation.UserError(f"no {op.name} cases match (tags {args.tags}, dtype "
                                   f"{args.dtype}, case {args.case}); cases are "
                                   f"{[c.id for c in op.cases]}")
    return op, impls, cases


@dataclasses.dataclass
class Row:
    impl: Any
    case: Any
    direction: str
    measurement: Any = None
    skipped: str | None = None


def run_rows(op, impls, cases, directions, regime, rule) -> list[Row]:
    """Time every (implementation, case, direction) that can run here, with a progress bar."""
    from kernels.core import checking, devices, registry, timing
    from kernels.roofline import report

    todo = [Row(impl, case, d) for case in cases for d in dict.fromkeys(directions)
            for impl in impls]
    inputs: dict[str, tuple] = {}  # numpy inputs per case, made once (large ones take seconds)
    for row in report.progress(todo, f"timing {op.name}",
                               lambda r: f"{r.impl.name} {r.case.id} {r.direction}"):
        reason = devices.case_unavailable_reason(row.impl, row.case)
        if reason is None and not registry.has_direction(row.impl, row.direction):
            reason = "no backward"
        if reason:
            row.skipped = reason
            continue
        try:
            if row.case.id not in inputs:
                inputs.clear()
                inputs[row.case.id] = checking.make_inputs(op, row.case, 0, "normal")
            row.measurement = timing.measure(row.impl, row.case, row.direction, regime, rule=rule,
                                             inputs=inputs[row.case.id])
        except Exception as error:  # one failing kernel must not hide the others' numbers
            row.skipped = f"ERROR {type(error).__name__}: {error}"[:200]
        except KeyboardInterrupt:  # Ctrl-C (or a timeout's SIGINT) keeps what was measured
            print(f"interrupted: keeping the {sum(r.measurement is not None for r in todo)} "
                  f"points measured so far", file=sys.stderr)
            for rest in todo[todo.index(row):]:
                rest.skipped = rest.skipped or "not measured: interrupted"
            break
    return todo


def _rule(args):
    from kernels.core import fingerprint, timing

    rule = timing.default_rule(fingerprint.fingerprint())
    if args.budget:
        rule = dataclasses.replace(rule, time_budget_s=args.budget)
    return rule


def _ceilings(allow_measure: bool = True):
    from kernels.core import fingerprint
    from kernels.roofline import ceilings

    device = fingerprint.fingerprint()
    sheet, measured = ceilings.for_device(device, allow_measure=allow_measure)
    return device, sheet, measured


def _speedups(rows: list[Row], mixed: bool = False) -> dict[int, str]:
    """Each non-baseline row's speedup over the best baseline of its (case, direction) and
    precision timed by the same method (`timing.speedup`): "other clock" where only other
    clocks timed one, "no TF32 baseline" where none computed in its precision (those of
    another are rows of their own, their precision in its column, never divided by); with
    `mixed`, across clocks (never across precisions), and the cell says so."""
    from kernels.core import timing

    peers: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row.measurement and row.impl.baseline:
            peers.setdefault((row.case.id, row.direction), {})[row.impl.name] = row.measurement
    out = {}
    for index, row in enumerate(rows):
        baselines = peers.get((row.case.id, row.direction))
        if not row.measurement or row.impl.baseline or not baselines:
            continue
        fastest = timing.speedup(row.measurement, baselines, across_clocks=mixed)
        out[index] = (fastest.why_none() if fastest.value is None else
                      f"{fastest.value:.2f}x" + (" (mixed clocks)" if mixed else ""))
    return out


def mixed_clocks(rows: list[Row], ceiling=None) -> str | None:
    """Why these rows (and the measured ceiling) cannot share one chart, or None."""
    from kernels.core import timing

    measured = [row.measurement for row in rows if row.measurement is not None]
    why = timing.comparable(*measured)
    if why is None and ceiling is not None and ceiling.kind == "measured" and measured \
            and ceiling.method not in (None, measured[0].method):
        why = (f"points timed by {measured[0].method}, measured ceilings by {ceiling.method} "
               f"(python -m kernels ceilings --refresh)")
    return why


def _format_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.3f} ms"


def cmd_time(args: argparse.Namespace) -> int:
    from kernels.core import registry
    from kernels.core.tables import table
    from kernels.roofline import model, report

    op, impls, cases = select(args)
    check_versus(op, impls, args.versus)
    device, sheet, measured = _ceilings()
    print(f"device: {device.describe()}", flush=True)
    ceiling = measured or sheet
    if ceiling:
        print(f"roofline: {ceiling.kind} ceilings ({ceiling.bandwidth / 1e9:.0f} GB/s)",
              flush=True)
    rows = run_rows(op, impls, cases, args.direction, args.regime, _rule(args))
    speedups = _speedups(rows, mixed=args.mixed_clocks)
    lines = []
    for index, row in enumerate(rows):
        if row.measurement is None:
            lines.append([row.impl.id, row.case.id, row.direction, "-", "-", "-", "-", "-", "-",
                          "-", "-", "-", "-", "-", f"skipped: {row.skipped}"])
            continue
        m = row.measurement
        work = registry.operation(op.name).work(row.case, row.direction)
        placement = model.place(
            work, m.median_s, ceiling, row.case.dtype, devices=row.impl.devices_for(row.case),
            interconnect=report.sharding_ceiling(row.impl, row.case, work)) if ceiling else None
        speedup = speedups.get(index, "baseline" if row.impl.baseline else "-")
        lines.append([row.impl.id, row.case.id, row.direction, m.precision or "?",
                      _format_time(m.median_s), f"{100 * m.cv:.2f}%", str(m.repeats), m.method,
                      m.regime, m.stop_reason, str(m.throttled_count),
                      f"{work.flops / m.median_s / 1e12:.3f}",
                      f"{work.bytes / m.median_s / 1e9:.1f}", report.fraction_text(placement),
                      speedup])
    print(table(lines, ["implementation", "case", "dir", "precision", "median", "CV", "n",
                        "method", "regime", "stop", "throttled", "TFLOP/s", "GB/s", "roofline",
                        "vs best baseline of its precision"]))
    for name in dict.fromkeys(args.versus or ()):
        print()
        print(versus_table(op, rows, name, measured))
    return _status(rows)


# --versus names besides an operation's implementations.
VERSUS_COPY = "copy"  # the bytes the case must move at the measured copy ceiling
VERSUS_FASTEST = "fastest"  # the fastest implementation timed in the case and direction


def check_versus(op, impls, names: list[str] | None) -> None:
    """UserError unless each --versus name is an implementation being timed, "copy" or
    "fastest"."""
    from kernels.core import registry

    timed = [impl.name for impl in impls]
    for name in names or ():
        if name in (VERSUS_COPY, VERSUS_FASTEST) or name in timed:
            continue
        declared = [impl.name for impl in registry.implementations(op.name)]
        why = ("not among those timed (--impl)" if name in declared else
               f"not an implementation of {op.name}")
        raise validation.UserError(f"--versus: expected one of {timed}, {VERSUS_COPY!r} or "
                                   f"{VERSUS_FASTEST!r}, got {name!r} ({why})")


def _ratio_cell(reference, m) -> str:
    """The reference's time over m's, or why it is not shown: the clocks or precisions differ.
    `reference`: (seconds, method or None, precision or None)."""
    seconds, method, precision = reference
    if method is not None and m.method != method:
        return f"other clock ({m.method})"
    theirs = getattr(m, "precision", None)
    if precision and theirs and theirs != precision:
        return f"other precision ({theirs})"
    return f"{seconds / m.median_s:.3f}"


def _versus_reference(op, name: str, case, direction: str, by_impl: dict[str, Row], measured):
    """(seconds, method, precision, label) of `name` in one (case, direction) whose rows are
    `by_impl`, or a str: why there is none."""
    timed = {n: r.measurement for n, r in by_impl.items() if r.measurement is not None}
    if name == VERSUS_COPY:
        if measured is None:
            return "no measured copy ceiling (python -m kernels ceilings)"
        seconds = op.work(case, direction).bytes / measured.bandwidth
        return seconds, measured.method, None, _format_time(seconds)
    chosen = name
    if name == VERSUS_FASTEST and timed:
        # The fastest by the clock most rows were timed by: a time by another is no rival.
        methods = [m.method for m in timed.values()]
        clock = max(methods, key=methods.count)
        chosen = min((n for n in timed if timed[n].method == clock),
                     key=lambda n: timed[n].median_s)
    if chosen not in timed:
        return by_impl[chosen].skipped or "not timed" if chosen in by_impl else "not timed"
    m = timed[chosen]
    label = _format_time(m.median_s) + (f" ({chosen})" if name == VERSUS_FASTEST else "")
    return m.median_s, m.method, getattr(m, "precision", None), label


def versus_table(op, rows: list[Row], name: str, measured=None) -> str:
    """One line per (case, direction), one column per implementation: `name`'s time over
    each implementation's (> 1: faster than it), from the rows of this one run. `name` is an
    implementation, "copy" (the bytes the case must move, by its work model, at the measured
    copy ceiling `measured`: 1 is copy speed) or "fastest" (the fastest row timed there)."""
    from kernels.core.tables import table

    impls = list(dict.fromkeys(row.impl.name for row in rows))
    cells: dict[tuple[str, str], dict[str, Row]] = {}
    for row in rows:
        cells.setdefault((row.case.id, row.direction), {})[row.impl.name] = row
    lines = []
    for (case_id, direction), by_impl in cells.items():
        timed = {n: r.measurement for n, r in by_impl.items() if r.measurement is not None}
        case = next(iter(by_impl.values())).case
        reference = _versus_reference(op, name, case, direction, by_impl, measured)
        if isinstance(reference, str):
            lines.append([case_id, direction, f"- ({reference})", *("-" for _ in impls)])
            continue
        lines.append([case_id, direction, reference[3], *(
            _ratio_cell(reference[:3], timed[n]) if n in timed else "-" for n in impls)])
    what = {VERSUS_COPY: "copy bound", VERSUS_FASTEST: "fastest"}.get(name, name)
    title = {
        VERSUS_COPY: "the bytes each must move at the measured copy ceiling"
                     + (f" ({measured.bandwidth / 1e9:.0f} GB/s)" if measured else "")
                     + " over its time (1.000: at copy speed)",
        VERSUS_FASTEST: "the fastest time over each's (1.000: the fastest)",
    }.get(name, f"{name}'s time over each's (> 1: faster than {name})")
    return f"vs {what}: {title}; one run\n" + table(lines, ["case", "dir", what, *impls])


def _status(rows: list[Row]) -> int:
    """1 if a row failed with an error (one failing kernel keeps the others' rows), else 0."""
    return 1 if any(row.skipped and row.skipped.startswith("ERROR") for row in rows) else 0


def cmd_roofline(args: argparse.Namespace) -> int:
    from kernels.roofline import report

    op, impls, cases = select(args)
    device, sheet, measured = _ceilings()
    print(f"device: {device.describe()}", flush=True)
    rows = run_rows(op, impls, cases, args.direction, args.regime, _rule(args))
    mixed = mixed_clocks(rows, measured)
    if mixed and not args.mixed_clocks:
        print(f"roofline: refused: {mixed}; pass --mixed-clocks to draw them anyway",
              file=sys.stderr)
        return 2
    points = [report.point(row.impl, row.case, row.direction, row.measurement, sheet, measured)
              for row in rows if row.measurement is not None]
    for row in rows:
        if row.skipped:
            print(f"skipped {row.impl.id} {row.case.id} {row.direction}: {row.skipped}")
    if not points:
        print("roofline: nothing measured (every row skipped, above): no data file written",
              file=sys.stderr)
        return 1
    path = report.write_data(points, device, sheet, measured, pathlib.Path(args.out))
    print(f"wrote {path}")
    for png in report.plot_data(path):
        print(f"wrote {png}")
    return _status(rows)


def roofline_data_file(text: str) -> str:
    """argparse type: a roofline data file as `python -m kernels roofline` writes it."""
    import json

    from kernels.roofline import report

    path = pathlib.Path(text)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise argparse.ArgumentTypeError(f"expected a roofline data file (JSON), got {text!r}, "
                                         f"which {what}")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise argparse.ArgumentTypeError(f"expected a roofline data file (JSON), got {text!r}, "
                                         f"which is not JSON ({error})") from None
    problem = report.data_problem(data)
    if problem:
        raise argparse.ArgumentTypeError(f"expected a roofline data file (python -m kernels "
                                         f"roofline), got {text!r}, which is not one: expected "
                                         f"{problem}")
    return text


def cmd_plot_roofline(args: argparse.Namespace) -> int:
    from kernels.roofline import report

    written = report.plot_data(pathlib.Path(args.json),
                               pathlib.Path(args.out) if args.out else None)
    if not written:
        raise validation.UserError(f"json: {args.json} has no point with FLOPs to draw")
    for png in written:
        print(f"wrote {png}")
    return 0


def cmd_ceilings(args: argparse.Namespace) -> int:
    from kernels.core import fingerprint
    from kernels.core.tables import table
    from kernels.roofline import ceilings

    device = fingerprint.fingerprint()
    print(f"device: {device.describe()}")
    sheet = ceilings.datasheet(device.name) if device.platform == "gpu" else None
    measured = ceilings.measured(device, refresh=args.refresh)
    if sheet is None and device.platform == "gpu":
        print(f"no datasheet entry for {device.name!r}: measured ceilings only")
    rows = [["memory bandwidth", _rate(sheet and sheet.bandwidth, "GB/s", 1e9),
             _rate(measured and measured.bandwidth, "GB/s", 1e9),
             _ratio(measured and measured.bandwidth, sheet and sheet.bandwidth)]]
    for dtype in ("fp8", "bf16", "f16", "tf32", "f32", "f64"):
        a = sheet.flops.get(dtype) if sheet else None
        b = measured.flops.get(dtype) if measured else None
        if a or b:
            rows.append([f"{dtype} dense", _rate(a, "TFLOP/s", 1e12), _rate(b, "TFLOP/s", 1e12),
                         _ratio(b, a)])
    print(table(rows, ["ceiling", "datasheet", "measured", "measured/datasheet"]))
    if sheet:
        print(f"datasheet: {sheet.source}")
    if measured:
        print(f"measured: {measured.source} (cache: {ceilings.cache_path(device.model)})")
    return 0


def _rate(value, unit, scale) -> str:
    """`value` in `unit` (scaled by `scale`), stepping down by 1000 where it is under 1."""
    if not value:
        return "-"
    prefixes = {"T": "G", "G": "M", "M": "k"}
    while value / scale < 1 and unit[0] in prefixes:
        unit, scale = prefixes[unit[0]] + unit[1:], scale / 1e3
    return f"{value / scale:.1f} {unit}"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "-"


# verify-timing: one kernel of each family (Pallas, Triton, ctypes CUDA, XLA) on a small and
# a large softmax and a bf16 8192^3 matmul, each against an independent profiler.
VERIFY_CASES = tuple(
    [("softmax", impl, case) for case in ("f32-256x1024", "f32-32768x4096")
     for impl in ("pallas", "triton", "cuda", "xla")] +
    [("matmul", impl, "bf16-8192x8192x8192")
     for impl in ("pallas_mosaic", "triton", "cuda_wgmma", "xla")])
AGREEMENT = 0.03
REPEAT_CV = 0.01
CV_FLOOR_S = 100e-6  # the CV goal holds for kernels of 100 us or more


def cmd_verify_timing(args: argparse.Namespace) -> int:
    """The timer against independent measurements (a profiler trace: XLA's for JAX code,
    torch.profiler's for torch-side code; ncu), and its spread over repeated timings."""
    from kernels.core import devices, registry, timing
    from kernels.core.tables import table
    from kernels.profile import crosscheck

    selected = [c for c in VERIFY_CASES if (not args.impl or c[1] in args.impl)
                and (not args.case or any(word in c[2] for word in args.case))]
    if not selected:
        raise validation.UserError(
            f"--impl/--case: expected some of the checked kernels, "
            f"{sorted({impl for _, impl, _ in VERIFY_CASES})}, and cases, "
            f"{sorted({case for _, _, case in VERIFY_CASES})}; got --impl {args.impl}, "
            f"--case {args.case}")
    if not devices.this_machine().has_gpu:
        print("verify-timing: skipped: needs a CUDA GPU (it compares CUPTI kernel time with "
              "an independent profiler trace)")
        return 0
    use_ncu = args.ncu and crosscheck.find_ncu() is not None
    lines, ok = [], True
    for op_name, impl_name, case_id in selected:
        impl = registry.implementation(op_name, impl_name)
        reason = devices.case_unavailable_reason(impl, registry.operation(op_name).case(case_id))
        if reason:
            lines.append([f"{impl.id} {case_id}", "-", "-", "-", "-", "-", "-",
                          f"skipped: {reason}"])
            continue
        independent: dict[str, float | str] = {}
        for name, run in (("trace", crosscheck.trace_in_subprocess),
                          ("ncu", crosscheck.ncu_kernel_time if use_ncu else None)):
            if run is None:
                independent[name] = "not run (--ncu)"
                continue
            try:
                independent[name] = run(op_name, impl_name, case_id, calls=args.calls)
            except Exception as error:  # report it and go on to the other checks
                independent[name] = f"failed: {error}"[:120]
            print(f"  {op_name}-{impl_name} {case_id}: {name} {independent[name]}",
                  file=sys.stderr, flush=True)
        timeable = timing.prepare(impl, registry.operation(op_name).case(case_id))
        runs = [timing.time_timeable(timeable) for _ in range(args.repeats)]
        medians = [m.median_s for m in runs]
        timer = statistics.median(medians)
        spread = statistics.stdev(medians) / statistics.fmean(medians)
        sample_cv = statistics.median(m.cv for m in runs)
        cells = []
        for name in ("trace", "ncu"):
            value = independent[name]
            cells.append(f"{_format_time(value)} ({100 * (timer - value) / value:+.2f}%)"
                         if isinstance(value, float) else value)
        # The verdict is against the profiler trace, whose calls follow the flush as the
        # timer's do. ncu is shown beside it: it serialises every kernel and invalidates
        # the caches itself, so kernels of a few microseconds read ~1 us longer there.
        trace = independent["trace"]
        agreed = isinstance(trace, float) and abs(timer - trace) <= AGREEMENT * trace
        steady = timer < CV_FLOOR_S or (spread <= REPEAT_CV and sample_cv <= REPEAT_CV)
        passed = agreed and steady
        ok &= passed
        lines.append([f"{impl.id} {case_id}", _format_time(timer), *cells,
                      f"{100 * spread:.2f}% (n={len(medians)})", f"{100 * sample_cv:.2f}%",
                      f"{runs[0].method}, {runs[0].stop_reason}, {runs[0].repeats} samples",
                      "ok" if passed else "FAIL"])
        print("  " + " | ".join(lines[-1]), file=sys.stderr, flush=True)  # survives a later crash
    print(table(lines, ["kernel", "timer (median of medians)", "profiler trace", "ncu",
                        "CV of medians", "CV of samples", "first run",
                        f"trace within {AGREEMENT:.0%}, CVs<=1% (>= 100 us)"]))
    return 0 if ok else 1


def _selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", help="operation, e.g. softmax")
    parser.add_argument("--impl", action="extend", nargs="+", help="implementation names")
    parser.add_argument("--case", action="extend", nargs="+",
                        help="keep cases whose id contains one of these")
    parser.add_argument("--tags", action="extend", nargs="+",
                        help="case sets (default: gpu on a GPU, else cpu)")
    parser.add_argument("--dtype", action="extend", nargs="+", choices=sorted(dtypes.NAMES),
                        help="keep these dtypes (of those the operation declares)")
    parser.add_argument("--dims", action="extend", nargs="+", type=_dims, metavar="NAME=V1,V2",
                        help="build cases over these dimensions instead of the declared ones")
    parser.add_argument("--batch", type=_int_list, help="attention: batch sizes")
    parser.add_argument("--heads", type=_int_list, help="attention: head counts")
    parser.add_argument("--head-dim", type=_int_list,
                        help="attention: head dimensions")
    parser.add_argument("--seq-lengths", type=_int_list,
                        help="attention: sequence lengths, e.g. 128,256,512")
    parser.add_argument("--any-size", action="store_true",
                        help="without a GPU, run --dims / attention sizes larger than the "
                             "operation's CPU cases anyway")
    parser.add_argument("--regime", choices=("cold", "hot"), default="cold",
                        help="cold: the L2 flushed before each call; hot: operands resident "
                        "(default cold)")
    parser.add_argument("--budget", type=validation.positive_float,
                        help="wall-time budget per timing (s)")
    parser.add_argument("--mixed-clocks", action="store_true",
                        help="compare results timed by different methods (labelled as such)")


def add_commands(sub) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register this module's subcommands on `sub`; returns name -> handler."""
    timer = sub.add_parser("time", help="device time, TFLOP/s, GB/s, roofline, speedup")
    _selection_arguments(timer)
    timer.add_argument("--direction", nargs="+", choices=("fwd", "bwd"), default=["fwd"],
                       help="forward, backward or both (default fwd)")
    timer.add_argument("--versus", action="extend", nargs="+", metavar="NAME",
                       help="after the table, each case's time of NAME over every "
                            "implementation's: an implementation timed here, 'copy' (the "
                            "case's bytes at the measured copy ceiling) or 'fastest'")
    roof = sub.add_parser("roofline", help="time and place on the roofline; JSON + PNG in traces/")
    _selection_arguments(roof)
    roof.add_argument("--direction", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"],
                      help="forward, backward or both (default fwd bwd)")
    roof.add_argument("--out", default="traces", type=validation.output_directory,
                      help="directory for the JSON and charts (default traces)")
    plot = sub.add_parser("plot-roofline", help="redraw roofline charts from a data JSON")
    plot.add_argument("json", type=roofline_data_file,
                      help="a roofline data file written by `roofline`")
    plot.add_argument("--out", type=validation.output_directory,
                      help="directory for the charts (default: beside the JSON)")
    ceil = sub.add_parser("ceilings", help="datasheet vs measured ceilings of this device")
    ceil.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    verify = sub.add_parser("verify-timing", help="timer vs profiler trace; CV over repeats")
    verify.add_argument("--repeats", type=validation.int_at_least(2), default=10,
                        help="timings per kernel, whose spread is reported, at least 2 "
                        "(default 10)")
    verify.add_argument("--calls", type=validation.positive_int, default=20,
                        help="calls traced / profiled (default 20)")
    verify.add_argument("--ncu", action="store_true", help="also compare with ncu's durations")
    verify.add_argument("--impl", action="extend", nargs="+",
                        help="only these implementations (default: one per family)")
    verify.add_argument("--case", action="extend", nargs="+",
                        help="only cases whose id contains one of these")
    return {"time": cmd_time, "roofline": cmd_roofline, "plot-roofline": cmd_plot_roofline,
            "ceilings": cmd_ceilings, "verify-timing": cmd_verify_timing}
