"""What an implementation declares of its optimized HLO, per platform.

The declaration lives below the registry, which carries it on each implementation; the
parsing and checking of compiled HLO against it is a guard (`kernels.guards.hlo`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

# A registry.Case, not imported: the registry carries these rules, so it imports this module.
Case = Any

PLATFORMS = ("cpu", "gpu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HloRules:
    """What the compiled forward must look like on one platform.

    fusions: exact count, or an inclusive (min, max) range, of fusion kernels, or a
        function of the case returning one (XLA's choices can depend on the shape);
        None: not checked.
    custom_calls: glob patterns (e.g. "__gpu$xla.gpu.triton"); every custom
        call must match one and every pattern must be matched; () forbids custom
        calls; None: not checked.
    forbidden: ops that must not run as kernels of their own, on arrays (a copy
        of one element is not a pass over memory).
    static_shapes: no dynamic dimensions (`f32[<=8]`) or dynamic-shape ops.
    """

    fusions: int | tuple[int, int] | Callable[[Case], int | tuple[int, int]] | None \
        = None
    custom_calls: tuple[str, ...] | None = None
    forbidden: tuple[str, ...] = ("copy", "transpose")
    static_shapes: bool = True

    def __post_init__(self) -> None:
        if self.fusions is not None and not callable(self.fusions):
            _range(self.fusions)

    def fusion_range(self, case: Case | None = None) -> tuple[int, int]:
        """(min, max) fusions allowed, for `case` where the rule depends on it."""
        if callable(self.fusions):
            if case is None:
                raise ValueError("case: expected a case, this rule depends on it; got None")
            return _range(self.fusions(case))
        return _range(self.fusions)


def _range(fusions: int | tuple[int, int]) -> tuple[int, int]:
    low, high = (fusions, fusions) if isinstance(fusions, int) else fusions
    if not 0 <= low <= high:
        raise ValueError(f"fusions: expected a count or (min, max) with 0 <= min <= max, "
                         f"got {fusions!r}")
    return low, high


@dataclasses.dataclass(frozen=True, kw_only=True)
class HloExpectation:
    """An implementation's HLO rules per platform; a platform left None is not checked there.

    Pallas kernels run interpreted on CPU, where their HLO is the interpreter's
    loop; their CPU rules can only say what must never appear.
    """

    cpu: HloRules | None = None
    gpu: HloRules | None = None

    def for_platform(self, platform: str) -> HloRules | None:
        if platform not in PLATFORMS:
            raise ValueError(f"platform: expected one of {PLATFORMS}, got {platform!r}")
        return getattr(self, platform)
