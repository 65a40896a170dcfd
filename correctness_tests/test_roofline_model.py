"""Roofline placement with exact numbers (powers of two, so every comparison is exact): the
memory and compute roofs, work without FLOPs, and the interconnect roof of sharded work."""

from __future__ import annotations

import pytest

from kernels.core import registry
from kernels.roofline import ceilings, floors, model

BANDWIDTH = 2.0**40  # bytes/s
PEAK = 2.0**44  # FLOP/s: the ridge at 16 FLOP/byte
CEILING = ceilings.Ceiling("test device", "measured", BANDWIDTH, {"bf16": PEAK})


# First in the file on purpose: the datasheet and the floor tables are built when their modules
# are imported, and mutmut credits what runs at import to the first test it sees run (make
# mutation's roofline target starts with this file), so this is the test their mutants meet.
def test_the_tables_built_at_import_are_whole():
    """Every datasheet peak is positive, dense at most half the 2:4 sparse headline (to the
    datasheet's rounding) and the H100 SXM's bf16 is 989.4 TFLOP/s dense; every floor names a
    registered kernel of a GPU the datasheet knows, and no two floors of a model cover the
    same kernel, direction and case."""
    for name, entry in ceilings.DATASHEET.items():
        assert entry.bandwidth > 0 and entry.peaks and entry.source, name
        for dtype, peak in entry.peaks.items():
            assert peak.dense > 0, (name, dtype)
            if peak.sparse is not None:
                assert peak.dense == pytest.approx(peak.sparse / 2, rel=0.02), (name, dtype)
    h100 = ceilings.datasheet("NVIDIA H100 80GB HBM3")
    assert h100.flops["bf16"] == pytest.approx(989.45e12, rel=1e-4)
    assert h100.flops["f32"] == pytest.approx(66.9e12, rel=1e-4)  # FFMA, no tensor cores
    assert ceilings.DATASHEET["NVIDIA H100 80GB HBM3"].peaks["bf16"].sparse == \
        pytest.approx(1978.9e12, rel=1e-4)
    assert h100.peak("f32") == pytest.approx(494.7e12, rel=1e-4)
    for model_name, table in floors.FLOORS.items():
        assert model_name in ceilings.DATASHEET
        keys = [(f.op, f.impl, f.direction, f.case) for f in table]
        assert len(keys) == len(set(keys)), model_name
        for floor in table:
            assert isinstance(floor.op, str) and isinstance(floor.impl, str), floor
            registry.implementation(floor.op, floor.impl)


def test_placement_dict_carries_the_verdict():
    placed = model.place(registry.Work(flops=2.0**40, bytes=2.0**30), 1.0, CEILING, "bf16")
    data = placed.to_dict()
    assert data["suspicious"] is False and data["warning"] == ""
    assert data["fraction"] == placed.fraction and data["bound"] == "compute"


def test_work_must_move_bytes():
    with pytest.raises(ValueError, match=r"^work.bytes: expected > 0, got 0.0$"):
        model.place(registry.Work(flops=1.0, bytes=0.0), 1.0, CEILING, "bf16")
    half_a_byte = model.place(registry.Work(flops=0.0, bytes=0.5), 2.0**-41, CEILING, "bf16")
    assert half_a_byte.fraction == 1.0


def test_work_without_flops_is_judged_by_bandwidth():
    placed = model.place(registry.Work(flops=0.0, bytes=2.0**30), 2.0**-9, CEILING, "bf16")
    assert placed.fraction == 0.5  # 2**39 bytes/s of 2**40
    assert placed.attainable_flops == 0.0 and placed.bound == "memory"


def test_a_fraction_of_a_flop_still_uses_the_compute_model():
    placed = model.place(registry.Work(flops=0.5, bytes=2.0**30), 2.0**-10, CEILING, "bf16")
    assert placed.attainable_flops == 0.5 / 2.0**30 * BANDWIDTH
    assert placed.fraction == 1.0


def test_the_ridge_point_counts_as_compute_bound():
    placed = model.place(registry.Work(flops=2.0**34, bytes=2.0**30), 2.0**-10, CEILING, "bf16")
    assert placed.intensity == 16.0 and placed.bound == "compute" and placed.fraction == 1.0


def _sharded(comm_bytes: float, seconds: float, devices: int = 4, interconnect=2.0**30):
    work = registry.Work(flops=2.0**36, bytes=2.0**30, comm_bytes=comm_bytes)
    return model.place(work, seconds, CEILING, "bf16", devices=devices, interconnect=interconnect)


