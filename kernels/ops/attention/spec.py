"""Attention: reference, inputs, work model, tolerance and cases.

softmax(Q K^T * scale + mask) V per (batch, head), scale = 1 / sqrt(head_dim),
inputs laid out (batch, seq, heads, head_dim) with one sequence length for
queries and keys (self-attention). `causal=True` masks key j > query i (the
top-left aligned lower triangle; with seq_q == seq_k it is also bottom-right).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation

NAME = "attention"
SUPPORTED_DTYPES = ("bf16", "f16", "f32")
HEAD_DIMS = (64, 128)
LAYOUT = "(batch, seq, heads, head_dim)"
# "large" inputs: q and k scaled so logits have standard deviation ~36 (a row's max
# is then far beyond exp's float32 range: a kernel must subtract it), v scaled by 50.
LARGE_QK_SCALE = 6.0
LARGE_V_SCALE = 50.0
# Largest |logit| * log2(e) the "large" inputs reach in practice (std 36, a few sigma).
MAX_LOGIT = 256.0


def scale_of(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def flash_attention_vjp(forward: Callable, backward: Callable) -> Callable:
    """attention(q, k, v, causal, config, interpret), jitted, with a custom VJP that saves
    the output and the log-sum-exp of the forward for the backward (the flash schedule).

    forward(q, k, v, causal, config, interpret) -> (o, lse);
    backward(q, k, v, o, lse, do, causal, config, interpret) -> (dq, dk, dv).
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
    def attention(q, k, v, causal, config, interpret):
        return forward(q, k, v, causal, config, interpret)[0]

    def attention_fwd(q, k, v, causal, config, interpret):
        o, lse = forward(q, k, v, causal, config, interpret)
        return o, (q, k, v, o, lse)

    def attention_bwd(causal, config, interpret, residuals, do):
        return backward(*residuals, do, causal, config, interpret)

    attention.defvjp(attention_fwd, attention_bwd)
    return jax.jit(attention, static_argnums=(3, 4, 5))


def _probabilities(q: jax.Array, k: jax.Array, causal: bool) -> jax.Array:
    """P = softmax(Q K^T * scale + mask), shape (batch, heads, seq_q, seq_k), float32."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST)
    logits = logits * scale_of(q.shape[-1])
    if causal:
        seq_q, seq_k = q.shape[1], k.shape[1]
        allowed = jnp.arange(seq_k)[None, :] <= jnp.arange(seq_q)[:, None]
        logits = jnp.where(allowed, logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)


def reference(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False) -> jax.Array:
    """softmax(Q K^T / sqrt(head_dim) + mask) V, in the dtype of the inputs (float32 here)."""
    p = _probabilities(q, k, causal)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=jax.lax.Precision.HIGHEST)


def gradient_magnitude(inputs, out, d_out, *, causal: bool = False):
    """Size of the terms summed into dq, dk, dv (they can cancel far below these).

    dV = P^T dO; dS = P * (dP - rowsum(P * dP)) with dP = dO V^T; dQ = scale dS K;
    dK = scale dS^T Q. Each term is bounded by the same product of absolute values.
    """
    # One batch entry at a time: each holds (heads, seq, seq) float32 arrays (1 GiB for
    # 16 heads at seq 4096), and several are alive at once.
    q, k, v = inputs
    parts = [_gradient_magnitude(q[i:i + 1], k[i:i + 1], v[i:i + 1], d_out[i:i + 1], causal)
             for i in range(q.shape[0])]
    return tuple(jnp.concatenate(grads, axis=0) for grads in zip(*parts, strict=True))


def _gradient_magnitude(q, k, v, d_out, causal: bool):
    hi = jax.lax.Precision.HIGHEST
    p = jnp.abs(_probabilities(q, k, causal))
    dp = jnp.einsum("bqhd,bkhd->bhqk", jnp.abs(d_out), jnp.abs(v), precision=hi)
    ds = p * (dp + jnp.sum(p * dp, axis=-1, keepdims=True))
    scale = scale_of(q.shape[-1])
    dq = scale * jnp.einsum("bhqk,bkhd->bqhd", ds, jnp.abs(k), precision=hi)
    dk = scale * jnp.einsum("bhqk,bqhd->bkhd", ds, jnp.abs(q), precision=hi)
    dv = jnp.einsum("bhqk,bqhd->bkhd", p, jnp.abs(d_out), precision=hi)
    return dq, dk, dv


def reference_bytes(case: registry.Case) -> float:
    """The float32 (batch, heads, seq, seq) arrays of the reference and its VJP: XLA's CPU
    compile of the jitted reference, VJP and magnitudes holds about six at once (measured
    for every "gpu" case); seven leaves room for the GPU's other fusion choices."""
    return 7.0 * case["batch"] * case["heads"] * case["seq"] ** 2 * 4


