"""The gate-power command's parts: the planted slowdown, the detectable shift, the verdicts."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from kernels.bench import gate
from kernels.core import registry


@contextlib.contextmanager
def planted(op: str, impl: str, fraction: float):
    """Run the plant's text as the kernel's module would, then put the registry back."""
    original = registry.implementation(op, impl)
    try:
        exec(gate.plant_source(op, impl, fraction, original.framework), {"registry": registry})
        yield registry.implementation(op, impl)
    finally:
        registry._IMPLEMENTATIONS[(op, impl)] = original


def test_a_jax_plant_survives_xla_and_adds_its_fraction_of_work():
    import jax

    x = np.random.default_rng(0).standard_normal((64, 1000), dtype=np.float32)
    original = registry.implementation("softmax", "xla")
    base_flops = jax.jit(original.fn).lower(x).compile().cost_analysis()
    with planted("softmax", "xla", 0.25) as slowed:
        slow = jax.jit(slowed.fn)
        slow_flops = slow.lower(x).compile().cost_analysis()
        np.testing.assert_array_equal(np.asarray(slow(x)), np.asarray(original.fn(x)))
    base_flops = base_flops[0] if isinstance(base_flops, list) else base_flops
    slow_flops = slow_flops[0] if isinstance(slow_flops, list) else slow_flops
    # 16 of 64 rows again: XLA kept the extra work (handed to a host callback).
    assert slow_flops["flops"] == pytest.approx(1.25 * base_flops["flops"], rel=0.02)
    assert registry.implementation("softmax", "xla") is original


def test_a_torch_plant_runs_the_kernel_again_on_the_leading_rows(monkeypatch):
    import torch

    original = registry.implementation("softmax", "torch")
    calls = []

    def recording(x, *args, **kwargs):
        calls.append(tuple(x.shape))
        return original.fn(x, *args, **kwargs)

    monkeypatch.setitem(registry._IMPLEMENTATIONS, ("softmax", "torch"),
                        registry.dataclasses.replace(original, fn=recording))
    x = torch.randn(40, 8)
    with planted("softmax", "torch", 0.1) as slowed:
        out = slowed.fn(x)
    assert calls == [(40, 8), (4, 8)]
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_plants_land_in_the_kernels_own_module():
    assert str(gate.module_path("softmax", "cuda")) == "kernels/ops/softmax/cuda.py"
    assert str(gate.module_path("softmax", "pallas")) == "kernels/ops/softmax/pallas.py"


def test_the_detectable_shift_grows_with_the_noise():
    rng = np.random.default_rng(0)
    quiet = list(1e-3 * (1 + 0.001 * rng.standard_normal(100)))
    noisy = list(1e-3 * (1 + 0.03 * rng.standard_normal(100)))
    quiet_shift, quiet_gate = gate.detectable_shift(quiet, 1.05)
    noisy_shift, noisy_gate = gate.detectable_shift(noisy, 1.05)
    assert 0 < quiet_shift < 0.005 < noisy_shift < 0.05
    assert quiet_gate == pytest.approx(0.05) and noisy_gate == pytest.approx(0.05)
    assert gate.detectable_shift(noisy, 1.001)[1] == noisy_shift


def _outcome(label, asv_worse, plain, ratio, verdict):
    return gate.Outcome(label, int(asv_worse), 1 if verdict == "slower" else 0,
                        {"xla": gate.RowVerdict(ratio, asv_worse, plain, verdict)})


def test_report_fails_on_a_missed_plant_a_false_positive_or_a_speedup_read_as_slower():
    settings = gate.Settings(families=("xla",), factor=1.05)
    good = [("A/A", 0.0, _outcome("A/A 1", False, False, 1.001, "same")),
            ("plant", 0.05, _outcome("+5% trial 1", True, False, 1.06, "slower")),
            ("plant", 0.10, _outcome("+10% trial 1", True, True, 1.11, "slower")),
            ("speed-up", 0.05, _outcome("-5%", False, False, 0.94, "faster"))]
    lines = []
    assert gate.report(good, settings, ["xla"], {}, lines.append) == 0
    assert "0 false positive(s)" in "\n".join(lines)
    for index, bad in ((0, _outcome("A/A 1", True, False, 1.06, "slower")),
                       (1, _outcome("+5% trial 1", False, False, 1.04, "same")),
                       (2, _outcome("+10% trial 1", True, False, 1.11, "slower")),
                       (3, _outcome("-5%", True, True, 0.94, "faster"))):
        outcomes = list(good)
        outcomes[index] = (good[index][0], good[index][1], bad)
        assert gate.report(outcomes, settings, ["xla"], {}, lines.append) == 1, bad


def test_asv_marks_a_row_worse_by_its_own_test():
    from asv_runner.statistics import compute_stats

    from kernels.bench import asv_tools

    def result(samples):
        value, stats = compute_stats(samples, 1)
        return asv_tools.Result(value, samples, stats)

    rng = np.random.default_rng(0)
    base = result(list(1e-3 * (1 + 0.002 * rng.standard_normal(50))))
    slower = result(list(1.07e-3 * (1 + 0.002 * rng.standard_normal(50))))
    assert gate.asv_marks_worse(base, slower, 1.05)
    assert not gate.asv_marks_worse(base, slower, 1.1)
    assert not gate.asv_marks_worse(slower, base, 1.05)  # a speed-up is not worse
    assert not gate.asv_marks_worse(base, None, 1.05)


def test_bad_settings_are_refused_before_any_clone():
    with pytest.raises(ValueError, match=r"families: expected some of"):
        gate.Settings(families=("fortran",))
    with pytest.raises(ValueError, match=r"sizes: expected fractions in \(0, 1\)"):
        gate.Settings(sizes=(5.0,))
    with pytest.raises(ValueError, match=r"factor: expected a finite number > 1"):
        gate.Settings(factor=1.0)
