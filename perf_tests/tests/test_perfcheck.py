"""The performance checks' own logic, on made-up measurements: floors, verdicts, clock, refusals.

These run everywhere in a fraction of a second; the GPU items of
test_performance.py rely on them to fail a slow kernel and nothing else.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from kernels.bench import perfcheck
from kernels.core import fingerprint, registry, timing
from kernels.roofline import ceilings, floors, model

H100 = "NVIDIA H100 80GB HBM3"


def _device(name: str = H100, platform: str = "gpu") -> fingerprint.Fingerprint:
    return fingerprint.Fingerprint(
        platform=platform, name=name, model=fingerprint.normalise(name), sm_count=132,
        memory_bytes=80 << 30, l2_bytes=50 << 20, compute_capability="90", driver="580",
        cuda="13.0", default_sm_mhz=1980, max_sm_mhz=1980, versions=(("jax", "0.11.2"),))


def _measurement(median_s: float, method: str = "cupti", label: str = "m",
                 precision: str = "") -> timing.Measurement:
    samples = [median_s * f for f in (0.999, 1.0, 1.001)]
    return timing.Measurement.from_samples(samples, label=label, method=method, regime="cold",
                                           stop_reason="converged", fingerprint={},
                                           precision=precision)


def _softmax(case_id: str = "f32-32768x4096"):
    op = registry.operation("softmax")
    return op, registry.implementation("softmax", "pallas"), op.case(case_id)


def _sheet_placement(op, case, seconds: float) -> model.Placement:
    return model.place(op.work(case, "fwd"), seconds, ceilings.datasheet(H100), case.dtype)


def _judge(measured, baselines, placement, floor, device=None, has_floors=True):
    return perfcheck.judge(label="softmax-pallas-f32-32768x4096-fwd", device=device or _device(),
                           measured=measured, baselines=baselines, placement=placement,
                           floor=floor, has_floors=has_floors)


# The floor table


def test_every_kernel_has_an_h100_floor_on_every_gpu_bench_case():
    """...of one device: sharded cases have no floor (perf_items leaves them out)."""
    missing = []
    for op in registry.operations():
        cases = [c for c in op.cases if {"bench", "gpu"} <= c.tags]
        for impl in registry.implementations(op.name):
            if impl.baseline:
                continue
            for case in (c for c in cases if impl.devices_for(c) == 1):
                for direction in registry.DIRECTIONS:
                    if registry.has_direction(impl, direction) and floors.floor_for(
                            H100, op.name, impl.name, case.id, direction) is None:
                        missing.append(f"{impl.id}-{case.id}-{direction}")
    assert not missing, f"kernels with no H100 floor: {missing}"


@pytest.mark.parametrize("device_name", sorted(floors.FLOORS))
def test_floor_tables_name_real_kernels_baselines_and_roofs(device_name):
    assert ceilings.datasheet(device_name) is not None, \
        f"{device_name}: floors need the datasheet roofs beside them"
    for floor in floors.FLOORS[device_name]:
        impl = registry.implementation(floor.op, floor.impl)
        assert not impl.baseline, f"{floor}: baselines have no floor"
        if floor.baseline:
            assert registry.implementation(floor.op, floor.baseline).baseline, floor
        assert len(floor.reason) <= 200, f"{floor.op}-{floor.impl}: reason is one line"


def test_each_gpu_model_is_judged_by_its_own_floors_only():
    """A floor records what one GPU model measured: no floor (object or reason) is shared
    between two models' tables, and every other model the datasheet knows has no table, so
    its runs record and skip instead of being held to another model's numbers."""
    owners: dict[int, list[str]] = {}
    reasons: dict[str, list[str]] = {}
    for model_name, table in floors.FLOORS.items():
        for floor in table:
            owners.setdefault(id(floor), []).append(model_name)
        for reason in {floor.reason for floor in table}:
            reasons.setdefault(reason, []).append(model_name)
    assert all(len(models) == 1 for models in owners.values()), owners
    assert all(len(models) == 1 for models in reasons.values()), \
        {reason: models for reason, models in reasons.items() if len(models) > 1}
    for model_name in set(ceilings.DATASHEET) - set(floors.FLOORS):
        assert floors.table(model_name) is None, model_name
        assert floors.floor_for(model_name, "softmax", "pallas", "f32-32768x4096", "fwd") is None
    for model_name, table in floors.FLOORS.items():
        assert floors.table(model_name) is table


def test_floor_for_reads_the_named_models_table(monkeypatch):
    """The floor comes from the asked model's table, not another's: two models, one floor
    each, same kernel."""
    fields = dict(op="softmax", impl="pallas", against="baseline")
    slow = floors.Floor(**fields, fraction=0.2, reason="model A's run")
    fast = floors.Floor(**fields, fraction=0.9, reason="model B's run")
    monkeypatch.setattr(floors, "FLOORS", {"GPU A": (slow,), "GPU B": (fast,)})
    assert floors.floor_for("GPU A", "softmax", "pallas", "f32-1x1", "fwd") is slow
    assert floors.floor_for("GPU B", "softmax", "pallas", "f32-1x1", "fwd") is fast
    assert floors.floor_for("GPU C", "softmax", "pallas", "f32-1x1", "fwd") is None
    assert floors.table("GPU B") == (fast,) and floors.table("GPU C") is None


def test_the_most_specific_floor_wins_and_ties_are_refused(monkeypatch):
    picked = floors.floor_for(H100, "softmax", "pallas", "f32-256x1024", "bwd")
    assert (picked.case, picked.direction, picked.against) == ("256x1024", "bwd", "baseline")
    picked = floors.floor_for(H100, "matmul", "triton", "f32-4096x4096x4096", "fwd")
    assert picked.case == "f32-"
    twin = dataclasses.replace(picked, fraction=0.1)
    monkeypatch.setitem(floors.FLOORS, "Twin GPU", (picked, twin))
    with pytest.raises(ValueError, match="equally"):
        floors.floor_for("Twin GPU", "matmul", "triton", "f32-4096x4096x4096", "fwd")


