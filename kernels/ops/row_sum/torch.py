"""Baseline: torch.sum over the last axis, accumulating in float32 (PyTorch's CUDA reduction)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernels.core import registry
from kernels.ops.row_sum import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch


def row_sum(x: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.sum(x, dim=-1, dtype=torch.float32).to(x.dtype)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch", fn=row_sum, framework="torch", baseline=True,
    requires=registry.Requirements(modules=("torch",)),
    description="torch.sum(dim=-1, dtype=float32)",
))
