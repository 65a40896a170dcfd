"""Pallas softmax specifics the generic harness does not reach: configs and leading axes."""

import jax
import numpy as np
import pytest

from kernels.core import compat
from kernels.ops.softmax import pallas, spec


def test_config_must_be_powers_of_two():
    with pytest.raises(ValueError, match="block_cols: expected a power of two, got 1000"):
        pallas.SoftmaxConfig(block_rows=1, block_cols=1000, num_warps=4)


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 5), (37, 128), (32768, 4096), (4, 10000)])
def test_default_config_fits_the_shape(rows, cols):
    config = pallas.default_config(rows, cols)
    assert config.block_cols <= pallas.MAX_BLOCK_COLS
    assert config.block_cols >= min(cols, pallas.MAX_BLOCK_COLS)
    assert config.block_rows <= max(1, 2 * rows)


@pytest.mark.parametrize("config", [
    pallas.SoftmaxConfig(block_rows=4, block_cols=16, num_warps=1),   # many column blocks
    pallas.SoftmaxConfig(block_rows=1, block_cols=64, num_warps=1),   # one row per program
], ids=["4x16", "1x64"])
def test_explicit_configs_and_leading_axes(config):
    x = np.random.default_rng(0).standard_normal((2, 5, 100)).astype(np.float32)
    got = pallas.softmax(x, config=config)
    want = spec.reference(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
    grad = jax.grad(lambda v: (pallas.softmax(v, config=config) ** 2).sum())(x)
    want_grad = jax.grad(lambda v: (spec.reference(v) ** 2).sum())(x)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-4, atol=1e-7)


def test_interprets_without_a_gpu():
    assert compat.pallas_interpret() == (jax.default_backend() != "gpu")
