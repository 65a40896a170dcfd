"""The measurement core: results, stopping rule, device identity, ceilings, roofline, CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import pathlib
import subprocess
import sys
import time

import pytest

from correctness_tests import fakes
from kernels.bench import perfcheck
from kernels.core import devices, fingerprint, registry, timing
from kernels.profile import crosscheck
from kernels.roofline import ceilings, model, report

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _measurement(samples=(1e-3, 1.1e-3, 0.9e-3)) -> timing.Measurement:
    return timing.Measurement.from_samples(
        samples, clocks=[1980, 1980, 1500], throttled=[False, False, True],
        label="softmax-xla f32-8x8 fwd", method="cupti", regime="cold", stop_reason="converged",
        fingerprint={"model": "nvidia-h100-80gb-hbm3", "driver": "580.159.04"})


def test_measurement_json_round_trip():
    m = _measurement()
    assert m.median_s == 1e-3 and m.min_s == 0.9e-3 and m.max_s == 1.1e-3
    assert m.repeats == 3 and m.throttled_count == 1
    assert math.isclose(m.cv, 0.1)  # stdev 1e-4 over mean 1e-3
    again = timing.Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m


def test_measurement_of_one_sample_round_trips_its_infinite_cv():
    m = _measurement(samples=(2e-3,))
    assert m.cv == math.inf
    assert timing.Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m


class FakeSampler:
    """Returns values from a repeating pattern and advances a fake clock per sample."""

    def __init__(self, pattern, seconds_per_sample=0.0):
        self.values = itertools.cycle(pattern)
        self.seconds_per_sample = seconds_per_sample
        self.now = 0.0
        self.calls = []

    def take(self, n):
        self.calls.append(n)
        self.now += n * self.seconds_per_sample
        return [next(self.values) for _ in range(n)]

    def clock(self):
        return self.now


def test_steady_samples_converge_after_min_samples_and_min_time():
    rule = timing.StoppingRule(min_samples=10, min_time_s=0.05, max_noise=0.005,
                               time_budget_s=100.0, max_samples=1000)
    sampler = FakeSampler([0.01])
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert reason == "converged"
    assert len(samples) == 10  # 10 x 0.01 s already exceeds the 0.05 s minimum


def test_steady_but_short_samples_wait_for_the_minimum_time():
    rule = timing.StoppingRule(min_samples=10, min_time_s=0.05, max_noise=0.005,
                               time_budget_s=100.0, max_samples=1000)
    sampler = FakeSampler([0.001])
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert reason == "converged"
    assert len(samples) == 80  # batches of 10, 10, 20, 40: the first count with >= 0.05 s
    assert sampler.calls == [10, 10, 20, 40]


def test_noisy_samples_stop_at_max_samples():
    rule = timing.StoppingRule(min_samples=10, max_noise=0.005, time_budget_s=100.0,
                               max_samples=50, max_batch=16)
    sampler = FakeSampler([1.0, 2.0])  # CV about 33%: never converges
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert reason == "max-samples"
    assert len(samples) == 50
    assert sampler.calls == [10, 10, 16, 14]


def test_noisy_samples_stop_at_the_time_budget():
    rule = timing.StoppingRule(min_samples=10, max_noise=0.005, time_budget_s=1.0,
                               max_samples=10_000)
    sampler = FakeSampler([1.0, 2.0], seconds_per_sample=0.02)
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert reason == "time-budget"
    assert len(samples) == 80  # 0.02 s per sample: 40 samples reach 0.8 s, 80 reach 1.6 s


def test_stopping_rule_rejects_bad_counts():
    with pytest.raises(ValueError, match="min_samples: expected 1 <= min_samples <= max_samples"):
        timing.StoppingRule(min_samples=0)


@pytest.mark.parametrize("name,model_name", [
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
    ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"),
    ("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", "intel-xeon-platinum-8480"),
    ("AMD EPYC 7B13 64-Core Processor", "amd-epyc-7b13-64-core-processor"),
])
def test_model_names_are_normalised(name, model_name):
    assert fingerprint.normalise(name) == model_name


def test_fingerprint_of_this_machine_names_model_and_versions():
    device = fingerprint.fingerprint()
    assert device.model == fingerprint.normalise(device.name)
    assert dict(device.versions)["jax"]
    assert device.to_dict()["versions"]["jax"] == dict(device.versions)["jax"]


def test_throttle_flag_compares_with_the_default_clock():
    device = dataclasses.replace(fingerprint.fingerprint(), default_sm_mhz=1980)
    assert device.is_throttled(fingerprint.Clocks(sm_mhz=1500))
    assert not device.is_throttled(fingerprint.Clocks(sm_mhz=1900))
    assert not device.is_throttled(None)


# The audited values (issue 3): dense rates; SXM and PCIe apart; L4's 300 GB/s.
@pytest.mark.parametrize("name,bandwidth,dtype,dense", [
    ("NVIDIA H100 80GB HBM3", 3.35e12, "bf16", 989.45e12),
    ("NVIDIA H100 80GB HBM3", 3.35e12, "tf32", 494.7e12),
    ("NVIDIA H100 PCIe", 2.0e12, "bf16", 756.5e12),
    ("NVIDIA H200", 4.8e12, "bf16", 989.5e12),
    ("NVIDIA A100-SXM4-80GB", 2039e9, "tf32", 156e12),
    ("NVIDIA A100-SXM4-40GB", 1555e9, "bf16", 312e12),
    ("NVIDIA A100 80GB PCIe", 1935e9, "f16", 312e12),
    ("NVIDIA L4", 300e9, "bf16", 121e12),
    ("NVIDIA L40S", 864e9, "bf16", 362.05e12),
    ("NVIDIA GeForce RTX 4090", 1008e9, "bf16", 165.2e12),
    ("NVIDIA RTX 4000 Ada Generation", 360e9, "fp8", 163.8e12),
    ("NVIDIA B200", 8.0e12, "bf16", 2250e12),
])
def test_datasheet_lookup_by_exact_driver_name(name, bandwidth, dtype, dense):
    sheet = ceilings.datasheet(name)
    assert sheet is not None and sheet.kind == "datasheet"
    assert sheet.bandwidth == pytest.approx(bandwidth)
    assert sheet.flops[dtype] == pytest.approx(dense)
    entry = ceilings.DATASHEET[name].peaks[dtype]
    # Datasheets round: the L40S prints 362.05 dense beside 733 sparse.
    assert entry.sparse is None or entry.sparse == pytest.approx(2 * entry.dense, rel=0.02)


def test_datasheet_needs_the_exact_name():
    assert ceilings.datasheet("H100") is None
    assert ceilings.datasheet("nvidia h100 80gb hbm3") is None


def test_unknown_gpu_uses_measured_ceilings_only_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    unknown = dataclasses.replace(fingerprint.fingerprint(), platform="gpu",
                                  name="NVIDIA Imaginary 9000", model="nvidia-imaginary-9000")
    cached = ceilings.Ceiling("NVIDIA Imaginary 9000", "measured", 1e12, {"bf16": 1e14},
                              method=ceilings.default_method(unknown))
    path = ceilings.cache_path(unknown.model)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ceiling": cached.to_dict()}))
    with pytest.warns(UserWarning, match="no datasheet entry for 'NVIDIA Imaginary 9000'"):
        sheet, measured = ceilings.for_device(unknown, allow_measure=False)
    assert sheet is None and measured == cached


def test_ceilings_cached_by_another_clock_are_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    device = fingerprint.fingerprint()
    stale = ceilings.Ceiling(device.name, "measured", 1e12, {"f32": 1e12}, method="cuda-events")
    path = ceilings.cache_path(device.model)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ceiling": stale.to_dict()}))
    with pytest.warns(UserWarning, match="timed by cuda-events, not host-clock: measuring again"):
        assert ceilings.measured(device, allow_measure=False) is None


def test_place_memory_bound_point():
    ceiling = ceilings.Ceiling("test", "measured", bandwidth=2e12, flops={"bf16": 1e15})
    # Intensity 100 FLOP/byte: the memory roof gives 100 x 2e12 = 2e14 < 1e15.
    p = model.place(registry.Work(flops=1e12, bytes=1e10), 0.01, ceiling, "bf16")
    assert p.intensity == 100
    assert p.attainable_flops == pytest.approx(2e14)
    assert p.achieved_flops == pytest.approx(1e14)
    assert p.achieved_bandwidth == pytest.approx(1e12)
    assert p.fraction == pytest.approx(0.5)
    assert p.bound == "memory" and not p.suspicious


def test_place_compute_bound_point_and_flag_above_the_roof():
    ceiling = ceilings.Ceiling("test", "measured", bandwidth=2e12, flops={"bf16": 1e15})
    # Intensity 1000: 1000 x 2e12 = 2e15 > 1e15, so the compute roof binds.
    p = model.place(registry.Work(flops=1e13, bytes=1e10), 0.02, ceiling, "bf16")
    assert p.bound == "compute"
    assert p.fraction == pytest.approx(0.5)  # 5e14 of 1e15
    too_fast = model.place(registry.Work(flops=1e13, bytes=1e10), 0.005, ceiling, "bf16")
    assert too_fast.fraction == pytest.approx(2.0) and too_fast.suspicious
    # Above a measured compute roof the roof is low (a peer GEMM); above a datasheet one, or
    # a measured memory roof, the work model is wrong.
    assert too_fast.warning == "above the measured GEMM roof"
    # Within a measured roof's own noise (3% above it) is not flagged; above a datasheet roof is.
    at_roof = model.place(registry.Work(flops=1e13, bytes=1e10), 0.01 / 1.03, ceiling, "bf16")
    assert at_roof.fraction == pytest.approx(1.03) and not at_roof.suspicious
    sheet = dataclasses.replace(ceiling, kind="datasheet")
    above_sheet = model.place(registry.Work(flops=1e13, bytes=1e10), 0.01 / 1.03, sheet, "bf16")
    assert above_sheet.suspicious and above_sheet.warning == "above the roof: work model?"


def test_place_scales_with_devices_and_f32_uses_the_tf32_roof():
    ceiling = ceilings.Ceiling("test", "measured", bandwidth=1e12,
                               flops={"f32": 5e13, "tf32": 4e14})
    p = model.place(registry.Work(flops=4e15, bytes=1e9), 10.0, ceiling, "f32", devices=2)
    assert p.peak_flops == pytest.approx(8e14)  # 2 x the tf32 peak
    assert p.bandwidth == pytest.approx(2e12)
    assert p.fraction == pytest.approx(0.5)


def test_place_rejects_nonpositive_time():
    ceiling = ceilings.Ceiling("test", "measured", bandwidth=1e12, flops={"f32": 1e12})
    with pytest.raises(ValueError, match="seconds: expected > 0, got 0"):
        model.place(registry.Work(flops=1.0, bytes=1.0), 0, ceiling, "f32")


def _roofline_data() -> dict:
    sheet = ceilings.datasheet("NVIDIA H100 80GB HBM3")
    measured = ceilings.Ceiling("NVIDIA H100 80GB HBM3", "measured", 3.0e12,
                                {"bf16": 7.0e14, "f32": 5.2e13, "tf32": 3.6e14})
    points = []
    for impl, dtype, seconds in (("xla", "f32", 3.6e-4), ("pallas", "bf16", 2.0e-4)):
        work = registry.Work(flops=5 * 32768 * 4096, bytes=2 * 32768 * 4096 * (
            4 if dtype == "f32" else 2))
        placement = {c.kind: model.place(work, seconds, c, dtype).to_dict()
                     for c in (measured, sheet)}
        points.append({"op": "softmax", "impl": impl, "case": f"{dtype}-32768x4096",
                       "direction": "fwd", "dtype": dtype, "flops": work.flops,
                       "bytes": work.bytes, "median_s": seconds, "placement": placement})
    return {"model": "nvidia-h100-80gb-hbm3", "timestamp": "20260101-000000",
            "fingerprint": {"name": "NVIDIA H100 80GB HBM3"},
            "ceilings": {"datasheet": sheet.to_dict(), "measured": measured.to_dict()},
            "points": points}


def test_roofline_chart_is_drawn_from_a_data_file(tmp_path):
    import matplotlib.image

    path = tmp_path / "roofline_data_nvidia-h100-80gb-hbm3_20260101-000000.json"
    path.write_text(json.dumps(_roofline_data()))
    written = report.plot_data(path)
    assert [p.name for p in written] == ["roofline_fwd_nvidia-h100-80gb-hbm3_20260101-000000.png"]
    image = matplotlib.image.imread(written[0])
    assert image.shape[0] > 500 and image.shape[1] > 800
    assert image.std() > 0.05  # not a blank canvas


def test_a_cluster_label_names_its_points_top_down():
    """Points close together share one label; its lines stack as the points do, the fastest
    on top (an H100 chart of 2026-11-25 named cuDNN's point pallas_mosaic's, and the reverse)."""
    points = [dict(p, placement={}) for p in _roofline_data()["points"]]
    points[1] = dict(points[0], impl="pallas")  # same intensity, 10% faster
    ys = [1.0, 1.1]
    assert report._clusters([1.0, 1.0], ys) == [[0, 1]]
    assert report._cluster_label(points, ys, [0, 1]).splitlines() == [
        "pallas f32-32768x4096", "xla f32-32768x4096"]


@pytest.mark.skipif(devices.this_machine().has_gpu,
                    reason="compares XLA's CPU cost model; on a GPU, XLA's gemm custom calls "
                           "report their costs differently")
@pytest.mark.parametrize("check", crosscheck.COST_CHECKS,
                         ids=lambda c: f"{c.op}-{c.impl}-{c.case}-{c.direction}")
def test_work_model_agrees_with_xla_cost_analysis(check):
    assert check.case in crosscheck.cost_analysis_check(check)


def test_trace_events_are_taken_from_gpu_stream_lines_only():
    trace = {"traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #13"}},
        {"ph": "M", "pid": 1, "tid": 8, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 5.0, "dur": 2.0, "name": "fusion"},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 1.0, "dur": 1.0, "name": "broadcast"},
        {"ph": "X", "pid": 1, "tid": 8, "ts": 5.0, "dur": 2.0, "name": "fusion"},
        {"ph": "X", "pid": 2, "tid": 7, "ts": 5.0, "dur": 2.0, "name": "fusion"},
    ]}
    events = crosscheck._gpu_stream_events(trace)
    assert [e["name"] for e in events] == ["broadcast", "fusion"]


def test_ncu_csv_sums_each_metric_over_kernels():
    text = ('==PROF== Disconnected\n"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k1","dram__bytes_read.sum","Mbyte","1.50"\n'
            '"1","k2","dram__bytes_read.sum","Kbyte","500"\n'
            '"0","k1","gpu__time_duration.sum","usecond","2,000"\n')
    totals = crosscheck.parse_ncu_csv(text)
    assert totals["dram__bytes_read.sum"] == pytest.approx(2.0e6)
    assert totals["gpu__time_duration.sum"] == pytest.approx(2.0e6)


def _kernels(*args: str, cache: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), KERNELPERF_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "kernels", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(devices.this_machine().has_gpu, reason="the CPU path (host clock) only")
def test_time_command_on_cpu_labels_the_host_clock(tmp_path):
    result = _kernels("time", "softmax", "--tags", "cpu", "--impl", "xla", "--impl", "torch",
                      "--case", "f32-64x1000", "--direction", "fwd", "bwd", "--budget", "0.05",
                      cache=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("softmax-")]
    assert len(rows) == 4, result.stdout
    assert all("host-clock" in row and " cold " in row for row in rows)
    torch_fwd = next(r for r in rows if r.startswith("softmax-torch") and " fwd " in r)
    assert "baseline" in torch_fwd and "% mem" in torch_fwd


@pytest.mark.skipif(devices.this_machine().has_gpu, reason="the CPU message only")
def test_verify_timing_says_it_needs_a_gpu(tmp_path):
    result = _kernels("verify-timing", cache=tmp_path)
    assert result.returncode == 0
    assert "skipped: needs a CUDA GPU" in result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not devices.this_machine().has_gpu, reason="needs a CUDA GPU (CUPTI timer)")
def test_cupti_timer_agrees_with_a_profiler_trace():
    if perfcheck.parallel_reason():
        pytest.skip(perfcheck.parallel_reason())
    op = registry.operation("softmax")
    impl = registry.implementation("softmax", "xla")
    case = next(c for c in op.cases if c.id == "f32-4096x4096")
    traced = crosscheck.trace_in_subprocess("softmax", "xla", case.id)
    m = timing.measure(impl, case)
    assert m.method == "cupti" and m.regime == "cold"
    assert abs(m.median_s - traced) <= 0.05 * traced, (m.median_s, traced)


class FakeCuptiSession:
    """Records, between start() and stop(), one kernel per unit of work the call reports;
    logs every event so the test can see where the flush ran."""

    def __init__(self):
        self.log: list[str] = []
        self.recording = False
        self.kernels: list[tuple[str, float]] = []

    def start(self):
        self.log.append("start")
        self.recording, self.kernels = True, []

    def stop(self):
        self.log.append("stop")
        self.recording = False
        return self.kernels

    def launch(self, name: str, ms: float):
        self.log.append(name)
        if self.recording:
            self.kernels.append((name, ms))


def test_cupti_sampler_records_each_call_alone_and_leaves_the_flush_out():
    session = FakeCuptiSession()
    sizes = iter([1, 2, 1, 3, 2])  # calls launch different numbers of kernels (autograd, ...)

    def call():
        for k in range(next(sizes)):
            session.launch(f"k{k}", 1.0 + k)

    sampler = timing._CuptiSampler(call, lambda: session.launch("flush", 9.0),
                                   lambda _: None, session, "softmax-test")
    assert sampler.flush_names == ["flush"]  # learned by recording the flush alone
    # The compiling call ran unrecorded; then each sample is start, flush, kernels, stop.
    assert sampler.take(4) == pytest.approx([3e-3, 1e-3, 6e-3, 3e-3])
    assert session.log[:6] == ["k0", "flush", "start", "flush", "stop", "start"]
    assert session.log[6:9] == ["flush", "k0", "k1"]


def test_cupti_sampler_refuses_a_call_that_launches_no_kernel_or_skips_the_flush():
    session = FakeCuptiSession()
    sampler = timing._CuptiSampler(lambda: None, lambda: session.launch("flush", 1.0),
                                   lambda _: None, session, "copy")
    with pytest.raises(RuntimeError, match="CUPTI recorded no kernel for copy"):
        sampler.take(1)
    flushes = iter([True, True, False])
    sampler = timing._CuptiSampler(lambda: session.launch("k", 1.0),
                                   lambda: session.launch("flush", 1.0) if next(flushes)
                                   else None, lambda _: None, session, "call")
    with pytest.raises(RuntimeError, match="expected the call to follow the flush's kernels"):
        sampler.take(1)


def test_torch_is_timed_by_cupti_unless_events_are_asked_for(monkeypatch):
    monkeypatch.delenv(timing.TORCH_TIMER_VARIABLE, raising=False)
    assert timing.torch_timer() == "cupti"
    monkeypatch.setenv(timing.TORCH_TIMER_VARIABLE, "cuda-events")
    assert timing.torch_timer() == "cuda-events"
    monkeypatch.setenv(timing.TORCH_TIMER_VARIABLE, "events")
    with pytest.raises(ValueError, match="KERNELPERF_TORCH_TIMER: expected one of"):
        timing.torch_timer()


def _timed(median_s: float, method: str = "cupti", label: str = "m") -> timing.Measurement:
    return timing.Measurement.from_samples([median_s], label=label, method=method,
                                           regime="cold", stop_reason="converged",
                                           fingerprint={})


def test_measurements_by_different_clocks_are_not_compared():
    one = _timed(1e-3, label="a")
    other = dataclasses.replace(one, label="b", method="cuda-events")
    assert timing.comparable(one, dataclasses.replace(one, label="c")) is None
    assert "different clocks (a: cupti, b: cuda-events)" in timing.comparable(one, other)


def test_speedup_is_over_the_fastest_baseline_of_the_same_clock():
    ours = _timed(2e-3)
    baselines = {"xla": _timed(3e-3), "cudnn": _timed(2.5e-3), "torch": _timed(4e-3),
                 "events": _timed(1e-3, "cuda-events")}
    fastest = timing.speedup(ours, baselines)
    assert fastest.best == "cudnn" and fastest.value == pytest.approx(1.25)
    assert fastest.other_clock == ("events",)
    across = timing.speedup(ours, baselines, across_clocks=True)
    assert across.best == "events" and across.value == pytest.approx(0.5)
    assert across.other_clock == ()
    alone = timing.speedup(ours, {"events": baselines["events"]})
    assert (alone.best, alone.value, alone.other_clock) == (None, None, ("events",))
    assert timing.speedup(ours, {}) == timing.Speedup(best=None, value=None, other_clock=())


def test_time_table_speedups_per_case_and_direction_by_one_clock():
    from kernels.cli import measure as measure_cli

    def impl(name, baseline=False):
        return registry.Implementation(op="softmax", name=name, fn=lambda x: x,
                                       framework="jax", baseline=baseline)

    small, large = (registry.operation("softmax").case(c)
                    for c in ("f32-37x128", "f32-256x1024"))
    ours, xla, torch = impl("pallas"), impl("xla", True), impl("torch", True)
    Row = measure_cli.Row
    rows = [Row(xla, small, "fwd", _timed(3e-6)), Row(torch, small, "fwd", _timed(2e-6)),
            Row(ours, small, "fwd", _timed(4e-6)),
            Row(xla, small, "bwd", _timed(9e-6)), Row(ours, small, "bwd", _timed(3e-6)),
            Row(xla, large, "fwd", _timed(1e-6, "host-clock")),
            Row(ours, large, "fwd", _timed(2e-6)),
            Row(ours, large, "bwd", _timed(2e-6)), Row(ours, small, "fwd", None, "skipped")]
    assert measure_cli._speedups(rows) == {2: "0.50x", 4: "3.00x", 6: "other clock"}
    assert measure_cli._speedups(rows, mixed=True)[6] == "0.50x (mixed clocks)"


def test_versus_tables_divide_one_runs_times_per_case_and_direction():
    """`kernels time --versus NAME`: per (case, direction), NAME's time over each row's, by
    one clock and one precision; "copy" is the case's bytes at the measured copy ceiling."""
    import types

    from kernels.cli import measure as measure_cli
    from kernels.roofline import ceilings

    def impl(name):
        return registry.Implementation(op="softmax", name=name, fn=lambda x: x,
                                       framework="jax")

    op = registry.operation("softmax")
    case = op.case("f32-256x1024")
    cudnn, ours, other = impl("xla"), impl("pallas"), impl("torch")
    Row = measure_cli.Row
    rows = [Row(cudnn, case, "fwd", _timed(2e-3)), Row(ours, case, "fwd", _timed(4e-3)),
            Row(other, case, "fwd", _timed(1e-3, "cuda-events")),
            Row(cudnn, case, "bwd", None, "no backward"), Row(ours, case, "bwd", _timed(1e-3)),
            Row(other, case, "bwd", None, "skipped")]
    lines = measure_cli.versus_table(op, rows, "xla").splitlines()
    assert lines[0].startswith("vs xla: xla's time over each's (> 1: faster than xla)")
    assert lines[1].split() == ["case", "dir", "xla", "xla", "pallas", "torch"]
    assert lines[3].split() == ["f32-256x1024", "fwd", "2.000", "ms", "1.000", "0.500",
                                "other", "clock", "(cuda-events)"]
    assert lines[4].split()[:5] == ["f32-256x1024", "bwd", "-", "(no", "backward)"]

    fastest = measure_cli.versus_table(op, rows, "fastest").splitlines()
    # The fastest by the clock most rows share: torch's 1 ms by CUDA events is no rival.
    assert fastest[3].split()[2:7] == ["2.000", "ms", "(xla)", "1.000", "0.500"]
    assert fastest[4].split()[2:7] == ["1.000", "ms", "(pallas)", "-", "1.000"]

    bandwidth = 1e9  # bytes per second: the case's 2 MiB forward take 2.097 ms at copy speed
    measured = ceilings.Ceiling(device="gpu", kind="measured", bandwidth=bandwidth, flops={},
                                method="cupti")
    copy = measure_cli.versus_table(op, rows, "copy", measured).splitlines()
    assert "(1 GB/s)" in copy[0]
    forward_s = op.work(case, "fwd").bytes / bandwidth
    assert copy[3].split()[2:6] == ["2.097", "ms", f"{forward_s / 2e-3:.3f}",
                                    f"{forward_s / 4e-3:.3f}"]
    backward_s = op.work(case, "bwd").bytes / bandwidth  # y and dy read, dx written
    assert copy[4].split()[-3:] == ["-", f"{backward_s / 1e-3:.3f}", "-"]
    assert "no measured copy ceiling" in measure_cli.versus_table(op, rows, "copy", None)

    # A precision the reference does not share is named, never divided by.
    tf32 = types.SimpleNamespace(median_s=1e-3, method="cupti", precision="TF32")
    fp32 = types.SimpleNamespace(median_s=2e-3, method="cupti", precision="FP32")
    mixed = measure_cli.versus_table(op, [Row(cudnn, case, "fwd", tf32),
                                          Row(ours, case, "fwd", fp32)], "xla")
    assert mixed.splitlines()[3].split()[-3:] == ["other", "precision", "(FP32)"]


