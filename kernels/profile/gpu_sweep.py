"""On a GPU: bad inputs into the compiled paths, and the CUDA sanitizer's intermittent fault.
`python3 -m kernels.profile.gpu_sweep [--part api|sanitizer|all] [--out DIR] [--repeats N]`.

Part "api": every torch-framework kernel of ours (Triton and the ctypes CUDA launchers) is
called with inputs a user may hand it by mistake: CPU tensors, tensors on another device
(a second GPU where there is one, else the `meta` device), non-contiguous views (a transpose,
a strided slice), zero-size inputs and JAX arrays. Each call runs in its own process, so a
crash (a segmentation fault, an illegal address that poisons the CUDA context) is one row, not
the end of the sweep. A row passes if the kernel returns the right result (compared with
the operation's registered reference) or raises a TypeError / ValueError before launching;
anything else is reported.

Part "sanitizer": `compute-sanitizer --tool memcheck` over `pytest -m "cuda and small"` dies by
SIGSEGV now and then on the H100, in the sanitizer's own executable, while it follows the test
process's children. Each arm of SANITIZER_ARMS runs `--repeats` times (`--jobs` at a time): the
tests or a selection of them (`-k`) under memcheck with or without following children or the
kernel-name filter, without the sanitizer, and programs of a few lines (PROBES) that do what
the tests do to the GPU, candidates for a reproduction free of this repository's code. By
default the three arms that tell the story: the smallest reproduction found
(test_softmax_versions alone, following children), the same not following them, and the
documented command (docs/kernels.md) over the whole tier; `--arm` picks others. The kernel
log's segfault lines (dmesg) name the process that faulted. Output: a table on stdout; in DIR
(default $OUT, else ./gpu_sweep_out) every api call's output in api.log and each sanitizer
run's log, with the last test started and faulthandler's innermost Python frame named in the
table when a run died.
Exit status 1 when an api row is neither correct nor a clear error, or a sanitizer run did not
exit 0.
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

ROOT = pathlib.Path(__file__).resolve().parents[2]

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
    """The right result of one row: the operation's registered jax.numpy reference
    (kernels.core.registry) on the inputs upcast to float32, as a float32 CPU torch tensor.
    `args` are CPU torch tensors; the case params are the reference's defaults (the rows of
    KERNELS pass none)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from kernels.core import registry

    reference = registry.operation(op).reference
    # On the host, as the torch formulas it replaces were: the truth stays off the GPU whose
    # kernels are under test, and in full float32 (no TF32 products).
    with jax.default_device(jax.devices("cpu")[0]):
        out = reference(*(jnp.asarray(a.float().numpy(), dtype=jnp.float32) for a in args))
        return torch.from_numpy(np.array(out, dtype=np.float32))


def child(op: str, impl_name: str, kind: str) -> dict:
    """One call, in this (child) process; the outcome as a JSON-able dict."""
    from kernels.core import environment

    environment.configure()
    import torch

    from kernels.core import registry

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
    status, _ = _run([sys.executable, "-m", "kernels.profile.gpu_sweep", "--child", op, impl, kind],
                     log)
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