def test_interconnect_roof_binds_when_communication_takes_longest():
    # 4 devices: compute floor 2**36 / 2**46 = 2**-10 s, memory 2**30 / 2**42 = 2**-12 s;
    # 2**34 bytes over 4 x 2**30 bytes/s take 4 s.
    placed = _sharded(comm_bytes=2.0**34, seconds=8.0)
    assert placed.bound == "interconnect"
    assert placed.fraction == 0.5  # 4 s of the 8 measured
    assert placed.attainable_flops == 2.0**36 / 4.0
    assert placed.achieved_interconnect == 2.0**34 / 8.0 / 4
    assert placed.interconnect == 2.0**30


def test_interconnect_roof_stays_out_when_faster_than_the_others():
    placed = _sharded(comm_bytes=2.0**10, seconds=2.0**-9)
    assert placed.bound == "compute" and placed.fraction == 0.5
    assert placed.achieved_interconnect == 2.0**10 / 2.0**-9 / 4


def test_interconnect_time_equal_to_the_compute_floor_leaves_compute_bound():
    placed = _sharded(comm_bytes=2.0**22, seconds=2.0**-10)  # 2**22 / 2**32 = 2**-10 s
    assert placed.bound == "compute"


@pytest.mark.parametrize("comm_bytes,devices,interconnect", [
    (0.0, 4, 2.0**30), (0.5, 4, 2.0**30), (2.0**34, 1, 2.0**30), (2.0**34, 4, None)])
def test_interconnect_needs_bytes_devices_and_a_bandwidth(comm_bytes, devices, interconnect):
    placed = _sharded(comm_bytes, 8.0, devices=devices, interconnect=interconnect)
    if comm_bytes == 0.5:  # half a byte still crosses: counted
        assert placed.achieved_interconnect == 0.5 / 8.0 / 4
    else:
        assert placed.achieved_interconnect is None and placed.bound != "interconnect"


def test_two_devices_use_the_interconnect_roof():
    placed = _sharded(comm_bytes=2.0**34, seconds=16.0, devices=2)
    assert placed.bound == "interconnect" and placed.fraction == 0.5  # 8 s of 16


# Ceilings: which roof a dtype reads, and where measured ceilings come from.

def test_f32_reads_the_tf32_roof_and_a_missing_dtype_falls_back_to_f32():
    both = ceilings.Ceiling("d", "datasheet", 1.0, {"tf32": 8.0, "f32": 2.0, "bf16": 16.0})
    assert (both.peak("f32"), both.peak("tf32"), both.peak("bf16"), both.peak("fp8")) == \
        (8.0, 8.0, 16.0, 2.0)
    ffma = ceilings.Ceiling("d", "measured", 1.0, {"f32": 2.0})
    assert (ffma.peak("f32"), ffma.peak("tf32"), ffma.peak("bf16")) == (2.0, 2.0, 2.0)
    with pytest.raises(KeyError, match=r"measured ceilings of d have no peak for 'f32' nor f32; "
                                       r"they have \['bf16'\]"):
        ceilings.Ceiling("d", "measured", 1.0, {"bf16": 16.0}).peak("f32")


def test_scaled_ceilings_multiply_every_roof_and_name_the_count():
    one = ceilings.Ceiling("GPU", "measured", 3.0, {"bf16": 5.0, "f32": 7.0}, "copy", "cupti")
    assert one.scaled(1) is one
    four = one.scaled(4)
    assert (four.device, four.bandwidth, four.flops) == ("4 x GPU", 12.0,
                                                          {"bf16": 20.0, "f32": 28.0})
    assert (four.kind, four.source, four.method) == ("measured", "copy", "cupti")
    assert ceilings.Ceiling.from_dict(four.to_dict()) == four


def test_datasheet_ceilings_are_the_dense_rates_with_their_source():
    sheet = ceilings.datasheet("NVIDIA H200")
    entry = ceilings.DATASHEET["NVIDIA H200"]
    assert (sheet.device, sheet.kind, sheet.bandwidth, sheet.source) == \
        ("NVIDIA H200", "datasheet", 4.8e12, entry.source)
    assert sheet.flops == {dtype: peak.dense for dtype, peak in entry.peaks.items()}
    assert sheet.method is None


