"""kernels.profile.bottleneck on any machine: ncu's raw CSV read into kernels, the verdict
rules, and the profile plumbing against a stand-in ncu (the real one runs in `python -m kernels
bottleneck` on a GPU)."""

from __future__ import annotations

import pathlib
import stat
import sys

import pytest

from kernels.core import validation
from kernels.profile import bottleneck, crosscheck

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
METRICS = {
    "gpu__time_duration.sum": ("us", "{time}"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "{sm}"),
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "{mem}"),
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "{dram}"),
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "{l2}"),
    "l1tex__throughput.avg.pct_of_peak_sustained_active": ("%", "{l1}"),
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "{tensor}"),
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": ("%", "{xu}"),
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "{fma}"),
    "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active": ("%", "99"),
    "smsp__issue_active.avg.pct_of_peak_sustained_active": ("%", "{issue}"),
    "launch__registers_per_thread": ("register/thread", "168"),
    "launch__shared_mem_per_block_dynamic": ("Kbyte/block", "{smem}"),
    "launch__shared_mem_per_block_static": ("byte/block", "0"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "18.7"),
    STALL.format("long_scoreboard"): ("", "{long}"),
    STALL.format("barrier"): ("", "2.5"),
    STALL.format("math_pipe_throttle"): ("", "0.4"),
    STALL.format("selected"): ("", "1.0"),
    "smsp__average_warps_issue_stalled_barrier_not_issued.ratio": ("", "100"),
    "device__attribute_display_name": ("", "NVIDIA H100 80GB HBM3"),
}
KERNEL = dict(time="1,234.5", sm="62.1", mem="40", dram="20", l2="30", l1="38", tensor="55",
              xu="48",
              fma="31", issue="41", smem="196.61", long="3.25")


def raw_csv(*kernels: dict[str, str]) -> str:
    """ncu's `--page raw --csv` layout: a header, a row of units, a row per kernel."""
    def line(cells):
        return ",".join(f'"{cell}"' for cell in cells)

    head = ["ID", "Process ID", "Process Name", "Kernel Name", *METRICS]
    units = ["", "", "", "", *(unit for unit, _ in METRICS.values())]
    body = [line([str(i), "42", "python3", f"kernel_{i}(float*, int)",
                  *(value.format(**k) for _, value in METRICS.values())])
            for i, k in enumerate(kernels)]
    return "==PROF== Disconnected\n" + "\n".join([line(head), line(units), *body]) + "\n"


def test_raw_csv_gives_each_kernel_its_metrics_in_launch_order():
    kernels = bottleneck.parse_raw_csv(raw_csv(KERNEL, {**KERNEL, "time": "10"}))
    assert [k.name for k in kernels] == ["kernel_0(float*, int)", "kernel_1(float*, int)"]
    first = kernels[0]
    assert first.time_ns == pytest.approx(1234.5e3)  # "1,234.5" usecond
    assert kernels[1].time_ns == pytest.approx(10e3)
    assert (first.sm_pct, first.memory_pct, first.issue_pct) == (62.1, 40.0, 41.0)
    assert first.tensor_pct == 55.0
    # "shared" is the sum of other pipes, not a pipe of its own.
    assert first.busiest_pipe() == ("xu", 48.0)
    # "selected" (the issuing cycle itself) is no stall.
    assert first.stalls() == [("long_scoreboard", 3.25), ("barrier", 2.5),
                              ("math_pipe_throttle", 0.4)]
    assert first.shared_bytes == pytest.approx(196.61e3)
    assert "device__attribute_display_name" not in first.values  # a string, not a number


DATA = pathlib.Path(__file__).parent / "data"


def test_a_real_report_from_the_h100():
    """ncu 2025.3.1's own output (data/README.md): the Mosaic forward of 2026-11-25, whose grid
    ran batches side by side and streamed K and V from DRAM."""
    (kernel,) = bottleneck.parse_raw_csv((DATA / "ncu_raw_mosaic_attention_fwd_h100.csv")
                                         .read_text())
    assert kernel.name == "anonymous_mosaic_gpu_kernel"
    assert kernel.time_ns == pytest.approx(971.648e3)  # "971.648" in a "us" column
    assert kernel.memory_units() == pytest.approx({"DRAM": 80.546756, "L2": 94.223059,
                                                   "L1/shared": 45.199287})
    assert kernel.get("lts__t_sector_hit_rate.pct") == pytest.approx(30.612525)
    assert kernel.verdict() == "memory (L2)"
    assert kernel.shared_bytes == pytest.approx(167001.0)  # 167 Kbyte dynamic, 1 byte static
    bwd = bottleneck.parse_raw_csv((DATA / "ncu_raw_triton_attention_bwd_h100.csv").read_text())
    assert [(k.name, round(k.time_ns)) for k in bwd] == [
        ("attention_backward_kernel_delta", 50144), ("attention_backward_kernel_dkdv", 2393248),
        ("attention_backward_kernel_dq", 1307968)]  # a "ms" column
    assert [k.verdict() for k in bwd] == ["memory (DRAM)", "latency (barrier)", "SM (tensor)"]
    assert bwd[0].local_memory_instructions == 32768


