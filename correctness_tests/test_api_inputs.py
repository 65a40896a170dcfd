"""The Python API meets bad calls before launching: torch kernels check they got torch tensors
on the device they run on, configs and flags are type-checked, zero-size batches give an empty
result of the right shape, and sizes beyond 32-bit index arithmetic are refused."""

from __future__ import annotations

import numpy as np
import pytest

from correctness_tests import fakes
from kernels.core import devices, registry, validation

torch = pytest.importorskip("torch")  # third-party: the torch kernels' framework

CPU = not devices.this_machine().has_gpu
needs_triton = pytest.mark.skipif(not devices.module_available("triton"), reason="needs triton")


def _ours(op: str, name: str) -> registry.Implementation:
    impl = registry.implementation(op, name)
    reason = devices.unavailable_reason(impl)
    if reason:
        pytest.skip(reason)
    return impl


def _device() -> str:
    return "cpu" if CPU else "cuda"


# (op, implementation, config class module attribute) for every public wrapper with a config.
CONFIGURED = [
    ("softmax", "pallas", "SoftmaxConfig"), ("softmax", "triton", "SoftmaxConfig"),
    ("matmul", "pallas_triton", "MatmulConfig"), ("attention", "pallas_triton",
                                                   "AttentionConfig"),
    ("attention", "triton", "AttentionConfig"),
]


def _args(op: str, framework: str):
    rng = np.random.default_rng(0)
    shapes = {"softmax": [(4, 8)], "matmul": [(4, 8), (8, 4)],
              "attention": [(1, 16, 1, 64)] * 3}[op]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if framework == "torch":
        return [torch.from_numpy(a).to(_device()) for a in arrays]
    import jax.numpy as jnp

    return [jnp.asarray(a) for a in arrays]


@pytest.mark.parametrize("op,name,config_class", CONFIGURED, ids=lambda v: str(v))
@pytest.mark.parametrize("config", ["fast", {"block": 64}, 128])
def test_config_of_the_wrong_type_is_refused(op, name, config_class, config):
    impl = _ours(op, name)
    expected = getattr(__import__(impl.fn.__module__, fromlist=["_"]), config_class).__name__
    with pytest.raises(TypeError, match=f"config: expected a {expected} or None, got "
                                        f"{type(config).__name__}"):
        impl.fn(*_args(op, impl.framework), config=config)


@pytest.mark.parametrize("op,name", [("softmax", "pallas"), ("matmul", "pallas_triton"),
                                     ("attention", "pallas_triton")])
@pytest.mark.parametrize("flag", ["yes", 1, "False"])
def test_interpret_flag_must_be_a_bool(op, name, flag):
    impl = _ours(op, name)
    with pytest.raises(TypeError, match=f"interpret: expected True, False or None, got "
                                        f"{type(flag).__name__}"):
        impl.fn(*_args(op, "jax"), interpret=flag)


TORCH_KERNELS = [("softmax", "triton"), ("matmul", "triton"), ("attention", "triton")]


@needs_triton
@pytest.mark.parametrize("op,name", TORCH_KERNELS)
def test_torch_kernel_refuses_a_jax_array(op, name):
    impl = _ours(op, name)
    with pytest.raises(TypeError, match=r"expected a torch.Tensor, got jax.*Array"):
        impl.fn(*_args(op, "jax"))


@needs_triton
@pytest.mark.parametrize("op,name", TORCH_KERNELS)
def test_torch_kernel_refuses_a_tensor_on_another_device(op, name):
    """A tensor on the `meta` device (no memory at all) stands in for any wrong device."""
    impl = _ours(op, name)
    args = _args(op, "torch")
    args[-1] = args[-1].to("meta")
    with pytest.raises(ValueError, match=f"expected a tensor on {_device()}, got device meta"):
        impl.fn(*args)


# Zero rows / an empty product: an empty result of the right shape, dtype kept.
EMPTY = [
    ("softmax", "pallas", [(0, 8)], (0, 8)), ("softmax", "triton", [(0, 8)], (0, 8)),
    ("softmax", "pallas", [(2, 0, 8)], (2, 0, 8)),
    ("matmul", "pallas_triton", [(0, 8), (8, 4)], (0, 4)),
    ("matmul", "pallas_triton", [(4, 8), (8, 0)], (4, 0)),
    ("matmul", "triton", [(0, 8), (8, 4)], (0, 4)),
    ("matmul", "triton", [(4, 8), (8, 0)], (4, 0)),
]


@pytest.mark.parametrize("op,name,shapes,expected", EMPTY, ids=lambda v: str(v))
def test_zero_size_input_gives_an_empty_result(op, name, shapes, expected):
    impl = _ours(op, name)
    arrays = [np.zeros(s, np.float32) for s in shapes]
    if impl.framework == "torch":
        args = [torch.from_numpy(a).to(_device()) for a in arrays]
    else:
        import jax.numpy as jnp

        args = [jnp.asarray(a) for a in arrays]
    out = impl.fn(*args)
    assert tuple(out.shape) == expected
    assert str(out.dtype).removeprefix("torch.") == "float32"


def test_empty_reduction_axis_stays_refused():
    """An empty product over k = 0 or a softmax over no columns has no defined kernel result:
    refused, naming the axis (the operations declare these as bad inputs too)."""
    impl = _ours("matmul", "pallas_triton")
    with pytest.raises(ValueError, match="a: expected a non-empty axis 1"):
        impl.fn(np.zeros((4, 0), np.float32), np.zeros((0, 4), np.float32))


@needs_triton
def test_triton_matmul_refuses_k_beyond_32_bit_offsets_before_launch():
    impl = _ours("matmul", "triton")
    k = 2**31
    a = torch.zeros(1, device=_device()).expand(2, k)  # stride 0: no memory behind it
    b = torch.zeros(1, device=_device()).expand(k, 2)
    with pytest.raises(ValueError, match=r"a: expected offsets below 2\*\*31 .* shape "
                                         r"\(2, 2147483648\)"):
        impl.fn(a, b)


@needs_triton
def test_triton_softmax_refuses_rows_beyond_32_bit_offsets_before_launch():
    impl = _ours("softmax", "triton")
    x = torch.zeros(1, device=_device()).expand(2**31, 4)
    with pytest.raises(ValueError, match=r"x: expected offsets below 2\*\*31"):
        impl.fn(x)


def test_index_range_counts_strides_and_sizes():
    validation.check_index_range("x", torch.zeros(1).expand(2**16, 2**16))  # offsets 0
    # 2**31 elements: the last is at offset 2**31 - 1, still representable
    validation.check_index_range("x", fakes.Shape((2**15, 2**16)))
    with pytest.raises(ValueError, match="largest offset 0, largest dimension 2147483649"):
        validation.check_index_range("x", torch.zeros(1).expand(2**31 + 1))
    with pytest.raises(ValueError, match="largest offset 2147483648"):
        validation.check_index_range("x", fakes.Shape((2, 2), (2**30, -(2**30))))
    with pytest.raises(ValueError, match="largest offset 2147483648"):
        validation.check_index_range("x", fakes.Shape((2**31 + 1,)))
