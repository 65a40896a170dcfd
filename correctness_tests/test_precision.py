"""Precision as part of the row: declarations validated, tolerances per precision, and ratios
only between implementations of one precision (docs/precision.md).

The numbers are the H200's matmul f32 4096^3 of 2026-12-01 (shared device notes): XLA 345 us
in TF32, torch 2674 us in FP32, our Triton kernel 2745 us in TF32, cuda_sgemm 3256 us in FP32.
"""

from __future__ import annotations

import math

import pytest

from correctness_tests import fakes
from kernels.core import checking, precisions, registry, timing

GPU_F32 = "f32-4096x4096x4096"
# name -> (median seconds, precision) on the GPU, f32 4096^3 forward.
H200_F32 = {"xla": (345e-6, "TF32"), "torch": (2674e-6, "FP32"), "triton": (2745e-6, "TF32"),
            "cuda_sgemm": (3256e-6, "FP32")}


def _measurement(name: str, method: str = "cupti") -> timing.Measurement:
    seconds, precision = H200_F32[name]
    samples = [seconds * f for f in (0.999, 1.0, 1.001)]
    return timing.Measurement.from_samples(samples, label=name, method=method, regime="cold",
                                           stop_reason="converged", fingerprint={},
                                           precision=precision)


# ------------------------------------------------------------------------------------------
# Declarations

def test_an_unknown_precision_is_refused_in_one_line_naming_the_choices():
    with pytest.raises(ValueError) as error:
        precisions.DotPrecision(gpu="tf32", cpu="FP32")
    assert str(error.value) == ("precision.gpu: expected one of ('FP32', 'TF32', 'BF16x3') or "
                                "None (no float32 inputs), got 'tf32'")
    with pytest.raises(ValueError, match=r"^precision\.cpu: expected .* got 'HIGHEST'$"):
        precisions.DotPrecision(gpu="TF32", cpu="HIGHEST")
    with pytest.raises(TypeError, match=r"^precision: expected a precisions.DotPrecision or None "
                                        r"for matmul-x, got 'TF32'$"):
        registry.Implementation(op="matmul", name="x", fn=abs, precision="TF32")


def test_registration_wants_a_declaration_exactly_where_the_operation_has_dots():
    registry.load()  # the operations first, as their implementations' modules import them
    undeclared = registry.Implementation(op="matmul", name="undeclared", fn=abs)
    with pytest.raises(ValueError, match=r"^matmul-undeclared: precision: expected a "
                                         r"precisions.DotPrecision .*BF16x3\), got None$"):
        registry.register_implementation(undeclared)
    needless = registry.Implementation(op="softmax", name="needless", fn=abs,
                                       precision=precisions.EVERYWHERE_FP32)
    with pytest.raises(ValueError, match=r"^softmax-needless: precision: expected None"):
        registry.register_implementation(needless)
    assert ("matmul", "undeclared") not in registry._IMPLEMENTATIONS
    assert ("softmax", "needless") not in registry._IMPLEMENTATIONS


# What each implementation multiplies float32 in, (GPU, CPU), pinned: a change is a decision
# someone makes on purpose, with the framework's documentation or code in hand (the
# registrations cite theirs). None: no float32 path.
DECLARED = {
    "attention": {"cudnn": (None, None), "pallas_mosaic": (None, None),
                  "pallas_triton": ("FP32", "FP32"), "torch_cudnn": (None, None),
                  "torch_flash": (None, None), "triton": ("FP32", "FP32"),
                  "xla": ("FP32", "FP32")},
    "matmul": {"cuda_mma": (None, None), "cuda_sgemm": ("FP32", "FP32"),
               "cuda_wgmma": (None, None), "pallas_mosaic": (None, None),
               "pallas_triton": ("TF32", "FP32"), "torch": ("FP32", "FP32"),
               "torch_tf32": ("TF32", "FP32"), "triton": ("TF32", "FP32"),
               "xla": ("TF32", "FP32")},
    "mlp": {"xla": ("TF32", "FP32"), "xla_remat": ("TF32", "FP32")},
    "moe": {"expert_parallel": ("TF32", "FP32"), "xla": ("TF32", "FP32")},
    "sharded_matmul": {"collective": ("TF32", "FP32"), "mosaic": (None, None),
                       "xla": ("TF32", "FP32")},
    "sharded_vmap": {"vmap": ("TF32", "FP32"), "xla": ("TF32", "FP32")},
    "transformer_block": {"nnx": ("TF32", "FP32"), "xla": ("TF32", "FP32")},
}