@pytest.mark.parametrize("bad, match", [
    (dict(against="copy"), "against"), (dict(fraction=0.0), "fraction"),
    (dict(direction="both"), "direction"), (dict(reason=" "), "reason"),
    (dict(against="roofline", baseline="xla"), "baseline")])
def test_floor_rejects_bad_fields(bad, match):
    fields = dict(op="softmax", impl="pallas", against="baseline", fraction=0.5, reason="why")
    with pytest.raises(ValueError, match=match):
        floors.Floor(**{**fields, **bad})


def test_a_floor_describes_what_it_is_a_fraction_of():
    fields = dict(op="softmax", impl="pallas", fraction=0.5, reason="why")
    assert floors.Floor(**fields, against="roofline").describe() == \
        "0.50 of the datasheet roofline"
    assert floors.Floor(**fields, against="baseline").describe() == "0.50 of the best baseline"
    assert floors.Floor(**fields, against="baseline", baseline="torch").describe() == \
        "0.50 of baseline torch"


@pytest.mark.parametrize("fraction", [1e-3, 1.0, 1.5])
def test_floor_fractions_up_to_one_and_a_half_are_taken(fraction):
    floor = floors.Floor(op="softmax", impl="pallas", against="roofline", fraction=fraction,
                         reason="why", direction="bwd", case="1x1")
    assert floor.matches("softmax", "pallas", "f32-1x1", "bwd")
    assert not floor.matches("softmax", "pallas", "f32-1x1", "fwd")
    assert not floor.matches("softmax", "pallas", "f32-2x2", "bwd")
    assert not floor.matches("softmax", "triton", "f32-1x1", "bwd")
    assert not floor.matches("matmul", "pallas", "f32-1x1", "bwd")
    assert floor.specificity == (True, True)


def test_floor_rejects_a_fraction_above_one_and_a_half_naming_it():
    with pytest.raises(ValueError, match=r"^fraction: expected 0 < fraction <= 1.5, got 1.6$"):
        floors.Floor(op="softmax", impl="pallas", against="roofline", fraction=1.6, reason="r")


def test_floors_made_for_several_kernels_share_everything_but_the_kernel():
    made = floors._floors("softmax", ("pallas", "triton"), "baseline", 0.4, "shared reason",
                          direction="bwd", case="256x1024")
    assert [f.impl for f in made] == ["pallas", "triton"]
    assert {(f.op, f.against, f.fraction, f.reason, f.direction, f.case, f.baseline)
            for f in made} == {("softmax", "baseline", 0.4, "shared reason", "bwd",
                                "256x1024", None)}
    (one,) = floors._floors("matmul", "cuda_sgemm", "baseline", 0.6, "r", baseline="torch")
    assert (one.impl, one.baseline, one.direction, one.case) == ("cuda_sgemm", "torch", None,
                                                                 None)


# Verdicts


def test_roofline_floor_passes_a_fast_kernel_and_fails_a_slow_one_with_every_number():
    op, _, case = _softmax()
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    baselines = {"xla": _measurement(358e-6), "torch": _measurement(454e-6)}
    fast = _measurement(355e-6)
    verdict = _judge(fast, baselines, _sheet_placement(op, case, fast.median_s), floor)
    assert verdict.status == "pass" and verdict.value > floor.fraction
    assert verdict.best_baseline == "xla" and verdict.speedup == pytest.approx(358 / 355, 1e-3)

    slow = _measurement(533e-6)  # the 1.5x plant of RESULTS.md (column blocks capped)
    verdict = _judge(slow, baselines, _sheet_placement(op, case, slow.median_s), floor)
    assert verdict.status == "fail"
    assert verdict.value == pytest.approx(2 * case["rows"] * case["cols"] * 4 / 533e-6 / 3.35e12,
                                          rel=1e-3)
    for expected in ("under its floor", f"floor {floor.fraction:.2f}", "533.00 us", "cupti",
                     "baseline xla: 358.00 us", "datasheet", floor.reason):
        assert expected in verdict.message, (expected, verdict.message)


def test_baseline_floor_compares_with_the_best_baseline_of_the_same_clock():
    op, _, case = _softmax("f32-256x1024")
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    assert floor.against == "baseline"
    baselines = {"xla": _measurement(2.6e-6), "torch": _measurement(1.0e-6, "cuda-events")}
    placement = _sheet_placement(op, case, 2.0e-6)
    assert _judge(_measurement(2.0e-6), baselines, placement, floor).status == "pass"
    verdict = _judge(_measurement(6.0e-6), baselines, placement, floor)
    assert verdict.status == "fail" and verdict.value == pytest.approx(2.6 / 6.0, 1e-3)
    # torch, 1.0 us by CUDA events, is faster but on another clock: listed, never compared.
    assert verdict.best_baseline == "xla" and verdict.refused_baselines == ("torch (cuda-events)",)
    assert "not compared (another clock than cupti): torch (cuda-events)" in verdict.message


def test_no_baseline_on_the_same_clock_is_refused_not_passed():
    op, _, case = _softmax("f32-256x1024")
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    verdict = _judge(_measurement(2.0e-6), {"xla": _measurement(2.6e-6, "host-clock")},
                     _sheet_placement(op, case, 2.0e-6), floor)
    assert verdict.status == "refused"
    assert "timed by cupti" in verdict.message and "xla (host-clock)" in verdict.message


