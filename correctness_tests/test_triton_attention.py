"""Triton attention specifics the generic harness does not reach: both ways of streaming
blocks (TMA descriptors, pointer loads), inputs off 16-byte alignment, the config's checks,
and the Gluon forward of Hopper GPUs (compiled for sm_90 here, run against the tl kernel on
one)."""

import dataclasses
import functools
import re

import pytest

from kernels.core import checking, registry
from kernels.ops.attention import spec
from kernels.profile import triton_aot

torch = pytest.importorskip("torch")  # the Triton kernels run on torch tensors
from kernels.ops.attention import triton as attention_triton  # noqa: E402
from kernels.ops.attention import triton_gluon  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"
# The forwards the H100 configs hand to Gluon: (head_dim, causal) and the config.
GLUON_FORWARDS = [((head_dim, causal), config)
                  for head_dim in spec.HEAD_DIMS for causal in (False, True)
                  if (config := attention_triton.tuned_for(attention_triton.CONFIGS[H100],
                                                           head_dim, causal)).gluon]
SM90_SHARED_BYTES = 228 * 1024  # per SM; each CTA also holds 1 KiB for the system

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


def test_gluon_flag_is_checked():
    with pytest.raises(TypeError, match="gluon: expected True or False, got 'on'"):
        attention_triton.AttentionConfig(gluon="on")
    with pytest.raises(ValueError, match="gluon: expected block_m=64, num_warps=4 and "
                                         "num_stages >= 3, got block_m=128, num_warps=8"):
        attention_triton.AttentionConfig(gluon=True)
    with pytest.raises(ValueError, match="num_stages >= 3, got .* num_stages=2"):
        attention_triton.AttentionConfig(block_m=64, num_warps=4, num_stages=2, gluon=True)


def test_gluon_runs_only_where_wgmma_does():
    """bf16/f16 on sm_90: never on the CPU (the interpreter runs the tl kernel) nor for f32,
    nor on an Ampere or Blackwell GPU (no wgmma there)."""
    for dtype in (torch.bfloat16, torch.float32):
        assert not triton_gluon.runs_on(torch.empty(1, 1, 1, 64, dtype=dtype))
    assert triton_gluon.takes(torch.bfloat16, (9, 0)) and triton_gluon.takes(torch.float16, (9, 0))
    assert not triton_gluon.takes(torch.float32, (9, 0))
    assert not any(triton_gluon.takes(torch.bfloat16, c) for c in ((8, 0), (10, 0), (12, 0)))


@pytest.mark.parametrize(("shape", "config"), GLUON_FORWARDS, ids=lambda v: (
    f"d{v[0]}{'-causal' if v[1] else ''}" if isinstance(v, tuple) else None))
def test_gluon_forward_overlaps_the_softmax_and_fits_two_ctas_per_sm(shape, config):
    """Compiled for sm_90 on any machine: no spills; shared memory for two CTAs per SM; Q K^T
    reading both operands from shared memory and P V taking P from registers; and in the key
    loop a wait that lets one wgmma group (the last P V) run on while S is read: the overlap
    of the softmax with P V, which a wait for both products would undo."""
    head_dim, causal = shape
    compiled = triton_aot.report(f"{triton_gluon.__name__}:example_launch", head_dim=head_dim,
                                 causal=causal, block_n=config.block_n, stages=config.num_stages)
    assert compiled.stack_bytes == 0, compiled.stack_bytes
    assert 2 * (compiled.shared_bytes + 1024) <= SM90_SHARED_BYTES, compiled.shared_bytes
    code = compiled.sass
    assert re.search(rf"HGMMA\.64x{config.block_n}x16\.F32\.BF16 R\d+, gdesc", code)
    assert re.search(rf"HGMMA\.64x{head_dim}x16\.F32\.BF16 R\d+, R\d+, gdesc", code)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in code


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and triton_gluon.runs_on(
    torch.empty(1, device="cuda", dtype=torch.bfloat16))), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize(("batch", "seq", "heads", "head_dim", "causal", "logit_scale"), [
    (1, 1, 1, 64, True, 1), (2, 37, 2, 64, True, 1), (1, 65, 1, 128, True, 1),
    (2, 1000, 4, 128, True, 1), (1, 4097, 2, 128, False, 1), (1, 4097, 2, 64, True, 1),
    (2, 2048, 4, 128, False, 8), (2, 2048, 4, 128, True, 8)])
def test_gluon_forward_matches_the_tl_forward(batch, seq, heads, head_dim, causal, logit_scale,
                                              dtype):
    """Sequences ending inside a block (and inside the next sequence's rows of the 2-D
    descriptors), a single query, large logits: the Gluon kernel's output and log-sum-exp
    against the tl kernel's, which the generic harness checks against the reference."""
    generator = torch.Generator(device="cuda").manual_seed(seq * head_dim + causal)
    q, k, v = ((torch.randn(batch, seq, heads, head_dim, device="cuda", generator=generator)
                * (logit_scale if i < 2 else 1)).to(dtype) for i in range(3))
    tl_config = attention_triton.AttentionConfig(block_m=64, block_n=64, num_warps=4,
                                                 num_stages=3, tma=True)
    gluon_config = dataclasses.replace(tl_config, gluon=True)
    o, lse = attention_triton._forward(q, k, v, causal, gluon_config)
    o_tl, lse_tl = attention_triton._forward(q, k, v, causal, tl_config)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(lse, lse_tl, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(o.float(), o_tl.float(), atol=2e-2, rtol=2e-2)
