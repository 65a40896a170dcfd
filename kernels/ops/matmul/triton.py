"""Matmul in Triton: tiled C = A @ B with grouped tile order and float32 accumulation, autotuned.

Each program computes one block_m x block_n tile of C, walking K in steps of
block_k with a software pipeline of `num_stages` loads in flight. Programs are
numbered in super-groups of `group_m` tile rows, so that tiles running at the
same time share rows of A and columns of B in L2 (the grouped ordering of
Triton's matmul tutorial). Rows of A and columns of B past the edge are read
wrapped around (their results are never stored), so only the K tail needs a
masked load, and only when K is not a multiple of block_k. The tile shape
is chosen by `triton.autotune` over a small set keyed on (M, N, K), except
where a config is given, or for float32 where this GPU model has a tuned one
(`python -m kernels tune matmul --impl triton:f32`, F32_TUNING_CANDIDATES).

The backward reuses the same kernel on transposed views: dA = dC B^T and
dB = A^T dC (the kernel takes any strides). float32 operands are multiplied
in TF32, which the operation's float32 tolerance allows for.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from kernels.core import compat, environment, frameworks, precisions, registry, tuning, validation
from kernels.ops.matmul import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

compat.patch_triton_interpreter()


MatmulConfig = spec.TileConfig


def _to_triton(config: MatmulConfig) -> triton.Config:
    return triton.Config({"BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                          "BLOCK_K": config.block_k, "GROUP_M": config.group_m},
                         num_warps=config.num_warps, num_stages=config.num_stages)


# Hopper-sized tiles (wgmma wants 64-row multiples per warp group; 128 x 256 x 64 with 3
# stages is 144 KiB of shared memory in bf16) and two smaller ones for small or f32 products.
GPU_CONFIGS = (
    MatmulConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
    MatmulConfig(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
    MatmulConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
    MatmulConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4),
    MatmulConfig(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=4),
    MatmulConfig(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=3),
)
# The interpreter would time every config by running it in NumPy: one small tile, so the
# tiny CPU cases still take several tiles and a K tail.
INTERPRETER_CONFIGS = (MatmulConfig(block_m=64, block_n=64, block_k=32, group_m=2, num_warps=4,
                                    num_stages=1),)


def _configs() -> list[triton.Config]:
    interpreting = os.environ.get("TRITON_INTERPRET", "") == "1"
    return [_to_triton(c) for c in (INTERPRETER_CONFIGS if interpreting else GPU_CONFIGS)]


# Shared memory a config may fill with its pipelined A and B tiles (H100: 227 KiB a block).
SHARED_MEMORY_BYTES = 200 * 1024


def _fits(configs, named_args, **kwargs):
    """Drop tiles larger than the problem (a 128 x 256 tile for a 1-column product wastes
    the whole launch) or than shared memory (f32 tiles), keeping at least the smallest."""
    m, n = named_args["M"], named_args["N"]
    itemsize = named_args["a_ptr"].element_size()
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, triton.next_power_of_2(m))
            and c.kwargs["BLOCK_N"] <= max(64, triton.next_power_of_2(n))
            and c.num_stages * itemsize * c.kwargs["BLOCK_K"] * (
                c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) <= SHARED_MEMORY_BYTES]
    return kept or configs[-1:]


# cache_results: the choice is kept on disk (Triton's cache, keyed by the kernel's source, the
# configs and the shape), so every process runs the config the first one picked. Without it
# each process autotuned afresh and near-tied configs swapped between processes: on the H100
# the same commit read 0.94-1.04x of itself from one process to the next (gate-power,
# 2026-11-26), which a 2% gate cannot see through. Not kept by a pytest worker that shares the
# GPU with others' checks (environment.device_shared): a choice timed under their load is
# kept by nobody. One was: the check of 8192^3 in bf16 autotuned beside 8 workers, and the perf
# item, reading that choice, ran at 0.842x XLA in two cold `pytest -m gpu` runs where the
# bring-up's runs read 0.897-0.901x (H200, 2026-12-02). The perf items' worker autotunes alone.
@triton.autotune(configs=_configs(), key=["M", "N", "K"], prune_configs_by={
    "early_config_prune": _fits}, cache_results=not environment.device_shared())
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def matmul_kernel(
    # Inputs
    a_ptr, b_ptr,
    # Outputs
    c_ptr,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Grouped order: GROUP_M tile rows are swept column by column before moving on.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    first_m = (pid // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Wrapped rows/columns keep every A and B load in bounds without a mask.
    rows = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    cols = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :].to(tl.int64) * stride_bn

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# The float32 (TF32) grid `python -m kernels tune matmul` times on the f32 4096^3 case, as
# "triton:f32" in tuned.json. float32 tiles take twice the shared memory of 16-bit ones per
# stage ((block_m + block_n) block_k 4 B), so the autotune set above keeps only its two
# smallest tiles for f32 (64x128x32 and 64x64x32, both here): 50 TFLOP/s on the H200, an
# eighth of cuBLAS's TF32 (issue 51). These are the tiles that fit at 4 bytes, up to 192 KiB
# (128x128x64 in 3 stages), with TF32's k-step of 8 in mind (block_k 16 or 32 keeps more
# stages in flight for the same bytes).
F32_TUNING_CASE = "f32-4096x4096x4096"
F32_TUNING_CANDIDATES = tuple(
    MatmulConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (64, 128, 32, 4, 4), (64, 64, 32, 4, 3),  # the autotune's f32 choices today
        (128, 128, 32, 8, 3), (128, 128, 32, 4, 4), (128, 256, 32, 8, 3),
        (256, 128, 32, 8, 3), (128, 128, 64, 8, 3), (128, 256, 16, 8, 4),
        (128, 64, 32, 4, 4),
    ])


@functools.cache
def _tuned_f32(device_name: str) -> MatmulConfig | None:
    """This GPU model's tuned float32 tiles (tuned.json, "triton:f32"), or None: autotune.
    Read once per process and model: a launch must not parse a file."""
    return tuning.tuned_config(spec.NAME, "triton", F32_TUNING_CANDIDATES[0],
                               model=tuning.model_key(device_name), variant="f32")


def _fitted(config: MatmulConfig, m: int, n: int, k: int) -> MatmulConfig:
    """`config` with tiles no larger than the problem needs (at least tl.dot's 16)."""
    fit = lambda block, size: max(16, min(block, triton.next_power_of_2(size)))  # noqa: E731
    return dataclasses.replace(config, block_m=fit(config.block_m, m),
                               block_n=fit(config.block_n, n), block_k=fit(config.block_k, k))


def default_tiles(dtype: torch.dtype, device: torch.device, m: int, n: int,
                  k: int) -> MatmulConfig | None:
    """Fixed tiles for an (m, n, k) product when no config is given: float32 on a GPU whose
    model has tuned ones (fitted to the problem); None, the autotuned kernel, otherwise."""
    if dtype.itemsize != 4 or device.type != "cuda":
        return None
    import torch

    tuned = _tuned_f32(torch.cuda.get_device_name(device))
    return _fitted(tuned, m, n, k) if tuned else None


def _matmul(a: torch.Tensor, b: torch.Tensor, config: MatmulConfig | None = None) -> torch.Tensor:
    """Launch on any strides; allocate C (NaN-poisoned under the correctness harness).

    config: fixed tiles; else float32 on a GPU takes this model's tuned tiles (fitted to the
    problem) where a tune recorded some, and everything else the autotuned kernel."""
    (m, k), n = a.shape, b.shape[1]
    c = frameworks.torch_empty((m, n), a.dtype, a.device)
    config = config or default_tiles(a.dtype, a.device, m, n, k)
    args = (a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1))
    if config is None:
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        matmul_kernel[grid](*args, DOT_PRECISION="tf32")  # TF32 for f32; 16-bit dots ignore it
        return c
    # The kernel under the autotuner (and its EVEN_K heuristic), launched with these tiles.
    matmul_kernel.fn[(triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)](
        *args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, DOT_PRECISION="tf32", num_warps=config.num_warps,
        num_stages=config.num_stages)
    return c