def test_a_named_baseline_is_the_one_compared():
    """cuda_sgemm's hand-written H100 floor names torch, and the best baseline of its precision
    (FP32) is torch's too, not XLA's faster TF32 GEMM: named or not, the same peer is the one
    compared."""
    floor = floors.floor_for(H100, "matmul", "cuda_sgemm", "f32-4096x4096x4096", "fwd")
    assert floor.baseline == "torch"
    baselines = {"torch": _measurement(2.68e-3, precision="FP32"),
                 "xla": _measurement(0.4e-3, precision="TF32")}
    for chosen in (floor, dataclasses.replace(floor, baseline=None)):
        verdict = _judge(_measurement(3.26e-3, precision="FP32"), baselines, None, chosen)
        assert verdict.status == "pass" and verdict.value == pytest.approx(2.68 / 3.26, 1e-3)
        assert verdict.best_baseline == "torch"


def test_a_model_without_floors_and_a_cpu_skip_naming_the_device():
    measured = _measurement(1e-3)
    h200 = _judge(measured, {}, None, None, device=_device("NVIDIA H200"), has_floors=False)
    assert h200.status == "skipped" and "'NVIDIA H200'" in h200.message
    cpu = _judge(measured, {}, None, None, device=_device("AMD EPYC", "cpu"), has_floors=False)
    assert cpu.status == "skipped" and "CPU (AMD EPYC)" in cpu.message
    gap = _judge(measured, {}, None, None, has_floors=True)
    assert gap.status == "skipped" and "add one" in gap.message


def test_comparison_with_a_saved_run_is_refused_across_clocks_and_models():
    device = _device()
    measured = _measurement(1e-3)
    same = {"model": device.model}
    assert perfcheck.compare_refusal({"clock_method": "cupti"}, same, measured, device,
                                     "0001") is None
    other_clock = perfcheck.compare_refusal({"clock_method": "cuda-events"}, same, measured,
                                            device, "0001")
    assert "timed by cuda-events, this run by cupti" in other_clock
    other_model = perfcheck.compare_refusal({"clock_method": "cupti"}, {"model": "nvidia-h200"},
                                            measured, device, "0001")
    assert "nvidia-h200" in other_model and device.model in other_model


# The clock that feeds pytest-benchmark


def test_device_clock_advances_by_exactly_each_sample_and_no_further():
    clock = timing.DeviceClock()
    samples = [3.5e-4, 1.25e-6, 2.0]
    clock.load(samples)
    durations = []
    for _ in samples:  # what pytest-benchmark's pedantic runner does per round
        start = clock.read()
        clock.step()
        durations.append(clock.read() - start)
    assert durations == pytest.approx(samples, rel=1e-12)
    with pytest.raises(RuntimeError, match="no device samples left"):
        clock.step()


def test_storage_is_per_device_model():
    assert perfcheck.default_storage("nvidia-h100-80gb-hbm3") == \
        "file://./.benchmarks/nvidia-h100-80gb-hbm3"


def test_floors_are_judged_under_xdist_workers_only_with_the_device_alone(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    assert "4 pytest-xdist workers share the device and this one does not hold it alone" in \
        perfcheck.parallel_reason()
    assert perfcheck.parallel_reason(alone=True) is None  # the device lock held exclusive
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    assert perfcheck.parallel_reason() is None


# The run's last line on its perf items

def test_a_gpu_model_without_floors_is_a_finding_naming_it_and_the_bring_up():
    line = perfcheck.finding(device_name="NVIDIA B200", platform="gpu", has_floors=False,
                             statuses={"skipped": 88})
    assert line == ("kernelperf: no performance floors for GPU model 'NVIDIA B200': 88 perf "
                    "items recorded, not judged; bring it up with `python -m kernels bringup` "
                    "or `make bringup`")


def test_a_cpu_run_says_what_it_timed_instead():
    line = perfcheck.finding(device_name="AMD EPYC", platform="cpu", has_floors=False,
                             statuses={"skipped": 2}, timed="softmax-pallas")
    assert line == ("kernelperf: perf items on a CPU (AMD EPYC): 2 recorded, timed "
                    "softmax-pallas with the host clock, not judged: floors are per GPU model")


def test_a_model_with_floors_counts_its_verdicts():
    line = perfcheck.finding(device_name=H100, platform="gpu", has_floors=True,
                             statuses={"pass": 80, "fail": 2, "skipped": 3})
    assert line == (f"kernelperf: perf items judged against the floors of {H100!r}: 80 passed, "
                    f"2 under their floor, 3 without a floor")


def _perf_conftest():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "kernelperf_perf_conftest", pathlib.Path(__file__).parent / "conftest.py")
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


class _Terminal:
    def __init__(self):
        self.lines: list[str] = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


@pytest.mark.parametrize("device_name, has_floors", [("NVIDIA B200", False), (H100, True)])
def test_the_run_ends_with_its_finding_after_the_floor_table(device_name, has_floors):
    """What a run prints last about its perf items, from the rows its items (or the perf
    worker, shipped) reported: on a model without floors (a B200: none brought up), the
    finding naming it and the bring-up command; the H100's floors judge the H100 only."""
    assert (floors.table(device_name) is not None) is has_floors
    module = _perf_conftest()
    config = pytest.Config.__new__(pytest.Config)  # a stash is all the hooks read here
    config.stash = pytest.Stash()
    config.stash[module.VERDICTS] = []
    session = perfcheck.PerfSession(_device(device_name), perfcheck.stopping_rule(_device()))
    op, _, case = _softmax()
    floor = floors.floor_for(device_name, "softmax", "pallas", case.id, "fwd")
    seconds = 0.35e-3  # 0.92 of the H100's datasheet bandwidth: over its 0.80 floor
    verdict = _judge(_measurement(seconds), {}, _sheet_placement(op, case, seconds), floor,
                     device=_device(device_name), has_floors=has_floors)
    module._reporter(config, session)("softmax-pallas-f32-32768x4096-fwd", verdict)
    terminal = _Terminal()
    module.pytest_terminal_summary(terminal, 0, config)
    assert terminal.lines[0] == "== kernelperf floors"
    assert terminal.lines[2].startswith("softmax-pallas-f32-32768x4096-fwd")
    if has_floors:
        assert terminal.lines[-1] == (f"kernelperf: perf items judged against the floors of "
                                      f"{H100!r}: 1 passed")
    else:
        assert terminal.lines[-1] == ("kernelperf: no performance floors for GPU model "
                                      "'NVIDIA B200': 1 perf items recorded, not judged; bring "
                                      "it up with `python -m kernels bringup` or `make bringup`")


