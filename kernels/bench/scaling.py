"""Scaling of every sharded operation: each implementation on its mesh against itself on one
device, with the interconnect bandwidth its communication achieved.

    python -m kernels.bench.scaling [--ops moe ...] [--tags gpu] [--direction fwd bwd]

For each case runnable here (its mesh fits the devices), the implementation is
timed through kernels.core.timing's host clock (wall time per call, both runs
alike) on the case's mesh and on a 1x1 mesh, the same shapes on one device.
`scaling` = one-device time / mesh time (ideal: the device count);
`comm GB/s/dev` = the case's comm_bytes / time / devices, the rate each device
received data at; `link %` = that over the all-gather bandwidth measured alone
(kernels.sharding.meshes), the interconnect roof.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from kernels.core import environment

SHARDED_OPS = ("sharded_matmul", "moe", "sharded_vmap", "transformer_block")


def one_device(case):
    """The same case on a 1x1 mesh."""
    params = dict(case.params)
    params["mesh"] = "1x1"
    return dataclasses.replace(case, params=tuple(params.items()))


def wall_time(impl, case, direction: str) -> float:
    """Median seconds per call by kernels.core.timing's host clock, for the mesh and the one-device
    run alike (CUPTI would time the one-device run without its dispatch, and sum the
    overlapping streams of the sharded one)."""
    import jax

    from kernels.core import timing

    prepared = timing.prepare(impl, case, direction=direction)

    def call():
        jax.block_until_ready(prepared.fn(*prepared.args))

    return timing.time_timeable(timing.Timeable(prepared.label, "host", call, (), False),
                                regime="hot").median_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=list(SHARDED_OPS), choices=SHARDED_OPS)
    parser.add_argument("--tags", nargs="+", default=None,
                        help="case tags (default: gpu on a GPU, cpu elsewhere)")
    parser.add_argument("--direction", nargs="+", default=["fwd"], choices=["fwd", "bwd"])
    args = parser.parse_args(argv)
    environment.configure()
    from kernels.core import devices, registry
    from kernels.sharding import meshes

    machine = devices.this_machine()
    tags = args.tags or (["gpu"] if machine.has_gpu else ["cpu"])
    print(f"{machine.describe()}; timer: kernels.core.timing host clock (wall time per call, "
          f"dispatch included), hot")
    header = (f"{'implementation':<30} {'case':<58} {'dir':<4} {'ms':>9} {'1-dev ms':>9} "
              f"{'scaling':>8} {'comm GB/s/dev':>13} {'link %':>7}")
    print(header)
    single: dict[tuple[str, str, str], float] = {}
    for op_name in args.ops:
        op = registry.operation(op_name)
        for impl in registry.implementations(op_name):
            for case in registry.select_cases(op, tags):
                if devices.case_unavailable_reason(impl, case, machine):
                    continue
                n = impl.devices_for(case)
                for direction in args.direction:
                    seconds = wall_time(impl, case, direction)
                    alone = one_device(case)
                    key = (impl.id, alone.id, direction)
                    if key not in single:
                        single[key] = wall_time(impl, alone, direction)
                    work = op.work(case, direction)
                    comm = work.comm_bytes / seconds / n if n > 1 and work.comm_bytes else None
                    link = (comm / meshes.interconnect_ceiling(n) if comm else None)
                    print(f"{impl.id:<30} {case.id:<58} {direction:<4} {seconds * 1e3:9.3f} "
                          f"{single[key] * 1e3:9.3f} {single[key] / seconds:7.2f}x "
                          f"{comm / 1e9 if comm else 0:13.1f} "
                          f"{100 * link if link else 0:6.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
