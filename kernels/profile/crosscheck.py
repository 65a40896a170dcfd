"""Independent checks of the numbers the suite reports.

- `cost_analysis_check`: an operation's analytic work model against XLA's own
  count (`compiled.cost_analysis()`) for its XLA baseline. XLA counts a
  transcendental (exp) apart from its FLOPs, so FLOPs compare with
  flops + transcendentals; its "bytes accessed" adds up every HLO's operands
  and results, so it is at least the model's minimum bytes, and equal to it
  for a single dot.
- `trace_kernel_time`: a JAX timeable's kernel time from an XLA profiler
  trace (`jax.profiler.trace`), independent of the timer's CUPTI path; used
  by `python -m kernels verify-timing`.
- `torch_profiler_kernel_time`: the same for torch-side code (Triton, the
  ctypes CUDA kernels, torch baselines) from torch.profiler's (Kineto's)
  trace.
- `ncu_kernel_time`: the same from Nsight Compute's kernel durations (GPU only).
- `ncu_dram_command` / `dram_bytes_check`: the byte model of a bandwidth-bound
  kernel against Nsight Compute's DRAM byte counters (GPU only):
  `python -m kernels.profile.crosscheck dram softmax xla f32-32768x4096` prints the
  ncu command, runs it where ncu and a GPU exist, and compares.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
import io
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from kernels.core import environment

# Relative gap allowed between the analytic FLOPs and XLA's count, and between
# the model's bytes and XLA's where XLA's must equal the minimum (a single dot).
FLOPS_TOLERANCE = 0.01
BYTES_TOLERANCE = 0.01
# ncu's DRAM bytes against the model's minimum: within this fraction above it
# (a kernel may re-read a little; reading much more means the model or the kernel is off).
DRAM_TOLERANCE = 0.10


@dataclasses.dataclass(frozen=True)
class CostCheck:
    """One comparison: (op, implementation, case id, direction, bytes "equal" or "minimum")."""

    op: str
    impl: str
    case: str
    direction: str
    bytes_rule: str


# f32 only: for 16-bit inputs XLA on CPU adds convert ops to its counts. The
# softmax backward is left out: XLA's graph for jax.nn.softmax's VJP does 6
# elementwise operations per element where the model counts the minimum 4.
COST_CHECKS = (
    CostCheck("softmax", "xla", "f32-64x1000", "fwd", "minimum"),
    CostCheck("matmul", "xla", "f32-129x130x257", "fwd", "equal"),
    CostCheck("matmul", "xla", "f32-129x130x257", "bwd", "equal"),
)


def xla_cost(check: CostCheck) -> tuple[dict[str, float], Any]:
    """XLA's cost analysis of the check's implementation (the pullback for "bwd"), and the Work."""
    import jax

    from kernels.core import checking, frameworks, registry, timing

    op = registry.operation(check.op)
    impl = registry.implementation(check.op, check.impl)
    case = op.case(check.case)
    if check.direction == "fwd":
        args = impl.place(case, frameworks.framework("jax").from_numpy(
            checking.make_inputs(op, case, 0, "normal")))
        fn = jax.jit(impl.fn)
    else:
        timeable = timing.prepare(impl, case, direction="bwd")
        fn, args = jax.jit(timeable.fn), timeable.args
    cost = fn.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost  # a list of one on older jaxlibs
    return dict(cost), op.work(case, check.direction)


def cost_analysis_check(check: CostCheck) -> str:
    """Compare; raise AssertionError naming both counts on a mismatch, else a one-line summary."""
    cost, work = xla_cost(check)
    xla_flops = cost.get("flops", 0.0) + cost.get("transcendentals", 0.0)
    xla_bytes = cost["bytes accessed"]
    label = f"{check.op}-{check.impl} {check.case} {check.direction}"
    if abs(work.flops - xla_flops) > FLOPS_TOLERANCE * xla_flops:
        raise AssertionError(f"{label}: model {work.flops:.6g} FLOPs, XLA {xla_flops:.6g} "
                             f"(flops + transcendentals); tolerance {FLOPS_TOLERANCE:.0%}")
    if check.bytes_rule == "equal" and abs(work.bytes - xla_bytes) > BYTES_TOLERANCE * xla_bytes:
        raise AssertionError(f"{label}: model {work.bytes:.6g} bytes, XLA {xla_bytes:.6g}; "
                             f"tolerance {BYTES_TOLERANCE:.0%}")
    if check.bytes_rule == "minimum" and work.bytes > xla_bytes * (1 + BYTES_TOLERANCE):
        raise AssertionError(f"{label}: model's minimum {work.bytes:.6g} bytes exceeds all "
                             f"the bytes XLA accesses ({xla_bytes:.6g})")
    return (f"{label}: FLOPs model {work.flops:.6g} / XLA {xla_flops:.6g}; bytes model "
            f"{work.bytes:.6g} / XLA {xla_bytes:.6g} ({check.bytes_rule})")


# Lines XLA's trace derives from the kernels (duplicating their durations), not kernels.
_DERIVED_LINES = ("XLA", "Steps", "Scope", "Source", "Launch Stats", "Framework")


def _gpu_stream_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Complete events on the GPU's stream lines of a trace (not XLA's derived op lines)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    gpu_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") ==
                "process_name" and str(e["args"].get("name", "")).startswith("/device:GPU")}
    threads = {(e["pid"], e.get("tid")): str(e["args"].get("name", "")) for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] in gpu_pids}
    streams = {key for key, name in threads.items() if name.startswith("Stream")}
    if not streams:  # another naming: every GPU line that is not a derived one
        streams = {key for key, name in threads.items()
                   if not any(word in name for word in _DERIVED_LINES)}
    return sorted((e for e in events if e.get("ph") == "X" and (e["pid"], e.get("tid")) in
                   streams), key=lambda e: e["ts"])


def _trace(run, directory: pathlib.Path) -> list[dict[str, Any]]:
    import jax

    with jax.profiler.trace(str(directory), create_perfetto_trace=True):
        run()
    path = max(directory.glob("plugins/profile/*/perfetto_trace.json.gz"),
               key=lambda p: p.stat().st_mtime)
    with gzip.open(path) as file:
        return _gpu_stream_events(json.load(file))


def trace_kernel_time(timeable, *, calls: int = 30) -> float:
    """Median over `calls` cold calls of the summed kernel durations, from an XLA profiler trace.

    Each call follows an L2-sized write (a separate program, as the timer's
    cold regime does); the flush's kernels, found by tracing it alone, mark
    where each call starts and are left out of the sums.
    """
    import jax
    import jax.numpy as jnp

    from kernels.core import fingerprint, timing

    words = timing.l2_bytes(fingerprint.fingerprint()) // 4
    flush = jax.jit(lambda token: jnp.broadcast_to(token, (words,)))
    token = jnp.int32(1)
    jax.block_until_ready(flush(token))
    for _ in range(timing.WARMUP_CALLS):
        jax.block_until_ready(timeable.fn(*timeable.args))
    with tempfile.TemporaryDirectory() as scratch:
        flush_names = {e["name"] for e in _trace(
            lambda: [jax.block_until_ready(flush(token)) for _ in range(3)],
            pathlib.Path(scratch) / "flush")}

        def run():
            for _ in range(calls):
                jax.block_until_ready(flush(token))
                jax.block_until_ready(timeable.fn(*timeable.args))

        events = _trace(run, pathlib.Path(scratch) / "calls")
    if not flush_names:
        raise RuntimeError("the profiler trace shows no GPU kernels for the L2 flush")
    sums: list[float] = []
    for event in events:
        if event["name"] in flush_names:
            sums.append(0.0)
        elif sums:
            sums[-1] += float(event["dur"]) * 1e-6  # trace durations are in microseconds
    sums = [s for s in sums if s > 0]
    if len(sums) != calls:
        names = sorted({e["name"] for e in events})[:12]
        raise RuntimeError(f"profiler trace: expected {calls} calls' kernels after the flush "
                           f"{sorted(flush_names)}, found {len(sums)}; kernels seen: {names}")
    return statistics.median(sums)


CALL_RANGE = "kernelperf-call"


def torch_profiler_kernel_time(timeable, *, calls: int = 30) -> float:
    """Median over `calls` cold calls of the summed kernel durations, from torch.profiler.

    Each call runs inside a `record_function` range that ends with a device
    synchronize, after an L2-sized write that was waited for before the range
    began; a call's kernels are the GPU kernels that start inside its range
    (Kineto puts host ranges and device kernels on one time base). Memcpy and
    memset records are not kernels and are left out, as CUPTI's kernel records
    leave them out.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from kernels.core import fingerprint, timing

    flush = timing.torch_flush(timing.l2_bytes(fingerprint.fingerprint()))
    for _ in range(timing.WARMUP_CALLS):
        timeable.fn(*timeable.args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush()
            torch.cuda.synchronize()
            with record_function(CALL_RANGE):
                timeable.fn(*timeable.args)
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as scratch:
        path = pathlib.Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("ph") == "X" and e.get("name") == CALL_RANGE
                    and e.get("cat") == "user_annotation")
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    sums = [0.0] * len(ranges)
    for kernel in kernels:
        for index, (start, end) in enumerate(ranges):
            # 1 us of slack for the host/device clock alignment; the flush ran and was
            # waited for before the range began, so it starts well before.
            if start - 1.0 <= kernel["ts"] <= end:
                sums[index] += float(kernel["dur"]) * 1e-6
                break
    if len(ranges) != calls or not all(sums):
        raise RuntimeError(f"torch.profiler: expected {calls} '{CALL_RANGE}' ranges each with "
                           f"kernels, found {len(ranges)} ranges, {sum(map(bool, sums))} with "
                           f"kernels ({len(kernels)} kernels in all)")
    return statistics.median(sums)


