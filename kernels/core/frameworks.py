"""Bridges between the registry's numpy inputs and each framework's arrays.

The harness makes inputs as numpy arrays and compares numpy results, so one
comparison serves every framework. Each adapter places inputs on the
framework's default device, brings results back, takes a vector-Jacobian
product, and waits for the device. On a GPU, torch inputs are placed once by
JAX and handed to torch zero-copy through DLPack (`jax_to_torch`), so a Triton
or CUDA kernel reads the very device buffers a JAX implementation would; JAX
makes torch's stream wait until the buffer is ready. On CPU they come through
NumPy (the Triton interpreter wants plain CPU tensors).

Kernels that allocate their own output (Triton, CUDA) call `torch_empty`, which
fills the buffer with NaN while `poisoned_outputs()` is active, so an element
the kernel never writes shows up as NaN in the comparison.

The other way, `as_device_array` views a torch result on the GPU as a JAX array
(DLPack again, no copy), so the harness compares every framework's results on
the device where they are.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from kernels.core import dtypes, validation

_POISON = contextvars.ContextVar("kernelperf_poison_outputs", default=False)


@contextlib.contextmanager
def poisoned_outputs() -> Iterator[None]:
    """While active, `torch_empty` returns NaN-filled buffers instead of uninitialised ones."""
    token = _POISON.set(True)
    try:
        yield
    finally:
        _POISON.reset(token)


def poisoning() -> bool:
    return _POISON.get()


class JaxFramework:
    name = "jax"

    def from_numpy(self, arrays: Sequence[np.ndarray]) -> tuple[Any, ...]:
        import jax.numpy as jnp

        for index, array in enumerate(arrays):
            validation.check_x64_for(f"inputs[{index}]", array)
        return tuple(jnp.asarray(a) for a in arrays)

    def to_numpy(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def vjp(self, fn: Callable[..., Any], args: Sequence[Any], cotangent: np.ndarray,
            kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
        import jax
        import jax.numpy as jnp

        out, pullback = jax.vjp(lambda *a: fn(*a, **kwargs), *args)
        return out, pullback(jnp.asarray(cotangent, dtype=out.dtype))

    def synchronize(self, value: Any) -> Any:
        import jax

        return jax.block_until_ready(value)


class TorchFramework:
    name = "torch"

    @staticmethod
    def device() -> str:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def from_numpy(self, arrays: Sequence[np.ndarray]) -> tuple[Any, ...]:
        device = self.device()
        if device == "cuda":
            import jax

            from kernels.core import compat

            if compat.on_gpu():
                return tuple(jax_to_torch(jax.device_put(a)) for a in arrays)
        return tuple(numpy_to_torch(a, device) for a in arrays)

    def to_numpy(self, value: Any) -> np.ndarray:
        return torch_to_numpy(value)

    def vjp(self, fn: Callable[..., Any], args: Sequence[Any], cotangent: np.ndarray,
            kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
        leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        out = fn(*leaves, **kwargs)
        out.backward(numpy_to_torch(cotangent.astype(dtypes.to_numpy(
            dtypes.short_name(out.dtype))), out.device.type))
        return out.detach(), tuple(leaf.grad for leaf in leaves)

    def synchronize(self, value: Any) -> Any:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return value


FRAMEWORKS = {"jax": JaxFramework(), "torch": TorchFramework()}


def framework(name: str) -> JaxFramework | TorchFramework:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise ValueError(f"framework: expected one of {sorted(FRAMEWORKS)}, got {name!r}") from None


def numpy_to_torch(array: np.ndarray, device: str) -> Any:
    import torch

    if array.dtype == dtypes.to_numpy("bf16"):
        # torch.from_numpy does not know ml_dtypes' bfloat16: move the bits.
        tensor = torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        # np.array, not np.ascontiguousarray: the latter turns a 0-d array into shape (1,).
        tensor = torch.from_numpy(np.array(array, order="C", copy=True))
    return tensor.to(device)


def torch_to_numpy(tensor: Any) -> np.ndarray:
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(dtypes.to_numpy("bf16"))
    return tensor.numpy()


def jax_to_torch(array: Any) -> Any:
    """Zero-copy view of a JAX array as a torch tensor (DLPack); same device, same bytes."""
    import torch

    return torch.from_dlpack(array)


def as_device_array(value: Any, platform: str = "gpu") -> Any:
    """`value` as a single-device JAX array on `platform` ("gpu"), without a copy (a torch
    tensor through DLPack); None for anything else (elsewhere, several devices, NumPy)."""
    if type(value).__module__.startswith("torch"):
        if value.device.type != {"gpu": "cuda"}.get(platform, platform):
            return None
        import jax.dlpack

        # DLPack exports neither tensors that require grad nor (to JAX) strided views.
        return jax.dlpack.from_dlpack(value.detach().contiguous())
    import jax

    if isinstance(value, jax.Array):
        devices = value.devices()
        if len(devices) == 1 and next(iter(devices)).platform == platform:
            return value
    return None


def torch_empty(shape: Sequence[int], dtype: Any, device: Any) -> Any:
    """An output buffer for a kernel to fill: NaN-poisoned under `poisoned_outputs()`."""
    import torch

    if poisoning():
        return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
    return torch.empty(tuple(shape), dtype=dtype, device=device)