def test_measured_ceilings_are_cached_per_model_under_kernelperf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    assert ceilings.cache_path("test-gpu") == tmp_path / "ceilings" / "test-gpu.json"
    monkeypatch.delenv("KERNELPERF_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ceilings.cache_path("m") == tmp_path / "home" / ".cache" / "kernelperf" / \
        "ceilings" / "m.json"


def _cpu(name: str = "Test CPU"):
    from kernels.core import fingerprint

    return fingerprint.Fingerprint(
        platform="cpu", name=name, model=fingerprint.normalise(name), sm_count=None,
        memory_bytes=None, l2_bytes=None, compute_capability=None, driver=None, cuda=None,
        default_sm_mhz=None, max_sm_mhz=None, versions=())


def test_measured_ceilings_are_measured_once_then_read_back(tmp_path, monkeypatch):
    """No cache: measured (here a made-up measurement) and written with the device; then read
    back without measuring; `refresh` measures again; `allow_measure=False` never measures.
    The cache's folders are made as needed."""
    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path / "not" / "yet"))
    device = _cpu()
    calls = []

    def fake_measure(dev):
        calls.append(dev)
        return ceilings.Ceiling(dev.name, "measured", 1e11 * len(calls), {"f32": 1e12},
                                method=ceilings.default_method(dev))

    monkeypatch.setattr(ceilings, "measure", fake_measure)
    assert ceilings.measured(device, allow_measure=False) is None and not calls
    first = ceilings.measured(device)
    assert calls == [device] and first.bandwidth == 1e11
    import json

    written = json.loads(ceilings.cache_path(device.model).read_text())
    assert written["ceiling"] == first.to_dict() and written["fingerprint"]["name"] == "Test CPU"
    assert ceilings.measured(device) == first and len(calls) == 1
    assert ceilings.measured(device, refresh=True).bandwidth == 2e11 and len(calls) == 2
    assert not list(ceilings.cache_path(device.model).parent.glob("*.tmp"))


def test_ceilings_after_a_device_trace_are_measured_by_a_fresh_process(tmp_path, monkeypatch):
    """A process that recorded a device trace (the device-span clock) never times the ceilings
    itself (Mosaic's CUPTI timer aborted such measuring workers on a 4-GPU host): a child
    measures and caches them, and this process reads the cache; a failing child leaves none,
    with a warning."""
    import dataclasses
    import json
    import subprocess

    from kernels.core import timing

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    device = dataclasses.replace(_cpu("Test GPU"), platform="gpu")
    made = ceilings.Ceiling(device.name, "measured", 3e12, {"bf16": 9e14}, method="cupti")
    children = []

    def child(command, **kwargs):
        children.append(command)
        path = ceilings.cache_path(device.model)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"ceiling": made.to_dict()}))
        return subprocess.CompletedProcess(command, 0)

    def in_process(dev):
        raise AssertionError("measured in the traced process")

    monkeypatch.setattr(ceilings, "measure", in_process)
    monkeypatch.setattr(subprocess, "run", child)
    monkeypatch.setattr(timing, "_TRACED", True)
    assert ceilings.measured(device) == made
    assert len(children) == 1 and "ceilings.measured()" in children[0][-1]
    ceilings.cache_path(device.model).unlink()
    monkeypatch.setattr(subprocess, "run",
                        lambda command, **kwargs: subprocess.CompletedProcess(command, 1))
    with pytest.warns(UserWarning, match=r"in a fresh process failed \(exit 1\); none measured"):
        assert ceilings.measured(device) is None


def test_a_cpu_has_no_datasheet_and_no_warning(tmp_path, monkeypatch):
    import warnings

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ceilings.for_device(_cpu("NVIDIA H100 80GB HBM3"), allow_measure=False) == \
            (None, None)
    assert ceilings.default_method(_cpu()) == "host-clock"