def test_a_baseline_that_could_not_be_timed_is_named_and_never_passes_a_floor():
    op, _, case = _softmax("f32-256x1024")
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    verdict = perfcheck.judge(label="softmax-pallas-f32-256x1024-fwd", device=_device(),
                              measured=_measurement(2.0e-6), baselines={},
                              placement=_sheet_placement(op, case, 2.0e-6), floor=floor,
                              has_floors=True,
                              baseline_errors={"xla": "RuntimeError: out of memory"})
    assert verdict.status == "refused"
    assert "xla (failed)" in verdict.message
    assert "baseline xla could not be timed: RuntimeError: out of memory" in verdict.message


def test_a_gpu_kernel_timed_by_the_host_clock_is_refused_not_judged():
    op, _, case = _softmax()
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    host = _measurement(355e-6, "host-clock")
    verdict = _judge(host, {"xla": _measurement(358e-6, "host-clock")},
                     _sheet_placement(op, case, host.median_s), floor)
    assert verdict.status == "refused" and "host clock on a GPU" in verdict.message


def test_asv_does_not_import_the_pytest_side():
    # asv's discovery imports every module of the perf_tests package (benchmark_dir).
    here = pathlib.Path(__file__).parent
    assert (here.parent / "__init__.py").exists() and not (here / "__init__.py").exists()


# Which kernels are timed, how long, and what each record carries

def _machine(platform: str):
    from kernels.core import devices

    return devices.Machine(platform=platform, device_kind="test", device_count=1,
                           compute_capability=(9, 0) if platform == "gpu" else None)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_perf_items_are_every_kernel_bench_case_and_direction_it_has(platform):
    """One item per (our kernel, bench case of the platform on one device, direction it runs),
    baselines never; on CPU only CPU_IMPLEMENTATIONS run, every other runnable item says why
    not."""
    from kernels.core import devices

    machine = _machine(platform)
    items = perfcheck.perf_items(machine)
    expected = {(impl.id, case.id, direction)
                for op in registry.operations()
                for case in registry.bench_cases(op, platform)
                for direction in registry.DIRECTIONS
                for impl in registry.implementations(op.name)
                if not impl.baseline and registry.has_direction(impl, direction)
                and impl.devices_for(case) == 1}
    assert {(i.impl.id, i.case.id, i.direction) for i in items} == expected
    assert len(items) == len(expected)
    for item in items:
        unavailable = devices.case_unavailable_reason(item.impl, item.case, machine)
        timed_here = platform == "gpu" or \
            (item.impl.op, item.impl.name) in perfcheck.CPU_IMPLEMENTATIONS
        if unavailable:
            assert item.skip_reason == unavailable, item.id
        elif timed_here:
            assert item.skip_reason is None, item.id
        else:
            assert item.skip_reason.startswith("on CPU the perf tests time only softmax-pallas")
        assert item.id == f"{item.impl.id}-{item.case.id}-{item.direction}"
        assert item.group == f"{item.case.op} {item.case.id} {item.direction}"
    if platform == "cpu":
        assert any(i.skip_reason is None for i in items)


def test_baselines_for_are_the_operations_baselines_that_run_the_case_here():
    from kernels.core import devices

    _, impl, case = _softmax("f32-256x1024")
    for platform in ("gpu", "cpu"):
        machine = _machine(platform)
        for direction in registry.DIRECTIONS:
            found = perfcheck.baselines_for(impl, case, direction, machine)
            assert all(peer.op == "softmax" for peer in found)
            for peer in registry.implementations("softmax"):
                runs = (peer.baseline and registry.has_direction(peer, direction)
                        and devices.case_unavailable_reason(peer, case, machine) is None)
                assert (peer in found) == runs, (platform, direction, peer.name)
    assert perfcheck.baselines_for(impl, case, "fwd", _machine("gpu"))


def test_stopping_rule_is_the_budget_asked_for_and_fewer_samples_on_cpu(monkeypatch):
    monkeypatch.delenv(perfcheck.BUDGET_VARIABLE, raising=False)
    gpu = perfcheck.stopping_rule(_device())
    assert gpu == timing.StoppingRule(time_budget_s=perfcheck.GPU_BUDGET_S)
    cpu = perfcheck.stopping_rule(_device("AMD EPYC", "cpu"))
    assert cpu == timing.StoppingRule(time_budget_s=perfcheck.CPU_BUDGET_S,
                                      min_samples=perfcheck.CPU_MIN_SAMPLES)
    monkeypatch.setenv(perfcheck.BUDGET_VARIABLE, "2.5")
    assert perfcheck.stopping_rule(_device()).time_budget_s == 2.5
    monkeypatch.setenv(perfcheck.BUDGET_VARIABLE, "")
    assert perfcheck.stopping_rule(_device()).time_budget_s == perfcheck.GPU_BUDGET_S
    monkeypatch.setenv(perfcheck.BUDGET_VARIABLE, "soon")
    with pytest.raises(ValueError, match=r"^KERNELPERF_PERF_BUDGET: expected seconds as a "
                                         r"number, got 'soon'$"):
        perfcheck.stopping_rule(_device())


