"""Matrix product C = A @ B: reference, inputs, work model, tolerance and cases."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation

NAME = "matmul"
SUPPORTED_DTYPES = ("f32", "bf16", "f16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TileConfig:
    """A tiled GEMM as the Triton compiler takes it (the Triton kernel and the Pallas-Triton
    one): tile shape (powers of two, >= 16 for tl.dot), `group_m` tile rows per L2 group,
    warps and software-pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        validation.check_powers_of_two(
            self, ("block_m", "block_n", "block_k", "group_m", "num_warps"))
        for name in ("block_m", "block_n", "block_k"):
            if getattr(self, name) < 16:
                raise ValueError(f"{name}: expected >= 16 (tl.dot's smallest tile), "
                                 f"got {getattr(self, name)}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages: expected >= 1, got {self.num_stages}")


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """(m, k) @ (k, n) at full float32 precision (no TF32)."""
    return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def validate(a, b) -> None:
    """Checks every matmul implementation of ours applies before launching."""
    validation.check_array("a", a, rank=2, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_array("b", b, rank=2, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_same_dtype(a=a, b=b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"b: expected {a.shape[1]} rows to match a's columns (a is "
                         f"{tuple(a.shape)}), got shape {tuple(b.shape)}")
    # m = 0 or n = 0 is an empty product (an empty result); k = 0 would sum nothing.
    validation.check_nonempty_axis("a", a, 1)


def empty_product(a, b, *, requires_grad: bool = False):
    """The (m, n) zeros of an empty product (m or n is 0: no grid to launch) in a's
    framework, dtype and device; None when the product is not empty."""
    m, n = a.shape[0], b.shape[1]
    if m and n:
        return None
    if hasattr(a, "new_zeros"):  # a torch tensor
        return a.new_zeros((m, n), requires_grad=requires_grad)
    return jnp.zeros((m, n), a.dtype)


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray, np.ndarray]:
    """Normal(0, 1) entries scaled by 1/sqrt(k) so C stays O(1); "large" multiplies by 50."""
    m, n, k = case["m"], case["n"], case["k"]
    scale = (50.0 if distribution == "large" else 1.0) / np.sqrt(k)
    dtype = dtypes.to_numpy(case.dtype)
    a = (rng.standard_normal((m, k), dtype=np.float32) * scale).astype(dtype)
    b = rng.standard_normal((k, n), dtype=np.float32).astype(dtype)
    return a, b


def work(case: registry.Case, direction: str) -> registry.Work:
    """2mnk FLOPs forward; backward is two products (dA = dC B^T, dB = A^T dC): 4mnk.

    Bytes: each operand read once and the result written once; backward reads
    A, B, dC and writes dA, dB.
    """
    m, n, k = case["m"], case["n"], case["k"]
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    if direction == "fwd":
        return registry.Work(flops=2.0 * m * n * k, bytes=(m * k + k * n + m * n) * itemsize)
    registry.check_direction(direction)
    return registry.Work(flops=4.0 * m * n * k,
                         bytes=2.0 * (m * k + k * n + m * n) * itemsize)


def tolerance(case: registry.Case, *, rounding: float = 0.0) -> float:
    """Output rounding and float32 accumulation over k; `rounding`: the relative rounding of
    float32 operands by the implementation's precision (TF32: 2^-11), twice per product."""
    return 2.0 * rounding + checking.relative_tolerance(case.dtype, case["k"])


def gradient_magnitude(inputs, c, dc):
    """|dC| |B|^T and |A|^T |dC|: the size of the terms in each gradient."""
    a, b = inputs
    return jnp.abs(dc) @ jnp.abs(b).T, jnp.abs(a).T @ jnp.abs(dc)


def _case(dtype: str, m: int, n: int, k: int, *tags: str) -> registry.Case:
    return registry.make_case(NAME, dtype, {"m": m, "n": n, "k": k}, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    cases = []
    for dtype in SUPPORTED_DTYPES:
        # Small and awkward: not multiples of any tile, a single row, a single column.
        for m, n, k in [(64, 64, 64), (33, 17, 65), (1, 128, 96), (100, 1, 300)]:
            cases.append(_case(dtype, m, n, k, "cpu"))
        # Tracked by asv on CPU machines ("bench"), float32 only.
        cases.append(_case(dtype, 129, 130, 257, "cpu", *(["bench"] if dtype == "f32" else [])))
        # asv tracks ("bench") the square products in bf16 and f32, and the awkward
        # shape in bf16.
        for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (4097, 4095, 4100),
                        (16384, 1024, 8192)]:
            tracked = (dtype == "bf16" and (m, n, k) != (16384, 1024, 8192)) or \
                (dtype == "f32" and (m, n, k) == (4096, 4096, 4096))
            cases.append(_case(dtype, m, n, k, "gpu", *(["bench"] if tracked else [])))
    return tuple(cases)


BAD_INPUTS = (
    registry.BadInput("rank1", lambda: (np.ones(4, np.float32), np.ones((4, 4), np.float32)),
                      ValueError, r"a: expected rank 2, got shape \(4,\)"),
    registry.BadInput("mismatched-dtypes",
                      lambda: (np.ones((4, 4), np.float32), np.ones((4, 4), np.float16)),
                      TypeError, r"expected one dtype for a, b, got a=float32, b=float16"),
    registry.BadInput("int8", lambda: (np.ones((4, 4), np.int8), np.ones((4, 4), np.int8)),
                      TypeError, r"a: expected dtype in .* got int8"),
    registry.BadInput("inner-mismatch",
                      lambda: (np.ones((4, 5), np.float32), np.ones((4, 4), np.float32)),
                      ValueError, r"b: expected 5 rows to match a's columns"),
    registry.BadInput("empty-k", lambda: (np.ones((4, 0), np.float32),
                                          np.ones((0, 4), np.float32)),
                      ValueError, r"a: expected a non-empty axis 1"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="matrix product (m, k) @ (k, n)",
    input_names=("a", "b"),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    dots=True,
    bad_inputs=BAD_INPUTS,
    gradient_magnitude=gradient_magnitude,
))