def test_measure_takes_the_fastest_candidate_and_derives_each_roof(monkeypatch):
    """measure() with the timer replaced by known medians: the copy's bandwidth is bytes read
    plus written over the fastest copy's time, each product's rate 2 n^3 over the fastest
    product's time, and the notes name what was timed."""
    pytest.importorskip("torch")
    from kernels.core import timing

    medians = {"torch neg": 4e-3, "xla neg": 2e-3, "torch matmul f32": 0.5}

    def fake_time(timeable, *, regime, rule, device):
        assert regime == ("hot" if "neg" in timeable.label else "cold")
        assert (rule.min_samples, rule.time_budget_s) == (5, 0.25)
        return timing.Measurement.from_samples(
            [medians[timeable.label]], label=timeable.label, method="host-clock",
            regime=regime, stop_reason="converged", fingerprint={})

    monkeypatch.setattr(timing, "time_timeable", fake_time)
    monkeypatch.setattr(ceilings, "CPU_COPY_BYTES", 1 << 20)
    monkeypatch.setattr(ceilings, "CPU_MATMUL", {"f32": 64})
    roof = ceilings.measure(_cpu())
    assert (roof.device, roof.kind, roof.method) == ("Test CPU", "measured", "host-clock")
    assert roof.bandwidth == pytest.approx(2 * (1 << 20) / 2e-3)
    assert roof.flops == {"f32": pytest.approx(2 * 64**3 / 0.5)}
    assert roof.source == ("copy 1 MiB (xla neg: host-clock, n=1, converged); "
                           "matmul f32 64^3 (torch matmul f32: host-clock, n=1, converged)")


def test_measure_refuses_candidates_timed_by_different_clocks(monkeypatch):
    pytest.importorskip("torch")
    from kernels.core import timing

    def fake_time(timeable, *, regime, rule, device):
        method = "cupti" if timeable.framework == "jax" else "cuda-events"
        return timing.Measurement.from_samples(
            [1e-3], label=timeable.label, method=method, regime=regime,
            stop_reason="converged", fingerprint={})

    monkeypatch.setattr(timing, "time_timeable", fake_time)
    monkeypatch.setattr(ceilings, "CPU_COPY_BYTES", 1 << 20)
    with pytest.raises(RuntimeError, match="measured ceilings: taken by different clocks"):
        ceilings.measure(_cpu())


def test_copy_and_product_candidates_compute_what_they_are_named(monkeypatch):
    """The copies negate `nbytes` of float32 ones (torch's and XLA's); the products multiply
    two n x n matrices of the dtype (XLA's only for 16-bit types)."""
    torch = pytest.importorskip("torch")
    import numpy as np

    copies = ceilings._copy_kernels(1 << 12, "cpu")
    assert [label for label, *_ in copies] == ["torch neg", "xla neg"]
    for label, fn, framework, args in copies:
        out = np.asarray(fn(*args)) if framework == "jax" else fn(*args).numpy()
        assert out.shape == (1 << 10,) and np.all(out == -1), label
    assert [framework for _, _, framework, _ in copies] == ["torch", "jax"]
    kinds = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
             "f16": torch.float16}
    for dtype, torch_dtype in kinds.items():
        products = ceilings._products(dtype, 8, "cpu")
        labels = [f"torch matmul {dtype}"] + ([f"xla matmul {dtype}"] if dtype in ("bf16", "f16")
                                              else [])
        assert [label for label, *_ in products] == labels
        assert [framework for _, _, framework, _ in products] == ["torch", "jax"][:len(labels)]
        a, b = products[0][3]
        assert a.shape == b.shape == (8, 8)
        assert a.dtype == b.dtype == torch_dtype
        assert not torch.equal(a, b)
        if dtype in ("tf32", "f16"):
            continue  # CPU matmuls in half precision are slow to emulate; their dtypes suffice
        for label, fn, framework, args in products:
            out = fn(*args)
            expected = (a.float() @ b.float()).numpy()
            got = np.asarray(out, dtype=np.float32) if framework == "jax" else \
                out.float().numpy()
            np.testing.assert_allclose(got, expected, rtol=0.05, atol=0.3, err_msg=label)


def _gpu(name: str = "NVIDIA H100 80GB HBM3"):
    import dataclasses

    return dataclasses.replace(_cpu(name), platform="gpu", l2_bytes=50 << 20)


def test_measured_ceilings_share_the_clock_the_points_are_timed_by(monkeypatch):
    """CUPTI on a GPU that has it; the host clock on a GPU without it and on every CPU."""
    from kernels.core import compat

    monkeypatch.setattr(compat, "cupti_session", lambda: object())
    assert ceilings.default_method(_gpu()) == "cupti"
    assert ceilings.default_method(_cpu()) == "host-clock"
    monkeypatch.setattr(compat, "cupti_session", lambda: None)
    assert ceilings.default_method(_gpu()) == "host-clock"


