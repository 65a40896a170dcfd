"""Baseline: torch scaled_dot_product_attention on its cuDNN backend (GPU only)."""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels import registry
from kernels.ops.attention import spec

BACKEND = SDPBackend.CUDNN_ATTENTION


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
              causal: bool = False) -> torch.Tensor:
    # SDPA takes (batch, heads, seq, head_dim): transposed views, no copies.
    with sdpa_kernel(BACKEND):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2)


def supports(case: registry.Case) -> str | None:
    if case.dtype == "f32":
        return "torch's cuDNN backend takes bf16/f16 only, not f32"
    if case["seq"] == 1:
        # torch 2.11 on the H100: "RuntimeError: No available kernel. Aborting execution."
        return "torch's cuDNN backend has no kernel for a sequence of length 1"
    return None


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch_cudnn", fn=attention, framework="torch", baseline=True,
    supports=supports,
    requires=registry.Requirements(gpu=True, min_compute_capability=(8, 0), modules=("torch",)),
    description="torch SDPA, CUDNN_ATTENTION backend",
))