# Every Nsight Compute run here (and kernels.profile.bottleneck's): only the calls between
# cudaProfilerStart and Stop, caches flushed before each kernel, clocks left alone.
NCU_FLAGS = ("--profile-from-start", "off", "--cache-control", "all", "--clock-control", "none")


def find_ncu() -> str | None:
    """Nsight Compute's ncu: on PATH, else in the CUDA toolkit's bin; None if neither has it."""
    found = shutil.which("ncu")
    if found:
        return found
    for candidate in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        path = pathlib.Path(candidate, "bin", "ncu")
        if candidate and path.is_file():
            return str(path)
    return None


def ncu_path() -> str:
    """`find_ncu`, or a UserError naming where it looked."""
    from kernels.core import validation

    found = find_ncu()
    if found is None:
        raise validation.UserError("ncu: expected Nsight Compute's ncu on PATH or in "
                                   "$CUDA_HOME/bin or /usr/local/cuda/bin, found none")
    return found


def _ncu_csv(*args: str) -> list[str]:
    return [ncu_path(), "--csv", *NCU_FLAGS, *args]


def child_command(*args: str) -> list[str]:
    """This module run as a child process with `args` (`run ...` is what ncu profiles)."""
    return [sys.executable, "-m", "kernels.profile.crosscheck", *args]


