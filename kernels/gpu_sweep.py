"""On a GPU: bad inputs into the compiled paths, and the CUDA sanitizer with a cold and a warm
JAX compilation cache. `python3 -m kernels.gpu_sweep [--part api|sanitizer|all] [--out DIR]`.

Part "api": every torch-framework kernel of ours (Triton and the ctypes CUDA launchers) is
called with inputs a user may hand it by mistake: CPU tensors, tensors on another device
(a second GPU where there is one, else the `meta` device), non-contiguous views (a transpose,
a strided slice), zero-size inputs and JAX arrays. Each call runs in its own process, so a
crash (a segmentation fault, an illegal address that poisons the CUDA context) is one row, not
the end of the sweep. A row passes if the kernel returns the right result (compared with
torch's own) or raises a TypeError / ValueError before launching; anything else is reported.

Part "sanitizer": `compute-sanitizer --tool memcheck` over `pytest -m "cuda and small"` twice,
first with an empty JAX compilation cache, then with the cache the first run filled (on the
H100 the cold run died with a segmentation fault in two of three sessions, 2026-11-24 and -25;
the warm run always passed); then, to place the
fault, minimal programs under the sanitizer with a cold cache: a JAX jit alone, a JAX matmul
(XLA's GEMM autotuner launches many kernels), the same with autotuning off, and torch alone.
Output: a table on stdout; in DIR (default $OUT, else ./gpu_sweep_out) every api call's output
in api.log and each sanitizer run's log, with the last test started named in the table when a
run died. Exit status 1 when an api row is neither correct nor a clear error, or a sanitizer
run or probe did not exit 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

# (operation, implementation, input shapes): small shapes every kernel takes (head_dim 64,
# k and n multiples of 8 for wgmma).
KERNELS = (
    ("softmax", "triton", ((64, 256),)),
    ("softmax", "cuda", ((64, 256),)),
    ("row_sum", "cuda", ((64, 256),)),
    ("matmul", "triton", ((64, 128), (128, 64))),
    ("matmul", "cuda_sgemm", ((64, 128), (128, 64))),
    ("matmul", "cuda_mma", ((64, 128), (128, 64))),
    ("matmul", "cuda_wgmma", ((64, 128), (128, 64))),
    ("attention", "triton", ((2, 128, 2, 64),) * 3),
)
KINDS = ("cuda-contiguous", "cpu", "other-device", "transposed", "strided-slice", "zero-size",
         "jax-array")
CALL_TIMEOUT_S = 180


def _dtype_for(impl: str) -> str:
    return "bfloat16" if impl in ("cuda_mma", "cuda_wgmma") else "float32"


def _make(kind: str, shapes, dtype: str):
    """The inputs of one row, built in the child process (torch imported there)."""
    import torch

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    base = [torch.randn(s, dtype=torch.float32).to(dt) for s in shapes]
    if kind == "cuda-contiguous":
        return [x.cuda() for x in base]
    if kind == "cpu":
        return base
    if kind == "other-device":
        target = "cuda:1" if torch.cuda.device_count() > 1 else "meta"
        return [base[0].cuda()] + [x.to(target) for x in base[1:]] if len(base) > 1 \
            else [base[0].to(target)]
    if kind == "transposed":  # same shapes, column-major memory
        return [x.cuda().mT.contiguous().mT for x in base]
    if kind == "strided-slice":  # every other row of a twice-as-tall tensor
        return [torch.cat([x, x], dim=0).cuda()[::2] if x.dim() == 2
                else torch.cat([x, x], dim=1).cuda()[:, ::2] for x in base]
    if kind == "zero-size":
        return [x[:0].cuda() if i == 0 else x.cuda() for i, x in enumerate(base)]
    if kind == "jax-array":
        import jax.numpy as jnp

        return [jnp.asarray(x.float().numpy()).astype(dtype) for x in base]
    raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")


def _expected(op: str, args):
    import torch

    xs = [a.float() for a in args]
    if op == "softmax":
        return torch.softmax(xs[0], dim=-1)
    if op == "row_sum":
        return xs[0].sum(dim=-1)
    if op == "matmul":
        return xs[0] @ xs[1]
    q, k, v = (x.transpose(1, 2) for x in xs)  # (b, h, s, d)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)


def child(op: str, impl_name: str, kind: str) -> dict:
    """One call, in this (child) process; the outcome as a JSON-able dict."""
    from kernels import environment

    environment.configure()
    import torch

    from kernels import registry

    impl = registry.implementation(op, impl_name)
    shapes = dict((o, s) for o, i, s in KERNELS if i == impl_name and o == op)[op]
    args = _make(kind, shapes, _dtype_for(impl_name))
    try:
        out = impl.fn(*args)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except (TypeError, ValueError) as error:
        return {"outcome": "clear error", "detail": f"{type(error).__name__}: {error}"[:160]}
    except Exception as error:  # what this sweep looks for: a failure that is not a clear one
        return {"outcome": "UNCLEAR ERROR", "detail": f"{type(error).__name__}: {error}"[:160]}
    want = _expected(op, [a.cpu() if a.device.type != "meta" else a for a in args])
    got = out.float().cpu()
    if tuple(got.shape) != tuple(want.shape):
        return {"outcome": "WRONG SHAPE", "detail": f"{tuple(got.shape)} vs {tuple(want.shape)}"}
    if got.numel() == 0:
        return {"outcome": "correct", "detail": f"empty {tuple(got.shape)}"}
    err = float((got - want.cpu()).abs().max() / want.abs().max().clamp_min(1e-30))
    limit = 3e-2 if _dtype_for(impl_name) == "bfloat16" else 2e-3  # TF32 products
    return {"outcome": "correct" if err <= limit else "WRONG RESULT",
            "detail": f"max rel err {err:.1e}"}


def _run(command: list[str], log: pathlib.Path, env: dict | None = None,
         timeout: int = CALL_TIMEOUT_S) -> tuple[str, float]:
    """Run, logging stdout+stderr; (status text, seconds). Signals are named."""
    start = time.time()
    with open(log, "w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False)
            code = done.returncode
        except subprocess.TimeoutExpired:
            return f"timeout after {timeout} s", time.time() - start
    if code < 0:
        return f"killed by {signal.Signals(-code).name}", time.time() - start
    return f"exit {code}", time.time() - start


_API_LOG_LOCK = threading.Lock()


def _api_row(out: pathlib.Path, op: str, impl: str, kind: str) -> list[str]:
    log = out / f"api_{op}_{impl}_{kind}.log"
    status, _ = _run([sys.executable, "-m", "kernels.gpu_sweep", "--child", op, impl, kind], log)
    text = log.read_text()
    # One api.log for the whole part: a file per call (56 of them) is more than a GPU job's
    # artifacts should carry.
    with _API_LOG_LOCK, open(out / "api.log", "a") as combined:
        combined.write(f"### {op}-{impl} {kind}: {status}\n{text}\n")
    log.unlink()
    # The child's last line, not a traceback quoting the print statement.
    results = [line for line in text.splitlines() if line.startswith("RESULT {")]
    if results:
        result = json.loads(results[-1][len("RESULT "):])
        row = [f"{op}-{impl}", kind, result["outcome"], result["detail"]]
    else:
        tail = text.strip().splitlines()[-1:] or [""]
        row = [f"{op}-{impl}", kind, f"CRASH ({status})", tail[0][:160]]
    print("  " + " | ".join(row), file=sys.stderr, flush=True)
    return row


def part_api(out: pathlib.Path, jobs: int) -> list[list[str]]:
    """Every (kernel, kind) row, `jobs` child processes at a time (each mostly imports and
    compiles; the kernels are tiny), in KERNELS x KINDS order."""
    from concurrent.futures import ThreadPoolExecutor

    calls = [(out, op, impl, kind) for op, impl, _ in KERNELS for kind in KINDS]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda call: _api_row(*call), calls))


def part_sanitizer(out: pathlib.Path, minutes: float, cold_runs: int = 1) -> list[list[str]]:
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        return [["compute-sanitizer", "-", "not found", "install the CUDA toolkit's sanitizer"]]
    rows = []
    base = [sanitizer, "--tool", "memcheck", "--kernel-name", "kns=kernelperf_"]
    pytest = [sys.executable, "-m", "pytest", "-m", "cuda and small", "-p", "no:xdist", "-v",
              "-x"]
    limit = int(minutes * 60)
    # The fault is intermittent (2 of 3 sessions): `cold_runs` runs, each with an empty cache;
    # then a warm one on the last run's cache; then the same tests cold without the sanitizer,
    # which says whether the fault needs it. Python's faulthandler names the Python frames
    # of a segmentation fault in the test process.
    runs = [(f"cold cache{f' #{i + 1}' if cold_runs > 1 else ''}", True, True)
            for i in range(cold_runs)]
    runs += [("warm cache", False, True), ("cold cache, no sanitizer", True, False)]
    cache = None
    for state, cold, sanitized in runs:
        if cold:
            cache = pathlib.Path(tempfile.mkdtemp(prefix="kernelperf-jax-cache-"))
        env = dict(os.environ, KERNELPERF_COMPILATION_CACHE=str(cache), PYTHONFAULTHANDLER="1")
        name = "".join(c if c.isalnum() else "_" for c in state)
        log = out / f"sanitizer_pytest_{name}.log"
        status, seconds = _run((base if sanitized else []) + pytest, log, env, limit)
        detail = f"{seconds:.0f} s; cache holds {sum(1 for _ in cache.rglob('*'))} files"
        label = "pytest -m 'cuda and small'" + (" under memcheck" if sanitized else "")
        rows.append([label, state, status, detail + _where_it_stopped(log, status)])
        print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    probes = {
        "jax jit (x + 1)": "import jax, jax.numpy as jnp; "
                           "print(jax.jit(lambda x: x + 1)(jnp.ones(4)).block_until_ready())",
        "jax matmul 512^2 (XLA GEMM autotuning)":
            "import jax, jax.numpy as jnp; x = jnp.ones((512, 512)); "
            "print(jax.jit(jnp.dot)(x, x).block_until_ready()[0, 0])",
        "torch matmul 512^2": "import torch; x = torch.ones(512, 512, device='cuda'); "
                              "print((x @ x)[0, 0].item())",
    }
    for label, code in probes.items():
        variants = [("cold cache", {})]
        if "autotuning" in label:
            variants.append(("cold cache, autotune off",
                             {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}))
        for variant, extra in variants:
            fresh = tempfile.mkdtemp(prefix="kernelperf-jax-probe-")
            probe_env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=fresh,
                             XLA_PYTHON_CLIENT_PREALLOCATE="false", **extra)
            name = "".join(c if c.isalnum() else "_" for c in f"{label}_{variant}")
            status, seconds = _run([sanitizer, "--tool", "memcheck", sys.executable, "-c", code],
                                   out / f"sanitizer_probe_{name}.log", probe_env, limit)
            rows.append([f"probe: {label}", variant, status, f"{seconds:.0f} s"])
            print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _where_it_stopped(log: pathlib.Path, status: str) -> str:
    """For a run that did not exit 0: the last test pytest started (its -v lines name each
    before running it), the sanitizer's error count if it lived to report one, and the
    innermost Python frame faulthandler printed for a fatal signal, if it printed one."""
    if status == "exit 0":
        return ""
    lines = log.read_text(errors="replace").splitlines()
    started = [line.split()[0] for line in lines if "::" in line and line.startswith(
        ("correctness_tests/", "perf_tests/"))]
    summaries = re.findall(r"ERROR SUMMARY: (\d+) error", "\n".join(lines))
    errors = (f"sanitizer errors: {summaries[-1]}" if summaries
              else "no sanitizer error summary (it died before writing one)")
    where = f"; last test started: {started[-1] if started else 'none'}; {errors}"
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if fatal:
        # faulthandler: "Fatal Python error: Segmentation fault", then each thread's stack,
        # the current thread's first, its innermost frame first.
        frames = [line.strip() for line in lines[fatal[-1]:] if line.strip().startswith("File ")]
        where += f"; {lines[fatal[-1]][len('Fatal Python error: '):]} in " + (
            frames[0] if frames else "no Python frame (native code)")
    return where


@dataclasses.dataclass(frozen=True)
class Options:
    part: str
    out: pathlib.Path
    sanitizer_minutes: float
    jobs: int
    cold_runs: int


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kernels.gpu_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("api", "sanitizer", "all"), default="all")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_sweep_out"))
    parser.add_argument("--sanitizer-minutes", type=float, default=4.0,
                        help="time limit of each sanitizer run")
    parser.add_argument("--cold-runs", type=int, default=1,
                        help="sanitizer part: runs with an empty JAX cache (the fault is "
                             "intermittent)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="api part: child processes at a time (default: 8 or the CPUs)")
    parser.add_argument("--child", nargs=3, metavar=("OP", "IMPL", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(*args.child)), flush=True)
        return 0
    from kernels.cli import table

    for flag, value in (("--jobs", args.jobs), ("--cold-runs", args.cold_runs)):
        if value < 1:
            parser.error(f"{flag}: expected at least 1, got {value}")
    if args.part in ("api", "all"):
        import torch

        if not torch.cuda.is_available():
            parser.error("--part api: expected a machine with a CUDA GPU, got none visible "
                         "to torch")
    options = Options(args.part, pathlib.Path(args.out), args.sanitizer_minutes, args.jobs,
                      args.cold_runs)
    options.out.mkdir(parents=True, exist_ok=True)
    report, failed = [], False
    if options.part in ("api", "all"):
        rows = part_api(options.out, options.jobs)
        report.append(table(rows, ["kernel", "input", "outcome", "detail"]))
        failed |= any(row[2] not in ("correct", "clear error") for row in rows)
    if options.part in ("sanitizer", "all"):
        rows = part_sanitizer(options.out, options.sanitizer_minutes, options.cold_runs)
        report.append(table(rows, ["run", "state", "status", "detail"]))
        failed |= any(row[2] != "exit 0" for row in rows)
    text = "\n\n".join(report)
    print(text)
    (options.out / "gpu_sweep.txt").write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