def test_every_implementation_with_dots_declares_its_precision_as_pinned():
    found = {op.name: {impl.name: (impl.precision.gpu, impl.precision.cpu)
                       for impl in registry.implementations(op.name)}
             for op in registry.operations() if op.dots}
    assert found == DECLARED
    without = {op.name for op in registry.operations() if not op.dots}
    assert without == {"softmax", "row_sum"}
    assert all(impl.precision is None for op in without for impl in registry.implementations(op))


def test_an_implementation_without_a_float32_path_refuses_every_f32_case():
    """A declaration of no float32 path must match `supports`, or a row would claim one."""
    for op in registry.operations():
        for impl in registry.implementations(op.name):
            if impl.precision != precisions.NO_FLOAT32:
                continue
            for case in (c for c in op.cases if c.dtype == "f32"):
                assert impl.supports(case), (impl.id, case.id)


def test_the_precision_of_a_case_follows_dtype_and_platform():
    op = registry.operation("matmul")
    f32, bf16 = op.case(GPU_F32), op.case("bf16-4096x4096x4096")
    xla, torch_ = registry.implementation("matmul", "xla"), registry.implementation("matmul",
                                                                                     "torch")
    assert (xla.precision_on(f32, "gpu"), xla.precision_on(f32, "cpu")) == ("TF32", "FP32")
    assert (torch_.precision_on(f32, "gpu"), torch_.precision_on(f32, "cpu")) == ("FP32", "FP32")
    assert xla.precision_on(bf16, "gpu") == torch_.precision_on(bf16, "gpu") == "BF16"
    softmax = registry.implementation("softmax", "pallas")
    assert softmax.precision_on(registry.operation("softmax").cases[0], "gpu") == "FP32"
    mosaic = registry.implementation("matmul", "pallas_mosaic")
    with pytest.raises(ValueError, match="matmul-pallas_mosaic: declares no float32 path"):
        mosaic.precision_on(f32, "gpu")
    with pytest.raises(ValueError, match="platform: expected 'gpu' or 'cpu', got 'tpu'"):
        xla.precision_on(f32, "tpu")


# ------------------------------------------------------------------------------------------
# Tolerance per precision

def test_the_tolerance_follows_the_declared_precision():
    op = registry.operation("matmul")
    case = op.case("f32-129x130x257")
    fp32, tf32 = op.tolerance_at(case, "FP32"), op.tolerance_at(case, "TF32")
    assert fp32 == op.tolerance(case) == pytest.approx(checking.relative_tolerance("f32", 257))
    assert tf32 == pytest.approx(fp32 + 2 * 2.0 ** -11)
    assert op.tolerance_at(case, "FP32") < op.tolerance_at(case, "BF16x3") < tf32
    triton = registry.implementation("matmul", "triton")
    assert checking.tolerance_for(triton, case, "gpu") == tf32
    assert checking.tolerance_for(triton, case, "cpu") == fp32
    bf16 = op.case("bf16-129x130x257")
    assert checking.tolerance_for(triton, bf16, "gpu") == op.tolerance(bf16)
    with pytest.raises(ValueError, match="softmax has no matrix products"):
        registry.operation("softmax").tolerance_at(registry.operation("softmax").cases[0],
                                                   "TF32")


def _fake_matmul(name: str, declared: precisions.DotPrecision) -> registry.Implementation:
    return registry.Implementation(op="matmul", name=name, fn=fakes.tf32_matmul,
                                   precision=declared)


@pytest.mark.parametrize("case_id", ["f32-129x130x257", "f32-64x64x64"])
def test_a_kernel_declared_fp32_that_runs_tf32_fails_its_check(case_id):
    """Planted: a matmul rounding its operands to TF32 while declaring FP32 is held to
    float32's tolerance and fails, output and gradients; declared TF32 the same kernel
    passes, so what fails is the lie, not the kernel."""
    case = registry.operation("matmul").case(case_id)
    fp32_tolerance = registry.operation("matmul").tolerance(case)
    lying = _fake_matmul("tf32-declared-fp32", precisions.EVERYWHERE_FP32)
    with pytest.raises(checking.CheckFailure,
                       match=rf"FP32\] output: rel \S+, max \S+ \(tol {fp32_tolerance:.1e}\)"):
        checking.check(lying, case)
    # The fake runs TF32 everywhere, the CPU too: so it declares.
    honest = checking.check(_fake_matmul("tf32-declared-tf32", precisions.DotPrecision(
        gpu="TF32", cpu="TF32")), case)
    assert [r.name.rsplit(" ", 1)[1] for r in honest] == ["output", "da", "db"]
    assert honest[0].tolerance > 100 * fp32_tolerance
    # The emulation is TF32's size of error: far over float32's tolerance, under TF32's.
    assert 10 * fp32_tolerance < honest[0].relative_error < honest[0].tolerance / 2


