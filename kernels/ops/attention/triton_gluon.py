"""The Triton attention's forward on Hopper, written in Gluon (Triton's explicit-layout language).

Same algorithm and outputs as `triton.attention_forward_kernel` (FlashAttention-2's online
softmax, base-2 log-sum-exp saved for the backward), with what `tl` leaves to the compiler
spelled out: one warpgroup per CTA holds 64 query rows; K and V blocks arrive by TMA into a
ring of `stages` shared-memory slots, each completing on its own mbarrier; S = Q K^T reads
Q and K from shared memory, P V takes P from registers, and both wgmmas are asynchronous.
Step j issues S_j, rescales the accumulator, issues P_{j-1} V_{j-1}, waits for S_j alone and
starts the softmax of S_j while P_{j-1} V_{j-1} is on the tensor cores (FlashAttention-3's
intra-warpgroup overlap; ptxas moves the wait for P V a few instructions into the softmax,
and pinning it after the softmax measured the same: the second CTA on the SM fills the gap,
perf_tests/RESULTS.md). The `tl` kernel waits for both products before every softmax and
synchronises its warps around each TMA copy.

Keys past the sequence and, under the causal mask, past the diagonal are masked in the last
blocks only (a second loop). Q, K and V are read through 2-D descriptors over (batch * seq,
heads * head_dim): a block that runs past one sequence reads the next one's rows, which the
mask removes (keys) or the store drops (queries); past the tensor's end TMA fills zeros.
Used by `triton.attention` on sm_90 for bf16/f16 where the config says `gluon`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

# By torch dtype name (torch is imported by a call, not by loading the registry).
GLUON_DTYPES = {"bfloat16": gl.bfloat16, "float16": gl.float16}
WARPS = 4  # one warpgroup: its wgmma wait is what frees a ring slot for the next TMA copy
BLOCK_M = 16 * WARPS  # query rows: wgmma gives each warp 16
MIN_STAGES = 3  # slots for the block being read by S, the one read by P V, and the next


def runs_on(x: torch.Tensor) -> bool:
    """Whether this kernel can take x: bf16/f16 on an sm_90 GPU (wgmma is Hopper's alone)."""
    import torch

    return x.device.type == "cuda" and takes(x.dtype, torch.cuda.get_device_capability(x.device))


def takes(dtype: torch.dtype, capability: tuple[int, int]) -> bool:
    return _name(dtype) in GLUON_DTYPES and capability == (9, 0)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, block, n_blocks, row0, col,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA copies of key block `block` (K and V, each on its own barrier) into its ring slot;
    nothing past the last block."""
    slot = block % STAGES
    live = block < n_blocks
    row = row0 + block * BLOCK_N
    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(k_desc, [row, col], k_bars.index(slot), k_smem.index(slot),
                                    pred=live)
    mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(v_desc, [row, col], v_bars.index(slot), v_smem.index(slot),
                                    pred=live)


@gluon.jit
def _masked(s, block, offs_m, offs_n, seq, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    keys = block * BLOCK_N + offs_n
    keep = keys[None, :] < seq
    if CAUSAL:
        keep = keep & (keys[None, :] <= offs_m[:, None])
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _step(j, p, alpha, m_i, l_i, acc, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc,
          zeros_s, offs_m, offs_n, seq, n_blocks, row0, col, qk_scale, BLOCK_N: gl.constexpr,
          STAGES: gl.constexpr, MASK: gl.constexpr, CAUSAL: gl.constexpr,
          row_o: gl.constexpr, p_layout: gl.constexpr):
    """Key block j >= 1, with P_{j-1} and its alpha from the step before."""
    # Block j - 2 + STAGES goes where block j - 2 was: its P V finished at the last step's end.
    _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j - 2 + STAGES, n_blocks, row0, col,
             BLOCK_N, STAGES)
    slot = j % STAGES
    mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
    s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zeros_s, use_acc=False,
                      is_async=True)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    prev = (j - 1) % STAGES
    mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
    p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s, ))  # S_j is ready; P_{j-1} V_{j-1} may still run
    if MASK:
        s = _masked(s, j, offs_m, offs_n, seq, BLOCK_N, CAUSAL)
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    return p, alpha, m_new, l_i, acc


@gluon.jit
def attention_forward_kernel(
    q_desc, k_desc, v_desc,  # TMA descriptors over (batch * seq, heads * head_dim)
    o_ptr, lse_ptr,
    stride_b, stride_s, stride_h, heads, seq, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    if CAUSAL:  # the longest query blocks (most keys) first: a shorter tail of the grid
        start_m = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_M
    else:
        start_m = gl.program_id(0) * BLOCK_M
    bh = gl.program_id(1)
    b = bh // heads
    h = bh % heads
    row0 = b * seq
    col = h * HEAD_DIM

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    # Blocks before `full_blocks` need no mask: in range and, under the causal mask, visible to
    # every query of this block. Causal blocks past the diagonal are never visited.
    if CAUSAL:
        end = gl.minimum(seq, start_m + BLOCK_M)
        full_blocks = gl.minimum(start_m, seq) // BLOCK_N
    else:
        end = seq
        full_blocks = seq // BLOCK_N
    n_blocks = gl.cdiv(end, BLOCK_N)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + start_m, col], q_bar, q_smem)
    for i in gl.static_range(STAGES - 1):
        _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, n_blocks, row0, col, BLOCK_N,
                 STAGES)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zeros_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)

    # Block 0. Every row meets key 0 here, so the running max is finite from now on.
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zeros_s, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    if full_blocks == 0:
        s = _masked(s, 0, offs_m, offs_n, seq, BLOCK_N, CAUSAL)
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    alpha = gl.full([BLOCK_M], 1.0, gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    for j in range(1, gl.maximum(full_blocks, 1)):
        p, alpha, m_i, l_i, acc = _step(j, p, alpha, m_i, l_i, acc, q_smem, k_smem, v_smem,
                                        k_bars, v_bars, k_desc, v_desc, zeros_s, offs_m, offs_n,
                                        seq, n_blocks, row0, col, qk_scale, BLOCK_N, STAGES,
                                        False, CAUSAL, row_o, p_layout)
    for j in range(gl.maximum(full_blocks, 1), n_blocks):
        p, alpha, m_i, l_i, acc = _step(j, p, alpha, m_i, l_i, acc, q_smem, k_smem, v_smem,
                                        k_bars, v_bars, k_desc, v_desc, zeros_s, offs_m, offs_n,
                                        seq, n_blocks, row0, col, qk_scale, BLOCK_N, STAGES,
                                        True, CAUSAL, row_o, p_layout)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    last = n_blocks - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    gl.store(lse_ptr + bh.to(gl.int64) * seq + offs_m, m_i + gl.log2(l_i), mask=offs_m < seq)
    o = acc / gl.convert_layout(l_i, row_o)[:, None]
    offs_mo = start_m + gl.arange(0, BLOCK_M, layout=row_o)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    base = b.to(gl.int64) * stride_b + h.to(gl.int64) * stride_h
    gl.store(o_ptr + base + offs_mo[:, None] * stride_s + offs_d[None, :], o.to(dtype),
             mask=offs_mo[:, None] < seq)


def descriptor(x: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A TMA descriptor of `block_rows` rows of one head over contiguous x (batch, seq, heads,
    head_dim), seen as (batch * seq, heads * head_dim)."""
    batch, seq, heads, head_dim = x.shape
    flat = x.view(batch * seq, heads * head_dim)
    layout = gl.NVMMASharedLayout.get_default_for([block_rows, head_dim],
                                                  GLUON_DTYPES[_name(x.dtype)])
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block_rows, head_dim],
                            layout)


