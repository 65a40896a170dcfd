"""Triton attention specifics the generic harness does not reach: both ways of streaming
blocks (TMA descriptors, pointer loads), the fallback from TMA, the config's checks."""

import dataclasses
import functools

import pytest

from kernels import checking, registry
from kernels.ops.attention import spec

torch = pytest.importorskip("torch")  # the Triton kernels run on torch tensors
from kernels.ops.attention import triton as attention_triton  # noqa: E402

CPU_CASES = [c for c in registry.operation(spec.NAME).cases if "cpu" in c.tags]


@pytest.mark.parametrize("tma", [False, True], ids=["pointer-loads", "tma"])
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
def test_both_load_paths_match_the_reference(case, tma):
    """Forward and gradients, ragged and causal cases, small tiles, every streamed block
    loaded one way or the other (on CPU through the interpreter, whose default config takes
    TMA; on a GPU compiled, where TMA's zero fill past the sequence is the hardware's)."""
    config = dataclasses.replace(attention_triton.INTERPRETER_CONFIG, tma=tma, bwd_tma=tma)
    impl = registry.implementation(spec.NAME, "triton")
    configured = dataclasses.replace(impl, fn=functools.partial(impl.fn, config=config))
    results = checking.check(configured, case)
    assert {r.name.split()[-1] for r in results} >= {"output", "dq", "dk", "dv"}


def test_tma_falls_back_to_pointer_loads_for_unaligned_tensors():
    """A descriptor's base must be 16-byte aligned: a view 4 bytes into its storage takes
    pointer loads (TensorDescriptor would refuse it) and still gets the right answer."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = (1, 37, 2, 64)
    storage = torch.randn(3 * 37 * 2 * 64 + 1, device=device)
    q, k, v = (storage[1 + i * 37 * 128:][: 37 * 128].view(shape) for i in range(3))
    assert not attention_triton._tma_usable(q, k, v)
    assert attention_triton._tma_usable(storage[: 37 * 128].view(shape))
    config = dataclasses.replace(attention_triton.default_config(q.dtype, 64, q.device), tma=True)
    out = attention_triton.attention(q, k, v, causal=True, config=config)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_config_flags_are_checked():
    with pytest.raises(TypeError, match="tma: expected True or False, got 'yes'"):
        attention_triton.AttentionConfig(tma="yes")
    with pytest.raises(TypeError, match="bwd_tma: expected True or False, got 1"):
        attention_triton.AttentionConfig(bwd_tma=1)
    with pytest.raises(ValueError, match="num_warps: expected an int >= 1, got True"):
        attention_triton.AttentionConfig(num_warps=True)