def test_a_known_gpu_gets_its_datasheet_and_its_cached_roofs_without_a_warning(tmp_path,
                                                                             monkeypatch):
    import json
    import warnings

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    device = _gpu()
    cached = ceilings.Ceiling(device.name, "measured", 3e12, {"bf16": 8e14},
                              method=ceilings.default_method(device))
    path = ceilings.cache_path(device.model)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ceiling": cached.to_dict()}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sheet, measured = ceilings.for_device(device, allow_measure=False)
    assert sheet == ceilings.datasheet(device.name) and measured == cached


def test_roofs_cached_by_another_clock_are_measured_again_and_replaced(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    device = _cpu()
    path = ceilings.cache_path(device.model)
    path.parent.mkdir(parents=True)
    stale = ceilings.Ceiling(device.name, "measured", 1.0, {"f32": 1.0}, method="cuda-events")
    path.write_text(json.dumps({"ceiling": stale.to_dict()}))
    fresh = ceilings.Ceiling(device.name, "measured", 2.0, {"f32": 2.0}, method="host-clock")
    monkeypatch.setattr(ceilings, "measure", lambda dev: fresh)
    with pytest.warns(UserWarning, match=r"timed by cuda-events, not host-clock: measuring again"):
        assert ceilings.measured(device) == fresh
    assert json.loads(path.read_text())["ceiling"] == fresh.to_dict()


def test_without_torch_there_are_no_measured_ceilings_and_a_warning_says_so(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))

    def no_torch(dev):
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(ceilings, "measure", no_torch)
    with pytest.warns(UserWarning, match=r"measured ceilings need torch \(No module named "
                                         r"'torch'\); none for Test CPU"):
        assert ceilings.measured(_cpu()) is None
    assert not ceilings.cache_path(_cpu().model).exists()


def test_a_gpu_measures_big_copies_and_products_on_cuda_with_tf32_only_for_tf32(monkeypatch):
    """measure() on a GPU (its candidates and timer faked): a 1 GiB copy and 8192^3 products
    made on "cuda", a 3 s budget, every timing on this device, TF32 allowed only while the
    tf32 product is timed and restored after."""
    torch = pytest.importorskip("torch")
    from kernels.core import timing

    made, timed = [], []

    def copies(nbytes, where):
        made.append(("copy", nbytes, where))
        return [("torch neg", lambda: None, "torch", ("arg",))]

    def products(dtype, size, where):
        made.append((dtype, size, where))
        return [(f"torch matmul {dtype}", lambda: None, "torch", ("arg",))]

    def fake_time(timeable, *, regime, rule, device):
        timed.append((timeable.label, timeable.args, rule.time_budget_s, device.platform,
                      torch.backends.cuda.matmul.allow_tf32))
        return timing.Measurement.from_samples(
            [1e-3], label=timeable.label, method="cupti", regime=regime,
            stop_reason="converged", fingerprint={})

    monkeypatch.setattr(ceilings, "_copy_kernels", copies)
    monkeypatch.setattr(ceilings, "_products", products)
    monkeypatch.setattr(timing, "time_timeable", fake_time)
    monkeypatch.setattr(timing, "callable_timeable",
                        lambda label, fn, framework, args: timing.Timeable(
                            label, framework, fn, args, on_gpu=True))
    before = torch.backends.cuda.matmul.allow_tf32  # torch's module: no monkeypatching it
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        roof = ceilings.measure(_gpu())
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert made == [("copy", ceilings.GPU_COPY_BYTES, "cuda"),
                    *((dtype, size, "cuda") for dtype, size in ceilings.GPU_MATMUL.items())]
    assert all(args == ("arg",) and budget == 3.0 and platform == "gpu"
               for _, args, budget, platform, _ in timed)
    assert {label: tf32 for label, *_, tf32 in timed} == {
        "torch neg": False, "torch matmul bf16": False, "torch matmul f16": False,
        "torch matmul tf32": True, "torch matmul f32": False}
    assert roof.bandwidth == pytest.approx(2 * ceilings.GPU_COPY_BYTES / 1e-3)
    assert roof.method == "cupti" and set(roof.flops) == set(ceilings.GPU_MATMUL)


