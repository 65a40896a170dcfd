"""Baseline: torch.matmul (cuBLAS on GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernels.core import registry
from kernels.ops.matmul import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.matmul(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch", fn=matmul, framework="torch", baseline=True,
    requires=registry.Requirements(modules=("torch",)),
    description="torch.matmul (cuBLAS on GPU)",
))