def test_extra_info_carries_every_number_of_the_verdict():
    op, impl, case = _softmax()
    measured = _measurement(2e-3)
    baselines = {"xla": _measurement(1e-3, label="xla")}
    sheet = _sheet_placement(op, case, 2e-3)
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    verdict = _judge(measured, baselines, sheet, floor)
    work = op.work(case, "fwd")
    info = perfcheck.extra_info(measured=measured, work=work, sheet=sheet, measured_roof=None,
                                verdict=verdict, baselines=baselines, device=_device(),
                                baseline_errors={"torch": "boom"})
    assert info["clock_method"] == "cupti" and info["regime"] == "cold"
    assert info["stop_reason"] == "converged" and info["throttled_samples"] == 0
    assert info["cv"] == pytest.approx(measured.cv)
    assert info["tflops"] == pytest.approx(work.flops / 2e-3 / 1e12)
    assert info["gbps"] == pytest.approx(work.bytes / 2e-3 / 1e9)
    assert info["roofline_fraction"] == sheet.fraction
    assert info["roofline_ceiling"] == sheet.ceiling and info["bound"] == sheet.bound
    assert info["measured_roofline_fraction"] is None
    assert info["speedup"] == pytest.approx(0.5) and info["best_baseline"] == "xla"
    assert info["baselines"] == {"xla": {"median_s": 1e-3, "method": "cupti",
                                         "cv": pytest.approx(baselines["xla"].cv),
                                         "precision": None}}
    assert info["baseline_errors"] == {"torch": "boom"}
    assert info["floor"] == dataclasses.asdict(floor)
    assert info["floor_value"] == verdict.value and info["floor_verdict"] == verdict.status
    assert info["fingerprint"] == _device().to_dict()


def test_extra_info_without_a_datasheet_uses_the_measured_roof_and_drops_infinite_cvs():
    op, impl, case = _softmax()
    one = timing.Measurement.from_samples([2e-3], label="m", method="host-clock",
                                          regime="hot", stop_reason="max-samples",
                                          fingerprint={})
    roof = model.place(op.work(case, "fwd"), 2e-3,
                       ceilings.Ceiling("cpu", "measured", 1e10, {"f32": 1e11}), case.dtype)
    verdict = _judge(one, {}, None, None, device=_device("AMD EPYC", "cpu"), has_floors=False)
    info = perfcheck.extra_info(measured=one, work=op.work(case, "fwd"), sheet=None,
                                measured_roof=roof, verdict=verdict,
                                baselines={"xla": one}, device=_device("AMD EPYC", "cpu"))
    assert info["cv"] is None and info["baselines"]["xla"]["cv"] is None
    assert info["roofline_fraction"] == roof.fraction == info["measured_roofline_fraction"]
    assert info["roofline_ceiling"] == roof.ceiling and info["bound"] == roof.bound
    assert info["floor"] is None and info["floor_value"] is None
    assert info["floor_verdict"] == "skipped" and info["baseline_errors"] == {}
    assert info["regime"] == "hot" and info["stop_reason"] == "max-samples"


class _Benchmark:
    """pytest-benchmark's fixture as `record` uses it: pedantic runs the target once per
    round and keeps each round's duration by the fixture's timer (device_time)."""

    def __init__(self, disabled: bool = False, keep=None):
        self.extra_info, self.disabled, self.keep = {}, disabled, keep
        self.stats = None

    def pedantic(self, target, rounds, iterations, warmup_rounds):
        assert (iterations, warmup_rounds) == (1, 0)
        durations = []
        for _ in range(rounds):
            start = perfcheck.device_time()
            target()
            durations.append(perfcheck.device_time() - start)
        if getattr(self, "disabled", False):
            return
        import types

        kept = durations if self.keep is None else self.keep(durations)
        self.stats = types.SimpleNamespace(stats=types.SimpleNamespace(data=kept))


def test_record_replays_the_device_samples_as_the_rounds():
    measured = timing.Measurement.from_samples([1e-3, 3e-3, 2e-3], label="m", method="cupti",
                                               regime="cold", stop_reason="converged",
                                               fingerprint={})
    bench = _Benchmark()
    perfcheck.record(bench, measured, {"tflops": 1.0})
    assert bench.extra_info == {"tflops": 1.0}
    assert bench.stats.stats.data == pytest.approx([1e-3, 3e-3, 2e-3], rel=1e-9)
    perfcheck.record(_Benchmark(disabled=True), measured, {})  # nothing recorded, no check
    with pytest.raises(AssertionError, match=r"recorded 2 durations .* not the 3 device "
                                             r"samples \(median 2.000e-03 s\)"):
        perfcheck.record(_Benchmark(keep=lambda d: d[:2]), measured, {})
    with pytest.raises(AssertionError, match="is its timer kernels.bench.perfcheck.device_time"):
        perfcheck.record(_Benchmark(keep=lambda d: [x * 1.01 for x in d]), measured, {})


def test_describe_measurement_names_its_clock_and_throttling():
    m = timing.Measurement.from_samples([1e-3, 1e-3], throttled=[True, False], label="m",
                                        method="cupti", regime="cold", stop_reason="converged",
                                        fingerprint={})
    assert perfcheck.describe_measurement(m) == \
        "1000.00 us median (cupti, cold L2, 2 samples, cv 0.00%, converged, 1 throttled)"
    assert perfcheck.describe_measurement(_measurement(2e-6)).startswith(
        "2.00 us median (cupti, cold L2, 3 samples, cv 0.10%, converged)")


