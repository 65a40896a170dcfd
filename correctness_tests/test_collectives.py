"""Collective bandwidth (kernels.sharding.collectives): nccl-tests' size and bus-bandwidth
definitions, the collectives' semantics per rank on host devices, the table and the clock
check's command line."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from kernels.sharding import collectives, meshes

# Several devices: `pytest -m multi_gpu` runs these on a GPU host too (real NCCL).
pytestmark = pytest.mark.multi_gpu
ON_GPU = jax.default_backend() == "gpu"
CLOCK = "device-span" if ON_GPU else "host-clock"


def test_bus_factors_are_nccl_tests():
    assert collectives.bus_factor("all-reduce", 4) == pytest.approx(1.5)
    for op in ("all-gather", "reduce-scatter", "all-to-all"):
        assert collectives.bus_factor(op, 2) == pytest.approx(0.5)
        assert collectives.bus_factor(op, 8) == pytest.approx(7 / 8)
    assert collectives.bus_factor("send-recv", 8) == 1.0
    with pytest.raises(KeyError, match=r"op: expected one of \['all-gather'.*got 'gather'"):
        collectives.bus_factor("gather", 2)
    with pytest.raises(ValueError, match=r"^devices: expected at least 2 .* got 1$"):
        collectives.bus_factor("all-gather", 1)


def test_result_bandwidths():
    # 1 GiB all-gathered over 2 ranks in 4 ms: algbw 268 GB/s, busbw half of it.
    result = collectives.Result(op="all-gather", devices=2, size_bytes=1 << 30, seconds=4e-3,
                                method="device-span", cv=0.01, repeats=20)
    assert result.algbw == pytest.approx((1 << 30) / 4e-3)
    assert result.busbw == pytest.approx(result.algbw / 2)
    reduce = collectives.Result(op="all-reduce", devices=8, size_bytes=1 << 30, seconds=1.0,
                                method="device-span", cv=0.0, repeats=1)
    assert reduce.busbw == pytest.approx((1 << 30) * 14 / 8)
    with pytest.raises(ValueError, match=r"seconds: expected > 0, got 1024, 0.0"):
        collectives.Result(op="all-gather", devices=2, size_bytes=1024, seconds=0.0,
                           method="x", cv=0.0, repeats=1)


def test_sizes_and_byte_counts():
    assert collectives.sizes(1 << 20, 1 << 22) == [1 << 20, 1 << 21, 1 << 22]
    assert collectives.parse_bytes("256M") == 256 << 20
    assert collectives.parse_bytes("1GiB") == 1 << 30
    assert collectives.parse_bytes("64k") == 64 << 10
    assert collectives.human(256 << 20) == "256 MiB" and collectives.human(100) == "100 B"
    with pytest.raises(Exception, match=r"expected a byte count >= 1 .* got '1.5G'"):
        collectives.parse_bytes("1.5G")
    assert collectives.elements_per_rank("all-gather", 3, 1 << 20) == (1 << 18) // 3 * 3
    with pytest.raises(ValueError, match=r"size_bytes: expected at least 32 bytes \(8 float32 "
                                         r"per rank\) for all-to-all, got 16"):
        collectives.elements_per_rank("all-to-all", 8, 16)


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("op", collectives.OPS)
def test_each_collective_moves_what_nccl_tests_counts(op, devices):
    """S bytes per rank as nccl-tests defines it, and the collective's result, rank by rank."""
    if jax.device_count() < devices:
        pytest.skip(f"needs {devices} devices")
    size = 64 * devices * 4
    fn, ones = collectives.build(op, devices, size)
    count = size // 4
    x = jax.device_put(np.arange(ones.size, dtype=np.float32), ones.sharding)
    blocks = np.split(np.arange(ones.size, dtype=np.float32), devices)  # per rank's input
    out = fn(x)
    shards = [np.asarray(s.data) for s in sorted(out.addressable_shards,
                                                 key=lambda s: s.index[0].start or 0)]
    total = sum(blocks)
    for rank, shard in enumerate(shards):
        if op == "all-gather":  # output S per rank: every rank's S/n block
            assert blocks[rank].size == count // devices
            np.testing.assert_array_equal(shard, np.concatenate(blocks))
        elif op == "reduce-scatter":  # input S per rank, output the rank's sum block
            assert blocks[rank].size == count
            np.testing.assert_array_equal(shard, np.split(total, devices)[rank])
        elif op == "all-reduce":
            np.testing.assert_array_equal(shard, total)
        elif op == "all-to-all":  # block j of rank i goes to rank j, in rank order
            expected = np.concatenate([np.split(blocks[src], devices)[rank]
                                       for src in range(devices)])
            np.testing.assert_array_equal(shard, expected)
        else:  # send-recv: each rank's buffer to the next rank
            np.testing.assert_array_equal(shard, blocks[(rank - 1) % devices])


