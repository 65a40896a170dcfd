"""Flash attention in Pallas (Triton lowering): FlashAttention-2 forward and backward, custom VJP.

Forward (Dao, "FlashAttention-2", 2023, Algorithm 1): one program per
(query block, batch x head) keeps its queries in registers and walks the key
blocks, carrying the running row max m, the running sum l of exp(s - m) and the
unnormalised output, rescaled by exp(m_old - m_new) when the max grows; in base
2, with the scale and log2(e) folded into one FMA per logit. Key blocks that
every query of the block may see, in range, come first in a loop without masks
or masked loads; under the causal mask, key blocks wholly above the diagonal are
never visited. It saves the log-sum-exp m + log(l) per query for the backward.

Backward (Algorithm 2, split in two kernels to avoid atomics): one kernel per
key block accumulates dK and dV over the query blocks (from the first one that
reaches the diagonal, when causal); another per query block accumulates dQ over
the key blocks. P is recomputed from Q K^T and the saved log-sum-exp;
delta = rowsum(dO * O) is computed by XLA beforehand.

Ragged sequences: loads past `seq` are masked (rows and keys there read zeros,
their logits are -inf) and every store is masked, so no shape needs padding.
Dots take the input dtype with float32 accumulation; float32 inputs use full
float32 dots (Precision.HIGHEST), not TF32.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.core import compat, precisions, registry, validation
from kernels.ops.attention import spec

plt = compat.pallas_triton()
IMPL = "pallas_triton"
LOG2E = 1.4426950408889634  # 1 / ln 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """Query/key block sizes (powers of two, >= 16 for tl.dot), warps and pipeline stages,
    for the forward and for the two backward kernels."""

    block_q: int
    block_k: int
    num_warps: int
    num_stages: int
    block_q_bwd: int
    block_k_bwd: int
    num_warps_bwd: int

    def __post_init__(self) -> None:
        validation.check_powers_of_two(self, ("block_q", "block_k", "block_q_bwd", "block_k_bwd"),
                                       at_least=16)
        validation.check_powers_of_two(self, ("num_warps", "num_warps_bwd"))


def default_config(head_dim: int, interpret: bool, dtype=jnp.bfloat16) -> AttentionConfig:
    if interpret:  # several blocks per sequence on the tiny CPU cases, to cover the masks
        return AttentionConfig(block_q=32, block_k=32, num_warps=4, num_stages=1,
                               block_q_bwd=32, block_k_bwd=32, num_warps_bwd=4)
    # Measured on an H100 (bf16, batch 4, heads 16, seq 4096, head_dim 128): forward 128x128
    # blocks with 8 warps and 3 stages 1.37 ms (128x64: 1.48, 64x64 w4: 1.55); backward
    # 64x64 blocks with 4 warps took fwd+bwd 6.39 ms (8 warps: 9.94; 32x64: 8.79). After the
    # forward's unmasked leading loop (2026-11-25, CUPTI, cuDNN in the same run): head_dim
    # 128 128x128 w8 s3 0.679x cuDNN (128x64 w8 0.631x); head_dim 64 128x64 with 8 warps
    # 0.762x (4 warps 0.732x, 128x128 0.575x).
    if jnp.dtype(dtype) == jnp.float32:
        # Float32 tiles are twice the bytes: 128x128 blocks in 3 stages asked for 384 KiB of
        # shared memory at head_dim 128 on the H100 (227 KiB available).
        return AttentionConfig(block_q=64, block_k=64, num_warps=4, num_stages=2,
                               block_q_bwd=32, block_k_bwd=32, num_warps_bwd=4)
    if head_dim == 128:
        return AttentionConfig(block_q=128, block_k=128, num_warps=8, num_stages=3,
                               block_q_bwd=64, block_k_bwd=64, num_warps_bwd=4)
    return AttentionConfig(block_q=128, block_k=64, num_warps=8, num_stages=3,
                           block_q_bwd=64, block_k_bwd=64, num_warps_bwd=4)


def _precision(dtype):
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _rows(ref, batch, start, size, head, seq):
    """Index and row mask of a (size, head_dim) block of a (batch, seq, heads, head_dim) ref."""
    ids = start + jnp.arange(size)
    return ref.at[batch, pl.ds(start, size), head, :], ids, ids < seq


def _load(ref, batch, start, size, head, seq):
    index, ids, ok = _rows(ref, batch, start, size, head, seq)
    return plt.load(index, mask=ok[:, None], other=0.0), ids, ok


def _store(ref, value, batch, start, size, head, seq):
    index, _, ok = _rows(ref, batch, start, size, head, seq)
    plt.store(index, value.astype(ref.dtype), mask=ok[:, None])


def _allowed(q_ids, k_ids, seq: int, causal: bool):
    ok = (k_ids < seq)[None, :]
    if causal:
        ok = ok & (k_ids[None, :] <= q_ids[:, None])
    return ok


def attention_forward_kernel(
    # Inputs
    q_ref, k_ref, v_ref,
    # Outputs
    o_ref, lse_ref,
    *,
    causal: bool, scale: float, config: AttentionConfig,
):
    _, seq, heads, head_dim = q_ref.shape
    bq, bk = config.block_q, config.block_k
    q_start = pl.program_id(0) * bq
    batch, head = pl.program_id(1) // heads, pl.program_id(1) % heads
    q, q_ids, q_ok = _load(q_ref, batch, q_start, bq, head, seq)
    precision = _precision(q_ref.dtype)
    c = scale * LOG2E  # base 2 with the scale folded in: exp2(s c - m) is one FMA and one ex2

    def step(j, carry, masked: bool):
        m, row_sum, acc = carry
        if masked:
            k, k_ids, _ = _load(k_ref, batch, j * bk, bk, head, seq)
            v, _, _ = _load(v_ref, batch, j * bk, bk, head, seq)
        else:
            k = plt.load(k_ref.at[batch, pl.ds(j * bk, bk), head, :])
            v = plt.load(v_ref.at[batch, pl.ds(j * bk, bk), head, :])
        s = jnp.dot(q, k.T, precision=precision, preferred_element_type=jnp.float32)
        if masked:
            s = jnp.where(_allowed(q_ids, k_ids, seq, causal), s, -jnp.inf)
        # Every row (rows past seq included: their q is zero) sees key 0 in the first block,
        # so m is finite from then on and exp2(-inf - m) is 0, never NaN.
        m_new = jnp.maximum(m, jnp.max(s, axis=1) * c)
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s * c - m_new[:, None])
        row_sum = row_sum * alpha + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, precision=precision,
                                             preferred_element_type=jnp.float32)
        return m_new, row_sum, acc

    # Leading key blocks that every query of this block may see, in range: no mask, no
    # masked loads. Causal blocks past this query block's last row are never visited.
    num_k, unmasked = pl.cdiv(seq, bk), seq // bk
    if causal:
        num_k = jnp.minimum(num_k, pl.cdiv(q_start + bq, bk))
        unmasked = jnp.minimum(unmasked, (q_start + 1) // bk)
    carry = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
             jnp.zeros((bq, head_dim), jnp.float32))
    carry = jax.lax.fori_loop(0, unmasked, functools.partial(step, masked=False), carry)
    m, row_sum, acc = jax.lax.fori_loop(unmasked, num_k, functools.partial(step, masked=True),
                                        carry)
    _store(o_ref, acc / row_sum[:, None], batch, q_start, bq, head, seq)
    # The backward takes the natural log-sum-exp of the scaled logits.
    plt.store(lse_ref.at[batch, head, pl.ds(q_start, bq)], (m + jnp.log2(row_sum)) / LOG2E,
              mask=q_ok)


def _load_row_stats(ref, batch, head, start, size, seq):
    ids = start + jnp.arange(size)
    return plt.load(ref.at[batch, head, pl.ds(start, size)], mask=ids < seq, other=0.0)


def attention_backward_kernel_dkv(
    # Inputs
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
    # Outputs
    dk_ref, dv_ref,
    *,
    causal: bool, scale: float, config: AttentionConfig,
):
    _, seq, heads, head_dim = q_ref.shape
    bq, bk = config.block_q_bwd, config.block_k_bwd
    k_start = pl.program_id(0) * bk
    batch, head = pl.program_id(1) // heads, pl.program_id(1) % heads
    k, k_ids, _ = _load(k_ref, batch, k_start, bk, head, seq)
    v, _, _ = _load(v_ref, batch, k_start, bk, head, seq)
    precision = _precision(q_ref.dtype)

    def step(i, carry):
        dk, dv = carry
        q_start = i * bq
        q, q_ids, q_ok = _load(q_ref, batch, q_start, bq, head, seq)
        do, _, _ = _load(do_ref, batch, q_start, bq, head, seq)
        lse = _load_row_stats(lse_ref, batch, head, q_start, bq, seq)
        delta = _load_row_stats(delta_ref, batch, head, q_start, bq, seq)
        s = jnp.dot(q, k.T, precision=precision, preferred_element_type=jnp.float32) * scale
        ok = _allowed(q_ids, k_ids, seq, causal) & q_ok[:, None]
        p = jnp.where(ok, jnp.exp(s - lse[:, None]), 0.0)
        dv = dv + jnp.dot(p.astype(do.dtype).T, do, precision=precision,
                          preferred_element_type=jnp.float32)
        dp = jnp.dot(do, v.T, precision=precision, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        dk = dk + jnp.dot(ds.astype(q.dtype).T, q, precision=precision,
                          preferred_element_type=jnp.float32)
        return dk, dv

    first = k_start // bq if causal else 0  # query blocks wholly above the diagonal skip
    zeros = jnp.zeros((bk, head_dim), jnp.float32)
    dk, dv = jax.lax.fori_loop(first, pl.cdiv(seq, bq), step, (zeros, zeros))
    _store(dk_ref, dk * scale, batch, k_start, bk, head, seq)
    _store(dv_ref, dv, batch, k_start, bk, head, seq)


def attention_backward_kernel_dq(
    # Inputs
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
    # Outputs
    dq_ref,
    *,
    causal: bool, scale: float, config: AttentionConfig,
):
    _, seq, heads, head_dim = q_ref.shape
    bq, bk = config.block_q_bwd, config.block_k_bwd
    q_start = pl.program_id(0) * bq
    batch, head = pl.program_id(1) // heads, pl.program_id(1) % heads
    q, q_ids, q_ok = _load(q_ref, batch, q_start, bq, head, seq)
    do, _, _ = _load(do_ref, batch, q_start, bq, head, seq)
    lse = _load_row_stats(lse_ref, batch, head, q_start, bq, seq)
    delta = _load_row_stats(delta_ref, batch, head, q_start, bq, seq)
    precision = _precision(q_ref.dtype)

    def step(j, dq):
        k, k_ids, _ = _load(k_ref, batch, j * bk, bk, head, seq)
        v, _, _ = _load(v_ref, batch, j * bk, bk, head, seq)
        s = jnp.dot(q, k.T, precision=precision, preferred_element_type=jnp.float32) * scale
        ok = _allowed(q_ids, k_ids, seq, causal) & q_ok[:, None]
        p = jnp.where(ok, jnp.exp(s - lse[:, None]), 0.0)
        dp = jnp.dot(do, v.T, precision=precision, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        return dq + jnp.dot(ds.astype(k.dtype), k, precision=precision,
                            preferred_element_type=jnp.float32)

    num_k = pl.cdiv(seq, bk)
    if causal:
        num_k = jnp.minimum(num_k, pl.cdiv(q_start + bq, bk))
    dq = jax.lax.fori_loop(0, num_k, step, jnp.zeros((bq, head_dim), jnp.float32))
    _store(dq_ref, dq * scale, batch, q_start, bq, head, seq)


def _params(config: AttentionConfig, backward: bool):
    return plt.CompilerParams(num_warps=config.num_warps_bwd if backward else config.num_warps,
                              num_stages=config.num_stages)


def _forward(q, k, v, causal, config, interpret):
    batch, seq, heads, head_dim = q.shape
    kernel = functools.partial(attention_forward_kernel, causal=causal,
                               scale=spec.scale_of(head_dim), config=config)
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)),
        grid=(pl.cdiv(seq, config.block_q), batch * heads),
        compiler_params=_params(config, backward=False),
        interpret=interpret,
        name="attention_forward",
    )(q, k, v)


def _backward(q, k, v, o, lse, do, causal, config, interpret):
    batch, seq, heads, head_dim = q.shape
    delta = jnp.einsum("bshd,bshd->bhs", o.astype(jnp.float32), do.astype(jnp.float32))
    options = dict(causal=causal, scale=spec.scale_of(head_dim), config=config)
    inputs = (q, k, v, do, lse, delta)
    dk, dv = pl.pallas_call(
        functools.partial(attention_backward_kernel_dkv, **options),
        out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        grid=(pl.cdiv(seq, config.block_k_bwd), batch * heads),
        compiler_params=_params(config, backward=True),
        interpret=interpret,
        name="attention_backward_dkv",
    )(*inputs)
    dq = pl.pallas_call(
        functools.partial(attention_backward_kernel_dq, **options),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(pl.cdiv(seq, config.block_q_bwd), batch * heads),
        compiler_params=_params(config, backward=True),
        interpret=interpret,
        name="attention_backward_dq",
    )(*inputs)
    return dq, dk, dv


_attention_jit = spec.flash_attention_vjp(_forward, _backward)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
              config: AttentionConfig | None = None,
              interpret: bool | None = None) -> jax.Array:
    """softmax(Q K^T / sqrt(d) + mask) V for (batch, seq, heads, head_dim) inputs; differentiable.

    Args:
      causal: mask key j > query i.
      config: blocks and warps; `default_config(head_dim, interpret, dtype)` when None.
      interpret: run the Pallas interpreter; by default wherever JAX has no GPU.
    Returns:
      An array of q's shape and dtype.
    """
    spec.validate(q, k, v, causal)
    validation.check_config(config, AttentionConfig)
    validation.check_flag("interpret", interpret)
    for name, x in (("q", q), ("k", k), ("v", v)):
        validation.check_index_range(name, x)
    if interpret is None:
        interpret = compat.pallas_interpret()
    config = config or default_config(q.shape[-1], interpret, q.dtype)
    return _attention_jit(q, k, v, bool(causal), config, interpret)


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name=IMPL,
    fn=attention,
    # Precision.HIGHEST for float32 (_precision), which the Triton lowering maps to
    # input_precision IEEE; interpret mode: XLA:CPU, FP32.
    precision=precisions.EVERYWHERE_FP32,
    description="Pallas (Triton lowering), FlashAttention-2 forward with saved log-sum-exp, "
                "dK/dV and dQ backward kernels; custom VJP",
))
