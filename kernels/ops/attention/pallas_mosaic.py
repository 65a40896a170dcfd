"""Flash attention in Pallas Mosaic GPU (Hopper): FlashAttention-3 forward, wgmma backward, VJP.

Forward (Shah et al., "FlashAttention-3", 2024, Algorithm 1 with the
"ping-pong" schedule of section 3.1): one CTA per (2 block_q queries, head,
batch). A producer warpgroup streams K and V blocks by TMA into a
`max_concurrent_steps`-deep ring of swizzled shared-memory buffers; two
consumer warpgroups, each owning block_q query rows (kept in shared memory),
issue wgmma for S = Q K^T (both operands in shared memory) and O += P V (P
from registers), with the online softmax in registers in base 2 (the logits
scaled by log2(e) / sqrt(d), so exp2 is one FMA and one MUFU op). A shared
"schedule" barrier alternates the two consumers, so that one's softmax runs
while the other's matmuls occupy the tensor cores. With `fused_burst`, a
consumer issues O += P_i V_i and the next block's S = Q K_{i+1}^T together and
waits once for both. The output is normalised at the end and written by TMA
with the base-2 log-sum-exp of every row.

Backward (FlashAttention-2 Algorithm 2, split in two kernels since Mosaic GPU
here has no float atomics for dQ): the dK/dV kernel gives each consumer
warpgroup block_kv_dkv keys (K and V in shared memory) and streams blocks of
Q, dO, the log-sum-exp and delta = rowsum(dO * O) (computed by XLA); it works
on transposes (S^T = K Q^T, dP^T = V dO^T) so that P^T and dS^T are register
A operands of dV += P^T dO and dK += dS^T Q. The dQ kernel gives each
consumer block_q_dq query rows (Q, dO) and streams K and V blocks:
dQ += dS K. In both, the dP product is issued with the S product (it does not
need P), so it runs under the exp2; the dK/dV kernel then issues dV and dK
together.

Sequence lengths are zero-padded in the wrapper to a multiple of every block
(one copy of q, k, v, dO, only when seq is not a multiple; the results are
sliced). The forward and the dQ kernel mask padded keys in the last key block
(the dQ kernel must: exp2(-lse) can overflow there, and inf times a zero key
row is NaN); padded query rows (zero dO, zero delta, finite lse) contribute
nothing to dK and dV and need no mask. Under the causal mask, key blocks
wholly above the diagonal are never loaded and only blocks crossing it are
masked. CTAs start in groups of heads whose streamed inputs fit in L2 together, and under
the causal mask the longest blocks of each group first (tile_order).

bf16 and f16 only: wgmma has no float32 operands (pallas_triton covers f32).
Hopper only: JAX's Mosaic GPU interpreter cannot run these kernels (see
NO_INTERPRETER); on CPU the tests lower them for a CUDA target instead.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.core import compat, precisions, registry, tuning, validation
from kernels.ops.attention import spec

IMPL = "pallas_mosaic"
SUPPORTED_DTYPES = ("bf16", "f16")
LOG2E = math.log2(math.e)
COMPUTE_WGS = 2  # consumer warpgroups per CTA; a third one is the TMA producer
# The streamed inputs of the heads whose CTAs run at once should sit in L2 together
# (tile_order). With batch as the fastest grid axis, the H100's 132 CTAs streamed 132 heads'
# K and V and the forward ran from DRAM (ncu: 81% of DRAM peak, 31% L2 hits; hd128 0.84x
# cuDNN). H100, same run, cuDNN's time over ours, 2026-11-25 (perf_tests/RESULTS.md), for
# hd128 fwd / bwd / causal fwd / causal bwd, hd64 the same: sequence blocks fastest, no
# groups 0.944 0.883 0.964 0.913 0.966 0.805 0.940 0.849; groups of 8 MiB 0.934 0.893 1.004
# 0.949 0.961 0.824 1.003 0.972 (16 MiB and 32 MiB a little behind). The non-causal forward
# keeps no groups (every block is as long, and it was 1% faster so).
L2_GROUP_BYTES = 8 << 20
# Registers per thread after setmaxnreg: 2 consumers x 232 + the producer's 40 = 504 of the 512
# a lane has across the CTA's three warpgroups. Asking for more blocks a warpgroup forever (240
# with 40 hung the H100); 240 with 24 ran the head_dim 128 forward no faster (0.94x cuDNN both).
CONSUMER_REGISTERS = 232
PRODUCER_REGISTERS = 40


@dataclasses.dataclass(frozen=True, kw_only=True)
class MosaicAttentionConfig:
    """Blocks and pipeline depths.

    Forward: block_q query rows per consumer warpgroup (a CTA holds 2 block_q),
    block_kv keys per streamed K/V block. dK/dV: block_kv_dkv keys per
    warpgroup, block_q_dkv queries per streamed block. dQ: block_q_dq rows per
    warpgroup, block_kv_dq keys per streamed block. Row counts of a warpgroup
    are wgmma M tiles: multiples of 64. fused_burst: the forward issues P V and
    the next block's Q K^T together (one wait per key block; one more S tile
    live in registers).
    """

    block_q: int = 64
    block_kv: int = 128
    max_concurrent_steps: int = 2
    block_q_dkv: int = 64
    block_kv_dkv: int = 64
    block_q_dq: int = 64
    block_kv_dq: int = 64
    max_concurrent_steps_bwd: int = 3
    fused_burst: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.fused_burst, bool):
            raise TypeError(f"fused_burst: expected True or False, got {self.fused_burst!r}")
        for name in ("block_q", "block_kv_dkv", "block_q_dq"):
            value = getattr(self, name)
            if value < 64 or value % 64:
                raise ValueError(f"{name}: expected a multiple of 64 (wgmma M), got {value}")
        validation.check_powers_of_two(self, ("block_q", "block_kv", "block_q_dkv",
                                              "block_kv_dkv", "block_q_dq", "block_kv_dq"),
                                       at_least=16)
        for name in ("max_concurrent_steps", "max_concurrent_steps_bwd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")

    @property
    def seq_multiple(self) -> int:
        """Sequences are padded to a multiple of this (every block of every kernel)."""
        return math.lcm(COMPUTE_WGS * self.block_q, self.block_kv, self.block_q_dkv,
                        COMPUTE_WGS * self.block_kv_dkv, COMPUTE_WGS * self.block_q_dq,
                        self.block_kv_dq)


# Forward at head_dim 128: Q 32 KiB + 2 stages of K and V 128 KiB of shared memory; the
# S tile and O accumulator take 128 of a consumer's CONSUMER_REGISTERS per thread.
# Measured on an H100 (bf16, batch 4, seq 4096, CUPTI, cold L2, cuDNN in the same run;
# perf_tests/RESULTS.md, 2026-11-25): head_dim 128 forward 0.84x cuDNN whatever the block_kv
# and depth (the 2026-11-24 tune: block_kv 64 with 2/3/4 stages 15-33% slower; 128 with 3
# stages does not fit), and JAX's attention_mgpu ordering tricks (an optimization_barrier
# before the schedule barrier, waiting for the next K block under the P V wgmma) changed it
# by under 0.5%. head_dim 64 has the room for block_kv 256: 0.915x -> 0.959x (causal 1.008x ->
# 1.028x). The backward's dQ kernel with 128-key blocks and 2 stages: 0.806x -> 0.833x at
# head_dim 128, 0.785x -> 0.810x at 64 (causal: 0.864x -> 0.863x, 0.895x -> 0.910x). After the
# grid change (2026-11-25, two runs): head_dim 64's dK/dV kernel streaming 128-query blocks
# 0.81x -> 0.86x (causal 0.96x -> 1.00x); at 128 it lost (0.90x -> 0.80x), and a third stage
# does not fit there; 64-key dQ blocks and deeper rings changed nothing at 64.
#
# 2026-11-25 (fourth session; H100, same runs, perf_tests/RESULTS.md): independent wgmmas issued
# before the elementwise work that does not need them. dQ kernel: dP with S, the exp2 under it;
# dK/dV kernel: dP^T with S^T, then dV with dK after dS^T. Backward hd128 unchanged (0.90x),
# causal 0.94x -> 0.98x, hd64 0.86x -> 0.94x, causal 1.01x -> 1.12x. Forward (fused_burst):
# P V and the next block's Q K^T issued together, one wait for both, the other warpgroup's
# softmax under them: hd128 0.94x -> 0.97x, causal 1.00x -> 1.01x; hd64 0.99x -> 0.83x (its
# 256-key S tile), so off there.
GPU_DEFAULTS = {
    128: MosaicAttentionConfig(block_kv_dq=128, max_concurrent_steps_bwd=2, fused_burst=True),
    64: MosaicAttentionConfig(block_kv=256, block_q_dkv=128, block_kv_dq=128,
                              max_concurrent_steps_bwd=2),
}
GPU_DEFAULT = GPU_DEFAULTS[128]
TUNING_CASE = "bf16-4x4096x16x128"


def default_config(head_dim: int = 128) -> MosaicAttentionConfig:
    """The measured default for `head_dim`, with this GPU model's tuned forward blocks
    (tuned.json) at the head_dim they were tuned at."""
    if head_dim not in GPU_DEFAULTS:
        raise ValueError(f"head_dim: expected one of 64, 128 (Mosaic attention), got {head_dim}")
    config = GPU_DEFAULTS[head_dim]
    if head_dim == spec.OPERATION.case(TUNING_CASE)["head_dim"]:
        config = tuning.tuned_config(spec.NAME, IMPL, config) or config
    return config


def _smem_layout():
    """TMA/wgmma layout of a (rows, head_dim) 16-bit tile: 128-byte swizzle, (8, 64) tiles."""
    plgpu = compat.pallas_mosaic_gpu()
    return plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)


def _when(condition, body) -> None:
    """pl.when for traced conditions; a plain `if` for Python ones."""
    if isinstance(condition, bool):
        if condition:
            body()
    else:
        pl.when(condition)(body)


def _int(x) -> jax.Array | int:
    """A loop bound as int32 (Python ints pass through)."""
    return x if isinstance(x, int) else x.astype(jnp.int32)


def _produce(streams, start, count, stages: int) -> None:
    """The producer warpgroup: TMA blocks start .. start + count - 1 of every stream into
    slot (step % stages) of its ring, waiting for the consumers to free the slot first.

    streams: (source(i) -> gmem ref of block i, ring, ready barriers, freed barriers or
    None when another stream's wait on the same step already covers this one).
    """
    plgpu = compat.pallas_mosaic_gpu()

    def issue(step, slot, wait: bool):
        for source, ring, ready, freed in streams:
            if wait and freed is not None:
                plgpu.barrier_wait(freed.at[slot])
            plgpu.copy_gmem_to_smem(source(start + step), ring.at[slot], ready.at[slot])

    for step in range(stages):
        _when(step < count, functools.partial(issue, step, step, False))
    if isinstance(count, int) and count <= stages:
        return

    @pl.loop(stages, count)
    def _steady(step):
        issue(step, lax.rem(step, jnp.int32(stages)), True)


def _mask(shape, row_start, col_start, seq: int, causal: bool, *, transposed: bool = False):
    """Allowed (query, key) pairs of a block in WGMMA layout: key < seq, and key <= query
    when causal. Rows are queries, columns keys (the reverse when `transposed`)."""
    plgpu = compat.pallas_mosaic_gpu()
    rows = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA) + row_start
    cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA) + col_start
    queries, keys = (cols, rows) if transposed else (rows, cols)
    ok = keys < seq
    if causal:
        ok = ok & (keys <= queries)
    return ok


def _key_steps(q_start, q_rows: int, block_kv: int, seq: int, causal: bool):
    """(key blocks visited, leading ones that need no mask) for queries
    q_start .. q_start + q_rows - 1."""
    total, unmasked = pl.cdiv(seq, block_kv), seq // block_kv
    if causal:
        total = jnp.minimum(total, pl.cdiv(q_start + q_rows, block_kv))
        unmasked = jnp.minimum(unmasked, (q_start + 1) // block_kv)
    return total, unmasked


def tile_order(linear, batch: int, heads: int, count: int, group: int, longest: str | None):
    """(batch, head, block) of the CTA that starts `linear`-th (a Python int or a traced
    int32 scalar alike).

    Heads (batch * heads of them) go in groups of `group`; inside a group the CTAs go block
    rank by block rank, each rank across the group's heads. So the CTAs running at once stream
    the inputs of about `group` heads, which share L2, and when `longest` says where the
    longest blocks are ("last": query blocks under the causal mask; "first": key blocks, whose
    dK/dV see every later query) they start first in every group and the shortest make the
    tail; with `longest` None, blocks keep their order."""
    total = batch * heads
    group = max(1, min(group, total))
    per_group = group * count
    g = lax.div(linear, per_group)
    size = jnp.minimum(group, total - g * group)  # the last group may be smaller
    within = linear - g * per_group
    rank, member = lax.div(within, size), lax.rem(within, size)
    head_index = g * group + member
    block = count - 1 - rank if longest == "last" else rank
    return lax.div(head_index, heads), lax.rem(head_index, heads), block


def _tile(axis: str, count: int, like, longest: str | None, group_bytes: int = L2_GROUP_BYTES):
    """This CTA's (batch, head, block along `axis`) in `tile_order`; `like` is a (batch, seq,
    heads, head_dim) input, which sets the sizes. The grid (batch, heads, blocks) is launched
    reversed, blocks as CUDA's x, so CTAs start in the order of (batch * heads + head) *
    count + block; `group_bytes` of streamed inputs (K and V, or Q and dO: two of `like`'s
    per-head slices) sets the group (0: one head)."""
    batch, seq_pad, heads, head_dim = like.shape
    head_bytes = 2 * seq_pad * head_dim * jnp.dtype(like.dtype).itemsize
    linear = ((lax.axis_index("batch") * heads + lax.axis_index("heads")) * count
              + lax.axis_index(axis))
    return tile_order(linear, batch, heads, count, max(1, group_bytes // head_bytes), longest)


def attention_forward_kernel(
    # Inputs
    q_ref, k_ref, v_ref,
    # Outputs
    o_ref, lse_ref,
    # Scratch
    qo_smem, k_smem, v_smem, lse_smem,
    q_ready, k_ready, v_ready, k_freed, v_freed, schedule,
    *,
    seq: int, causal: bool, config: MosaicAttentionConfig,
):
    plgpu = compat.pallas_mosaic_gpu()
    bq, bk, stages = config.block_q, config.block_kv, config.max_concurrent_steps
    seq_pad, head_dim = q_ref.shape[1], q_ref.shape[-1]
    dtype = q_ref.dtype
    c = LOG2E * spec.scale_of(head_dim)
    wg = lax.axis_index("wg")
    batch, head, block = _tile("q_blocks", seq_pad // (COMPUTE_WGS * bq), k_ref,
                               "last" if causal else None, L2_GROUP_BYTES if causal else 0)
    cta_q = block * (COMPUTE_WGS * bq)
    steps, unmasked = _key_steps(cta_q, COMPUTE_WGS * bq, bk, seq, causal)

    def schedule_sync():
        plgpu.barrier_arrive(schedule)
        plgpu.barrier_wait(schedule)

    @pl.when(wg < COMPUTE_WGS)
    def _consumer():
        plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
        q_smem = qo_smem.at[wg]
        q_start = cta_q + wg * bq
        rows = (batch, pl.ds(q_start, bq), head)
        plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, q_ready.at[wg])
        plgpu.barrier_wait(q_ready.at[wg])
        row_layout = plgpu.Layout.WGMMA.reduce(1)
        m = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), row_layout)
        row_sum = plgpu.layout_cast(jnp.full((bq,), 0.0, jnp.float32), row_layout)
        acc = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32),
                                plgpu.Layout.WGMMA)

        # Ping-pong: warpgroup 1 starts half a round late.
        pl.when(wg == 1)(schedule_sync)

        def softmax(i, s, carry, masked: bool):
            """P (input dtype) of logits block i, and the statistics and output rescaled."""
            acc, m, row_sum = carry
            if masked:
                s = jnp.where(_mask((bq, bk), q_start, i * bk, seq, causal), s, -jnp.inf)
            # Base 2, logits scaled by c = log2(e) / sqrt(d): exp2(s c - m) is one FMA + ex2.
            # Every row has an allowed key in the first block (key 0), so m is finite from
            # then on and exp2(-inf - m) is 0, never NaN.
            m_new = jnp.maximum(m, s.max(axis=1) * c)
            alpha = jnp.exp2(m - m_new)
            p = jnp.exp2(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            row_sum = row_sum * alpha + p.sum(axis=1)
            return p.astype(dtype), (acc, m_new, row_sum)

        def step(i, carry, masked: bool):
            slot = lax.rem(i, jnp.int32(stages))
            plgpu.barrier_wait(k_ready.at[slot])

            def qk(s_ref):
                plgpu.wgmma(s_ref, q_smem, k_smem.at[slot].T)
                schedule_sync()  # the other warpgroup's softmax runs under this matmul
                return s_ref[...]

            s = pl.run_scoped(qk, plgpu.ACC((bq, bk), jnp.float32))
            plgpu.barrier_arrive(k_freed.at[slot])
            p16, (acc, m, row_sum) = softmax(i, s, carry, masked)
            plgpu.barrier_arrive(schedule)  # softmax done
            plgpu.barrier_wait(v_ready.at[slot])
            plgpu.barrier_wait(schedule)  # the other warpgroup's matmuls have been issued

            def pv(acc_ref):
                plgpu.wgmma(acc_ref, p16, v_smem.at[slot])

            acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_freed.at[slot])
            return acc, m, row_sum

        def burst_step(i, carry, masked: bool, last: bool = False):
            # P_i V_i and the next block's S = Q K_{i+1}^T go to the tensor cores together,
            # one wait for both; the other warpgroup's softmax runs under them.
            *stats, s = carry
            p16, (acc, m, row_sum) = softmax(i, s, stats, masked)
            slot = lax.rem(i, jnp.int32(stages))
            following = lax.rem(i + 1, jnp.int32(stages))
            plgpu.barrier_arrive(schedule)  # softmax done
            plgpu.barrier_wait(v_ready.at[slot])
            if not last:
                plgpu.barrier_wait(k_ready.at[following])
            plgpu.barrier_wait(schedule)  # the other warpgroup's matmuls have been issued

            def burst(refs):
                plgpu.wgmma(refs[0], p16, v_smem.at[slot])
                if not last:
                    plgpu.wgmma(refs[1], q_smem, k_smem.at[following].T)
                schedule_sync()

            refs = [plgpu.ACC.init(acc)]
            if not last:
                refs.append(plgpu.ACC.init(plgpu.layout_cast(
                    jnp.full((bq, bk), 0.0, jnp.float32), plgpu.Layout.WGMMA)))
            acc, *s = pl.run_state(burst)(tuple(refs))
            plgpu.barrier_arrive(v_freed.at[slot])
            if last:
                return acc, m, row_sum
            plgpu.barrier_arrive(k_freed.at[following])
            return acc, m, row_sum, s[0]

        carry = (acc, m, row_sum)
        if not config.fused_burst:
            carry = lax.fori_loop(0, _int(unmasked), functools.partial(step, masked=False),
                                  carry)
            if causal or seq % bk:
                carry = lax.fori_loop(_int(unmasked), _int(steps),
                                      functools.partial(step, masked=True), carry)
        else:
            plgpu.barrier_wait(k_ready.at[0])

            def first_qk(s_ref):
                plgpu.wgmma(s_ref, q_smem, k_smem.at[0].T)
                return s_ref[...]

            carry = (*carry, pl.run_scoped(first_qk, plgpu.ACC((bq, bk), jnp.float32)))
            plgpu.barrier_arrive(k_freed.at[0])
            split = jnp.minimum(unmasked, steps - 1)
            carry = lax.fori_loop(0, _int(split), functools.partial(burst_step, masked=False),
                                  carry)
            if causal or seq % bk:
                carry = lax.fori_loop(_int(split), _int(steps - 1),
                                      functools.partial(burst_step, masked=True), carry)
            carry = burst_step(steps - 1, carry, masked=bool(causal or seq % bk), last=True)
        acc, m, row_sum = carry
        pl.when(wg == 0)(schedule_sync)

        acc = acc * lax.broadcast_in_dim(1.0 / row_sum, acc.shape, [0])
        q_smem[...] = acc.astype(dtype)  # Q is no longer read: its buffer stages O
        lse_smem.at[wg][...] = m + jnp.log(row_sum) * (1.0 / math.log(2.0))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, o_ref.at[rows])
        plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[batch, head, pl.ds(q_start, bq)])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == COMPUTE_WGS)
    def _producer():
        plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")

        def block(ref, i):
            return ref.at[batch, pl.ds(i * bk, bk), head]

        _produce([(functools.partial(block, k_ref), k_smem, k_ready, k_freed),
                  (functools.partial(block, v_ref), v_smem, v_ready, v_freed)],
                 0, steps, stages)


def attention_backward_kernel_dkv(
    # Inputs
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
    # Outputs
    dk_ref, dv_ref,
    # Scratch
    k_smem, v_smem, q_ring, do_ring, lse_ring, delta_ring,
    kv_ready, q_ready, do_ready, lse_ready, delta_ready, freed,
    *,
    seq: int, causal: bool, config: MosaicAttentionConfig,
):
    plgpu = compat.pallas_mosaic_gpu()
    bq, bk, stages = config.block_q_dkv, config.block_kv_dkv, config.max_concurrent_steps_bwd
    seq_pad, head_dim = q_ref.shape[1], q_ref.shape[-1]
    dtype = q_ref.dtype
    scale = spec.scale_of(head_dim)
    c = LOG2E * scale
    wg = lax.axis_index("wg")
    batch, head, block = _tile("kv_blocks", seq_pad // (COMPUTE_WGS * bk), q_ref,
                               "first" if causal else None)
    cta_k = block * (COMPUTE_WGS * bk)
    end = pl.cdiv(seq, bq)  # query blocks past seq hold only padding: zero dO, no effect
    if causal:
        first = cta_k // bq  # query blocks wholly before this CTA's first key see none of it
        unmasked_from = jnp.minimum(pl.cdiv(cta_k + COMPUTE_WGS * bk - 1, bq), end)
    else:
        first, unmasked_from = 0, 0
    steps = end - first

    @pl.when(wg < COMPUTE_WGS)
    def _consumer():
        plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
        k_wg, v_wg = k_smem.at[wg], v_smem.at[wg]
        k_start = cta_k + wg * bk
        rows = (batch, pl.ds(k_start, bk), head)
        plgpu.copy_gmem_to_smem(k_ref.at[rows], k_wg, kv_ready.at[wg])
        plgpu.copy_gmem_to_smem(v_ref.at[rows], v_wg, kv_ready.at[COMPUTE_WGS + wg])
        plgpu.barrier_wait(kv_ready.at[wg])
        plgpu.barrier_wait(kv_ready.at[COMPUTE_WGS + wg])
        col_layout = plgpu.Layout.WGMMA.reduce(0)

        def step(i, carry, masked: bool):
            dk, dv = carry
            slot = lax.rem(i - first, jnp.int32(stages))
            q_blk, do_blk = q_ring.at[slot], do_ring.at[slot]
            for ready in (q_ready, lse_ready, do_ready):
                plgpu.barrier_wait(ready.at[slot])

            def p_t(st):
                lse = compat.mosaic_gpu_load(lse_ring.at[slot], layout=col_layout)
                pt = jnp.exp2(st * c - lax.broadcast_in_dim(lse, st.shape, [1]))
                if masked:
                    pt = jnp.where(_mask((bk, bq), k_start, i * bq, seq, causal,
                                         transposed=True), pt, 0.0)
                return pt

            def s_t_dp_t(st_ref, dpt_ref):
                # dP^T does not depend on P^T: issued with S^T, it runs under the exp2.
                plgpu.wgmma(st_ref, k_wg, q_blk.T)
                plgpu.wgmma(dpt_ref, v_wg, do_blk.T)
                pt = p_t(plgpu.wgmma_accumulator_load(st_ref, wait_n=1))
                return pt, plgpu.wgmma_accumulator_load(dpt_ref, wait_n=0)

            acc = plgpu.ACC((bk, bq), jnp.float32)
            pt, dpt = pl.run_scoped(s_t_dp_t, acc, acc)
            plgpu.barrier_wait(delta_ready.at[slot])
            delta = compat.mosaic_gpu_load(delta_ring.at[slot], layout=col_layout)
            # dS^T before the dV wgmma, not under it: under it, the dV and dK accumulators,
            # P^T, dP^T and dS^T are live at once (H100: 0.86x cuDNN against 0.90x at
            # head_dim 128).
            dst = (pt * (dpt - lax.broadcast_in_dim(delta, dpt.shape, [1]))).astype(dtype)

            def dv_dk(refs):
                plgpu.wgmma(refs[0], pt.astype(dtype), do_blk)
                plgpu.wgmma(refs[1], dst, q_blk)

            dv, dk = pl.run_state(dv_dk)((plgpu.ACC.init(dv), plgpu.ACC.init(dk)))
            plgpu.barrier_arrive(freed.at[slot])
            return dk, dv

        zeros = plgpu.layout_cast(jnp.full((bk, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)
        carry = (zeros, zeros)
        if causal:
            carry = lax.fori_loop(_int(first), _int(unmasked_from),
                                  functools.partial(step, masked=True), carry)
        carry = lax.fori_loop(_int(unmasked_from), _int(end),
                              functools.partial(step, masked=False), carry)
        dk, dv = carry
        k_wg[...] = (dk * scale).astype(dtype)  # K and V are no longer read: they stage dK, dV
        v_wg[...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_wg, dk_ref.at[rows])
        plgpu.copy_smem_to_gmem(v_wg, dv_ref.at[rows])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == COMPUTE_WGS)
    def _producer():
        plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")

        def block(ref, i):
            return ref.at[batch, pl.ds(i * bq, bq), head]

        def stats(ref, i):
            return ref.at[batch, head, pl.ds(i * bq, bq)]

        _produce([(functools.partial(block, q_ref), q_ring, q_ready, freed),
                  (functools.partial(stats, lse_ref), lse_ring, lse_ready, None),
                  (functools.partial(block, do_ref), do_ring, do_ready, None),
                  (functools.partial(stats, delta_ref), delta_ring, delta_ready, None)],
                 first, steps, stages)


def attention_backward_kernel_dq(
    # Inputs
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
    # Outputs
    dq_ref,
    # Scratch
    q_smem, do_smem, lse_smem, delta_smem, k_ring, v_ring,
    row_ready, k_ready, v_ready, freed,
    *,
    seq: int, causal: bool, config: MosaicAttentionConfig,
):
    plgpu = compat.pallas_mosaic_gpu()
    bq, bk, stages = config.block_q_dq, config.block_kv_dq, config.max_concurrent_steps_bwd
    seq_pad, head_dim = q_ref.shape[1], q_ref.shape[-1]
    dtype = q_ref.dtype
    scale = spec.scale_of(head_dim)
    c = LOG2E * scale
    wg = lax.axis_index("wg")
    batch, head, block = _tile("q_blocks", seq_pad // (COMPUTE_WGS * bq), k_ref,
                               "last" if causal else None)
    cta_q = block * (COMPUTE_WGS * bq)
    # Padded keys are masked as in the forward: their P = exp2(-lse) overflows to inf when
    # every real logit of a row is very negative, and inf * 0 (zero key row) is NaN in dQ.
    steps, unmasked = _key_steps(cta_q, COMPUTE_WGS * bq, bk, seq, causal)

    @pl.when(wg < COMPUTE_WGS)
    def _consumer():
        plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
        q_wg, do_wg = q_smem.at[wg], do_smem.at[wg]
        q_start = cta_q + wg * bq
        rows = (batch, pl.ds(q_start, bq), head)
        stats = (batch, head, pl.ds(q_start, bq))
        loads = ((q_ref.at[rows], q_wg), (do_ref.at[rows], do_wg),
                 (lse_ref.at[stats], lse_smem.at[wg]), (delta_ref.at[stats], delta_smem.at[wg]))
        for j, (source, target) in enumerate(loads):
            plgpu.copy_gmem_to_smem(source, target, row_ready.at[j * COMPUTE_WGS + wg])
        for j in range(len(loads)):
            plgpu.barrier_wait(row_ready.at[j * COMPUTE_WGS + wg])
        row_layout = plgpu.Layout.WGMMA.reduce(1)
        lse = compat.mosaic_gpu_load(lse_smem.at[wg], layout=row_layout)
        delta = compat.mosaic_gpu_load(delta_smem.at[wg], layout=row_layout)

        def step(i, dq, masked: bool):
            slot = lax.rem(i, jnp.int32(stages))
            k_blk, v_blk = k_ring.at[slot], v_ring.at[slot]
            plgpu.barrier_wait(k_ready.at[slot])
            plgpu.barrier_wait(v_ready.at[slot])

            def s_dp(s_ref, dp_ref):
                # dP does not depend on P: issued with S, it runs under the exp2.
                plgpu.wgmma(s_ref, q_wg, k_blk.T)
                plgpu.wgmma(dp_ref, do_wg, v_blk.T)
                s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)
                p = jnp.exp2(s * c - lax.broadcast_in_dim(lse, s.shape, [0]))
                if masked:
                    p = jnp.where(_mask((bq, bk), q_start, i * bk, seq, causal), p, 0.0)
                return p, plgpu.wgmma_accumulator_load(dp_ref, wait_n=0)

            acc = plgpu.ACC((bq, bk), jnp.float32)
            p, dp = pl.run_scoped(s_dp, acc, acc)
            ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))

            def dq_update(dq_ref):
                plgpu.wgmma(dq_ref, ds.astype(dtype), k_blk)

            dq = pl.run_state(dq_update)(plgpu.ACC.init(dq))
            plgpu.barrier_arrive(freed.at[slot])
            return dq

        dq = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)
        dq = lax.fori_loop(0, _int(unmasked), functools.partial(step, masked=False), dq)
        if causal or seq % bk:
            dq = lax.fori_loop(_int(unmasked), _int(steps), functools.partial(step, masked=True),
                               dq)
        q_wg[...] = (dq * scale).astype(dtype)  # Q is no longer read: its buffer stages dQ
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_wg, dq_ref.at[rows])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == COMPUTE_WGS)
    def _producer():
        plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")

        def block(ref, i):
            return ref.at[batch, pl.ds(i * bk, bk), head]

        _produce([(functools.partial(block, k_ref), k_ring, k_ready, freed),
                  (functools.partial(block, v_ref), v_ring, v_ready, None)],
                 0, steps, stages)


def _launch(body, inputs, out_type, scratch, grid, grid_names, interpret: bool):
    """`body` over `grid` = (batch, heads, sequence blocks); Mosaic GPU launches it reversed,
    the blocks as CUDA's x, the fastest-varying, and `_tile` maps the start order to tiles."""
    plgpu = compat.pallas_mosaic_gpu()
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch,
        grid=grid,
        grid_names=grid_names,
        num_threads=COMPUTE_WGS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=compat.mosaic_gpu_interpret_params() if interpret else False,
    )(*inputs)