def test_sweep_prints_a_row_per_op_and_size(capsys):
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    assert collectives.main(["--ops", "all-gather", "all-to-all", "--devices", "2",
                             "--min-bytes", "64K", "--max-bytes", "128K"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("all-", "send"))]
    assert [(r[0], r[1], r[2] + r[3]) for r in rows] == [
        ("all-gather", "2", "64KiB"), ("all-gather", "2", "128KiB"),
        ("all-to-all", "2", "64KiB"), ("all-to-all", "2", "128KiB")]
    for r in rows:
        time_us, algbw, busbw = float(r[4]), float(r[5]), float(r[6])
        # Printed with 2 decimals: half a unit of the last one either way.
        assert algbw == pytest.approx(int(r[2]) * 1024 / time_us / 1e3, rel=0.01, abs=0.006)
        assert busbw == pytest.approx(algbw / 2, rel=0.01, abs=0.006)
        assert CLOCK in r[-4]  # the GPU's device span, the CPU's labelled host clock


@pytest.mark.parametrize("argv,message", [
    (["--min-bytes", "2M", "--max-bytes", "1M"], r"--min-bytes: expected at most --max-bytes "
                                                 r"\(1 MiB\), got 2 MiB"),
    (["--devices", "1"], r"--devices: expected an integer >= 2, got '1'"),
    (["--bytes", "-5"], r"--bytes: expected a byte count >= 1"),
    pytest.param(["--max-bytes", "1G"], r"--max-bytes: expected at most 64 MiB per rank on "
                                        r"CPU host devices .* got 1 GiB",
                 marks=pytest.mark.skipif(ON_GPU, reason="the CPU's limit")),
])
def test_command_line_mistakes_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        collectives.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(message, err), err


@pytest.mark.skipif(ON_GPU, reason="the CPU's answer; on GPUs the device script runs the check")
def test_check_clock_on_cpu_says_there_is_nothing_to_compare(capsys):
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    assert collectives.check_clock(2, 1 << 16, calls=4) == 0
    out = capsys.readouterr().out
    assert "host clock, 1 call per sample" in out and "4 calls back to back" in out
    assert "no GPU activity in the trace file" in out


def test_kernel_durations_need_one_kernel_per_device_and_call():
    from kernels.core import timing

    def ev(device, start, end, name="ncclDevKernel_AllGather_RING_LL"):
        return timing.DeviceEvent(device=device, stream="s", name=name, start_ns=start,
                                  end_ns=end)

    events = [ev("GPU:0", 0, 100), ev("GPU:1", 5, 120), ev("GPU:0", 200, 290, "gemm"),
              ev("GPU:0", 500, 590), ev("GPU:1", 505, 600)]
    assert collectives.kernel_durations(events, "AllGather", 2) == pytest.approx(
        [115e-9, 95e-9])
    assert collectives.kernel_durations(events, "AllGather", 3) == []


def test_interconnect_ceiling_is_the_all_gather_busbw():
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    bandwidth = meshes.interconnect_bandwidth(2, message_bytes=1 << 20, repeats=3)
    assert bandwidth.timer.startswith(f"kernels.core.timing {CLOCK}")
    result = collectives.Result(op="all-gather", devices=2, size_bytes=bandwidth.message_bytes,
                                seconds=bandwidth.seconds, method=CLOCK, cv=0.0,
                                repeats=3)
    assert bandwidth.bytes_per_second == pytest.approx(result.busbw)