def _verdict_fixture():
    op, _, case = _softmax()
    baselines = {"torch": _measurement(1.5e-3, label="torch"),
                 "xla": _measurement(1e-3, label="xla"),
                 "cudnn": _measurement(1e-3, method="cuda-events", label="cudnn")}
    errors = {"triton": "RuntimeError: " + "x" * 400 + "\nsecond line"}
    return op, case, baselines, errors, _sheet_placement(op, case, 2e-3)


def test_a_verdict_shows_every_number_line_by_line():
    """A kernel exactly at its floor passes; the message is the verdict, then the kernel's
    measurement, its roofline, each same-clock baseline fastest first, the baselines of
    another clock, and those that failed (their first line, cut at 300 characters)."""
    op, case, baselines, errors, placement = _verdict_fixture()
    measured = _measurement(2e-3)
    floor = floors.Floor(op="softmax", impl="pallas", against="baseline", fraction=0.5,
                         reason="why")
    verdict = perfcheck.judge(label="k", device=_device(), measured=measured,
                              baselines=baselines, placement=placement, floor=floor,
                              has_floors=True, baseline_errors=errors)
    assert (verdict.status, verdict.method, verdict.floor) == ("pass", "cupti", floor)
    assert verdict.value == pytest.approx(0.5)
    describe = perfcheck.describe_measurement
    assert verdict.message.split("\n") == [
        f"k on {H100}: 0.500x the speed of baseline xla (1000.00 us) >= floor 0.50 (why)",
        f"measured: {describe(measured)}",
        f"roofline: {placement.fraction:.3f} of {placement.ceiling} ({placement.bound}-bound; "
        f"{placement.achieved_bandwidth / 1e9:.0f} GB/s, "
        f"{placement.achieved_flops / 1e12:.2f} TFLOP/s)",
        f"baseline xla: {describe(baselines['xla'])}; ours is 0.500x its speed",
        f"baseline torch: {describe(baselines['torch'])}; ours is 0.750x its speed",
        f"not compared (another clock than cupti): cudnn (cuda-events); "
        f"{timing.comparable(measured, *baselines.values())}",
        "baseline triton could not be timed: " + ("RuntimeError: " + "x" * 400)[:300]]
    slower = perfcheck.judge(label="k", device=_device(), measured=_measurement(2.1e-3),
                             baselines=baselines, placement=placement, floor=floor,
                             has_floors=True)
    assert slower.status == "fail"
    assert slower.message.split("\n")[0] == (
        f"under its floor: k on {H100}: 0.476x the speed of baseline xla (1000.00 us) < floor "
        f"0.50 (why)")


def test_a_refusal_names_the_baseline_it_wanted_and_every_one_it_had():
    op, case, baselines, errors, placement = _verdict_fixture()
    named = floors.Floor(op="softmax", impl="pallas", against="baseline", fraction=0.5,
                         reason="why", baseline="cudnn")
    verdict = perfcheck.judge(label="k", device=_device(), measured=_measurement(2e-3),
                              baselines=baselines, placement=placement, floor=named,
                              has_floors=True, baseline_errors=errors)
    assert (verdict.status, verdict.floor, verdict.method) == ("refused", named, "cupti")
    head, second = verdict.message.split("\n")[:2]
    assert head == ("k: refusing to compare with baseline cudnn: k was timed by cupti, and no "
                    "such baseline was timed by the same clock (baselines: torch (cupti), "
                    "xla (cupti), cudnn (cuda-events), triton (failed))")
    assert second.startswith("measured: ")
    anyone = dataclasses.replace(named, baseline=None)
    alone = perfcheck.judge(label="k", device=_device(), measured=_measurement(2e-3),
                            baselines={}, placement=None, floor=anyone, has_floors=True)
    assert alone.message.split("\n")[0].startswith("k: refusing to compare with a baseline: ")
    assert alone.message.split("\n")[0].endswith("(baselines: none)")
    assert alone.floor == anyone


def test_a_skipped_verdict_still_shows_the_measurement():
    measured = _measurement(1e-3)
    skipped = _judge(measured, {}, None, None, device=_device("NVIDIA H200"), has_floors=False)
    assert skipped.message.split("\n")[1] == \
        f"measured: {perfcheck.describe_measurement(measured)}"
    assert skipped.method == "cupti"


def test_placements_use_the_datasheet_and_only_a_measured_roof_of_the_same_clock(monkeypatch):
    op, impl, case = _softmax()
    sheet = ceilings.datasheet(H100)
    roof = ceilings.Ceiling(H100, "measured", 3.0e12, {"f32": 4e14}, method="cupti")
    asked = []

    def for_device(device, *, allow_measure):
        asked.append((device.platform, allow_measure))
        return sheet, roof

    monkeypatch.setattr(ceilings, "for_device", for_device)
    work = op.work(case, "fwd")
    on_sheet, on_roof = perfcheck.placements(impl, case, "fwd", 2e-3, "cupti", _device())
    assert on_sheet == model.place(work, 2e-3, sheet, case.dtype)
    assert on_roof == model.place(work, 2e-3, roof, case.dtype)
    assert perfcheck.placements(impl, case, "fwd", 2e-3, "cuda-events", _device())[1] is None
    bwd = perfcheck.placements(impl, case, "bwd", 3e-3, "cupti", _device())[0]
    assert bwd == model.place(op.work(case, "bwd"), 3e-3, sheet, case.dtype)
    perfcheck.placements(impl, case, "fwd", 2e-3, "host-clock", _device("AMD EPYC", "cpu"))
    # A GPU never stops to measure its roofs inside a perf test; a CPU does (about 2 s).
    assert asked == [("gpu", False)] * 3 + [("cpu", True)]
    monkeypatch.setattr(ceilings, "for_device", lambda device, allow_measure: (None, None))
    assert perfcheck.placements(impl, case, "fwd", 2e-3, "cupti", _device()) == (None, None)


