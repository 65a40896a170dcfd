"""Time the CUDA kernels beside their torch/cuBLAS peers on this GPU, against the goals.

`python -m kernels.profile.cuda_bench [--ops softmax row_sum matmul]`. Every number
is a median from `kernels.core.timing` (CUPTI kernel time, the clock every framework
is timed by; L2 flushed before each call; samples until the noise settles),
work from the operation's own model (`Operation.work`), cases from its "gpu"
set. Goals (issue 7), all relative to peers measured in the same run: softmax
and row_sum at >= 0.9x the copy bandwidth (bytes read + written by an
elementwise kernel over 1 GiB; a cudaMemcpy is no kernel to CUPTI); the
tensor-core GEMMs at >= 0.7x cuBLAS (torch.matmul) in its dtype; the SGEMM at
>= 0.6x cuBLAS float32 with TF32 off. `python -m kernels time OP` times the
same kernels with roofline columns; this command adds the goals and the ratio
to the copy. It times only torch-callable code (JAX runs on its own stream).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence

from kernels.core import environment

COPY_BYTES = 1 << 30


def goal(op_name: str, dtype: str) -> float:
    """Issue 7's goal: bandwidth-bound kernels at 0.9x the copy; GEMMs at 0.7x cuBLAS on tensor
    cores (bf16/f16), 0.6x in float32 (the SGEMM)."""
    if op_name == "matmul":
        return 0.6 if dtype == "f32" else 0.7
    return 0.9


@dataclasses.dataclass(frozen=True)
class Row:
    impl: str
    case: str
    ms: float
    rate: str
    versus: str
    goal: str


def _bench(fn: Callable[[], object], label: str = "") -> float:
    """Median device time of `fn` in milliseconds (cold L2), through the one timing path."""
    from kernels.core import timing

    return timing.time_timeable(timing.callable_timeable(label, fn, "torch")).median_s * 1e3


def copy_bandwidth() -> float:
    """A copy done by a kernel (torch's elementwise negation), bytes read + written per second."""
    import torch

    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / (_bench(functools.partial(torch.neg, src, out=dst), "copy") * 1e-3)


def _inputs(op_name: str, case):
    """Normal inputs made on the device (the harness's numpy path is slow at these sizes)."""
    import torch

    from kernels.ops.matmul import spec as matmul_spec

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[case.dtype]
    if op_name == matmul_spec.NAME:
        m, n, k = case["m"], case["n"], case["k"]
        return (torch.randn(m, k, device="cuda") / k ** 0.5).to(dtype), \
            torch.randn(k, n, device="cuda").to(dtype)
    x = torch.randn(case["rows"], case["cols"], device="cuda")
    if case.variant == "masked":  # as the operation makes them: ~30% -inf
        x.masked_fill_(torch.rand_like(x) < 0.3, float("-inf"))
    return (x.to(dtype),)


def bench_op(op_name: str, copy_rate: float) -> list[Row]:
    import torch

    from kernels.core import registry

    op = registry.operation(op_name)
    ours = [impl for impl in registry.implementations(op_name)
            if impl.name == "cuda" or impl.name.startswith("cuda_")]
    peer_fn = registry.implementation(op_name, "torch").fn  # the registered torch baseline
    rows = []
    for case in op.cases_tagged("gpu"):
        args = _inputs(op_name, case)
        peer_ms = _bench(functools.partial(peer_fn, *args), f"peer {case.id}")
        work = op.work(case, "fwd")
        peer = "cuBLAS" if op_name == "matmul" else "torch"
        # Kernels that declare CONFIGS (tile shapes to choose between) are timed in each.
        variants = [(impl, config) for impl in ours if not impl.supports(case)
                    for config in getattr(sys.modules[impl.fn.__module__], "CONFIGS", (None,))]
        for impl, config in variants:
            fn = functools.partial(impl.fn, *args, **({"config": config} if config else {}))
            label = f"{impl.id}[{config.label}]" if config else impl.id
            ms = _bench(fn, f"{label} {case.id}")
            if op_name == "matmul":
                ratio = peer_ms / ms
                rate = f"{work.flops / ms / 1e9:.0f} TFLOP/s"
                versus = f"{ratio:.2f}x {peer} ({work.flops / peer_ms / 1e9:.0f} TFLOP/s)"
            else:
                ratio = work.bytes / (ms * 1e-3) / copy_rate
                rate = f"{work.bytes / ms / 1e9:.2f} TB/s"
                versus = (f"{ratio:.2f}x copy; {peer} {work.bytes / peer_ms / 1e9:.2f} TB/s "
                          f"({peer_ms / ms:.2f}x)")
            target = goal(op_name, case.dtype)
            rows.append(Row(label, case.id, ms, rate, versus,
                            f"{'met' if ratio >= target else 'MISSED'} (>= {target}x)"))
        del args
        torch.cuda.empty_cache()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    environment.configure()
    parser = argparse.ArgumentParser(prog="python -m kernels.profile.cuda_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=["softmax", "row_sum", "matmul"])
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU; torch sees none")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS float32 peer: full FP32 FFMA
    torch.backends.cudnn.allow_tf32 = False
    copy_rate = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; device copy "
          f"{copy_rate / 1e12:.2f} TB/s (read + write, {COPY_BYTES >> 20} MiB)", flush=True)
    table = [("implementation", "case", "ms", "rate", "versus peer", "goal")]
    for op_name in args.ops:
        rows = bench_op(op_name, copy_rate)
        print(f"  timed {op_name}: {len(rows)} kernels x cases", flush=True)
        table += [(r.impl, r.case, f"{r.ms:.3f}", r.rate, r.versus, r.goal) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