# Programs that do what the CUDA tests do to the GPU, minus the tests, for a reproduction of the
# sanitizer's fault free of this repository's code (all but SOFTMAX_PROBE use none of it). The
# prelude starts CUDA (torch) and defines nvcc_module(name, source, *flags): source compiled by
# nvcc in a child process and loaded with ctypes; and build(i): a kernel adding i to x.
_PROBE_PRELUDE = """
import ctypes, os, subprocess, tempfile, time, torch
x = torch.zeros(32, device="cuda")
folder = tempfile.mkdtemp()

def nvcc_module(name, source, *flags):
    path, library = (os.path.join(folder, f"{name}.{ext}") for ext in ("cu", "so"))
    with open(path, "w") as f:
        f.write(source)
    subprocess.run(["nvcc", *flags, "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90a", path,
                    "-o", library], check=True)
    return ctypes.CDLL(library)

def build(i):
    return nvcc_module(
        f"k{i}", '__global__ void kernelperf_probe(float* x) { x[threadIdx.x] += %d; }\\n'
        'extern "C" void launch(float* x) { kernelperf_probe<<<1, 32>>>(x); }\\n' % i).launch
"""
# Ten builds, each launched once.
BUILD_PROBE = _PROBE_PRELUDE + """
for i in range(10):
    build(i)(ctypes.c_void_p(x.data_ptr()))
    torch.cuda.synchronize()
print("sum", x.sum().item(), "expected", 32 * sum(range(10)))
"""
# The tests' other pattern: thousands of launches of instrumented kernels with a child process
# now and then (`nvcc --version` for the build cache's key), for 45 s.
LAUNCH_PROBE = _PROBE_PRELUDE + """
launch, launches, end = build(1), 0, time.time() + 45
while time.time() < end:
    for _ in range(200):
        launch(ctypes.c_void_p(x.data_ptr()))
    launches += 200
    torch.cuda.synchronize()
    subprocess.run(["nvcc", "--version"], capture_output=True, check=True)
print("launches", launches, "sum", x.sum().item(), "expected", 32 * launches)
"""
# Smaller: torch's own kernels launched between short-lived children (`true`), no nvcc, no
# ctypes. (A probe with no CUDA at all cannot serve: memcheck ends such a target with "Target
# application terminated before first instrumented API call", exit 255.)
CHILDREN_PROBE = """
import subprocess, time, torch
x, children, end = torch.zeros(1 << 20, device="cuda"), 0, time.time() + 45
while time.time() < end:
    for _ in range(50):
        x.add_(1)
    torch.cuda.synchronize()
    subprocess.run(["true"], check=True)
    children += 1
print("children", children, "all equal", bool((x == 50 * children).all().item()))
"""
# Closer to the tests: JAX's GPU client in the process too, a new XLA compilation at every
# step and (REBUILD) a new nvcc-built module loaded and launched, for 60 s; without REBUILD one
# module built before the loop, so no child process after the start.
JAX_PROBE = _PROBE_PRELUDE + """
import jax, jax.numpy as jnp
value, launch, added, steps, end = 1, build(1), 0, 0, time.time() + 60
while time.time() < end:
    if REBUILD and steps:
        value = steps + 1
        launch = build(value)
    launch(ctypes.c_void_p(x.data_ptr()))
    added += value
    torch.cuda.synchronize()
    y = jax.jit(lambda a: jnp.exp(a - a.max()) / (steps + 1))(jnp.ones((15, 100 + steps)))
    y.block_until_ready()
    steps += 1
print("steps", steps, "sum", x.sum().item(), "expected", 32 * added)
"""
# As the CUDA softmax does: a module of many kernels (48 instantiations of a 1024-thread
# template, all matching the kernel-name filter) launched in turn with JAX's GPU client in the
# process, a new module built by nvcc every tenth step; for 60 s.
MANY_KERNELS_PROBE = _PROBE_PRELUDE + """
import jax, jax.numpy as jnp
SOURCE = r'''
template <int N> __global__ void __launch_bounds__(1024) kernelperf_probe(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += N * OFFSET;
}
typedef void (*kernel_t)(float*, int);
template <int... N> struct table { static constexpr kernel_t all[] = {kernelperf_probe<N>...}; };
extern "C" int launch(int which, float* x, int n) {
  const kernel_t* kernels = table<1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,
    24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48>::all;
  kernels[which % 48]<<<(n + 1023) / 1024, 1024>>>(x, n);
  return (int)cudaGetLastError();
}
'''

def build_many(offset):
    return nvcc_module(f"m{offset}", SOURCE.replace("OFFSET", str(offset)), "-O3",
                       "-std=c++17", "-lineinfo").launch

n = 15 * 4096
x = torch.zeros(n, device="cuda")
jnp.ones(8).block_until_ready()
offset, launch, added, steps, end = 1, build_many(1), 0, 0, time.time() + 60
while time.time() < end:
    if steps and steps % 10 == 0:
        offset += 1
        launch = build_many(offset)
    assert launch(steps, ctypes.c_void_p(x.data_ptr()), n) == 0
    added += (steps % 48 + 1) * offset
    torch.cuda.synchronize()
    y = jax.jit(lambda a: jax.nn.softmax(a * (steps + 1)))(jnp.ones((15, 100 + steps)))
    y.block_until_ready()
    steps += 1
print("steps", steps, "first", x[0].item(), "expected", added)
"""
# Halving from the other side: this repository's CUDA softmax, the versions that
# test_softmax_versions runs, called in a loop without pytest (and without JAX, then with it).
SOFTMAX_PROBE = """
import time, torch
from correctness_tests.test_cuda_kernels import SOFTMAX_VERSIONS
from kernels.ops.softmax import cuda as softmax_cuda
if WITH_JAX:
    import jax.numpy as jnp
    jnp.ones(8).block_until_ready()
types = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
calls, end = 0, time.time() + 40
while time.time() < end:
    for dtype, cols, fields in SOFTMAX_VERSIONS:
        x = torch.randn(3, 5, cols, device="cuda", dtype=types[dtype])
        y = softmax_cuda.softmax(x, config=softmax_cuda.SoftmaxConfig(**fields)).float()
        torch.cuda.synchronize()
        if WITH_JAX:
            y = jnp.asarray(y.cpu().numpy())
        assert abs(float(y.sum()) - 15) < 0.1, float(y.sum())
        calls += 1
print("calls", calls)
"""
PROBES = {"build probe": BUILD_PROBE, "launch probe": LAUNCH_PROBE,
          "children probe": CHILDREN_PROBE, "JAX probe": "REBUILD = True" + JAX_PROBE,
          "JAX probe, one build": "REBUILD = False" + JAX_PROBE,
          "many kernels probe": MANY_KERNELS_PROBE,
          "softmax probe": "WITH_JAX = False" + SOFTMAX_PROBE,
          "softmax + JAX probe": "WITH_JAX = True" + SOFTMAX_PROBE}


