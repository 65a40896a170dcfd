"""Triton attention specifics the generic harness does not reach: both ways of streaming
blocks (TMA descriptors, pointer loads), inputs off 16-byte alignment, the config's checks."""

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


def test_inputs_off_16_byte_alignment_are_copied_not_refused():
    """Views 4 bytes into their storage are valid inputs, but a TMA descriptor's base must be
    16-byte aligned: the kernels get aligned copies, and the output and gradients are right
    through the TMA path and the pointer loads alike."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape, size = (1, 37, 2, 64), 37 * 2 * 64
    storage = torch.randn(4 * size + 1, device=device)

    def unaligned(base):
        return [base[1 + i * size:][:size].view(shape) for i in range(4)]

    q, k, v, do = unaligned(storage)
    assert all(x.data_ptr() % 16 for x in (q, k, v, do))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in leaves), is_causal=True).transpose(1, 2)
    expected_grads = torch.autograd.grad(expected, leaves, do.clone())
    for tma in (True, False):
        config = dataclasses.replace(attention_triton.default_config(q.dtype, 64, q.device),
                                     tma=tma, bwd_tma=tma)
        ours = storage.clone().requires_grad_()
        q, k, v, _ = unaligned(ours)
        out = attention_triton.attention(q, k, v, causal=True, config=config)
        grads = torch.autograd.grad(out, (q, k, v), do)
        if device == "cuda":
            torch.cuda.synchronize()  # a fault here is ours, not the reference's
        for got, want in zip((out, *grads), (expected, *expected_grads), strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_config_flags_are_checked():
    with pytest.raises(TypeError, match="tma: expected True or False, got 'yes'"):
        attention_triton.AttentionConfig(tma="yes")
    with pytest.raises(TypeError, match="bwd_tma: expected True or False, got 1"):
        attention_triton.AttentionConfig(bwd_tma=1)
    with pytest.raises(ValueError, match="num_warps: expected an int >= 1, got True"):
        attention_triton.AttentionConfig(num_warps=True)