def validate(q, k, v, causal: bool = False) -> None:
    """Checks every attention implementation of ours applies before launching."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        validation.check_array(name, x, rank=4, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_same_dtype(q=q, k=k, v=v)
    shape = tuple(q.shape)
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != shape:
            raise ValueError(f"{name}: expected shape {LAYOUT} = {shape} like q, "
                             f"got {tuple(x.shape)}")
    if shape[1] < 1:
        raise ValueError(f"q: expected seq >= 1 in {LAYOUT}, got shape {shape}")
    if shape[0] < 1 or shape[2] < 1:
        raise ValueError(f"q: expected batch >= 1 and heads >= 1 in {LAYOUT}, got shape {shape}")
    if shape[3] not in HEAD_DIMS:
        raise ValueError(f"q: expected head_dim in {HEAD_DIMS} (the last axis of {LAYOUT}), "
                         f"got {shape[3]} in shape {shape}")
    if not isinstance(causal, bool | np.bool_):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v ~ Normal(0, 1) (logits ~ Normal(0, 1)); "large" scales q, k by 6 and v by 50."""
    shape = (case["batch"], case["seq"], case["heads"], case["head_dim"])
    qk_scale, v_scale = (LARGE_QK_SCALE, LARGE_V_SCALE) if distribution == "large" else (1.0, 1.0)
    dtype = dtypes.to_numpy(case.dtype)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    return (q * qk_scale).astype(dtype), (k * qk_scale).astype(dtype), (v * v_scale).astype(dtype)


def attended_pairs(seq: int, causal: bool) -> int:
    """(query, key) pairs that take part: seq^2, or seq (seq + 1) / 2 under the causal mask."""
    return seq * (seq + 1) // 2 if causal else seq * seq


def work(case: registry.Case, direction: str) -> registry.Work:
    """FLOPs and fewest bytes.

    Forward: two matmuls per (batch, head), S = Q K^T and O = P V, 2 * head_dim
    FLOPs per (query, key) pair each: 4 * batch * heads * pairs * head_dim, with
    pairs = seq^2, or seq (seq + 1) / 2 under the causal mask (about half; the
    masked half is skipped, not computed). Softmax FLOPs are not counted (the
    FlashAttention papers' convention). Backward: five matmuls of the same size
    (S recomputed from Q K^T, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q)
    against the forward's two: 2.5x the forward FLOPs.

    Bytes: forward reads q, k, v and writes o and the float32 log-sum-exp per
    (batch, head, query); backward reads q, k, v, o, dO and the log-sum-exp and
    writes dq, dk, dv.
    """
    b, s, h, d = case["batch"], case["seq"], case["heads"], case["head_dim"]
    fwd_flops = 4.0 * b * h * attended_pairs(s, case.kwargs.get("causal", False)) * d
    tensor_bytes = b * s * h * d * dtypes.to_numpy(case.dtype).itemsize
    lse_bytes = b * h * s * 4
    if direction == "fwd":
        return registry.Work(flops=fwd_flops, bytes=4.0 * tensor_bytes + lse_bytes)
    registry.check_direction(direction)
    return registry.Work(flops=2.5 * fwd_flops, bytes=8.0 * tensor_bytes + lse_bytes)


