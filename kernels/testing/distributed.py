"""Beyond one host: the sharded ops over every process's devices, through jax.distributed.

Every process runs the same program (SPMD). `jax.distributed.initialize`
connects them through a coordinator; after it, `jax.devices()` lists the
devices of all processes and the meshes of `kernels.sharding.meshes` span them. On a
cluster manager JAX knows (SLURM, Open MPI, Kubernetes/GKE) initialize() needs
no arguments; elsewhere give the coordinator address, the process count and
this process's id, here on the command line:

    python -m kernels.testing.distributed --coordinator HOST0:1234 --num-processes 2 \
        --process-id {0,1} [--local-device-ids 0,1] [--mesh 2x4 --mesh 1x8]

On one host with one process per GPU (or per group of GPUs), `--local-device-ids` names the
GPUs this process drives (JAX then restricts its client to them, while CUDA and NCCL still see
every GPU, so peers reach each other over NVLink); without it every process would claim every
GPU. The meshes default to those of all processes' devices together
(kernels.sharding.meshes.standard_shapes: 1xN, Nx1 and 2xN/2), so the same command serves any
device count. Keep NCCL_NVLS_ENABLE=0 in the environment (no NVLink multicast).

`check_sharded_matmul` is the cross-process check: every process makes the
same inputs from a seed, assembles the global arrays from its own shards
(`jax.make_array_from_callback`), runs the sharded matmul implementations
forward and backward, and compares each shard it holds with the unsharded
reference, through the one comparison in kernels.core.checking. Implementations that cannot
run the case here (the Mosaic kernel: bf16 only, a GPU) print why and are skipped.
"""

from __future__ import annotations

import argparse
import sys

from kernels.core import environment, validation


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None,
               local_device_ids: list[int] | None = None) -> None:
    """jax.distributed.initialize; arguments left None are detected by JAX where it can.
    `local_device_ids`: the GPUs of this host this process drives (one process per GPU)."""
    import jax

    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids)


def device_ids(text: str) -> list[int]:
    """argparse type: comma-separated device ids, such as 0 or 2,3."""
    import argparse

    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        ids = []
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"expected distinct device ids >= 0 separated by "
                                         f"commas, such as 0 or 2,3, got {text!r}")
    return ids


def _global(x, sharding):
    """A global array laid out by `sharding` from the full numpy array every process holds."""
    import jax

    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _compare_shards(name: str, actual, expected, magnitude, tolerance: float) -> int:
    """Compare every shard this process holds; returns how many were compared."""
    import numpy as np

    from kernels.core import checking

    for shard in actual.addressable_shards:
        checking.compare(np.asarray(shard.data), expected[shard.index], tolerance=tolerance,
                         magnitude=None if magnitude is None else magnitude[shard.index],
                         name=f"{name} shard {shard.index} on {shard.device}")
    return len(actual.addressable_shards)


def check_sharded_matmul(mesh: str = "2x4", m: int | None = None, n: int | None = None,
                         k: int = 48, seed: int = 0) -> list[str]:
    """Forward and gradients of every sharded_matmul implementation on a mesh over all
    processes' devices, each process checking its own shards; returns one line per check.
    m and n default to 16 and 8 rows and columns per device, which divide any mesh."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    from kernels.core import checking, devices, registry
    from kernels.ops.sharded_matmul import spec
    from kernels.sharding import meshes

    m = m or 16 * meshes.mesh_size(mesh)
    n = n or 8 * meshes.mesh_size(mesh)
    op = registry.operation(spec.NAME)
    # Small: tagged "cpu", which runs everywhere (interpreted where there is no GPU).
    case = registry.make_case(spec.NAME, "f32", {"m": m, "n": n, "k": k}, params={"mesh": mesh},
                              tags=("cpu",))
    a, b = checking.make_inputs(op, case, seed, "normal")
    cotangent = np.random.default_rng(seed + 1).standard_normal((m, n)).astype(np.float32)
    # The reference runs on this process's own default device, unsharded.
    ref_c, (ref_da, ref_db), (mag_da, mag_db) = checking.reference_outputs(
        op, case, (a, b), cotangent)
    layout = meshes.make_mesh(mesh)
    a_global = _global(a, NamedSharding(layout, spec.A_SPEC))
    b_global = _global(b, NamedSharding(layout, spec.B_SPEC))
    dc_global = _global(cotangent, NamedSharding(layout, spec.C_SPEC))
    lines = []
    where = f"process {jax.process_index()}/{jax.process_count()}"
    for impl in registry.implementations(spec.NAME):
        reason = devices.case_unavailable_reason(impl, case)
        if reason:
            lines.append(f"{where}: {impl.id} mesh {mesh}: skipped: {reason}")
            continue
        c, pullback = jax.vjp(lambda x, y, f=impl.fn: f(x, y, mesh), a_global, b_global)
        da, db = pullback(dc_global)
        tol = checking.tolerance_for(impl, case)  # at its declared precision (TF32 on GPUs)
        shards = _compare_shards(f"{impl.id} output", c, ref_c, None, tol)
        _compare_shards(f"{impl.id} da", da, ref_da, mag_da, tol * op.gradient_tolerance_factor)
        _compare_shards(f"{impl.id} db", db, ref_db, mag_db, tol * op.gradient_tolerance_factor)
        lines.append(f"{where}: {impl.id} mesh {mesh} over {jax.device_count()} devices: "
                     f"{shards} local shards of C, dA, dB match the reference")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = validation.ArgumentParser(prog="python -m kernels.testing.distributed",
                                       description=__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coordinator", help="HOST:PORT of process 0 (default: detected)")
    parser.add_argument("--num-processes", type=validation.positive_int)
    parser.add_argument("--process-id", type=validation.nonnegative_int)
    parser.add_argument("--local-device-ids", type=device_ids,
                        help="GPUs of this host this process drives, e.g. 0 or 2,3 "
                             "(default: all it sees)")
    parser.add_argument("--mesh", action="append",
                        help="DATAxMODEL over all processes' devices; repeatable (default: "
                             "1xN, Nx1 and 2xN/2 for the N devices of all processes)")
    args = parser.parse_args(argv)
    environment.configure()
    initialize(args.coordinator, args.num_processes, args.process_id, args.local_device_ids)
    import jax

    from kernels.sharding import meshes

    for mesh in args.mesh or meshes.standard_shapes(jax.device_count()):
        for line in check_sharded_matmul(mesh):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