def test_roofs_cached_without_a_clock_are_said_to_be_cuda_events(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    path = ceilings.cache_path(_cpu().model)
    path.parent.mkdir(parents=True)
    old = ceilings.Ceiling("Test CPU", "measured", 1.0, {"f32": 1.0})
    path.write_text(json.dumps({"ceiling": old.to_dict()}))
    with pytest.warns(UserWarning, match="were timed by CUDA events, not host-clock"):
        assert ceilings.measured(_cpu(), allow_measure=False) is None


def test_for_device_measures_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    fresh = ceilings.Ceiling("Test CPU", "measured", 2.0, {"f32": 2.0}, method="host-clock")
    monkeypatch.setattr(ceilings, "measure", lambda dev: fresh)
    assert ceilings.for_device(_cpu()) == (None, fresh)


def test_the_candidates_are_made_on_the_device_asked_for(monkeypatch):
    """Made on torch's "meta" device (shapes without memory), as a GPU's are on "cuda": the
    copy reads and writes its own two buffers there, the products' operands live there."""
    torch = pytest.importorskip("torch")
    (_, neg, _, _), _ = ceilings._copy_kernels(4096, "meta")
    src, dst = neg.args[0], neg.keywords["out"]
    assert src.device.type == dst.device.type == "meta" and src is not dst
    assert src.shape == dst.shape == (1024,) and src.dtype == dst.dtype == torch.float32
    import numpy as np

    from kernels.core import frameworks

    # XLA's candidate copies the operands through the host, which a meta tensor has not.
    monkeypatch.setattr(frameworks, "torch_to_numpy", lambda t: np.zeros(t.shape, np.float32))
    a, b = ceilings._products("f16", 8, "meta")[0][3]
    assert a.device.type == b.device.type == "meta" and a.dtype == torch.float16


def _traced_gpu(tmp_path, monkeypatch):
    """A GPU device in a process that recorded a device trace, its ceilings cached under
    tmp_path, and the ceilings it would measure (in-process measuring refused)."""
    import dataclasses

    from kernels.core import timing

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    monkeypatch.setattr(timing, "_TRACED", True)
    device = dataclasses.replace(_cpu("Test GPU"), platform="gpu")
    made = ceilings.Ceiling(device.name, "measured", 3e12, {"bf16": 9e14},
                            method=ceilings.default_method(device))
    return device, made


def test_the_ceilings_child_is_this_python_running_measured_with_its_output_on_stderr(
        tmp_path, monkeypatch):
    """The fresh process is this interpreter running a `-c` program: run here (untraced, as a
    fresh process is), that program measures and caches the ceilings the parent then reads.
    The child's output goes to the parent's stderr, never its stdout (which may carry JSON)."""
    import subprocess
    import sys

    from kernels.core import timing

    device, made = _traced_gpu(tmp_path, monkeypatch)
    monkeypatch.setattr(ceilings, "measure", lambda dev: made)
    runs = []

    def child(command, **kwargs):
        runs.append(kwargs)
        assert command[:2] == [sys.executable, "-c"] and len(command) == 3
        with monkeypatch.context() as fresh:  # a fresh process on the same device
            fresh.setattr(timing, "_TRACED", False)
            fresh.setattr(ceilings.fingerprint_module, "fingerprint", lambda: device)
            exec(command[2], {})  # the child's own program, as `python -c` runs it
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", child)
    assert ceilings.measured(device) == made
    assert len(runs) == 1 and runs[0]["stdout"] is sys.stderr


def test_a_ceilings_child_that_fails_or_caches_nothing_leaves_no_roofs(tmp_path, monkeypatch):
    """No roofs (and a warning) when the child exits non-zero, even with a cache of another
    clock left from before, or exits 0 without caching any; a failing child is a warning,
    never an exception (subprocess.run's check stays off)."""
    import json
    import subprocess

    device, made = _traced_gpu(tmp_path, monkeypatch)
    monkeypatch.setattr(ceilings, "measure", lambda dev: made)

    def exits(code):
        def run(command, **kwargs):
            if kwargs.get("check") and code:
                raise subprocess.CalledProcessError(code, command)
            return subprocess.CompletedProcess(command, code)
        return run

    monkeypatch.setattr(subprocess, "run", exits(0))
    with pytest.warns(UserWarning, match=r"in a fresh process failed \(exit 0\); none measured"):
        assert ceilings.measured(device) is None
    path = ceilings.cache_path(device.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = ceilings.Ceiling(device.name, "measured", 1.0, {"bf16": 1.0}, method="cuda-events")
    path.write_text(json.dumps({"ceiling": stale.to_dict()}))
    monkeypatch.setattr(subprocess, "run", exits(3))
    with pytest.warns(UserWarning) as caught:
        assert ceilings.measured(device) is None
    assert any("in a fresh process failed (exit 3); none measured" in str(w.message)
               for w in caught)


def test_a_cpu_measures_its_ceilings_in_process_even_after_a_device_trace(tmp_path,
                                                                         monkeypatch):
    """Only a GPU's ceilings move to a fresh process after a trace (Mosaic's CUPTI timer); a
    CPU measures them here, and says so on stderr first."""
    import subprocess

    from kernels.core import timing

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    monkeypatch.setattr(timing, "_TRACED", True)
    fresh = ceilings.Ceiling("Test CPU", "measured", 2.0, {"f32": 2.0}, method="host-clock")
    monkeypatch.setattr(ceilings, "measure", lambda dev: fresh)

    def child(command, **kwargs):
        raise AssertionError("a CPU's ceilings measured by a child")

    monkeypatch.setattr(subprocess, "run", child)
    assert ceilings.measured(_cpu()) == fresh


def test_measuring_ceilings_says_which_and_where_they_will_be_cached(tmp_path, monkeypatch,
                                                                   capsys):
    """A line on stderr before the (slow) measuring: the model and the cache path, in this
    process or in a fresh one after a device trace."""
    import subprocess

    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path))
    fresh = ceilings.Ceiling("Test CPU", "measured", 2.0, {"f32": 2.0}, method="host-clock")
    monkeypatch.setattr(ceilings, "measure", lambda dev: fresh)
    ceilings.measured(_cpu())
    path = ceilings.cache_path(_cpu().model)
    assert capsys.readouterr().err == \
        f"no measured ceilings of {_cpu().model} cached ({path}): measuring them once\n"
    device, _ = _traced_gpu(tmp_path, monkeypatch)
    monkeypatch.setattr(subprocess, "run",
                        lambda command, **kwargs: subprocess.CompletedProcess(command, 1))
    with pytest.warns(UserWarning):
        ceilings.measured(device)
    path = ceilings.cache_path(device.model)
    assert capsys.readouterr().err == (
        f"no measured ceilings of {device.model} cached ({path}): measuring them once in a "
        f"fresh process (this one recorded a device trace)\n")


