"""Device identity carried by every result: model, driver, library versions, clocks.

`fingerprint()` describes the device the timed code runs on (GPU 0 as CUDA
numbers it, or the CPU), read once per process: normalised model name (the key
results and ceilings are kept under), SM count, memory, L2 size, driver, CUDA
and jax/jaxlib/torch/triton versions, and the default SM clock. `read_clocks()`
reads what changes while measuring (SM and memory clocks, temperature) through
NVML (nvidia-ml-py); the timing module reads it around every batch of samples
so a throttled sample is flagged, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from typing import Any

from kernels.core import environment

# A sample taken while the SM clock ran below this fraction of its default
# (application) clock is flagged as throttled.
THROTTLE_FRACTION = 0.85


def normalise(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`; CPU names lose (R), (TM) and `@ GHz`."""
    text = re.sub(r"\((r|tm)\)", " ", name.lower())
    text = re.sub(r"\bcpu\b|@.*$", " ", text)
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown"


@dataclasses.dataclass(frozen=True)
class Clocks:
    """SM and memory clocks (MHz) and temperature (C) at one moment; None where unknown."""

    sm_mhz: int | None = None
    memory_mhz: int | None = None
    temperature_c: int | None = None


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What a result was measured on; two results are comparable only if these agree."""

    platform: str  # "gpu" or "cpu"
    name: str  # as the driver (or /proc/cpuinfo) reports it
    model: str  # normalised `name`: the key for results and ceilings
    sm_count: int | None
    memory_bytes: int | None
    l2_bytes: int | None
    compute_capability: str | None
    driver: str | None
    cuda: str | None
    default_sm_mhz: int | None  # default application clock; throttling is judged against it
    max_sm_mhz: int | None
    versions: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        if self.platform == "gpu":
            memory = f"{self.memory_bytes / 2**30:.0f} GiB" if self.memory_bytes else "?"
            return (f"{self.name} ({self.sm_count} SMs, {memory}, sm_{self.compute_capability}, "
                    f"driver {self.driver}, CUDA {self.cuda})")
        return f"{self.name} ({os.cpu_count()} threads)"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["versions"] = dict(self.versions)
        return out

    def is_throttled(self, clocks: Clocks | None) -> bool:
        """Whether the SM clock in `clocks` is well under the default clock."""
        if clocks is None or clocks.sm_mhz is None or not self.default_sm_mhz:
            return False
        return clocks.sm_mhz < THROTTLE_FRACTION * self.default_sm_mhz


def _versions() -> tuple[tuple[str, str], ...]:
    found = []
    for package in ("jax", "jaxlib", "torch", "triton", "numpy"):
        try:
            found.append((package, importlib.metadata.version(package)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return tuple(found)


@functools.cache
def _nvml():
    """The pynvml module, initialised; None without a GPU or nvidia-ml-py."""
    if not environment.nvidia_gpu_present():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver library, or nvidia-ml-py not installed
        return None
    return pynvml


@functools.cache
def _handle():
    """NVML handle of CUDA device 0 (NVML ignores CUDA_VISIBLE_DEVICES: match by UUID)."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(0).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode())
    except Exception:  # torch missing or too old to report a UUID
        return nvml.nvmlDeviceGetHandleByIndex(0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu_properties() -> dict[str, Any]:
    """SM count, L2 size, compute capability: from torch where it is installed, else JAX."""
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return {"sm_count": props.multi_processor_count,
                    "l2_bytes": getattr(props, "L2_cache_size", None),
                    "compute_capability": f"{props.major}{props.minor}",
                    "memory_bytes": props.total_memory, "name": props.name}
    except ImportError:
        pass
    import jax

    device = jax.devices()[0]
    capability = str(getattr(device, "compute_capability", "")).replace(".", "") or None
    return {"sm_count": getattr(device, "core_count", None), "l2_bytes": None,
            "compute_capability": capability, "memory_bytes": None, "name": device.device_kind}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


@functools.cache
def fingerprint() -> Fingerprint:
    """This process's device (GPU 0, or the CPU), read once."""
    versions = _versions()
    if not environment.nvidia_gpu_present():
        name = _cpu_name()
        return Fingerprint("cpu", name, normalise(name), None, None, None, None, None, None, None,
                           None, versions)
    props = _gpu_properties()
    nvml, handle = _nvml(), _handle()
    name, driver, cuda, default_mhz, max_mhz = props["name"], None, None, None, None
    memory = props["memory_bytes"]
    if handle is not None:
        name = _text(nvml.nvmlDeviceGetName(handle))
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        version = nvml.nvmlSystemGetCudaDriverVersion()
        cuda = f"{version // 1000}.{version % 1000 // 10}"
        memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
        default_mhz = _nvml_call(nvml.nvmlDeviceGetDefaultApplicationsClock, handle,
                                 nvml.NVML_CLOCK_SM)
        max_mhz = _nvml_call(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM)
    return Fingerprint("gpu", name, normalise(name), props["sm_count"], memory, props["l2_bytes"],
                       props["compute_capability"], driver, cuda, default_mhz, max_mhz, versions)


@dataclasses.dataclass(frozen=True)
class Identity:
    """What names a machine for asv: the device model and the keys every result carries."""

    platform: str
    name: str
    model: str
    driver: str | None
    cuda: str | None
    default_sm_mhz: int | None
    devices: int = 1  # GPUs visible to this process (CUDA_VISIBLE_DEVICES respected)


def _nvml_index_handle(nvml):
    """NVML handle of the first visible GPU, read without starting CUDA (asv's own process
    names the machine and must stay light): CUDA_VISIBLE_DEVICES's first entry, by index or
    UUID, else GPU 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith("GPU-"):
        return nvml.nvmlDeviceGetHandleByUUID(first.encode())
    return nvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)


@functools.cache
def identity() -> Identity:
    """This machine's device model, driver, CUDA and default clock, through NVML alone (no
    torch, no CUDA context); falls back to `fingerprint()` where NVML cannot be read."""
    if not environment.nvidia_gpu_present():
        name = _cpu_name()
        return Identity("cpu", name, normalise(name), None, None, None)
    nvml = _nvml()
    try:
        handle = _nvml_index_handle(nvml)
        name = _text(nvml.nvmlDeviceGetName(handle))
        version = nvml.nvmlSystemGetCudaDriverVersion()
        return Identity("gpu", name, normalise(name), _text(nvml.nvmlSystemGetDriverVersion()),
                        f"{version // 1000}.{version % 1000 // 10}",
                        _nvml_call(nvml.nvmlDeviceGetDefaultApplicationsClock, handle,
                                   nvml.NVML_CLOCK_SM), environment.nvidia_gpu_count())
    except Exception:  # no NVML (nvidia-ml-py missing) or an unexpected board
        full = fingerprint()
        return Identity(full.platform, full.name, full.model, full.driver, full.cuda,
                        full.default_sm_mhz)


def gpu_memory_bytes() -> int | None:
    """Total memory of the first visible GPU, without starting CUDA: from NVML, else
    nvidia-smi; None where neither answers (no GPU)."""
    nvml = _nvml()
    if nvml is not None:
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(_nvml_index_handle(nvml)).total)
        except Exception:  # an unexpected board: ask the command line
            pass
    if environment.nvidia_gpu_present() and shutil.which("nvidia-smi"):
        try:
            text = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                 "--id=0"], capture_output=True, text=True, timeout=30, check=True).stdout
            return int(float(text.split()[0])) * 2**20
        except (subprocess.SubprocessError, ValueError, IndexError, OSError):
            pass
    return None


def _nvml_call(fn, *args) -> int | None:
    try:
        return int(fn(*args))
    except Exception:  # not supported on this board (NVML raises NVMLError_NotSupported)
        return None


def read_clocks() -> Clocks | None:
    """SM and memory clocks and temperature of the measured GPU now; None on CPU or without NVML."""
    nvml, handle = _nvml(), _handle()
    if handle is None:
        return None
    return Clocks(_nvml_call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                  _nvml_call(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
                  _nvml_call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU))
