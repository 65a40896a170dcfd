"""How much of the sharded matmul's communication is hidden: compute-only against every
collective variant, by the device clock, with scaling against one device and achieved
interconnect bandwidth.

    python -m kernels.ops.sharded_matmul.overlap [--m 16384 --n 8192 --k 8192] [--mesh 1x2 ...]

Per mesh, the variants (the same product and layouts, spec.py's):
  compute-only            the per-device products with A already gathered: no communication,
                          the time a perfectly hidden all-gather leaves
  collective              the ring collective matmul (one-way ring, the registered default)
  collective-bidir        the ring with half of each block going each way
  collective-lhs          the one-way ring compiled with XLA's latency-hiding scheduler
  xla                     jnp.matmul partitioned by XLA's SPMD partitioner
  xla-windowed            the same with XLA's best flags for overlap (xla.WINDOWED_OPTIONS:
                          its own collective matmul, "windowed einsum", multi-streamed, under
                          the latency-hiding scheduler)
  all-gather-then-matmul  the all-gather, then the product: nothing overlapped
  mosaic                  JAX's Mosaic GPU all_gather_lhs_matmul (mosaic.py; bf16/f16 on 1xN
                          meshes over every GPU, else skipped with the reason)
and `1 device`, the whole product on one device.

Timing: kernels.core.timing's device clock ("device-span", the same for the one-device
product): from a profiler trace of many calls, each waited for, the span of each call on
the device that took longest, first kernel start to last kernel end, copies and NCCL
kernels included. Back-to-back calls on the host clock flattered the ring (0.839 against
0.811 on the device clock on an H100 pair: call i+1's permute overlapped call i's product).
Without a GPU the labelled host clock.
`hidden` = compute-only time / variant time (1.0: communication fully hidden; goal >= 0.9).
`GB/s/dev` is the bytes each device receives in the all-gather of A over the variant's time
(a floor on the link rate achieved while overlapping); `% alone` is that over the all-gather
of the same bytes alone (kernels.sharding.collectives, its busbw), printed above the table
with the ring's step, a send/recv of one block. `overlap` reads the compiled HLO: per
asynchronous collective-permute, how many matrix products were scheduled between its start
and its done (comma-separated; "-" where there is none, as in the Mosaic kernel's one call).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from kernels.core import environment, validation

# XLA's GPU scheduler that moves asynchronous collectives' starts early and
# their dones late, around independent work: for the whole process, or per jit.
LATENCY_HIDING_OPTION = "xla_gpu_enable_latency_hiding_scheduler"
LATENCY_HIDING = f"--{LATENCY_HIDING_OPTION}=true"


# A variant whose product is further than this from the one-device product (relative
# Frobenius norm) is wrong, not rounded differently: bf16 rounding of the output is 0.4%.
WRONG = 0.02

# (m, n, k) by default: a real size on GPUs; on CPU host devices one that runs in seconds.
GPU_SIZE = (16384, 8192, 8192)
CPU_SIZE = (256, 128, 128)


def device_time(label: str, fn, *args) -> tuple[float, str]:
    """Median seconds per call by kernels.core.timing's device clock (hot: the operands stay
    resident, as in a layer), and how it was taken."""
    from kernels.core import timing

    measurement = timing.time_timeable(timing.callable_timeable(label, fn, "jax", args),
                                       regime="hot", clock="device-span")
    return (measurement.median_s,
            f"{measurement.method}, n={measurement.repeats}, CV {100 * measurement.cv:.1f}%, "
            f"{measurement.stop_reason}")


def products_between_permutes(hlo: str) -> list[int]:
    """For each collective-permute-start in scheduled HLO, the matmuls before its done."""
    lines = hlo.splitlines()
    counts = []
    for i, line in enumerate(lines):
        match = re.search(r"(%\S+) = .*collective-permute-start\(", line)
        if not match:
            continue
        name = match.group(1)
        products = 0
        for later in lines[i + 1:]:
            if "collective-permute-done(" in later and name in later:
                break
            if re.search(r"gemm|\bdot\(|convolution\(", later):
                products += 1
        counts.append(products)
    return counts


def alone(model: int, gathered_bytes: int, block_bytes: int) -> dict[str, object]:
    """The all-gather of A's bytes per device, and one ring step (a send/recv of one block),
    measured alone over `model` devices (kernels.sharding.collectives)."""
    from kernels.sharding import collectives

    return {"all-gather": collectives.measure("all-gather", model, gathered_bytes),
            "send-recv": collectives.measure("send-recv", model, block_bytes)}


def variants(mesh_shape: str, dtype: str, m: int, n: int, k: int):
    """(name, jitted fn, which A it takes, or the reason it cannot run) per variant."""
    import jax

    from kernels.ops.sharded_matmul import collective, mosaic, xla

    config = mosaic.default_config()
    mosaic_reason = (None if jax.default_backend() == "gpu"
                     else "needs a CUDA GPU (Hopper): a Mosaic GPU kernel")
    mosaic_reason = mosaic_reason or mosaic.unsupported_reason(m, n, k, dtype, mesh_shape,
                                                               config)
    return [
        ("compute-only", collective.compute_only(mesh_shape), "gathered"),
        ("collective", collective.collective(mesh_shape, collective.Config()), "sharded"),
        ("collective-bidir",
         collective.collective(mesh_shape, collective.Config(bidirectional=True)), "sharded"),
        # Compiler options apply to a top-level jit only (not inside vjp or another jit), so
        # this variant exists here rather than as a Config.
        ("collective-lhs", jax.jit(collective.ring(mesh_shape),
                                   compiler_options={LATENCY_HIDING_OPTION: True}), "sharded"),
        ("xla", xla.partitioned(mesh_shape), "sharded"),
        ("xla-windowed", xla.partitioned(mesh_shape, windowed=True), "sharded"),
        ("all-gather-then-matmul", collective.gather_then_multiply(mesh_shape), "sharded"),
        ("mosaic", mosaic_reason or mosaic.build(mesh_shape, config,
                                                 jax.numpy.dtype(_np_dtype(dtype)).name),
         "line"),
    ]


def _np_dtype(dtype: str):
    from kernels.core import dtypes

    return dtypes.to_numpy(dtype)


def run(m: int, n: int, k: int, shapes: list[str], dtype: str) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from kernels.ops.sharded_matmul import mosaic, spec
    from kernels.sharding import meshes

    np_dtype = _np_dtype(dtype)
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((m, k), dtype=np.float32) / np.sqrt(k)).astype(np_dtype)
    b = rng.standard_normal((k, n), dtype=np.float32).astype(np_dtype)
    flops = 2.0 * m * n * k
    itemsize = np_dtype.itemsize

    one = jax.devices()[0]
    print(f"timing 1 device ({m}x{k} @ {k}x{n}) ...", flush=True)
    product = jax.jit(jnp.matmul)
    t_one, how = device_time("1 device", product, jax.device_put(a, one), jax.device_put(b, one))
    # Every variant's product is checked against this one before it is timed: a fast wrong
    # program must not enter the table (XLA's windowed einsum read wrong on a 1x4 mesh).
    reference_c = product(jax.device_put(a, one), jax.device_put(b, one))
    error_of = jax.jit(lambda c, ref: jnp.linalg.norm((c - ref).astype(jnp.float32))
                       / jnp.linalg.norm(ref.astype(jnp.float32)))
    rows = [dict(mesh="1 device", variant="jnp.matmul", seconds=t_one, flops=flops,
                 speedup=1.0, hidden=None, gbps=None, share=None, overlap="", timing=how)]
    for mesh_shape in shapes:
        reason = meshes.unavailable_reason(mesh_shape)
        if reason:
            print(f"skipping mesh {mesh_shape}: {reason}", file=sys.stderr)
            continue
        data, model = meshes.parse_mesh_shape(mesh_shape)
        mesh = meshes.make_mesh(mesh_shape)
        # Bytes each device receives in the all-gather of its data row's A, and one block.
        gathered = (m // data) * k * itemsize
        received = (model - 1) * (m // data // model) * k * itemsize
        reference = alone(model, gathered, gathered // model) if model > 1 else {}
        for name, result in reference.items():
            print(f"{mesh_shape} {name} alone over {model} devices: "
                  f"{result.busbw / 1e9:.1f} GB/s busbw ({result.size_bytes / 2**20:.1f} MiB "
                  f"per rank, {result.seconds * 1e6:.0f} us, {result.method})", flush=True)
        inputs = {"sharded": meshes.place(a, mesh, spec.A_SPEC),
                  "gathered": meshes.place(a, mesh, PartitionSpec(meshes.DATA, None))}
        b_sharded = meshes.place(b, mesh, spec.B_SPEC)
        expected = NamedSharding(mesh, spec.C_SPEC)
        reference_here = jax.device_put(reference_c, expected)
        t_compute = None
        for name, fn, which in variants(mesh_shape, dtype, m, n, k):
            if isinstance(fn, str):
                print(f"{mesh_shape} {name}: skipped: {fn}", file=sys.stderr, flush=True)
                continue
            if which == "line":
                a_in, b_in = mosaic.place_on_line(mesh_shape, a, b)
            else:
                a_in, b_in = inputs[which], b_sharded
            print(f"timing {mesh_shape} {name} ...", flush=True)
            try:
                out = fn(a_in, b_in)
            except Exception as error:  # e.g. a compile option this XLA does not know
                print(f"{mesh_shape} {name}: failed: {str(error)[:300]}", file=sys.stderr)
                continue
            if not out.sharding.is_equivalent_to(expected, 2):
                raise AssertionError(f"{name} on {mesh_shape}: output sharding {out.sharding}, "
                                     f"expected {expected}")
            error = float(error_of(out, reference_here))
            if not error <= WRONG:
                print(f"{mesh_shape} {name}: WRONG, not timed: relative error {error:.3g} "
                      f"against the one-device product (limit {WRONG})", file=sys.stderr,
                      flush=True)
                continue
            try:
                seconds, how = device_time(f"{mesh_shape} {name}", fn, a_in, b_in)
            except RuntimeError as error:  # a device trace that cannot be cut into calls
                print(f"{mesh_shape} {name}: not timed: {error}", file=sys.stderr, flush=True)
                continue
            t_compute = seconds if name == "compute-only" else t_compute
            counts = products_between_permutes(fn.lower(a_in, b_in).compile().as_text())
            gbps = received / seconds if name != "compute-only" and model > 1 else None
            ag = reference.get("all-gather")
            rows.append(dict(
                mesh=mesh_shape, variant=name, seconds=seconds, flops=flops,
                speedup=t_one / seconds, hidden=t_compute / seconds if t_compute else None,
                gbps=gbps / 1e9 if gbps else None,
                share=gbps / ag.busbw if gbps and ag else None,
                overlap=",".join(map(str, counts)), timing=how))
    return rows


def check_sizes(m: int, n: int, k: int, shapes: list[str]) -> None:
    """UserError (one line) unless every mesh is well formed and divides the product."""
    import jax

    from kernels.ops.sharded_matmul import spec

    for shape in shapes:
        try:
            spec.validate(jax.ShapeDtypeStruct((m, k), "float32"),
                          jax.ShapeDtypeStruct((k, n), "float32"), shape)
        except ValueError as error:
            raise validation.UserError(f"--mesh {shape}, --m/--n/--k: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = validation.ArgumentParser(prog="python -m kernels.ops.sharded_matmul.overlap",
                                       description=__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, gpu, cpu in zip(("m", "n", "k"), GPU_SIZE, CPU_SIZE, strict=True):
        parser.add_argument(f"--{name}", type=validation.positive_int,
                            help=f"default {gpu} ({cpu} on CPU)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--mesh", action="append",
                        help="DATAxMODEL, repeatable (default: 1xN, and 2x(N/2) for even "
                             "N >= 4, for N = 2, 4, 8 up to the device count)")
    parser.add_argument("--latency-hiding", action="store_true",
                        help=f"add {LATENCY_HIDING} to XLA_FLAGS (before JAX starts)")
    args = parser.parse_args(argv)
    environment.configure()
    if args.latency_hiding:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {LATENCY_HIDING}".strip()
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu" and not (args.m or args.n or args.k):
        print(f"no GPU: a CPU-sized product {'x'.join(map(str, CPU_SIZE))} on forced host "
              f"devices (checks the variants run, times mean little); --m --n --k for others")
    default = CPU_SIZE if device.platform == "cpu" else GPU_SIZE
    args.m, args.n, args.k = (given or size for given, size in
                              zip((args.m, args.n, args.k), default, strict=True))
    count = jax.device_count()
    shapes = args.mesh or [shape for n in (2, 4, 8) if n <= count
                           for shape in [f"1x{n}"] + ([f"2x{n // 2}"] if n >= 4 else [])]
    try:
        check_sizes(args.m, args.n, args.k, shapes)
    except validation.UserError as error:
        parser.error(str(error))
    print(f"{count} x {device.device_kind} ({device.platform}), jax {jax.__version__}; "
          f"{args.dtype} ({args.m}, {args.k}) @ ({args.k}, {args.n}); timer: kernels.core.timing "
          f"device clock (device-span; host-clock without a GPU), hot; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    rows = run(args.m, args.n, args.k, shapes, args.dtype)
    print(f"{'mesh':>9} {'variant':>22} {'ms':>8} {'TFLOP/s':>8} {'vs 1 dev':>8} "
          f"{'hidden':>7} {'GB/s/dev':>9} {'% alone':>7} {'overlap':>8}  timing")
    for row in rows:
        hidden = f"{row['hidden']:.3f}" if row["hidden"] is not None else "-"
        gbps = f"{row['gbps']:.1f}" if row["gbps"] is not None else "-"
        share = f"{100 * row['share']:.0f}%" if row["share"] is not None else "-"
        print(f"{row['mesh']:>9} {row['variant']:>22} {row['seconds'] * 1e3:8.3f} "
              f"{row['flops'] / row['seconds'] / 1e12:8.1f} {row['speedup']:8.2f}x "
              f"{hidden:>7} {gbps:>9} {share:>7} {row['overlap'] or '-':>8}  {row['timing']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
