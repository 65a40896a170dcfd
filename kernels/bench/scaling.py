"""Scaling of every sharded operation as users read it: strong scaling (the same problem on 1,
2 and 4 devices) and weak scaling (the same work per device), with efficiency.

    python -m kernels.bench.scaling [--ops moe ...] [--tags gpu] [--direction fwd bwd]
        [--modes strong weak] [--counts 1 2 4]

For each implementation and each case runnable here (its mesh fits the devices), the case's
mesh gives a family (all data parallel Nx1, all model parallel 1xN, or both 2xN/2) and its
meshes of n devices for every n in --counts this machine holds (n = 1: the 1x1 mesh):

  strong  the case's problem on every n: speedup = t(1) / t(n), efficiency = speedup / n
          (ideal 1);
  weak    the case's per-device share (the dimensions its operation declares in
          `weak_scaling` divided by the mesh axes they are split over) times n along the
          same axes: speedup = n t(1) / t(n) (throughput), efficiency = t(1) / t(n).

t(1) is the implementation itself on one device, or, where it cannot run on one (a kernel
that needs a 1xN mesh over several GPUs), the operation's baseline on one device, named in
the row. Every time is kernels.core.timing's device clock ("device-span": the one-device runs
too, so both sides of a ratio come from one clock; on CPU the labelled host clock), hot.
`comm GB/s/dev` = the case's comm_bytes / time / devices, the rate each device received data
at; `link %` = that over the all-gather bus bandwidth measured alone at 1 GiB
(kernels.sharding.collectives, the roofline's interconnect roof). `exchanges`: where an
operation declares its collectives (MoE's dispatch and combine all-to-alls), each one's bus
bandwidth inside the operation, from the NCCL kernels' durations in a device trace, beside
the same all-to-all alone (GPU only; "-" elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys

from kernels.core import environment, validation

SHARDED_OPS = ("sharded_matmul", "moe", "sharded_vmap", "transformer_block")
MODES = ("strong", "weak")
DEFAULT_COUNTS = (1, 2, 4)
# Calls traced for the exchanges' bandwidth.
EXCHANGE_CALLS = 5


def family(mesh: str) -> str:
    """Which axes the mesh spreads over: "data" (Nx1), "model" (1xN) or "both"."""
    from kernels.sharding import meshes

    data, model = meshes.parse_mesh_shape(mesh)
    return "both" if data > 1 and model > 1 else "data" if data > 1 else "model"


def scaled_mesh(mesh: str, devices: int) -> str | None:
    """The mesh of `devices` devices in `mesh`'s family: Nx1, 1xN, or for both axes the
    model axis up to its size in `mesh` and the data axis the rest (None if that does not
    divide). One device: 1x1."""
    from kernels.sharding import meshes

    data, model = meshes.parse_mesh_shape(mesh)
    if devices == 1:
        return "1x1"
    kind = family(mesh)
    if kind == "data":
        return f"{devices}x1"
    if kind == "model":
        return f"1x{devices}"
    width = min(model, devices)
    return f"{devices // width}x{width}" if devices % width == 0 else None


def with_mesh(case, mesh: str, dims: dict[str, int] | None = None):
    """`case` on another mesh (and with some dimensions changed)."""
    params = dict(case.params)
    params["mesh"] = mesh
    merged = dict(case.dims)
    merged.update(dims or {})
    return dataclasses.replace(case, params=tuple(params.items()), dims=tuple(merged.items()))


def weak_case(op, case, mesh: str):
    """The case with the work per device it has on its own mesh, on `mesh`: each dimension
    the operation declares for a mesh axis divided by that axis's size in the case's mesh and
    multiplied by its size in `mesh`; None if a share is not whole or the op declares none."""
    from kernels.sharding import meshes

    if not op.weak_scaling:
        return None
    sizes = dict(zip(meshes.MESH_AXES, meshes.parse_mesh_shape(case.kwargs["mesh"]),
                     strict=True))
    target = dict(zip(meshes.MESH_AXES, meshes.parse_mesh_shape(mesh), strict=True))
    dims = dict(case.dims)
    for axis, names in op.weak_scaling:
        for name in names:
            if dims[name] % sizes[axis]:
                return None
            dims[name] = dims[name] // sizes[axis] * target[axis]
    return with_mesh(case, mesh, dims)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Point:
    """One measured (implementation, case, direction)."""

    impl: str
    case: object
    direction: str
    seconds: float
    method: str
    spans: tuple = ()  # CallSpans of traced calls, where exchanges were asked for


def exchange_bandwidths(spans, exchanges) -> list[float] | None:
    """Per exchange, its bus bandwidth inside the operation: per call, each device's kernels
    named like the exchanges' are taken in time order, the i-th being exchange i; its time
    is the longest over devices (median over calls); busbw = S * factor / time. None unless
    every device ran exactly one such kernel per exchange in every call."""
    from kernels.sharding import collectives

    if not spans or not exchanges:
        return None
    fragments = tuple({f for exchange in exchanges for f in exchange.kernels})
    per_exchange: list[list[float]] = [[] for _ in exchanges]
    for span in spans:
        by_device: dict[str, list] = {}
        for event in span.named(*fragments):
            by_device.setdefault(event.device, []).append(event)
        if not by_device or any(len(found) != len(exchanges) for found in by_device.values()):
            return None
        for i in range(len(exchanges)):
            per_exchange[i].append(max((found[i].end_ns - found[i].start_ns) * 1e-9
                                       for found in by_device.values()))
    return [e.size_bytes * collectives.bus_factor(e.kind, e.ranks) / statistics.median(times)
            for e, times in zip(exchanges, per_exchange, strict=True)]


class Runner:
    """Measures points once each (the same point serves strong and weak rows)."""

    def __init__(self, machine):
        self.machine = machine
        self.points: dict[tuple[str, str, str], Point | str] = {}
        self.alone_busbw: dict[tuple[str, int, int], float | None] = {}

    def alone(self, exchange) -> float | None:
        """The exchange's collective alone at its size (kernels.sharding.collectives), busbw;
        None without a GPU (host devices' collectives are memory copies, not a link)."""
        from kernels.sharding import collectives

        key = (exchange.kind, exchange.ranks, exchange.size_bytes)
        if key not in self.alone_busbw:
            self.alone_busbw[key] = (collectives.measure(*key).busbw
                                     if self.machine.has_gpu else None)
        return self.alone_busbw[key]

    def point(self, impl, case, direction: str, trace: bool = False) -> Point | str:
        """The point, or why it cannot run here."""
        from kernels.core import devices, registry, timing

        key = (impl.id, case.id, direction)
        if key not in self.points:
            reason = devices.case_unavailable_reason(impl, case, self.machine)
            if reason is None and not registry.has_direction(impl, direction):
                reason = "no backward"
            if reason:
                self.points[key] = reason
                return reason
            prepared = timing.prepare(impl, case, direction=direction)
            try:
                measurement = timing.time_timeable(prepared, regime="hot", clock="device-span")
                spans = (tuple(timing.trace_calls(prepared, EXCHANGE_CALLS) or ()) if trace
                         else ())
            except RuntimeError as error:  # a device trace that cannot be cut into calls
                self.points[key] = f"not timed: {error}"
                return self.points[key]
            self.points[key] = Point(impl=impl.id, case=case, direction=direction,
                                     seconds=measurement.median_s, method=measurement.method,
                                     spans=spans)
        return self.points[key]


HEADER = (f"{'implementation':<30} {'mode':<6} {'n':>2} {'case':<58} {'dir':<4} {'ms':>9} "
          f"{'1-dev ms':>9} {'speedup':>8} {'effic.':>7} {'comm GB/s/dev':>13} {'link %':>7}  "
          f"exchanges (busbw GB/s: in op / alone)")


def run(ops, tags, directions, modes, counts, out=None) -> list[dict]:
    """Every row of the table, printed as measured."""
    from kernels.core import devices, registry

    out = out or sys.stdout
    machine = devices.this_machine()
    runner = Runner(machine)
    counts = [n for n in counts if n <= machine.device_count]
    rows = []
    seen = set()
    print(HEADER, file=out, flush=True)
    for op_name in ops:
        op = registry.operation(op_name)
        baseline = next((i for i in registry.implementations(op_name) if i.baseline), None)
        for impl in registry.implementations(op_name):
            for case in registry.select_cases(op, tags):
                # The family is asked of its largest mesh here, not of the declared one: an
                # 8-device case scales down to the 4 devices of this machine.
                largest = next((m for m in map(functools.partial(scaled_mesh,
                                                                 case.kwargs["mesh"]),
                                               reversed(counts)) if m), None)
                if largest is None or devices.case_unavailable_reason(
                        impl, with_mesh(case, largest), machine):
                    continue
                for direction in directions:
                    for mode in modes:
                        path = tuple(scaled_mesh(case.kwargs["mesh"], n) for n in counts)
                        start = (with_mesh(case, "1x1") if mode == "strong"
                                 else weak_case(op, case, "1x1"))
                        key = (impl.id, direction, mode, path, start)
                        if key in seen:
                            continue  # the same family of points from another case
                        seen.add(key)
                        rows += _family_rows(op, impl, baseline, case, direction, mode,
                                             counts, runner, out)
    return rows


def _family_rows(op, impl, baseline, case, direction, mode, counts, runner, out) -> list[dict]:
    from kernels.sharding import meshes

    def problem(mesh):
        return with_mesh(case, mesh) if mode == "strong" else weak_case(op, case, mesh)

    single_case = problem("1x1")
    if single_case is None:
        print(f"{impl.id:<30} {mode:<6} skipped: {op.name} declares no weak scaling for "
              f"{case.id}", file=out, flush=True)
        return []
    single = runner.point(impl, single_case, direction)
    single_by = impl.id
    if isinstance(single, str) and baseline is not None and baseline is not impl:
        single, single_by = runner.point(baseline, single_case, direction), baseline.id
    rows = []
    for n in counts:
        mesh = scaled_mesh(case.kwargs["mesh"], n)
        target = problem(mesh) if mesh else None
        if target is None:
            continue
        exchanges = op.exchanges(target, direction) if op.exchanges and n > 1 else ()
        point = runner.point(impl, target, direction, trace=bool(exchanges))
        if isinstance(point, str):
            print(f"{impl.id:<30} {mode:<6} {n:>2} {target.id:<58} {direction:<4} skipped: "
                  f"{point}", file=out, flush=True)
            continue
        t1 = single.seconds if isinstance(single, Point) else None
        speedup = (t1 / point.seconds) * (n if mode == "weak" else 1) if t1 else None
        work = op.work(target, direction)
        comm = work.comm_bytes / point.seconds / n if n > 1 and work.comm_bytes else None
        link = comm / meshes.interconnect_ceiling(n) if comm else None
        inside = exchange_bandwidths(point.spans, exchanges)
        described = "-"
        if exchanges:
            alone = [runner.alone(e) for e in exchanges]
            described = ", ".join(
                f"{e.label} {_gbps(inside[i] if inside else None)} / {_gbps(alone[i])}"
                for i, e in enumerate(exchanges))
        by = "" if single_by == impl.id or t1 is None else f" (1-dev by {single_by})"
        row = dict(impl=impl.id, mode=mode, devices=n, case=target.id, direction=direction,
                   seconds=point.seconds, single=t1, speedup=speedup,
                   efficiency=speedup / n if speedup else None, comm=comm, link=link,
                   exchanges=described, method=point.method)
        rows.append(row)
        print(f"{impl.id:<30} {mode:<6} {n:>2} {target.id:<58} {direction:<4} "
              f"{point.seconds * 1e3:9.3f} {_ms(t1):>9} {_x(speedup):>8} "
              f"{_fraction(row['efficiency']):>7} {comm / 1e9 if comm else 0:13.1f} "
              f"{100 * link if link else 0:6.1f}%  {described}{by}", file=out, flush=True)
    return rows


def _gbps(rate):
    return f"{rate / 1e9:.0f}" if rate else "-"


def _ms(seconds):
    return f"{seconds * 1e3:.3f}" if seconds else "-"


def _x(value):
    return f"{value:.2f}x" if value else "-"


def _fraction(value):
    return f"{value:.2f}" if value else "-"


def main(argv: list[str] | None = None) -> int:
    parser = validation.ArgumentParser(prog="python -m kernels.bench.scaling",
                                       description=__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=list(SHARDED_OPS), choices=SHARDED_OPS)
    parser.add_argument("--tags", nargs="+", default=None,
                        help="case tags (default: gpu on a GPU, cpu elsewhere)")
    parser.add_argument("--direction", nargs="+", default=["fwd"], choices=["fwd", "bwd"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--counts", nargs="+", type=validation.positive_int,
                        default=list(DEFAULT_COUNTS),
                        help="device counts (default 1 2 4; those above the machine's skip)")
    args = parser.parse_args(argv)
    environment.configure()
    from kernels.core import devices, registry

    machine = devices.this_machine()
    tags = args.tags or (["gpu"] if machine.has_gpu else ["cpu"])
    try:
        registry.check_tags(tags, [registry.operation(name) for name in args.ops])
    except validation.UserError as error:
        parser.error(f"--tags: {error}")
    print(f"{machine.describe()}; timer: kernels.core.timing device clock (device-span; the "
          f"labelled host clock without a GPU), hot; device counts "
          f"{[n for n in args.counts if n <= machine.device_count]}", flush=True)
    run(args.ops, tags, args.direction, args.modes, sorted(set(args.counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
