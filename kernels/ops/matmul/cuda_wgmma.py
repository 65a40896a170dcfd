"""bf16/f16 matmul in raw CUDA for Hopper (gemm_wgmma.cu): TMA + mbarrier ring + wgmma.

A persistent, warp-specialised kernel: per SM one CTA whose producer warp
issues TMA loads (128-byte swizzle) into a 4-stage ring of 64-deep k-steps
while two consumer warpgroups multiply 128 x 256 tiles of C with
wgmma.mma_async m64n256k16 from shared-memory descriptors (B, row-major, read
N-major through wgmma's transpose bit), float32 accumulation. sm_90 only;
K and N must be multiples of 8 (TMA's 16-byte strides). Forward only. See
kernels/cuda/runtime.py for the torch interop.
"""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.core import dtypes, frameworks, precisions, registry, validation
from kernels.cuda import runtime
from kernels.ops.matmul import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

LIBRARY = runtime.CudaLibrary(Path(__file__).with_name("gemm_wgmma.cu"), {
    "kernelperf_gemm_wgmma": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_void_p),
})

DTYPES = ("bf16", "f16")
# TMA needs every row stride a multiple of 16 bytes: 8 elements of a 16-bit dtype.
ALIGNMENT = 8
# wgmma, TMA and setmaxnreg exist on sm_90a alone (Blackwell has tcgen05 instead).
CAPABILITY = (9, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WgmmaConfig:
    """Tile order: the persistent CTAs walk 128 x 256 tiles of C group_m tile-rows at a time."""

    group_m: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.group_m <= 1024:
            raise ValueError(f"group_m: expected an int in [1, 1024], got {self.group_m}")


DEFAULT_CONFIG = WgmmaConfig()


def _capability_reason(capability: tuple[int, int]) -> str | None:
    if tuple(capability) != CAPABILITY:
        return (f"cuda_wgmma needs a Hopper GPU (sm_90a: wgmma, TMA, setmaxnreg); this GPU is "
                f"sm_{capability[0]}{capability[1]}")
    return None


def supports(case: registry.Case) -> str | None:
    if case.dtype not in DTYPES:
        return f"cuda_wgmma takes bf16/f16 (cuda_sgemm computes float32); got {case.dtype}"
    if case["k"] % ALIGNMENT or case["n"] % ALIGNMENT:
        return (f"cuda_wgmma loads through TMA, which needs k and n multiples of {ALIGNMENT} "
                f"(16-byte row strides); got k={case['k']}, n={case['n']} (cuda_mma takes any "
                f"shape)")
    import torch

    if torch.cuda.is_available():
        return _capability_reason(torch.cuda.get_device_capability())
    return None


def matmul(a: torch.Tensor, b: torch.Tensor, *, config: WgmmaConfig | None = None
           ) -> torch.Tensor:
    """a @ b for bfloat16 or float16 CUDA tensors on Hopper, by gemm_wgmma.cu (float32
    accumulation).

    Args:
      a: (m, k) contiguous bfloat16/float16 CUDA tensor, k a multiple of 8, 16-byte aligned.
      b: (k, n) contiguous tensor of a's dtype on a's device, n a multiple of 8, 16-byte aligned.
      config: tile order; DEFAULT_CONFIG when None.
    Returns:
      A new (m, n) tensor of a's dtype.
    """
    spec.validate(a, b)
    validation.check_config(config, WgmmaConfig)
    if dtypes.short_name(a.dtype) not in DTYPES:
        raise TypeError(f"a: cuda_wgmma expects bfloat16 or float16 (cuda_sgemm takes float32), "
                        f"got {dtypes.name_of(a.dtype)}")
    (m, k), n = a.shape, b.shape[1]
    if k % ALIGNMENT or n % ALIGNMENT:
        raise ValueError(f"a, b: cuda_wgmma needs k and n multiples of {ALIGNMENT} (TMA's 16-byte "
                         f"row strides), got k={k}, n={n}; cuda_mma takes any shape")
    runtime.check_tensor("a", a)
    runtime.check_tensor("b", b, like=a)
    if (empty := spec.empty_product(a, b)) is not None:
        return empty
    if max(m, n, k) > runtime.INT32_MAX:
        raise ValueError(f"a, b: expected dimensions below 2**31, got m={m}, n={n}, k={k}")
    for name, x in (("a", a), ("b", b)):
        if x.data_ptr() % runtime.VECTOR_BYTES:
            raise ValueError(f"{name}: cuda_wgmma needs data aligned to {runtime.VECTOR_BYTES} "
                             f"bytes (TMA), got an address {x.data_ptr() % runtime.VECTOR_BYTES} "
                             f"bytes past one; cuda_mma takes it")
    import torch

    reason = _capability_reason(torch.cuda.get_device_capability(a.device))
    if reason:
        raise RuntimeError(reason)
    config = config or DEFAULT_CONFIG
    c = frameworks.torch_empty((m, n), a.dtype, a.device)
    LIBRARY.launch("kernelperf_gemm_wgmma", a.device, a.data_ptr(), b.data_ptr(), c.data_ptr(),
                   m, n, k, runtime.dtype_code(a), config.group_m, runtime.current_stream(a))
    return c


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="cuda_wgmma",
    fn=matmul,
    precision=precisions.NO_FLOAT32,  # wgmma on bf16/f16 (supports)
    framework="torch",
    requires=registry.Requirements(gpu=True, min_compute_capability=CAPABILITY,
                                   modules=("torch",)),
    differentiable=False,
    supports=supports,
    description="CUDA C++ via nvcc + ctypes: Hopper GEMM, TMA + 4-stage mbarrier ring, "
                "warp-specialised wgmma m64n256k16, persistent",
))