# ------------------------------------------------------------------------------------------
# Ratios compare one precision

def test_the_speedup_is_over_the_best_baseline_of_the_same_precision():
    """Planted: the best baseline of any precision (XLA's TF32, 345 us) as cuda_sgemm's peer
    reads 0.106x; its own precision's (torch's FP32) reads 0.82x."""
    baselines = {name: _measurement(name) for name in ("xla", "torch")}
    fp32 = timing.speedup(_measurement("cuda_sgemm"), baselines)
    assert (fp32.best, fp32.other_precision, fp32.precision) == ("torch", ("xla",), "FP32")
    assert fp32.value == pytest.approx(2674 / 3256)
    tf32 = timing.speedup(_measurement("triton"), baselines)
    assert (tf32.best, tf32.other_precision) == ("xla", ("torch",))
    assert tf32.value == pytest.approx(345 / 2745)
    # --mixed-clocks crosses clocks, never precisions.
    alone = timing.speedup(_measurement("cuda_sgemm"), {"xla": _measurement("xla")},
                           across_clocks=True)
    assert (alone.best, alone.value, alone.why_none()) == (None, None, "no FP32 baseline")


def test_a_baseline_of_another_precision_is_shown_labelled_and_never_divided_by():
    from kernels.bench import perfcheck
    from kernels.roofline import floors

    ours = _measurement("cuda_sgemm")
    baselines = {name: _measurement(name) for name in ("xla", "torch")}
    floor = floors.Floor(op="matmul", impl="cuda_sgemm", against="baseline", fraction=0.65,
                         reason="why")
    verdict = perfcheck.judge(label="k", device=fakes.gpu_fingerprint(), measured=ours,
                              baselines=baselines, placement=None, floor=floor, has_floors=True)
    assert (verdict.status, verdict.best_baseline) == ("pass", "torch")
    assert verdict.value == verdict.speedup == pytest.approx(2674 / 3256)
    lines = verdict.message.split("\n")
    assert "not compared (another precision than FP32): xla (TF32, 345.00 us)" in lines
    assert verdict.other_precision == ("xla (TF32, 345.00 us)",)
    assert not any(line.startswith("baseline xla") for line in lines), lines
    # A floor that names a peer of another precision is refused, not divided.
    named = perfcheck.judge(label="k", device=fakes.gpu_fingerprint(), measured=ours,
                            baselines=baselines, placement=None, has_floors=True,
                            floor=floors.Floor(op="matmul", impl="cuda_sgemm",
                                               against="baseline", fraction=0.65, reason="why",
                                               baseline="xla"))
    assert named.status == "refused" and named.value is None
    assert named.message.startswith("k: refusing to compare with baseline xla: it computed in "
                                    "TF32, k in FP32")
    # Only baselines of another precision: a refusal that names them with theirs.
    lone = perfcheck.judge(label="k", device=fakes.gpu_fingerprint(), measured=ours,
                           baselines={"xla": baselines["xla"]}, placement=None, floor=floor,
                           has_floors=True)
    assert lone.status == "refused"
    assert lone.message.split("\n")[0] == ("k: refusing to compare with a baseline: no baseline "
                                           "computed in FP32 (baselines: xla (TF32, 345.00 us))")
    work = registry.operation("matmul").work(registry.operation("matmul").case(GPU_F32), "fwd")
    info = perfcheck.extra_info(measured=ours, work=work, sheet=None, measured_roof=None,
                                verdict=verdict, baselines=baselines,
                                device=fakes.gpu_fingerprint())
    assert info["precision"] == "FP32" and info["baselines"]["xla"]["precision"] == "TF32"
    assert info["other_precision_baselines"] == ["xla (TF32, 345.00 us)"]