@functools.cache
def _autograd() -> type:
    """The kernel as a torch.autograd.Function, built on first use: torch is imported by a call,
    not by loading the registry."""
    import torch

    class Matmul(torch.autograd.Function):
        """C = A @ B; backward dA = dC B^T, dB = A^T dC with the same kernel on transposed views."""

        @staticmethod
        def forward(ctx, a, b, config):
            ctx.save_for_backward(a, b)
            return _matmul(a, b, config)

        @staticmethod
        def backward(ctx, dc):
            # The forward's tiles are for (m, n, k); the gradients have other shapes.
            a, b = ctx.saved_tensors
            da = _matmul(dc, b.T) if ctx.needs_input_grad[0] else None
            db = _matmul(a.T, dc) if ctx.needs_input_grad[1] else None
            return da, db, None

    return Matmul


def matmul(a: torch.Tensor, b: torch.Tensor, *, config: MatmulConfig | None = None) -> torch.Tensor:
    """a @ b, differentiable.

    Args:
      a: (m, k) tensor, bf16, f16 or f32.
      b: (k, n) tensor of a's dtype on a's device.
      config: the forward's tiles, used as given; None: autotuned (float32: this GPU
        model's tuned tiles where recorded).
    Returns:
      (m, n) tensor of a's dtype (accumulated in float32).
    """
    spec.validate(a, b)
    device = frameworks.TorchFramework.device()
    validation.check_torch_tensor("a", a, device)
    validation.check_torch_tensor("b", b, device, like=a)
    validation.check_index_range("a", a)
    validation.check_index_range("b", b)
    validation.check_config(config, MatmulConfig)
    if (empty := spec.empty_product(a, b, requires_grad=a.requires_grad or b.requires_grad)) \
            is not None:
        return empty
    return _autograd().apply(a, b, config)


tuning.register_tunable(spec.NAME, tuning.slot("triton", "f32"), functools.partial(
    tuning.sweep, spec.NAME, "triton", F32_TUNING_CANDIDATES, F32_TUNING_CASE, variant="f32"))


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="triton",
    fn=matmul,
    # tl.dot(input_precision="tf32") below; Triton's interpreter multiplies in NumPy
    # float32 whatever input_precision says (triton/runtime/interpreter.py, create_dot).
    precision=precisions.TF32_ON_GPU,
    autotunes=True,  # triton.autotune over _configs() at the first call per (M, N, K)
    framework="torch",
    requires=registry.Requirements(modules=("torch", "triton")),
    description="Triton: tiled, grouped tile order, f32 accumulation, autotuned on (M, N, K); "
                "backward by the same kernel on transposed views",
))
