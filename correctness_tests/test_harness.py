"""The harness must catch wrong kernels: planted faults fail, and the tolerance model behaves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from correctness_tests import fakes
from kernels.core import checking, devices, dtypes, frameworks, phases, registry

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


PLANTED_FAULTS = {
    "zeros": (lambda x: jnp.zeros_like(x), "all zeros"),
    "constant": (lambda x: jnp.full_like(x, 1.0 / x.shape[-1]), "constant"),
    "nan": (lambda x: jnp.full_like(x, jnp.nan), "NaN/inf where the reference is finite"),
    "off-by-little": (lambda x: jax.nn.softmax(x, axis=-1) * 1.001, "rel 1.00e-03"),
    "one-row-wrong": (lambda x: jax.nn.softmax(x, axis=-1).at[3].set(1.0 / x.shape[-1]),
                      "worst at"),
    "wrong-dtype": (lambda x: jax.nn.softmax(x, axis=-1).astype(jnp.float16), "dtype float16"),
    "wrong-gradient": (fakes.softmax_with_scaled_gradient(0.99), r"dx: rel 9\.\d+e-03"),
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


def test_unwritten_gradient_is_caught_by_poisoning(planted):
    """The gradients run under the same NaN poisoning as the output: a backward that leaves
    a column of its own buffer unwritten fails on NaN in dx, whatever torch.empty held."""
    torch = pytest.importorskip("torch")
    poisoned = []

    class SkipsLastColumnOfDx(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.softmax(x, dim=-1)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            poisoned.append(frameworks.poisoning())
            dx = frameworks.torch_empty(y.shape, y.dtype, y.device)
            dx[:, :-1] = (y * (dy - (y * dy).sum(dim=-1, keepdim=True)))[:, :-1]
            return dx

    impl = planted("dx-skips-last-column", SkipsLastColumnOfDx.apply, framework="torch")
    with pytest.raises(checking.CheckFailure, match=r" dx: 6 of 1800 elements are NaN"):
        checking.check(impl, SOFTMAX_CASE, seed=0)
    assert poisoned == [True]


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


# The GPU path without a GPU: references kept as device arrays, comparisons and the input
# check reduced by jitted JAX programs, torch results viewed through DLPack. Pointed at
# JAX's CPU device, it runs the same code the H100 runs.
@pytest.fixture
def device_path(monkeypatch):
    programs = []
    original = checking._device_stats_program

    def counting(with_magnitude):
        programs.append(with_magnitude)
        return original(with_magnitude)

    monkeypatch.setattr(checking, "_device_platform", lambda: "cpu")
    monkeypatch.setattr(checking, "DEVICE_COMPARE_MIN_SIZE", 0)
    monkeypatch.setattr(checking, "_device_stats_program", counting)
    return programs


@pytest.mark.parametrize("name", PLANTED_FAULTS)
def test_planted_fault_is_caught_on_the_device_path(planted, device_path, name):
    fn, message = PLANTED_FAULTS[name]
    impl = planted(name, fn)
    with pytest.raises(checking.CheckFailure, match=message):
        checking.check(impl, SOFTMAX_CASE, seed=0)
    if name != "wrong-dtype":  # refused before any comparison
        assert device_path, "the comparison did not take the device path"


def test_correct_kernel_passes_on_the_device_path(planted, device_path):
    impl = planted("correct", lambda x: jax.nn.softmax(x, axis=-1))
    results = checking.check(impl, SOFTMAX_CASE, seed=0)
    assert [r.name.split()[-1] for r in results] == ["output", "dx"]
    assert all(r.relative_error < r.tolerance for r in results)
    assert device_path == [False, True]  # output, then dx with its magnitude


@pytest.mark.multi_gpu  # on a GPU host: GPUs, and the reductions may be collectives
@pytest.mark.skipif(jax.device_count() < 3, reason="needs 3 devices (forced host devices)")
def test_a_result_spread_over_devices_is_compared_on_a_device(device_path, monkeypatch):
    """A sharded result is gathered onto the reference's device (device to device: on the
    4-GPU host, 58% of `pytest -m multi_gpu` once went to copying sharded results to the
    host), so one program per shape serves every mesh; one over GATHER_MAX_BYTES is reduced
    where it is, the reference laid out beside it; a wrong element is found at its place."""
    from jax.sharding import NamedSharding, PartitionSpec

    from kernels.core import compat

    mesh = compat.make_mesh((2,), ("x",), devices=jax.devices()[1:3])
    expected = np.linspace(1.0, 2.0, 64 * 32, dtype=np.float32).reshape(64, 32)
    actual = jax.device_put(expected, NamedSharding(mesh, PartitionSpec("x")))
    result = checking.compare(actual, expected, tolerance=1e-6, name="sharded")
    assert result.relative_error == 0.0 and device_path == [False]
    # The reference's device, wherever it is; with a NumPy reference, the lowest of the
    # result's devices.
    for reference, home in ((jax.device_put(expected, jax.devices()[0]), 0),
                            (jax.device_put(expected, jax.devices()[2]), 2), (expected, 1)):
        gathered = checking._device_arrays(actual, reference, None)
        assert [a.devices() for a in gathered[:2]] == [{jax.devices()[home]}] * 2, home
        assert gathered[2] is None
    monkeypatch.setattr(checking, "GATHER_MAX_BYTES", actual.nbytes - 1)
    arranged = checking._device_arrays(actual, expected, None)
    assert arranged[1].sharding == actual.sharding and arranged[2] is None
    assert checking.compare(actual, expected, tolerance=1e-6, name="sharded").relative_error == 0
    monkeypatch.setattr(checking, "GATHER_MAX_BYTES", actual.nbytes)
    assert len(checking._device_arrays(actual, expected, None)[0].devices()) == 1
    device_path.clear()
    wrong = actual.at[40, 7].set(5.0)
    with pytest.raises(checking.CheckFailure, match=r"sharded: .*\(40, 7\)"):
        checking.compare(wrong, expected, tolerance=1e-3, name="sharded")
    assert device_path == [False]
    with pytest.raises(checking.CheckFailure, match=r"shape \(64, 32\), expected \(32, 64\)"):
        checking.compare(actual, expected.T, tolerance=1e-3, name="sharded")


def test_unwritten_output_is_caught_by_poisoning_on_the_device_path(planted, device_path):
    test_unwritten_output_is_caught_by_poisoning(planted)
    assert device_path


def test_modified_input_is_caught_on_the_device_path(planted, device_path, monkeypatch):
    checks = []
    original = checking._same_program

    def counting():
        checks.append(True)
        return original()

    monkeypatch.setattr(checking, "_same_program", counting)
    test_modified_input_is_caught(planted)
    assert checks, "the input check did not run on the device"


def test_shape_mismatch_is_named_on_both_paths(device_path):
    expected = np.ones((3, 2), np.float32)
    for actual in (np.ones((2, 3), np.float32), jnp.ones((2, 3), jnp.float32)):
        with pytest.raises(checking.CheckFailure, match=r"^y: shape \(2, 3\), expected \(3, 2\)$"):
            checking.compare(actual, jnp.asarray(expected) if isinstance(actual, jax.Array)
                             else expected, tolerance=0.1, name="y")


def _scenarios():
    """(name, actual, expected, magnitude) covering every guard and a pass."""
    rng = np.random.default_rng(3)
    e = rng.standard_normal((40, 70)).astype(np.float32)
    masked = e.copy()
    masked[::7, ::3] = -np.inf
    nan = e.copy()
    nan[5, 9] = np.nan
    nan[30, 1] = np.inf
    off = e.copy()
    off[17, 33] += 0.5
    cancel = (e * 1e-6).astype(np.float32)
    spike = np.zeros((4, 9), np.float32)  # a shape of its own, as "zero-matched" below
    spike[2, 3] = 1e-25
    return [
        ("close", e * np.float32(1 + 1e-6), e, None),
        ("masked-match", masked.copy(), masked, None),
        ("masked-mismatch", np.where(np.isinf(masked), 0, masked).astype(np.float32), masked,
         None),
        ("nan", nan, e, None),
        ("zeros", np.zeros_like(e), e, None),
        ("constant", np.full_like(e, 0.25), e, None),
        ("one-off", off, e, None),
        ("cancellation-forgiven", cancel + np.float32(1e-9), cancel, np.ones_like(e)),
        ("cancellation-too-far", cancel + np.float32(1e-3), cancel, np.ones_like(e)),
        ("16-bit", e.astype(dtypes.to_numpy("bf16")), e, None),
        # A zero reference met by zeros: a peak of 0 must not scale the norms by 0. A shape of
        # its own, so its device program is traced here (a jitted function runs its Python,
        # where a mutant lives, only when traced for a new shape).
        ("zero-matched", np.zeros((3, 5), np.float32), np.zeros((3, 5), np.float32), None),
        # Off by 5% of the one large entry everywhere, at 1e-25: fails by its norm, which
        # float32 squares unscaled would lose.
        ("tiny", np.where(spike > 0, spike, np.float32(5e-27)).astype(np.float32), spike, None),
    ]


@pytest.mark.parametrize("scenario", _scenarios(), ids=lambda s: s[0])
def test_device_comparison_judges_like_the_host(scenario, device_path):
    """Same verdict, same message, same errors (to float32 rounding) on both paths."""
    _, actual, expected, magnitude = scenario

    def outcome(a, e, m):
        try:
            result = checking.compare(a, e, tolerance=1e-4, name="y", magnitude=m)
        except checking.CheckFailure as failure:
            return "fail", str(failure)
        return "pass", (result.relative_error, result.max_error)

    host = outcome(actual, expected, magnitude)
    assert not device_path  # NumPy arrays stay on the host
    device = outcome(jnp.asarray(actual), jnp.asarray(expected),
                     None if magnitude is None else jnp.asarray(magnitude))
    assert device_path, "the JAX arrays were not compared on the device"
    assert host[0] == device[0]
    if host[0] == "fail":
        assert device[1] == host[1]
    else:
        np.testing.assert_allclose(device[1], host[1], rtol=1e-5, atol=1e-12)


def _correct_softmaxes(planted, count):
    return [planted(f"correct{i}", lambda x, i=i: jax.nn.softmax(x + 0.0 * i, axis=-1))
            for i in range(count)]


def test_reference_computed_once_per_case_seed_and_distribution(planted, monkeypatch):
    computed = []
    original = checking.compute_reference

    def counting(op, case, seed, distribution, **kwargs):
        computed.append((case.id, seed, distribution))
        return original(op, case, seed, distribution, **kwargs)

    monkeypatch.setattr(checking, "compute_reference", counting)
    cache = checking.ReferenceCache(2**30)
    for impl in _correct_softmaxes(planted, 3):
        for seed in (0, 1):
            for distribution in ("normal", "large"):
                checking.check(impl, SOFTMAX_CASE, seed=seed, distribution=distribution,
                               references=cache)
    assert sorted(computed) == sorted((SOFTMAX_CASE.id, s, d) for s in (0, 1)
                                      for d in ("normal", "large"))
    assert (cache.misses, cache.hits) == (4, 8)


def test_shared_reference_still_catches_a_planted_fault(planted):
    """A correct kernel fills the cache; the wrong one after it is compared with the same
    reference and still fails (speed from sharing, not from checking less)."""
    cache = checking.ReferenceCache(2**30)
    (correct,) = _correct_softmaxes(planted, 1)
    checking.check(correct, SOFTMAX_CASE, seed=0, references=cache)
    for name, (fn, message) in PLANTED_FAULTS.items():
        with pytest.raises(checking.CheckFailure, match=message):
            checking.check(planted(name, fn), SOFTMAX_CASE, seed=0, references=cache)
    assert cache.misses == 1 and cache.hits == len(PLANTED_FAULTS)


def test_reference_cache_respects_its_bound():
    op = registry.operation("softmax")
    one = checking.compute_reference(op, SOFTMAX_CASE, 0, "normal", with_grad=True)
    cache = checking.ReferenceCache(one.nbytes + one.nbytes // 2)
    for seed in range(4):
        ref = cache.get(op, SOFTMAX_CASE, seed, "normal", with_grad=True)
        assert cache.nbytes <= cache.max_bytes and len(cache) == 1
        np.testing.assert_array_equal(ref.inputs[0], checking.make_inputs(
            op, SOFTMAX_CASE, seed, "normal")[0])
    unbounded_keeps_nothing = checking.ReferenceCache(0)
    ref = unbounded_keeps_nothing.get(op, SOFTMAX_CASE, 0, "normal", with_grad=True)
    assert len(unbounded_keeps_nothing) == 0 and ref.grads is not None
    np.testing.assert_array_equal(ref.output, one.output)


def test_reference_cache_keeps_only_the_latest_case():
    op = registry.operation("softmax")
    other = registry.make_case("softmax", "f32", {"rows": 3, "cols": 7}, tags=["cpu"])
    cache = checking.ReferenceCache(2**30)
    for seed in (0, 1):
        cache.get(op, SOFTMAX_CASE, seed, "normal", with_grad=True)
    cache.get(op, SOFTMAX_CASE, 0, "large", with_grad=True)
    assert len(cache) == 3
    cache.get(op, other, 0, "normal", with_grad=True)
    assert len(cache) == 1
    cache.get(op, SOFTMAX_CASE, 0, "normal", with_grad=True)
    assert (cache.misses, cache.hits, len(cache)) == (5, 0, 1)


def test_the_meshes_of_one_problem_share_its_inputs_and_reference():
    """A mesh lays the work out, it does not change it: the second mesh of a sharded case
    reads the first one's inputs and reference, and a check on it still passes."""
    op = registry.operation("sharded_matmul")
    by_mesh = {c.kwargs["mesh"]: c for c in op.cases if c.id.startswith("f32-64x32x48-")}
    assert {"4x2", "2x4"} <= set(by_mesh)
    cache = checking.ReferenceCache(2**30)
    first = cache.get(op, by_mesh["4x2"], 0, "normal", with_grad=True)
    assert cache.get(op, by_mesh["2x4"], 0, "normal", with_grad=True) is first
    assert (cache.misses, cache.hits) == (1, 1)
    assert checking.reference_case(by_mesh["2x4"]).kwargs["mesh"] == checking.REFERENCE_MESH
    assert checking.reference_case(SOFTMAX_CASE) is SOFTMAX_CASE  # no mesh, nothing changes
    if jax.device_count() >= 8:
        impl = registry.implementation("sharded_matmul", "xla")
        assert checking.check(impl, by_mesh["2x4"], references=cache)
        assert cache.misses == 1


