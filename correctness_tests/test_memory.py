"""Peak memory from XLA's memory analysis (and the device's high-water mark on GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.core import devices, registry
from kernels.guards import memory


def _smallest_cpu_cases() -> list:
    params = []
    for impl in registry.implementations():
        if impl.framework != "jax":
            continue
        cases = registry.operation(impl.op).cases_tagged("cpu")
        case = min(cases, key=lambda c: np.prod([n for _, n in c.dims]))
        reason = devices.case_unavailable_reason(impl, case)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(impl, case, id=f"{impl.id}-{case.id}", marks=marks))
    return params


@pytest.mark.parametrize(("impl", "case"), _smallest_cpu_cases())
def test_compiled_peak_holds_inputs_and_output(impl, case):
    op = registry.operation(impl.op)
    inputs = op.make_inputs(case, np.random.default_rng(0), op.distributions[0])
    use = memory.measure(impl, case, "fwd", live=False)
    # XLA's memory analysis is per device: a device of a sharded program holds at
    # least its 1/devices share of every input.
    input_bytes = sum(a.nbytes for a in inputs) // impl.devices_for(case)
    assert use.argument_bytes >= input_bytes, use
    assert use.output_bytes > 0, use
    assert use.compiled_peak_bytes >= max(input_bytes, use.output_bytes), use


def _mlp_case() -> registry.Case:
    # Eight layers with a 4x feed-forward: enough saved activations for remat to matter,
    # small enough to compile in a second.
    return registry.make_case("mlp", "f32", {"batch": 256, "d_model": 64, "d_ff": 256,
                                             "layers": 8})


def test_remat_trades_backward_memory():
    case = _mlp_case()
    plain, remat = (registry.implementation("mlp", name) for name in ("xla", "xla_remat"))
    forward = [memory.measure(impl, case, "fwd", live=False) for impl in (plain, remat)]
    backward = [memory.measure(impl, case, "bwd", live=False) for impl in (plain, remat)]
    assert forward[0].compiled_peak_bytes == forward[1].compiled_peak_bytes, forward
    # Without remat the backward holds 2 x (batch x d_ff) activations per layer; with it,
    # one layer's at a time.
    saved = 2 * 8 * 256 * 256 * 4
    assert backward[0].compiled_peak_bytes - backward[1].compiled_peak_bytes >= saved // 2, \
        backward


def test_bad_direction_is_named():
    with pytest.raises(ValueError, match=r"direction: expected one of \('fwd', 'bwd'\), "
                                         r"got 'sideways'"):
        memory.program(registry.implementation("mlp", "xla"), _mlp_case(), "sideways")


@pytest.mark.gpu
@pytest.mark.skipif(not devices.this_machine().has_gpu,
                    reason="needs a CUDA GPU: the CPU client keeps no memory statistics")
def test_live_peak_on_gpu_is_near_the_compiled_peak():
    use = memory.measure_isolated(registry.implementation("mlp", "xla"), _mlp_case(), "bwd")
    assert use.live_peak_bytes is not None, use
    # The allocator rounds buffers up and may hold the arguments twice while placing them.
    assert 0.5 * use.compiled_peak_bytes <= use.live_peak_bytes <= 3 * use.compiled_peak_bytes, use
