"""float32 matmul in raw CUDA (sgemm.cu): shared-memory tiles, 8 x 8 outputs per thread, FFMA.

128 x 128 tiles of C per block of 256 threads, K walked in steps of 8 through
two shared-memory buffers; no tensor cores and no TF32, so results are full
float32 products. Forward only. See kernels/cuda/runtime.py for the torch
interop.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.core import dtypes, frameworks, precisions, registry
from kernels.cuda import runtime
from kernels.ops.matmul import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

LIBRARY = runtime.CudaLibrary(Path(__file__).with_name("sgemm.cu"), {
    "kernelperf_sgemm": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p),
})

# Elements per 16-byte access: the vectorised path needs K and N to be multiples of it.
VECTOR = 4


def supports(case: registry.Case) -> str | None:
    if case.dtype != "f32":
        return f"cuda_sgemm computes float32 only (cuda_mma takes bf16/f16); got {case.dtype}"
    return None


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for float32 CUDA tensors, by sgemm.cu.

    Args:
      a: (m, k) contiguous float32 CUDA tensor.
      b: (k, n) contiguous float32 CUDA tensor on a's device.
    Returns:
      A new (m, n) float32 tensor.
    """
    spec.validate(a, b)
    if dtypes.short_name(a.dtype) != "f32":
        raise TypeError(f"a: cuda_sgemm expects float32 (cuda_mma takes bf16/f16), got "
                        f"{dtypes.name_of(a.dtype)}")
    runtime.check_tensor("a", a)
    runtime.check_tensor("b", b, like=a)
    if (empty := spec.empty_product(a, b)) is not None:
        return empty
    (m, k), n = a.shape, b.shape[1]
    if max(m, n, k) > runtime.INT32_MAX:
        raise ValueError(f"a, b: expected dimensions below 2**31, got m={m}, n={n}, k={k}")
    c = frameworks.torch_empty((m, n), a.dtype, a.device)
    vectorized = k % VECTOR == 0 and n % VECTOR == 0 and all(
        t.data_ptr() % runtime.VECTOR_BYTES == 0 for t in (a, b, c))
    LIBRARY.launch("kernelperf_sgemm", a.device, a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n,
                   k, int(vectorized), runtime.current_stream(a))
    return c


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="cuda_sgemm",
    fn=matmul,
    precision=precisions.EVERYWHERE_FP32,  # FFMA, no tensor cores (sgemm.cu)
    framework="torch",
    requires=registry.Requirements(gpu=True, modules=("torch",)),
    differentiable=False,
    supports=supports,
    description="CUDA C++ via nvcc + ctypes: f32 SGEMM, 128x128x8 smem tiles, 8x8 per thread",
))