def test_reference_cache_recomputes_to_add_gradients():
    op = registry.operation("softmax")
    cache = checking.ReferenceCache(2**30)
    assert not cache.get(op, SOFTMAX_CASE, 0, "normal", with_grad=False).with_grad
    assert cache.get(op, SOFTMAX_CASE, 0, "normal", with_grad=True).with_grad
    assert cache.get(op, SOFTMAX_CASE, 0, "normal", with_grad=False).with_grad
    assert (cache.misses, cache.hits) == (2, 1)


def test_cached_inputs_are_read_only():
    op = registry.operation("softmax")
    ref = checking.compute_reference(op, SOFTMAX_CASE, 0, "normal", with_grad=True)
    for array in (*ref.inputs, ref.cotangent):
        with pytest.raises(ValueError, match="read-only"):
            array[0, 0] = 1.0


def test_check_times_its_phases(planted):
    impl = planted("timed", jax.jit(lambda x: jax.nn.softmax(x, axis=-1)))
    timer = phases.PhaseTimer()
    with timer.active():
        checking.check(impl, SOFTMAX_CASE, seed=5, timer=timer)
    assert set(phases.PHASES) <= set(timer.seconds)
    assert timer.seconds["jax_compile"] > 0  # a fresh jit of a fresh function compiles
    assert timer.total == pytest.approx(sum(timer.seconds[p] for p in phases.PHASES))


