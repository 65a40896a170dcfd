"""Flash attention in Triton, forward and backward (FlashAttention-2), as a torch.autograd.Function.

Forward (Dao 2023, "FlashAttention-2", Algorithm 1): one program per
(query block, batch * head) keeps its Q tile in registers and walks the key
blocks with an online softmax: a running max m and sum l per query row,
rescaling the output accumulator by exp(m_old - m_new) when the max grows.
Exponentials are exp2 with log2(e) folded into the scale, applied in the
same FMA that subtracts the row max. Under the causal mask, key blocks
entirely above the diagonal are skipped, only blocks on the diagonal or past
the end of a ragged sequence pay for a mask, and the longest query blocks
are launched first. The log-sum-exp per query row (base 2, scaled logits) is
saved for the backward.

Backward (Algorithm 2, split in two kernels so neither needs atomics):
delta = rowsum(dO * O) first; then one program per key block accumulates
dK and dV over query blocks, and one program per query block accumulates dQ
over key blocks. Both recompute P = exp2(S * scale * log2(e) - lse) from Q, K
and the saved log-sum-exp: seven matmuls in all (five with atomics for dQ).

Streamed blocks (K and V in the forward and dQ kernels, Q and dO in dK/dV) come
by pointer loads or, where the config asks and the GPU has it, by TMA from
tensor descriptors over (batch, seq, heads, head_dim), whose zero fill past the
sequence replaces the load masks; the config also picks tiles small enough for
two CTAs per SM (AttentionConfig, CONFIGS). On sm_90 the config can hand the
forward to the same algorithm written in Gluon (triton_gluon.py), which overlaps
each block's softmax with the previous block's P V wgmma.

Inputs are (batch, seq, heads, head_dim), bf16/f16 (f32 with IEEE float32
dots: the operation's float32 tolerance rules out TF32). P and dS are
rounded to the input dtype before their matmuls, as every flash kernel does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.core import compat, frameworks, precisions, registry, validation
from kernels.ops.attention import spec, triton_gluon

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

compat.patch_triton_interpreter()

LOG2E = 1.4426950408889634  # 1 / ln 2: exp(x) = exp2(x * LOG2E)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """Tile sizes and warps (powers of two) and software-pipeline stages, per kernel.

    Forward: block_m queries per program, block_n keys per step. dK/dV:
    block_n1 keys per program, block_m1 queries per step. dQ: block_m2 queries
    per program, block_n2 keys per step, with its own warps and stages when
    dq_num_warps / dq_num_stages are set (0: those of dK/dV). Causal masking of
    a diagonal block assumes block_m % block_n == 0, block_n1 % block_m1 == 0 and
    block_m2 % block_n2 == 0 (each step then lies on or off the diagonal).
    tma / bwd_tma: the forward's / the backward kernels' streamed blocks (K and V;
    Q and dO for dK/dV) come by TMA from tensor descriptors instead of pointer
    loads, where the GPU has TMA (sm_90 and later); zero-filled past the sequence.
    gluon: the forward runs as triton_gluon's kernel where it can (sm_90, bf16/f16): block_m
    64 and 4 warps (one warpgroup), block_n and num_stages (>= 3) from here, TMA always.
    """

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    block_m1: int = 32
    block_n1: int = 128
    block_m2: int = 128
    block_n2: int = 32
    bwd_num_warps: int = 4
    bwd_num_stages: int = 3
    dq_num_warps: int = 0  # 0: as bwd_num_warps
    dq_num_stages: int = 0  # 0: as bwd_num_stages
    tma: bool = False
    bwd_tma: bool = False
    gluon: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(field.default, bool):
                if not isinstance(value, bool):
                    raise TypeError(f"{field.name}: expected True or False, got {value!r}")
                continue
            floor = 0 if field.name.startswith("dq_") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < floor:
                raise ValueError(f"{field.name}: expected an int >= {floor}, got {value!r}")
            if "stages" not in field.name and value & (value - 1):
                raise ValueError(f"{field.name}: expected a power of two, got {value}")
        for big, small in (("block_m", "block_n"), ("block_n1", "block_m1"),
                           ("block_m2", "block_n2")):
            if getattr(self, big) % getattr(self, small):
                raise ValueError(f"{big}={getattr(self, big)} must be a multiple of "
                                 f"{small}={getattr(self, small)}")
        if self.gluon and (self.block_m != triton_gluon.BLOCK_M or self.num_warps
                           != triton_gluon.WARPS or self.num_stages < triton_gluon.MIN_STAGES):
            raise ValueError(f"gluon: expected block_m={triton_gluon.BLOCK_M}, num_warps="
                             f"{triton_gluon.WARPS} and num_stages >= {triton_gluon.MIN_STAGES}, "
                             f"got block_m={self.block_m}, num_warps={self.num_warps}, "
                             f"num_stages={self.num_stages}")


# Per GPU model (torch.cuda.get_device_name) and head_dim, bf16/f16; float32 tiles are
# smaller (4-byte elements, and IEEE dots use no tensor cores). Keys: (head_dim, causal), or
# head_dim for both. H100 sweeps of 2026-11-25 (CUPTI, cold L2, cuDNN in the same run, cuDNN's
# time over ours; perf_tests/RESULTS.md), head_dim 128 / 128 causal / 64 / 64 causal:
# - forward: 128 x 64 tiles, 8 warps, pointer loads 0.73 / 0.74 / 0.91 / 0.87; 64 x 64 with 4
#   warps (two CTAs per SM) and K, V by TMA 0.78 / 0.81 / 0.85 / 0.89 (by pointer loads 0.72 /
#   0.74 / 0.84 / 0.88); 128 x 64 by TMA 0.68 / 0.72 / 0.84 / 0.82; 128 x 128, 4 stages, and
#   Triton's Hopper warp specialization (tl.range(warp_specialize=True): 8 warps no faster,
#   4 warps do not compile) all slower. Fifth session, same runs: Q held in registers for
#   Q K^T (0.73 / 0.78 / 0.67 / 0.77), lazy rescaling of the accumulator (0.71 / 0.75 / 0.82 /
#   0.82) and 2 CTAs of 8 warps under a 128-register cap (0.74 / 0.74) slower still; the Gluon
#   kernel (64 x 64, 3 stages) 0.83 / 0.87 / 0.87 / 0.92 against the tl kernel's 0.78 / 0.81 /
#   0.90 / 0.89, so it runs every forward here but head_dim 64 non-causal.
# - backward: 64-query dK/dV steps and 64-key dQ steps with 8 warps, pointer loads 0.67 /
#   0.74 / 0.80 / 0.75 (the last 32 x 128 with 4 warps, the first session's defaults); 64 x 64
#   tiles in both kernels with 4 warps and Q, dO, K, V by TMA 0.78 (2 stages) / 0.81 (2) /
#   0.83 (3) / 0.87 (3); the same by pointer loads 0.67 / 0.70 / 0.74 / 0.87.
CONFIGS = {
    "NVIDIA H100 80GB HBM3": {
        128: AttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=3, tma=True,
                             gluon=True, block_m1=64, block_n1=64, block_m2=64, block_n2=64,
                             bwd_num_warps=4, bwd_num_stages=2, bwd_tma=True),
        (64, False): AttentionConfig(block_m1=64, block_n1=64, block_m2=64, block_n2=64,
                                     bwd_num_warps=4, bwd_num_stages=3, bwd_tma=True),
        (64, True): AttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=3, tma=True,
                                    gluon=True, block_m1=64, block_n1=64, block_m2=64, block_n2=64,
                                    bwd_num_warps=4, bwd_num_stages=3, bwd_tma=True),
    },
}
# Other GPUs of a tuned one's SM architecture take its configs: on the H200 (sm_90 like the
# H100) the generic config ran the head_dim 128 backward at 0.30x cuDNN (32-query dK/dV steps
# with 4 warps, as on the H100).
CONFIGS_BY_CAPABILITY = {(9, 0): CONFIGS["NVIDIA H100 80GB HBM3"]}
GENERIC_CONFIG = AttentionConfig()
FLOAT32_CONFIG = AttentionConfig(block_m=64, block_n=32, num_warps=4, num_stages=2, block_m1=16,
                                 block_n1=64, block_m2=64, block_n2=16, bwd_num_warps=4,
                                 bwd_num_stages=2)
# The interpreter runs each program in NumPy: small tiles keep CPU tests quick and still send
# the tiny cases (seq 37, 65, 80) through several blocks, masked and unmasked. TMA as on the
# H100 (the interpreter emulates descriptors); correctness_tests/test_triton_attention.py
# runs the pointer loads too.
INTERPRETER_CONFIG = AttentionConfig(block_m=32, block_n=16, num_warps=4, num_stages=1,
                                     block_m1=16, block_n1=32, block_m2=32, block_n2=16,
                                     bwd_num_warps=4, bwd_num_stages=1, tma=True, bwd_tma=True)


def default_config(dtype: torch.dtype, head_dim: int, device: torch.device,
                   causal: bool = False) -> AttentionConfig:
    import torch

    if device.type != "cuda":
        return INTERPRETER_CONFIG
    if dtype == torch.float32:
        return FLOAT32_CONFIG
    tuned = (CONFIGS.get(torch.cuda.get_device_name(device))
             or CONFIGS_BY_CAPABILITY.get(torch.cuda.get_device_capability(device), {}))
    return tuned_for(tuned, head_dim, causal)


def tuned_for(tuned: dict, head_dim: int, causal: bool) -> AttentionConfig:
    """The config of one GPU model's table (CONFIGS' values) for head_dim and the mask: its
    (head_dim, causal) entry, else its head_dim entry, else GENERIC_CONFIG."""
    return tuned.get((head_dim, causal), tuned.get(head_dim, GENERIC_CONFIG))


@triton.jit
def _tma_rows(desc, b, h, start, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows start .. start + BLOCK - 1 of head (b, h), (BLOCK, HEAD_DIM), by TMA from a
    descriptor of (batch, seq, heads, head_dim): zeros past the sequence."""
    return desc.load([b, start, h, 0]).reshape(BLOCK, HEAD_DIM)


