"""Pallas Mosaic GPU attention specifics the generic harness does not reach on CPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.core import compat, registry, tuning
from kernels.ops.attention import pallas_mosaic, spec


def test_mosaic_config_checks():
    with pytest.raises(ValueError, match="block_q: expected a multiple of 64"):
        pallas_mosaic.MosaicAttentionConfig(block_q=32)
    with pytest.raises(ValueError, match="block_kv: expected a power of two"):
        pallas_mosaic.MosaicAttentionConfig(block_kv=96)
    with pytest.raises(ValueError, match="max_concurrent_steps: expected >= 1"):
        pallas_mosaic.MosaicAttentionConfig(max_concurrent_steps=0)
    with pytest.raises(TypeError, match="fused_burst: expected True or False, got 1"):
        pallas_mosaic.MosaicAttentionConfig(fused_burst=1)
    assert pallas_mosaic.MosaicAttentionConfig().seq_multiple == 128


def test_mosaic_default_config_takes_only_the_tuned_fields(monkeypatch, tmp_path):
    """A tuned entry changes only the forward fields the tune sweeps, whatever else the tuned
    config held, and only at the head_dim it was tuned at; the checked-in entries hold those
    fields alone."""
    defaults = pallas_mosaic.GPU_DEFAULTS
    chosen = tuning.chosen_fields(pallas_mosaic.TUNING_CANDIDATES)
    checked_in = tuning.read_tuned(spec.NAME)[pallas_mosaic.IMPL]
    assert all(set(entry["config"]) == set(chosen) for entry in checked_in.values())
    tuned = pallas_mosaic.MosaicAttentionConfig(block_kv=64, max_concurrent_steps=3,
                                                block_kv_dq=16, fused_burst=False)
    monkeypatch.setattr(tuning, "this_model", lambda: "test-gpu")
    monkeypatch.setattr(tuning, "tuned_path", lambda op: tmp_path / "tuned.json")
    assert pallas_mosaic.default_config(128) == defaults[128]
    assert pallas_mosaic.default_config(64) == defaults[64]
    tuning.record(spec.NAME, pallas_mosaic.IMPL, "test-gpu", tuned, time_ms=1.0,
                  case_id=pallas_mosaic.TUNING_CASE, timer="test", fields=chosen)
    assert pallas_mosaic.default_config(128) == dataclasses.replace(
        defaults[128], block_kv=64, max_concurrent_steps=3)
    assert pallas_mosaic.default_config(64) == defaults[64]
    with pytest.raises(ValueError, match="head_dim: expected one of 64, 128"):
        pallas_mosaic.default_config(96)


def test_mosaic_rejects_f32_with_the_reason():
    q = np.ones((1, 8, 1, 64), np.float32)
    with pytest.raises(TypeError, match="q: expected dtype bfloat16 or float16"):
        pallas_mosaic.attention(q, q, q)
    case = next(c for c in registry.operation(spec.NAME).cases if c.dtype == "f32")
    assert "bf16/f16" in pallas_mosaic.supports(case)


@pytest.mark.skipif(compat.on_gpu(), reason="the GPU runs every case compiled instead")
def test_mosaic_skips_on_cpu_saying_why():
    bf16 = next(c for c in registry.operation(spec.NAME).cases if c.dtype == "bf16")
    assert pallas_mosaic.supports(bf16) == pallas_mosaic.NO_INTERPRETER
    q = jnp.ones((1, 8, 1, 64), jnp.bfloat16)
    with pytest.raises(RuntimeError, match="interpreter cannot run this kernel"):
        pallas_mosaic.attention(q, q, q)


@pytest.mark.parametrize("shape,dtype,causal,flags", [
    ((2, 37, 2, 64), jnp.bfloat16, True, {}),     # ragged, one block, causal
    ((1, 300, 2, 128), jnp.float16, False, {}),   # ragged last key block masked
    ((4, 4096, 16, 128), jnp.bfloat16, False, {}),  # the benchmark shape
    ((4, 4096, 16, 128), jnp.bfloat16, True, {}),
    # Both forward schedules on ragged shapes, causal and not (every masked/unmasked path).
    ((1, 300, 2, 128), jnp.bfloat16, True, {"fused_burst": False}),
    ((1, 300, 2, 64), jnp.bfloat16, False, {"fused_burst": True}),
])
def test_mosaic_lowers_for_hopper(shape, dtype, causal, flags):
    """Forward and backward traced and lowered to Mosaic GPU for a CUDA target, on any machine:
    what can be checked of the kernels without a Hopper GPU (layouts, wgmma shapes,
    barrier and shared-memory declarations)."""
    x = jax.ShapeDtypeStruct(shape, dtype)
    config = dataclasses.replace(pallas_mosaic.default_config(shape[-1]), **flags)

    def forward_backward(q, k, v, do):
        attention = pallas_mosaic._attention_jit
        _, vjp = jax.vjp(lambda *a: attention(*a, causal, config, False), q, k, v)
        return vjp(do)

    lowered = jax.jit(forward_backward).trace(x, x, x, x).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("mosaic_gpu") >= 3  # forward, dK/dV and dQ kernels


@pytest.mark.parametrize("batch,heads,count,group", [(4, 16, 32, 8), (2, 3, 5, 4), (1, 1, 7, 8),
                                                     (3, 5, 1, 2)])
@pytest.mark.parametrize("longest", [None, "last", "first"])
def test_tile_order_visits_every_tile_once_in_groups_longest_first(batch, heads, count, group,
                                                                   longest):
    """The CTA start order: every (batch, head, block) once; each group of heads finished
    before the next starts; inside a group, block ranks in order, the longest blocks first."""
    tiles = [tuple(int(v) for v in pallas_mosaic.tile_order(
        jnp.int32(i), batch, heads, count, group, longest)) for i in range(batch * heads * count)]
    assert sorted(tiles) == [(b, h, k) for b in range(batch) for h in range(heads)
                             for k in range(count)]
    head_of = [b * heads + h for b, h, _ in tiles]
    assert [x // min(group, batch * heads) for x in head_of] == sorted(
        x // min(group, batch * heads) for x in head_of)
    blocks = [k for _, _, k in tiles]
    first = {"last": count - 1, None: 0, "first": 0}[longest]
    assert blocks[0] == first and all(k == first for k in blocks[:min(group, batch * heads)])
    steps = [b - a for a, b in zip(blocks, blocks[1:], strict=False) if b != a]
    if longest == "last":
        # Within a group the block index only falls; it jumps back up at a new group.
        assert all(step == -1 or step == count - 1 for step in steps)
