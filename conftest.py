"""pytest set-up: process environment first, then tests generated from the registry.

Before anything imports JAX or Triton, `kernels.environment.configure()` puts
Triton in its interpreter and gives JAX 8 host devices when there is no GPU.
Tests that take a `kernel_item` or `bad_input_item` argument are parametrized
over the registry, with ids like `softmax-pallas-f32-37x128-normal`. On a GPU
machine every kernel item is marked `gpu` (so `pytest -m gpu` runs them
compiled); without one, items that need a GPU are marked `gpu` and skip with
the reason, and the rest run interpreted.
"""

from __future__ import annotations

import dataclasses

from kernels import environment

environment.configure()

import pytest  # noqa: E402

from kernels import devices, registry  # noqa: E402

# The persistent compilation cache for the run, and its hit rate in the summary.
pytest_plugins = ("kernels.compilation_cache_plugin",)


@dataclasses.dataclass(frozen=True)
class KernelItem:
    impl: registry.Implementation
    case: registry.Case
    distribution: str

    @property
    def id(self) -> str:
        return f"{self.impl.id}-{self.case.id}-{self.distribution}"


def _marks(impl: registry.Implementation, reason: str | None, machine: devices.Machine) -> list:
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


def kernel_params() -> list:
    machine = devices.this_machine()
    params = []
    for op in registry.operations():
        for impl in registry.implementations(op.name):
            for case in op.cases:
                reason = devices.case_unavailable_reason(impl, case, machine)
                marks = _marks(impl, reason, machine)
                if "cpu" in case.tags:
                    marks.append(pytest.mark.small)
                for distribution in op.distributions:
                    item = KernelItem(impl, case, distribution)
                    params.append(pytest.param(item, id=item.id, marks=marks))
    return params


def bad_input_params() -> list:
    params = []
    for op in registry.operations():
        for impl in registry.implementations(op.name):
            if impl.baseline:
                continue  # peers are not ours to fix
            missing = [m for m in impl.requires.modules if not devices.module_available(m)]
            marks = [pytest.mark.skip(reason=f"needs {', '.join(missing)}")] if missing else []
            for bad in op.bad_inputs:
                params.append(pytest.param((impl, bad), id=f"{impl.id}-{bad.label}", marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel_item" in metafunc.fixturenames:
        metafunc.parametrize("kernel_item", kernel_params())
    if "bad_input_item" in metafunc.fixturenames:
        metafunc.parametrize("bad_input_item", bad_input_params())


def pytest_report_header(config: pytest.Config) -> list[str]:
    machine = devices.this_machine()
    failures = registry.import_failures()
    lines = [f"kernelperf: {machine.describe()}; Pallas "
             f"{'compiled' if machine.has_gpu else 'interpreted'}"]
    lines += [f"kernelperf: not registered: {name}: {why}" for name, why in failures.items()]
    return lines
