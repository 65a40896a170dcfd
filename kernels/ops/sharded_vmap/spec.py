"""Per-example projection and softmax, vmapped over a sharded batch: reference, inputs, work.

Each example x_i (rows, d_in) maps to softmax(x_i @ w) normalised over its
rows (axis 0 of the example), so the function mixes rows within an example
and never across examples. Laid out with the batch over `data` and w's output
features over `model`, every device can compute its block alone: the
compiled forward needs no communication at all.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels.core import checking, dtypes, registry, validation
from kernels.sharding import meshes

NAME = "sharded_vmap"
SUPPORTED_DTYPES = ("f32", "bf16")
RULES = meshes.MeshRules()
X_SPEC = RULES.spec("batch", None, "embed")
W_SPEC = RULES.spec("embed", "mlp")
OUT_SPEC = RULES.spec("batch", None, "mlp")


def per_example(x: jax.Array, w: jax.Array) -> jax.Array:
    """(rows, d_in), (d_in, d_out) -> (rows, d_out), softmax over the rows."""
    logits = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))
    return jax.nn.softmax(logits, axis=0).astype(x.dtype)


def reference(x: jax.Array, w: jax.Array, *, mesh: str) -> jax.Array:
    """The batched computation written out, no vmap and no sharding."""
    del mesh
    logits = jnp.einsum("bnd,de->bne", x, w, precision=jax.lax.Precision.HIGHEST)
    return jax.nn.softmax(logits, axis=1)


def validate(x, w, mesh: str) -> None:
    validation.check_array("x", x, rank=3, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_array("w", w, rank=2, allowed_dtypes=SUPPORTED_DTYPES)
    validation.check_same_dtype(x=x, w=w)
    if x.shape[2] != w.shape[0]:
        raise ValueError(f"w: expected {x.shape[2]} rows to match x's features (x is "
                         f"{tuple(x.shape)}), got shape {tuple(w.shape)}")
    data, model = meshes.parse_mesh_shape(mesh)
    if x.shape[0] % data:
        raise ValueError(f"x: expected a batch divisible by data = {data} (mesh {mesh}), "
                         f"got shape {tuple(x.shape)}")
    if w.shape[1] % model:
        raise ValueError(f"w: expected columns divisible by model = {model} (mesh {mesh}), "
                         f"got shape {tuple(w.shape)}")


def prepare(case: registry.Case, x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    mesh = meshes.make_mesh(case.kwargs["mesh"])
    return meshes.place(x, mesh, X_SPEC), meshes.place(w, mesh, W_SPEC)


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray, np.ndarray]:
    """Normal entries, w scaled by 1/sqrt(d_in); "large" scales x by 10 (peaked softmax)."""
    b, n, d_in, d_out = (case[d] for d in ("batch", "rows", "d_in", "d_out"))
    dtype = dtypes.to_numpy(case.dtype)
    scale = 10.0 if distribution == "large" else 1.0
    x = (rng.standard_normal((b, n, d_in), dtype=np.float32) * scale).astype(dtype)
    w = (rng.standard_normal((d_in, d_out), dtype=np.float32) / np.sqrt(d_in)).astype(dtype)
    return x, w


def work(case: registry.Case, direction: str) -> registry.Work:
    """2 b n d_in d_out for the product (softmax's O(b n d_out) left out); comm over all devices.

    Forward: none. Backward: dw is partial on every data row of the mesh and
    all-reduced over data (2 (data - 1) d_in d_out elements by a ring); dx is
    partial over the model axis and all-reduced there (2 (model - 1) b n d_in).
    """
    b, n, d_in, d_out = (case[d] for d in ("batch", "rows", "d_in", "d_out"))
    data, model = meshes.parse_mesh_shape(case.kwargs["mesh"])
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    flops = 2.0 * b * n * d_in * d_out
    bytes_ = (b * n * d_in + d_in * d_out + b * n * d_out) * itemsize
    if direction == "fwd":
        return registry.Work(flops=flops, bytes=bytes_)
    registry.check_direction(direction)
    comm = (2 * (data - 1) * d_in * d_out + 2 * (model - 1) * b * n * d_in) * itemsize
    return registry.Work(flops=2 * flops, bytes=2 * bytes_, comm_bytes=comm)


# Standard deviation of the "large" inputs' logits (x scaled by 10, w by 1/sqrt(d_in)).
LARGE_LOGIT_STD = 10.0


def tolerance(case: registry.Case, *, rounding: float = 0.0) -> float:
    """The product's and the softmax's rounding; `rounding`: the relative rounding of float32
    operands by the implementation's precision (TF32: 2^-11) errs each logit by about twice
    that times its size, and softmax turns an error in a logit into a relative one in its
    probability."""
    return 2 * (checking.relative_tolerance(case.dtype, case["d_in"])
                + 2.0 * rounding * LARGE_LOGIT_STD)


def _case(dtype: str, dims: tuple[int, ...], mesh: str, *tags: str) -> registry.Case:
    names = ("batch", "rows", "d_in", "d_out")
    return registry.make_case(NAME, dtype, dict(zip(names, dims, strict=True)),
                              params={"mesh": mesh}, tags=tags)


def _cases() -> tuple[registry.Case, ...]:
    # The 4x2 case is a CPU benchmark too (KERNELPERF_BENCH_FULL, on 8 host devices).
    cases = [_case("f32", (16, 8, 16, 32), mesh, "cpu",
                   *((registry.BENCH_TAG,) if mesh == "4x2" else ()))
             for mesh in ("8x1", "4x2", "2x4")]
    # Real sizes on the meshes of 2, 4 and 8 devices; benchmarked where the machine holds them.
    cases += [_case("bf16", (32, 512, 1024, 4096), mesh, "gpu", registry.BENCH_TAG)
              for mesh in meshes.shapes_up_to(max(meshes.GPU_DEVICE_COUNTS))]
    return tuple(cases)


BAD_INPUTS = (
    registry.BadInput("batch-not-divisible",
                      lambda: (np.ones((3, 2, 4), np.float32), np.ones((4, 4), np.float32), "2x1"),
                      ValueError, r"x: expected a batch divisible by data = 2"),
    registry.BadInput("features", lambda: (np.ones((2, 2, 4), np.float32),
                                           np.ones((5, 4), np.float32), "1x1"),
                      ValueError, r"w: expected 4 rows to match x's features"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="per-example softmax(x_i @ w) vmapped over a batch sharded across devices",
    input_names=("x", "w"),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    dots=True,
    bad_inputs=BAD_INPUTS,
    weak_scaling=((meshes.DATA, ("batch",)), (meshes.MODEL, ("d_out",))),
))
