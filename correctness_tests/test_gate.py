"""The gate-power command's parts: the planted slowdown, the detectable shift, the verdicts."""

from __future__ import annotations

import contextlib
import math
import pathlib
import re

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
    """A fraction of 1 (a 50% plant scaled 2x, the documented CPU form) would run the very call
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
    with pytest.raises(ValueError, match=r"^site: a per-device site is planted in JAX kernels "
                                         r"only, got '_local_product' in a torch"):
        gate.plant_source("softmax", "triton", 0.02, "torch", "_local_product")


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

    assert "(asv columns: '+' is asv's own per-row 'worse' mark on the same results)" in text

    # a speed-up read as one is listed as ok; asv's plain 1.1 mark has its own column
    caught = gate.RowVerdict(1.2, 0.01, None, "slower", True, True)
    quiet = [outcomes[0], ("plant", 0.02, _outcome("+2% trial 1", {XLA: caught})),
             ("speed-up", 0.02, _outcome("-2%", {XLA: _row(0.98, "faster")}))]
    lines = []
    assert gate.report(quiet, settings, plants, lines.append) == 0
    rows = [re.split(r"\s{2,}", line.strip()) for line in "\n".join(lines).splitlines()
            if line.startswith("xla ")]
    assert rows[1][-3:] == ["+", "+", "caught"] and rows[2][-1] == "ok (faster)", rows
    assert lines[-1] == ("gate-power: every plant caught, no false positive, no speed-up read "
                         "as a regression")
    assert "A/A and unplanted controls: 0 false positive(s) in 2 benchmark rows" in lines


def test_a_sharded_plant_rings_over_every_gpu_of_the_machine():
    sharded = next(plant for plant in gate.PLANTS if plant.family == "sharded")
    for count in (2, 3, 4, 5, 8, 16):
        case = registry.operation(sharded.op).case(sharded.case_for("gpu", count))
        widest = max(n for n in (2, 4, 8) if n <= count)
        assert case.kwargs["mesh"] == f"1x{widest}", (count, case.id)
    # A CPU's forced host devices keep its one case whatever their number.
    assert sharded.case_for("cpu", 8) == sharded.case["cpu"]
    softmax = next(plant for plant in gate.PLANTS if plant.op == "softmax")
    assert softmax.case_for("gpu", 8) == softmax.case["gpu"]


def test_plants_cover_every_family_in_two_operations_or_more():
    by_family = {}
    for plant in gate.PLANTS:
        by_family.setdefault(plant.family, set()).add(plant.op)
        registry.implementation(plant.op, plant.impl)  # each names a real implementation
        for key in plant.case:  # every platform's case, and the wider machines' ones
            assert "bench" in registry.operation(plant.op).case(plant.case[key]).tags
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


# -- the flow: clone, commit each trial, run the CI path, report --------------------------------

@pytest.fixture
def flow(monkeypatch, tmp_path):
    """main_flow with a tiny scratch clone and a recording run_trial; yields (calls, scratch,
    expect) where `expect` holds what run_trial must be handed (settings, plants, log)."""
    from kernels.bench import asv_tools
    from kernels.core import vcs

    scratch = tmp_path / "scratch"
    top = pathlib.Path(vcs.output(pathlib.Path.cwd(), "rev-parse", "--show-toplevel"))
    source_head = vcs.output(top, "rev-parse", "HEAD")
    expect = {}

    def mkdtemp(prefix):
        assert prefix == "kernelperf-gate-"  # what the device scripts collect journals by
        scratch.mkdir()
        return str(scratch)

    def tiny_clone(source, commit, into, who):
        """vcs.scratch_clone's stand-in: main with the files trials edit."""
        assert (source, commit, into, who) == (top, source_head, scratch, "gate-power")
        for path in ("README.md", *(str(registry.module_path(p.op, p.impl))
                                    for p in gate.PLANTS)):
            (into / path).parent.mkdir(parents=True, exist_ok=True)
            (into / path).write_text("kernel\n")
        vcs.output(into, "init", "-q", "-b", "main")
        vcs.output(into, "config", "user.email", f"{who}@kernelperf")
        vcs.output(into, "config", "user.name", who)
        vcs.output(into, "add", "-A")
        vcs.output(into, "commit", "-q", "-m", "main")

    monkeypatch.setattr(gate.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(vcs, "scratch_clone", tiny_clone)
    monkeypatch.setattr(asv_tools, "register_machine", lambda: "fake-machine")
    monkeypatch.setenv("GIT_EDITOR", "false")  # a commit that would open an editor fails
    calls = []

    def run_trial(repo, label, base, head, plants, platform, settings, machine, log):
        assert repo == scratch and machine == "fake-machine"
        assert platform == expect.get("platform", "cpu")
        assert settings is expect["settings"] and log == expect["log"]
        # The settings' plants, each narrowed to its one case on this machine.
        narrowed = expect.get("narrowed", {})
        assert [(p.family, p.op, p.impl, p.scale, p.site, p.case) for p in plants] == [
            (p.family, p.op, p.impl, p.scale, p.site,
             {platform: narrowed.get(p.op, p.case[platform])}) for p in expect["plants"]]
        calls.append(dict(
            label=label, base=base, head=head, diff=vcs.output(repo, "diff", f"{head}~1", head),
            parent=vcs.output(repo, "rev-parse", f"{head}~1"),
            main=vcs.output(repo, "rev-parse", "main"),
            message=vcs.output(repo, "log", "-1", "--format=%s", head)))
        verdict = ("same" if label.startswith("A/A") else "faster" if label.startswith("-")
                   else "slower")
        return _outcome(label, {XLA: _row(1.0, verdict), CONTROL: _row(1.0, "same")})

    monkeypatch.setattr(gate, "run_trial", run_trial)
    return calls, scratch, expect, source_head


def _flow(flow, settings, plants=None, **kwargs):
    _, _, expect, _ = flow
    lines = []
    expect.update(settings=settings, log=lines.append,
                  plants=plants or tuple(p for p in gate.PLANTS if (p.op, p.impl) == XLA))
    return gate.main_flow(settings, log=lines.append, **kwargs), lines


def test_the_flow_runs_each_aa_trial_each_plant_and_the_smallest_reverted(flow):
    """Against the source's HEAD: every A/A commit adds one blank line to the README, every
    trial of a size plants that size (times the plant's scale) in the kernel's module alone,
    each on main, and the speed-up is the smallest size's first plant reverted, measured
    against that plant."""
    calls, scratch, _, head = flow
    settings = gate.Settings(families=("xla",), ops=("softmax",), sizes=(0.02, 0.03),
                             trials=2, aa_trials=2)
    status, lines = _flow(flow, settings)
    assert status == 0
    assert lines[0] == (f"gate-power: scratch clone {scratch} of {head[:8]}; machine "
                        f"fake-machine; 1 plants: softmax-xla f32-64x1000")
    assert [c["label"] for c in calls] == ["A/A 1", "A/A 2", "+2% trial 1", "+2% trial 2",
                                           "+3% trial 1", "+3% trial 2",
                                           "-2% (plant reverted)"]
    assert [c["message"] for c in calls[:6]] == [
        "A/A 1", "A/A 2", "plant +2% trial 1", "plant +2% trial 2", "plant +3% trial 1",
        "plant +3% trial 2"]
    plant = next(p for p in gate.PLANTS if (p.op, p.impl) == XLA)
    module = str(registry.module_path(*XLA))
    for call in calls[:6]:
        assert call["base"] == head and call["parent"] == call["main"], call  # each on main
        edited = re.findall(r"^\+\+\+ b/(\S+)", call["diff"], re.M)
        added = re.findall(r"^\+(?!\+\+ )(.*)$", call["diff"], re.M)
        if call["label"].startswith("A/A"):
            assert edited == ["README.md"] and added == [""], call
        else:
            size = float(call["label"][1:2]) / 100
            assert edited == [module], call
            assert "".join(f"{line}\n" for line in added).strip() == gate.plant_source(
                *XLA, size * plant.scale, "jax").strip()
    first_two = calls[2]
    assert calls[6]["base"] == first_two["head"] and calls[6]["parent"] == first_two["head"]
    assert re.search(r"^-_kernelperf_planted_slowdown\(\)$", calls[6]["diff"], re.M)
    assert not scratch.exists()  # the scratch clone is removed unless kept
    assert lines[-1].startswith("gate-power: every plant caught")


def test_a_plant_never_recomputes_more_than_every_row(flow):
    calls, *_ = flow
    settings = gate.Settings(families=("xla",), ops=("softmax",), sizes=(0.8,), trials=1,
                             aa_trials=0, speedup=False)
    assert _flow(flow, settings)[0] == 0
    assert "recomputes 100.0% of the rows" in calls[0]["diff"]  # 0.8 x scale 2.0, capped


def test_two_plants_in_one_commit_each_in_its_own_module(flow):
    calls, *_ = flow
    settings = gate.Settings(families=("xla", "triton"), ops=("softmax",), sizes=(0.02,),
                             trials=1, aa_trials=0, speedup=False)
    plants = tuple(p for p in gate.PLANTS if p.op == "softmax" and p.family in ("xla", "triton"))
    status, lines = _flow(flow, settings, plants)
    assert status == 0 and len(plants) == 2
    edited = sorted(re.findall(r"^\+\+\+ b/(\S+)", calls[0]["diff"], re.M))
    assert edited == sorted(str(registry.module_path(p.op, p.impl)) for p in plants)
    for plant in plants:
        impl = registry.implementation(plant.op, plant.impl)
        assert gate.plant_source(plant.op, plant.impl, 0.02 * plant.scale,
                                 impl.framework).strip().splitlines()[2] in calls[0]["diff"]
    assert lines[0].endswith("2 plants: softmax-triton f32-64x1000, softmax-xla f32-64x1000")


def test_plants_sharing_a_module_are_all_planted_and_a_sharded_one_at_its_site(
        flow, monkeypatch):
    calls, *_ = flow
    xla = next(p for p in gate.PLANTS if (p.op, p.impl) == XLA)
    sharded = next(p for p in gate.PLANTS if p.family == "sharded")
    monkeypatch.setattr(gate, "PLANTS", (xla, gate.dataclasses.replace(xla, scale=1.0), sharded))
    from kernels.core import devices

    reason = devices.case_unavailable_reason(registry.implementation(sharded.op, sharded.impl),
                                             registry.operation(sharded.op).case(
                                                 sharded.case["cpu"]))
    if reason:
        pytest.skip(reason)
    settings = gate.Settings(families=("xla", "sharded"), ops=("softmax", "sharded_matmul"),
                             sizes=(0.02,), trials=1, aa_trials=0, speedup=False)
    assert _flow(flow, settings, gate.PLANTS)[0] == 0
    diff = calls[0]["diff"]
    assert len(re.findall(r"^\+_kernelperf_planted_slowdown\(\)$", diff, re.M)) == 3
    assert "recomputes 4.0% of the rows" in diff and "recomputes 2.0% of the rows" in diff
    assert f"+    inner = globals()[{sharded.site!r}]" in diff


def test_on_a_gpu_the_flow_plants_the_gpu_cases(flow, monkeypatch):
    from kernels.core import devices

    calls, _, expect, _ = flow
    machine = devices.this_machine()
    monkeypatch.setattr(devices, "this_machine",
                        lambda: gate.dataclasses.replace(machine, platform="gpu"))
    monkeypatch.setattr(devices, "case_unavailable_reason", lambda impl, case: None)
    expect["platform"] = "gpu"
    settings = gate.Settings(families=("xla",), ops=("softmax",), sizes=(0.02,), trials=1,
                             aa_trials=0, speedup=False)
    status, lines = _flow(flow, settings)
    assert status == 0 and len(calls) == 1
    assert lines[0].endswith("1 plants: softmax-xla f32-32768x4096")


def test_on_four_gpus_the_flow_rings_the_sharded_plant_over_all_four(flow, monkeypatch):
    from kernels.core import devices

    calls, _, expect, _ = flow
    machine = devices.this_machine()
    monkeypatch.setattr(devices, "this_machine", lambda: gate.dataclasses.replace(
        machine, platform="gpu", device_count=4))
    monkeypatch.setattr(devices, "case_unavailable_reason", lambda impl, case: None)
    expect.update(platform="gpu", narrowed={"sharded_matmul": "bf16-8192x8192x4096-mesh1x4"})
    settings = gate.Settings(families=("sharded",), ops=("sharded_matmul",), sizes=(0.02,),
                             trials=1, aa_trials=0, speedup=False)
    # (The stand-in trial reports softmax rows only, so the run reads the plant as missed.)
    _, lines = _flow(flow, settings, tuple(p for p in gate.PLANTS if p.family == "sharded"))
    assert len(calls) == 1  # the stand-in trial checked the plant it was given
    assert lines[0].endswith("1 plants: sharded_matmul-collective bf16-8192x8192x4096-mesh1x4")


def test_the_flow_names_a_plant_that_cannot_run_here_and_plants_the_rest(flow):
    calls, *_ = flow
    settings = gate.Settings(families=("xla", "cuda"), ops=("softmax",), sizes=(0.02,),
                             trials=1, aa_trials=0, speedup=False)
    status, lines = _flow(flow, settings)
    assert status == 0 and [c["label"] for c in calls] == ["+2% trial 1"]
    assert lines[0].startswith("gate-power: no cuda plant in softmax here (softmax-cuda "
                               "f32-64x1000: needs a CUDA GPU")


def test_the_flow_keeps_the_clone_when_asked(flow):
    calls, scratch, *_ = flow
    settings = gate.Settings(families=("xla",), ops=("softmax",), sizes=(0.02,), trials=1,
                             aa_trials=0, speedup=False)
    status, lines = _flow(flow, settings, keep=True)
    assert status == 0 and [c["label"] for c in calls] == ["+2% trial 1"]
    assert scratch.exists() and lines[-1] == f"kept {scratch}"


def test_an_interrupted_flow_reports_the_trials_it_finished_and_exits_1(flow, monkeypatch):
    recording = gate.run_trial

    def interrupted_on_the_plant(repo, label, *args):
        if label.startswith("+"):
            raise KeyboardInterrupt
        return recording(repo, label, *args)

    monkeypatch.setattr(gate, "run_trial", interrupted_on_the_plant)
    status, lines = _flow(flow, gate.Settings(families=("xla",), ops=("softmax",),
                                              sizes=(0.02,)))
    assert status == 1
    text = "\n".join(lines)
    assert "gate-power: interrupted after 1 trial(s); reporting those" in text
    assert "0 false positive(s) in 2 benchmark rows" in text


def test_a_missed_plant_fails_the_flow(flow, monkeypatch):
    recording = gate.run_trial

    def quiet(repo, label, *args):
        outcome = recording(repo, label, *args)
        return _outcome(label, {**outcome.rows, XLA: _row(1.0, "same")})

    monkeypatch.setattr(gate, "run_trial", quiet)
    status, lines = _flow(flow, gate.Settings(families=("xla",), ops=("softmax",),
                                              sizes=(0.02,), trials=1, speedup=False))
    assert status == 1 and lines[-1] == "gate-power: FAILED for +2% trial 1 softmax-xla"


def test_the_flow_refuses_families_that_cannot_run_here_in_one_line(flow):
    with pytest.raises(gate.validation.UserError,
                       match=r"^families \['cuda'\] of operations \['softmax'\]: none can run "
                             r"here \(cpu\); on a CPU, --families xla pallas triton$"):
        gate.main_flow(gate.Settings(families=("cuda",), ops=("softmax",)), log=print)
    assert flow[0] == []


def test_lines_are_printed_whole_and_at_once(capsys):
    gate._print("gate-power: a line")
    assert capsys.readouterr().out == "gate-power: a line\n"


class _FakeBench:
    """subprocess.Popen's stand-in for `kernels bench`: prints `lines`, writes `rows` to the
    --json file, exits `code`."""

    def __init__(self, rows, lines, code):
        self.rows, self.lines, self.code, self.calls = rows, lines, code, []
        self.real = gate.subprocess.Popen  # every other process (git, a device probe) runs

    def __call__(self, command, *args, cwd=None, env=None, **kwargs):
        import io
        import json

        if command[1:4] != ["-m", "kernels", "bench"]:
            return self.real(command, *args, cwd=cwd, env=env, **kwargs)
        # one text stream, asv's errors in it
        assert kwargs == dict(text=True, stdout=gate.subprocess.PIPE,
                              stderr=gate.subprocess.STDOUT), kwargs
        self.calls.append(dict(command=command, cwd=cwd, env=env))
        if self.rows is not None:
            gate.pathlib.Path(command[command.index("--json") + 1]).write_text(
                json.dumps(self.rows))
        self.stdout = io.StringIO("".join(f"{line}\n" for line in self.lines))
        return self

    def wait(self):
        return self.code


TIME = "benchmarks.Softmax.time_device"
PARAMS = ["'xla'", "'f32-64x1000'", "'fwd'"]
TRITON_MATMUL = ("matmul", "triton")


@pytest.mark.parametrize("platform,code", [("cpu", 1), ("gpu", 0)])
def test_a_trial_runs_the_ci_path_narrowed_to_its_plants_and_reads_every_verdict(
        monkeypatch, tmp_path, platform, code):
    from kernels.bench import asv_tools

    (tmp_path / ".asv").mkdir()
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setenv("KERNELPERF_FROM_THE_CALLER", "kept")
    matmul = ["'triton'", "'f32-129x130x257'", "'fwd'"]
    rows = [dict(benchmark="benchmarks.Softmax.track_peak_memory", params=PARAMS, ratio=1.0,
                 gap=None, confirmed=None, verdict="same"),
            dict(benchmark=TIME, params=PARAMS, ratio=1.05, gap=0.012, confirmed="1.04 1.05",
                 verdict="slower"),
            dict(benchmark=TIME, params=["'torch'", *PARAMS[1:]], ratio=1.0, gap=0.02,
                 confirmed=None, verdict="same"),
            dict(benchmark="benchmarks.Matmul.time_device", params=matmul, ratio=1.2,
                 gap=0.01, confirmed=None, verdict="slower"),
            dict(benchmark="benchmarks.Attention.time_device", params=PARAMS, ratio=1.0,
                 gap=0.01, confirmed=None, verdict="same")]
    lines = ["· Discovering benchmarks", "[50%] ··· benchmarks.Softmax.time_device ok",
             "noise from a tool", "confirming 1 slower row(s): 2 rounds", "  round 1: 1.04",
             "confirmation took 9 s", "summary: 1 slower, 1 same",
             "smallest change callable: 1.2%", "asv on 2 commit(s) took 9 s",
             "kernels bench: 12 s in all", "  4 parameter sets measured", "another tool's line"]
    fake = _FakeBench(rows, lines, code)
    monkeypatch.setattr(gate.subprocess, "Popen", fake)
    results = {"b" * 40: {(TIME, tuple(PARAMS)): fakes.asv_timed(1.0, 0.002),
                          (TIME, ("'torch'", *PARAMS[1:])): fakes.asv_timed(1.0, 0.002),
                          ("benchmarks.Matmul.time_device", tuple(matmul)):
                              fakes.asv_timed(1.0, 0.002)},
               "h" * 40: {(TIME, tuple(PARAMS)): fakes.asv_timed(1.05, 0.002, seed=1),
                          (TIME, ("'torch'", *PARAMS[1:])): fakes.asv_timed(1.0, 0.002, seed=1),
                          ("benchmarks.Matmul.time_device", tuple(matmul)):
                              fakes.asv_timed(1.2, 0.002, seed=1)}}
    monkeypatch.setattr(asv_tools, "load",
                        lambda folder, machine, commit: results[commit] if
                        (folder, machine) == (str(tmp_path / ".asv" / "results"), "m") else {})
    plants = tuple(p for p in gate.PLANTS if (p.op, p.impl) in (XLA, TRITON_MATMUL))
    settings = gate.Settings(families=("xla", "triton"), ops=("softmax", "matmul"),
                             confirm_rounds=2)
    logged = []
    outcome = gate.run_trial(tmp_path, "+2% trial 1", "b" * 40, "h" * 40, plants, platform,
                             settings, "m", logged.append)
    (call,) = fake.calls
    command = call["command"]
    assert command[0] == gate.os.path.abspath(gate.sys.executable) and call["cwd"] == tmp_path
    assert command[command.index("--base") + 1] == "b" * 40
    assert command[command.index("--head") + 1] == "h" * 40
    assert command[command.index("--bench") + 1] == r"(Matmul|Softmax)\.time_device"
    assert command[command.index("--confirm-rounds") + 1] == "2"
    # the interleaved gate: the base is measured beside the head, never reused
    assert "--reuse-base" not in command and "--sequential" not in command
    env = call["env"]
    cases = sorted(p.case[platform] for p in plants)
    assert env["KERNELPERF_BENCH_CASES"] == ",".join(cases)
    assert env["KERNELPERF_BENCH_DIRECTIONS"] == "fwd" and env["PYTHONUNBUFFERED"] == "1"
    assert env["KERNELPERF_FROM_THE_CALLER"] == "kept"
    narrowed = {"KERNELPERF_BENCH_FULL": "1", "KERNELPERF_BENCH_IMPLS": "triton,xla"}
    assert {k: env.get(k) for k in narrowed} == (narrowed if platform == "cpu"
                                                 else dict.fromkeys(narrowed))
    assert logged == [f"[+2% trial 1] kernels bench --base bbbbbbbb --head hhhhhhhh "
                      f"(Matmul|Softmax, {', '.join(cases)}, fwd)"] + [
        f"  {line}" for line in lines if "tool" not in line]
    assert outcome.label == "+2% trial 1" and outcome.exit == code
    assert outcome.rows == {
        XLA: gate.RowVerdict(1.05, 0.012, "1.04 1.05", "slower", True, False),
        CONTROL: gate.RowVerdict(1.0, 0.02, None, "same", False, False),
        TRITON_MATMUL: gate.RowVerdict(1.2, 0.01, None, "slower", True, True),
        # a benchmark of no planted operation keeps its own name
        ("benchmarks.Attention.time_device", "xla"): gate.RowVerdict(
            1.0, 0.01, None, "same", False, False)}


def test_a_trial_whose_bench_broke_raises_with_the_end_of_its_output(monkeypatch, tmp_path):
    (tmp_path / ".asv").mkdir()
    plants = tuple(p for p in gate.PLANTS if (p.op, p.impl) == XLA)
    settings = gate.Settings(families=("xla",), ops=("softmax",), reuse_base=False)
    output = [f"{index:04d} " + "x" * 95 for index in range(40)]  # 4000 characters
    for rows, code in ((None, 1), ([], 2)):
        fake = _FakeBench(rows, output, code)
        monkeypatch.setattr(gate.subprocess, "Popen", fake)
        with pytest.raises(RuntimeError) as raised:
            gate.run_trial(tmp_path, "A/A 1", "base", "head", plants, "cpu", settings, "m",
                           print)
        header, tail = str(raised.value).split("\n", 1)
        assert header == f"A/A 1: kernels bench exited {code}:"
        assert tail == "".join(f"{line}\n" for line in output)[-3000:]
        assert "--reuse-base" not in fake.calls[0]["command"]


@pytest.mark.parametrize(("sequential", "reuse", "flags"), [
    (False, True, []), (True, True, ["--sequential", "--reuse-base"]),
    (True, False, ["--sequential"])])
def test_a_trial_runs_the_interleaved_gate_unless_told_sequential(monkeypatch, tmp_path,
                                                                  sequential, reuse, flags):
    """The interleaved gate measures the base beside the head in every trial: reusing the
    base's results is for the sequential (asv run) gate only."""
    from kernels.bench import asv_tools

    (tmp_path / ".asv").mkdir()
    plants = tuple(p for p in gate.PLANTS if (p.op, p.impl) == XLA)
    settings = gate.Settings(families=("xla",), ops=("softmax",), sequential=sequential,
                             reuse_base=reuse)
    fake = _FakeBench([], [], 0)
    monkeypatch.setattr(gate.subprocess, "Popen", fake)
    monkeypatch.setattr(asv_tools, "load", lambda *args: {})
    gate.run_trial(tmp_path, "A/A 1", "b" * 40, "h" * 40, plants, "cpu", settings, "m",
                   lambda _: None)
    command = fake.calls[0]["command"]
    assert [word for word in command if word in ("--sequential", "--reuse-base")] == flags
