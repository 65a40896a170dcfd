"""Baseline: torch.softmax (PyTorch's own CUDA kernel on GPU)."""

import torch

from kernels.core import registry
from kernels.ops.softmax import spec


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch", fn=softmax, framework="torch", baseline=True,
    requires=registry.Requirements(modules=("torch",)),
    description="torch.softmax",
))
