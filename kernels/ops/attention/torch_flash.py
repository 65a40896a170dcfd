"""Baseline: torch scaled_dot_product_attention on its FlashAttention-2 backend (GPU only)."""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels import registry
from kernels.ops.attention import spec

BACKEND = SDPBackend.FLASH_ATTENTION


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
              causal: bool = False) -> torch.Tensor:
    # SDPA takes (batch, heads, seq, head_dim): transposed views, no copies.
    with sdpa_kernel(BACKEND):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2)


def supports(case: registry.Case) -> str | None:
    if case.dtype == "f32":
        return "torch's flash backend takes bf16/f16 only, not f32"
    return None


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch_flash", fn=attention, framework="torch", baseline=True,
    supports=supports,
    requires=registry.Requirements(gpu=True, min_compute_capability=(8, 0), modules=("torch",)),
    description="torch SDPA, FLASH_ATTENTION backend (FlashAttention-2)",
))