def test_the_time_table_divides_by_its_own_precision_and_says_where_none_ran():
    from kernels.cli import measure

    op = registry.operation("matmul")
    case = op.case(GPU_F32)
    rows = [measure.Row(registry.implementation("matmul", name), case, "fwd", _measurement(name))
            for name in ("xla", "torch", "triton", "cuda_sgemm")]
    cells = measure._speedups(rows)
    assert cells == {2: f"{345 / 2745:.2f}x", 3: f"{2674 / 3256:.2f}x"}
    no_peer = measure._speedups([rows[0], rows[3]], mixed=True)
    assert no_peer == {1: "no FP32 baseline"}


def _dashboard_benchmark(monkeypatch, records: dict, impl: str):
    """A Matmul benchmark with the dashboard's metrics on the GPU case, its records `records`
    (name -> median seconds or None for a skipped one), as asv's process would hold them."""
    import perf_tests.benchmarks as benchmarks

    monkeypatch.setattr(benchmarks.environment, "nvidia_gpu_present", lambda: True)
    journal = {("matmul", name, GPU_F32, "fwd"):
               {"event": "skipped", "reason": "n/a"} if seconds is None else
               {"event": "done", "samples": [seconds] * 3, "method": "cupti"}
               for name, seconds in records.items()}
    monkeypatch.setattr(benchmarks, "_records", lambda cls: journal)
    cls = type("Matmul", (benchmarks._DashboardMetrics, benchmarks._OperationBenchmarks),
               {"op_name": "matmul"})
    bench = cls()
    bench.impl = registry.implementation("matmul", impl)
    bench.case = registry.operation("matmul").case(GPU_F32)
    bench.direction = "fwd"
    bench.record = journal[("matmul", impl, GPU_F32, "fwd")]
    return benchmarks, bench


def test_track_speedup_is_over_the_best_baseline_of_the_kernels_precision(monkeypatch):
    records = {"xla": 345e-6, "torch": 2674e-6, "torch_tf32": None, "cuda_sgemm": 3256e-6,
               "triton": 2745e-6}
    benchmarks, sgemm = _dashboard_benchmark(monkeypatch, records, "cuda_sgemm")
    assert sgemm.track_speedup() == pytest.approx(2674 / 3256)
    _, triton = _dashboard_benchmark(monkeypatch, records, "triton")
    assert triton.track_speedup() == pytest.approx(345 / 2745)
    # Only a baseline of another precision ran: skipped (n/a), naming it with its precision.
    _, lone = _dashboard_benchmark(monkeypatch, {"xla": 345e-6, "cuda_sgemm": 3256e-6},
                                   "cuda_sgemm")
    with pytest.raises(NotImplementedError, match=r"no speedup: no baseline computed in FP32 "
                                                  r"\(xla \(TF32\): another precision"):
        lone.track_speedup()
    # A commit from before precisions were declared keeps its meaning: the best of any.
    monkeypatch.delattr(benchmarks.registry, "precision_of")
    assert sgemm.track_speedup() == pytest.approx(345 / 3256)
    assert math.isnan(_dashboard_benchmark(monkeypatch, records, "xla")[1].track_speedup())


def test_an_operation_with_dots_needs_a_tolerance_that_grows_with_the_rounding():
    """Planted: a tolerance that ignores `rounding` would hold a TF32 kernel to float32's."""
    import dataclasses

    matmul = registry.operation("matmul")
    registry._check_dot_tolerance(matmul)
    flat = dataclasses.replace(matmul, tolerance=lambda case, rounding=0.0: 1e-5)
    with pytest.raises(ValueError, match=r"^matmul.tolerance: expected a tolerance that grows "
                                         r"with the operands' rounding .*, got 1.000e-05 "
                                         r"either way$"):
        registry._check_dot_tolerance(flat)


def test_kernels_list_shows_each_implementations_float32_precision(capsys):
    from kernels.cli import check

    assert check.cmd_list(None) == 0
    rows = {tuple(line.split()[:2]): line.split()[4] for line in capsys.readouterr().out.split("\n")
            if len(line.split()) > 4 and line.split()[0] in ("matmul", "softmax")}
    assert (rows["matmul", "triton"], rows["matmul", "torch"], rows["matmul", "cuda_mma"],
            rows["softmax", "pallas"]) == ("TF32/FP32", "FP32", "-", "FP32")
