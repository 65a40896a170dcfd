"""How the kernel tests share a machine: device-memory estimates per case, xdist groups, and
how many workers one GPU can hold.

Every check of a case needs the same inputs and reference (kernels.core.checking's cache), so
the items of one case form one xdist group (`--dist loadgroup` sends a group to one
worker) and run back to back. JAX's allocator never hands memory back to the device, so
a worker keeps the peak of the largest item it ran: the few cases whose reference needs
tens of GiB (real-size attention) all go to one group, hence one worker, and the worker
count is what the GPU holds with that worker at its peak and every other worker at the
peak of the largest remaining case. Items over several devices form one group too, so
two of them never share the GPUs at once; every other item marked `multi_gpu` (the sharded
tests, the collectives) takes `several_devices_held`, a lock the workers share, for the
same reason: NCCL runs the collectives of two processes' communicators on the same GPUs in
no agreed order, and such work can wait on itself forever (NCCL's user guide, "Using
multiple NCCL communicators concurrently").

Workers allocate with JAX's platform allocator (conftest.py), which hands memory
back as arrays die. The perf items (they time the device) run on a worker of their own, on
the device alone once the other workers are done (kernels/testing/perf_phase.py); where the
run may select them, the plan keeps room for that worker at the peak of the largest perf
case (`perf_bytes`) or of the largest light group, whichever is more, beside the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import tempfile
from collections.abc import Iterator

from kernels.core import devices, dtypes, environment, fingerprint, registry

HEAVY_GROUP = "gpu-memory-heavy"
MULTI_DEVICE_GROUP = "several-devices"
# A case whose estimate passes this goes to the heavy group.
HEAVY_BYTES = 12 * 2**30
# Share of the GPU the workers may fill together: CUDA contexts, cuBLAS/cuDNN workspaces
# and fragmentation of the allocators' pools take the rest.
CAPACITY_FRACTION = 0.85
# CUDA context, cuBLAS and cuDNN handles of the JAX and torch in one worker process.
CONTEXT_BYTES = 1.5 * 2**30
MAX_WORKERS = 8
WORKERS_VARIABLE = "KERNELPERF_TEST_WORKERS"
# Set, to the holder's pid, while a process holds several_devices_held: its children inherit it.
HELD_VARIABLE = "KERNELPERF_SEVERAL_DEVICES_HELD"
# Float32 copies of what the backward touches, alive together at a check's peak: the
# reference (jitted forward, VJP, magnitudes), the implementation's output and gradients,
# the cached reference and the pristine inputs.
COPIES = 4
# What a perf item holds at its peak, in copies of the bytes the backward moves (case dtype):
# the placed inputs, the forward's output and residuals, the cotangent and the gradients
# (kernels.core.timing.prepare), plus the L2 flush buffer's few tens of MiB.
PERF_COPIES = 3


@contextlib.contextmanager
def several_devices_held(directory: str | None = None) -> Iterator[None]:
    """Hold this user's lock on the machine's GPUs while the body runs (an exclusive flock
    on a file in `directory`, the temporary directory by default): one process at a time
    runs work over several devices. The kernel closes the file, hence frees the lock, when
    a process dies holding it. A process started by the holder (HELD_VARIABLE in its
    environment: a child pytest, say) runs without taking it, where waiting would be for
    its own parent."""
    if os.environ.get(HELD_VARIABLE):
        yield
        return
    path = os.path.join(directory or tempfile.gettempdir(),
                        f"kernelperf-several-devices-{os.getuid()}.lock")
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        os.environ[HELD_VARIABLE] = str(os.getpid())
        try:
            yield
        finally:
            os.environ.pop(HELD_VARIABLE, None)
            fcntl.flock(handle, fcntl.LOCK_UN)


def estimated_bytes(op: registry.Operation, case: registry.Case) -> float:
    """Device bytes one check of `case` may hold at its peak.

    COPIES float32 copies of the bytes the backward moves (inputs, output, cotangent,
    gradients: the work model's "bwd" bytes, rescaled from the case dtype to float32), plus
    what the reference holds beyond them (`Operation.reference_bytes`).
    """
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    base = COPIES * op.work(case, "bwd").bytes * 4 / itemsize
    return base + (op.reference_bytes(case) if op.reference_bytes else 0.0)


def group(op: registry.Operation, impl: registry.Implementation, case: registry.Case,
          machine: devices.Machine) -> str:
    """The xdist group of the items of (impl, case): the case, or one of the shared groups."""
    if machine.has_gpu:
        if impl.devices_for(case) > 1:
            return MULTI_DEVICE_GROUP
        if estimated_bytes(op, case) > HEAVY_BYTES:
            return HEAVY_GROUP
    return f"{op.name}-{case.id}"


def perf_bytes(op: registry.Operation, case: registry.Case) -> float:
    """Device bytes a perf item of `case` may hold at its peak: PERF_COPIES times what the
    backward moves, in the case's dtype (no float32 reference: perf items time, not check)."""
    return PERF_COPIES * op.work(case, "bwd").bytes


@dataclasses.dataclass(frozen=True)
class Plan:
    """The worker count for a GPU of `gpu_bytes`, and why. `workers` run the kernel checks;
    with `perf_bytes` the plan also keeps room for the perf items' own worker (one more)."""

    workers: int
    gpu_bytes: int
    heavy_bytes: float  # the largest estimate in the heavy group (0 if none)
    light_bytes: float  # the largest estimate outside it
    cpus: int
    perf_bytes: float = 0.0  # the largest perf case's peak; 0: no room kept for a perf worker

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers: expected >= 1, got {self.workers}")

    def describe(self) -> str:
        return (f"{self.workers} xdist workers for a {self.gpu_bytes / 2**30:.0f} GiB GPU: one may "
                f"hold {self.heavy_bytes / 2**30:.1f} GiB (the heavy group), the others "
                f"{self.light_bytes / 2**30:.1f} GiB each, plus "
                f"{CONTEXT_BYTES / 2**30:.1f} GiB of context per process, within "
                f"{CAPACITY_FRACTION:.0%}{self._perf()}; {self.cpus} CPUs")

    def _perf(self) -> str:
        if not self.perf_bytes:
            return ""
        return (f", beside one more worker for the perf items (up to "
                f"{max(self.perf_bytes, self.light_bytes) / 2**30:.1f} GiB)")


def plan(gpu_bytes: int, estimates: list[tuple[str, float]], cpus: int,
         perf: float = 0.0) -> Plan:
    """Workers that fit `gpu_bytes` given (group, estimated bytes) of the runnable items:
    one worker at the heavy group's peak, the rest at the largest other estimate, each
    with its context; at most half the CPUs (compiles run on them) and MAX_WORKERS. `perf`
    (the largest perf case's peak, `perf_bytes`): room kept first for the perf worker, at
    that peak or the largest light estimate (it may get light work where no perf item
    is selected), whichever is more."""
    heavy = max((b for g, b in estimates if g == HEAVY_GROUP), default=0.0)
    light = max((b for g, b in estimates if g != HEAVY_GROUP), default=0.0)
    capacity = CAPACITY_FRACTION * gpu_bytes
    if perf:
        capacity -= max(perf, light) + CONTEXT_BYTES
    if heavy:
        capacity -= heavy + CONTEXT_BYTES
    by_memory = (1 if heavy else 0) + max(0, math.floor(capacity / (light + CONTEXT_BYTES)))
    workers = max(1, min(by_memory, max(1, cpus // 2), MAX_WORKERS))
    return Plan(workers=workers, gpu_bytes=gpu_bytes, heavy_bytes=heavy, light_bytes=light,
                cpus=cpus, perf_bytes=perf)


def runnable_estimates(machine: devices.Machine) -> list[tuple[str, float]]:
    """(group, estimated bytes) of every registered (implementation, case) this machine runs."""
    estimates = []
    for op in registry.operations():
        for impl in registry.implementations(op.name):
            for case in op.cases:
                if devices.case_unavailable_reason(impl, case, machine) is None:
                    estimates.append((group(op, impl, case, machine), estimated_bytes(op, case)))
    return estimates


def perf_estimate(machine: devices.Machine) -> float:
    """The largest `perf_bytes` over the operations' bench cases on this platform."""
    platform = "gpu" if machine.has_gpu else "cpu"
    return max((perf_bytes(op, case) for op in registry.operations()
                for case in registry.bench_cases(op, platform)), default=0.0)


def auto_workers(machine: devices.Machine, perf: bool = False) -> Plan | None:
    """The plan for this GPU machine (`perf`: with room for the perf items' worker); None
    without a GPU or where its memory is unknown."""
    if not machine.has_gpu:
        return None
    total = fingerprint.gpu_memory_bytes()
    if total is None:
        return None
    return plan(total, runnable_estimates(machine), environment.cpu_count(),
                perf=perf_estimate(machine) if perf else 0.0)
