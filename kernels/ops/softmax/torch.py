"""Baseline: torch.softmax (PyTorch's own CUDA kernel on GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernels.core import registry
from kernels.ops.softmax import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch


def softmax(x: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.softmax(x, dim=-1)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch", fn=softmax, framework="torch", baseline=True,
    requires=registry.Requirements(modules=("torch",)),
    description="torch.softmax",
))
