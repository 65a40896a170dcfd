"""Baseline: torch.matmul (cuBLAS on GPU)."""

import torch

from kernels.core import registry
from kernels.ops.matmul import spec


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="torch", fn=matmul, framework="torch", baseline=True,
    requires=registry.Requirements(modules=("torch",)),
    description="torch.matmul (cuBLAS on GPU)",
))