def _pad(x: jax.Array, seq_pad: int, axis: int = 1) -> jax.Array:
    if x.shape[axis] == seq_pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, seq_pad - x.shape[axis])
    return jnp.pad(x, widths)


def _padded_length(seq: int, config: MosaicAttentionConfig) -> int:
    return pl.cdiv(seq, config.seq_multiple) * config.seq_multiple


def _forward(q, k, v, causal: bool, config: MosaicAttentionConfig, interpret: bool):
    """(o, lse): o like q; lse (batch, heads, padded seq) float32, base 2, over the logits
    scaled by 1/sqrt(d)."""
    plgpu = compat.pallas_mosaic_gpu()
    batch, seq, heads, head_dim = q.shape
    seq_pad = _padded_length(seq, config)
    bq, bk, stages = config.block_q, config.block_kv, config.max_concurrent_steps
    stages = min(stages, pl.cdiv(seq, bk))
    config = dataclasses.replace(config, max_concurrent_steps=stages)
    layout = _smem_layout()
    scratch = [
        plgpu.SMEM((COMPUTE_WGS, bq, head_dim), q.dtype, transforms=layout),
        plgpu.SMEM((stages, bk, head_dim), q.dtype, transforms=layout),
        plgpu.SMEM((stages, bk, head_dim), q.dtype, transforms=layout),
        plgpu.SMEM((COMPUTE_WGS, bq), jnp.float32),
        plgpu.Barrier(num_barriers=COMPUTE_WGS),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages),
        plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages),
        plgpu.Barrier(num_arrivals=COMPUTE_WGS),
    ]
    o, lse = _launch(
        functools.partial(attention_forward_kernel, seq=seq, causal=causal, config=config),
        [_pad(x, seq_pad) for x in (q, k, v)],
        (jax.ShapeDtypeStruct((batch, seq_pad, heads, head_dim), q.dtype),
         jax.ShapeDtypeStruct((batch, heads, seq_pad), jnp.float32)),
        scratch, (batch, heads, seq_pad // (COMPUTE_WGS * bq)), ("batch", "heads", "q_blocks"),
        interpret)
    return o[:, :seq], lse


def _backward(q, k, v, o, lse, do, causal: bool, config: MosaicAttentionConfig,
              interpret: bool):
    plgpu = compat.pallas_mosaic_gpu()
    batch, seq, heads, head_dim = q.shape
    seq_pad = lse.shape[-1]
    stages = config.max_concurrent_steps_bwd
    delta = jnp.einsum("bshd,bshd->bhs", o.astype(jnp.float32), do.astype(jnp.float32))
    inputs = [_pad(x, seq_pad) for x in (q, k, v, do)] + [lse, _pad(delta, seq_pad, axis=2)]
    padded = jax.ShapeDtypeStruct((batch, seq_pad, heads, head_dim), q.dtype)
    layout = _smem_layout()
    options = dict(seq=seq, causal=causal)

    bq, bk = config.block_q_dkv, config.block_kv_dkv
    dkv_stages = min(stages, pl.cdiv(seq, bq))
    dk, dv = _launch(
        functools.partial(attention_backward_kernel_dkv, **options,
                          config=dataclasses.replace(config, max_concurrent_steps_bwd=dkv_stages)),
        inputs, (padded, padded),
        [plgpu.SMEM((COMPUTE_WGS, bk, head_dim), q.dtype, transforms=layout),
         plgpu.SMEM((COMPUTE_WGS, bk, head_dim), q.dtype, transforms=layout),
         plgpu.SMEM((dkv_stages, bq, head_dim), q.dtype, transforms=layout),
         plgpu.SMEM((dkv_stages, bq, head_dim), q.dtype, transforms=layout),
         plgpu.SMEM((dkv_stages, bq), jnp.float32),
         plgpu.SMEM((dkv_stages, bq), jnp.float32),
         plgpu.Barrier(num_barriers=2 * COMPUTE_WGS),
         *(plgpu.Barrier(num_barriers=dkv_stages) for _ in range(4)),
         plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=dkv_stages)],
        (batch, heads, seq_pad // (COMPUTE_WGS * bk)), ("batch", "heads", "kv_blocks"),
        interpret)

    bq, bk = config.block_q_dq, config.block_kv_dq
    dq_stages = min(stages, pl.cdiv(seq, bk))
    dq = _launch(
        functools.partial(attention_backward_kernel_dq, **options,
                          config=dataclasses.replace(config, max_concurrent_steps_bwd=dq_stages)),
        inputs, padded,
        [plgpu.SMEM((COMPUTE_WGS, bq, head_dim), q.dtype, transforms=layout),
         plgpu.SMEM((COMPUTE_WGS, bq, head_dim), q.dtype, transforms=layout),
         plgpu.SMEM((COMPUTE_WGS, bq), jnp.float32),
         plgpu.SMEM((COMPUTE_WGS, bq), jnp.float32),
         plgpu.SMEM((dq_stages, bk, head_dim), q.dtype, transforms=layout),
         plgpu.SMEM((dq_stages, bk, head_dim), q.dtype, transforms=layout),
         plgpu.Barrier(num_barriers=4 * COMPUTE_WGS),
         plgpu.Barrier(num_barriers=dq_stages),
         plgpu.Barrier(num_barriers=dq_stages),
         plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=dq_stages)],
        (batch, heads, seq_pad // (COMPUTE_WGS * bq)), ("batch", "heads", "q_blocks"),
        interpret)
    return dq[:, :seq], dk[:, :seq], dv[:, :seq]


_attention_jit = spec.flash_attention_vjp(_forward, _backward)


# Why no case runs on CPU. Tried on jax 0.10.2 with InterpretGPUParams (bf16 1x37x1x64, causal):
# "NotImplementedError: Higher-order primitive run_state"; its wgmma also reads the A operand
# only from a shared-memory allocation, and this kernel keeps P and dS in registers.
NO_INTERPRETER = (
    "needs a Hopper GPU: JAX's Mosaic GPU interpreter cannot run this kernel (no pl.run_state "
    "for register-carried wgmma accumulators, no wgmma A operand from registers, which the "
    "FA3 P V and dS K products use); on CPU, test_pallas_attention.py lowers it for sm_90a "
    "instead")


def supports(case: registry.Case) -> str | None:
    if case.dtype not in SUPPORTED_DTYPES:
        return (f"Mosaic GPU wgmma takes bf16/f16 operands, not {case.dtype}; pallas_triton "
                f"covers f32")
    if not compat.on_gpu():
        return NO_INTERPRETER
    return None


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
              config: MosaicAttentionConfig | None = None,
              interpret: bool = False) -> jax.Array:
    """softmax(Q K^T / sqrt(d) + mask) V for bf16/f16 (batch, seq, heads, head_dim) inputs on
    Hopper; differentiable.

    Args:
      causal: mask key j > query i.
      config: blocks and pipeline depths; `default_config(head_dim)` when None.
      interpret: run JAX's Mosaic GPU interpreter (jax 0.10.2's cannot: see NO_INTERPRETER).
    Returns:
      An array of q's shape and dtype.
    """
    spec.validate(q, k, v, causal)
    if str(q.dtype) not in ("bfloat16", "float16"):
        raise TypeError(f"q: expected dtype bfloat16 or float16 (wgmma operands), got {q.dtype}")
    validation.check_config(config, MosaicAttentionConfig)
    validation.check_flag("interpret", interpret)
    if not interpret and not compat.on_gpu():
        raise RuntimeError(NO_INTERPRETER)
    config = config or default_config(q.shape[-1])
    return _attention_jit(q, k, v, bool(causal), config, interpret)


# Forward key block and pipeline depth (shared memory at head_dim 128: Q 32 KiB plus 64 KiB
# of K and V per stage at block_kv 128, 32 KiB at 64), timed on the issue's bf16 case.
TUNING_CANDIDATES = tuple(
    dataclasses.replace(GPU_DEFAULT, block_kv=block_kv, max_concurrent_steps=steps)
    for block_kv, steps in [(128, 2), (128, 3), (64, 2), (64, 3), (64, 4)])
tuning.register_tunable(spec.NAME, IMPL, functools.partial(
    tuning.sweep, spec.NAME, IMPL, TUNING_CANDIDATES, TUNING_CASE))

registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name=IMPL,
    fn=attention,
    precision=precisions.NO_FLOAT32,  # wgmma on bf16/f16 (supports)
    requires=registry.Requirements(min_compute_capability=(9, 0)),
    supports=supports,
    description="Pallas Mosaic GPU: FlashAttention-3 forward (TMA K/V ring, 2 ping-pong "
                "wgmma consumer warpgroups, exp2 online softmax), wgmma dK/dV and dQ "
                "backward kernels; zero-padded ragged sequences; custom VJP",
))
