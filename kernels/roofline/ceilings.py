"""Ceilings per device model: datasheet peaks, and peaks measured on the device.

Datasheet entries are keyed by the exact name the driver reports (NVML /
`nvidia-smi` / `jax.Device.device_kind`), because SXM and PCIe boards of one
chip differ (H100 SXM: 3.35 TB/s HBM3; H100 PCIe: 2.0 TB/s HBM2e). Every
FLOP/s figure is the dense rate; where a datasheet's headline is the 2:4
structured-sparsity rate it is kept beside it as `sparse` and halved for
`dense`. Audited against the public tables' known errors: the H100 SXM's
bandwidth is 3.35 TB/s (2.0 TB/s is the PCIe board), its dense tf32 rate is
494.7 TFLOP/s (156 is the A100's), and the L4 moves 300 GB/s (not 3.35 TB/s).

Measured ceilings: a large copy done by a kernel (bytes read + written per
second) and a large matrix product per dtype, each the best of torch and XLA,
timed by `kernels.core.timing` with the clock the points are timed by (CUPTI on a
GPU: a cudaMemcpy is no kernel to it, and ceilings timed by CUDA events read
low enough that products sat at 114-117% of them), and cached per device model
in `$KERNELPERF_CACHE/ceilings/<model>.json` (default `~/.cache/kernelperf`),
with the method; a cache taken by another method is measured again. Where a machine has
no cache, the ceilings the repository ships for its model (`kernels/models/<model>/`,
written by `python -m kernels bringup`) are used, if timed by the same clock. A CPU
gets measured ceilings too, so the roofline works on any machine; a GPU with
no datasheet entry works on measured ceilings alone, with a warning.

dtypes: "f64", "f32" (FP32 FMA, no tensor cores), "tf32", "bf16", "f16",
"fp8". The compute roof for f32 data is the tf32 tensor-core peak where the
device has one, since XLA and Triton multiply f32 in tf32 by default (the
FFMA peak is kept as "f32" in the table and plotted).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import sys
import warnings
from typing import Any

from kernels.core import fingerprint as fingerprint_module
from kernels.core import modeldata

T = 1e12


@dataclasses.dataclass(frozen=True)
class Peak:
    """A datasheet compute rate: dense FLOP/s, and the sparse headline where one is printed."""

    dense: float
    sparse: float | None = None


def _sparse(headline_tflops: float) -> Peak:
    """A datasheet figure quoted with 2:4 sparsity: the dense rate is half of it."""
    return Peak(dense=headline_tflops * T / 2, sparse=headline_tflops * T)


def _dense(tflops: float) -> Peak:
    return Peak(dense=tflops * T)


@dataclasses.dataclass(frozen=True)
class DatasheetEntry:
    bandwidth: float  # bytes/s
    peaks: dict[str, Peak]
    source: str


# Hopper (H100 SXM5 / PCIe): NVIDIA H100 Tensor Core GPU datasheet and the
# Hopper architecture whitepaper (table "H100 SXM5 / PCIe"); tensor rates
# printed with sparsity there ("* with sparsity").
_H100_SXM = DatasheetEntry(
    bandwidth=3.35e12,  # datasheet: 3.35 TB/s HBM3 (H100 SXM 80GB)
    peaks={
        "f64": _dense(33.5),  # datasheet FP64 34 TFLOPS (whitepaper 33.5)
        "f32": _dense(66.9),  # datasheet FP32 67 TFLOPS (whitepaper 66.9)
        "tf32": _sparse(989.4),  # datasheet TF32 Tensor Core 989 TFLOPS* -> 494.7 dense
        "bf16": _sparse(1978.9),  # datasheet BF16 Tensor Core 1,979 TFLOPS* -> 989.4 dense
        "f16": _sparse(1978.9),  # datasheet FP16 Tensor Core 1,979 TFLOPS* -> 989.4 dense
        "fp8": _sparse(3957.8),  # datasheet FP8 Tensor Core 3,958 TFLOPS* -> 1978.9 dense
    },
    source="NVIDIA H100 datasheet (SXM column); Hopper whitepaper",
)
_H100_PCIE = DatasheetEntry(
    bandwidth=2.0e12,  # datasheet: 2 TB/s HBM2e (H100 PCIe 80GB)
    peaks={
        "f64": _dense(25.6),  # datasheet FP64 26 TFLOPS (whitepaper 25.6)
        "f32": _dense(51.2),  # datasheet FP32 51 TFLOPS (whitepaper 51.2)
        "tf32": _sparse(756.0),  # datasheet TF32 756 TFLOPS* -> 378 dense
        "bf16": _sparse(1513.0),  # datasheet BF16 1,513 TFLOPS* -> 756.5 dense
        "f16": _sparse(1513.0),  # datasheet FP16 1,513 TFLOPS* -> 756.5 dense
        "fp8": _sparse(3026.0),  # datasheet FP8 3,026 TFLOPS* -> 1513 dense
    },
    source="NVIDIA H100 datasheet (PCIe column); Hopper whitepaper",
)
# H200 SXM: same GH100 compute as the H100 SXM, HBM3e memory.
_H200 = DatasheetEntry(
    bandwidth=4.8e12,  # H200 datasheet: 4.8 TB/s HBM3e (141 GB)
    peaks={
        "f64": _dense(34.0),  # datasheet FP64 34 TFLOPS
        "f32": _dense(67.0),  # datasheet FP32 67 TFLOPS
        "tf32": _sparse(989.0),  # datasheet TF32 989 TFLOPS* -> 494.5 dense
        "bf16": _sparse(1979.0),  # datasheet BF16 1,979 TFLOPS* -> 989.5 dense
        "f16": _sparse(1979.0),  # datasheet FP16 1,979 TFLOPS* -> 989.5 dense
        "fp8": _sparse(3958.0),  # datasheet FP8 3,958 TFLOPS* -> 1979 dense
    },
    source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)",
)
# Ampere A100: NVIDIA A100 datasheet; tensor rates printed as dense | sparse*.
_A100_PEAKS = {
    "f64": _dense(9.7),  # datasheet FP64 9.7 TFLOPS (19.5 with FP64 tensor cores)
    "f32": _dense(19.5),  # datasheet FP32 19.5 TFLOPS
    "tf32": _sparse(312.0),  # datasheet TF32 156 | 312* TFLOPS
    "bf16": _sparse(624.0),  # datasheet BF16 312 | 624* TFLOPS
    "f16": _sparse(624.0),  # datasheet FP16 312 | 624* TFLOPS
}
_A100_SOURCE = "NVIDIA A100 Tensor Core GPU datasheet"
# Ada: NVIDIA L4 / L40S datasheets (tensor rates printed with sparsity*).
_L4 = DatasheetEntry(
    bandwidth=300e9,  # datasheet: 300 GB/s GDDR6 (24 GB)
    peaks={
        "f32": _dense(30.3),  # datasheet FP32 30.3 TFLOPS
        "tf32": _sparse(120.0),  # datasheet TF32 120 TFLOPS* -> 60 dense
        "bf16": _sparse(242.0),  # datasheet BF16 242 TFLOPS* -> 121 dense
        "f16": _sparse(242.0),  # datasheet FP16 242 TFLOPS* -> 121 dense
        "fp8": _sparse(485.0),  # datasheet FP8 485 TFLOPS* -> 242.5 dense
    },
    source="NVIDIA L4 Tensor Core GPU datasheet",
)
_L40S = DatasheetEntry(
    bandwidth=864e9,  # datasheet: 864 GB/s GDDR6 (48 GB)
    peaks={
        "f32": _dense(91.6),  # datasheet FP32 91.6 TFLOPS
        "tf32": _sparse(366.0),  # datasheet TF32 183 | 366* TFLOPS
        "bf16": Peak(362.05 * T, 733.0 * T),  # datasheet BF16 362.05 | 733* TFLOPS
        "f16": Peak(362.05 * T, 733.0 * T),  # datasheet FP16 362.05 | 733* TFLOPS
        "fp8": _sparse(1466.0),  # datasheet FP8 733 | 1,466* TFLOPS
    },
    source="NVIDIA L40S datasheet",
)
# GeForce RTX 4090: Ada Lovelace architecture whitepaper, appendix table
# (dense / sparse). GeForce boards run FP16/BF16 with FP32 accumulation at half
# the FP16-accumulate rate; kernels accumulate in FP32, so those are the rates here.
_RTX_4090 = DatasheetEntry(
    bandwidth=1008e9,  # whitepaper: 1008 GB/s GDDR6X (24 GB, 21 Gbps x 384 bit)
    peaks={
        "f32": _dense(82.6),  # whitepaper: peak FP32 82.6 TFLOPS
        "tf32": _sparse(165.2),  # whitepaper: TF32 tensor 82.6 / 165.2
        "bf16": _sparse(330.4),  # whitepaper: BF16 (FP32 accumulate) 165.2 / 330.4
        "f16": _sparse(330.4),  # whitepaper: FP16 (FP32 accumulate) 165.2 / 330.4
        "fp8": _sparse(1321.2),  # whitepaper: FP8 (FP32 accumulate) 660.6 / 1321.2
    },
    source="NVIDIA Ada Lovelace GPU architecture whitepaper, RTX 4090 column",
)
# RTX 4000 Ada Generation: the datasheet gives FP32 and one tensor figure,
# 327.6 TFLOPS, the FP8 rate with sparsity; the others follow from Ada's
# tensor-core ratios (FP8 = 2x FP16/BF16 = 4x TF32), full-rate FP32 accumulation
# on professional boards.
_RTX_4000_ADA = DatasheetEntry(
    bandwidth=360e9,  # datasheet: 360 GB/s GDDR6 (20 GB, 160 bit)
    peaks={
        "f32": _dense(26.7),  # datasheet: single precision 26.7 TFLOPS
        "fp8": _sparse(327.6),  # datasheet: tensor performance 327.6 TFLOPS* -> 163.8 dense
        "bf16": _sparse(163.8),  # derived: half the FP8 rate -> 81.9 dense
        "f16": _sparse(163.8),  # derived: half the FP8 rate -> 81.9 dense
        "tf32": _sparse(81.9),  # derived: a quarter of the FP8 rate -> 41.0 dense
    },
    source="NVIDIA RTX 4000 Ada Generation datasheet (tensor rates derived, see comment)",
)
# B200 (HGX B200, per GPU: the 8-GPU board's figures divided by 8; printed with sparsity*).
_B200 = DatasheetEntry(
    bandwidth=8.0e12,  # datasheet: 64 TB/s HBM3e per HGX B200 board -> 8 TB/s per GPU
    peaks={
        "f64": _dense(37.0),  # HGX B200 FP64 296 TFLOPS / 8
        "f32": _dense(75.0),  # HGX B200 FP32 600 TFLOPS / 8
        "tf32": _sparse(2250.0),  # HGX B200 TF32 18 PFLOPS* / 8 -> 1.125 PFLOPS dense
        "bf16": _sparse(4500.0),  # HGX B200 FP16/BF16 36 PFLOPS* / 8 -> 2.25 PFLOPS dense
        "f16": _sparse(4500.0),  # HGX B200 FP16/BF16 36 PFLOPS* / 8 -> 2.25 PFLOPS dense
        "fp8": _sparse(9000.0),  # HGX B200 FP8 72 PFLOPS* / 8 -> 4.5 PFLOPS dense
    },
    source="NVIDIA HGX B200 datasheet, per GPU",
)

# Keyed by the exact name the driver reports.
DATASHEET: dict[str, DatasheetEntry] = {
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H200": _H200,
    "NVIDIA A100-SXM4-40GB": DatasheetEntry(1555e9, _A100_PEAKS,  # datasheet 1,555 GB/s HBM2
                                            _A100_SOURCE + " (40GB SXM)"),
    "NVIDIA A100-SXM4-80GB": DatasheetEntry(2039e9, _A100_PEAKS,  # datasheet 2,039 GB/s HBM2e
                                            _A100_SOURCE + " (80GB SXM)"),
    "NVIDIA A100-PCIE-40GB": DatasheetEntry(1555e9, _A100_PEAKS,  # datasheet 1,555 GB/s HBM2
                                            _A100_SOURCE + " (40GB PCIe)"),
    "NVIDIA A100 80GB PCIe": DatasheetEntry(1935e9, _A100_PEAKS,  # datasheet 1,935 GB/s HBM2e
                                            _A100_SOURCE + " (80GB PCIe)"),
    "NVIDIA L4": _L4,
    "NVIDIA L40S": _L40S,
    "NVIDIA GeForce RTX 4090": _RTX_4090,
    "NVIDIA RTX 4000 Ada Generation": _RTX_4000_ADA,
    "NVIDIA B200": _B200,
}


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """The roofs of one device: memory bandwidth and dense compute peak per dtype."""

    device: str
    kind: str  # "datasheet" or "measured"
    bandwidth: float  # bytes/s
    flops: dict[str, float]  # dtype -> FLOP/s
    source: str = ""
    method: str | None = None  # the clock measured ceilings were timed by

    def peak(self, dtype: str) -> float:
        """Compute roof for data of `dtype` (f32: the tf32 peak where there is one)."""
        chain = {"f32": ("tf32", "f32"), "tf32": ("tf32", "f32")}.get(dtype, (dtype,))
        for key in (*chain, "f32"):
            if key in self.flops:
                return self.flops[key]
        raise KeyError(f"dtype: {self.kind} ceilings of {self.device} have no peak for "
                       f"{dtype!r} nor f32; they have {sorted(self.flops)}")

    def scaled(self, devices: int) -> Ceiling:
        """The roofs of `devices` such devices together."""
        if devices == 1:
            return self
        return dataclasses.replace(self, bandwidth=self.bandwidth * devices,
                                   flops={k: v * devices for k, v in self.flops.items()},
                                   device=f"{devices} x {self.device}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ceiling:
        return cls(**data)


def datasheet(name: str) -> Ceiling | None:
    """Dense datasheet ceilings for the exact driver name, or None if not in the table."""
    entry = DATASHEET.get(name)
    if entry is None:
        return None
    return Ceiling(device=name, kind="datasheet", bandwidth=entry.bandwidth,
                   flops={dtype: peak.dense for dtype, peak in entry.peaks.items()},
                   source=entry.source)


def cache_path(model: str) -> pathlib.Path:
    root = pathlib.Path(os.environ.get("KERNELPERF_CACHE",
                                       pathlib.Path.home() / ".cache" / "kernelperf"))
    return root / "ceilings" / f"{model}.json"


# What the measured ceilings time, per platform: copy size and product sizes per dtype.
GPU_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 1 << 26
GPU_MATMUL = {"bf16": 8192, "f16": 8192, "tf32": 8192, "f32": 8192}
CPU_MATMUL = {"f32": 1024}
# Sampling time per candidate. On a CPU the host clock never converges to the rule's 0.5%
# (every candidate runs to its budget), and a quarter second is still dozens of copies and
# at least five products, a median well inside the CPU's run-to-run spread: at 1 s a fresh
# home's first roofline spent 7 CPU-s here (2 cores), and `make test` measured them four times
# (fresh homes of the README check and of three end-to-end tests).
GPU_BUDGET_S = 3.0
CPU_BUDGET_S = 0.25


def _copy_kernels(nbytes: int, where: str) -> list[tuple[str, Any, str, tuple]]:
    """(label, callable, framework, arguments) for copies done by a kernel: torch's
    elementwise negation and XLA's, each reading and writing `nbytes`."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32, device=where)
    dst = torch.empty_like(src)
    candidates = [("torch neg", functools.partial(torch.neg, src, out=dst), "torch", ())]
    try:
        import jax.numpy as jnp

        candidates.append(("xla neg", jnp.negative, "jax",
                           (jnp.ones(nbytes // 4, jnp.float32),)))
    except ImportError:
        pass
    return candidates


def _products(dtype: str, size: int, where: str) -> list[tuple[str, Any, str, tuple]]:
    """(label, callable, framework, arguments) for a size^3 product in `dtype`: torch's,
    and XLA's for the 16-bit types (whose precision both take the same way)."""
    import torch

    torch_dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "tf32": torch.float32,
                    "f32": torch.float32}
    a = torch.randn(size, size, device=where).to(torch_dtypes[dtype])
    b = torch.randn(size, size, device=where).to(torch_dtypes[dtype])
    candidates = [(f"torch matmul {dtype}", torch.matmul, "torch", (a, b))]
    if dtype in ("bf16", "f16"):
        import jax.numpy as jnp

        from kernels.core import frameworks

        candidates.append((f"xla matmul {dtype}", jnp.matmul, "jax",
                           tuple(jnp.asarray(frameworks.torch_to_numpy(t)) for t in (a, b))))
    return candidates


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def measure(device: fingerprint_module.Fingerprint | None = None) -> Ceiling:
    """Time a large copy and large products on this device (kernels.core.timing); the best of
    torch's and XLA's for each. Every timing must come by one method, or this refuses."""
    import torch

    from kernels.core import timing

    device = device or fingerprint_module.fingerprint()
    gpu = device.platform == "gpu"
    where = "cuda" if gpu else "cpu"
    rule = timing.StoppingRule(min_samples=5, time_budget_s=GPU_BUDGET_S if gpu else CPU_BUDGET_S)

    def best(candidates, regime: str) -> tuple[float, str, str]:
        runs = [timing.time_timeable(timing.callable_timeable(label, fn, framework, args),
                                     regime=regime, rule=rule, device=device)
                for label, fn, framework, args in candidates]
        mixed = timing.comparable(*runs)
        if mixed:
            raise RuntimeError(f"measured ceilings: {mixed}")
        fastest = min(runs, key=lambda m: m.median_s)
        return fastest.median_s, (f"{fastest.label}: {fastest.method}, n={fastest.repeats}, "
                                  f"{fastest.stop_reason}"), fastest.method

    nbytes = GPU_COPY_BYTES if gpu else CPU_COPY_BYTES
    products = GPU_MATMUL if gpu else CPU_MATMUL
    steps = 1 + len(products)
    # Seconds per step, minutes on a GPU's first run: a line per step, not silence.
    _progress(f"ceilings of {device.name}: 1/{steps} copy {nbytes >> 20} MiB")
    copy_s, note, method = best(_copy_kernels(nbytes, where), "hot")
    flops, notes = {}, [f"copy {nbytes >> 20} MiB ({note})"]
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    try:
        for step, (dtype, size) in enumerate(products.items(), start=2):
            _progress(f"ceilings of {device.name}: {step}/{steps} matmul {dtype} {size}^3")
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            # Cold, as the points are: products back to back heat the card and throttle it.
            product_s, note, _ = best(_products(dtype, size, where), "cold")
            flops[dtype] = 2.0 * size**3 / product_s
            notes.append(f"matmul {dtype} {size}^3 ({note})")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return Ceiling(device=device.name, kind="measured", bandwidth=2.0 * nbytes / copy_s,
                   flops=flops, source="; ".join(notes), method=method)


def measured(device: fingerprint_module.Fingerprint | None = None, *,
             refresh: bool = False, allow_measure: bool = True) -> Ceiling | None:
    """This device model's measured ceilings: from the cache, else measured now and cached."""
    device = device or fingerprint_module.fingerprint()
    path = cache_path(device.model)
    if path.exists() and not refresh:
        cached = Ceiling.from_dict(json.loads(path.read_text())["ceiling"])
        if cached.method == default_method(device):
            return cached
        warnings.warn(f"measured ceilings in {path} were timed by {cached.method or 'CUDA events'}"
                      f", not {default_method(device)}: measuring again", stacklevel=2)
    if not allow_measure:
        return None
    from kernels.core import timing

    if device.platform == "gpu" and timing.traced_here():
        return _measured_elsewhere(device, path)
    _progress(f"no measured ceilings of {device.model} cached ({path}): measuring them once")
    try:
        ceiling = measure(device)
    except ImportError as error:
        warnings.warn(f"measured ceilings need torch ({error}); none for {device.name}",
                      stacklevel=2)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"ceiling": ceiling.to_dict(), "fingerprint": device.to_dict()},
                                  indent=1))
    os.replace(partial, path)
    return ceiling


