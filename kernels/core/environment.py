"""Process-wide settings that must be made before JAX or Triton is imported.

Call `configure()` first thing (conftest.py, the CLI and the asv benchmarks do).
It decides, without importing any framework, whether this machine has an NVIDIA
GPU, and if not: Triton runs in its interpreter and JAX exposes 8 host devices
for sharding. Everywhere, JAX allocates GPU memory on demand.
"""

from __future__ import annotations

import glob
import os

HOST_DEVICE_COUNT = 8
FORCE_CPU_VARIABLE = "KERNELPERF_FORCE_CPU"
# Set by `python -m kernels bench` for asv's benchmark processes: perf_tests/benchmarks.py then
# defines (so records) the dashboard metrics (kernels.bench.asv_tools, kernels.bench.recover).
DASHBOARD_VARIABLE = "KERNELPERF_DASHBOARD_METRICS"


def nvidia_gpu_present() -> bool:
    """Whether the NVIDIA driver exposes a GPU, checked without importing CUDA libraries."""
    if os.environ.get(FORCE_CPU_VARIABLE, "") not in ("", "0"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or bool(glob.glob("/proc/driver/nvidia/gpus/*"))


def nvidia_gpu_count() -> int:
    """NVIDIA GPUs this process may use, counted without importing CUDA libraries (which a
    parent that spawns one process per GPU must not hold): the driver's list, narrowed by
    CUDA_VISIBLE_DEVICES when it is set; 0 without a GPU (or with KERNELPERF_FORCE_CPU)."""
    if not nvidia_gpu_present():
        return 0
    present = len(glob.glob("/proc/driver/nvidia/gpus/*")) or len(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    return min(present, len([part for part in visible.split(",") if part.strip()]))


def configure() -> None:
    """Set TRITON_INTERPRET, XLA_FLAGS, JAX's allocation mode and, in an xdist worker, the
    host libraries' threads for this machine; idempotent."""
    # torch shares the GPU with JAX throughout the suite (baselines, Triton and CUDA kernels),
    # and every xdist worker is a JAX process: JAX's default, 75% of the GPU reserved per
    # process, would starve them. A value the user set is kept.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if not nvidia_gpu_present():
        # Read by triton at import time: it must be set before anything imports triton.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        # A CPU JAX otherwise has no CUDA backend to probe; keep it from trying.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flag = f"--xla_force_host_platform_device_count={HOST_DEVICE_COUNT}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    # xdist workers share the cores: NumPy's OpenBLAS and torch's OpenMP would each start a
    # thread per core in every worker, and on 2 cores two workers' threads waited on each
    # other (a 64k-element float64 dot took 63 us with two threads, 10 us with one; the kernel
    # checks of softmax and matmul in two processes side by side took 17% more CPU, 21% with
    # torch's). Read when NumPy and torch load, so set before either; a value the user set is
    # kept, and a run without workers (or outside pytest) keeps the libraries' defaults.
    workers = xdist_workers()
    if workers > 1:
        for variable in HOST_THREAD_VARIABLES:
            os.environ.setdefault(variable, str(max(1, cpu_count() // workers)))


# The thread counts of NumPy's BLAS and of OpenMP (torch's CPU threads), per xdist worker.
HOST_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")

# Names the xdist worker the perf items run on (kernels/testing/perf_phase.py sets it for the
# workers it starts; conftest.py reads it before JAX starts, to choose that worker's allocator).
PERF_WORKER_VARIABLE = "KERNELPERF_PERF_WORKER"


def device_shared() -> bool:
    """True in an xdist worker whose device work runs beside other workers' (every worker of a
    run but the perf items' own, kernels/testing/perf_phase.py): what it times, it times under
    their load."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return bool(worker) and xdist_workers() > 1 and worker != os.environ.get(PERF_WORKER_VARIABLE)


def xdist_workers() -> int:
    """Processes of this pytest run sharing the machine: its xdist workers, or 1."""
    return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
