"""Baselines: torch scaled_dot_product_attention pinned to one backend (GPU only).

`torch_flash` is its FLASH_ATTENTION backend (FlashAttention-2), `torch_cudnn`
its CUDNN_ATTENTION backend. Both take bf16/f16 only.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from kernels.core import precisions, registry
from kernels.ops.attention import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch


def pinned_to(backend: str):
    """Attention in the registry's (batch, seq, heads, head_dim) layout on the SDPA backend
    named `backend` (a torch.nn.attention.SDPBackend member) alone."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  causal: bool = False) -> torch.Tensor:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # SDPA takes (batch, heads, seq, head_dim): transposed views, no copies.
        with sdpa_kernel(getattr(SDPBackend, backend)):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        return out.transpose(1, 2)

    return attention


def _supports(case: registry.Case, label: str) -> str | None:
    if case.dtype == "f32":
        return f"torch's {label} backend takes bf16/f16 only, not f32"
    if label == "cuDNN" and case["seq"] == 1:
        # torch 2.11 on the H100: "RuntimeError: No available kernel. Aborting execution."
        return "torch's cuDNN backend has no kernel for a sequence of length 1"
    return None


for _name, _backend, _label, _description in (
        ("torch_flash", "FLASH_ATTENTION", "flash",
         "torch SDPA, FLASH_ATTENTION backend (FlashAttention-2)"),
        ("torch_cudnn", "CUDNN_ATTENTION", "cuDNN",
         "torch SDPA, CUDNN_ATTENTION backend")):
    registry.register_implementation(registry.Implementation(
        op=spec.NAME, name=_name, fn=pinned_to(_backend),
        framework="torch", baseline=True, supports=functools.partial(_supports, label=_label),
        requires=registry.Requirements(gpu=True, min_compute_capability=(8, 0),
                                       modules=("torch",)),
        description=_description,
        precision=precisions.NO_FLOAT32,  # bf16/f16 only (_supports)
    ))
