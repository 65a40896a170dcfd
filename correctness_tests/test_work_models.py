"""Every operation's work model, both directions, against a count made independently of it.

FLOPs are counted from the jaxpr of the operation's own reference (what the
computation does, not what its author wrote down): for operations made of
products, 2 x (output elements) x (contracted length) per `dot_general`; for
element-wise operations (softmax, row sum), one FLOP per output element of
each arithmetic primitive and one per input element of each reduction. The
backward is the jaxpr of `jax.vjp`'s pullback less the forward it contains.
Where a model deliberately counts something else (FlashAttention recomputes
Q K^T in the backward; the causal mask skips half the pairs; MoE routing is
one-hot data movement, not arithmetic), the adjustment is written out below
with its reason. Bytes are the sizes of the arrays each direction must read
and write, taken from the shapes the reference actually takes and returns.
A model that doubles or halves any of these numbers fails here.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.core import checking, dtypes, registry
from kernels.roofline import ceilings, model

ELEMENTWISE = {"add", "sub", "mul", "div", "exp", "max", "min", "neg", "log"}
REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min"}
FREE = {"broadcast_in_dim", "reshape", "convert_element_type", "stop_gradient", "squeeze",
        "expand_dims", "transpose", "copy", "copy_p", "select_n", "iota", "eq", "ge", "gt",
        "le", "lt", "ne", "and", "not", "pjit", "jit", "custom_jvp_call", "custom_vjp_call",
        "is_finite", "mul_add"}


def _sub_jaxprs(eqn) -> list:
    found = []
    for value in eqn.params.values():
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                found.append(item.jaxpr)
            elif isinstance(item, jax.extend.core.Jaxpr):
                found.append(item)
    return found


def _size(var) -> int:
    return math.prod(var.aval.shape)


def count_flops(jaxpr, *, products_only: bool) -> float:
    """FLOPs of a jaxpr: its dot_generals, and (unless `products_only`) its arithmetic.

    An element-wise primitive this counter does not know raises, so a new operation cannot
    be counted as free by accident.
    """
    total = 0.0
    for eqn in jaxpr.eqns:
        inner = _sub_jaxprs(eqn)
        if inner:
            total += sum(count_flops(j, products_only=products_only) for j in inner)
            continue
        name = eqn.primitive.name
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            length = math.prod(eqn.invars[0].aval.shape[d] for d in contract)
            total += 2.0 * _size(eqn.outvars[0]) * length
        elif products_only:
            continue
        elif name in ELEMENTWISE:
            total += _size(eqn.outvars[0])
        elif name in REDUCTIONS:
            total += _size(eqn.invars[0])
        elif name not in FREE:
            raise AssertionError(f"count_flops: no rule for primitive {name!r}")
    return total


def _inputs(op: registry.Operation, case: registry.Case) -> tuple[np.ndarray, ...]:
    """The case's inputs in float32, as numpy: tracing needs no device (nothing is compiled)."""
    return tuple(np.asarray(x, np.float32) for x in checking.make_inputs(op, case, 0, "normal"))


def _traced_flops(fn, args, *, products_only: bool) -> tuple[float, float]:
    """(forward FLOPs, backward FLOPs) of `fn` at `args`, counted from their jaxprs."""
    forward = count_flops(jax.make_jaxpr(fn)(*args).jaxpr, products_only=products_only)
    out = jax.eval_shape(fn, *args)
    cotangent = jax.ShapeDtypeStruct(out.shape, out.dtype)
    both = jax.make_jaxpr(lambda c, *a: jax.vjp(fn, *a)[1](c))(cotangent, *args)
    return forward, count_flops(both.jaxpr, products_only=products_only) - forward


def _reference(op: registry.Operation, case: registry.Case):
    return lambda *a: op.reference(*a, **case.kwargs)


# Independent FLOP counts: name -> (op, case) -> (fwd, bwd).
def _softmax_flops(op, case):
    (x,) = _inputs(op, case)
    forward = count_flops(jax.make_jaxpr(op.reference)(x).jaxpr, products_only=False)
    # The backward as a kernel computes it, dx = y (dy - sum(y dy)) (checked against the VJP in
    # test_softmax_backward_formula_is_the_vjp); autodiff's graph does more (6 per element).
    y = jax.eval_shape(op.reference, x)
    backward = count_flops(jax.make_jaxpr(_softmax_backward)(y, y).jaxpr, products_only=False)
    return forward, backward


def _softmax_backward(y, dy):
    return y * (dy - jnp.sum(y * dy, axis=-1, keepdims=True))


def _row_sum_flops(op, case):
    return _traced_flops(op.reference, _inputs(op, case), products_only=False)


def _products_flops(op, case):
    return _traced_flops(_reference(op, case), _inputs(op, case), products_only=True)


def _attention_flops(op, case):
    forward, backward = _products_flops(op, case)
    seq = case["seq"]
    if case.kwargs.get("causal"):
        # The reference computes every (query, key) pair and masks; a causal kernel skips the
        # pairs above the diagonal: seq (seq + 1) / 2 of seq^2 take part, forward and backward.
        forward, backward = (f * (seq + 1) / (2 * seq) for f in (forward, backward))
    # Autodiff keeps P from the forward; FlashAttention's backward recomputes S = Q K^T, which
    # is half of the forward's two products.
    return forward, backward + forward / 2


