"""The grids `python -m kernels tune` chooses from, per dtype and path (kernels.core.tuning's
variants): every candidate computes the right answer, interpreted on a small case; each grid
holds the config that runs today; and a recorded choice becomes the default only where its
variant says (float32 products, float32 rows wider than one block), on a GPU."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from kernels.core import checking, devices, registry, tuning

# Per operation, the small case every candidate of its variant grids is checked on: the
# matmul's tiles (up to 256 x 128) take two tiles each way and a K tail (72 = 2 x 32 + 8); the
# softmax rows (50257 columns) take every wide block (up to 32768) at least twice, the last
# ragged, forward and gradients (the config is shared by both).
CHECK_CASES = {
    "matmul": registry.make_case("matmul", "f32", {"m": 260, "n": 136, "k": 72}, tags=("cpu",)),
    "softmax": registry.make_case("softmax", "f32", {"rows": 3, "cols": 50257}, tags=("cpu",)),
}
# What the interpreters read of a config: warps and stages mean nothing there.
INTERPRETER_FIELDS = {"num_warps", "num_stages"}


def _variant_grids() -> list[tuple[str, str]]:
    registry.load()
    return sorted((op, name) for op, name in tuning._TUNABLES if tuning.VARIANT_SEPARATOR in name)


def _candidates() -> list:
    """(op, tunable name, config), one per config the interpreter tells apart."""
    params = []
    for op, name in _variant_grids():
        seen = set()
        for config in tuning.tunables(op)[name]().candidates:
            shape = tuple(sorted((k, v) for k, v in dataclasses.asdict(config).items()
                                 if k not in INTERPRETER_FIELDS))
            if shape not in seen:
                seen.add(shape)
                params.append(pytest.param(op, name, config, id=f"{name}-{config}"))
    return params


def test_every_variant_grid_has_a_check_case():
    assert {op for op, _ in _variant_grids()} <= set(CHECK_CASES)
    assert {"matmul/triton:f32", "matmul/pallas_triton:f32", "softmax/triton:f32-wide",
            "softmax/pallas:f32-wide"} <= {f"{op}/{name}" for op, name in _variant_grids()}


@pytest.mark.parametrize("op_name,name,config", _candidates())
def test_every_candidate_computes_the_right_answer(op_name, name, config):
    if devices.this_machine().has_gpu:
        pytest.skip("the interpreters' check; on a GPU the tune times these and "
                    "test_kernels checks the config it chose, as the default")
    tunable = tuning.tunables(op_name)[name]()
    impl = registry.implementation(op_name, tunable.impl)
    configured = dataclasses.replace(impl, fn=functools.partial(impl.fn, config=config))
    results = checking.check(configured, CHECK_CASES[op_name], seed=0,
                             gradients="bwd" in tunable.directions)
    assert len(results) == (2 if "bwd" in tunable.directions else 1)


def test_each_grid_holds_the_config_that_runs_today():
    """A tune can keep today's speed: the untuned default is a candidate (for the Triton
    matmul's float32, each tile its autotune keeps for 4-byte operands)."""
    import torch

    from kernels.ops.matmul import pallas_triton as matmul_pallas
    from kernels.ops.matmul import triton as matmul_triton
    from kernels.ops.softmax import pallas as softmax_pallas
    from kernels.ops.softmax import triton as softmax_triton

    assert matmul_pallas.F32_TUNING_CANDIDATES[0] == matmul_pallas.GPU_DEFAULT_F32
    assert softmax_pallas.WIDE_TUNING_CANDIDATES[0] == softmax_pallas.default_config(4096, 32768)
    cuda = torch.device("cuda")  # a device object only: nothing runs
    assert softmax_triton.WIDE_TUNING_CANDIDATES[0] == softmax_triton.default_config(32768, cuda)

    class F32Pointer:
        def element_size(self):
            return 4

    autotuned = [matmul_triton._to_triton(c) for c in matmul_triton.GPU_CONFIGS]
    kept = matmul_triton._fits(autotuned, {"M": 4096, "N": 4096, "a_ptr": F32Pointer()})
    assert kept, "the autotune keeps some f32 tile"
    for chosen in kept:
        tile = matmul_triton.MatmulConfig(
            block_m=chosen.kwargs["BLOCK_M"], block_n=chosen.kwargs["BLOCK_N"],
            block_k=chosen.kwargs["BLOCK_K"], group_m=chosen.kwargs["GROUP_M"],
            num_warps=chosen.num_warps, num_stages=chosen.num_stages)
        assert tile in matmul_triton.F32_TUNING_CANDIDATES, tile


# -- where a recorded choice is read --------------------------------------------------------

MODEL = "nvidia-test-gpu"
PLAIN = {"block_m": 256, "block_n": 64, "block_k": 64, "num_warps": 8, "num_stages": 3}
F32 = {"block_m": 128, "block_n": 256, "block_k": 16, "num_warps": 8, "num_stages": 4}


