"""Baselines: torch.matmul (cuBLAS on GPU), in float32 as torch defaults to and in TF32.

`torch` is torch.matmul as it comes: for float32 inputs cuBLAS's FP32 GEMM (TF32 is off by
default since torch 1.12). `torch_tf32` is the same call with TF32 allowed, forward and
backward, so that a TF32 kernel has cuBLAS's TF32 GEMM as a peer of its own precision
beside XLA's (whose default is TF32 on the GPU).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from kernels.core import compat, precisions, registry
from kernels.ops.matmul import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.matmul(a, b)


@functools.cache
def _tf32_autograd() -> type:
    """torch.matmul with TF32 allowed as a torch.autograd.Function: the backward's products
    run when autograd calls them, outside the forward's block, so they set TF32 again."""
    import torch

    class Tf32Matmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            with compat.torch_matmul_precision("tf32"):
                return torch.matmul(a, b)

        @staticmethod
        def backward(ctx, dc):
            a, b = ctx.saved_tensors
            with compat.torch_matmul_precision("tf32"):
                da = torch.matmul(dc, b.T) if ctx.needs_input_grad[0] else None
                db = torch.matmul(a.T, dc) if ctx.needs_input_grad[1] else None
            return da, db

    return Tf32Matmul


def matmul_tf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for float32 tensors by cuBLAS in TF32, forward and backward."""
    return _tf32_autograd().apply(a, b)


def _float32_only(case: registry.Case) -> str | None:
    if case.dtype != "f32":
        return f"torch_tf32 is the float32 GEMM in TF32; {case.dtype} is torch's own"
    return None


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch", fn=matmul, framework="torch", baseline=True,
    requires=registry.Requirements(modules=("torch",)),
    description="torch.matmul (cuBLAS on GPU)",
    # torch.backends.cuda.matmul.allow_tf32 is off by default since torch 1.12 (and
    # fp32_precision "none" on 2.9+): cuBLAS float32 GEMMs without TF32.
    precision=precisions.EVERYWHERE_FP32,
))

registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch_tf32", fn=matmul_tf32, framework="torch", baseline=True,
    # TF32 is a tensor-core mode: on a CPU this would be the torch baseline again.
    requires=registry.Requirements(gpu=True, modules=("torch",)),
    supports=_float32_only,
    description="torch.matmul with TF32 allowed (cuBLAS TF32 GEMM), float32 only",
    precision=precisions.TF32_ON_GPU,
))
