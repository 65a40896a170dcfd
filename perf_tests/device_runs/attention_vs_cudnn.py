"""Issue 18's table: our attention kernels against cuDNN, one process, one clock (GPU).

    python3 -m perf_tests.device_runs.attention_vs_cudnn [--budget S] [--case NAME ...]

bf16, batch 4, seq 4096: head_dim 128 with 16 heads and head_dim 64 with 8, causal and not,
forward and backward. Every point is `kernels.timing.measure` (CUPTI, cold L2, median), cuDNN
through jax and through torch's SDPA timed in the same process; the ratio is the fastest
baseline's time over ours. One JSON line per point goes to $OUT/attention_vs_cudnn.jsonl as it
is taken (nothing lost if the call is cut off); the table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from kernels import environment

OURS = ("pallas_mosaic", "triton", "pallas_triton")
BASELINES = ("cudnn", "torch_cudnn")
CASES = {  # name: (head_dim, heads, causal)
    "hd128": (128, 16, False),
    "hd128-causal": (128, 16, True),
    "hd64": (64, 8, False),
    "hd64-causal": (64, 8, True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=0.6, help="seconds of samples per point")
    parser.add_argument("--case", nargs="+", choices=tuple(CASES), default=tuple(CASES))
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget: expected seconds > 0, got {args.budget}")
    environment.configure()
    from kernels import checking, cli, compat, registry, timing
    from kernels.ops.attention import spec

    if not compat.on_gpu():
        parser.error("expected a machine with a GPU (the cases are bf16 4 x 4096 attention), "
                     "got none visible to JAX")
    registry.load()
    op = registry.operation(spec.NAME)
    rule = timing.StoppingRule(min_samples=10, time_budget_s=args.budget)
    out = pathlib.Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "attention_vs_cudnn.jsonl", "a") as log:
        for name in args.case:
            head_dim, heads, causal = CASES[name]
            case = spec.make_case("bf16", 4, 4096, heads, head_dim, causal, "gpu")
            inputs = checking.make_inputs(op, case, 0, "normal")
            for direction in ("fwd", "bwd"):
                times = {}
                for impl in BASELINES + OURS:
                    m = timing.measure(registry.implementation(spec.NAME, impl), case, direction,
                                       rule=rule, inputs=inputs)
                    times[impl] = m.median_s
                    point = {"case": name, "direction": direction, "impl": impl,
                             "median_us": round(m.median_s * 1e6, 2), "cv": round(m.cv, 4),
                             "method": m.method, "throttled": m.throttled_count,
                             "device": m.fingerprint.get("name")}
                    log.write(json.dumps(point) + "\n")
                    log.flush()
                best = min(times[b] for b in BASELINES)
                flops = op.work(case, direction).flops
                rows.append([name, direction, f"{best * 1e6:.0f} us ({flops / best / 1e12:.0f})"]
                            + [f"{best / times[impl]:.3f}" for impl in OURS])
                print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(cli.table(rows, ["case", "dir", "cuDNN (TFLOP/s)", *OURS]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