def test_placements_count_the_devices_a_sharded_case_runs_on(monkeypatch):
    op = registry.operation("sharded_matmul")
    impl = next(i for i in registry.implementations("sharded_matmul") if not i.baseline)
    case = next(c for c in op.cases if impl.devices_for(c) > 1)
    sheet = ceilings.datasheet(H100)
    monkeypatch.setattr(ceilings, "for_device", lambda device, allow_measure: (sheet, None))
    placed, _ = perfcheck.placements(impl, case, "fwd", 1e-3, "cupti", _device())
    assert placed == model.place(op.work(case, "fwd"), 1e-3, sheet, case.dtype,
                                 devices=impl.devices_for(case))


def test_a_perf_session_times_each_triple_once_and_keeps_one_cases_inputs(monkeypatch):
    from kernels.core import checking

    made, prepared, timed = [], [], []

    def make_inputs(op, case, seed, distribution):
        made.append((op.name, case.id, seed, distribution))
        return (f"inputs of {case.id}",)

    def prepare(impl, case, *, direction, inputs):
        prepared.append((impl.id, case.id, direction, inputs))
        return f"{impl.id} {case.id} {direction}"

    def time_timeable(timeable, *, rule, device):
        timed.append((timeable, rule, device))
        return _measurement(1e-3, label=timeable)

    monkeypatch.setattr(checking, "make_inputs", make_inputs)
    monkeypatch.setattr(timing, "prepare", prepare)
    monkeypatch.setattr(timing, "time_timeable", time_timeable)
    rule, device = timing.StoppingRule(time_budget_s=0.5), _device()
    session = perfcheck.PerfSession(device, rule)
    op, impl, case = _softmax()
    other = op.case("f32-256x1024")
    first = session.measure(impl, case, "fwd")
    assert session.measure(impl, case, "fwd") is first
    session.measure(impl, case, "bwd")
    session.measure(impl, other, "fwd")
    session.measure(impl, case, "fwd")
    assert made == [("softmax", case.id, 0, "normal"), ("softmax", other.id, 0, "normal")]
    assert [p[:3] for p in prepared] == [(impl.id, case.id, "fwd"), (impl.id, case.id, "bwd"),
                                         (impl.id, other.id, "fwd")]
    assert prepared[0][3] == (f"inputs of {case.id}",)
    assert prepared[2][3] == (f"inputs of {other.id}",)
    assert all(r is rule and d is device for _, r, d in timed) and len(timed) == 3
    assert first.label == f"{impl.id} {case.id} fwd"


def test_a_baseline_that_raises_is_named_once_and_never_timed_again(monkeypatch):
    op, impl, case = _softmax("f32-256x1024")
    peers = [p for p in registry.implementations("softmax") if p.baseline][:2]
    assert len(peers) == 2
    asked = []

    def baselines_for(kernel, for_case, direction):
        asked.append((kernel, for_case, direction))
        return peers

    monkeypatch.setattr(perfcheck, "baselines_for", baselines_for)
    calls = []

    def measure(self, peer, for_case, direction):
        assert (for_case, direction) == (case, "fwd")
        calls.append(peer.name)
        if peer is peers[0]:
            raise RuntimeError("out of memory\ndetails")
        return _measurement(1e-3, label=peer.name)

    monkeypatch.setattr(perfcheck.PerfSession, "measure", measure)
    session = perfcheck.PerfSession(_device(), timing.StoppingRule())
    for _ in range(2):
        measured, errors = session.measure_baselines(impl, case, "fwd")
        assert list(measured) == [peers[1].name]
        assert errors == {peers[0].name: "RuntimeError: out of memory\ndetails"}
    assert calls == [peers[0].name, peers[1].name, peers[1].name]
    assert asked == [(impl, case, "fwd")] * 2


def test_extra_info_without_any_roof_has_no_roofline_numbers():
    op, _, case = _softmax()
    measured = _measurement(1e-3)
    verdict = _judge(measured, {}, None, None, device=_device("NVIDIA H200"), has_floors=False)
    info = perfcheck.extra_info(measured=measured, work=op.work(case, "fwd"), sheet=None,
                                measured_roof=None, verdict=verdict, baselines={},
                                device=_device("NVIDIA H200"))
    assert info["roofline_fraction"] is info["roofline_ceiling"] is info["bound"] is None
    assert info["speedup"] is None and info["best_baseline"] is None


def test_times_are_shown_in_microseconds_to_two_places():
    assert perfcheck._us(0.123456) == "123456.00 us"
    assert perfcheck._us(1.5e-6) == "1.50 us"


def test_a_saved_run_of_unknown_clock_or_device_is_refused_saying_so():
    measured = _measurement(1e-3)
    assert "timed by an unknown method, this run by cupti" in perfcheck.compare_refusal(
        {}, {"model": "x"}, measured, _device(), "0001")
    assert "ran on an unknown device, this run on nvidia-h100-80gb-hbm3" in \
        perfcheck.compare_refusal({"clock_method": "cupti"}, None, measured, _device(), "0001")