def tolerance(case: registry.Case, *, rounding: float = 0.0) -> float:
    """Output rounding plus P rounded to the input dtype before P V (as flash kernels do),
    plus float32 accumulation over head_dim (logits) and seq (output), plus the
    float32 rounding of the logits, eps * |logit|, which exp turns into a relative
    error of P: the "large" inputs have logits up to about MAX_LOGIT.

    `rounding`: the relative rounding of float32 operands by the implementation's precision
    (precisions.ROUNDING), twice per product of Q K^T and of P V. Every float32 path here is
    FP32 (Triton input_precision="ieee", XLA Precision.HIGHEST): TF32 would round each logit
    by ~2^-10 of its size, and the "large" logits (std ~36) turn that into percent errors.
    """
    return (dtypes.eps(case.dtype) + (dtypes.eps("f32") + 2.0 * rounding) * MAX_LOGIT
            + 2.0 * rounding + checking.relative_tolerance(case.dtype,
                                                            case["seq"] + case["head_dim"]))


def make_case(dtype: str, batch: int, seq: int, heads: int, head_dim: int, causal: bool,
              *tags: str) -> registry.Case:
    return registry.make_case(NAME, dtype, {"batch": batch, "seq": seq, "heads": heads,
                                            "head_dim": head_dim},
                              params={"causal": causal}, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    cases = []
    for dtype in SUPPORTED_DTYPES:
        # Small and awkward, interpretable on CPU and rerun compiled on the GPU: a single
        # query; 37, 65 and 80 are not multiples of any block; both head dims.
        for b, s, h, d, causal in [(1, 1, 1, 64, False), (2, 37, 2, 64, True),
                                   (1, 65, 1, 128, True), (1, 80, 2, 64, False)]:
            tracked = dtype == "f32" and s == 80  # asv on CPU machines, one case
            cases.append(make_case(dtype, b, s, h, d, causal, "cpu",
                                   *(["bench"] if tracked else [])))
    # Real sizes. asv tracks ("bench") the FlashAttention benchmark shape and its head_dim 64
    # half (8 heads), causal and not; then awkward lengths (1000, 4097: ragged last blocks).
    for heads, head_dim in ((16, 128), (8, 64)):
        for causal in (False, True):
            cases.append(make_case("bf16", 4, 4096, heads, head_dim, causal, "gpu", "bench"))
    cases.append(make_case("bf16", 2, 1000, 8, 128, True, "gpu"))
    cases.append(make_case("bf16", 1, 4097, 4, 64, False, "gpu"))
    cases.append(make_case("f16", 2, 2048, 8, 128, True, "gpu"))
    cases.append(make_case("f16", 1, 1000, 4, 64, False, "gpu"))
    cases.append(make_case("f32", 1, 1024, 4, 64, True, "gpu"))
    cases.append(make_case("f32", 1, 777, 2, 128, False, "gpu"))
    return tuple(cases)


def _qkv(shape=(1, 8, 2, 64), dtype=np.float32, k_shape=None, k_dtype=None):
    q = np.ones(shape, dtype)
    k = np.ones(k_shape or shape, k_dtype or dtype)
    return q, k, np.ones(shape, dtype)


BAD_INPUTS = (
    registry.BadInput("rank3", lambda: _qkv(shape=(8, 2, 64)), ValueError,
                      r"q: expected rank 4, got shape \(8, 2, 64\)"),
    registry.BadInput("mismatched-dtypes", lambda: _qkv(k_dtype=np.float16), TypeError,
                      r"expected one dtype for q, k, v, got q=float32, k=float16, v=float32"),
    registry.BadInput("int32", lambda: _qkv(dtype=np.int32), TypeError,
                      r"q: expected dtype in \(bfloat16, float16, float32\), got int32"),
    registry.BadInput("k-shape", lambda: _qkv(k_shape=(1, 9, 2, 64)), ValueError,
                      r"k: expected shape .* = \(1, 8, 2, 64\) like q, got \(1, 9, 2, 64\)"),
    registry.BadInput("head-dim-32", lambda: _qkv(shape=(1, 8, 2, 32)), ValueError,
                      r"q: expected head_dim in \(64, 128\) .* got 32"),
    registry.BadInput("empty-seq", lambda: _qkv(shape=(1, 0, 2, 64)), ValueError,
                      r"q: expected seq >= 1"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description=f"softmax(Q K^T / sqrt(d) + mask) V, layout {LAYOUT}",
    input_names=("q", "k", "v"),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    dots=True,
    bad_inputs=BAD_INPUTS,
    gradient_magnitude=gradient_magnitude,
    reference_bytes=reference_bytes,
))