def _moe_flops(op, case):
    """The router product and the experts' two products on their capacity slots; dispatch and
    combine are one-hot einsums (data movement written as products) and are not counted."""
    from kernels.ops.moe import spec as moe

    x, router, w_in, w_out = _inputs(op, case)
    g, s, m = x.shape
    e = router.shape[1]
    slots = moe.capacity(s, e, case.kwargs["top_k"], case.kwargs["capacity_factor"])
    tokens = jax.ShapeDtypeStruct((e, g, slots, m), jnp.float32)
    experts = _traced_flops(lambda t, a, b: moe.expert_mlp(t, a, b), (tokens, w_in, w_out),
                            products_only=True)
    routing = _traced_flops(lambda a, r: jnp.einsum("gsm,me->gse", a, r), (x, router),
                            products_only=True)
    return experts[0] + routing[0], experts[1] + routing[1]


FLOPS = {
    "softmax": _softmax_flops,
    "row_sum": _row_sum_flops,
    "matmul": _products_flops,
    "mlp": _products_flops,
    "sharded_matmul": _products_flops,
    "sharded_vmap": None,  # set below: the product only, the softmax left out
    "transformer_block": _products_flops,
    "attention": _attention_flops,
    "moe": _moe_flops,
}


def _sharded_vmap_flops(op, case):
    """The model counts the product, not the softmax over its O(b n d_out) logits."""
    return _products_flops(op, case)


FLOPS["sharded_vmap"] = _sharded_vmap_flops


def _nbytes(*arrays) -> float:
    return float(sum(math.prod(a.shape) for a in arrays))


def moved_bytes(op: registry.Operation, case: registry.Case, direction: str) -> float:
    """Fewest bytes a direction moves, from the reference's real argument and result shapes:
    forward reads the inputs and writes the output; the backward reads what it needs (listed
    per operation) and writes one gradient per input."""
    args = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in _inputs(op, case))
    out = jax.eval_shape(_reference(op, case), *args)
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    if direction == "fwd":
        extra = 0.0
        if op.name == "attention":  # the float32 log-sum-exp per (batch, head, query), saved
            extra = 4.0 * case["batch"] * case["heads"] * case["seq"]
        return _nbytes(*args, out) * itemsize + extra
    if op.name == "softmax":  # y and dy in, dx out
        return 3 * _nbytes(out) * itemsize
    if op.name == "row_sum":  # dy in, dx (a broadcast of it) out
        return _nbytes(out, args[0]) * itemsize
    if op.name == "attention":  # q, k, v, o, dO and the log-sum-exp in; dq, dk, dv out
        lse = 4.0 * case["batch"] * case["heads"] * case["seq"]
        return (2 * _nbytes(*args) + 2 * _nbytes(out)) * itemsize + lse
    if op.name in ("matmul", "sharded_matmul"):
        # Two products, dA = dC B^T and dB = A^T dC, each reading its operands and writing
        # its result: dC is read by both.
        return 2 * _nbytes(*args, out) * itemsize
    # Each product's backward pass reads and writes what its forward did, twice over: the
    # input gradients and the weight gradients are two products per forward product.
    return 2 * moved_bytes(op, case, "fwd")


def _cases() -> list[registry.Case]:
    """Per operation: for each set of parameters, and f32 or not (bytes scale with the element
    size), its largest CPU case (a case of one query cannot tell causal from not)."""
    chosen: dict[tuple, registry.Case] = {}
    for op in registry.operations():
        for case in op.cases_tagged("cpu"):
            key = (op.name, case.params, case.dtype == "f32")
            size = math.prod(n for _, n in case.dims)
            if key not in chosen or size > math.prod(n for _, n in chosen[key].dims):
                chosen[key] = case
    return list(chosen.values())


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c.op}-{c.id}")
def test_work_model_matches_an_independent_count(case):
    op = registry.operation(case.op)
    counted_flops = FLOPS[op.name](op, case)
    for direction, flops in zip(registry.DIRECTIONS, counted_flops, strict=True):
        work = op.work(case, direction)
        assert work.flops == pytest.approx(flops, rel=1e-9), (
            f"{op.name} {case.id} {direction}: model {work.flops:.6g} FLOPs, counted {flops:.6g}")
        counted = moved_bytes(op, case, direction)
        assert work.bytes == pytest.approx(counted, rel=1e-9), (
            f"{op.name} {case.id} {direction}: model {work.bytes:.6g} bytes, counted {counted:.6g}")


def test_every_operation_has_an_independent_count():
    assert sorted(FLOPS) == sorted(op.name for op in registry.operations())
    assert {case.op for case in _cases()} == set(FLOPS)


