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
