"""How much of the collective matmul's communication is hidden: compute-only vs collective vs
XLA-partitioned, with scaling against one device and achieved interconnect bandwidth.

    python -m kernels.ops.sharded_matmul.overlap [--m 16384 --n 8192 --k 8192] [--mesh 1x2 ...]

For each mesh: `compute-only` is the same per-device products with A already
gathered (no communication, the time a perfectly hidden all-gather leaves);
`collective`, `collective-bidir` and `collective-lhs` are the ring collective
matmul (one-way ring, the registered default; the bidirectional ring; the
one-way ring compiled with XLA's latency-hiding scheduler); `xla` is
jnp.matmul partitioned by XLA from the same layouts. `1 device` is the whole
product on one device.

Timing is kernels.core.timing's host clock around 10 back-to-back calls ending in
block_until_ready (its median and stopping rule): these products take
milliseconds per call, so dispatch overhead is a few percent at most
(device/NOTES.md), and wall time is what counts when transfers and products
overlap on different streams.
`hidden` = compute-only time / variant time (1.0: communication fully hidden;
goal >= 0.9). `GB/s/dev` is the bytes each device receives in the all-gather
of A divided by the variant's time (a floor on the link rate achieved while
overlapping), beside the all-gather bandwidth measured alone
(`kernels.sharding.meshes`). `overlap` reads the compiled HLO: per asynchronous
collective-permute, how many matrix products were scheduled between its start
and its done (comma-separated; "-" where there is none).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from kernels.core import environment

# XLA's GPU scheduler that moves asynchronous collectives' starts early and
# their dones late, around independent work: for the whole process, or per jit.
LATENCY_HIDING_OPTION = "xla_gpu_enable_latency_hiding_scheduler"
LATENCY_HIDING = f"--{LATENCY_HIDING_OPTION}=true"


# (m, n, k) by default: a real size on GPUs; on CPU host devices one that runs in seconds.
GPU_SIZE = (16384, 8192, 8192)
CPU_SIZE = (256, 128, 128)
# All-gather message on CPU host devices: 256 MiB (the GPU's) takes seconds per call there.
CPU_GATHER_BYTES = 4 * 2**20

# Calls per timing sample: back-to-back dispatches amortise the host's launch overhead.
CALLS_PER_SAMPLE = 10


def host_time(label: str, fn, *args) -> tuple[float, str]:
    """Seconds per call by kernels.core.timing's host clock (median of samples of CALLS_PER_SAMPLE
    back-to-back calls ending in block_until_ready), and how sampling stopped.

    Not CUPTI: CUPTI sums kernel durations over every device and stream, which
    counts overlapped transfers and products twice; wall time is the quantity here.
    """
    import jax

    from kernels.core import timing

    def calls():
        for _ in range(CALLS_PER_SAMPLE):
            out = fn(*args)
        jax.block_until_ready(out)

    jax.block_until_ready(fn(*args))  # compile outside the timed region
    measurement = timing.time_timeable(timing.Timeable(label, "host", calls, (), False),
                                       regime="hot")
    return (measurement.median_s / CALLS_PER_SAMPLE,
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


def run(m: int, n: int, k: int, shapes: list[str], dtype: str) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from kernels.core import dtypes
    from kernels.ops.sharded_matmul import collective, spec, xla
    from kernels.sharding import meshes

    np_dtype = dtypes.to_numpy(dtype)
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((m, k), dtype=np.float32) / np.sqrt(k)).astype(np_dtype)
    b = rng.standard_normal((k, n), dtype=np.float32).astype(np_dtype)
    flops = 2.0 * m * n * k
    itemsize = np_dtype.itemsize

    one = jax.devices()[0]
    print("  1 device: jnp.matmul", file=sys.stderr, flush=True)
    single = jax.jit(jnp.matmul)
    t_one, how = host_time("1 device", single, jax.device_put(a, one), jax.device_put(b, one))
    rows = [dict(mesh="1 device", variant="jnp.matmul", seconds=t_one, flops=flops,
                 speedup=1.0, hidden=None, gbps=None, overlap="", timing=how)]
    for mesh_shape in shapes:
        reason = meshes.unavailable_reason(mesh_shape)
        if reason:
            print(f"skipping mesh {mesh_shape}: {reason}", file=sys.stderr)
            continue
        data, model = meshes.parse_mesh_shape(mesh_shape)
        mesh = meshes.make_mesh(mesh_shape)
        a_sharded = meshes.place(a, mesh, spec.A_SPEC)
        a_gathered = meshes.place(a, mesh, PartitionSpec(meshes.DATA, None))
        b_sharded = meshes.place(b, mesh, spec.B_SPEC)
        # Bytes each device receives in the all-gather of its data row's A.
        received = (model - 1) * (m // data // model) * k * itemsize
        variants = [
            ("compute-only", collective.compute_only(mesh_shape), a_gathered),
            ("collective", collective.collective(mesh_shape, collective.Config()), a_sharded),
            ("collective-bidir",
             collective.collective(mesh_shape, collective.Config(bidirectional=True)), a_sharded),
            # Compiler options apply to a top-level jit only (not inside vjp or
            # another jit), so this variant exists here rather than as a Config.
            ("collective-lhs", jax.jit(collective.ring(mesh_shape),
                                       compiler_options={LATENCY_HIDING_OPTION: True}), a_sharded),
            ("xla", xla.partitioned(mesh_shape), a_sharded),
        ]
        t_compute = None
        for index, (name, fn, a_in) in enumerate(variants, start=1):
            # Each variant compiles, then samples for seconds: a line as each starts.
            print(f"  {mesh_shape}: {index}/{len(variants)} {name}", file=sys.stderr, flush=True)
            expected = NamedSharding(mesh, spec.C_SPEC)
            try:
                out = fn(a_in, b_sharded)
            except Exception as error:  # e.g. a compile option this XLA does not know
                print(f"{mesh_shape} {name}: failed: {str(error)[:300]}", file=sys.stderr)
                continue
            if not out.sharding.is_equivalent_to(expected, 2):
                raise AssertionError(f"{name} on {mesh_shape}: output sharding {out.sharding}, "
                                     f"expected {expected}")
            seconds, how = host_time(f"{mesh_shape} {name}", fn, a_in, b_sharded)
            t_compute = seconds if name == "compute-only" else t_compute
            counts = products_between_permutes(fn.lower(a_in, b_sharded).compile().as_text())
            rows.append(dict(
                mesh=mesh_shape, variant=name, seconds=seconds, flops=flops,
                speedup=t_one / seconds, hidden=t_compute / seconds,
                gbps=received / seconds / 1e9 if name != "compute-only" and model > 1 else None,
                overlap=",".join(map(str, counts)), timing=how))
    return rows


def _mistake(parser: argparse.ArgumentParser, message: str) -> int:
    """A user's mistake: one line (no usage block), exit status 2."""
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return 2