def _last_column_wrong(y):
    """The last entry of every row moved: 1.5 y + 0.01 (NaN-free, wrong in every case)."""
    return y.at[..., -1].set(y[..., -1] * 1.5 + 0.01)


REAL_SIZE_CASE = registry.make_case("softmax", "f32", {"rows": 32768, "cols": 4096},
                                    tags=["gpu"])
REAL_SIZE_FAULTS = {
    "one-nan": (lambda x: jax.nn.softmax(x, axis=-1).at[12345, 678].set(jnp.nan),
                r"output: 1 of 134217728 elements are NaN/inf .*first at \(12345, 678\)"),
    "one-element-off": (lambda x: jax.nn.softmax(x, axis=-1).at[20000, 5].add(1e-3),
                        r"output: .* worst at \(20000, 5\)"),
    "last-column": (lambda x: _last_column_wrong(jax.nn.softmax(x, axis=-1)), "output: rel"),
    "zeros": (lambda x: jnp.zeros_like(x), "all zeros"),
    "wrong-gradient": (fakes.softmax_with_scaled_gradient(0.99), r"dx: rel \d\.\d+e-03"),
}


@pytest.mark.gpu
@pytest.mark.skipif(not devices.this_machine().has_gpu, reason="needs a CUDA GPU (real size)")
def test_planted_faults_are_caught_at_real_size(planted):
    """softmax f32 32768 x 4096 (134M elements): every plant fails on the device path, with
    one reference shared by all of them, and a correct kernel passes."""
    assert checking._device_platform() == "gpu"
    cache = checking.ReferenceCache(4 * 2**30)
    results = checking.check(planted("correct", lambda x: jax.nn.softmax(x, axis=-1)),
                             REAL_SIZE_CASE, seed=0, references=cache)
    assert all(r.relative_error < r.tolerance for r in results)
    for name, (fn, message) in REAL_SIZE_FAULTS.items():
        with pytest.raises(checking.CheckFailure, match=message):
            checking.check(planted(name, fn), REAL_SIZE_CASE, seed=0, references=cache)
    assert cache.misses == 1