def test_launch_overhead_is_host_time_per_issued_call():
    calls = []

    def fn():
        calls.append(time.perf_counter())
        time.sleep(2e-3)

    timeable = timing.Timeable("sleep", "torch", fn, (), on_gpu=False)
    rule = timing.StoppingRule(min_samples=3, time_budget_s=0.2)
    m = timing.launch_overhead(timeable, rule=rule, calls=4)
    assert m.method == "host-launch" and m.repeats >= 3
    assert 2e-3 <= m.median_s < 4e-3  # per call, not per batch of 4
    assert len(calls) == 4 * (m.repeats + timing.WARMUP_CALLS)


def test_cases_are_built_from_dims_and_attention_flags():
    import argparse

    from kernels.cli import measure as measure_cli
    from kernels.core import validation

    op = registry.operation("softmax")
    cases = measure_cli.cases_from_dims(op, {"rows": [8], "cols": [16, 32]}, ["f32", "bf16"])
    assert [c.id for c in cases] == ["f32-8x16", "f32-8x32", "bf16-8x16", "bf16-8x32"]
    with pytest.raises(validation.UserError, match=r"missing \['cols'\]"):
        measure_cli.cases_from_dims(op, {"rows": [8]}, ["f32"])
    flags = argparse.Namespace(batch=[4], heads=None, head_dim=None, seq_lengths=None)
    with pytest.raises(validation.UserError, match="--batch: softmax has no such dimension"):
        measure_cli._attention_dims(op, flags)


