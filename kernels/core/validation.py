"""Input checks shared by kernel wrappers and the command line: errors name the argument, the
expectation and what came."""

from __future__ import annotations

import argparse
import math
import pathlib
from collections.abc import Callable, Iterable
from typing import Any

from kernels.core import dtypes


class UserError(ValueError):
    """A mistake in what the user asked for (a name that does not exist, a number out of range,
    a missing or malformed file). `python -m kernels` prints the message as one line and exits
    2; any other exception is a bug and keeps its traceback."""


class UnknownName(UserError, KeyError):
    """A name that is not registered; the message lists the names there are. Also a KeyError,
    as lookups by name have always raised."""

    def __str__(self) -> str:
        # KeyError's own str() quotes the message as if it were the missing key.
        return str(self.args[0]) if self.args else ""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line and exit status 2 (argparse prints
    the usage first): every `python -m` command of the package parses with it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def _number(text: str, kind: type, *, minimum: float, inclusive: bool) -> float:
    """`text` as a finite `kind` above (or, `inclusive`, at least) `minimum`; argparse's type
    error otherwise, which it reports naming the option."""
    bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    expected = f"expected {'an integer' if kind is int else 'a finite number'} {bound}"
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
    if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= `minimum` (a count whose statistics need that many)."""
    def convert(text: str) -> int:
        return _number(text, int, minimum=minimum, inclusive=True)

    return convert


positive_int = int_at_least(1)  # argparse type: an integer >= 1
nonnegative_int = int_at_least(0)  # argparse type: an integer >= 0 (a seed)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a time budget); 'nan' and 'inf' are refused."""
    return _number(text, float, minimum=0.0, inclusive=False)


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a relative gap)."""
    return _number(text, float, minimum=0.0, inclusive=True)


def output_directory(text: str) -> str:
    """argparse type: a directory to write into; it may not exist yet, but may not be a file."""
    path = pathlib.Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a directory (existing or new), got {text!r}, "
                                         f"which is a file")
    return text


def check_x64_for(name: str, x: Any) -> None:
    """Refuse a 64-bit numpy array that JAX would silently narrow to 32 bits (jax_enable_x64
    off): a float64 case must run in float64 or not at all."""
    import jax

    wide = ("float64", "int64", "uint64", "complex128")
    if str(getattr(x, "dtype", "")) in wide and not jax.config.jax_enable_x64:
        raise TypeError(f"{name}: expected a dtype JAX keeps as it is, got {x.dtype} "
                        f"(jax_enable_x64 is off: JAX would narrow it to 32 bits; set "
                        f"JAX_ENABLE_X64=1)")


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


def check_config(config: Any, expected: type) -> None:
    """TypeError unless `config` is None (the default) or an `expected` instance: a string or
    a dict would otherwise fail deep inside the launch ("'str' object has no attribute ...")."""
    if config is not None and not isinstance(config, expected):
        raise TypeError(f"config: expected a {expected.__name__} or None, got "
                        f"{type(config).__name__} {config!r}"[:200])


def check_flag(name: str, value: Any) -> None:
    """TypeError unless `value` is True, False or None (a string such as 'no' is truthy)."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name}: expected True, False or None, got {type(value).__name__} "
                        f"{value!r}")


def check_torch_tensor(name: str, x: Any, device_type: str, *, like: Any = None) -> None:
    """TypeError unless `x` is a torch tensor; ValueError unless it is on `device_type` ("cuda"
    or "cpu") and, given `like`, on like's device. Torch kernels otherwise fail late on a JAX
    array (a bare AttributeError) or read another device's memory."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__module__}."
                        f"{type(x).__name__}")
    if x.device.type != device_type:
        raise ValueError(f"{name}: expected a tensor on {device_type}, got device {x.device}")
    if like is not None and x.device != like.device:
        raise ValueError(f"{name}: expected device {like.device} like the first argument, "
                         f"got {x.device}")


# Element offsets a kernel computes in 32-bit integers (Triton's and Pallas's defaults for
# program ids, aranges and their products with strides) must stay below this.
INT32_LIMIT = 2**31


def check_index_range(name: str, x: Any, limit: int = INT32_LIMIT) -> None:
    """ValueError unless every element of `x` lies within `limit` - 1 elements of its first
    one (the largest offset, sum of (size - 1) * |stride|, or the element count for arrays
    without strides), so 32-bit index arithmetic cannot wrap. Checked before launch: a Triton
    matmul with k = 2**31 (stride-0 inputs) ran for minutes instead."""
    shape = tuple(x.shape)
    if any(size == 0 for size in shape):
        return
    strides = x.stride() if callable(getattr(x, "stride", None)) else None
    if strides is None:
        largest = math.prod(shape) - 1
    else:
        largest = sum((size - 1) * abs(stride) for size, stride in zip(shape, strides,
                                                                        strict=True))
    biggest_dim = max(shape, default=1)
    if largest >= limit or biggest_dim >= limit:
        raise ValueError(f"{name}: expected offsets below 2**31 (32-bit index arithmetic), got "
                         f"shape {shape}" + (f" with strides {tuple(strides)}" if strides else "")
                         + f": largest offset {largest}, largest dimension {biggest_dim}")
