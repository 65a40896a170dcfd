"""What this machine offers (platform, devices, compute capability, frameworks), and whether
an implementation or case can run here, with the reason when not."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util

from kernels.core import registry


@dataclasses.dataclass(frozen=True)
class Machine:
    platform: str  # JAX's default backend: "gpu" or "cpu"
    device_kind: str  # e.g. "NVIDIA H100 80GB HBM3", or "cpu"
    device_count: int
    compute_capability: tuple[int, int] | None

    @property
    def has_gpu(self) -> bool:
        return self.platform == "gpu"

    def describe(self) -> str:
        cc = f", sm_{self.compute_capability[0]}{self.compute_capability[1]}" \
            if self.compute_capability else ""
        return f"{self.device_count} x {self.device_kind} ({self.platform}{cc})"


@functools.cache
def this_machine() -> Machine:
    import jax

    devices = jax.devices()
    first = devices[0]
    capability = None
    if first.platform == "gpu" and getattr(first, "compute_capability", None):
        major, minor = str(first.compute_capability).split(".")[:2]
        capability = (int(major), int(minor))
    return Machine(platform=first.platform, device_kind=first.device_kind,
                   device_count=len(devices), compute_capability=capability)


@functools.cache
def module_available(name: str) -> bool:
    # Cached: collection asks it for every (implementation, case) pair, and a module that is
    # not imported yet (torch, which loading the registry leaves alone) is searched for on
    # the whole path each time.
    return importlib.util.find_spec(name) is not None


def unavailable_reason(impl: registry.Implementation, machine: Machine | None = None) -> str | None:
    """None if `impl` can run on this machine, else why not (naming what it needs)."""
    machine = machine or this_machine()
    needs = impl.requires
    missing = [m for m in needs.modules if not module_available(m)]
    if missing:
        return f"needs Python module(s) {', '.join(missing)}; not installed"
    if needs.gpu and not machine.has_gpu:
        return f"needs a CUDA GPU ({needs.describe()}); this machine has {machine.describe()}"
    if needs.min_compute_capability and machine.compute_capability \
            and machine.compute_capability < needs.min_compute_capability:
        major, minor = needs.min_compute_capability
        return f"needs compute capability >= {major}.{minor}; this machine has {machine.describe()}"
    if needs.devices > machine.device_count:
        return f"needs {needs.devices} devices; this machine has {machine.describe()}"
    return None


def case_unavailable_reason(impl: registry.Implementation, case: registry.Case,
                            machine: Machine | None = None) -> str | None:
    """None if `impl` can run `case` here: real-size ("gpu") cases need a GPU."""
    machine = machine or this_machine()
    reason = unavailable_reason(impl, machine) or impl.supports(case)
    if reason:
        return reason
    if impl.devices_for(case) > machine.device_count:
        return (f"needs {impl.devices_for(case)} devices for {case.id}; this machine has "
                f"{machine.describe()}")
    if not machine.has_gpu and "cpu" not in case.tags:
        return (f"needs a CUDA GPU: {case.id} is a real-size case; without a GPU only "
                f"'cpu'-tagged cases run (interpreted)")
    return None