# Which sampler a GPU gets, without a GPU: the session, the flushes and torch's wait are fakes.

@pytest.fixture
def fake_gpu(monkeypatch):
    """CUPTI as a fake session; every flush a fake launch recording (bytes, wait); torch's
    device wait a no-op; a process that has recorded no device trace yet (after one, CUPTI
    timers are not started: a device-clock test run earlier must not choose the sampler).
    Yields (session, flushes)."""
    from kernels.core import compat

    monkeypatch.setattr(timing, "_TRACED", False)

    session = FakeCuptiSession()
    flushes = []

    def flush_factory(kind):
        def make(nbytes, wait=True):
            flushes.append((kind, nbytes, wait))
            return lambda: session.launch("flush", 9.0)
        return make

    monkeypatch.setattr(compat, "cupti_session", lambda: session)
    for kind in ("jax", "torch"):
        monkeypatch.setattr(timing, f"{kind}_flush", flush_factory(kind))
    monkeypatch.delenv(timing.TORCH_TIMER_VARIABLE, raising=False)
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    timing._warn_no_cupti.cache_clear()
    yield session, flushes
    timing._warn_no_cupti.cache_clear()


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("regime", timing.REGIMES)
def test_a_gpu_call_is_sampled_by_cupti_with_the_l2_flush_left_out(fake_gpu, framework, regime):
    """On a GPU every framework is timed by CUPTI: a sample is the call's kernels alone; the
    cold regime dispatches a flush of the whole L2 inside the session without waiting."""
    session, flushes = fake_gpu
    timeable = timing.Timeable("k", framework, lambda: session.launch("k", 2.0), (),
                               on_gpu=True)
    sampler, method = timing.make_sampler(timeable, regime, fakes.gpu_fingerprint())
    assert method == "cupti"
    assert sampler.take(3) == pytest.approx([2e-3] * 3)
    expected = [(framework, 60 << 20, False if framework == "jax" else True)]
    assert flushes == (expected if regime == "cold" else [])
    assert sampler.inner.flush_names == (["flush"] if regime == "cold" else [])
    assert sampler.clocks == [None] * 3 and sampler.throttled == [False] * 3