@pytest.mark.gpu
@pytest.mark.skipif(not devices.this_machine().has_gpu, reason="needs a CUDA GPU (real size)")
def test_torch_faults_are_caught_at_real_size(planted):
    """The same through torch on the GPU: an unwritten column (NaN poison, read through
    DLPack) and an input overwritten in place (checked on the device)."""
    torch = pytest.importorskip("torch")

    def skips_last_column(x):
        out = frameworks.torch_empty(x.shape, x.dtype, x.device)
        out[:, :-1] = torch.softmax(x, dim=-1)[:, :-1]
        return out

    def in_place(x):
        return x.copy_(torch.softmax(x, dim=-1))

    cache = checking.ReferenceCache(4 * 2**30)
    with pytest.raises(checking.CheckFailure, match=r"32768 of 134217728 elements are NaN"):
        checking.check(planted("skips-last-column", skips_last_column, framework="torch"),
                       REAL_SIZE_CASE, seed=0, gradients=False, references=cache)
    with pytest.raises(checking.CheckFailure, match="input x was modified"):
        checking.check(planted("in-place", in_place, framework="torch"), REAL_SIZE_CASE,
                       seed=0, gradients=False, references=cache)


def test_chunked_generator_depends_on_the_seed_alone(monkeypatch):
    # Large draws are filled in threads from per-chunk child seeds: the same values whatever
    # the thread count, different per seed and per draw, standard normal; small draws are
    # exactly default_rng's, so CPU-sized cases keep their inputs.
    monkeypatch.setattr(checking.ChunkedGenerator, "MIN_ELEMENTS", 1000)
    draws = []
    for workers in ("1", "64"):  # 64 workers: one thread on this machine
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
        rng = checking.ChunkedGenerator(7)
        draws.append((rng.standard_normal((300, 70), dtype=np.float32),
                      rng.standard_normal((300, 70), dtype=np.float32), rng.random(5000)))
    for a, b in zip(*draws, strict=True):
        assert np.array_equal(a, b)
    first, second, uniform = draws[0]
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, checking.ChunkedGenerator(8).standard_normal(
        (300, 70), dtype=np.float32))
    assert first.dtype == np.float32 and abs(first.mean()) < 0.05 and abs(first.std() - 1) < 0.05
    assert 0 <= uniform.min() and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.02
    small = checking.ChunkedGenerator(7).standard_normal((10, 9), dtype=np.float32)
    assert np.array_equal(small, np.random.default_rng(7).standard_normal((10, 9),
                                                                          dtype=np.float32))