def launch(q, k, v, o, lse, causal: bool, qk_scale: float, *, block_n: int, stages: int):
    """(grid, args, kwargs) of the kernel's launch that writes o (like q) and lse (batch, heads,
    seq; base 2, scaled logits) from contiguous, 16-byte aligned q, k, v (batch, seq, heads,
    head_dim)."""
    batch, seq, heads, head_dim = q.shape
    grid = (triton.cdiv(seq, BLOCK_M), batch * heads)
    args = (descriptor(q, BLOCK_M), descriptor(k, block_n), descriptor(v, block_n), o, lse,
            q.stride(0), q.stride(1), q.stride(2), heads, seq, qk_scale)
    return grid, args, dict(HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=block_n, STAGES=stages,
                            CAUSAL=causal, num_warps=WARPS)


def forward(q, k, v, o, lse, causal: bool, qk_scale: float, *, block_n: int, stages: int):
    grid, args, kwargs = launch(q, k, v, o, lse, causal, qk_scale, block_n=block_n,
                                stages=stages)
    attention_forward_kernel[grid](*args, **kwargs)


def example_launch(head_dim: int, causal: bool, block_n: int, stages: int):
    """(kernel, args, kwargs) of a bf16 launch on CPU tensors of a ragged size (2 x 1000 x 4),
    for compiling without a GPU (kernels.profile.triton_aot)."""
    import torch

    q = torch.empty((2, 1000, 4, head_dim), dtype=torch.bfloat16)
    lse = torch.empty((2, 4, 1000), dtype=torch.float32)
    _, args, kwargs = launch(q, q, q, q, lse, causal, 0.1, block_n=block_n, stages=stages)
    return attention_forward_kernel, args, kwargs