def child_env() -> dict[str, str]:
    # The parent may hold most of the GPU already; the child must not preallocate.
    return dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")


def ncu_dram_command(op: str, impl: str, case: str) -> list[str]:
    """The Nsight Compute command that counts DRAM bytes of one call of `impl` on `case`."""
    return _ncu_csv("--metrics", "dram__bytes_read.sum,dram__bytes_write.sum",
                    *child_command("run", op, impl, case, "--calls", "1"))


def parse_ncu_rows(text: str) -> list[dict[str, str]]:
    """The rows of ncu's --csv table (one per kernel and metric), in launch order."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("ncu output has no CSV table (did it profile any kernel?)")
    return list(csv.DictReader(io.StringIO(text[start:])))


# ncu's units in bytes and in nanoseconds: older versions write "usecond", 2025.3's raw page "us".
NCU_BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
NCU_NANOSECONDS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9, "nsecond": 1.0, "usecond": 1e3,
                   "msecond": 1e6, "second": 1e9}
_NCU_SCALE = {**NCU_BYTES, **NCU_NANOSECONDS}


def _ncu_value(row: dict[str, str]) -> float:
    return float(row["Metric Value"].replace(",", "")) * _NCU_SCALE.get(row["Metric Unit"], 1)


def parse_ncu_csv(text: str) -> dict[str, float]:
    """Sum of each metric over every profiled kernel in ncu's --csv output (bytes, ns)."""
    totals: dict[str, float] = {}
    for row in parse_ncu_rows(text):
        totals[row["Metric Name"]] = totals.get(row["Metric Name"], 0.0) + _ncu_value(row)
    return totals


def _require_gpu() -> None:
    from kernels.core import devices

    if not devices.this_machine().has_gpu:
        raise RuntimeError("needs a CUDA GPU (and Nsight Compute's ncu)")


