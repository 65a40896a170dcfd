"""The harness must catch wrong kernels: planted faults fail, and the tolerance model behaves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import checking, devices, dtypes, frameworks, registry

SOFTMAX_CASE = registry.make_case("softmax", "f32", {"rows": 6, "cols": 300}, tags=["cpu"])


@pytest.fixture
def planted():
    """Register a faulty softmax implementation for one test, then remove it."""
    names = []

    def plant(name, fn, framework="jax"):
        names.append(name)
        return registry.register_implementation(registry.Implementation(
            op="softmax", name=name, fn=fn, framework=framework, baseline=True))

    registry.load()
    yield plant
    for name in names:
        registry.unregister_implementation("softmax", name)


def _grad_scaled(scale):
    @jax.custom_vjp
    def f(x):
        return jax.nn.softmax(x, axis=-1)

    def fwd(x):
        y = f(x)
        return y, y

    def bwd(y, dy):
        return (scale * y * (dy - jnp.sum(y * dy, axis=-1, keepdims=True)),)

    f.defvjp(fwd, bwd)
    return f


PLANTED_FAULTS = {
    "zeros": (lambda x: jnp.zeros_like(x), "all zeros"),
    "constant": (lambda x: jnp.full_like(x, 1.0 / x.shape[-1]), "constant"),
    "nan": (lambda x: jnp.full_like(x, jnp.nan), "NaN/inf where the reference is finite"),
    "off-by-little": (lambda x: jax.nn.softmax(x, axis=-1) * 1.001, "rel 1.00e-03"),
    "one-row-wrong": (lambda x: jax.nn.softmax(x, axis=-1).at[3].set(1.0 / x.shape[-1]),
                      "worst at"),
    "wrong-dtype": (lambda x: jax.nn.softmax(x, axis=-1).astype(jnp.float16), "dtype float16"),
    "wrong-gradient": (_grad_scaled(0.99), r"dx: rel 9\.\d+e-03"),
}


@pytest.mark.parametrize("name", PLANTED_FAULTS)
def test_planted_fault_is_caught(planted, name):
    fn, message = PLANTED_FAULTS[name]
    impl = planted(name, fn)
    with pytest.raises(checking.CheckFailure, match=message):
        checking.check(impl, SOFTMAX_CASE, seed=0)


def test_unwritten_output_is_caught_by_poisoning(planted):
    torch = pytest.importorskip("torch")

    def skips_last_column(x):
        out = frameworks.torch_empty(x.shape, x.dtype, x.device)
        out[:, :-1] = torch.softmax(x, dim=-1)[:, :-1]
        return out

    impl = planted("skips-last-column", skips_last_column, framework="torch")
    with pytest.raises(checking.CheckFailure, match=r"6 of 1800 elements are NaN"):
        checking.check(impl, SOFTMAX_CASE, seed=0, gradients=False)


def test_modified_input_is_caught(planted):
    torch = pytest.importorskip("torch")

    def in_place(x):
        return x.copy_(torch.softmax(x, dim=-1))

    impl = planted("in-place", in_place, framework="torch")
    with pytest.raises(checking.CheckFailure, match="input x was modified"):
        checking.check(impl, SOFTMAX_CASE, seed=0, gradients=False)


def test_compare_reports_errors():
    expected = np.linspace(1.0, 2.0, 100)
    result = checking.compare(expected * (1 + 1e-6), expected, tolerance=1e-5, name="y")
    assert result.relative_error == pytest.approx(1e-6, rel=1e-3)
    with pytest.raises(checking.CheckFailure, match=r"shape \(99,\), expected \(100,\)"):
        checking.compare(expected[:99], expected, tolerance=1e-5, name="y")


def test_compare_requires_matching_infinities():
    expected = np.array([0.0, -np.inf, 1.0])
    checking.compare(expected.copy(), expected, tolerance=1e-6, name="y")
    with pytest.raises(checking.CheckFailure, match="reference is -inf"):
        checking.compare(np.array([0.0, 0.0, 1.0]), expected, tolerance=1e-6, name="y")


def test_magnitude_forgives_cancellation_only_up_to_its_size():
    expected = np.array([1e-9, -2e-9])
    magnitude = np.array([1.0, 1.0])
    checking.compare(expected + 1e-8, expected, tolerance=1e-6, name="dx", magnitude=magnitude)
    with pytest.raises(checking.CheckFailure):
        checking.compare(expected + 1e-3, expected, tolerance=1e-6, name="dx", magnitude=magnitude)


def test_tolerance_grows_with_reduction_length_and_dtype():
    assert checking.relative_tolerance("f32", 4096) > checking.relative_tolerance("f32", 16)
    assert checking.relative_tolerance("bf16", 128) > checking.relative_tolerance("f16", 128) \
        > checking.relative_tolerance("f32", 128)
    assert checking.relative_tolerance("bf16", 128) < 1e-2


def test_inputs_are_random_and_never_zero():
    op = registry.operation("softmax")
    a = checking.make_inputs(op, SOFTMAX_CASE, seed=0, distribution="normal")[0]
    b = checking.make_inputs(op, SOFTMAX_CASE, seed=1, distribution="normal")[0]
    large = checking.make_inputs(op, SOFTMAX_CASE, seed=0, distribution="large")[0]
    assert not np.array_equal(a, b)
    assert np.count_nonzero(a) == a.size
    assert np.abs(large).max() > 40 * np.abs(a).max() / 2


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_jax_to_torch_shares_the_buffer(dtype):
    """DLPack hands torch JAX's own buffer (no copy), bf16 included."""
    pytest.importorskip("torch")
    array = jax.device_put(np.arange(1, 13, dtype=dtypes.to_numpy(dtype)).reshape(3, 4))
    tensor = frameworks.jax_to_torch(array)
    assert tensor.data_ptr() == array.unsafe_buffer_pointer()
    np.testing.assert_array_equal(frameworks.torch_to_numpy(tensor), np.asarray(array))


@pytest.mark.gpu
@pytest.mark.skipif(not devices.this_machine().has_gpu, reason="needs a CUDA GPU (JAX and torch)")
def test_torch_inputs_on_gpu_come_zero_copy_from_jax(monkeypatch):
    """On a GPU the harness places torch inputs through JAX and DLPack, not a host copy."""
    torch = pytest.importorskip("torch")
    assert torch.cuda.is_available()
    exported = []

    def recording(array):
        exported.append(array)
        return original(array)

    original = frameworks.jax_to_torch
    monkeypatch.setattr(frameworks, "jax_to_torch", recording)
    inputs = (np.random.default_rng(0).standard_normal((37, 130)).astype(np.float32),)
    (tensor,) = frameworks.framework("torch").from_numpy(inputs)
    assert tensor.is_cuda and len(exported) == 1
    assert tensor.data_ptr() == exported[0].unsafe_buffer_pointer()
    np.testing.assert_array_equal(frameworks.torch_to_numpy(tensor), inputs[0])
