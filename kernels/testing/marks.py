"""The pytest marks an item of one implementation on one case carries, for every suite that
generates such items from the registry (the kernel checks, the perf tests): `gpu` where it
runs on or needs a GPU, `multi_gpu` where it needs several devices, `cuda` for the raw CUDA
kernels, and a skip with the reason where it cannot run here."""

from __future__ import annotations

import pytest

from kernels.core import devices, registry


def kernel_marks(impl: registry.Implementation, reason: str | None,
                 machine: devices.Machine) -> list:
    marks = []
    if machine.has_gpu or impl.requires.gpu or reason and "GPU" in reason:
        marks.append(pytest.mark.gpu)
    if impl.requires.devices > 1:
        marks.append(pytest.mark.multi_gpu)
    if impl.name == "cuda" or impl.name.startswith("cuda_"):
        marks.append(pytest.mark.cuda)
    if reason:
        marks.append(pytest.mark.skip(reason=reason))
    return marks
