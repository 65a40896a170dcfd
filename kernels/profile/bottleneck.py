"""What bounds each kernel of an implementation: Nsight Compute's hardware counters over one
call, reduced to a line per kernel and a verdict.

`python -m kernels bottleneck attention --impl pallas_mosaic cudnn --case bf16-4x4096x16x128
--direction fwd bwd` runs, for each implementation and direction, one process under
`ncu --profile-from-start off` (the call is warmed up first, so compilation and autotuning
kernels are not profiled; `kernels.profile.crosscheck run` is the child), with the sections below,
the caches flushed before each kernel (as the cold regime does) and the clocks left alone
(ncu's default would lock them to base; the GPU's settings are not ours to change). The
report (`.ncu-rep`, for Nsight Compute's source and warp-state views) and ncu's own rule
text (`--page details`) are kept beside the table.

Per kernel: its time and share of the call; SM and memory throughput against peak (ncu's
speed-of-light); the tensor pipe's and the busiest other pipe's share of their peak (the
exponentials of a softmax run on `xu`, its multiplies and adds on `fma`/`alu`); issue
slots busy; DRAM throughput and the L2 hit rate (a grid whose concurrent blocks share no
inputs streams them from DRAM); registers per thread, local-memory instructions (spills),
shared memory per block and achieved occupancy; the three largest warp stall reasons (cycles
per issued instruction). The verdict, in this order:
- "tensor pipe": the tensor pipe at TENSOR_BOUND of peak or more; the matmuls run near
  peak and only fewer or cheaper matmuls go faster;
- "latency (<stall>)": neither SM nor memory throughput reaches LATENCY_BELOW of peak, so
  warps wait (on the stall named) more than any unit is busy;
- "memory (<unit>)": memory throughput above SM throughput; the unit is DRAM, L2 or
  L1/shared, whichever is nearest its peak;
- "SM (<pipe>)": otherwise, the busiest pipe (tensor included), or the issue slots when
  they are busier.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess

from kernels.profile import crosscheck

SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis",
            "MemoryWorkloadAnalysis_Tables", "LaunchStats", "Occupancy", "SchedulerStats",
            "WarpStateStats")
TENSOR_BOUND = 70.0
LATENCY_BELOW = 60.0
NCU_TIMEOUT_S = 900

_PIPE = re.compile(r"^sm__(?:inst_executed_pipe|pipe)_(\w+?)(?:_cycles_active)?"
                   r"\.avg\.pct_of_peak_sustained_active$")
_STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)"
                    r"(?:_per_issue_active)?\.ratio$")
# Not named as the busiest pipe: "shared" (fp16 and tensor work together) is a sum of others,
# and the tensor pipe and its sub-pipes have their own column.
_PIPE_AGGREGATES = ("shared", "tensor")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One profiled kernel: its name and every raw metric ncu gave (units kept)."""

    name: str
    values: dict[str, float]
    units: dict[str, str]

    def get(self, *names: str) -> float | None:
        """The first of `names` that ncu reported."""
        return next((self.values[n] for n in names if n in self.values), None)

    @property
    def time_ns(self) -> float | None:
        value = self.get("gpu__time_duration.sum")
        unit = self.units.get("gpu__time_duration.sum") or "ns"  # ncu's own default
        if value is not None and unit not in crosscheck.NCU_NANOSECONDS:
            raise ValueError(f"gpu__time_duration.sum: expected a unit of "
                             f"{list(crosscheck.NCU_NANOSECONDS)}, got {unit!r}")
        return None if value is None else value * crosscheck.NCU_NANOSECONDS[unit]

    @property
    def sm_pct(self) -> float | None:
        return self.get("sm__throughput.avg.pct_of_peak_sustained_elapsed")

    @property
    def memory_pct(self) -> float | None:
        return self.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                        "gpu__memory_throughput.avg.pct_of_peak_sustained_elapsed")

    def memory_units(self) -> dict[str, float]:
        """DRAM, L2 and L1/shared throughput against their peaks, in %."""
        found = {"DRAM": self.get("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                                 "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                 "L2": self.get("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
                 "L1/shared": self.get("l1tex__throughput.avg.pct_of_peak_sustained_active",
                                       "l1tex__throughput.avg.pct_of_peak_sustained_elapsed")}
        return {unit: value for unit, value in found.items() if value is not None}

    @property
    def issue_pct(self) -> float | None:
        return self.get("smsp__issue_active.avg.pct_of_peak_sustained_active")

    def pipes(self) -> dict[str, float]:
        """Each pipe's busiest reading (instructions or cycles) against its peak, in %."""
        found: dict[str, float] = {}
        for name, value in self.values.items():
            match = _PIPE.match(name)
            if match:
                pipe = match.group(1)
                found[pipe] = max(found.get(pipe, 0.0), value)
        return found

    @property
    def tensor_pct(self) -> float | None:
        tensor = [v for pipe, v in self.pipes().items() if "tensor" in pipe]
        return max(tensor) if tensor else None

    def _other_pipes(self) -> dict[str, float]:
        return {pipe: v for pipe, v in self.pipes().items()
                if not any(word in pipe for word in _PIPE_AGGREGATES)}

    def busiest_pipe(self) -> tuple[str, float] | None:
        """The busiest pipe other than the tensor pipe (and other aggregates)."""
        others = self._other_pipes()
        return max(others.items(), key=lambda item: item[1]) if others else None

    def stalls(self, top: int = 3) -> list[tuple[str, float]]:
        """The largest warp stall reasons: cycles per issued instruction spent on each."""
        found = {}
        for name, value in self.values.items():
            match = _STALL.match(name)
            # "selected" is the cycle a warp issues, not a wait (1 per instruction).
            if match and "not_issued" not in name and match.group(1) != "selected":
                found[match.group(1)] = value
        return sorted(found.items(), key=lambda item: -item[1])[:top]

    @property
    def shared_bytes(self) -> float | None:
        """Shared memory per block: dynamic plus static (without the driver's reserve). ncu
        gives sizes per block ("Kbyte/block")."""
        parts = [(self.values[n], self.units.get(n, "byte").split("/")[0]) for n in (
            "launch__shared_mem_per_block_dynamic", "launch__shared_mem_per_block_static")
            if n in self.values]
        return sum(v * crosscheck.NCU_BYTES[u] for v, u in parts) if parts else None

    @property
    def local_memory_instructions(self) -> float | None:
        """Local loads and stores executed: register spills (and stack arrays)."""
        parts = [self.values[n] for n in ("smsp__sass_inst_executed_op_local_ld.sum",
                                          "smsp__sass_inst_executed_op_local_st.sum")
                 if n in self.values]
        return sum(parts) if parts else None

    def verdict(self) -> str:
        tensor, sm, memory = self.tensor_pct, self.sm_pct, self.memory_pct
        if tensor is not None and tensor >= TENSOR_BOUND:
            return "tensor pipe"
        if sm is None or memory is None:
            return "unknown (ncu gave no speed-of-light)"
        if max(sm, memory) < LATENCY_BELOW:
            stalls = self.stalls(1)
            return f"latency ({stalls[0][0]})" if stalls else "latency"
        if memory > sm:
            units = self.memory_units()
            return f"memory ({max(units, key=units.get)})" if units else "memory"
        # The busiest of the pipes (the tensor pipe included) and the issue slots.
        busy = self._other_pipes()
        if tensor is not None:
            busy["tensor"] = tensor
        if self.issue_pct is not None:
            busy["issue slots"] = self.issue_pct
        return f"SM ({max(busy, key=busy.get)})" if busy else "SM"


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None  # "n/a", empty, or a string metric (a name, a device)


def parse_raw_csv(text: str) -> list[Kernel]:
    """Kernels from `ncu --import R --csv --page raw`: a header row ("ID", ..., "Kernel Name",
    then one column per metric), a row of units, then a row per kernel in launch order. The
    long layout (a row per kernel and metric, as `--page details` gives) is read too. Rows of
    the wrong length are skipped."""
    rows = [row for row in crosscheck.parse_ncu_rows(text)
            if None not in row and None not in row.values()]
    if rows and "Metric Name" in rows[0]:
        return _parse_long(rows)
    units = rows[0] if rows and not rows[0]["ID"].strip().isdigit() else None
    kernels = []
    for row in rows[1 if units else 0:]:
        values, unit_of = {}, {}
        for column, cell in row.items():
            number = _number(cell)
            if number is not None and column != "ID":
                values[column] = number
                unit_of[column] = units[column] if units else ""
        kernels.append(Kernel(row["Kernel Name"], values, unit_of))
    return kernels


def _parse_long(rows: list[dict[str, str]]) -> list[Kernel]:
    by_id: dict[str, Kernel] = {}
    for row in rows:
        kernel = by_id.setdefault(row["ID"], Kernel(row["Kernel Name"], {}, {}))
        number = _number(row["Metric Value"])
        if number is not None:
            kernel.values[row["Metric Name"]] = number
            kernel.units[row["Metric Name"]] = row["Metric Unit"]
    return list(by_id.values())


def _short(name: str, width: int = 48) -> str:
    name = re.sub(r"\(.*", "", name)  # C++ parameter lists
    return name if len(name) <= width else name[:width - 3] + "..."


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def rows(label: str, kernels: list[Kernel]) -> list[list[str]]:
    """Table rows for one implementation and direction, longest kernel first."""
    total = sum(k.time_ns or 0.0 for k in kernels) or 1.0
    out = []
    for kernel in sorted(kernels, key=lambda k: -(k.time_ns or 0.0)):
        pipe = kernel.busiest_pipe()
        shared = kernel.shared_bytes
        stalls = ", ".join(f"{reason} {cycles:.1f}" for reason, cycles in kernel.stalls())
        registers = kernel.get("launch__registers_per_thread")
        spills = kernel.local_memory_instructions
        out.append([
            label, _short(kernel.name),
            "-" if kernel.time_ns is None else f"{kernel.time_ns / 1e3:.1f}",
            f"{100 * (kernel.time_ns or 0.0) / total:.0f}",
            _pct(kernel.sm_pct), _pct(kernel.memory_pct), _pct(kernel.tensor_pct),
            "-" if pipe is None else f"{pipe[0]} {pipe[1]:.0f}", _pct(kernel.issue_pct),
            _pct(kernel.memory_units().get("DRAM")),
            _pct(kernel.get("lts__t_sector_hit_rate.pct")),
            "-" if registers is None else f"{registers:.0f}",
            "-" if spills is None else f"{spills:.0f}",
            "-" if shared is None else f"{shared / 1024:.0f}",
            _pct(kernel.get("sm__warps_active.avg.pct_of_peak_sustained_active")),
            stalls or "-", kernel.verdict()])
    return out


HEADER = ["implementation", "kernel", "us", "% of call", "SM %", "mem %", "tensor %",
          "busiest pipe %", "issue %", "DRAM %", "L2 hit %", "regs", "local ld/st",
          "smem KiB", "occupancy %",
          "top stalls (cycles/issue)", "bound by"]


def profile_command(ncu: str, report: pathlib.Path, op: str, impl: str, case: str,
                    direction: str) -> list[str]:
    """ncu over one warmed-up call of `impl` on `case` in `direction`, saved to `report`."""
    sections = [arg for section in SECTIONS for arg in ("--section", section)]
    return [ncu, *crosscheck.NCU_FLAGS, "--force-overwrite", "--export", str(report), *sections,
            *crosscheck.child_command("run", op, impl, case, "--calls", "1", "--direction",
                                      direction)]


def profile(op: str, impl: str, case: str, direction: str, out: pathlib.Path,
            ncu: str | None = None) -> tuple[pathlib.Path, list[Kernel]]:
    """Run ncu on one call; the report's path and its kernels. The rule text ncu prints for
    each section goes to `<report>.details.txt`."""
    ncu = ncu or crosscheck.ncu_path()
    report = out / f"{op}-{impl}-{case}-{direction}.ncu-rep"
    run = subprocess.run(profile_command(ncu, report, op, impl, case, direction),
                         capture_output=True, text=True, env=crosscheck.child_env(),
                         timeout=NCU_TIMEOUT_S)
    log = out / f"{report.stem}.log"
    log.write_text(run.stdout + run.stderr)
    if run.returncode or not report.exists():
        raise RuntimeError(f"ncu on {impl} {case} {direction} exited {run.returncode}; its "
                           f"output is in {log}: {(run.stderr or run.stdout)[-400:]}")
    raw = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw"],
                         capture_output=True, text=True, check=True, timeout=NCU_TIMEOUT_S)
    details = subprocess.run([ncu, "--import", str(report), "--page", "details"],
                             capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    (out / f"{report.stem}.details.txt").write_text(details.stdout)
    (out / f"{report.stem}.raw.csv").write_text(raw.stdout)
    return report, parse_raw_csv(raw.stdout)