def _arguments_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the sizes and meshes asked for, or None. Checked before JAX is
    imported (kernels.sharding.meshes imports it, and XLA_FLAGS must be set first)."""
    for flag in ("m", "n", "k"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            return f"--{flag}: expected a size >= 1, got {value}"
    for shape in args.mesh or ():
        parts = shape.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            return f"--mesh: expected DATAxMODEL such as 4x2, got {shape!r}"
        data, model = int(parts[0]), int(parts[1])
        if args.m is not None and args.m % (data * model):
            return (f"--m: expected rows divisible by data*model = {data * model} (mesh {shape}), "
                    f"got {args.m}")
        if args.n is not None and args.n % model:
            return (f"--n: expected columns divisible by model = {model} (mesh {shape}), "
                    f"got {args.n}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.ops.sharded_matmul.overlap",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, help=f"default {GPU_SIZE[0]} ({CPU_SIZE[0]} on CPU)")
    parser.add_argument("--n", type=int, help=f"default {GPU_SIZE[1]} ({CPU_SIZE[1]} on CPU)")
    parser.add_argument("--k", type=int, help=f"default {GPU_SIZE[2]} ({CPU_SIZE[2]} on CPU)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    parser.add_argument("--mesh", action="append",
                        help="DATAxMODEL, repeatable (default: 1xN and 2x(N/2) for N = 2, 4, "
                             "... up to the device count)")
    parser.add_argument("--latency-hiding", action="store_true",
                        help=f"add {LATENCY_HIDING} to XLA_FLAGS (before JAX starts)")
    args = parser.parse_args(argv)
    problem = _arguments_problem(args)
    if problem:
        return _mistake(parser, problem)
    environment.configure()
    if args.latency_hiding:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {LATENCY_HIDING}".strip()
    print("overlap: starting JAX", file=sys.stderr, flush=True)
    import jax

    from kernels.sharding import meshes

    device = jax.devices()[0]
    if device.platform == "cpu" and not (args.m or args.n or args.k):
        print(f"no GPU: a CPU-sized product {'x'.join(map(str, CPU_SIZE))} on forced host "
              f"devices (checks the variants run, times mean little); --m --n --k for others",
              flush=True)
    default = CPU_SIZE if device.platform == "cpu" else GPU_SIZE
    args.m, args.n, args.k = (given or size for given, size in
                              zip((args.m, args.n, args.k), default, strict=True))
    count = jax.device_count()
    shapes = args.mesh or [shape for n in (2, 4, 8) if n <= count
                           for shape in ([f"1x{n}"] + ([f"2x{n // 2}"] if n >= 4 else []))]
    for shape in shapes:  # the defaults checked against the sizes taken from them
        data, model = meshes.parse_mesh_shape(shape)
        if args.m % (data * model) or args.n % model:
            return _mistake(parser, f"--m/--n: expected rows divisible by {data * model} and "
                                    f"columns by {model} (mesh {shape}), got {args.m}, {args.n}")
    print(f"{count} x {device.device_kind} ({device.platform}), jax {jax.__version__}; "
          f"{args.dtype} ({args.m}, {args.k}) @ ({args.k}, {args.n}); timer: kernels.core.timing "
          f"host clock over {CALLS_PER_SAMPLE} back-to-back calls per sample; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    for n in sorted({meshes.mesh_size(s) for s in shapes} - {1}):
        bw = meshes.interconnect_bandwidth(n, message_bytes=CPU_GATHER_BYTES) \
            if device.platform == "cpu" else meshes.interconnect_bandwidth(n)
        print(f"all-gather alone over {n} devices: {bw.bytes_per_second / 1e9:.1f} GB/s received "
              f"per device ({bw.message_bytes / 2**20:.0f} MiB gathered, {bw.timer})", flush=True)
    rows = run(args.m, args.n, args.k, shapes, args.dtype)
    print(f"{'mesh':>9} {'variant':>18} {'ms':>8} {'TFLOP/s':>8} {'vs 1 dev':>8} "
          f"{'hidden':>7} {'GB/s/dev':>9} {'overlap':>8}  timing")
    for row in rows:
        hidden = f"{row['hidden']:.3f}" if row["hidden"] is not None else "-"
        gbps = f"{row['gbps']:.1f}" if row["gbps"] is not None else "-"
        print(f"{row['mesh']:>9} {row['variant']:>18} {row['seconds'] * 1e3:8.3f} "
              f"{row['flops'] / row['seconds'] / 1e12:8.1f} {row['speedup']:8.2f}x "
              f"{hidden:>7} {gbps:>9} {row['overlap'] or '-':>8}  {row['timing']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