@dataclasses.dataclass(frozen=True)
class SanitizerArm:
    """One way to run: the program ("tests": the CUDA tests, those `-k tests_k` selects if
    set; or a key of PROBES), the sanitizer's arguments (None: no sanitizer), and whether
    nvcc's build cache starts empty."""

    label: str
    program: str
    sanitizer: tuple[str, ...] | None
    empty_build_cache: bool = True
    tests_k: str = ""


PLAIN_MEMCHECK = ("--tool", "memcheck")
MEMCHECK = (*PLAIN_MEMCHECK, "--kernel-name", "kns=kernelperf_")  # our kernels only
APPLICATION_ONLY = ("--target-processes", "application-only")  # not the test's children
# What the arms showed on the H100 (2026-11-25, perf_tests/RESULTS.md), every fault at one
# instruction of the compute-sanitizer executable (kernel log): following the test process's
# children, the tests died in 8 of 17 runs, at varying tests, with an empty nvcc build cache or
# a full one; not following them, 0 of 11; no sanitizer 0 of 5. Halved: test_softmax_versions
# alone 4 of 4 died, 0 of 4 not following children, 0 of 4 without the kernel-name filter;
# the probes free of this repository's code passed every run.
SANITIZER_ARMS = (
    SanitizerArm("tests, memcheck", "tests", MEMCHECK),
    SanitizerArm("tests, memcheck, application-only", "tests",
                 MEMCHECK + APPLICATION_ONLY),
    SanitizerArm("tests, memcheck, warm build cache", "tests", MEMCHECK, False),
    SanitizerArm("tests, no sanitizer", "tests", None),
    SanitizerArm("nvcc + ctypes probe, memcheck", "build probe", PLAIN_MEMCHECK),
    SanitizerArm("launches + children probe, memcheck", "launch probe", MEMCHECK),
    SanitizerArm("torch + children probe, memcheck", "children probe", PLAIN_MEMCHECK),
    SanitizerArm("torch + children probe, memcheck, application-only", "children probe",
                 PLAIN_MEMCHECK + APPLICATION_ONLY),
    SanitizerArm("JAX + nvcc + ctypes probe, memcheck", "JAX probe", PLAIN_MEMCHECK),
    SanitizerArm("JAX + nvcc + ctypes probe, memcheck, application-only", "JAX probe",
                 PLAIN_MEMCHECK + APPLICATION_ONLY),
    # Halving the tests: the runs that died had started test_softmax_versions (most) or a
    # test_small_registry_cases item of the CUDA matmuls, 25-75 s in.
    SanitizerArm("softmax versions alone, memcheck", "tests", MEMCHECK,
                 tests_k="test_softmax_versions"),
    SanitizerArm("softmax versions alone, memcheck, application-only", "tests",
                 MEMCHECK + APPLICATION_ONLY,
                 tests_k="test_softmax_versions"),
    SanitizerArm("registry cases alone, memcheck", "tests", MEMCHECK,
                 tests_k="test_small_registry_cases"),
    # What died 4 of 4 (softmax versions alone, 21-25 s in) against application-only 0 of 4
    # and the registry cases 0 of 4: is it the kernel-name filter, pytest, JAX?
    SanitizerArm("softmax versions alone, memcheck, no kernel filter", "tests",
                 PLAIN_MEMCHECK, tests_k="test_softmax_versions"),
    SanitizerArm("softmax script, memcheck", "softmax probe", MEMCHECK),
    SanitizerArm("softmax + JAX script, memcheck", "softmax + JAX probe", MEMCHECK),
    # That split (with the kernel-name filter 4 of 4 died, without it 0 of 4; the softmax
    # script 0 of 4 without JAX, 1 of 4 with it) names the filter and JAX: JAX_PROBE again,
    # with the filter, with and without children after the start.
    SanitizerArm("JAX + nvcc + ctypes probe, memcheck, kernel filter", "JAX probe", MEMCHECK),
    SanitizerArm("JAX + nvcc + ctypes probe, memcheck, kernel filter, application-only",
                 "JAX probe", MEMCHECK + APPLICATION_ONLY),
    SanitizerArm("JAX + one build probe, memcheck, kernel filter", "JAX probe, one build",
                 MEMCHECK),
    # JAX_PROBE passed all 15 (filter, children or not); the softmax's module has many
    # 1024-thread kernels where the probe has one 32-thread kernel.
    SanitizerArm("many kernels + JAX probe, memcheck, kernel filter", "many kernels probe",
                 MEMCHECK),
    SanitizerArm("many kernels + JAX probe, memcheck, kernel filter, application-only",
                 "many kernels probe", MEMCHECK + APPLICATION_ONLY),
)
# The story in three arms: the smallest reproduction, the same not following children, and
# the documented command (docs/kernels.md) over the whole small tier.
DEFAULT_SANITIZER_ARMS = tuple(a for a in SANITIZER_ARMS if a.label in (
    "softmax versions alone, memcheck", "softmax versions alone, memcheck, application-only",
    "tests, memcheck, application-only"))


