"""The gate-power command's parts: the planted slowdown, the detectable shift, the verdicts."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

from correctness_tests import fakes
from kernels.bench import gate
from kernels.core import registry


@contextlib.contextmanager
def planted(op: str, impl: str, fraction: float, site: str | None = None):
    """Run the plant's text as the kernel's module would (in its namespace), then put the
    registry and the module back."""
    import importlib

    original = registry.implementation(op, impl)
    module = importlib.import_module(original.fn.__module__)
    before = vars(module).get(site)
    try:
        exec(gate.plant_source(op, impl, fraction, original.framework, site),
             vars(module) if site else {"registry": registry})
        yield registry.implementation(op, impl)
    finally:
        registry._IMPLEMENTATIONS[(op, impl)] = original
        if site:
            setattr(module, site, before)


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


def test_a_whole_plant_is_one_row_short_of_the_call_so_xla_keeps_it():
    """A fraction of 1 (a 50% plant scaled 2x, the README's CPU form) would run the very call
    again, which XLA merged with the first: the CPU gate-power missed a "+50%" XLA plant."""
    import jax

    x = np.random.default_rng(0).standard_normal((64, 1000), dtype=np.float32)
    original = registry.implementation("softmax", "xla")
    base = jax.jit(original.fn).lower(x).compile().cost_analysis()
    with planted("softmax", "xla", 1.0) as slowed:
        slow = jax.jit(slowed.fn).lower(x).compile().cost_analysis()
    base = base[0] if isinstance(base, list) else base
    slow = slow[0] if isinstance(slow, list) else slow
    assert slow["flops"] == pytest.approx((1 + 63 / 64) * base["flops"], rel=0.02)


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


def test_every_sharded_plant_names_a_function_of_its_kernel_and_others_none():
    import importlib

    for plant in gate.PLANTS:
        if plant.family == "sharded":
            module = importlib.import_module(
                registry.implementation(plant.op, plant.impl).fn.__module__)
            assert callable(getattr(module, plant.site, None)), plant
        else:
            assert plant.site is None, plant
    with pytest.raises(ValueError, match="site: expected a per-device function"):
        gate.Plant("sharded", "sharded_matmul", "collective", {})
    with pytest.raises(ValueError, match="site: expected a per-device function"):
        gate.Plant("xla", "softmax", "xla", {}, site="_local_product")


def test_a_sharded_plant_adds_its_rows_inside_the_kernel_and_no_exchange():
    """A sharded case's clock spans its devices' kernels, so a plant may add neither a host
    round trip (a callback read a 2% plant as 3-4x on 2 H100s) nor an exchange (the whole
    kernel again on 2% of the rows read 1.22x: its exchanges cost their latency whatever the
    rows). On the 4x2 mesh of host devices: every per-device product computes its 8 rows and
    2% of them again (1 row of 8), with exactly the kernel's own exchanges, and the result is
    the kernel's own."""
    import re

    import jax

    plant = next(p for p in gate.PLANTS if p.family == "sharded")
    impl = registry.implementation(plant.op, plant.impl)
    case = registry.operation(plant.op).case(plant.case["cpu"])
    assert case.id == "f32-64x32x48-mesh4x2"
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s, dtype=np.float32) for s in ((64, 48), (48, 32)))
    args = impl.place(case, (a, b))

    def compiled(fn):
        jax.clear_caches()  # the kernel's jit is cached per mesh: trace it again
        impl.fn.__globals__["collective"].cache_clear()
        program = jax.jit(lambda *xs: fn(*xs, **case.kwargs)).lower(*args).compile()
        analysis = program.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        text = program.as_text()
        moves = {op: len(re.findall(rf"= \S+ {op}(-start)?\(", text))
                 for op in ("all-gather", "all-to-all", "all-reduce", "collective-permute")}
        return text, analysis["flops"], moves

    _, base_flops, base_moves = compiled(impl.fn)
    with planted(plant.op, plant.impl, 0.02, plant.site) as slowed:
        text, slow_flops, slow_moves = compiled(slowed.fn)
        out = np.asarray(jax.jit(lambda *xs: slowed.fn(*xs, **case.kwargs))(*args))
    compiled(impl.fn)  # leave the unplanted kernel cached for the tests after this one
    assert not re.search(r'custom_call_target="[^"]*callback', text)
    assert sum(base_moves.values()) > 0  # the ring's permutes: the count sees exchanges
    assert slow_moves == base_moves
    # Per device 8 rows of A per product, 1 of them again: 9/8 of the products' flops.
    assert slow_flops >= (1 + 1 / 8) * base_flops * 0.98
    np.testing.assert_allclose(out, np.asarray(impl.fn(*args, **case.kwargs)), rtol=1e-6)


def test_plants_land_in_the_kernels_own_module():
    assert str(registry.module_path("softmax", "cuda")) == "kernels/ops/softmax/cuda.py"
    assert str(registry.module_path("softmax", "pallas")) == "kernels/ops/softmax/pallas.py"


