"""Meshes, logical-axis rules and the measured interconnect bandwidth shared by the sharded ops.

Sharded operations run over a 2-D device mesh with axes `data` and `model`;
a case names its mesh shape as a string such as "4x2" (data x model). Arrays
are laid out by logical axis names (`batch`, `embed`, `mlp`, `heads`,
`expert`) that `MeshRules` maps to mesh axes, the scheme of Flax's logical
partitioning and MaxText's `logical_axis_rules`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kernels.core import compat

DATA, MODEL = "data", "model"
MESH_AXES = (DATA, MODEL)


def parse_mesh_shape(shape: str | Sequence[int]) -> tuple[int, int]:
    """"4x2" or (4, 2) -> (4, 2): the sizes of the data and model axes."""
    if isinstance(shape, str):
        parts = shape.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"mesh: expected 'DATAxMODEL' such as '4x2', got {shape!r}")
        return int(parts[0]), int(parts[1])
    sizes = tuple(int(s) for s in shape)
    if len(sizes) != 2 or min(sizes) < 1:
        raise ValueError(f"mesh: expected two positive sizes (data, model), got {tuple(shape)!r}")
    return sizes  # type: ignore[return-value]


def mesh_size(shape: str | Sequence[int]) -> int:
    return math.prod(parse_mesh_shape(shape))


# Device counts the GPU cases of the sharded operations are declared for; a mesh larger than
# the host skips, naming its need.
GPU_DEVICE_COUNTS = (2, 4, 8)


def standard_shapes(devices: int) -> list[str]:
    """The meshes of `devices` devices every sharded operation is declared and tested on:
    all model parallel (1xN), all data parallel (Nx1), and both (2 x N/2, for even N >= 4)."""
    if devices < 1:
        raise ValueError(f"devices: expected >= 1, got {devices}")
    shapes = [f"1x{devices}", f"{devices}x1"] if devices > 1 else ["1x1"]
    if devices >= 4 and devices % 2 == 0:
        shapes.append(f"2x{devices // 2}")
    return shapes


def shapes_up_to(devices: int, counts: Sequence[int] = GPU_DEVICE_COUNTS) -> list[str]:
    """standard_shapes of every count in `counts` that `devices` devices can hold."""
    return [shape for n in counts if n <= devices for shape in standard_shapes(n)]


def unavailable_reason(shape: str | Sequence[int]) -> str | None:
    """None if this process sees enough devices for the mesh, else why not."""
    need, have = mesh_size(shape), jax.device_count()
    if need > have:
        return (f"needs {need} devices for mesh {'x'.join(map(str, parse_mesh_shape(shape)))}; "
                f"this machine has {have} {jax.devices()[0].platform} device(s)")
    return None


@functools.cache
def make_mesh(shape: str | tuple[int, int]) -> Mesh:
    """A (data, model) mesh over the first data*model devices (all processes' devices).

    `jax.make_mesh` orders devices so that the model axis, which carries the
    most traffic, falls on the closest devices (NVLink peers on a GPU host).
    """
    sizes = parse_mesh_shape(shape)
    reason = unavailable_reason(sizes)
    if reason:
        raise ValueError(f"mesh: {reason}")
    return compat.make_mesh(sizes, MESH_AXES, devices=jax.devices()[:math.prod(sizes)])


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshRules:
    """Logical axis name -> mesh axis (or axes, or None for replicated).

    The defaults are the usual data + tensor + expert parallel layout: the
    batch over `data`, hidden features (`mlp`, `heads`) over `model` (Megatron
    style: the first matmul splits its output, the second its input), experts
    over `data` so expert parallelism reuses the data-parallel devices, and
    `embed` replicated.
    """

    batch: str | tuple[str, ...] | None = DATA
    embed: str | tuple[str, ...] | None = None
    mlp: str | tuple[str, ...] | None = MODEL
    heads: str | tuple[str, ...] | None = MODEL
    expert: str | tuple[str, ...] | None = DATA

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            axes = (value,) if isinstance(value, str) else (value or ())
            for axis in axes:
                if axis not in MESH_AXES:
                    raise ValueError(f"MeshRules.{field.name}: expected mesh axes from "
                                     f"{MESH_AXES} or None, got {value!r}")

    def mesh_axis(self, logical: str | None) -> str | tuple[str, ...] | None:
        if logical is None:
            return None
        if not hasattr(self, logical):
            names = [f.name for f in dataclasses.fields(self)]
            raise ValueError(f"logical axis: expected one of {names} or None, got {logical!r}")
        return getattr(self, logical)

    def spec(self, *logical: str | None) -> PartitionSpec:
        """PartitionSpec for an array whose dimensions carry these logical names."""
        return PartitionSpec(*(self.mesh_axis(name) for name in logical))

    def sharding(self, mesh: Mesh, *logical: str | None) -> NamedSharding:
        return NamedSharding(mesh, self.spec(*logical))

    def as_pairs(self) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
        """(logical, mesh axes) pairs, the form flax's `logical_axis_rules` takes."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))


def place(x: jax.Array | np.ndarray, mesh: Mesh, spec: PartitionSpec) -> jax.Array:
    """`x` laid out over `mesh` by `spec` (runs once, outside any timed region)."""
    return jax.device_put(x, NamedSharding(mesh, spec))


@dataclasses.dataclass(frozen=True)
class Bandwidth:
    """Achieved all-gather bandwidth: nccl-tests' bus bandwidth, the bytes each device
    received per second ((n - 1) / n of the gathered array, over the call's time)."""

    devices: int
    message_bytes: int  # bytes gathered into each device's result (nccl-tests' S)
    seconds: float
    timer: str

    @property
    def bytes_per_second(self) -> float:
        received = self.message_bytes * (self.devices - 1) / self.devices
        return received / self.seconds


def interconnect_bandwidth(devices: int | None = None, *, message_bytes: int | None = None,
                           repeats: int = 20) -> Bandwidth:
    """Measure all-gather bandwidth across `devices` devices: the third roof of the roofline.

    Each device holds 1/devices of a `message_bytes` float32 array (default 1 GiB on GPUs,
    16 MiB on CPU host devices) and gathers the rest; the bandwidth counts the bytes a device
    receives, (n-1)/n of the message, nccl-tests' all-gather "bus bandwidth". Timed by
    kernels.core.timing through kernels.sharding.collectives: on GPUs each call's device span
    (the host clock added ~230 us per call, which read 170 GB/s for 242 at 256 MiB on an
    H100 pair), the median of `repeats` calls.
    """
    from kernels.core import timing
    from kernels.sharding import collectives

    n = devices or jax.device_count()
    if n < 2:
        raise ValueError(f"devices: expected at least 2 to measure an interconnect, got {n}")
    size = message_bytes or collectives.CEILING_BYTES[collectives.platform()]
    result = collectives.measure("all-gather", n, size, rule=timing.StoppingRule(
        min_samples=repeats, max_samples=repeats))
    return Bandwidth(devices=n, message_bytes=result.size_bytes, seconds=result.seconds,
                     timer=f"kernels.core.timing {result.method}, n={result.repeats}")


@functools.cache
def interconnect_ceiling(devices: int) -> float:
    """All-gather bytes/s received per device (busbw) over `devices` devices at 1 GiB (16 MiB
    on CPU host devices), measured once per process: the interconnect roof of the roofline."""
    from kernels.sharding import collectives

    return collectives.ceiling("all-gather", devices).busbw