def test_measuring_ceilings_prints_a_numbered_line_per_step_on_stderr(monkeypatch, capsys):
    """measure() says each step before it starts (minutes on a GPU's first run): step k of
    1 + one per product, the copy's size in MiB, each product's dtype and size."""
    pytest.importorskip("torch")
    from kernels.core import timing

    def fake_time(timeable, *, regime, rule, device):
        return timing.Measurement.from_samples(
            [1e-3], label=timeable.label, method="host-clock", regime=regime,
            stop_reason="converged", fingerprint={})

    monkeypatch.setattr(timing, "time_timeable", fake_time)
    monkeypatch.setattr(ceilings, "_copy_kernels",
                        lambda nbytes, where: [("torch neg", lambda: None, "torch", ())])
    monkeypatch.setattr(ceilings, "_products", lambda dtype, size, where: [
        (f"torch matmul {dtype}", lambda: None, "torch", ())])
    monkeypatch.setattr(ceilings, "CPU_COPY_BYTES", 3 << 20)
    monkeypatch.setattr(ceilings, "CPU_MATMUL", {"f32": 16, "bf16": 8})
    ceilings.measure(_cpu())
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == ["ceilings of Test CPU: 1/3 copy 3 MiB",
                                         "ceilings of Test CPU: 2/3 matmul f32 16^3",
                                         "ceilings of Test CPU: 3/3 matmul bf16 8^3"]


def test_a_test_run_caches_the_ceilings_it_measures_apart_from_the_users():
    """conftest.py points the run (workers and the processes tests start inherit it) at a
    cache of its own: ceilings measured under a test run's load never land in ~/.cache."""
    import os
    import pathlib

    given = os.environ.get("KERNELPERF_CACHE", "")
    if given and "kernelperf-test-cache-" not in given:
        pytest.skip(f"KERNELPERF_CACHE={given} was set for this run: conftest keeps it")
    path = ceilings.cache_path("cpu-model")
    assert pathlib.Path(given).name.startswith("kernelperf-test-cache-"), given
    assert pathlib.Path.home() not in path.parents and path.parent.parent.is_dir(), path
