"""The registry's declarations hold together, and input validation names what is wrong."""

import numpy as np
import pytest

from kernels.core import registry, validation


def test_every_operation_is_complete():
    for op in registry.operations():
        assert op.cases_tagged("cpu"), f"{op.name} has no CPU cases"
        assert op.cases_tagged("gpu"), f"{op.name} has no GPU cases"
        assert registry.implementations(op.name), f"{op.name} has no implementations"
        assert any(impl.baseline for impl in registry.implementations(op.name))
        for case in op.cases:
            assert op.work(case, "fwd").flops > 0, case.id
            for direction in registry.DIRECTIONS:
                work = op.work(case, direction)
                # A backward can be pure data movement (row_sum's is a broadcast): no FLOPs.
                assert work.flops >= 0 and work.bytes > 0, (case.id, direction)
            assert 0 < op.tolerance(case) < 0.05, case.id


def test_nothing_failed_to_register():
    failures = registry.import_failures()
    assert not failures, failures


# What loading the registry and asking why each case cannot run (as pytest's collection and
# the CLI do) must not import: each is imported on use by the one implementation needing it.
NOT_IMPORTED_BY_LOADING = ("torch", "flax", "jax.experimental.pallas.mosaic_gpu")


def test_loading_the_registry_imports_no_torch():
    """Every process that lists, benchmarks or checks kernels loads the registry (asv's
    benchmark processes, the CLI, the measuring workers, every pytest process); torch's
    import is a second of CPU in each, Flax's 0.4 s and Mosaic GPU's 0.2 s, so a torch or
    Triton module imports torch when it is called, the NNX block's model (a private module)
    is imported by its first call, and the Mosaic GPU interpreter's presence is read without
    the Mosaic GPU lowering."""
    import pathlib
    import subprocess
    import sys

    probe = ("import sys; from kernels.core import devices, registry; registry.load(); "
             "machine = devices.this_machine(); "
             "[devices.case_unavailable_reason(impl, case, machine) for op in registry.operations()"
             " for impl in registry.implementations(op.name) for case in op.cases]; "
             f"print(len(registry._IMPLEMENTATIONS), *(m in sys.modules for m in "
             f"{NOT_IMPORTED_BY_LOADING!r}))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=pathlib.Path(__file__).parents[1], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    count, *imported = result.stdout.split()
    registry.load()
    assert int(count) == len(registry._IMPLEMENTATIONS), result.stdout
    assert dict(zip(NOT_IMPORTED_BY_LOADING, imported, strict=True)) == \
        dict.fromkeys(NOT_IMPORTED_BY_LOADING, "False"), result.stdout
    assert registry.implementation("transformer_block", "nnx").requires.modules == ("flax",)


def test_case_ids_name_dtype_shape_and_variant():
    case = registry.make_case("softmax", "bf16", {"rows": 3, "cols": 5}, variant="masked")
    assert case.id == "bf16-3x5-masked"
    flagged = registry.make_case("attention", "f16", {"b": 2, "s": 64}, params={"causal": True})
    assert flagged.id == "f16-2x64-causal"
    assert case["cols"] == 5
    with pytest.raises(KeyError, match="no dimension 'heads'"):
        case["heads"]


def test_case_rejects_bad_dims_and_dtypes():
    with pytest.raises(ValueError, match="rows: expected a positive int, got 0"):
        registry.make_case("softmax", "f32", {"rows": 0, "cols": 5})
    with pytest.raises(ValueError, match="dtype: expected one of"):
        registry.make_case("softmax", "int8", {"rows": 1, "cols": 5})


def test_unknown_names_say_what_exists():
    with pytest.raises(KeyError, match="unknown operation 'nope'.*softmax"):
        registry.operation("nope")
    with pytest.raises(KeyError, match="unknown implementation 'nope' of 'softmax'.*pallas"):
        registry.implementation("softmax", "nope")


def test_softmax_work_model():
    op = registry.operation("softmax")
    case = registry.make_case("softmax", "bf16", {"rows": 32768, "cols": 4096})
    fwd, bwd = op.work(case, "fwd"), op.work(case, "bwd")
    assert fwd.bytes == 2 * 2 * 32768 * 4096  # read x, write y, 2 bytes each
    assert bwd.bytes == 3 * 2 * 32768 * 4096  # read y and dy, write dx
    assert fwd.intensity == pytest.approx(5 / 4)


def test_check_same_dtype_names_each_argument():
    q, k = np.ones((2, 2), np.float32), np.ones((2, 2), np.float16)
    with pytest.raises(TypeError, match="q=float32, k=float16"):
        validation.check_same_dtype(q=q, k=k)
    validation.check_same_dtype(q=q, k=q)


def test_check_array_rank():
    with pytest.raises(ValueError, match=r"q: expected rank 4, got shape \(4, 128\)"):
        validation.check_array("q", np.ones((4, 128), np.float32), rank=4)
