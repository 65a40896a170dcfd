"""Pre-norm transformer block over a (data, model) mesh: reference, inputs, work, cases.

x + attention(rms(x)), then + mlp(rms(.)): multi-head softmax attention (no
mask) and a GELU MLP, with parameter-free RMS normalisation. Parameters carry
logical axis names (LOGICAL below) that `meshes.MeshRules` maps to mesh
axes: the Megatron layout, heads and MLP features over `model`, batch over
`data`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation
from kernels.sharding import meshes

NAME = "transformer_block"
SUPPORTED_DTYPES = ("f32", "bf16")
HIGHEST = jax.lax.Precision.HIGHEST
INPUT_NAMES = ("x", "wq", "wk", "wv", "wo", "w_in", "w_out")
# Logical axis names of each input's dimensions (and of the output, same as x).
LOGICAL = {
    "x": ("batch", None, "embed"),
    "wq": ("embed", "heads", None),
    "wk": ("embed", "heads", None),
    "wv": ("embed", "heads", None),
    "wo": ("heads", None, "embed"),
    "w_in": ("embed", "mlp"),
    "w_out": ("mlp", "embed"),
}


def rms_norm(x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def reference(x, wq, wk, wv, wo, w_in, w_out, *, mesh: str) -> jax.Array:
    """The block in plain jnp on one device."""
    del mesh
    return _block(x, wq, wk, wv, wo, w_in, w_out)


# Jitted: op by op, the reference's gradient takes seconds to dispatch on CPU.
@jax.jit
def _block(x, wq, wk, wv, wo, w_in, w_out) -> jax.Array:
    dot = dict(precision=HIGHEST)
    h = rms_norm(x)
    q, k, v = (jnp.einsum("bsm,mhd->bshd", h, w, **dot) for w in (wq, wk, wv))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, **dot) / np.sqrt(q.shape[-1])
    attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v, **dot)
    x = x + jnp.einsum("bqhd,hdm->bqm", attended, wo, **dot)
    hidden = jax.nn.gelu(jnp.einsum("bsm,mf->bsf", rms_norm(x), w_in, **dot))
    return x + jnp.einsum("bsf,fm->bsm", hidden, w_out, **dot)


def dims_of(x, wq, w_in) -> dict[str, int]:
    batch, seq, embed = x.shape
    _, heads, head_dim = wq.shape
    return dict(batch=batch, seq=seq, embed=embed, heads=heads, head_dim=head_dim,
                mlp=w_in.shape[1])


def validate(x, wq, wk, wv, wo, w_in, w_out, mesh: str) -> None:
    arrays = dict(zip(INPUT_NAMES, (x, wq, wk, wv, wo, w_in, w_out), strict=True))
    for name, array in arrays.items():
        validation.check_array(name, array, rank=len(LOGICAL[name]),
                               allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_same_dtype(**arrays)
    d = dims_of(x, wq, w_in)
    expected = {"wq": ("embed", "heads", "head_dim"), "wk": ("embed", "heads", "head_dim"),
                "wv": ("embed", "heads", "head_dim"), "wo": ("heads", "head_dim", "embed"),
                "w_in": ("embed", "mlp"), "w_out": ("mlp", "embed")}
    for name, names in expected.items():
        shape = tuple(d[n] for n in names)
        if tuple(arrays[name].shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} ({', '.join(names)}), "
                             f"got {tuple(arrays[name].shape)}")
    data, model = meshes.parse_mesh_shape(mesh)
    for name, dim, count in (("x", "batch", data), ("wq", "heads", model), ("w_in", "mlp", model)):
        if d[dim] % count:
            raise ValueError(f"{name}: expected {dim} divisible by {count} (mesh {mesh}), "
                             f"got {d[dim]}")


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray, ...]:
    """Normal entries, weights scaled by 1/sqrt(fan-in); "large" scales x by 10."""
    b, s, m, h, d, f = (case[n] for n in ("batch", "seq", "embed", "heads", "head_dim", "mlp"))
    dtype = dtypes.to_numpy(case.dtype)

    def normal(shape, scale):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)

    x = normal((b, s, m), 10.0 if distribution == "large" else 1.0)
    wq, wk, wv = (normal((m, h, d), 1 / np.sqrt(m)) for _ in range(3))
    return (x, wq, wk, wv, normal((h, d, m), 1 / np.sqrt(h * d)), normal((m, f), 1 / np.sqrt(m)),
            normal((f, m), 1 / np.sqrt(f)))


def work(case: registry.Case, direction: str) -> registry.Work:
    """Matmul FLOPs of attention and MLP; comm_bytes summed over all devices.

    Forward (Megatron layout): the attention output projection and the MLP's
    second matmul are partial over `model` and all-reduced there, 2 (model - 1)
    * batch * seq * embed elements each by a ring. Backward: the same two
    all-reduces for dx, plus every weight gradient all-reduced over `data`
    (2 (data - 1) * parameters).
    """
    b, s, m, h, d, f = (case[n] for n in ("batch", "seq", "embed", "heads", "head_dim", "mlp"))
    data, model = meshes.parse_mesh_shape(case.kwargs["mesh"])
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    parameters = 4 * m * h * d + 2 * m * f
    flops = 2.0 * b * s * (4 * m * h * d + 2 * m * f) + 4.0 * b * h * s * s * d
    bytes_ = (2 * b * s * m + parameters) * itemsize
    all_reduces = 2 * 2 * (model - 1) * b * s * m * itemsize
    if direction == "fwd":
        return registry.Work(flops=flops, bytes=bytes_, comm_bytes=all_reduces)
    registry.check_direction(direction)
    return registry.Work(flops=2 * flops, bytes=2 * bytes_,
                         comm_bytes=all_reduces + 2 * (data - 1) * parameters * itemsize)


def tolerance(case: registry.Case, *, rounding: float = 0.0) -> float:
    """Chained products, each rounding its result; `rounding`: the relative rounding of
    float32 operands by the implementation's precision (TF32: 2^-11), twice per product."""
    return 4 * (2.0 * rounding
                + checking.relative_tolerance(case.dtype, max(case["embed"], case["mlp"])))


