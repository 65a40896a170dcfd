"""Pallas matmul specifics the generic harness does not reach: configs and their checks."""

import numpy as np
import pytest

from kernels.ops.matmul import pallas_mosaic, pallas_triton, spec


def test_triton_config_rejects_tiles_tl_dot_cannot_take():
    with pytest.raises(ValueError, match="block_k: expected >= 16"):
        pallas_triton.MatmulConfig(block_m=64, block_n=64, block_k=8)
    with pytest.raises(ValueError, match="block_m: expected a power of two, got 96"):
        pallas_triton.MatmulConfig(block_m=96, block_n=64, block_k=32)


def test_triton_small_tiles_many_groups():
    # 16-wide tiles: 9 x 9 tiles in groups of 2 rows (the last group partial), 17 K steps.
    config = pallas_triton.MatmulConfig(block_m=16, block_n=16, block_k=16, group_m=2)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((129, 257), dtype=np.float32)
    b = rng.standard_normal((257, 130), dtype=np.float32)
    got = np.asarray(pallas_triton.matmul(a, b, config=config))
    np.testing.assert_allclose(got, np.asarray(spec.reference(a, b)), rtol=1e-4, atol=1e-3)


def test_mosaic_config_checks():
    with pytest.raises(ValueError, match="tile_m: expected a multiple of 64"):
        pallas_mosaic.MosaicMatmulConfig(tile_m=96)
    with pytest.raises(ValueError, match="wg_dimension: expected 'm' or 'n'"):
        pallas_mosaic.MosaicMatmulConfig(wg_dimension="k")
    assert pallas_mosaic.MosaicMatmulConfig(wg_dimension="m").cta_tile == (256, 128)


def test_mosaic_rejects_f32_with_the_reason():
    a = np.ones((8, 8), np.float32)
    with pytest.raises(TypeError, match="a: expected dtype bfloat16 or float16"):
        pallas_mosaic.matmul(a, a)


def test_mosaic_interpreted():
    """The Mosaic GPU kernel through JAX's GPU interpreter (CPU) or compiled (GPU): forward
    and gradients of one awkward case, by the one harness."""
    from kernels.core import checking, registry

    op = registry.operation(spec.NAME)
    case = next(c for c in op.cases if c.id == pallas_mosaic.INTERPRETED_CASE)
    impl = registry.implementation(spec.NAME, pallas_mosaic.IMPL)
    results = checking.check(impl, case, distribution="normal")
    assert len(results) == 3  # output, da, db