def test_torch_on_a_gpu_is_timed_by_events_when_asked_or_without_cupti(fake_gpu, monkeypatch):
    from kernels.core import compat

    session, flushes = fake_gpu
    timeable = timing.Timeable("k", "torch", lambda: None, (), on_gpu=True)
    monkeypatch.setenv(timing.TORCH_TIMER_VARIABLE, "cuda-events")
    monkeypatch.setattr(compat, "cupti_session", lambda: pytest.fail("CUPTI asked for"))
    sampler, method = timing.make_sampler(timeable, "cold", fakes.gpu_fingerprint())
    assert method == "cuda-events" and isinstance(sampler.inner, timing._CudaEventSampler)
    assert sampler.inner.flush is not None and flushes == [("torch", 60 << 20, True)]
    monkeypatch.delenv(timing.TORCH_TIMER_VARIABLE)
    monkeypatch.setattr(compat, "cupti_session", lambda: None)
    with pytest.warns(RuntimeWarning, match="torch is timed by cuda-events"):
        sampler, method = timing.make_sampler(timeable, "hot", fakes.gpu_fingerprint())
    assert method == "cuda-events" and sampler.inner.flush is None


def test_jax_on_a_gpu_without_cupti_is_timed_by_the_host_clock_with_a_warning(fake_gpu,
                                                                            monkeypatch):
    from kernels.core import compat

    session, flushes = fake_gpu
    monkeypatch.setattr(compat, "cupti_session", lambda: None)
    timeable = timing.Timeable("k", "jax", lambda: None, (), on_gpu=True)
    with pytest.warns(RuntimeWarning, match=r"jax is timed by host-clock, which counts launch "
                                            r"gaps; such results say method='host-clock'"):
        sampler, method = timing.make_sampler(timeable, "cold", fakes.gpu_fingerprint())
    assert method == "host-clock" and isinstance(sampler.inner, timing._HostSampler)
    assert flushes == [("jax", 60 << 20, True)]