# The harness's own guards on what an operation declares, and its settings.

def _softmax_making(make):
    """Softmax's declaration with its input maker replaced."""
    import dataclasses

    return dataclasses.replace(registry.operation("softmax"), make_inputs=make)


def test_make_inputs_refuses_an_unknown_distribution_naming_the_known():
    op = registry.operation("softmax")
    with pytest.raises(ValueError, match=r"^distribution: expected one of \('normal', 'large'\), "
                                         r"got 'uniform'$"):
        checking.make_inputs(op, SOFTMAX_CASE, 0, "uniform")


def test_make_inputs_refuses_inputs_of_another_dtype_or_all_zeros():
    wrong_dtype = _softmax_making(lambda case, rng, dist: (np.ones((6, 300), np.float64),))
    with pytest.raises(TypeError, match=r"^softmax.make_inputs: x has dtype float64, case wants "
                                        r"float32$"):
        checking.make_inputs(wrong_dtype, SOFTMAX_CASE, 0, "normal")
    zeros = _softmax_making(lambda case, rng, dist: (np.zeros((6, 300), np.float32),))
    with pytest.raises(ValueError, match=r"^softmax.make_inputs: x is all zeros; inputs must not "
                                         r"be$"):
        checking.make_inputs(zeros, SOFTMAX_CASE, 0, "normal")
    empty = _softmax_making(lambda case, rng, dist: (np.zeros((0, 300), np.float32),))
    assert checking.make_inputs(empty, SOFTMAX_CASE, 0, "normal")[0].size == 0


def test_make_inputs_hands_the_seeded_generator_to_the_operation():
    seen = []

    def make(case, rng, dist):
        seen.append((case, dist))
        return (rng.standard_normal((6, 300), dtype=np.float32),)

    first = checking.make_inputs(_softmax_making(make), SOFTMAX_CASE, 5, "large")[0]
    again = checking.make_inputs(_softmax_making(make), SOFTMAX_CASE, 5, "large")[0]
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(
        first, np.random.default_rng(5).standard_normal((6, 300), dtype=np.float32))
    assert seen == [(SOFTMAX_CASE, "large")] * 2


def test_a_reference_has_gradients_exactly_when_it_has_a_cotangent():
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="^grads: expected exactly when a cotangent is given$"):
        checking.Reference(inputs=(x,), output=x, cotangent=x)
    with pytest.raises(ValueError, match="^grads: expected exactly when a cotangent is given$"):
        checking.Reference(inputs=(x,), output=x, grads=(x,))
    plain = checking.Reference(inputs=(x,), output=x)
    assert not plain.with_grad and plain.nbytes == 24
    full = checking.Reference(inputs=(x,), output=x, cotangent=x, grads=(x,),
                              magnitudes=(None,), device_inputs=(x,))
    assert full.with_grad and full.nbytes == 5 * 12


def test_the_shared_reference_cache_is_sized_by_its_variable(monkeypatch):
    make = checking.shared_references.__wrapped__  # the cache itself is one per process
    monkeypatch.delenv(checking.CACHE_VARIABLE, raising=False)
    assert make().max_bytes == checking.DEFAULT_CACHE_MB["cpu"] * 2**20
    monkeypatch.setattr(checking.compat, "on_gpu", lambda: True)
    assert make().max_bytes == checking.DEFAULT_CACHE_MB["gpu"] * 2**20
    monkeypatch.setenv(checking.CACHE_VARIABLE, " 64 ")
    assert make().max_bytes == 64 * 2**20
    monkeypatch.setenv(checking.CACHE_VARIABLE, "lots")
    with pytest.raises(ValueError, match=r"^KERNELPERF_REFERENCE_CACHE_MB: expected a whole "
                                         r"number of MiB, got 'lots'$"):
        make()
    with pytest.raises(ValueError, match=r"^max_bytes: expected >= 0, got -1$"):
        checking.ReferenceCache(-1)