def test_long_layout_reads_the_same():
    text = ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k","gpu__time_duration.sum","msecond","1.5"\n'
            '"0","k","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","70"\n'
            '"1","j","gpu__time_duration.sum","nsecond","900"\n')
    kernels = bottleneck.parse_raw_csv(text)
    assert [(k.name, k.time_ns) for k in kernels] == [("k", 1.5e6), ("j", 900.0)]
    assert kernels[0].sm_pct == 70.0
    with pytest.raises(ValueError, match="^ncu output has no CSV table"):
        bottleneck.parse_raw_csv("==PROF== No kernels were profiled.\n")


@pytest.mark.parametrize(("changes", "verdict"), [
    ({"tensor": "81"}, "tensor pipe"),
    ({"sm": "30", "mem": "55"}, "latency (long_scoreboard)"),
    ({"sm": "30", "mem": "75", "dram": "80", "l1": "40"}, "memory (DRAM)"),
    ({"sm": "30", "mem": "75", "dram": "10", "l2": "70", "l1": "75"}, "memory (L1/shared)"),
    ({"sm": "30", "mem": "95", "dram": "80", "l2": "94"}, "memory (L2)"),
    ({}, "SM (tensor)"),  # the tensor pipe at 55% is the busiest
    ({"tensor": "30"}, "SM (xu)"),  # then xu at 48% over the issue slots at 41%
    ({"tensor": "30", "issue": "90"}, "SM (issue slots)"),
])
def test_verdicts(changes, verdict):
    kernel = bottleneck.parse_raw_csv(raw_csv({**KERNEL, **changes}))[0]
    assert kernel.verdict() == verdict


def test_rows_put_the_longest_kernel_first_with_its_share():
    kernels = bottleneck.parse_raw_csv(raw_csv({**KERNEL, "time": "100"},
                                               {**KERNEL, "time": "300"}))
    rows = bottleneck.rows("triton fwd", kernels)
    assert [(r[1], r[2], r[3]) for r in rows] == [("kernel_1", "300.0", "75"),
                                                  ("kernel_0", "100.0", "25")]
    assert len(rows[0]) == len(bottleneck.HEADER)
    header = bottleneck.HEADER
    cells = dict(zip(header, rows[0], strict=True))
    assert (cells["busiest pipe %"], cells["regs"], cells["smem KiB"], cells["DRAM %"]) == \
        ("xu 48", "168", "192", "20")
    assert cells["top stalls (cycles/issue)"].startswith("long_scoreboard 3.2")


