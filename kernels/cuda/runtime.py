"""Calling nvcc-built CUDA kernels from Python: ctypes libraries, torch tensors, launch checks.

Interop route: torch tensors, by device pointer. Our CUDA implementations
register with framework "torch": the harness hands them torch CUDA tensors,
which give everything a raw launch needs (`data_ptr()`, device, dtype,
strides) and torch's current stream, which we pass to the launcher so our
kernel is ordered with the surrounding torch work and never synchronises the
device. Output buffers come from `kernels.core.frameworks.torch_empty` (NaN-filled
under test). JAX arrays reach these kernels zero-copy through DLPack
(`kernels.core.frameworks.jax_to_torch`). We did not take the other route, the JAX
FFI (registering each entry point as an XLA custom call so it runs inside
`jax.jit`): it needs an XLA FFI handler per kernel written against XLA's C++
API headers (a second, version-sensitive binding layer in every .cu file, and
jax 0.10 and 0.11 both to satisfy), and it would buy jit fusion that
hand-written kernels measured in isolation do not use.

Every C entry point launches and returns `cudaGetLastError()` as an int;
`CudaLibrary.launch` turns a non-zero code into `CudaError` with CUDA's own
message (`kernelperf_error_string`, exported by every library from its
statically linked CUDA runtime). Each library links the CUDA runtime
statically (nvcc's default), so it loads on machines without a CUDA
installation and shares the device's primary context with torch.

Inputs are checked before anything touches CUDA (`check_tensor`): a CPU
tensor, a non-contiguous one, or one that needs gradients is rejected with a
message naming the argument, on any machine.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernels.cuda import build

# Must match KpDtype in common.cuh.
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
# Widest access the kernels make: a 16-byte vector.
VECTOR_BYTES = 16
INT32_MAX = 2**31 - 1

# The row kernels (softmax.cu, row_sum.cu) give each row a warp, or a block of threads, and
# each thread several 16-byte accesses per step.
WARP = 32
MAX_THREADS = 1024
VECTORS_PER_THREAD = (1, 2, 4, 8)
# Row values one thread holds per step (kMaxValuesPerThread in both): 1024-thread blocks get
# 64 registers a thread, half of them for the row.
MAX_VALUES_PER_THREAD = 32


class CudaError(RuntimeError):
    """A CUDA call failed; the message carries CUDA's error string."""


def dtype_code(x: Any) -> int:
    return DTYPE_CODES[str(x.dtype).removeprefix("torch.")]


def check_tensor(name: str, x: Any, *, like: Any = None) -> None:
    """Raise unless `x` is a contiguous torch CUDA tensor that needs no gradient.

    Checked in an order that works without a GPU (type, layout, autograd, then
    device), so every check but the device's can be tested on CPU tensors.
    `like`: a tensor `x` must share a device with (the first argument, say).
    """
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got shape {tuple(x.shape)} with "
                         f"strides {x.stride()}")
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name}: requires grad, but this CUDA kernel is forward-only (no "
                         f"backward); pass {name}.detach() or run under torch.no_grad()")
    if x.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got device {x.device}")
    if like is not None and x.device != like.device:
        raise ValueError(f"{name}: expected a tensor on {like.device} like the first argument, "
                         f"got {x.device}")


def equally_aligned(*tensors: Any) -> bool:
    """Whether the tensors' data sit at one offset from a 16-byte boundary, so that rows of
    theirs split alike into a scalar head, 16-byte vectors and a scalar tail."""
    return len({t.data_ptr() % VECTOR_BYTES for t in tensors}) == 1


def check_row_mapping(threads_per_row: int, rows_per_block: int,
                      vectors_per_thread: int) -> None:
    """Raise unless the row kernels can take this thread mapping: threads_per_row 32 (a warp
    per row) or a multiple of 32 up to 1024 (a block per row), rows_per_block warps a block
    only with a warp per row, vectors_per_thread one of VECTORS_PER_THREAD."""
    t = threads_per_row
    if t < WARP or t > MAX_THREADS or t % WARP:
        raise ValueError(f"threads_per_row: expected a multiple of {WARP} in [{WARP}, "
                         f"{MAX_THREADS}], got {t}")
    if rows_per_block < 1 or (t > WARP and rows_per_block != 1) \
            or t * rows_per_block > MAX_THREADS:
        raise ValueError(f"rows_per_block: expected 1, or up to {MAX_THREADS // WARP} when "
                         f"threads_per_row is {WARP}; got {rows_per_block} with "
                         f"threads_per_row={t}")
    if vectors_per_thread not in VECTORS_PER_THREAD:
        raise ValueError(f"vectors_per_thread: expected one of {VECTORS_PER_THREAD}, got "
                         f"{vectors_per_thread}")


def next_power_of_2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


def max_vectors_per_thread(width: int) -> int:
    """Most accesses of `width` elements one thread of a row kernel makes per step."""
    return max(v for v in VECTORS_PER_THREAD if v * width <= MAX_VALUES_PER_THREAD)


def rows_and_cols(x: Any) -> tuple[int, int]:
    """(rows, columns) of a row kernel's input: leading axes flattened, the last the columns,
    which its int arithmetic caps at INT32_MAX."""
    cols = x.shape[-1]
    if cols > INT32_MAX:
        raise ValueError(f"x: expected at most {INT32_MAX} columns, got {cols}")
    return x.numel() // cols, cols


def current_stream(x: Any) -> int:
    """torch's current stream on x's device, as the cudaStream_t value the launchers take."""
    import torch

    return torch.cuda.current_stream(x.device).cuda_stream


class CudaLibrary:
    """One .cu file's shared library: built on first use for the device, entry points typed.

    `signatures` maps each entry point to its ctypes argument types; every
    entry point returns a cudaError_t as int.
    """

    def __init__(self, source: Path, signatures: Mapping[str, Sequence[type]]) -> None:
        self.source = source
        self.signatures = {name: tuple(types) for name, types in signatures.items()}
        self._loaded: dict[str, ctypes.CDLL] = {}
        self._lock = threading.Lock()

    def load(self, arch: str | None = None) -> ctypes.CDLL:
        """The library built for `arch` (default: the build's default target), loaded once."""
        arch = arch or build.default_arch()
        with self._lock:
            if arch not in self._loaded:
                lib = ctypes.CDLL(str(build.build(self.source, arch)))
                for name, argtypes in self.signatures.items():
                    entry = getattr(lib, name)
                    entry.argtypes = list(argtypes)
                    entry.restype = ctypes.c_int
                lib.kernelperf_error_string.argtypes = [ctypes.c_int]
                lib.kernelperf_error_string.restype = ctypes.c_char_p
                self._loaded[arch] = lib
            return self._loaded[arch]

    def for_device(self, device: Any) -> ctypes.CDLL:
        import torch

        return self.load(build.arch_for(torch.cuda.get_device_capability(device)))

    def launch(self, name: str, device: Any, *args: Any) -> None:
        """Call entry point `name` with `device` current; raise CudaError on a non-zero code."""
        import torch

        if name not in self.signatures:
            raise KeyError(f"{self.source.name} declares no entry point {name!r}; "
                           f"known: {sorted(self.signatures)}")
        lib = self.for_device(device)
        with torch.cuda.device(device):
            code = getattr(lib, name)(*args)
        if code != 0:
            message = lib.kernelperf_error_string(code).decode()
            raise CudaError(f"{self.source.name}: {name} failed: {message} (cudaError {code})")