def part_sanitizer(out: pathlib.Path, minutes: float, repeats: int = 1, jobs: int = 1,
                   arms: tuple[SanitizerArm, ...] = DEFAULT_SANITIZER_ARMS) -> list[list[str]]:
    """Every arm `repeats` times, `jobs` runs at a time, each with a fresh JAX compilation
    cache and (unless the arm says warm) a fresh nvcc build cache; a row per run, a row per
    arm counting the runs that did not exit 0, and the kernel's log of segmentation faults
    (which process faulted, in which library), where dmesg can be read."""
    from concurrent.futures import ThreadPoolExecutor

    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        return [["compute-sanitizer", "-", "not found", "install the CUDA toolkit's sanitizer"]]
    limit = int(minutes * 60)
    tests = [sys.executable, "-m", "pytest", "-m", "cuda and small", "-p", "no:xdist", "-v", "-x"]
    warm = pathlib.Path(tempfile.mkdtemp(prefix="kernelperf-cuda-warm-"))
    rows = []
    if any(not arm.empty_build_cache for arm in arms):
        status, seconds = _run(tests, out / "sanitizer_prepare_warm_build_cache.log",
                               dict(os.environ, KERNELPERF_CUDA_CACHE=str(warm)), limit)
        rows.append(["prepare the warm build cache (tests, no sanitizer)", "-", status,
                     f"{seconds:.0f} s"])
    faults_before = set(_kernel_segfaults())

    def one(arm: SanitizerArm, index: int) -> list[str]:
        build_cache = tempfile.mkdtemp(prefix="kernelperf-cuda-") if arm.empty_build_cache \
            else str(warm)
        env = dict(os.environ, PYTHONFAULTHANDLER="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
                   KERNELPERF_CUDA_CACHE=build_cache,
                   KERNELPERF_COMPILATION_CACHE=tempfile.mkdtemp(prefix="kernelperf-jax-"))
        program = ((tests + (["-k", arm.tests_k] if arm.tests_k else []))
                   if arm.program == "tests" else [sys.executable, "-c", PROBES[arm.program]])
        command = ([sanitizer, *arm.sanitizer] if arm.sanitizer else []) + program
        name = "".join(c if c.isalnum() else "_" for c in arm.label)
        log = out / f"sanitizer_{name}_{index + 1}.log"
        status, seconds = _run(command, log, env, limit)
        row = [arm.label, f"run {index + 1}", status,
               f"{seconds:.0f} s" + _where_it_stopped(log, status)]
        print("  " + " | ".join(row), file=sys.stderr, flush=True)
        return row

    calls = [(arm, i) for i in range(repeats) for arm in arms]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(lambda call: one(*call), calls))
    rows += sorted(runs, key=lambda row: [a.label for a in arms].index(row[0]))
    for arm in arms:
        bad = [row for row in runs if row[0] == arm.label and row[2] != "exit 0"]
        rows.append([arm.label, "all runs", f"{len(bad)} of {repeats} did not exit 0",
                     ", ".join(sorted({row[2] for row in bad}))])
    after = _kernel_segfaults()
    unreadable = [line for line in after if line.startswith("dmesg unreadable")]
    faults = unreadable or [line for line in after if line not in faults_before]
    for line in faults or ["no segmentation fault logged during the runs"]:
        rows.append([KERNEL_LOG, "-", "-", line[:200]])
    return rows


