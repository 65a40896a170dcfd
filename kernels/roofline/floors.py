"""Performance floors per GPU model: the slowest each of our kernels may be before a test fails.

A floor is a fraction, either of the roofline (the datasheet roofs of
`kernels.roofline.ceilings`, for bandwidth-bound kernels) or of the best
baseline measured in the same run by the same clock (compute-bound kernels,
and the tiny latency-bound cases where no roof is close). `perf_tests/`
times every kernel on its "bench" cases and fails it when it falls under its
floor (`kernels.bench.perfcheck.judge`).

Floors are data, one file per GPU model: `kernels/models/<model>/floors.json`
(`kernels.core.modeldata`), written by `python -m kernels bringup` on that model and
reviewed as a diff; the H100's were written by hand before the bring-up existed and
moved there unchanged. Each file names the exact driver name it was measured on, and
the table is keyed by that name, as `DATASHEET` is: a GPU model with no file records
its numbers and skips the floor check, naming the model, and a file is never read for
another model (its folder and its `device` must agree). Each floor carries its reason
(one line: the numbers it starts from and its margin); those the bring-up writes also
carry a `note` with the measured values of every run and round, the date, commit,
driver, clock, and how the margin was derived (kernels.bench.bringup). Small regressions
are the history's job (`--benchmark-compare-fail=median:5%`, the asv gate); floors
catch a kernel fallen far.

Where an entry matches several floors, the most specific wins: one naming a
case (a substring of the case id, e.g. "32768x4096" or "f32-") over one that
does not, then one naming a direction over one for both, then the one naming more
of the case (the bring-up names whole case ids, and `bf16-4x4096x16x128` is a part
of `bf16-4x4096x16x128-causal`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from kernels.core import fingerprint, modeldata, registry

AGAINST = ("roofline", "baseline")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Floor:
    """The least a kernel must reach: `fraction` of the roofline or of a baseline.

    against: "roofline" (placement under the datasheet roofs) or "baseline"
        (best baseline's median time over ours, same run, same clock).
    baseline: for against="baseline", the one peer to compare with; None: the best baseline
        of the kernel's precision (an FP32 kernel's is torch's FP32 GEMM, never XLA's TF32
        one: `perfcheck.judge` compares one precision only and refuses a named peer of
        another).
    direction: "fwd", "bwd", or None for both.
    case: a substring of the case id (e.g. "256x1024"), or None for every case.
    note: what the bring-up measured and how it derived the fraction (kernels.bench.bringup:
        the values per run and round, date, commit, driver, clock, margin); None for floors
        written by hand. Not part of the floor's identity (equality, hashing).
    """

    op: str
    impl: str
    against: str
    fraction: float
    reason: str
    direction: str | None = None
    case: str | None = None
    baseline: str | None = None
    note: dict[str, Any] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.against not in AGAINST:
            raise ValueError(f"against: expected one of {AGAINST}, got {self.against!r}")
        if not 0 < self.fraction <= 1.5:
            raise ValueError(f"fraction: expected 0 < fraction <= 1.5, got {self.fraction}")
        if self.direction not in (None, *registry.DIRECTIONS):
            raise ValueError(f"direction: expected None or one of {registry.DIRECTIONS}, got "
                             f"{self.direction!r}")
        if not self.reason.strip():
            raise ValueError(f"reason: expected a one-line reason for {self.op}-{self.impl}, got "
                             f"{self.reason!r}")
        if self.baseline is not None and self.against != "baseline":
            raise ValueError(f"baseline: names a peer only for against='baseline', got "
                             f"against={self.against!r}, baseline={self.baseline!r}")

    def matches(self, op: str, impl: str, case_id: str, direction: str) -> bool:
        return (self.op == op and self.impl == impl
                and self.direction in (None, direction)
                and (self.case is None or self.case in case_id))

    @property
    def specificity(self) -> tuple[bool, bool]:
        return (self.case is not None, self.direction is not None)

    def describe(self) -> str:
        of = "the datasheet roofline" if self.against == "roofline" else \
            (f"baseline {self.baseline}" if self.baseline else "the best baseline")
        return f"{self.fraction:.2f} of {of}"


def _floors(op: str, impls: str | tuple[str, ...], against: str, fraction: float, reason: str,
            **where: str | None) -> tuple[Floor, ...]:
    """One floor for each of `impls` (a name or several sharing the floor and its reason)."""
    names = (impls,) if isinstance(impls, str) else impls
    return tuple(Floor(op=op, impl=impl, against=against, fraction=fraction, reason=reason,
                       **where) for impl in names)


# The fields of a floor entry in a model's file, beside `impl` (a name, or a list of names
# sharing the floor and its reason) and the optional `comment` (a note on a group of entries)
# and `note` (what the bring-up measured).
_FIELDS = ("op", "against", "fraction", "reason", "direction", "case", "baseline")


def from_entry(entry: Mapping[str, Any]) -> tuple[Floor, ...]:
    """The floors of one entry of a model's file (one per implementation it names)."""
    unknown = set(entry) - {*_FIELDS, "impl", "comment", "note"}
    if unknown:
        raise ValueError(f"floor entry: unknown field(s) {sorted(unknown)} in {dict(entry)}")
    where = {name: entry.get(name) for name in ("direction", "case", "baseline")}
    made = _floors(entry["op"], tuple(entry["impl"]) if isinstance(entry["impl"], list)
                   else entry["impl"], entry["against"], float(entry["fraction"]),
                   entry["reason"], **where)
    note = entry.get("note")
    return tuple(dataclasses.replace(floor, note=note) for floor in made) if note else made