def test_two_workers_already_share_the_device(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert perfcheck.parallel_reason().startswith("2 pytest-xdist workers share the device")
    assert perfcheck.parallel_reason(alone=True) is None


def test_a_host_clock_refusal_keeps_its_floor_and_the_measurement():
    op, _, case = _softmax()
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    host = _measurement(355e-6, "host-clock")
    verdict = _judge(host, {}, _sheet_placement(op, case, host.median_s), floor)
    assert verdict.floor == floor and verdict.method == "host-clock"
    assert verdict.message.split("\n")[1] == f"measured: {perfcheck.describe_measurement(host)}"


def test_a_roofline_floor_names_the_fraction_and_needs_a_datasheet():
    op, _, case = _softmax()
    floor = floors.Floor(op="softmax", impl="pallas", against="roofline", fraction=0.5,
                         reason="why")
    placement = _sheet_placement(op, case, 0.5e-3)
    verdict = _judge(_measurement(0.5e-3), {}, placement, floor)
    assert verdict.message.split("\n")[0].startswith(
        f"softmax-pallas-f32-32768x4096-fwd on {H100}: {placement.fraction:.3f} of the "
        f"datasheet roofline ")
    with pytest.raises(ValueError, match=r"^floor of softmax-pallas-f32-32768x4096-fwd is a "
                                         r"fraction of the roofline, but NVIDIA H100 80GB HBM3 "
                                         r"has no datasheet ceilings$"):
        _judge(_measurement(1e-3), {}, None, floor)


def test_a_verdict_status_is_one_of_four():
    with pytest.raises(ValueError, match=r"^status: expected pass, fail, refused or skipped, "
                                         r"got 'maybe'$"):
        perfcheck.Verdict(status="maybe", message="", method="cupti")


def test_record_checks_what_was_recorded_to_one_part_in_a_billion():
    measured = timing.Measurement.from_samples([1e-3, 3e-3], label="m", method="cupti",
                                               regime="cold", stop_reason="converged",
                                               fingerprint={})
    with pytest.raises(AssertionError, match=r"recorded 2 durations"):
        perfcheck.record(_Benchmark(keep=lambda d: [x * (1 + 1e-7) for x in d]), measured, {})
    with pytest.raises(AssertionError, match=r"recorded 0 durations \(median nan s\)"):
        perfcheck.record(_Benchmark(keep=lambda d: []), measured, {})

    class Plain(_Benchmark):  # a fixture of a pytest-benchmark without `disabled`
        def __getattribute__(self, name):
            if name == "disabled":
                raise AttributeError(name)
            return super().__getattribute__(name)

    with pytest.raises(AssertionError, match=r"recorded 1 durations"):
        perfcheck.record(Plain(keep=lambda d: d[:1]), measured, {})


def test_every_baseline_of_another_clock_is_listed_comma_separated():
    """The "not compared" line names each refused baseline with its clock, joined by ", "."""
    op, _, case = _softmax("f32-256x1024")
    floor = floors.floor_for(H100, "softmax", "pallas", case.id, "fwd")
    baselines = {"xla": _measurement(2.6e-6), "torch": _measurement(1.0e-6, "cuda-events"),
                 "cudnn": _measurement(1.1e-6, "host-clock")}
    verdict = _judge(_measurement(2.0e-6), baselines, _sheet_placement(op, case, 2.0e-6), floor)
    assert verdict.refused_baselines == ("torch (cuda-events)", "cudnn (host-clock)")
    assert "not compared (another clock than cupti): torch (cuda-events), cudnn (host-clock); " \
        in verdict.message


def test_the_cpu_skip_reason_names_every_cpu_implementation(monkeypatch):
    """On CPU a kernel not timed there says which are, each as op-impl, sorted, ", " between."""
    monkeypatch.setattr(perfcheck, "CPU_IMPLEMENTATIONS",
                        frozenset({("softmax", "pallas"), ("matmul", "triton")}))
    reasons = {item.skip_reason for item in perfcheck.perf_items(_machine("cpu"))
               if item.skip_reason and item.skip_reason.startswith("on CPU")}
    assert reasons == {"on CPU the perf tests time only matmul-triton, softmax-pallas "
                       "(interpreted kernels take up to seconds per call); a GPU times every "
                       "kernel"}


def test_a_wrong_recording_names_the_median_of_what_was_recorded():
    """The mismatch message gives the recorded durations' own median beside the samples'; an
    empty recording reads nan, without NumPy's warning about the median of nothing."""
    import warnings

    measured = timing.Measurement.from_samples([1e-3, 3e-3, 2e-3], label="m", method="cupti",
                                               regime="cold", stop_reason="converged",
                                               fingerprint={})
    with pytest.raises(AssertionError, match=r"^pytest-benchmark recorded 2 durations \(median "
                                             r"2\.000e-03 s\), not the 3 device samples"):
        perfcheck.record(_Benchmark(keep=lambda d: d[:2]), measured, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AssertionError, match=r"recorded 0 durations \(median nan s\)"):
            perfcheck.record(_Benchmark(keep=lambda d: []), measured, {})


# The warm-up beside other workers (the perf phase)

def test_the_warm_up_leaves_autotuning_implementations_for_their_measurement(monkeypatch):
    """An autotuner timing its candidates beside other workers keeps a contended choice for
    the whole run: those implementations (registry.Implementation.autotunes) warm up in
    their measurement, with the device to themselves; the others now."""
    op = registry.operation("matmul")
    case = op.case("f32-129x130x257")
    triton, xla, torch = (registry.implementation("matmul", name)
                          for name in ("triton", "xla", "torch"))
    assert triton.autotunes and xla.autotunes and not torch.autotunes
    pallas = registry.implementation("matmul", "pallas_triton")
    assert not pallas.autotunes
    prepared = []

    class Sampler:
        def take(self, count):
            assert count == 1

    monkeypatch.setattr(perfcheck, "baselines_for", lambda impl, case, direction: [xla, torch])
    monkeypatch.setattr(timing, "prepare", lambda impl, case, **_: prepared.append(impl.name))
    monkeypatch.setattr(timing, "make_sampler", lambda timeable, regime, device: (Sampler(), 0))
    session = perfcheck.PerfSession(_device(), timing.StoppingRule(time_budget_s=0.1))
    assert session.warm_up(triton, case, "fwd") == 1
    assert session.warm_up(pallas, case, "fwd") == 1  # torch was warmed up already
    assert prepared == ["torch", "pallas_triton"]
