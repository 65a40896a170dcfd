"""Mixture-of-experts layer with top-k routing and a capacity: reference, inputs, work, cases.

GShard's formulation (Lepikhin et al., 2020, section 2.2): tokens come in
groups (x is (groups, group_size, embed)); a linear router and softmax give
each token a gate per expert; each token goes to its `top_k` experts; every
expert takes at most `capacity` = ceil(group_size * top_k * capacity_factor /
experts) tokens per group, filled in priority order (all first choices in
token order, then second choices, ...), and the rest are dropped. An expert is
a two-layer GELU MLP (embed -> mlp -> embed); the output is the gate-weighted
sum of a token's expert outputs (zero where all its choices were dropped).

The routing (`route`) is shared by the reference and the implementations, so
they drop the same tokens; the reference then runs every expert on every
group densely on one device.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation
from kernels.sharding import meshes

NAME = "moe"
SUPPORTED_DTYPES = ("f32", "bf16")
HIGHEST = jax.lax.Precision.HIGHEST
RULES = meshes.MeshRules()


def capacity(group_size: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert per group."""
    return max(1, math.ceil(group_size * top_k * capacity_factor / experts))


def route(x: jax.Array, router: jax.Array, top_k: int,
          slots: int) -> tuple[jax.Array, jax.Array]:
    """Dispatch and combine tensors, (groups, group_size, experts, slots) each.

    dispatch is 1 where a token occupies a slot of an expert; combine holds its
    gate there. Router logits are computed in float32 at full precision (exact
    for the grid-valued inputs of make_inputs), so that every implementation,
    sharded or not, picks the same experts.
    """
    experts = router.shape[1]
    logits = jnp.einsum("gsm,me->gse", x.astype(jnp.float32), router.astype(jnp.float32),
                        precision=HIGHEST)
    gates = jax.nn.softmax(logits, axis=-1)
    # Choose on the logits: same order as the gates, but no ties where gates underflow.
    _, chosen = jax.lax.top_k(jax.lax.stop_gradient(logits), top_k)  # (g, s, k)
    chosen_gate = jnp.take_along_axis(gates, chosen, axis=-1)  # (g, s, k)
    one_hot = jax.nn.one_hot(chosen, experts, dtype=jnp.int32)  # (g, s, k, e)
    groups, size = x.shape[:2]
    # Priority: choice-major, then token order (GShard): cumulative count per expert.
    by_priority = one_hot.transpose(0, 2, 1, 3).reshape(groups, top_k * size, experts)
    position = (jnp.cumsum(by_priority, axis=1) - 1).reshape(groups, top_k, size, experts)
    position = jnp.sum(position.transpose(0, 2, 1, 3) * one_hot, axis=-1)  # (g, s, k)
    kept = (position < slots).astype(jnp.float32)
    slot = jax.nn.one_hot(position, slots, dtype=jnp.float32)  # (g, s, k, c); zero if dropped
    dispatch = jnp.einsum("gske,gskc->gsec", one_hot.astype(jnp.float32) * kept[..., None], slot)
    combine = jnp.einsum("gske,gskc->gsec", one_hot * (chosen_gate * kept)[..., None], slot)
    return dispatch, combine


def expert_mlp(tokens: jax.Array, w_in: jax.Array, w_out: jax.Array,
               precision=None) -> jax.Array:
    """(experts, groups, slots, embed) -> same, each expert its own GELU MLP."""
    hidden = jax.nn.gelu(jnp.einsum("egcm,emh->egch", tokens, w_in, precision=precision))
    return jnp.einsum("egch,ehm->egcm", hidden, w_out, precision=precision)


def reference(x: jax.Array, router: jax.Array, w_in: jax.Array, w_out: jax.Array, *,
              top_k: int, capacity_factor: float, mesh: str) -> jax.Array:
    """Dense and unsharded: every expert runs on its slots of every group, one device."""
    del mesh
    return _dense(x, router, w_in, w_out, top_k=top_k, capacity_factor=capacity_factor)


# Jitted: op by op, the routing's many small ops take seconds to dispatch on CPU.
@functools.partial(jax.jit, static_argnames=("top_k", "capacity_factor"))
def _dense(x: jax.Array, router: jax.Array, w_in: jax.Array, w_out: jax.Array, *,
           top_k: int, capacity_factor: float) -> jax.Array:
    slots = capacity(x.shape[1], router.shape[1], top_k, capacity_factor)
    dispatch, combine = route(x, router, top_k, slots)
    tokens = jnp.einsum("gsec,gsm->egcm", dispatch, x, precision=HIGHEST)
    outputs = expert_mlp(tokens, w_in, w_out, precision=HIGHEST)
    return jnp.einsum("gsec,egcm->gsm", combine, outputs, precision=HIGHEST).astype(x.dtype)


