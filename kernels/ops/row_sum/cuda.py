"""Row sum in raw CUDA (row_sum.cu): a warp or a block per row, 16-byte loads, f32 accumulation.

Short rows get a warp each (several warps per block), long rows a block each;
every thread keeps several independent 16-byte loads in flight (rows of any
width and alignment: a scalar head and tail around the vectors) and the group
reduces through shuffles and shared memory. Forward only. See
kernels/cuda/runtime.py for the torch interop.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.core import frameworks, registry, validation
from kernels.cuda import runtime
from kernels.cuda.runtime import WARP, max_vectors_per_thread, next_power_of_2
from kernels.ops.row_sum import spec

if TYPE_CHECKING:  # torch is imported by a call, not by loading the registry
    import torch

LIBRARY = runtime.CudaLibrary(Path(__file__).with_name("row_sum.cu"), {
    "kernelperf_row_sum": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.c_void_p),
})

# Warps per block when each warp owns a row: 256-thread blocks.
WARP_ROWS_PER_BLOCK = 8
# A block-per-row group: enough threads to keep loads in flight, few enough that long rows
# still take several sweeps and short ones do not idle most of the block.
BLOCK_THREADS = (128, 512)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowSumConfig:
    """How rows map to threads.

    threads_per_row: 32 (a warp per row) or a multiple of 32 up to 1024 (a block per row).
    rows_per_block: warps per block when threads_per_row is 32; else 1.
    vectors_per_thread: independent loads each thread issues per step: 1, 2, 4, 8.
    vectorize: 16-byte loads (each row split into a scalar head up to its first 16-byte
        boundary, vectors and a scalar tail); else one element per load.
    """

    threads_per_row: int
    rows_per_block: int = 1
    vectors_per_thread: int = 1
    vectorize: bool = True

    def __post_init__(self) -> None:
        runtime.check_row_mapping(self.threads_per_row, self.rows_per_block,
                                  self.vectors_per_thread)


def default_config(cols: int, width: int) -> RowSumConfig:
    """A warp per row while one sweep of a warp covers the row, else a block per row."""
    vectors = math.ceil(cols / width)
    most = max_vectors_per_thread(width)
    if vectors <= WARP * most:
        return RowSumConfig(threads_per_row=WARP, rows_per_block=WARP_ROWS_PER_BLOCK,
                            vectors_per_thread=next_power_of_2(math.ceil(vectors / WARP)))
    small, large = BLOCK_THREADS
    threads = small if vectors <= small * most else large
    return RowSumConfig(threads_per_row=threads, vectors_per_thread=most)


def row_sum(x: torch.Tensor, *, config: RowSumConfig | None = None) -> torch.Tensor:
    """Sum of `x` over its last axis, by row_sum.cu.

    Args:
      x: contiguous CUDA tensor, float32, bfloat16 or float16, rank >= 1.
      config: thread mapping; `default_config(cols, width)` when None.
    Returns:
      A new tensor of shape x.shape[:-1] and x's dtype.
    """
    spec.validate(x)
    validation.check_config(config, RowSumConfig)
    runtime.check_tensor("x", x)
    rows, cols = runtime.rows_and_cols(x)
    y = frameworks.torch_empty(x.shape[:-1], x.dtype, x.device)
    if rows == 0:
        return y
    vector_width = runtime.VECTOR_BYTES // x.element_size()
    config = config or default_config(cols, vector_width)
    width = vector_width if config.vectorize else 1
    if config.vectors_per_thread > max_vectors_per_thread(width):
        raise ValueError(f"config: at most {max_vectors_per_thread(width)} vectors per thread "
                         f"of {width} elements, got {config.vectors_per_thread}")
    LIBRARY.launch("kernelperf_row_sum", x.device, x.data_ptr(), y.data_ptr(), rows, cols,
                   runtime.dtype_code(x), config.threads_per_row, config.rows_per_block,
                   config.vectors_per_thread, int(config.vectorize), runtime.current_stream(x))
    return y


registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name="cuda",
    fn=row_sum,
    framework="torch",
    requires=registry.Requirements(gpu=True, modules=("torch",)),
    differentiable=False,
    description="CUDA C++ via nvcc + ctypes: warp/block per row, 16-byte loads, f32 accumulation",
))
