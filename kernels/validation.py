"""Input checks shared by kernel wrappers: errors name the argument, the expectation, what came."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kernels import dtypes


def check_array(name: str, x: Any, *, min_rank: int = 0, rank: int | None = None,
                allowed_dtypes: Iterable[str] | None = None) -> None:
    """Raise TypeError/ValueError unless `x` is an array of the given rank and dtype.

    `allowed_dtypes` are short names ("f32", "bf16", ...).
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
    shape = tuple(x.shape)
    if rank is not None and len(shape) != rank:
        raise ValueError(f"{name}: expected rank {rank}, got shape {shape} (rank {len(shape)})")
    if len(shape) < min_rank:
        raise ValueError(
            f"{name}: expected rank >= {min_rank}, got shape {shape} (rank {len(shape)})")
    if allowed_dtypes is not None:
        allowed = tuple(allowed_dtypes)
        if dtypes.short_name(x.dtype) not in allowed:
            expected = ", ".join(dtypes.name_of(dtypes.to_numpy(a)) for a in allowed)
            raise TypeError(
                f"{name}: expected dtype in ({expected}), got {dtypes.name_of(x.dtype)}")


def check_nonempty_axis(name: str, x: Any, axis: int) -> None:
    shape = tuple(x.shape)
    if shape[axis] == 0:
        raise ValueError(f"{name}: expected a non-empty axis {axis}, got shape {shape}")


def check_same_dtype(**arrays: Any) -> None:
    """Raise TypeError unless all keyword arrays share one dtype, naming each."""
    names = {name: dtypes.name_of(x.dtype) for name, x in arrays.items()}
    if len(set(names.values())) > 1:
        listed = ", ".join(f"{name}={dtype}" for name, dtype in names.items())
        raise TypeError(f"expected one dtype for {', '.join(names)}, got {listed}")


def check_powers_of_two(config: Any, names: tuple[str, ...], *, at_least: int = 1) -> None:
    """Block-config fields that Triton and Pallas need as powers of two (>= `at_least`)."""
    for name in names:
        value = getattr(config, name)
        if value < at_least or value & (value - 1):
            bound = f" >= {at_least}" if at_least > 1 else ""
            raise ValueError(f"{name}: expected a power of two{bound}, got {value}")