def ncu_kernel_time(op: str, impl: str, case: str, *, calls: int = 10) -> float:
    """Median over `calls` of the summed ncu kernel durations of one call (caches flushed by ncu,
    clocks not locked). Only the calls between cudaProfilerStart/Stop are profiled, so
    compilation and autotuning kernels are not."""
    _require_gpu()
    result = subprocess.run(_ncu_csv("--metrics", "gpu__time_duration.sum",
                                     *child_command("run", op, impl, case, "--calls", str(calls))),
                            capture_output=True, text=True, env=child_env(), timeout=900)
    if result.returncode:
        raise RuntimeError(f"ncu failed: {(result.stderr or result.stdout)[-500:]}")
    durations = [_ncu_value(r) * 1e-9 for r in parse_ncu_rows(result.stdout)
                 if r["Metric Name"] == "gpu__time_duration.sum"]
    if not durations or len(durations) % calls:
        raise RuntimeError(f"ncu profiled {len(durations)} kernels, not a multiple of {calls}")
    per_call = len(durations) // calls
    return statistics.median(sum(durations[i:i + per_call])
                             for i in range(0, len(durations), per_call))


def trace_in_subprocess(op: str, impl: str, case: str, *, calls: int = 30) -> float:
    """The independent profiler's median kernel time in a fresh process (XLA's trace for JAX
    code, torch.profiler's for torch-side code): CUPTI takes one subscriber at a time, and
    the profiler there is untouched by the timer's CUPTI use here."""
    result = subprocess.run(child_command("trace", op, impl, case, "--calls", str(calls)),
                            capture_output=True, text=True, env=child_env(), timeout=900)
    if result.returncode:
        raise RuntimeError(f"profiler trace failed: {result.stderr[-500:]}")
    return float(result.stdout.split()[-1])


def dram_bytes_check(op: str, impl: str, case: str) -> str:
    """Run ncu on one call and compare its DRAM bytes with the model's (bandwidth-bound kernels)."""
    from kernels.core import registry

    _require_gpu()
    operation = registry.operation(op)
    work = operation.work(operation.case(case), "fwd")
    result = subprocess.run(ncu_dram_command(op, impl, case), capture_output=True, text=True,
                            env=child_env(), check=True)
    totals = parse_ncu_csv(result.stdout)
    dram = totals["dram__bytes_read.sum"] + totals["dram__bytes_write.sum"]
    verdict = "ok" if work.bytes * (1 - DRAM_TOLERANCE) <= dram <= work.bytes * (
        1 + DRAM_TOLERANCE) else "MISMATCH"
    return (f"{op}-{impl} {case}: ncu DRAM {dram:.4g} B, model {work.bytes:.4g} B "
            f"({dram / work.bytes:.3f}x) {verdict}")


def _timeable(op: str, impl: str, case: str, direction: str = "fwd"):
    from kernels.core import registry, timing

    return timing.prepare(registry.implementation(op, impl), registry.operation(op).case(case),
                          direction=direction)


def _run_calls(op: str, impl: str, case: str, calls: int, direction: str = "fwd") -> None:
    """Warm up, then `calls` calls inside cudaProfilerStart/Stop (what ncu profiles)."""
    import torch

    from kernels.core import frameworks, timing

    timeable = _timeable(op, impl, case, direction)
    fw = frameworks.framework("jax" if timeable.framework == "jax" else "torch")
    for _ in range(timing.WARMUP_CALLS):
        fw.synchronize(timeable.fn(*timeable.args))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(calls):
        fw.synchronize(timeable.fn(*timeable.args))
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main(argv: list[str] | None = None) -> int:
    environment.configure()
    parser = argparse.ArgumentParser(prog="python -m kernels.profile.crosscheck",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "warm up, then calls under cudaProfilerStart (for ncu)"),
                            ("trace", "median kernel time from a profiler trace (XLA's for "
                                      "JAX code, torch.profiler's for torch-side code)"),
                            ("dram", "ncu DRAM bytes of one call vs the byte model"),
                            ("ncu-time", "median kernel time by ncu")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("op")
        command.add_argument("impl")
        command.add_argument("case")
        command.add_argument("--calls", type=int, default=10)
        if name == "run":
            command.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    sub.add_parser("cost", help="analytic work vs XLA cost_analysis for the XLA baselines")
    args = parser.parse_args(argv)
    if args.command == "run":
        _run_calls(args.op, args.impl, args.case, args.calls, args.direction)
    elif args.command == "trace":
        timeable = _timeable(args.op, args.impl, args.case)
        traced = trace_kernel_time if timeable.framework == "jax" else torch_profiler_kernel_time
        print(repr(traced(timeable, calls=args.calls)))
    elif args.command == "ncu-time":
        print(repr(ncu_kernel_time(args.op, args.impl, args.case, calls=args.calls)))
    elif args.command == "dram":
        print(" ".join(ncu_dram_command(args.op, args.impl, args.case)))
        print(dram_bytes_check(args.op, args.impl, args.case))
    else:
        for check in COST_CHECKS:
            print(cost_analysis_check(check))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
