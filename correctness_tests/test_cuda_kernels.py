"""CUDA kernels beyond the generic registry tests: bad input rejected before CUDA is touched
(runs on CPU), configs validated, and on a GPU every kernel version checked by forcing it."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from kernels.core import checking, dtypes, frameworks, registry
from kernels.cuda import build, runtime

torch = pytest.importorskip("torch")

from kernels.ops.matmul import cuda_mma, cuda_sgemm, cuda_wgmma  # noqa: E402
from kernels.ops.row_sum import cuda as row_sum_cuda  # noqa: E402
from kernels.ops.softmax import cuda as softmax_cuda  # noqa: E402

pytestmark = pytest.mark.cuda

GPU = torch.cuda.is_available()


def on_gpu(test):
    """Runs on a CUDA GPU; small enough for the compute-sanitizer runs (`-m "cuda and small"`)."""
    for mark in (pytest.mark.gpu, pytest.mark.small,
                 pytest.mark.skipif(not GPU, reason="needs a CUDA GPU; torch sees none")):
        test = mark(test)
    return test

# (function, valid CPU arguments): the first argument is named x or a.
CALLS = {
    "softmax-cuda": (softmax_cuda.softmax, lambda: (torch.randn(4, 8),), "x"),
    "row_sum-cuda": (row_sum_cuda.row_sum, lambda: (torch.randn(4, 8),), "x"),
    "matmul-cuda_sgemm": (cuda_sgemm.matmul, lambda: (torch.randn(4, 8), torch.randn(8, 3)), "a"),
    "matmul-cuda_mma": (cuda_mma.matmul, lambda: (torch.randn(4, 8, dtype=torch.bfloat16),
                                                  torch.randn(8, 3, dtype=torch.bfloat16)), "a"),
    "matmul-cuda_wgmma": (cuda_wgmma.matmul, lambda: (torch.randn(4, 8, dtype=torch.bfloat16),
                                                      torch.randn(8, 8, dtype=torch.bfloat16)),
                          "a"),
}


def test_every_cuda_implementation_is_covered_here():
    cuda_impls = {impl.id for impl in registry.implementations()
                  if impl.name == "cuda" or impl.name.startswith("cuda_")}
    assert cuda_impls == set(CALLS)
    for impl_id in CALLS:
        impl = registry.implementation(*impl_id.split("-", 1))
        assert impl.requires.gpu and impl.framework == "torch" and not impl.differentiable


@pytest.fixture
def no_build(monkeypatch):
    """Fail loudly if anything tries to build or load a library: validation must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("reached the CUDA build before rejecting the input")
    monkeypatch.setattr(build, "build", refuse)


@pytest.mark.parametrize("impl_id", CALLS)
def test_cpu_tensor_is_rejected_before_cuda(impl_id, no_build):
    fn, make_args, name = CALLS[impl_id]
    with pytest.raises(ValueError, match=f"^{name}: expected a CUDA tensor, got device cpu$"):
        fn(*make_args())


@pytest.mark.parametrize("impl_id", CALLS)
def test_non_contiguous_tensor_is_rejected(impl_id, no_build):
    fn, make_args, name = CALLS[impl_id]
    args = list(make_args())
    args[0] = args[0].t().contiguous().t()  # same values, column-major strides
    with pytest.raises(ValueError, match=rf"{name}: expected a contiguous tensor, got shape "
                                         rf"\(4, 8\) with strides \(1, 4\)"):
        fn(*args)


@pytest.mark.parametrize("impl_id", CALLS)
def test_tensor_needing_gradients_is_rejected(impl_id, no_build):
    fn, make_args, name = CALLS[impl_id]
    args = list(make_args())
    args[0].requires_grad_(True)
    with pytest.raises(ValueError, match=f"{name}: requires grad, but this CUDA kernel is "
                                         f"forward-only"):
        fn(*args)


@pytest.mark.parametrize("impl_id", CALLS)
def test_numpy_array_is_rejected(impl_id, no_build):
    fn, make_args, name = CALLS[impl_id]
    # The same arrays in NumPy, in their own dtypes.
    args = [np.asarray(a.float()).astype(dtypes.to_numpy(dtypes.short_name(a.dtype)))
            for a in make_args()]
    with pytest.raises(TypeError, match=f"{name}: expected a torch tensor, got ndarray"):
        fn(*args)