def to_entry(floor: Floor) -> dict[str, Any]:
    """`floor` as an entry of a model's file (None fields left out)."""
    entry = {name: getattr(floor, name) for name in ("op", "impl", *_FIELDS[1:])}
    if floor.note is not None:
        entry["note"] = floor.note
    return {name: value for name, value in entry.items() if value is not None}


def parse(data: Mapping[str, Any], model: str) -> tuple[str, tuple[Floor, ...]]:
    """(exact driver name, floors) of the floors file `data` of `model`'s folder.

    Raises ValueError where the file's device is not that model (a file copied from another
    model's folder judges nothing)."""
    device = data.get("device")
    if not device or fingerprint.normalise(device) != model:
        raise ValueError(f"floors of {model}: expected a file measured on {model} (its "
                         f"'device', normalised, names the folder), got device {device!r}")
    return device, tuple(floor for entry in data.get("floors", ()) for floor in
                         from_entry(entry))


def load(root: pathlib.Path | None = None) -> dict[str, tuple[Floor, ...]]:
    """Every model's floors under `root` (default kernels/models), keyed by exact driver name."""
    found: dict[str, tuple[Floor, ...]] = {}
    for model in modeldata.models(root):
        data = modeldata.read(model, modeldata.FLOORS, root)
        if data is not None:
            device, table_ = parse(data, model)
            found[device] = table_
    return found


# Keyed by the exact name the driver reports (as ceilings.DATASHEET), read from the models'
# files once at import; `reload()` reads them again (the bring-up, after writing one).
FLOORS: dict[str, tuple[Floor, ...]] = load()


def reload(root: pathlib.Path | None = None) -> dict[str, tuple[Floor, ...]]:
    """Read the models' files again into FLOORS (the same dict object); returns it."""
    fresh = load(root)
    FLOORS.clear()
    FLOORS.update(fresh)
    return FLOORS


def table(device_name: str) -> tuple[Floor, ...] | None:
    """The floors of this GPU model (exact driver name), or None if it has none."""
    return FLOORS.get(device_name)


def most_specific(candidates: Sequence[Floor], what: str) -> Floor | None:
    """The most specific of the floors matching one item (module docstring), or None.

    Raises ValueError if two match equally specifically (an ambiguous table); `what` names
    the item in the message."""
    if not candidates:
        return None
    best = max((f.specificity, len(f.case or "")) for f in candidates)
    chosen = [f for f in candidates if (f.specificity, len(f.case or "")) == best]
    if len(chosen) > 1:
        raise ValueError(f"floors of {what}: {len(chosen)} entries match equally: "
                         f"{[f.describe() for f in chosen]}")
    return chosen[0]


def floor_for(device_name: str, op: str, impl: str, case_id: str,
              direction: str) -> Floor | None:
    """The most specific floor of `device_name` for (op, impl, case, direction), or None.

    Raises ValueError if two floors match equally specifically (an ambiguous table).
    """
    candidates = [f for f in FLOORS.get(device_name, ()) if f.matches(op, impl, case_id,
                                                                        direction)]
    return most_specific(candidates, f"{device_name}: {op}-{impl} {case_id} {direction}")