KERNEL_LOG = "kernel log (dmesg)"


def _kernel_segfaults() -> list[str]:
    """The kernel's lines about segmentation faults ("NAME[PID]: segfault at ... in LIB"), or
    one line saying why dmesg could not be read."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [f"dmesg unreadable: {error}"]
    if log.returncode:
        return [f"dmesg unreadable: {(log.stderr or log.stdout).strip()[:120]}"]
    return [line for line in log.stdout.splitlines() if "segfault" in line or "traps:" in line]


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
    repeats: int
    arms: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kernels.profile.gpu_sweep",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("api", "sanitizer", "all"), default="all")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_sweep_out"))
    parser.add_argument("--sanitizer-minutes", type=float, default=4.0,
                        help="time limit of each sanitizer run")
    parser.add_argument("--arm", action="append", choices=[a.label for a in SANITIZER_ARMS],
                        help="sanitizer part: only this arm (repeatable; default: all)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="sanitizer part: runs of each arm (the fault is intermittent)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="child processes at a time, api calls or sanitizer runs (default: 8 "
                             "or the CPUs)")
    parser.add_argument("--child", nargs=3, metavar=("OP", "IMPL", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(*args.child)), flush=True)
        return 0
    from kernels.core.tables import table

    for flag, value in (("--jobs", args.jobs), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag}: expected at least 1, got {value}")
    if args.part in ("api", "all"):
        import torch

        if not torch.cuda.is_available():
            parser.error("--part api: expected a machine with a CUDA GPU, got none visible "
                         "to torch")
    options = Options(args.part, pathlib.Path(args.out), args.sanitizer_minutes, args.jobs,
                      args.repeats, tuple(args.arm or ()))
    options.out.mkdir(parents=True, exist_ok=True)
    report, failed = [], False
    if options.part in ("api", "all"):
        rows = part_api(options.out, options.jobs)
        report.append(table(rows, ["kernel", "input", "outcome", "detail"]))
        failed |= any(row[2] not in ("correct", "clear error") for row in rows)
    if options.part in ("sanitizer", "all"):
        arms = tuple(a for a in SANITIZER_ARMS if a.label in options.arms) if options.arms \
            else DEFAULT_SANITIZER_ARMS
        rows = part_sanitizer(options.out, options.sanitizer_minutes, options.repeats,
                              options.jobs, arms)
        report.append(table(rows, ["run", "state", "status", "detail"]))
        # The kernel log's rows are context (a fault there is in some run's row too).
        failed |= any(row[2] not in ("exit 0", f"0 of {options.repeats} did not exit 0")
                      for row in rows if row[0] != KERNEL_LOG)
    text = "\n\n".join(report)
    print(text)
    (options.out / "gpu_sweep.txt").write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