@triton.jit
def _forward_inner(acc, l_i, m_i, q, k_src, v_src, b, h, offs_m, offs_n, start, end, seq,
                   stride_s, qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   CAUSAL_MASK: tl.constexpr, BOUNDS: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, TMA: tl.constexpr):
    """Online softmax over key blocks [start, end), masking only where asked (constexpr).
    k_src / v_src: TMA descriptors, or pointers to the K^T / V tiles of block 0."""
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        if TMA:
            k = _tma_rows(k_src, b, h, start_n, BLOCK_N, HEAD_DIM).T
        elif BOUNDS:
            k = tl.load(k_src + start_n * stride_s, mask=keys[None, :] < seq, other=0.0)
        else:
            k = tl.load(k_src + start_n * stride_s)
        s = tl.dot(q, k, input_precision=DOT_PRECISION)
        if CAUSAL_MASK or BOUNDS:
            keep = keys[None, :] < seq
            if CAUSAL_MASK:
                keep = keep & (keys[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        # Every row has met key 0 in the first block it saw, so m_new is finite. The scale is
        # applied to the row max and inside exp2's argument (one FMA per logit), not to S.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if TMA:
            v = _tma_rows(v_src, b, h, start_n, BLOCK_N, HEAD_DIM)
        elif BOUNDS:
            v = tl.load(v_src + start_n * stride_s, mask=keys[:, None] < seq, other=0.0)
        else:
            v = tl.load(v_src + start_n * stride_s)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_forward_kernel(
    # Inputs
    q_ptr, k_ptr, v_ptr,
    # Outputs
    o_ptr, lse_ptr,
    # Shapes and strides (q, k, v, o share one contiguous layout)
    stride_b, stride_s, stride_h, heads, seq, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """k_ptr / v_ptr: TMA descriptors when TMA, else the tensors."""
    if CAUSAL:  # the longest query blocks (most keys) first: a shorter tail of the grid
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // heads, bh % heads
    offset = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + offset + offs_m[:, None] * stride_s + offs_d[None, :],
                mask=offs_m[:, None] < seq, other=0.0)
    if TMA:
        k_src, v_src = k_ptr, v_ptr
    else:
        k_src = k_ptr + offset + offs_n[None, :] * stride_s + offs_d[:, None]  # K^T tile
        v_src = v_ptr + offset + offs_n[:, None] * stride_s + offs_d[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Keys before `full_end` need no mask: in range and, under the causal mask, visible to
    # every query of this block. Causal blocks past the diagonal are never visited.
    if CAUSAL:
        end = tl.minimum(seq, start_m + BLOCK_M)
        full_end = (tl.minimum(start_m, seq) // BLOCK_N) * BLOCK_N
    else:
        end = seq
        full_end = (seq // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _forward_inner(acc, l_i, m_i, q, k_src, v_src, b, h, offs_m, offs_n, 0,
                                   full_end, seq, stride_s, qk_scale, BLOCK_N, HEAD_DIM, False,
                                   False, DOT_PRECISION, TMA)
    acc, l_i, m_i = _forward_inner(acc, l_i, m_i, q, k_src, v_src, b, h, offs_m, offs_n,
                                   full_end, end, seq, stride_s, qk_scale, BLOCK_N, HEAD_DIM,
                                   CAUSAL, True, DOT_PRECISION, TMA)
    in_range = offs_m < seq
    tl.store(lse_ptr + bh.to(tl.int64) * seq + offs_m, m_i + tl.math.log2(l_i), mask=in_range)
    o = acc / l_i[:, None]
    tl.store(o_ptr + offset + offs_m[:, None] * stride_s + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=in_range[:, None])


@triton.jit
def attention_backward_kernel_delta(
    # Inputs
    o_ptr, do_ptr,
    # Outputs
    delta_ptr,
    stride_b, stride_s, stride_h, heads, seq,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """delta = rowsum(dO * O) per query: the softmax backward's inner product."""
    bh = tl.program_id(1)
    offset = (bh // heads).to(tl.int64) * stride_b + (bh % heads).to(tl.int64) * stride_h
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    index = offset + offs_m[:, None] * stride_s + offs_d[None, :]
    in_range = offs_m[:, None] < seq
    o = tl.load(o_ptr + index, mask=in_range, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + index, mask=in_range, other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh.to(tl.int64) * seq + offs_m, tl.sum(o * do, 1), mask=offs_m < seq)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_src, do_src, b, h, lse_ptr, delta_ptr, offs_n, offs_m, start,
                end, seq, stride_s, qk_scale, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                CAUSAL_MASK: tl.constexpr, BOUNDS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                TMA: tl.constexpr):
    """dV += P^T dO and dK += dS^T Q over query blocks [start, end) (dK unscaled).
    q_src / do_src: TMA descriptors, or pointers to the Q^T / dO tiles of block 0."""
    for start_m in range(start, end, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        queries = start_m + offs_m
        if TMA:
            q_t = _tma_rows(q_src, b, h, start_m, BLOCK_M, HEAD_DIM).T
            do = _tma_rows(do_src, b, h, start_m, BLOCK_M, HEAD_DIM)
        elif BOUNDS:
            q_t = tl.load(q_src + start_m * stride_s, mask=queries[None, :] < seq, other=0.0)
            do = tl.load(do_src + start_m * stride_s, mask=queries[:, None] < seq, other=0.0)
        else:
            q_t = tl.load(q_src + start_m * stride_s)
            do = tl.load(do_src + start_m * stride_s)
        if BOUNDS:
            in_range = queries < seq
            # +inf log-sum-exp makes P exactly 0 for queries past the end.
            lse = tl.load(lse_ptr + queries, mask=in_range, other=float("inf"))
            delta = tl.load(delta_ptr + queries, mask=in_range, other=0.0)
        else:
            lse = tl.load(lse_ptr + queries)
            delta = tl.load(delta_ptr + queries)
        s_t = tl.dot(k, q_t, input_precision=DOT_PRECISION)
        logits_t = s_t * qk_scale - lse[None, :]
        if CAUSAL_MASK:  # masked before exp2: a masked logit may be large enough to overflow
            logits_t = tl.where(queries[None, :] >= offs_n[:, None], logits_t, float("-inf"))
        p_t = tl.math.exp2(logits_t)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def attention_backward_kernel_dkdv(
    # Inputs
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,
    # Outputs
    dk_ptr, dv_ptr,
    stride_b, stride_s, stride_h, heads, seq, qk_scale, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """q_ptr / do_ptr: TMA descriptors when TMA, else the tensors."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, h = bh // heads, bh % heads
    offset = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_index = offset + offs_n[:, None] * stride_s + offs_d[None, :]
    keys_in_range = offs_n[:, None] < seq
    k = tl.load(k_ptr + kv_index, mask=keys_in_range, other=0.0)
    v = tl.load(v_ptr + kv_index, mask=keys_in_range, other=0.0)
    if TMA:
        q_src, do_src = q_ptr, do_ptr
    else:
        q_src = q_ptr + offset + offs_m[None, :] * stride_s + offs_d[:, None]  # Q^T tile
        do_src = do_ptr + offset + offs_m[:, None] * stride_s + offs_d[None, :]
    lse_ptr += bh.to(tl.int64) * seq
    delta_ptr += bh.to(tl.int64) * seq

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    full_end = (seq // BLOCK_M) * BLOCK_M
    start = 0
    if CAUSAL:
        # Queries before this key block see none of it; the diagonal blocks need the mask.
        start = tl.minimum(start_n + BLOCK_N, seq)
        dk, dv = _dkdv_inner(dk, dv, k, v, q_src, do_src, b, h, lse_ptr, delta_ptr, offs_n,
                             offs_m, start_n, start, seq, stride_s, qk_scale, BLOCK_M, HEAD_DIM,
                             True, True, DOT_PRECISION, TMA)
        full_end = tl.maximum(full_end, start)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_src, do_src, b, h, lse_ptr, delta_ptr, offs_n, offs_m,
                         start, full_end, seq, stride_s, qk_scale, BLOCK_M, HEAD_DIM, False,
                         False, DOT_PRECISION, TMA)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_src, do_src, b, h, lse_ptr, delta_ptr, offs_n, offs_m,
                         full_end, seq, seq, stride_s, qk_scale, BLOCK_M, HEAD_DIM, False, True,
                         DOT_PRECISION, TMA)
    tl.store(dk_ptr + kv_index, (dk * scale).to(dk_ptr.dtype.element_ty), mask=keys_in_range)
    tl.store(dv_ptr + kv_index, dv.to(dv_ptr.dtype.element_ty), mask=keys_in_range)


@triton.jit
def _dq_inner(dq, q, do, lse, delta, k_src, v_src, b, h, offs_m, offs_n, start, end, seq,
              stride_s, qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
              CAUSAL_MASK: tl.constexpr, BOUNDS: tl.constexpr, DOT_PRECISION: tl.constexpr,
              TMA: tl.constexpr):
    """dQ += dS K over key blocks [start, end) (unscaled). k_src / v_src: TMA descriptors, or
    pointers to the K^T / V^T tiles of block 0."""
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        if TMA:
            k_t = _tma_rows(k_src, b, h, start_n, BLOCK_N, HEAD_DIM).T
            v_t = _tma_rows(v_src, b, h, start_n, BLOCK_N, HEAD_DIM).T
        elif BOUNDS:
            k_t = tl.load(k_src + start_n * stride_s, mask=keys[None, :] < seq, other=0.0)
            v_t = tl.load(v_src + start_n * stride_s, mask=keys[None, :] < seq, other=0.0)
        else:
            k_t = tl.load(k_src + start_n * stride_s)
            v_t = tl.load(v_src + start_n * stride_s)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION)
        logits = s * qk_scale - lse[:, None]
        if CAUSAL_MASK or BOUNDS:  # masked before exp2, as in _dkdv_inner
            keep = keys[None, :] < seq
            if CAUSAL_MASK:
                keep = keep & (keys[None, :] <= offs_m[:, None])
            logits = tl.where(keep, logits, float("-inf"))
        p = tl.math.exp2(logits)
        dp = tl.dot(do, v_t, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def attention_backward_kernel_dq(
    # Inputs
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,
    # Outputs
    dq_ptr,
    stride_b, stride_s, stride_h, heads, seq, qk_scale, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """k_ptr / v_ptr: TMA descriptors when TMA, else the tensors."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // heads, bh % heads
    offset = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    index = offset + offs_m[:, None] * stride_s + offs_d[None, :]
    in_range = offs_m < seq
    q = tl.load(q_ptr + index, mask=in_range[:, None], other=0.0)
    do = tl.load(do_ptr + index, mask=in_range[:, None], other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * seq + offs_m, mask=in_range, other=float("inf"))
    delta = tl.load(delta_ptr + bh.to(tl.int64) * seq + offs_m, mask=in_range, other=0.0)
    if TMA:
        k_src, v_src = k_ptr, v_ptr
    else:
        k_src = k_ptr + offset + offs_n[None, :] * stride_s + offs_d[:, None]  # K^T tile
        v_src = v_ptr + offset + offs_n[None, :] * stride_s + offs_d[:, None]  # V^T tile

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        end = tl.minimum(seq, start_m + BLOCK_M)
        full_end = (tl.minimum(start_m, seq) // BLOCK_N) * BLOCK_N
    else:
        end = seq
        full_end = (seq // BLOCK_N) * BLOCK_N
    dq = _dq_inner(dq, q, do, lse, delta, k_src, v_src, b, h, offs_m, offs_n, 0, full_end, seq,
                   stride_s, qk_scale, BLOCK_N, HEAD_DIM, False, False, DOT_PRECISION, TMA)
    dq = _dq_inner(dq, q, do, lse, delta, k_src, v_src, b, h, offs_m, offs_n, full_end, end, seq,
                   stride_s, qk_scale, BLOCK_N, HEAD_DIM, CAUSAL, True, DOT_PRECISION, TMA)
    tl.store(dq_ptr + index, (dq * scale).to(dq_ptr.dtype.element_ty), mask=in_range[:, None])


def _dot_precision(dtype: torch.dtype) -> str:
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"  # "tf32" is ignored for 16-bit inputs


def _has_tma(device: torch.device) -> bool:
    """TMA needs sm_90 or later (the interpreter emulates it)."""
    import torch

    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x contiguous with a 16-byte aligned base, copied only if it is not: TMA descriptors need
    it, and a view a few elements into its storage is otherwise a valid input."""
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()


def _streamed(x: torch.Tensor, block: int, tma: bool):
    """What a kernel streams x (batch, seq, heads, head_dim) through: a TMA descriptor of one
    head's `block` rows at a time, or x itself for pointer loads."""
    if not tma:
        return x
    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, block, 1, x.shape[-1]])


def _forward(q, k, v, causal: bool, config: AttentionConfig):
    import torch

    batch, seq, heads, head_dim = q.shape
    o = frameworks.torch_empty(q.shape, q.dtype, q.device)
    lse = frameworks.torch_empty((batch, heads, seq), torch.float32, q.device)
    if config.gluon and triton_gluon.runs_on(q):
        triton_gluon.forward(q, k, v, o, lse, causal, spec.scale_of(head_dim) * LOG2E,
                             block_n=config.block_n, stages=config.num_stages)
        return o, lse
    grid = (triton.cdiv(seq, config.block_m), batch * heads)
    tma = config.tma and _has_tma(q.device)
    attention_forward_kernel[grid](
        q, _streamed(k, config.block_n, tma), _streamed(v, config.block_n, tma), o, lse,
        q.stride(0), q.stride(1), q.stride(2), heads, seq, spec.scale_of(head_dim) * LOG2E,
        HEAD_DIM=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n, CAUSAL=causal,
        DOT_PRECISION=_dot_precision(q.dtype), TMA=tma, num_warps=config.num_warps,
        num_stages=config.num_stages)
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool, config: AttentionConfig):
    import torch

    batch, seq, heads, head_dim = q.shape
    strides = (q.stride(0), q.stride(1), q.stride(2))
    delta = frameworks.torch_empty((batch, heads, seq), torch.float32, q.device)
    attention_backward_kernel_delta[(triton.cdiv(seq, config.block_m2), batch * heads)](
        o, do, delta, *strides, heads, seq, HEAD_DIM=head_dim, BLOCK_M=config.block_m2)
    scale = spec.scale_of(head_dim)
    tma = config.bwd_tma and _has_tma(q.device)
    common = dict(HEAD_DIM=head_dim, CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
                  TMA=tma, num_warps=config.bwd_num_warps, num_stages=config.bwd_num_stages)
    dk = frameworks.torch_empty(k.shape, k.dtype, k.device)
    dv = frameworks.torch_empty(v.shape, v.dtype, v.device)
    attention_backward_kernel_dkdv[(triton.cdiv(seq, config.block_n1), batch * heads)](
        _streamed(q, config.block_m1, tma), k, v, _streamed(do, config.block_m1, tma), lse,
        delta, dk, dv, *strides, heads, seq, scale * LOG2E, scale, BLOCK_M=config.block_m1,
        BLOCK_N=config.block_n1, **common)
    dq = frameworks.torch_empty(q.shape, q.dtype, q.device)
    common.update(num_warps=config.dq_num_warps or config.bwd_num_warps,
                  num_stages=config.dq_num_stages or config.bwd_num_stages)
    attention_backward_kernel_dq[(triton.cdiv(seq, config.block_m2), batch * heads)](
        q, _streamed(k, config.block_n2, tma), _streamed(v, config.block_n2, tma), do, lse,
        delta, dq, *strides, heads, seq, scale * LOG2E, scale, BLOCK_M=config.block_m2,
        BLOCK_N=config.block_n2, **common)
    return dq, dk, dv


@functools.cache
def _autograd() -> type:
    """The kernels as a torch.autograd.Function, built on first use: torch is imported by a
    call, not by loading the registry."""
    import torch

    class FlashAttention(torch.autograd.Function):
        """o = attention(q, k, v); saves q, k, v, o and the log-sum-exp for the backward."""

        @staticmethod
        def forward(ctx, q, k, v, causal: bool, config: AttentionConfig):
            o, lse = _forward(q, k, v, causal, config)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.config = causal, config
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = _backward(q, k, v, o, lse, _aligned(do), ctx.causal, ctx.config)
            return dq, dk, dv, None, None

    return FlashAttention


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              config: AttentionConfig | None = None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(head_dim) + causal mask) V, differentiable.

    Args:
      q, k, v: (batch, seq, heads, head_dim) tensors of one dtype (bf16, f16 or
        f32) on one device; head_dim 64 or 128.
      causal: mask key j > query i.
      config: tiles and pipeline depth; `default_config` when None.
    Returns:
      (batch, seq, heads, head_dim) tensor of q's dtype.
    """
    spec.validate(q, k, v, causal)
    device = frameworks.TorchFramework.device()
    for name, x in (("q", q), ("k", k), ("v", v)):
        validation.check_torch_tensor(name, x, device, like=q)
    validation.check_config(config, AttentionConfig)
    for name, x in (("q", q), ("k", k), ("v", v)):
        validation.check_index_range(name, x)
    q, k, v = (_aligned(x) for x in (q, k, v))
    config = config or default_config(q.dtype, q.shape[-1], q.device, bool(causal))
    return _autograd().apply(q, k, v, bool(causal), config)


def supports(case: registry.Case) -> str | None:
    if case["head_dim"] not in spec.HEAD_DIMS:
        return f"head_dim {case['head_dim']} not in {spec.HEAD_DIMS}"
    return None


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="triton",
    fn=attention,
    # input_precision="ieee" for float32 (_dot_precision); the interpreter is FP32 anyway.
    precision=precisions.EVERYWHERE_FP32,
    framework="torch",
    requires=registry.Requirements(modules=("torch", "triton")),
    supports=supports,
    description="Triton FlashAttention-2: online softmax forward saving the log-sum-exp "
                "(on sm_90 in Gluon, softmax overlapped with P V), dK/dV and dQ backward "
                "kernels, torch.autograd.Function",
))