@pytest.fixture
def tuned_files(monkeypatch, tmp_path):
    """Each operation's tuned.json in tmp_path, this machine taken for MODEL; returns a writer
    of {slot: config fields} entries for an op."""
    monkeypatch.setattr(tuning, "tuned_path", lambda op: tmp_path / f"{op}.json")
    monkeypatch.setattr(tuning, "this_model", lambda: MODEL)

    def write(op: str, entries: dict[str, dict]) -> None:
        (tmp_path / f"{op}.json").write_text(json.dumps({
            name: {MODEL: {"config": fields, "time_ms": 1.0, "case": "c", "timer": "t"}}
            for name, fields in entries.items()}))

    return write


def test_pallas_triton_matmul_reads_its_f32_tiles_apart_from_the_16_bit_ones(tuned_files):
    import jax.numpy as jnp

    from kernels.ops.matmul import pallas_triton

    pick = functools.partial(pallas_triton.default_config, 4096, 4096, 4096, interpret=False)
    tuned_files("matmul", {"pallas_triton": PLAIN})  # a file as shipped before variants
    assert pick(jnp.bfloat16) == pallas_triton.MatmulConfig(group_m=8, **PLAIN)
    assert pick(jnp.float32) == pallas_triton.GPU_DEFAULT_F32, "16-bit tiles read for f32"
    tuned_files("matmul", {"pallas_triton": PLAIN, "pallas_triton:f32": F32})
    assert pick(jnp.float32) == pallas_triton.MatmulConfig(group_m=8, **F32)
    assert pick(jnp.bfloat16) == pallas_triton.MatmulConfig(group_m=8, **PLAIN)
    # Small products still shrink the tuned tiles to themselves.
    assert pallas_triton.default_config(64, 64, 64, jnp.float32, False).block_n == 64


def test_triton_matmul_runs_tuned_f32_tiles_on_a_gpu_and_autotunes_otherwise(
        tuned_files, monkeypatch):
    import torch

    from kernels.ops.matmul import triton as matmul_triton

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Test GPU")
    matmul_triton._tuned_f32.cache_clear()
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    try:
        tuned_files("matmul", {"pallas_triton": PLAIN})
        assert matmul_triton.default_tiles(torch.float32, cuda, 4096, 4096, 4096) is None
        matmul_triton._tuned_f32.cache_clear()
        tuned_files("matmul", {"triton:f32": F32})
        assert matmul_triton.default_tiles(torch.float32, cuda, 4096, 4096, 4096) == \
            matmul_triton.MatmulConfig(**F32)
        assert matmul_triton.default_tiles(torch.float32, cuda, 64, 4096, 8).block_m == 64
        assert matmul_triton.default_tiles(torch.float32, cuda, 64, 4096, 8).block_k == 16
        assert matmul_triton.default_tiles(torch.bfloat16, cuda, 4096, 4096, 4096) is None
        assert matmul_triton.default_tiles(torch.float32, cpu, 4096, 4096, 4096) is None
    finally:
        matmul_triton._tuned_f32.cache_clear()


def test_wide_softmax_rows_take_their_tuned_config_on_a_gpu_only(tuned_files, monkeypatch):
    import jax.numpy as jnp
    import torch

    from kernels.ops.softmax import pallas as softmax_pallas
    from kernels.ops.softmax import triton as softmax_triton

    tuned_files("softmax", {"pallas:f32-wide": {"block_cols": 16384, "num_warps": 16},
                            "triton:f32-wide": {"block": 32768, "num_warps": 32}})
    wide = softmax_pallas.default_config(4096, 32768, jnp.float32, on_gpu=True)
    assert wide == softmax_pallas.SoftmaxConfig(block_rows=1, block_cols=16384, num_warps=16)
    untuned = softmax_pallas.default_config(4096, 32768)
    assert softmax_pallas.default_config(4096, 32768, jnp.float32) == untuned  # interpreted
    assert softmax_pallas.default_config(4096, 32768, jnp.bfloat16, on_gpu=True) == untuned
    assert softmax_pallas.default_config(4096, 4096, jnp.float32, on_gpu=True) == \
        softmax_pallas.default_config(4096, 4096)  # one block: not a wide row

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Test GPU")
    softmax_triton._tuned_wide.cache_clear()
    cuda = torch.device("cuda")
    try:
        assert softmax_triton.default_config(32768, cuda, torch.float32) == \
            softmax_triton.SoftmaxConfig(block=32768, num_warps=32)
        assert softmax_triton.default_config(32768, cuda, torch.bfloat16) == \
            softmax_triton.default_config(32768, cuda)
        assert softmax_triton.default_config(8192, cuda, torch.float32) == \
            softmax_triton.SoftmaxConfig(block=8192, num_warps=16)
        assert softmax_triton.default_config(32768, torch.device("cpu"), torch.float32).block \
            == softmax_triton.INTERPRETER_MAX_BLOCK
    finally:
        softmax_triton._tuned_wide.cache_clear()
