"""Softmax in raw CUDA (softmax.cu): a warp or a block per row, the row held in registers.

Short rows get a warp each (several warps per block), long rows a block each;
either way every thread issues all its 16-byte loads before using them, the
row stays in registers, and x is read once and y written once. Rows of any
width take 16-byte accesses: each splits into a scalar head up to its first
16-byte boundary, vectors, and a scalar tail. Rows too long for registers take
a two-pass online version. Arithmetic is float32 for every dtype. Forward
only. See kernels/cuda/runtime.py for the torch interop.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.core import frameworks, registry, validation
from kernels.cuda import runtime
from kernels.cuda.runtime import MAX_THREADS, WARP, max_vectors_per_thread, next_power_of_2
from kernels.ops.softmax import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

LIBRARY = runtime.CudaLibrary(Path(__file__).with_name("softmax.cu"), {
    "kernelperf_softmax": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int, ctypes.c_void_p),
})

# Warps per block when each warp owns a row: 128-thread blocks.
WARP_ROWS_PER_BLOCK = 4
# Fewest threads for a block-per-row group: fewer would leave too few loads in flight.
MIN_BLOCK_THREADS = 128


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftmaxConfig:
    """How rows map to threads.

    threads_per_row: 32 (a warp per row) or a multiple of 32 up to 1024 (a block per row).
    rows_per_block: warps per block when threads_per_row is 32; else 1.
    vectors_per_thread: accesses each thread holds in registers (cached version): 1, 2, 4, 8.
    online: the two-pass version (rows too long for registers); vectors_per_thread unused.
    vectorize: 16-byte accesses (each row split into a scalar head, vectors and a scalar
        tail), where x and y are equally aligned; else one element per access.
    """

    threads_per_row: int
    rows_per_block: int = 1
    vectors_per_thread: int = 1
    online: bool = False
    vectorize: bool = True

    def __post_init__(self) -> None:
        runtime.check_row_mapping(self.threads_per_row, self.rows_per_block,
                                  self.vectors_per_thread)
        if self.online and self.rows_per_block != 1:
            raise ValueError(f"rows_per_block: the online version takes a block per row, got "
                             f"{self.rows_per_block}")

    def capacity(self, width: int) -> int:
        """Longest row the cached version holds with `width` elements per access."""
        return self.threads_per_row * self.vectors_per_thread * width


def default_config(cols: int, width: int) -> SoftmaxConfig:
    """A warp per row while the row fits a warp's registers, then a block, then online."""
    vectors = math.ceil(cols / width)
    most = max_vectors_per_thread(width)
    if vectors <= WARP * most:
        return SoftmaxConfig(threads_per_row=WARP, rows_per_block=WARP_ROWS_PER_BLOCK,
                             vectors_per_thread=next_power_of_2(math.ceil(vectors / WARP)))
    if vectors <= MAX_THREADS * most:
        threads = min(MAX_THREADS,
                      max(MIN_BLOCK_THREADS, next_power_of_2(math.ceil(vectors / most))))
        return SoftmaxConfig(threads_per_row=threads,
                             vectors_per_thread=next_power_of_2(math.ceil(vectors / threads)))
    return SoftmaxConfig(threads_per_row=MAX_THREADS, online=True)


def softmax(x: torch.Tensor, *, config: SoftmaxConfig | None = None) -> torch.Tensor:
    """Softmax of `x` over its last axis, by softmax.cu.

    Args:
      x: contiguous CUDA tensor, float32, bfloat16 or float16, rank >= 1; leading axes are
        flattened into rows.
      config: thread mapping; `default_config(cols, width)` when None.
    Returns:
      A new tensor of x's shape and dtype.
    """
    spec.validate(x)
    validation.check_config(config, SoftmaxConfig)
    runtime.check_tensor("x", x)
    rows, cols = runtime.rows_and_cols(x)
    y = frameworks.torch_empty(x.shape, x.dtype, x.device)
    if rows == 0:
        return y
    vector_width = runtime.VECTOR_BYTES // x.element_size()
    vectorizable = runtime.equally_aligned(x, y)
    if config is None:
        config = default_config(cols, vector_width if vectorizable else 1)
    vectorized = config.vectorize and vectorizable
    width = vector_width if vectorized else 1
    if not config.online:
        if config.capacity(width) < cols:
            raise ValueError(f"config: holds rows of up to {config.capacity(width)} elements "
                             f"({config}), got {cols} columns")
        if config.vectors_per_thread > max_vectors_per_thread(width):
            raise ValueError(f"config: at most {max_vectors_per_thread(width)} vectors per "
                             f"thread of {width} elements, got {config.vectors_per_thread}")
    LIBRARY.launch("kernelperf_softmax", x.device, x.data_ptr(), y.data_ptr(), rows, cols,
                   runtime.dtype_code(x), config.threads_per_row, config.rows_per_block,
                   config.vectors_per_thread, int(vectorized), int(config.online),
                   runtime.current_stream(x))
    return y


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="cuda",
    fn=softmax,
    framework="torch",
    requires=registry.Requirements(gpu=True, modules=("torch",)),
    differentiable=False,
    description="CUDA C++ via nvcc + ctypes: warp/block per row, row in registers, 16-byte loads",
))
