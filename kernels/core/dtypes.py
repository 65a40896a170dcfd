"""Short dtype names used in case ids ("f32", "bf16"), and their numpy types."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

NUMPY = {
    "f64": np.dtype(np.float64),
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
}
NAMES = frozenset(NUMPY)
_BY_CANONICAL = {str(dtype): name for name, dtype in NUMPY.items()}


def to_numpy(name: str) -> np.dtype:
    return NUMPY[name]


def name_of(dtype: Any) -> str:
    """Canonical name of a numpy, JAX or torch dtype: 'float32', 'bfloat16', 'int32'..."""
    text = str(dtype)
    return text.removeprefix("torch.")


def short_name(dtype: Any) -> str:
    """'f32' for any float32 dtype (numpy, JAX or torch); the canonical name otherwise."""
    canonical = name_of(dtype)
    return _BY_CANONICAL.get(canonical, canonical)


def eps(name: str) -> float:
    """Machine epsilon (spacing of 1.0) of a short dtype name."""
    return float(ml_dtypes.finfo(NUMPY[name]).eps)