def test_jax_arrays_over_several_devices_are_timed_by_the_host_clock(fake_gpu):
    """CUPTI would sum the kernels of every device (overlap counted twice): wall time."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if len(jax.devices()) < 2:
        pytest.skip("needs two devices")
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    spread = jax.device_put(np.ones((4, 2), np.float32), NamedSharding(mesh, PartitionSpec("x")))
    one = jax.device_put(np.ones((4, 2), np.float32), jax.devices()[0])
    assert timing.spans_devices((spread, 1)) and not timing.spans_devices({"a": [one], "b": 2})
    timeable = timing.Timeable("k", "jax", lambda x: x, (spread,), on_gpu=True)
    _, method = timing.make_sampler(timeable, "hot", fakes.gpu_fingerprint())
    assert method == "host-clock"


def test_make_sampler_refuses_an_unknown_regime():
    timeable = timing.Timeable("k", "torch", lambda: None, (), on_gpu=False)
    with pytest.raises(ValueError,
                       match=r"^regime: expected one of \('cold', 'hot'\), got 'warm'$"):
        timing.make_sampler(timeable, "warm", fakes.gpu_fingerprint())


def test_the_flushes_write_the_bytes_they_are_given():
    import numpy as np

    flush = timing.numpy_flush(4096)
    flush()
    buffer = flush.func.__self__
    assert buffer.nbytes == 4096 and np.all(buffer == 1)
    written = timing.jax_flush(4096, wait=False)()
    assert written.shape == (1024,) and written.dtype == np.int32
    assert np.all(np.asarray(written) == 1)
    assert timing.jax_flush(4096)().shape == (1024,)
    in_place = timing.jax_host_flush(4096)
    first = in_place()
    address = first.unsafe_buffer_pointer()
    second = in_place()
    assert second.shape == (1024,) and second.dtype == np.int32
    assert second.unsafe_buffer_pointer() == address  # rewritten, not allocated again
    assert np.all(np.asarray(second) == 2)  # both flushes wrote every element


def test_a_cpu_jax_call_is_flushed_in_place_and_a_gpus_host_clock_by_a_fresh_write(monkeypatch):
    """The cold host clock of JAX work on a CPU flushes through jax_host_flush (a fresh
    buffer per sample cost 23 ms of CPU each), before every sample; a GPU without CUPTI
    keeps jax_flush."""
    import warnings

    import jax.numpy as jnp

    made = []

    def recording(kind):
        def make(nbytes, wait=True):
            made.append((kind, nbytes))
            return lambda: made.append((kind, "flushed"))
        return make

    monkeypatch.setattr(timing, "jax_flush", recording("fresh"))
    monkeypatch.setattr(timing, "jax_host_flush", recording("in place"))
    monkeypatch.setattr(timing, "_TRACED", False)
    cpu = dataclasses.replace(fakes.gpu_fingerprint(), platform="cpu")
    for on_gpu, device, kind in ((False, cpu, "in place"),
                                 (True, fakes.gpu_fingerprint(l2_bytes=4096), "fresh")):
        made.clear()
        timeable = timing.Timeable("neg", "jax", jnp.negative, (jnp.ones(8),), on_gpu=on_gpu)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a GPU without CUPTI says so
            sampler, method = timing.make_sampler(timeable, "cold", device)
        sampler.take(2)
        assert method == "host-clock", method
        assert made == [(kind, timing.l2_bytes(device)), (kind, "flushed"), (kind, "flushed")], \
            (on_gpu, made)


def test_the_time_budget_follows_its_variable_and_the_platform(monkeypatch):
    monkeypatch.delenv("KERNELPERF_TIME_BUDGET", raising=False)
    assert timing.default_rule(fakes.gpu_fingerprint()).time_budget_s == 3.0
    cpu = dataclasses.replace(fakes.gpu_fingerprint(), platform="cpu")
    assert timing.default_rule(cpu).time_budget_s == 1.0
    monkeypatch.setenv("KERNELPERF_TIME_BUDGET", "0.25")
    assert timing.default_rule(cpu) == timing.StoppingRule(time_budget_s=0.25)


# What is timed: the backward's pullback for a seeded cotangent, in either framework.

@pytest.mark.parametrize("impl_name", ["xla", "torch"])
def test_a_backward_timeable_computes_the_vjp_of_the_seeded_cotangent(impl_name):
    """The timed backward returns the reference's VJP for the cotangent drawn from the seed
    (not the forward again), whichever framework runs it; the forward returns the output."""
    import jax
    import numpy as np

    from kernels.core import checking, registry

    op = registry.operation("softmax")
    case = op.case("f32-37x128")
    impl = registry.implementation("softmax", impl_name)
    (x,) = checking.make_inputs(op, case, 3, "normal")
    cotangent = np.random.default_rng(3 + 1_000_003).standard_normal(x.shape, dtype=np.float32)
    _, pullback = jax.vjp(lambda a: jax.nn.softmax(a, axis=-1), x)
    backward = timing.prepare(impl, case, direction="bwd", seed=3)
    assert backward.label == f"softmax-{impl_name} {case.id} bwd"
    assert backward.framework == impl.framework and backward.on_gpu is False
    (dx,) = backward.fn(*backward.args)
    dx = dx.detach().numpy() if impl_name == "torch" else np.asarray(dx)
    np.testing.assert_allclose(dx, pullback(cotangent)[0], rtol=1e-4, atol=1e-6)
    forward = timing.prepare(impl, case, direction="fwd", seed=3, inputs=(x,))
    out = forward.fn(*forward.args)
    out = out.numpy() if impl_name == "torch" else np.asarray(out)
    np.testing.assert_allclose(out, jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-7)


def test_every_backward_of_a_case_shares_one_read_only_cotangent():
    """Drawn once per (shape, dtype, seed) and never written (each framework copies it to its
    device): a 32768 x 4096 draw cost ~2 s per implementation."""
    import numpy as np

    from kernels.core import dtypes

    first = timing._cotangent((64, 32), np.dtype("float32"), 5)
    assert timing._cotangent((64, 32), np.dtype("float32"), 5) is first
    assert not first.flags.writeable and first.dtype == np.float32
    assert timing._cotangent((64, 32), np.dtype("float32"), 6) is not first
    half = timing._cotangent((64, 32), dtypes.to_numpy("bf16"), 5)
    assert half.dtype == dtypes.to_numpy("bf16")
    np.testing.assert_array_equal(half.astype(np.float32), first.astype(dtypes.to_numpy("bf16"))
                                  .astype(np.float32))


def test_a_kernel_without_a_backward_cannot_be_timed_backward():
    from kernels.core import registry

    impl = registry.implementation("softmax", "cuda")
    case = registry.operation("softmax").case("f32-37x128")
    with pytest.raises(ValueError, match=r"^direction: softmax-cuda has no backward; expected "
                                         r"'fwd', got 'bwd'$"):
        timing.prepare(impl, case, direction="bwd")


def test_samples_taken_under_a_low_clock_are_flagged_throttled(monkeypatch):
    """Each batch takes the lower of the SM clock reads around it; a batch under the default
    clock's threshold is flagged throttled, sample by sample, and kept."""
    reads = iter([1980, 1900, 1000, 1980, None, None])
    monkeypatch.setattr(fingerprint, "read_clocks", lambda: (
        lambda mhz: None if mhz is None else fingerprint.Clocks(sm_mhz=mhz))(next(reads)))

    class Counting:
        def take(self, n):
            return [1e-3] * n

    sampler = timing._ClockedSampler(Counting(), fakes.gpu_fingerprint())
    sampler.take(2)
    sampler.take(1)
    sampler.take(1)
    assert sampler.clocks == [1900, 1900, 1000, None]
    assert sampler.throttled == [False, False, True, False]
    assert sampler.first_clocks.sm_mhz == 1980 and sampler.last_clocks is None
    sampler.reset()
    assert (sampler.clocks, sampler.throttled, sampler.first_clocks) == ([], [], None)