def test_profile_runs_ncu_then_reads_its_report(tmp_path, monkeypatch):
    """A stand-in ncu: the profiling call must name the child, the sections and the clocks left
    alone; the import calls print the CSV and the details."""
    log = tmp_path / "calls.txt"
    fake = tmp_path / "ncu"
    csv_file = tmp_path / "raw.csv"
    csv_file.write_text(raw_csv(KERNEL))
    fake.write_text(f"""#!{sys.executable}
import pathlib, sys
args = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write(" ".join(args) + "\\n")
if "--export" in args:
    pathlib.Path(args[args.index("--export") + 1]).write_text("report")
elif "raw" in args:
    print(pathlib.Path({str(csv_file)!r}).read_text())
else:
    print("Section: GPU Speed Of Light Throughput")
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    out.mkdir()
    report, kernels = bottleneck.profile("attention", "triton", "bf16-4x4096x16x128", "bwd",
                                         out, str(fake))
    assert report == out / "attention-triton-bf16-4x4096x16x128-bwd.ncu-rep"
    assert [k.name for k in kernels] == ["kernel_0(float*, int)"]
    calls = log.read_text().splitlines()
    first = calls[0].split()
    assert first[first.index("--clock-control") + 1] == "none"
    assert first[first.index("--profile-from-start") + 1] == "off"
    assert [first[i + 1] for i, a in enumerate(first) if a == "--section"] == \
        list(bottleneck.SECTIONS)
    assert first[-9:] == ["kernels.profile.crosscheck", "run", "attention", "triton",
                          "bf16-4x4096x16x128", "--calls", "1", "--direction", "bwd"]
    assert "Speed Of Light" in (out / f"{report.stem}.details.txt").read_text()
    # A failed profile names its log.
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('==ERROR== boom')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="exited 3; its output is in .*boom"):
        bottleneck.profile("attention", "triton", "bf16-4x4096x16x128", "fwd", out, str(fake))


def test_missing_ncu_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(crosscheck.pathlib.Path, "is_file", lambda self: False)
    assert crosscheck.find_ncu() is None
    with pytest.raises(validation.UserError, match="ncu: expected Nsight Compute's ncu"):
        crosscheck.ncu_path()
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text("")
    monkeypatch.undo()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert crosscheck.find_ncu() == str(fake)  # the toolkit's, where PATH has none


def test_the_child_takes_the_direction(monkeypatch):
    """`kernels.profile.crosscheck run ... --direction bwd` is what ncu launches."""
    from kernels.profile import crosscheck

    seen = []
    monkeypatch.setattr(crosscheck, "_run_calls", lambda *args: seen.append(args))
    crosscheck.main(["run", "attention", "triton", "bf16-4x4096x16x128", "--calls", "1",
                     "--direction", "bwd"])
    assert seen == [("attention", "triton", "bf16-4x4096x16x128", 1, "bwd")]


def test_the_command_profiles_each_implementation_and_direction(monkeypatch, tmp_path, capsys):
    """`python -m kernels bottleneck` with the GPU, ncu and the profile stood in: a row per
    kernel, a skip row for a direction an implementation lacks (whatever the order asked), a
    FAILED row and exit 1 for a profile that failed."""
    from kernels import cli
    from kernels.core import devices, registry

    class GPU:
        has_gpu = True

        def describe(self):
            return "1 x stand-in GPU"

    (kernel,) = bottleneck.parse_raw_csv((DATA / "ncu_raw_mosaic_attention_fwd_h100.csv")
                                         .read_text())
    calls = []

    def profile(op, impl, case, direction, out, ncu):
        calls.append((impl, direction))
        if impl == "cudnn":
            raise RuntimeError("ncu on cudnn exited 1")
        return out / "r.ncu-rep", [kernel]

    monkeypatch.setattr(devices, "this_machine", GPU)
    monkeypatch.setattr(devices, "case_unavailable_reason", lambda *a: None)
    monkeypatch.setattr(registry, "has_direction",
                        lambda impl, direction: impl.name != "triton" or direction == "fwd")
    monkeypatch.setattr(crosscheck, "ncu_path", lambda: "ncu")
    monkeypatch.setattr(bottleneck, "profile", profile)
    status = cli.main(["bottleneck", "attention", "--impl", "triton", "pallas_mosaic", "cudnn",
                       "--case", "bf16-4x4096x16x128", "--direction", "bwd", "fwd",
                       "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1
    assert calls == [("triton", "fwd"), ("pallas_mosaic", "bwd"), ("pallas_mosaic", "fwd"),
                     ("cudnn", "bwd"), ("cudnn", "fwd")]
    assert "skipped: has no bwd" in out and out.count("FAILED: ncu on cudnn exited 1") == 2
    assert out.count("anonymous_mosaic_gpu_kernel") == 3  # triton fwd, mosaic bwd and fwd


def test_odd_tables_read_right():
    """No units row (the first row after the header is a kernel), a kernel named like the
    header's first cell, a short row skipped, not ending the table, and tables with no
    kernel rows."""
    text = ('"ID","Kernel Name","gpu__time_duration.sum"\n'
            '"0","k","1500"\n'
            '"1","short"\n'
            '"2","ID","2,000"\n')
    kernels = bottleneck.parse_raw_csv(text)
    assert [(k.name, k.time_ns, k.units) for k in kernels] == [
        ("k", 1500.0, {"gpu__time_duration.sum": ""}),
        ("ID", 2000.0, {"gpu__time_duration.sum": ""})]
    assert "ID" not in kernels[0].values  # the launch index is no metric
    header = '"ID","Kernel Name","gpu__time_duration.sum"\n'
    assert bottleneck.parse_raw_csv(header) == []
    assert bottleneck.parse_raw_csv(header + '"","","us"\n') == []
    long = ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k","gpu__time_duration.sum","ns","5"\n'
            '"0","k"\n'
            '"1","j","gpu__time_duration.sum","ns","7"\n')
    assert [k.time_ns for k in bottleneck.parse_raw_csv(long)] == [5.0, 7.0]


def kernel(**values: float) -> bottleneck.Kernel:
    names = {"tensor": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
             "sm": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
             "mem": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
             "issue": "smsp__issue_active.avg.pct_of_peak_sustained_active",
             "alu": "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
             "xu": "sm__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active"}
    return bottleneck.Kernel("k", {names.get(k, k): v for k, v in values.items()}, {})


@pytest.mark.parametrize(("values", "verdict"), [
    (dict(tensor=70.0, sm=10.0, mem=10.0), "tensor pipe"),  # the bound itself counts
    (dict(sm=65.0), "unknown (ncu gave no speed-of-light)"),
    (dict(mem=65.0), "unknown (ncu gave no speed-of-light)"),
    (dict(sm=59.9, mem=59.9), "latency"),  # no stall metrics
    (dict(sm=60.0, mem=40.0, alu=30.0), "SM (alu)"),  # at the bound: no longer latency
    (dict(sm=70.0, mem=70.0, alu=30.0), "SM (alu)"),  # memory must exceed SM
    (dict(sm=40.0, mem=70.0), "memory"),  # no unit metrics
    (dict(sm=70.0, mem=40.0), "SM"),  # no pipe or issue metrics
    (dict(sm=70.0, mem=40.0, alu=50.0, xu=10.0), "SM (alu)"),  # the busiest, not the last name
])
def test_verdict_edges(values, verdict):
    assert kernel(**values).verdict() == verdict


def test_each_pipe_reads_its_busiest_metric_and_the_older_unit_names():
    pipes = bottleneck.Kernel("k", {
        "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": 30.0,
        "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": 20.0,
        "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 0.5}, {})
    assert pipes.pipes() == {"alu": 30.0, "fma": 0.5}
    assert kernel(alu=50.0, xu=10.0).busiest_pipe() == ("alu", 50.0)
    older = bottleneck.Kernel("k", {
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": 12.0,
        "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": 34.0}, {})
    assert older.memory_units() == {"DRAM": 12.0, "L1/shared": 34.0}
    four = bottleneck.Kernel("k", {STALL.format(r): v for r, v in
                                   (("a", 4.0), ("b", 3.0), ("c", 2.0), ("d", 1.0))}, {})
    assert [r for r, _ in four.stalls()] == ["a", "b", "c"]


def test_a_row_has_every_column_and_dashes_where_ncu_gave_nothing():
    (mosaic,) = bottleneck.parse_raw_csv((DATA / "ncu_raw_mosaic_attention_fwd_h100.csv")
                                         .read_text())
    empty = bottleneck.Kernel("tiny_kernel(int)", {"gpu__time_duration.sum": 0.5}, {})
    bare = bottleneck.Kernel("no_time", {}, {})
    rows = bottleneck.rows("mosaic fwd", [bare, empty, mosaic])
    assert rows[0] == ["mosaic fwd", "anonymous_mosaic_gpu_kernel", "971.6", "100", "66", "81",
                       "68", "xu 35", "34", "81", "31", "168", "0", "163", "18",
                       "long_scoreboard 3.1, barrier 1.6, wait 1.5", "memory (L2)"]
    assert rows[1] == ["mosaic fwd", "tiny_kernel", "0.0", "0"] + ["-"] * 12 + [
        "unknown (ncu gave no speed-of-light)"]
    assert rows[2][1:4] == ["no_time", "-", "0"]


def test_shares_and_sizes_round_from_the_exact_numbers():
    timed = bottleneck.Kernel("a", {"gpu__time_duration.sum": 3.0,
                                    "launch__shared_mem_per_block_dynamic": 10760.0},
                              {"launch__shared_mem_per_block_dynamic": "byte/block"})
    rows = bottleneck.rows("x", [bottleneck.Kernel("b", {}, {}), timed])
    assert [(r[1], r[3]) for r in rows] == [("a", "100"), ("b", "0")]
    assert rows[0][bottleneck.HEADER.index("smem KiB")] == "11"  # 10.508 KiB


def test_a_kernel_name_is_shown_without_parameters_and_cut_to_48_characters():
    """The table's kernel column: the C++ parameter list dropped, a name of up to 48 characters
    whole, a longer one cut to 45 and "..." (48 in all)."""
    def shown(name):
        (row,) = bottleneck.rows("impl", [bottleneck.Kernel(name, {}, {})])
        return row[1]

    assert shown("gemm_wgmma<128, 256>(float const*, float*, int)") == "gemm_wgmma<128, 256>"
    whole = "k" * 48
    assert shown(whole) == whole and shown(whole + "(int)") == whole
    assert shown("k" * 45 + "abcd") == "k" * 45 + "..."


def test_a_failed_ncu_is_refused_even_with_a_report_and_quoted_by_its_last_400_characters(
        tmp_path):
    """ncu exiting non-zero fails the profile although it wrote a report (a child that died
    mid-call leaves a partial one); the error quotes the end of its output, 400 characters."""
    fake = tmp_path / "ncu"
    fake.write_text(f"""#!{sys.executable}
import pathlib, sys
args = sys.argv[1:]
pathlib.Path(args[args.index("--export") + 1]).write_text("partial report")
sys.stdout.write("a" * 600 + "b" * 400)
sys.exit(3)
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(RuntimeError, match="exited 3; its output is in ") as raised:
        bottleneck.profile("attention", "triton", "bf16-4x4096x16x128", "fwd", tmp_path,
                           str(fake))
    assert str(raised.value).endswith(".log: " + "b" * 400)