def test_the_harness_compiles_without_autotuning_on_a_gpu_only(monkeypatch):
    """XLA's GPU autotuning is turned off for the harness's own programs (references,
    comparisons) on a GPU, and no option is passed elsewhere."""
    compiled = []

    def recording_jit(fn, **options):
        compiled.append(options)
        return fn

    monkeypatch.setattr(jax, "jit", recording_jit)
    for platform, options in (("gpu", {"xla_gpu_autotune_level": 0}), (None, None)):
        monkeypatch.setattr(checking, "_device_platform", lambda platform=platform: platform)
        checking._jit_unautotuned(abs)
        assert compiled.pop() == {"compiler_options": options}


def test_check_hands_the_case_to_prepare_and_its_parameters_to_the_kernel():
    """What `check` calls: `prepare(case, *inputs)` and `fn(*args, **case.kwargs)`, for the
    forward and again for the gradients."""
    op = registry.operation("attention")
    case = op.case("bf16-2x37x2x64-causal")
    xla = registry.implementation("attention", "xla")
    prepared, called = [], []

    def prepare(case, *inputs):
        prepared.append(case)
        return inputs

    def fn(*args, **kwargs):
        called.append(kwargs)
        return xla.fn(*args, **kwargs)

    impl = registry.Implementation(op="attention", name="recording", fn=fn, prepare=prepare)
    results = checking.check(impl, case)
    assert prepared == [case, case]
    assert called and all(kwargs == {"causal": True} for kwargs in called)
    assert [r.name for r in results] == [
        f"attention-recording[{case.id}, normal, seed 0, BF16] {part}"
        for part in ("output", "dq", "dk", "dv")]


def test_check_without_gradients_compares_the_output_alone(planted):
    impl = planted("correct-fwd-only", lambda x: jax.nn.softmax(x, axis=-1))
    (output,) = checking.check(impl, SOFTMAX_CASE, seed=3, distribution="large",
                               gradients=False)
    assert output.name == "softmax-correct-fwd-only[f32-6x300, large, seed 3, FP32] output"
    assert output.tolerance == registry.operation("softmax").tolerance(SOFTMAX_CASE)


def test_reference_outputs_are_the_references_value_and_vjp_in_float32():
    op = registry.operation("softmax")
    (x,) = checking.make_inputs(op, SOFTMAX_CASE, 0, "normal")
    out, grads, magnitudes = checking.reference_outputs(op, SOFTMAX_CASE, (x,), None)
    np.testing.assert_allclose(out, jax.nn.softmax(x, axis=-1), rtol=1e-6)
    assert out.dtype == np.float32 and grads is None and magnitudes is None
    cotangent = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    out, (dx,), (magnitude,) = checking.reference_outputs(op, SOFTMAX_CASE, (x,), cotangent)
    _, pullback = jax.vjp(lambda a: jax.nn.softmax(a, axis=-1), x)
    assert isinstance(out, np.ndarray) and isinstance(dx, np.ndarray)
    np.testing.assert_allclose(dx, pullback(cotangent)[0], rtol=1e-5, atol=1e-7)
    assert isinstance(magnitude, np.ndarray) and magnitude.shape == x.shape
    assert np.all(magnitude >= np.abs(dx) - 1e-6)


# Properties the mutation run (2026-11-27) found unstated: each test names what it guards.

def test_the_device_path_is_taken_on_a_gpu_only(monkeypatch):
    """On a GPU machine the harness works on JAX's "gpu" platform (the name JAX gives CUDA
    devices, which the device path matches arrays against); elsewhere references stay on the
    host as NumPy arrays, with no device copies of the inputs."""
    monkeypatch.setattr(checking.compat, "on_gpu", lambda: True)
    assert checking._device_platform() == "gpu"
    monkeypatch.setattr(checking.compat, "on_gpu", lambda: False)
    assert checking._device_platform() is None
    ref = checking.compute_reference(registry.operation("softmax"), SOFTMAX_CASE, 0, "normal",
                                     with_grad=True)
    assert isinstance(ref.output, np.ndarray) and ref.device_inputs is None
    assert all(isinstance(g, np.ndarray) for g in ref.grads)


def test_arrays_from_the_size_threshold_up_are_compared_on_the_device(device_path,
                                                                       monkeypatch):
    """DEVICE_COMPARE_MIN_SIZE is the smallest array reduced on the device: one element fewer
    stays on the host."""
    monkeypatch.setattr(checking, "DEVICE_COMPARE_MIN_SIZE", 64)
    for size, on_device in ((63, False), (64, True)):
        device_path.clear()
        values = jnp.linspace(1.0, 2.0, size, dtype=jnp.float32)
        checking.compare(values, values, tolerance=1e-6, name="y")
        assert bool(device_path) == on_device, size