def test_cuda_events_time_each_call_between_its_own_pair(monkeypatch):
    """The events sampler records a start and an end event around each call, the flush before
    the start, and reads each pair's elapsed time (ms) as seconds."""
    torch = pytest.importorskip("torch")
    log = []

    class Event:
        count = 0

        def __init__(self, enable_timing):
            assert enable_timing
            Event.count += 1
            self.number = Event.count

        def record(self):
            log.append(("record", self.number))

        def elapsed_time(self, end):
            return float(end.number - self.number)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    sampler = timing._CudaEventSampler(lambda: log.append("call"), lambda: log.append("flush"))
    assert sampler.take(2) == pytest.approx([2e-3, 2e-3])  # starts 1, 2; ends 3, 4
    assert log == ["flush", ("record", 1), "call", ("record", 3),
                   "flush", ("record", 2), "call", ("record", 4), "sync"]


def test_each_cupti_session_stops_after_the_work_it_recorded():
    """The session is stopped only once the last work dispatched inside it is done: the wait
    is given the call's result (the flush's when the flush is recorded alone), since JAX
    dispatches asynchronously and a session stopped early loses the kernels still running."""
    session = FakeCuptiSession()
    waited = []

    def call():
        session.launch("k", 1.0)
        return "call's result"

    def flush():
        session.launch("flush", 1.0)
        return "flush's result"

    sampler = timing._CuptiSampler(call, flush, waited.append, session, "op")
    assert waited == ["call's result", "flush's result", "flush's result"]  # compile, learn
    sampler.take(2)
    assert waited[3:] == ["call's result"] * 2


def test_cupti_sampler_refuses_a_flush_it_cannot_see():
    """A flush that CUPTI records no kernel for cannot be told from the call's kernels."""
    session = FakeCuptiSession()
    with pytest.raises(RuntimeError, match=r"^CUPTI recorded no kernel for the L2 flush$"):
        timing._CuptiSampler(lambda: session.launch("k", 1.0), lambda: None, lambda _: None,
                             session, "op")