def _row(ratio, verdict, gap=0.01):
    return gate.RowVerdict(ratio, gap, None, verdict, verdict == "slower", False)


def _outcome(label, rows):
    return gate.Outcome(label, 1 if any(r.verdict == "slower" for r in rows.values()) else 0,
                        rows)


XLA = ("softmax", "xla")
CONTROL = ("softmax", "torch")  # unplanted beside the plant: an A/A row in every trial


def test_report_fails_on_a_missed_plant_a_false_positive_or_a_speedup_read_as_slower():
    settings = gate.Settings(families=("xla",), ops=("softmax",))
    plants = tuple(p for p in gate.PLANTS if (p.op, p.impl) == XLA)
    good = [("A/A", 0.0, _outcome("A/A 1", {XLA: _row(1.001, "same"),
                                            CONTROL: _row(0.999, "same")})),
            ("plant", 0.02, _outcome("+2% trial 1", {XLA: _row(1.021, "slower"),
                                                     CONTROL: _row(1.004, "same")})),
            ("speed-up", 0.02, _outcome("-2%", {XLA: _row(0.98, "faster")}))]
    lines = []
    assert gate.report(good, settings, plants, lines.append) == 0
    assert "0 false positive(s) in 3 benchmark rows" in "\n".join(lines)
    for index, key, bad in ((0, XLA, _row(1.03, "slower")),
                            (1, XLA, _row(1.015, "same (not confirmed)")),
                            (1, CONTROL, _row(1.03, "slower")),  # a control flagged
                            (2, XLA, _row(1.02, "slower"))):
        outcomes = list(good)
        kind, size, outcome = good[index]
        outcomes[index] = (kind, size, _outcome(outcome.label, {**outcome.rows, key: bad}))
        assert gate.report(outcomes, settings, plants, lines.append) == 1, (index, key, bad)


def test_the_report_lists_every_verdict_a_reader_acts_on_and_names_each_failure():
    """Each listed row says what changed, in which trial, what both gates marked and what it
    means; a quiet unplanted control is counted but not listed; a kernel that failed on the
    head is as wrong in an A/A or a speed-up trial as a slowdown."""
    import re

    settings = gate.Settings(families=("xla",), ops=("softmax",))
    plants = tuple(p for p in gate.PLANTS if (p.op, p.impl) == XLA)
    outcomes = [
        ("A/A", 0.0, _outcome("A/A 1", {XLA: _row(1.001, "same"), CONTROL: _row(1.0, "same")})),
        ("plant", 0.02, _outcome("+2% trial 1", {XLA: _row(1.021, "slower", 0.004),
                                                 CONTROL: _row(1.03, "slower")})),
        ("plant", 0.03, _outcome("+3% trial 1", {XLA: _row(1.011, "same")})),
        ("speed-up", 0.02, _outcome("-2%", {XLA: _row(None, "FAILED on head", None)})),
        ("A/A", 0.0, _outcome("A/A 2", {XLA: _row(1.0, "FAILED on head", None)})),
    ]
    lines = []
    assert gate.report(outcomes, settings, plants, lines.append) == 1
    text = "\n".join(lines).splitlines()
    header = re.split(r"\s{2,}", text[0].strip())
    assert header == ["family", "implementation", "change", "trial", "head/base", "gap",
                      "re-measured", "kernels bench", "asv -f 1.02", "asv 1.1", "result"]
    rows = [re.split(r"\s{2,}", line.strip()) for line in text[2:]
            if line.startswith(("xla ", "- "))]
    assert rows == [
        ["xla", "softmax-xla", "A/A", "A/A 1", "1.001", "1.0%", "-", "same", ".", ".",
         "ok (same)"],
        ["-", "softmax-torch", "control", "+2% trial 1", "1.030", "1.0%", "-", "slower", "+",
         ".", "FALSE POSITIVE"],
        ["xla", "softmax-xla", "+2%", "+2% trial 1", "1.021", "0.4%", "-", "slower", "+", ".",
         "caught"],
        ["xla", "softmax-xla", "+3%", "+3% trial 1", "1.011", "1.0%", "-", "same", ".", ".",
         "MISSED"],
        ["xla", "softmax-xla", "-2%", "-2%", "-", "-", "-", "FAILED on head", ".", ".",
         "READ AS REGRESSION"],
        ["xla", "softmax-xla", "A/A", "A/A 2", "1.000", "-", "-", "FAILED on head", ".", ".",
         "FALSE POSITIVE"],
    ]
    assert "A/A and unplanted controls: 2 false positive(s) in 4 benchmark rows" in text
    assert text[-1] == ("gate-power: FAILED for +2% trial 1 softmax-torch, +3% trial 1 "
                        "softmax-xla, -2% softmax-xla, A/A 2 softmax-xla")

    quiet = [outcomes[0], ("plant", 0.02, _outcome("+2% trial 1", {XLA: _row(1.02, "slower")}))]
    lines = []
    assert gate.report(quiet, settings, plants, lines.append) == 0
    assert lines[-1] == ("gate-power: every plant caught, no false positive, no speed-up read "
                         "as a regression")
    assert "A/A and unplanted controls: 0 false positive(s) in 2 benchmark rows" in lines