def test_float64_torch_results_are_compared_in_float64_on_the_device_path(device_path):
    """JAX runs without x64, so float64 stays on the host, in float64, torch's too (which once
    went to the device and was judged in float32): an error of exactly 1e-9 is measured as
    such, and the values are shown to float64's digits."""
    torch = pytest.importorskip("torch")
    expected = torch.linspace(1.0, 2.0, 64, dtype=torch.float64)
    with pytest.raises(checking.CheckFailure, match=r"^f64: rel 1\.00e-09, max 1\.00e-09 .* "
                                                    r"got 2\.000000002, expected 2\.0$"):
        checking.compare(expected * (1 + 1e-9), expected, tolerance=1e-12, name="f64")
    assert not device_path


def test_torch_results_of_16_bits_compare_on_the_host():
    """A torch bfloat16 result (which NumPy cannot read directly) against a float32 reference:
    rounding to bf16 passes its tolerance, a 1% error fails."""
    torch = pytest.importorskip("torch")
    expected = np.linspace(1.0, 2.0, 32, dtype=np.float32)
    tolerance = checking.relative_tolerance("bf16", 1)
    checking.compare(torch.tensor(expected, dtype=torch.bfloat16), expected,
                     tolerance=tolerance, name="bf16")
    with pytest.raises(checking.CheckFailure, match="worst at"):
        checking.compare(torch.tensor(expected * 1.01, dtype=torch.bfloat16), expected,
                         tolerance=tolerance, name="bf16")


@pytest.mark.multi_gpu  # on a GPU host: GPUs, and the reductions may be collectives
@pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 devices (forced host devices)")
def test_a_sharded_result_compares_with_a_torch_reference(device_path):
    """compare takes any mix of NumPy, JAX and torch, a result spread over devices included:
    a torch reference is not laid out as the sharded result (JAX cannot place a tensor) but
    compared where it can be, with the same verdict."""
    torch = pytest.importorskip("torch")
    from jax.sharding import NamedSharding, PartitionSpec

    from kernels.core import compat

    mesh = compat.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    expected = np.linspace(1.0, 2.0, 64, dtype=np.float32).reshape(8, 8)
    actual = jax.device_put(expected, NamedSharding(mesh, PartitionSpec("x")))
    assert checking.compare(actual, torch.tensor(expected), tolerance=1e-6,
                            name="mixed").relative_error == 0
    with pytest.raises(checking.CheckFailure, match=r"worst at \(5, 1\)"):
        checking.compare(actual.at[5, 1].set(9.0), torch.tensor(expected), tolerance=1e-3,
                         name="mixed")


def test_a_magnitude_of_another_shape_is_refused_on_the_device_path(device_path):
    expected = jnp.ones((4, 3), jnp.float32)
    with pytest.raises(ValueError, match=r"^magnitude: expected shape \(4, 3\), got \(3, 4\)$"):
        checking.compare(expected, expected, tolerance=0.1, name="dx",
                         magnitude=jnp.ones((3, 4), jnp.float32))


ROW_SUM_CASE = registry.make_case("row_sum", "f32", {"rows": 5, "cols": 40}, tags=["cpu"])