def _measured_elsewhere(device: fingerprint_module.Fingerprint,
                        path: pathlib.Path) -> Ceiling | None:
    """Ceilings measured (and cached) by a fresh Python process: this one recorded a device
    trace, after which Mosaic's CUPTI timer aborts the process. None, with a warning, if the
    child fails (the roofline then stands on the datasheet)."""
    import subprocess

    _progress(f"no measured ceilings of {device.model} cached ({path}): measuring them once "
              f"in a fresh process (this one recorded a device trace)")
    done = subprocess.run([sys.executable, "-c",
                           "from kernels.roofline import ceilings; ceilings.measured()"],
                          stdout=sys.stderr, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not path.exists():
        warnings.warn(f"measuring the ceilings of {device.name} in a fresh process failed "
                      f"(exit {done.returncode}); none measured", stacklevel=3)
        return None
    return Ceiling.from_dict(json.loads(path.read_text())["ceiling"])


def default_method(device: fingerprint_module.Fingerprint) -> str:
    """The clock points on `device` are timed by, which measured ceilings must share."""
    from kernels.core import compat

    return "cupti" if device.platform == "gpu" and compat.cupti_session() else "host-clock"


def for_device(device: fingerprint_module.Fingerprint | None = None, *,
               allow_measure: bool = True) -> tuple[Ceiling | None, Ceiling | None]:
    """(datasheet, measured) ceilings of `device`; warns when a GPU has no datasheet entry."""
    device = device or fingerprint_module.fingerprint()
    sheet = datasheet(device.name) if device.platform == "gpu" else None
    if device.platform == "gpu" and sheet is None:
        warnings.warn(f"no datasheet entry for {device.name!r}; the roofline uses measured "
                      f"ceilings only (add it to kernels/roofline/ceilings.py DATASHEET)",
                      stacklevel=2)
    if not cache_path(device.model).exists():
        found = shipped(device)
        if found is not None:
            return sheet, found
    return sheet, measured(device, allow_measure=allow_measure)


def shipped(device: fingerprint_module.Fingerprint, root: pathlib.Path | None = None
            ) -> Ceiling | None:
    """The measured ceilings the repository ships for `device`'s model
    (kernels/models/<model>/ceilings.json, written by `python -m kernels bringup`), or None:
    none shipped, measured on another model's board, or timed by another clock than this
    machine times points by. `for_device` takes them where this machine has no cache."""
    if device.platform != "gpu":
        return None
    data = modeldata.read(device.model, modeldata.CEILINGS, root)
    if data is None:
        return None
    ceiling = Ceiling.from_dict(data["ceiling"])
    if ceiling.device != device.name or ceiling.method != default_method(device):
        return None
    return ceiling