def test_plants_cover_every_family_in_two_operations_or_more():
    by_family = {}
    for plant in gate.PLANTS:
        by_family.setdefault(plant.family, set()).add(plant.op)
        registry.implementation(plant.op, plant.impl)  # each names a real implementation
        for platform in ("gpu", "cpu"):
            assert "bench" in registry.operation(plant.op).case(plant.case[platform]).tags
    assert set(by_family) == set(gate.FAMILIES)
    # The sharded family plants in one operation: the others' leading rows are a batch of 8
    # or 16, where one row per device of the mesh is far more than a few percent.
    assert all(len(ops) >= 2 for family, ops in by_family.items() if family != "sharded"), \
        by_family
    assert len({plant.op for plant in gate.PLANTS}) >= 3


def test_asv_marks_a_row_worse_by_its_own_test():
    rng = np.random.default_rng(0)
    base = fakes.asv_result(list(1e-3 * (1 + 0.002 * rng.standard_normal(50))))
    slower = fakes.asv_result(list(1.07e-3 * (1 + 0.002 * rng.standard_normal(50))))
    assert gate.asv_marks_worse(base, slower, 1.05)
    assert not gate.asv_marks_worse(base, slower, 1.1)
    assert not gate.asv_marks_worse(slower, base, 1.05)  # a speed-up is not worse
    assert not gate.asv_marks_worse(base, None, 1.05)
    assert not gate.asv_marks_worse(fakes.asv_result([]), slower, 1.05)  # no value: no mark


def test_asv_marks_only_what_its_statistics_tell_apart():
    """The medians differ by more than the factor, the samples overlap: asv's test (what
    `asv continuous` marks) says nothing, though the ratio alone would."""
    rng = np.random.default_rng(1)
    base = fakes.asv_result(list(1e-3 * (1 + 0.2 * rng.standard_normal(20))))
    head = fakes.asv_result(list(base.value * 1.04 * (1 + 0.2 * rng.standard_normal(20))))
    assert head.value / base.value > 1.02
    assert not gate.asv_marks_worse(base, head, 1.02)


def test_bad_settings_are_refused_before_any_clone():
    with pytest.raises(ValueError, match=r"families: expected some of"):
        gate.Settings(families=("fortran",))
    with pytest.raises(ValueError, match=r"ops: expected some of"):
        gate.Settings(ops=("fft",))
    with pytest.raises(ValueError, match=r"no plant in families"):
        gate.Settings(families=("pallas",), ops=("row_sum",))
    with pytest.raises(ValueError, match=r"sizes: expected fractions in \(0, 1\)"):
        gate.Settings(sizes=(5.0,))
    with pytest.raises(ValueError, match=r"factor: expected a finite number > 1"):
        gate.Settings(factor=1.0)


@pytest.mark.parametrize("field, value, refused", [
    ("sizes", (0.0,), True), ("sizes", (1.0,), True), ("sizes", (1.5,), True),
    ("sizes", (0.999,), False), ("sizes", (1e-3, 0.5), False),
    ("trials", -1, True), ("trials", 0, False),
    ("aa_trials", -1, True), ("aa_trials", 0, False),
    ("confirm_rounds", -1, True), ("confirm_rounds", 0, False),
    ("factor", math.inf, True), ("factor", math.nan, True), ("factor", 1.0, True),
    ("factor", 1.001, False),
])
def test_each_setting_takes_its_whole_documented_range_and_nothing_past_it(field, value,
                                                                           refused):
    """Sizes are fractions in (0, 1); trial and round counts are >= 0 (0 skips that part);
    the factor is a finite number > 1. A refusal names the setting."""
    if refused:
        with pytest.raises(ValueError, match=rf"(^|, ){field}[:,]"):
            gate.Settings(**{field: value})
    else:
        assert getattr(gate.Settings(**{field: value}), field) == value


@pytest.mark.parametrize("trials, aa_trials, speedup", [(0, 0, False), (1, 0, False),
                                                        (0, 1, False), (0, 0, True)])
def test_a_run_needs_something_to_run_and_any_one_part_is_enough(trials, aa_trials, speedup):
    settings = dict(trials=trials, aa_trials=aa_trials, speedup=speedup)
    if not (trials or aa_trials or speedup):
        with pytest.raises(ValueError, match=r"^trials, aa_trials, speedup: expected something"
                                             r" to run, got no plant trial, no A/A trial and "
                                             r"no speedup$"):
            gate.Settings(**settings)
    else:
        assert gate.Settings(**settings).trials == trials


def test_a_torch_plant_needs_no_jax(monkeypatch):
    """A torch kernel's scratch clone may run where JAX is missing: its plant imports none."""
    import sys

    import torch

    registry.load()  # with JAX importable: the registry's own modules need it
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError
    with planted("softmax", "torch", 0.5) as slowed:
        out = slowed.fn(torch.randn(8, 4))
    torch.testing.assert_close(out.sum(-1), torch.ones(8))