def test_spec_errors_come_before_device_errors(no_build):
    with pytest.raises(TypeError, match=r"x: expected dtype in \(float32, bfloat16, float16\), "
                                        r"got int32"):
        softmax_cuda.softmax(torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="b: expected 8 rows to match a's columns"):
        cuda_sgemm.matmul(torch.randn(4, 8), torch.randn(7, 3))


def test_matmul_kernels_take_only_their_dtypes(no_build):
    with pytest.raises(TypeError, match="a: cuda_sgemm expects float32 .* got bfloat16"):
        cuda_sgemm.matmul(torch.ones(4, 8, dtype=torch.bfloat16),
                          torch.ones(8, 3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="a: cuda_mma expects bfloat16 or float16 .* got float32"):
        cuda_mma.matmul(torch.ones(4, 8), torch.ones(8, 3))
    case = registry.make_case("matmul", "bf16", {"m": 8, "n": 8, "k": 8})
    with pytest.raises(TypeError, match="a: cuda_wgmma expects bfloat16 or float16 .* got "
                                        "float32"):
        cuda_wgmma.matmul(torch.ones(4, 8), torch.ones(8, 8))
    assert "float32 only" in cuda_sgemm.supports(case)
    assert cuda_mma.supports(case) is None
    assert "takes bf16/f16" in cuda_wgmma.supports(
        registry.make_case("matmul", "f32", {"m": 8, "n": 8, "k": 8}))


def test_wgmma_refuses_strides_tma_cannot_take(no_build):
    """TMA needs 16-byte row strides: k and n multiples of 8, refused with the shape named."""
    for m, n, k in [(8, 12, 8), (8, 8, 12), (33, 17, 65)]:
        case = registry.make_case("matmul", "bf16", {"m": m, "n": n, "k": k})
        assert f"multiples of 8 (16-byte row strides); got k={k}, n={n}" in \
            cuda_wgmma.supports(case)
        with pytest.raises(ValueError, match=f"a, b: cuda_wgmma needs k and n multiples of 8 .* "
                                             f"got k={k}, n={n}"):
            cuda_wgmma.matmul(torch.ones(m, k, dtype=torch.bfloat16),
                              torch.ones(k, n, dtype=torch.bfloat16))


@pytest.mark.skipif(GPU and torch.cuda.get_device_capability() == (9, 0),
                    reason="checks the refusal on machines without a Hopper GPU")
def test_wgmma_skips_without_hopper():
    impl = registry.implementation("matmul", "cuda_wgmma")
    assert impl.requires.min_compute_capability == (9, 0)
    if GPU:  # another GPU: refused by supports(), naming what it needs
        case = registry.make_case("matmul", "bf16", {"m": 64, "n": 64, "k": 64})
        assert "needs a Hopper GPU (sm_90a" in cuda_wgmma.supports(case)
    assert "sm_90a" in cuda_wgmma._capability_reason((10, 0))
    assert cuda_wgmma._capability_reason((9, 0)) is None


def test_row_kernels_flatten_leading_axes_and_cap_columns_at_int32():
    import torch

    assert runtime.rows_and_cols(torch.empty(4, 5, 6)) == (20, 6)
    assert runtime.rows_and_cols(torch.empty(0, 7)) == (0, 7)
    wide = torch.empty(1).expand(3, 2**31)  # stride 0: no memory behind it
    with pytest.raises(ValueError, match=r"x: expected at most 2147483647 columns, got 2147483648"):
        runtime.rows_and_cols(wide)


def test_configs_validate_their_fields():
    with pytest.raises(ValueError, match="threads_per_row: expected a multiple of 32 in "
                                         r"\[32, 1024\], got 48"):
        softmax_cuda.SoftmaxConfig(threads_per_row=48)
    with pytest.raises(ValueError, match="rows_per_block: expected 1, or up to 32"):
        softmax_cuda.SoftmaxConfig(threads_per_row=128, rows_per_block=2)
    with pytest.raises(ValueError, match=r"vectors_per_thread: expected one of \(1, 2, 4, 8\), "
                                         "got 3"):
        row_sum_cuda.RowSumConfig(threads_per_row=32, vectors_per_thread=3)
    with pytest.raises(ValueError, match=r"block_n: expected one of \(128, 256\), got 64"):
        cuda_mma.MmaConfig(block_n=64)
    with pytest.raises(ValueError, match=r"group_m: expected an int in \[1, 1024\], got 0"):
        cuda_wgmma.WgmmaConfig(group_m=0)


@pytest.mark.parametrize("width", [1, 4, 8])
@pytest.mark.parametrize("cols", [1, 5, 128, 1000, 1025, 4097, 8191, 32768, 65536, 100000])
def test_default_configs_fit_the_row(cols, width):
    config = softmax_cuda.default_config(cols, width)
    assert config.online or config.capacity(width) >= cols
    assert config.vectors_per_thread <= runtime.max_vectors_per_thread(width)
    assert config.online == (cols > 1024 * runtime.max_vectors_per_thread(width) * width)
    summing = row_sum_cuda.default_config(cols, width)
    assert summing.vectors_per_thread <= runtime.max_vectors_per_thread(width)


# ----------------------------------------------------------------------------------------------
# On a GPU: each kernel version, forced through its config, against the operation's reference.

def _inputs(op_name: str, dtype: str, dims: dict[str, int], *, seed: int = 0):
    op = registry.operation(op_name)
    case = registry.make_case(op_name, dtype, dims)
    inputs = checking.make_inputs(op, case, seed, "normal")
    return op, case, inputs


def _check(op, case, inputs, out, name):
    expected = np.asarray(op.reference(*[np.asarray(x, np.float32) for x in inputs]))
    checking.compare(frameworks.torch_to_numpy(out), expected, tolerance=op.tolerance(case),
                     name=name)


SMALL_CASES = [(impl_id, case) for impl_id in CALLS
               for case in registry.operation(impl_id.split("-")[0]).cases_tagged("cpu")]


@on_gpu
@pytest.mark.parametrize("impl_id, case", SMALL_CASES,
                         ids=[f"{impl_id}-{case.id}" for impl_id, case in SMALL_CASES])
def test_small_registry_cases(impl_id, case):
    """The registry's small ("cpu") cases through the harness, needing only torch's GPU.

    test_kernels.py covers these too, but only where JAX sees the GPU; the
    compute-sanitizer runs set JAX_PLATFORMS=cpu (references on the host) so that
    only torch's kernels and ours touch the device, and rely on this test.
    """
    impl = registry.implementation(*impl_id.split("-", 1))
    reason = impl.supports(case)
    if reason:
        pytest.skip(reason)
    checking.check(impl, case, seed=0, distribution="normal")


SOFTMAX_VERSIONS = [
    ("f32", 100, dict(threads_per_row=32, rows_per_block=4, vectors_per_thread=1)),
    ("f32", 1000, dict(threads_per_row=32, rows_per_block=2, vectors_per_thread=8)),
    ("bf16", 1000, dict(threads_per_row=32, rows_per_block=4, vectors_per_thread=4)),
    ("f16", 250, dict(threads_per_row=32, rows_per_block=8, vectors_per_thread=8,
                      vectorize=False)),
    ("f32", 5000, dict(threads_per_row=256, vectors_per_thread=8)),
    ("bf16", 8192, dict(threads_per_row=1024, vectors_per_thread=1)),
    ("f32", 3001, dict(threads_per_row=1024, vectors_per_thread=4, vectorize=False)),
    ("f32", 20000, dict(threads_per_row=128, online=True)),
    ("bf16", 4104, dict(threads_per_row=64, online=True)),
    ("f16", 3001, dict(threads_per_row=256, online=True, vectorize=False)),
    # Odd widths with vectors: every row has its own scalar head and tail.
    ("f16", 37, dict(threads_per_row=32, rows_per_block=3, vectors_per_thread=1)),
    ("bf16", 3001, dict(threads_per_row=512, vectors_per_thread=1)),
    ("f32", 20001, dict(threads_per_row=256, online=True)),
]


@on_gpu
@pytest.mark.parametrize("dtype, cols, fields", SOFTMAX_VERSIONS,
                         ids=[f"{d}-{c}-{'online' if f.get('online') else f['threads_per_row']}"
                              f"x{f.get('vectors_per_thread', '')}" for d, c, f in
                              SOFTMAX_VERSIONS])
@pytest.mark.parametrize("leading_minus_inf", [False, True], ids=["normal", "leading-inf"])
def test_softmax_versions(dtype, cols, fields, leading_minus_inf):
    op, case, (x,) = _inputs("softmax", dtype, {"rows": 15, "cols": cols})
    if leading_minus_inf:
        # Whole leading vectors of -inf: the online pass must skip them without NaN.
        x[:, : min(cols - 1, 640)] = -np.inf
    config = softmax_cuda.SoftmaxConfig(**fields)
    device_x = frameworks.numpy_to_torch(x, "cuda").reshape(3, 5, cols)
    with frameworks.poisoned_outputs():
        y = softmax_cuda.softmax(device_x, config=config)
    torch.cuda.synchronize()
    assert y.shape == (3, 5, cols)
    _check(op, case, (x,), y.reshape(15, cols), f"softmax {config}")



ROW_SUM_VERSIONS = [
    ("f32", 100, dict(threads_per_row=32, rows_per_block=8, vectors_per_thread=1)),
    ("f32", 7, dict(threads_per_row=32, rows_per_block=4, vectors_per_thread=1)),
    ("f16", 3001, dict(threads_per_row=256, vectors_per_thread=2)),
    ("bf16", 3000, dict(threads_per_row=32, rows_per_block=2, vectors_per_thread=4)),
    ("f16", 20000, dict(threads_per_row=128, vectors_per_thread=4)),
    ("f32", 3001, dict(threads_per_row=512, vectors_per_thread=8, vectorize=False)),
    ("bf16", 70000, dict(threads_per_row=1024, vectors_per_thread=2)),
]


@on_gpu
@pytest.mark.parametrize("dtype, cols, fields", ROW_SUM_VERSIONS,
                         ids=[f"{d}-{c}-{f['threads_per_row']}x{f['vectors_per_thread']}"
                              for d, c, f in ROW_SUM_VERSIONS])
def test_row_sum_versions(dtype, cols, fields):
    op, case, (x,) = _inputs("row_sum", dtype, {"rows": 15, "cols": cols})
    config = row_sum_cuda.RowSumConfig(**fields)
    with frameworks.poisoned_outputs():
        y = row_sum_cuda.row_sum(frameworks.numpy_to_torch(x, "cuda").reshape(3, 5, cols),
                                 config=config)
    torch.cuda.synchronize()
    assert y.shape == (3, 5)
    _check(op, case, (x,), y.reshape(15), f"row_sum {config}")



def _offset_copy(t: torch.Tensor, elements: int) -> torch.Tensor:
    """A contiguous copy of t whose data starts `elements` past an aligned allocation."""
    storage = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    view = storage[elements:].view(t.shape)
    view.copy_(t)
    return view


@on_gpu
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("cols", [64, 1001])
def test_bandwidth_kernels_take_misaligned_inputs(dtype, cols):
    """x offset by one element: softmax falls back to scalar accesses (x and y differ modulo 16
    bytes); row_sum keeps its vectors behind a per-row scalar head."""
    for op_name, fn in (("softmax", softmax_cuda.softmax), ("row_sum", row_sum_cuda.row_sum)):
        op, case, (x,) = _inputs(op_name, dtype, {"rows": 9, "cols": cols})
        shifted = _offset_copy(frameworks.numpy_to_torch(x, "cuda"), 1)
        assert shifted.data_ptr() % runtime.VECTOR_BYTES != 0
        with frameworks.poisoned_outputs():
            out = fn(shifted)
        torch.cuda.synchronize()
        _check(op, case, (x,), out, f"{op_name} misaligned {dtype} {cols}")


MATMUL_SHAPES = [(200, 136, 72), (257, 130, 100), (1, 8, 16), (130, 1, 8), (300, 264, 1000)]


@on_gpu
@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("m, n, k", MATMUL_SHAPES, ids=["x".join(map(str, s))
                                                        for s in MATMUL_SHAPES])
@pytest.mark.parametrize("dtype, config", [("f32", None)] + [
    (dtype, config) for dtype in ("bf16", "f16") for config in cuda_mma.CONFIGS],
    ids=["f32-sgemm"] + [f"{d}-mma{c.label}" for d in ("bf16", "f16") for c in cuda_mma.CONFIGS])
def test_matmul_paths(dtype, config, m, n, k, misaligned):
    """Both load paths of each kernel and tile: 16-byte (cp.async / float4) and element-wise."""
    op, case, (a, b) = _inputs("matmul", dtype, {"m": m, "n": n, "k": k})
    kernel = cuda_sgemm.matmul if dtype == "f32" else functools.partial(cuda_mma.matmul,
                                                                        config=config)
    da, db = (frameworks.numpy_to_torch(v, "cuda") for v in (a, b))
    if misaligned:
        da, db = _offset_copy(da, 1), _offset_copy(db, 1)
        assert da.data_ptr() % runtime.VECTOR_BYTES != 0
    with frameworks.poisoned_outputs():
        c = kernel(da, db)
    torch.cuda.synchronize()
    _check(op, case, (a, b), c, f"matmul {dtype} {m}x{n}x{k}")



# Edges in m, n and k (TMA zero fill, guarded stores), several tiles per persistent CTA
# (288 tiles of 128 x 256 > 132 SMs) with k-steps that wrap the 4-slot ring inside a tile.
WGMMA_SHAPES = [(200, 136, 72), (1, 8, 16), (300, 264, 1000), (129, 520, 1032),
                (4096, 2056, 328)]
WGMMA_VERSIONS = [(dtype, cuda_wgmma.DEFAULT_CONFIG) for dtype in ("bf16", "f16")] + [
    ("bf16", cuda_wgmma.WgmmaConfig(group_m=g)) for g in (1, 3)]
needs_hopper = pytest.mark.skipif(not GPU or torch.cuda.get_device_capability() != (9, 0),
                                  reason="cuda_wgmma needs a Hopper GPU (sm_90a)")


@on_gpu
@needs_hopper
@pytest.mark.parametrize("m, n, k", WGMMA_SHAPES, ids=["x".join(map(str, s))
                                                       for s in WGMMA_SHAPES])
@pytest.mark.parametrize("dtype, config", WGMMA_VERSIONS,
                         ids=[f"{d}-group{c.group_m}" for d, c in WGMMA_VERSIONS])
def test_matmul_cuda_wgmma_shapes(dtype, config, m, n, k):
    op, case, (a, b) = _inputs("matmul", dtype, {"m": m, "n": n, "k": k})
    da, db = (frameworks.numpy_to_torch(v, "cuda") for v in (a, b))
    with frameworks.poisoned_outputs():
        c = cuda_wgmma.matmul(da, db, config=config)
    torch.cuda.synchronize()
    _check(op, case, (a, b), c, f"matmul cuda_wgmma {dtype} {m}x{n}x{k} {config}")


@on_gpu
@needs_hopper
def test_matmul_cuda_wgmma_refuses_misaligned_data():
    a = _offset_copy(torch.randn(16, 16, device="cuda").to(torch.bfloat16), 1)
    b = torch.randn(16, 16, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="a: cuda_wgmma needs data aligned to 16 bytes"):
        cuda_wgmma.matmul(a, b)


@on_gpu
def test_launch_errors_become_exceptions_with_cuda_message():
    x = torch.randn(4, 64, device="cuda")
    y = torch.empty_like(x)
    # 33 threads per row is rejected by the launcher with cudaErrorInvalidValue.
    with pytest.raises(runtime.CudaError, match=r"softmax\.cu: kernelperf_softmax failed: "
                                                r"invalid argument \(cudaError 1\)"):
        softmax_cuda.LIBRARY.launch("kernelperf_softmax", x.device, x.data_ptr(), y.data_ptr(),
                                    4, 64, 0, 33, 1, 1, 1, 0, runtime.current_stream(x))
    with pytest.raises(KeyError, match="declares no entry point 'nope'"):
        softmax_cuda.LIBRARY.launch("nope", x.device)



@on_gpu
def test_runs_on_torch_current_stream():
    x = torch.randn(64, 1000, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        scaled = x * 3.0  # queued on the side stream; our kernel must run after it
        y = softmax_cuda.softmax(scaled)
        s = row_sum_cuda.row_sum(scaled)
    side.synchronize()
    torch.testing.assert_close(y, torch.softmax(x * 3.0, dim=-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s, torch.sum(x * 3.0, dim=-1), rtol=1e-5, atol=1e-4)