def test_softmax_backward_formula_is_the_vjp():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 7)), jnp.float32)
    dy = jnp.asarray(np.random.default_rng(1).standard_normal((5, 7)), jnp.float32)
    y, pullback = jax.vjp(registry.operation("softmax").reference, x)
    np.testing.assert_allclose(_softmax_backward(y, dy), pullback(dy)[0], rtol=1e-5, atol=1e-6)


def test_counter_counts_a_product_and_refuses_unknown_primitives():
    a, b = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    assert count_flops(jax.make_jaxpr(jnp.matmul)(a, b).jaxpr, products_only=True) == 2 * 3 * 4 * 5
    with pytest.raises(AssertionError, match="no rule for primitive 'tanh'"):
        count_flops(jax.make_jaxpr(jnp.tanh)(a).jaxpr, products_only=False)


def test_a_fraction_above_the_roof_stays_loud():
    """A work model that counts too much puts a point above the roof: flagged, never hidden."""
    sheet = ceilings.datasheet("NVIDIA H100 80GB HBM3")
    work = registry.Work(flops=1.0e9, bytes=1.0e9)
    seconds = work.bytes / sheet.bandwidth  # exactly at the memory roof
    at_roof = model.place(work, seconds, sheet, "f32")
    assert at_roof.fraction == pytest.approx(1.0) and not at_roof.suspicious
    doubled = model.place(registry.Work(flops=2.0e9, bytes=2.0e9), seconds, sheet, "f32")
    assert doubled.fraction == pytest.approx(2.0)
    assert doubled.suspicious and doubled.warning == "above the roof: work model?"


@pytest.mark.parametrize("op_name", sorted(FLOPS))
def test_work_model_refuses_an_unknown_direction(op_name):
    op = registry.operation(op_name)
    with pytest.raises(ValueError, match=r"^direction: expected one of \('fwd', 'bwd'\), got "
                                         r"'sideways'$"):
        op.work(op.cases_tagged("cpu")[0], "sideways")


# Bytes crossing devices, counted by hand for each sharded operation's 4x2 CPU case (data = 4,
# model = 2, float32): elements per collective, times 4 bytes. A ring all-reduce of n elements
# over p devices moves 2 (p - 1) n in all; an all-gather of n elements' shards, (p - 1) n.
HAND_COUNTED_COMM = {
    # m, n, k = 64, 32, 48. Forward: A's rows gathered over model, (2 - 1) 64 48 = 3072.
    # Backward: dA reduce-scattered back (3072) and dB all-reduced over data,
    # 2 (4 - 1) 48 32 = 9216: 12288 elements.
    "sharded_matmul": (3072 * 4, 12288 * 4),
    # batch 16, rows 8, d_in 16, d_out 32. Forward: none. Backward: dw over data,
    # 2 (4 - 1) 16 32 = 3072, and dx over model, 2 (2 - 1) 16 8 16 = 4096: 7168 elements.
    "sharded_vmap": (0, 7168 * 4),
    # groups 8, group_size 16, embed 8, mlp 16, experts 8, top 2, capacity 16 2 / 8 = 4 slots.
    # Forward: dispatch and return all-to-alls, 2 (3 / 4) 8 8 4 8 = 3072, and the model-sharded
    # MLP's all-reduce, 2 (2 - 1) 128 8 = 2048: 5120. Backward: the same, and the router
    # gradient over all 8 devices, 2 (8 - 1) 8 8 = 896: 6016.
    "moe": (5120 * 4, 6016 * 4),
    # batch 8, seq 8, embed 16, heads 4, head_dim 4, mlp 32. Forward: two all-reduces over
    # model, 2 x 2 (2 - 1) 8 8 16 = 4096. Backward: those, and every weight gradient over data:
    # parameters 4 16 4 4 + 2 16 32 = 2048, 2 (4 - 1) 2048 = 12288: 16384.
    "transformer_block": (4096 * 4, 16384 * 4),
}


@pytest.mark.parametrize("op_name", sorted(HAND_COUNTED_COMM))
def test_bytes_between_devices_match_a_hand_count(op_name):
    op = registry.operation(op_name)
    case = next(c for c in op.cases_tagged("cpu") if c.kwargs.get("mesh") == "4x2"
                and c.kwargs.get("top_k", 2) == 2)
    counted = HAND_COUNTED_COMM[op_name]
    assert (op.work(case, "fwd").comm_bytes, op.work(case, "bwd").comm_bytes) == counted


@pytest.mark.parametrize("args,slots", [((16, 8, 2, 1.0), 4), ((1, 8, 1, 1.0), 1),
                                        ((10, 4, 1, 1.25), 4), ((8, 8, 1, 2.0), 2)])
def test_moe_capacity_known_values(args, slots):
    """Slots per expert per group: ceil(group_size top_k capacity_factor / experts), at least 1."""
    from kernels.ops.moe import spec as moe

    assert moe.capacity(*args) == slots


def test_attention_without_a_causal_parameter_counts_every_pair():
    case = registry.make_case("attention", "f32", {"batch": 1, "seq": 8, "heads": 1,
                                                   "head_dim": 4})
    assert registry.operation("attention").work(case, "fwd").flops == 4.0 * 8 * 8 * 4
