"""bf16/f16 matmul in raw CUDA on tensor cores (gemm_mma.cu): mma.sync m16n8k16, f32 accumulation.

128 x 128 (4 warps) or 128 x 256 (8 warps) tiles of C per block, each warp
64 x 64 through ldmatrix and mma.sync; a 4-stage cp.async pipeline over K in
steps of 32 with swizzled shared memory. Forward only. See
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

LIBRARY = runtime.CudaLibrary(Path(__file__).with_name("gemm_mma.cu"), {
    "kernelperf_gemm_mma": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                            ctypes.c_void_p),
})

DTYPES = ("bf16", "f16")
# Elements per 16-byte cp.async chunk: the asynchronous-copy path needs K and N multiples of it.
CHUNK = 8
BLOCK_M = 128
BLOCK_NS = (128, 256)  # the tiles gemm_mma.cu instantiates


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmaConfig:
    """Tile of C per block: 128 x block_n, one warp per 64 x 64 (4 or 8 warps)."""

    block_n: int = 128

    def __post_init__(self) -> None:
        if self.block_n not in BLOCK_NS:
            raise ValueError(f"block_n: expected one of {BLOCK_NS}, got {self.block_n}")

    @property
    def label(self) -> str:
        return f"{BLOCK_M}x{self.block_n}"


# Every tile gemm_mma.cu instantiates: the tests check each, the bench times each.
CONFIGS = tuple(MmaConfig(block_n=n) for n in BLOCK_NS)
# 128 x 128 until H100 timings of both say otherwise (python -m kernels.profile.cuda_bench times
# both).
DEFAULT_CONFIG = MmaConfig(block_n=128)


def supports(case: registry.Case) -> str | None:
    if case.dtype not in DTYPES:
        return f"cuda_mma takes bf16/f16 (cuda_sgemm computes float32); got {case.dtype}"
    return None


def matmul(a: torch.Tensor, b: torch.Tensor, *, config: MmaConfig | None = None
           ) -> torch.Tensor:
    """a @ b for bfloat16 or float16 CUDA tensors, by gemm_mma.cu (float32 accumulation).

    Args:
      a: (m, k) contiguous bfloat16/float16 CUDA tensor.
      b: (k, n) contiguous CUDA tensor of a's dtype, on a's device.
      config: tile shape; DEFAULT_CONFIG when None.
    Returns:
      A new (m, n) tensor of a's dtype.
    """
    spec.validate(a, b)
    validation.check_config(config, MmaConfig)
    if dtypes.short_name(a.dtype) not in DTYPES:
        raise TypeError(f"a: cuda_mma expects bfloat16 or float16 (cuda_sgemm takes float32), "
                        f"got {dtypes.name_of(a.dtype)}")
    runtime.check_tensor("a", a)
    runtime.check_tensor("b", b, like=a)
    if (empty := spec.empty_product(a, b)) is not None:
        return empty
    (m, k), n = a.shape, b.shape[1]
    if max(m, n, k) > runtime.INT32_MAX:
        raise ValueError(f"a, b: expected dimensions below 2**31, got m={m}, n={n}, k={k}")
    c = frameworks.torch_empty((m, n), a.dtype, a.device)
    aligned = k % CHUNK == 0 and n % CHUNK == 0 and all(
        t.data_ptr() % runtime.VECTOR_BYTES == 0 for t in (a, b, c))
    config = config or DEFAULT_CONFIG
    LIBRARY.launch("kernelperf_gemm_mma", a.device, a.data_ptr(), b.data_ptr(), c.data_ptr(), m,
                   n, k, runtime.dtype_code(a), config.block_n, int(aligned),
                   runtime.current_stream(a))
    return c


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="cuda_mma",
    fn=matmul,
    precision=precisions.NO_FLOAT32,  # mma.sync on bf16/f16 (supports)
    framework="torch",
    requires=registry.Requirements(gpu=True, min_compute_capability=(8, 0), modules=("torch",)),
    differentiable=False,
    supports=supports,
    description="CUDA C++ via nvcc + ctypes: tensor-core GEMM, mma.sync m16n8k16 + ldmatrix, "
                "4-stage cp.async",
))