def validate(x, router, w_in, w_out, top_k: int, capacity_factor: float, mesh: str) -> None:
    """Shapes, dtypes, routing parameters and divisibility by the mesh."""
    validation.check_array("x", x, rank=3, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_array("router", router, rank=2, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_array("w_in", w_in, rank=3, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_array("w_out", w_out, rank=3, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_same_dtype(x=x, router=router, w_in=w_in, w_out=w_out)
    groups, _, embed = x.shape
    experts, mlp = router.shape[1], w_in.shape[2]
    for name, array, shape in (("router", router, (embed, experts)),
                               ("w_in", w_in, (experts, embed, mlp)),
                               ("w_out", w_out, (experts, mlp, embed))):
        if tuple(array.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} from x {tuple(x.shape)} and "
                             f"router/w_in, got {tuple(array.shape)}")
    if not (isinstance(top_k, int) and 1 <= top_k <= experts):
        raise ValueError(f"top_k: expected an int in [1, {experts}], got {top_k!r}")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor: expected > 0, got {capacity_factor!r}")
    data, model = meshes.parse_mesh_shape(mesh)
    for name, size, axis, count in (("x", groups, "groups", data), ("router", experts,
                                    "experts", data), ("w_in", mlp, "mlp features", model)):
        if size % count:
            raise ValueError(f"{name}: expected {axis} divisible by {count} (mesh {mesh}), "
                             f"got {size}")


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray, ...]:
    """Normal entries, weights scaled by 1/sqrt(fan-in); "large" scales x by 10.

    x and the router are rounded to coarse binary grids (x to 1/8, or to
    integers for "large"; the router to 1/64): every product x * router is
    then exact and every router logit an exact sum in float32 (and TF32)
    whatever the summation order. Routing is a discrete choice; exact logits
    make it the same on one device and sharded, so the comparison with the
    reference measures the experts, not a near-tie broken differently.
    """
    g, s, m, h, e = (case[d] for d in ("groups", "group_size", "embed", "mlp", "experts"))
    dtype = dtypes.to_numpy(case.dtype)

    def normal(shape, scale):
        return rng.standard_normal(shape, dtype=np.float32) * scale

    def on_grid(x, step, bound):
        return np.clip(np.round(x / step) * step, -bound, bound).astype(dtype)

    x = (on_grid(normal((g, s, m), 10.0), 1.0, 40.0) if distribution == "large"
         else on_grid(normal((g, s, m), 1.0), 1 / 8, 4.0))
    router = on_grid(normal((m, e), 1 / np.sqrt(m)), 1 / 64, 1.0)
    return (x, router, normal((e, m, h), 1 / np.sqrt(m)).astype(dtype),
            normal((e, h, m), 1 / np.sqrt(h)).astype(dtype))


def work(case: registry.Case, direction: str) -> registry.Work:
    """Router and expert-MLP FLOPs on the capacity slots; comm_bytes summed over all devices.

    Forward communication: two all-to-alls over the expert axis (dispatch and
    return) move (data - 1) / data of the (experts, groups, slots, embed)
    tensor each, and the partial outputs of the model-sharded MLP are
    all-reduced over model (2 (model - 1) * tokens * embed elements by a ring).
    Backward: the same all-to-alls and all-reduce (for dx), plus an all-reduce
    of the replicated router's gradient over all devices.
    """
    g, s, m, h, e = (case[d] for d in ("groups", "group_size", "embed", "mlp", "experts"))
    params = case.kwargs
    data, model = meshes.parse_mesh_shape(params["mesh"])
    c = capacity(s, e, params["top_k"], params["capacity_factor"])
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    tokens = g * s
    flops = 2.0 * tokens * m * e + 4.0 * e * g * c * m * h
    bytes_ = (2 * tokens * m + m * e + 2 * e * m * h) * itemsize
    exchanged = 2 * (data - 1) / data * e * g * c * m * itemsize
    reduced = 2 * (model - 1) * tokens * m * itemsize
    if direction == "fwd":
        return registry.Work(flops=flops, bytes=bytes_, comm_bytes=exchanged + reduced)
    registry.check_direction(direction)
    devices = data * model
    return registry.Work(flops=2 * flops, bytes=2 * bytes_,
                         comm_bytes=exchanged + reduced + 2 * (devices - 1) * m * e * itemsize)


def exchanges(case: registry.Case, direction: str) -> tuple[registry.Exchange, ...]:
    """The forward's two all-to-alls over the expert (data) axis: each rank's buffer is its
    share of the (experts, groups, slots, embed) tensor (nccl-tests' all-to-all S). The
    backward's are not listed (their order among the gradient's collectives is the
    compiler's)."""
    registry.check_direction(direction)
    data, _ = meshes.parse_mesh_shape(case.kwargs["mesh"])
    if direction != "fwd" or data < 2:
        return ()
    c = capacity(case["group_size"], case["experts"], case.kwargs["top_k"],
                 case.kwargs["capacity_factor"])
    per_rank = (case["experts"] * case["groups"] * c * case["embed"]
                * dtypes.to_numpy(case.dtype).itemsize) // data
    return tuple(registry.Exchange(label=label, kind="all-to-all", size_bytes=per_rank,
                                   ranks=data, kernels=("SendRecv", "AllToAll"))
                 for label in ("dispatch", "combine"))


def tolerance(case: registry.Case, *, rounding: float = 0.0) -> float:
    """Four chained products (dispatch, the expert's two layers, combine), each rounding its
    result; `rounding`: the relative rounding of float32 operands by the implementation's
    precision (TF32: 2^-11), twice per product. The router's logits are FP32 in every
    implementation (`route`)."""
    return 4 * (2.0 * rounding
                + checking.relative_tolerance(case.dtype, max(case["embed"], case["mlp"])))


def _case(dtype: str, dims: tuple[int, ...], mesh: str, *tags: str, top_k: int = 2,
          capacity_factor: float = 1.0) -> registry.Case:
    names = ("groups", "group_size", "embed", "mlp", "experts")
    return registry.make_case(NAME, dtype, dict(zip(names, dims, strict=True)),
                              params={"top_k": top_k, "capacity_factor": capacity_factor,
                                      "mesh": mesh}, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    # Capacity factor 1 with random routing overfills some experts: tokens are dropped.
    # The 4x2 case is a CPU benchmark too (KERNELPERF_BENCH_FULL, on 8 host devices).
    cases = [_case("f32", (8, 16, 8, 16, 8), mesh, "cpu",
                   *((registry.BENCH_TAG,) if mesh == "4x2" else ()))
             for mesh in ("8x1", "4x2", "2x4")]
    cases.append(_case("f32", (8, 16, 8, 16, 8), "4x2", "cpu", top_k=1, capacity_factor=2.0))
    # Real sizes (8k tokens); the reference's dense one-hot dispatch bounds them.
    # Benchmarked where the machine holds the mesh (2, 4 and 8 devices declared).
    cases += [_case("f32", (8, 1024, 1024, 4096, 8), mesh, "gpu", registry.BENCH_TAG,
                    capacity_factor=1.25)
              for mesh in meshes.shapes_up_to(max(meshes.GPU_DEVICE_COUNTS))]
    return tuple(cases)


def _args(**changes):
    shapes = {"x": (4, 8, 8), "router": (8, 4), "w_in": (4, 8, 16), "w_out": (4, 16, 8)}
    arrays = {name: np.ones(shape, np.float32) for name, shape in shapes.items()}
    params = {"top_k": 2, "capacity_factor": 1.0, "mesh": "2x2"}
    arrays.update({k: v for k, v in changes.items() if k in arrays})
    params.update({k: v for k, v in changes.items() if k in params})
    return (*arrays.values(), *params.values())


BAD_INPUTS = (
    registry.BadInput("router-shape", lambda: _args(router=np.ones((8, 5), np.float32)),
                      ValueError, r"w_in: expected shape \(5, 8, 16\)"),
    registry.BadInput("top-k", lambda: _args(top_k=5), ValueError,
                      r"top_k: expected an int in \[1, 4\], got 5"),
    registry.BadInput("capacity", lambda: _args(capacity_factor=0.0), ValueError,
                      r"capacity_factor: expected > 0"),
    registry.BadInput("groups-not-divisible", lambda: _args(x=np.ones((3, 8, 8), np.float32)),
                      ValueError, r"x: expected groups divisible by 2"),
    registry.BadInput("int-x", lambda: _args(x=np.ones((4, 8, 8), np.int32)),
                      TypeError, r"x: expected dtype in .* got int32"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="mixture-of-experts MLP, top-k routing with capacity, experts over a mesh axis",
    input_names=("x", "router", "w_in", "w_out"),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    dots=True,
    bad_inputs=BAD_INPUTS,
    # Groups (tokens) over the expert axis, hidden features over model.
    weak_scaling=((meshes.DATA, ("groups",)), (meshes.MODEL, ("mlp",))),
    exchanges=exchanges,
))