def test_an_operation_without_term_magnitudes_is_checked_forward_and_backward():
    """row_sum declares no gradient magnitudes: its reference carries None per input, and a
    correct kernel's gradient is compared against the reference alone, and passes."""
    op = registry.operation("row_sum")
    assert op.gradient_magnitude is None
    (x,) = checking.make_inputs(op, ROW_SUM_CASE, 0, "normal")
    cotangent = np.ones(x.shape[:-1], np.float32)
    out, (dx,), magnitudes = checking.reference_outputs(op, ROW_SUM_CASE, (x,), cotangent)
    np.testing.assert_allclose(out, x.sum(axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(dx, np.ones_like(x))
    assert len(magnitudes) == 1 and magnitudes[0] is None
    results = checking.check(registry.implementation("row_sum", "xla"), ROW_SUM_CASE)
    assert [r.name.split()[-1] for r in results] == ["output", "dx"]


def test_make_inputs_refuses_another_number_of_inputs_than_the_operation_names():
    one = np.ones((6, 300), np.float32)
    for made in ((), (one, one)):
        with pytest.raises(ValueError, match="zip"):
            checking.make_inputs(_softmax_making(lambda case, rng, dist, made=made: made),
                                 SOFTMAX_CASE, 0, "normal")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_cotangent_is_the_seeds_alone_in_the_case_dtype(dtype):
    """The kernel and the reference get the same cotangent values: rounded to the case dtype,
    and drawn again the same for the same seed (another seed, another cotangent)."""
    op = registry.operation("softmax")
    case = registry.make_case("softmax", dtype, {"rows": 6, "cols": 300}, tags=["cpu"])
    first, again, other = (checking.compute_reference(op, case, seed, "normal", with_grad=True)
                           for seed in (0, 0, 1))
    assert first.cotangent.dtype == dtypes.to_numpy(dtype)
    np.testing.assert_array_equal(first.cotangent, again.cotangent)
    assert not np.array_equal(first.cotangent, other.cotangent)


def test_reference_cache_keeps_what_fits_exactly_and_drops_the_least_recently_used():
    """The bound is inclusive (an entry, or two, of exactly its size are kept), and when a new
    reference does not fit, the one used longest ago goes."""
    op = registry.operation("softmax")
    size = checking.compute_reference(op, SOFTMAX_CASE, 0, "normal", with_grad=True).nbytes
    exact = checking.ReferenceCache(size)
    exact.get(op, SOFTMAX_CASE, 0, "normal", with_grad=True)
    assert len(exact) == 1 and exact.nbytes == exact.max_bytes
    cache = checking.ReferenceCache(2 * size)
    for seed in (0, 1, 0, 2):  # seed 0 used again after 1: 1 is the least recent
        cache.get(op, SOFTMAX_CASE, seed, "normal", with_grad=True)
    assert len(cache) == 2 and (cache.misses, cache.hits) == (3, 1)
    cache.get(op, SOFTMAX_CASE, 0, "normal", with_grad=True)
    cache.get(op, SOFTMAX_CASE, 2, "normal", with_grad=True)
    assert (cache.misses, cache.hits) == (3, 3)


def test_an_input_holding_nan_left_alone_is_not_modified(planted, monkeypatch):
    """NaN is not equal to itself, but an input whose NaN the kernel did not touch was not
    modified: the input check compares NaN as equal to NaN (the output's NaN rows match the
    reference's)."""
    original = checking.make_inputs

    def with_a_nan(op, case, seed, distribution):
        (x,) = original(op, case, seed, distribution)
        x = x.copy()
        x[2, 5] = np.nan
        return (x,)

    monkeypatch.setattr(checking, "make_inputs", with_a_nan)
    impl = planted("correct-with-nan", lambda x: jax.nn.softmax(x, axis=-1))
    (output,) = checking.check(impl, SOFTMAX_CASE, gradients=False)
    assert output.relative_error < output.tolerance


def test_the_chunked_generator_keeps_default_rngs_other_methods_dtypes_and_out():
    """Every method but the two chunked ones is default_rng(seed)'s; the chunked ones honour
    `dtype` and `out` as NumPy's do, small draws and large."""
    rng, plain = checking.ChunkedGenerator(3), np.random.default_rng(3)
    np.testing.assert_array_equal(rng.integers(0, 100, 20), plain.integers(0, 100, 20))
    assert checking.ChunkedGenerator(3).random(5, dtype=np.float32).dtype == np.float32
    for method in ("standard_normal", "random"):
        for size in (7, checking.ChunkedGenerator.MIN_ELEMENTS):
            out = np.full(size, np.nan, np.float32)
            returned = getattr(checking.ChunkedGenerator(3), method)(size, np.float32, out)
            assert returned is out and np.all(np.isfinite(out)), (method, size)
            np.testing.assert_array_equal(out, getattr(np.random.default_rng(3), method)(
                size, dtype=np.float32))


def test_large_draws_are_filled_on_the_workers_share_of_the_cores(monkeypatch):
    """A draw of MIN_ELEMENTS or more runs on min(CHUNKS, cores // xdist workers) threads,
    at least one (never more than this worker's share of the machine); a smaller one on none."""
    import concurrent.futures

    pools = []
    original = concurrent.futures.ThreadPoolExecutor

    def recording(max_workers=None, *args, **kwargs):
        pools.append(max_workers)
        return original(max_workers, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", recording)
    monkeypatch.setattr(checking.ChunkedGenerator, "MIN_ELEMENTS", 1000)
    monkeypatch.setattr(checking.environment, "cpu_count", lambda: 8)
    for workers, threads in (("3", 2), ("16", 1), ("1", 8)):
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
        pools.clear()
        rng = checking.ChunkedGenerator(0)
        rng.standard_normal(999)
        rng.random((10, 100))
        assert pools == [threads], workers
        assert all(type(n) is int for n in pools)


def test_a_numpy_argument_keeps_the_comparison_on_the_host(device_path):
    """The device path is for arrays already there: a NumPy reference beside a JAX result on
    one device is compared on the host, not copied over to compile a reduction for it."""
    values = np.linspace(1.0, 2.0, 64, dtype=np.float32)
    assert checking.compare(jnp.asarray(values), values, tolerance=1e-6,
                            name="y").relative_error == 0
    assert checking._device_arrays(jnp.asarray(values), values, None) is None
    assert not device_path
