"""Softmax in Triton: one row per program, fused, forward and backward (torch.autograd.Function).

A row that fits one block (up to `max_block` columns) is read once, reduced
and normalised in registers and written once. A wider row is walked twice:
first keeping a running max and sum per lane (each lane's sum rescaled by
exp(m_old - m_new) when its max grows: Milakov & Gimelshein, "Online
normalizer calculation for softmax", 2018), reduced across lanes at the end;
then reading the row again to write exp(x - max) / sum. Out-of-range columns
are masked loads (-inf) and masked stores. Arithmetic is float32.

Backward: dx = y * (dy - sum(y * dy)) from the saved output, in the same
one-block or two-pass structure.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from kernels.core import compat, frameworks, registry, tuning, validation
from kernels.ops.softmax import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

compat.patch_triton_interpreter()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftmaxConfig:
    """Columns per block (a power of two: Triton's aranges are) and warps per row."""

    block: int
    num_warps: int

    def __post_init__(self) -> None:
        validation.check_powers_of_two(self, ("block", "num_warps"))


# Widest row block held in registers: 8192 float32 per row over 16 warps is 16 values a
# thread. The interpreter gets a narrow one so the CPU cases (4097 columns) take the
# two-pass path too.
MAX_BLOCK = 8192
INTERPRETER_MAX_BLOCK = 1024
# Columns per thread we aim for when choosing warps: enough to keep loads in flight.
COLUMNS_PER_THREAD = 16
MAX_WARPS = 16


def default_config(cols: int, device: torch.device,
                   dtype: torch.dtype | None = None) -> SoftmaxConfig:
    """Columns per block and warps for rows of `cols`: the row in one block up to MAX_BLOCK,
    else MAX_BLOCK-wide blocks; on a GPU, float32 rows wider than that take this model's
    tuned config where a tune recorded one (tuned.json, "triton:f32-wide")."""
    on_gpu = device.type == "cuda"
    if on_gpu and cols > MAX_BLOCK and dtype is not None and dtype.itemsize == 4:
        import torch

        tuned = _tuned_wide(torch.cuda.get_device_name(device))
        if tuned is not None:
            return tuned
    widest = MAX_BLOCK if on_gpu else INTERPRETER_MAX_BLOCK
    block = min(triton.next_power_of_2(cols), widest)
    num_warps = max(1, min(MAX_WARPS, block // (32 * COLUMNS_PER_THREAD)))
    return SoftmaxConfig(block=block, num_warps=num_warps)


# The grid `python -m kernels tune softmax` times for float32 rows wider than MAX_BLOCK, on
# 4096x32768 forward and backward together (they share the config): "triton:f32-wide" in
# tuned.json. The first is today's default there (8192-wide blocks, 16 warps: 0.75x of the
# CUDA kernel forward, 0.6 of the copy bound backward on the H200, issue 51); 32768-wide
# blocks hold that row whole (one read of x, 32 floats a thread at 32 warps).
WIDE_TUNING_CASE = "f32-4096x32768"
WIDE_TUNING_CANDIDATES = tuple(
    SoftmaxConfig(block=block, num_warps=warps)
    for block, warps in [(8192, 16), (8192, 8), (4096, 8), (4096, 16), (2048, 8), (4096, 4),
                         (16384, 16), (16384, 32), (32768, 32), (32768, 16)])


@functools.cache
def _tuned_wide(device_name: str) -> SoftmaxConfig | None:
    """This GPU model's tuned wide-row float32 config, or None. Read once per process and
    model: a launch must not parse a file."""
    return tuning.tuned_config(spec.NAME, "triton", WIDE_TUNING_CANDIDATES[0],
                               model=tuning.model_key(device_name), variant="f32-wide")


@triton.jit
def softmax_forward_kernel(
    # Inputs
    x_ptr,
    # Outputs
    y_ptr,
    cols, stride_x, stride_y,
    BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * stride_x
    y_ptr += row * stride_y
    offs = tl.arange(0, BLOCK)
    if ONE_BLOCK:
        in_row = offs < cols
        x = tl.load(x_ptr + offs, mask=in_row, other=float("-inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, 0))
        tl.store(y_ptr + offs, (e * (1.0 / tl.sum(e, 0))).to(y_ptr.dtype.element_ty), mask=in_row)
    else:
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, cols, BLOCK):
            x = tl.load(x_ptr + start + offs, mask=start + offs < cols,
                        other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            # A lane that has seen only -inf keeps max -inf; exp(-inf - -inf) would be NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
            m = m_new
        row_max = tl.max(m, 0)
        inverse_sum = 1.0 / tl.sum(s * tl.exp(m - row_max), 0)
        for start in range(0, cols, BLOCK):
            in_row = start + offs < cols
            x = tl.load(x_ptr + start + offs, mask=in_row, other=float("-inf")).to(tl.float32)
            y = tl.exp(x - row_max) * inverse_sum
            tl.store(y_ptr + start + offs, y.to(y_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def softmax_backward_kernel(
    # Inputs
    y_ptr, dy_ptr,
    # Outputs
    dx_ptr,
    cols, stride_y, stride_dy, stride_dx,
    BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    y_ptr += row * stride_y
    dy_ptr += row * stride_dy
    dx_ptr += row * stride_dx
    offs = tl.arange(0, BLOCK)
    if ONE_BLOCK:
        in_row = offs < cols
        y = tl.load(y_ptr + offs, mask=in_row, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=in_row, other=0.0).to(tl.float32)
        dx = y * (dy - tl.sum(y * dy, 0))
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=in_row)
    else:
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, cols, BLOCK):
            in_row = start + offs < cols
            y = tl.load(y_ptr + start + offs, mask=in_row, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + start + offs, mask=in_row, other=0.0).to(tl.float32)
            acc += y * dy
        total = tl.sum(acc, 0)
        for start in range(0, cols, BLOCK):
            in_row = start + offs < cols
            y = tl.load(y_ptr + start + offs, mask=in_row, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + start + offs, mask=in_row, other=0.0).to(tl.float32)
            tl.store(dx_ptr + start + offs, (y * (dy - total)).to(dx_ptr.dtype.element_ty),
                     mask=in_row)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, cols) with unit column stride (a view when x is contiguous)."""
    return x.contiguous().reshape(-1, x.shape[-1])


@functools.cache
def _autograd() -> type:
    """The kernels as a torch.autograd.Function, built on first use: torch is imported by a call,
    not by loading the registry."""
    import torch

    class Softmax(torch.autograd.Function):
        """y = softmax(x) over the last axis; saves y for dx = y * (dy - sum(y * dy))."""

        @staticmethod
        def forward(ctx, x, config: SoftmaxConfig):
            x2 = _rows(x)
            y = frameworks.torch_empty(x2.shape, x.dtype, x.device)
            softmax_forward_kernel[(x2.shape[0],)](
                x2, y, x2.shape[1], x2.stride(0), y.stride(0), BLOCK=config.block,
                ONE_BLOCK=x2.shape[1] <= config.block, num_warps=config.num_warps)
            ctx.save_for_backward(y)
            ctx.config = config
            return y.reshape(x.shape)

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            config = ctx.config
            dy2 = _rows(dy)
            dx = frameworks.torch_empty(y.shape, y.dtype, y.device)
            softmax_backward_kernel[(y.shape[0],)](
                y, dy2, dx, y.shape[1], y.stride(0), dy2.stride(0), dx.stride(0),
                BLOCK=config.block, ONE_BLOCK=y.shape[1] <= config.block,
                num_warps=config.num_warps)
            return dx.reshape(dy.shape), None

    return Softmax


def softmax(x: torch.Tensor, *, config: SoftmaxConfig | None = None) -> torch.Tensor:
    """Softmax over the last axis, differentiable.

    Args:
      x: tensor of rank >= 1, bf16, f16 or f32, non-empty last axis.
      config: block width and warps; `default_config` when None.
    Returns:
      A new tensor of x's shape and dtype.
    """
    spec.validate(x)
    validation.check_torch_tensor("x", x, frameworks.TorchFramework.device())
    validation.check_config(config, SoftmaxConfig)
    validation.check_index_range("x", x)
    config = config or default_config(x.shape[-1], x.device, x.dtype)
    if x.numel() == 0:
        return x.clone()
    return _autograd().apply(x, config)


tuning.register_tunable(spec.NAME, tuning.slot("triton", "f32-wide"), functools.partial(
    tuning.sweep, spec.NAME, "triton", WIDE_TUNING_CANDIDATES, WIDE_TUNING_CASE,
    variant="f32-wide", directions=("fwd", "bwd")))

registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="triton",
    fn=softmax,
    framework="torch",
    requires=registry.Requirements(modules=("torch", "triton")),
    description="Triton: one row per program, fused; online two-pass for rows wider "
                "than one block; autograd.Function backward",
))
