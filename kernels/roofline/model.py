"""The roofline model: where a measured point sits under a device's ceilings.

For work W (FLOPs) moving Q bytes in t seconds on a device with compute peak
P and bandwidth B: intensity I = W / Q, attainable = min(P, I * B),
achieved = W / t, fraction = achieved / attainable; the memory roof binds when
I * B < P. A fraction above 1 cannot be a fast kernel: it means the work model
counts too few bytes or FLOPs (or the ceiling is wrong), and is flagged.
Work with no FLOPs (a copy, a broadcast) is judged by bandwidth alone.

Sharded work has a third roof: C bytes crossing between n devices, each
receiving at most L bytes/s (the all-gather bandwidth measured by
`kernels.sharding.meshes.interconnect_bandwidth`), take at least C / (n L). Given
`interconnect` = L, the fraction is the slowest roof's time over the measured
time, max(W / P, Q / B, C / (n L)) / t, and the bound names that roof.
"""

from __future__ import annotations

import dataclasses

from kernels.core import registry
from kernels.roofline.ceilings import Ceiling

# Fractions above these are reported as a wrong work model rather than a fast kernel: any
# point above a datasheet roof; above a measured roof, by more than that roof's own noise (on
# the H100 a bandwidth-bound softmax read 3021 GB/s beside a 3006 GB/s measured copy).
SUSPICIOUS_FRACTION = {"datasheet": 1.0, "measured": 1.05}


@dataclasses.dataclass(frozen=True)
class Placement:
    intensity: float  # FLOP/byte
    achieved_flops: float  # FLOP/s
    achieved_bandwidth: float  # bytes/s
    peak_flops: float
    bandwidth: float
    attainable_flops: float
    fraction: float  # of the attainable rate
    bound: str  # "memory", "compute" or "interconnect": the roof that binds
    ceiling: str  # which ceilings: "measured" or "datasheet", and the device
    interconnect: float | None = None  # bytes/s each device receives, if given
    achieved_interconnect: float | None = None  # comm_bytes / seconds / devices

    @property
    def suspicious(self) -> bool:
        """Above the roof: the work model (or the ceiling) is wrong."""
        return self.fraction > SUSPICIOUS_FRACTION[self.ceiling.split()[0]]

    @property
    def warning(self) -> str:
        """What a point above its roof means. A measured compute roof is only the best peer
        GEMM we timed (on the H100 a Mosaic GPU matmul beat it by 12%), so rising above it
        says the roof is low; above a datasheet roof, or a measured copy, the work model is
        wrong."""
        if not self.suspicious:
            return ""
        if self.ceiling.startswith("measured") and self.bound == "compute":
            return "above the measured GEMM roof"
        return "above the roof: work model?"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"suspicious": self.suspicious, "warning": self.warning}


def place(work: registry.Work, seconds: float, ceiling: Ceiling, dtype: str, *,
          devices: int = 1, interconnect: float | None = None) -> Placement:
    """Place `work` done in `seconds` under `ceiling` (times `devices`) for data of `dtype`;
    with `interconnect` (bytes/s per device), under the interconnect roof too."""
    if seconds <= 0:
        raise ValueError(f"seconds: expected > 0, got {seconds}")
    if work.bytes <= 0:
        raise ValueError(f"work.bytes: expected > 0, got {work.bytes}")
    roofs = ceiling.scaled(devices)
    peak = roofs.peak(dtype)
    intensity = work.flops / work.bytes
    achieved_bandwidth = work.bytes / seconds
    if work.flops > 0:
        attainable = min(peak, intensity * roofs.bandwidth)
        fraction = work.flops / seconds / attainable
    else:
        attainable = 0.0
        fraction = achieved_bandwidth / roofs.bandwidth
    bound = "memory" if intensity * roofs.bandwidth < peak else "compute"
    achieved_interconnect = None
    if interconnect and work.comm_bytes > 0 and devices > 1:
        achieved_interconnect = work.comm_bytes / seconds / devices
        comm_time = work.comm_bytes / (devices * interconnect)
        floor = max(work.flops / peak, work.bytes / roofs.bandwidth)
        if comm_time > floor:
            bound, fraction = "interconnect", comm_time / seconds
            attainable = work.flops / comm_time
    return Placement(intensity=intensity, achieved_flops=work.flops / seconds,
                     achieved_bandwidth=achieved_bandwidth, peak_flops=peak,
                     bandwidth=roofs.bandwidth, attainable_flops=attainable, fraction=fraction,
                     bound=bound, ceiling=f"{ceiling.kind} {roofs.device}",
                     interconnect=interconnect, achieved_interconnect=achieved_interconnect)