def _case(dtype: str, dims: tuple[int, ...], mesh: str, *tags: str) -> registry.Case:
    names = ("batch", "seq", "embed", "heads", "head_dim", "mlp")
    return registry.make_case(NAME, dtype, dict(zip(names, dims, strict=True)),
                              params={"mesh": mesh}, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    # The 4x2 case is a CPU benchmark too (KERNELPERF_BENCH_FULL, on 8 host devices).
    cases = [_case("f32", (8, 8, 16, 4, 4, 32), mesh, "cpu",
                   *((registry.BENCH_TAG,) if mesh == "4x2" else ()))
             for mesh in ("8x1", "4x2", "2x4")]
    # Real sizes on the meshes of 2, 4 and 8 devices; benchmarked where the machine holds them.
    cases += [_case("f32", (16, 512, 1024, 16, 64, 4096), mesh, "gpu", registry.BENCH_TAG)
              for mesh in meshes.shapes_up_to(max(meshes.GPU_DEVICE_COUNTS))]
    return tuple(cases)


def _args(**changes):
    shapes = {"x": (2, 4, 8), "wq": (8, 2, 4), "wk": (8, 2, 4), "wv": (8, 2, 4),
              "wo": (2, 4, 8), "w_in": (8, 16), "w_out": (16, 8)}
    arrays = {n: changes.get(n, np.ones(s, np.float32)) for n, s in shapes.items()}
    return (*arrays.values(), changes.get("mesh", "2x2"))


BAD_INPUTS = (
    registry.BadInput("wo-shape", lambda: _args(wo=np.ones((2, 4, 9), np.float32)), ValueError,
                      r"wo: expected shape \(2, 4, 8\) \(heads, head_dim, embed\), "
                      r"got \(2, 4, 9\)"),
    registry.BadInput("heads-not-divisible", lambda: _args(mesh="1x4"), ValueError,
                      r"wq: expected heads divisible by 4"),
    registry.BadInput("x-rank", lambda: _args(x=np.ones((2, 8), np.float32)), ValueError,
                      r"x: expected rank 3"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="pre-norm transformer block (attention + GELU MLP) sharded by logical rules",
    input_names=INPUT_NAMES,
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    dots=True,
    bad_inputs=BAD_INPUTS,
    # Megatron layout: heads and MLP features over model, the batch over data.
    weak_scaling=((meshes.DATA, ("batch",)), (meshes.MODEL, ("heads", "mlp"))),
))
