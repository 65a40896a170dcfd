"""Performance tests generated from the registry: each kernel against its floor on this GPU.

One item per (kernel, bench case, direction), ids like
`softmax-pallas-f32-32768x4096-fwd`, marked `perf` (and `gpu` on a GPU
machine, or where the kernel needs one): `pytest -m perf` runs them in one
process, `pytest -m "gpu and not perf"` leaves them out. Each item times the kernel and
the operation's baselines in this process (kernels.bench.perfcheck), records the
kernel's device-time samples through pytest-benchmark, then checks the floor
for this GPU model; on CPU, or on a model without floors, it records and skips
the check with the reason (and the run's last line names the model). Under
xdist workers (a plain `pytest -m gpu`) the items are one xdist group, run by a
worker of their own: it warms them all up while the others run, then times
each with the device to itself (`device_alone`, kernels/testing/perf_phase.py).
"""

from __future__ import annotations

import pytest

from kernels.bench import perfcheck
from kernels.core import devices, registry
from kernels.roofline import floors
from kernels.testing import perf_phase
from kernels.testing.marks import kernel_marks

ITEMS = {item.id: item for item in perfcheck.perf_items()}


def _params() -> list:
    machine = devices.this_machine()
    params = []
    for item in ITEMS.values():
        marks = [pytest.mark.perf, pytest.mark.xdist_group(perf_phase.PERF_GROUP),
                 pytest.mark.benchmark(timer=perfcheck.device_time, group=item.group),
                 *kernel_marks(item.impl, item.skip_reason, machine)]
        params.append(pytest.param(item.id, id=item.id, marks=marks))
    return params


@pytest.mark.parametrize("perf_id", _params())
def test_kernel_performance(perf_id: str, perf_session: perfcheck.PerfSession,
                            warmed_perf_items: None, device_alone: bool, benchmark,
                            saved_record, report_verdict) -> None:
    parallel = perfcheck.parallel_reason(alone=device_alone)
    if parallel:  # another process may be timing or computing on the device
        pytest.skip(parallel)
    item = ITEMS[perf_id]
    device = perf_session.device
    measured = perf_session.measure(item.impl, item.case, item.direction)
    baselines, baseline_errors = perf_session.measure_baselines(item.impl, item.case,
                                                                item.direction)
    sheet, measured_roof = perfcheck.placements(item.impl, item.case, item.direction,
                                                measured.median_s, measured.method, device)
    table = floors.table(device.name) if device.platform == "gpu" else None
    floor = floors.floor_for(device.name, item.impl.op, item.impl.name, item.case.id,
                             item.direction) if table else None
    verdict = perfcheck.judge(label=item.id, device=device, measured=measured,
                              baselines=baselines, placement=sheet, floor=floor,
                              has_floors=table is not None, baseline_errors=baseline_errors)
    work = registry.operation(item.impl.op).work(item.case, item.direction)
    perfcheck.record(benchmark, measured, perfcheck.extra_info(
        measured=measured, work=work, sheet=sheet, measured_roof=measured_roof,
        verdict=verdict, baselines=baselines, device=device, baseline_errors=baseline_errors))
    report_verdict(item.id, verdict)
    if saved_record is not None:
        refusal = perfcheck.compare_refusal(*saved_record[:2], measured, device,
                                            saved_record[2])
        if refusal:
            pytest.fail(refusal, pytrace=False)
    if verdict.status == "skipped":
        pytest.skip(verdict.message.splitlines()[0])
    if verdict.status != "pass":
        pytest.fail(verdict.message, pytrace=False)
