"""Sharded matrix product C = A @ B over a (data, model) mesh: reference, inputs, work, cases.

Layout (the tensor-parallel layer with sequence-parallel input, as in
Wang et al., "Overlap communication with dependent computation via
decomposition", ASPLOS 2023): A (m, k) has its rows split over data and model,
B (k, n) its columns over model, and C (m, n) comes out with rows over data and
columns over model. Computing C needs A's rows all-gathered over the model
axis; that traffic is what a collective matmul hides behind the products.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from kernels.core import dtypes, registry
from kernels.ops.matmul import spec as matmul_spec
from kernels.sharding import meshes

NAME = "sharded_matmul"
SUPPORTED_DTYPES = ("f32", "bf16")
A_SPEC = P((meshes.DATA, meshes.MODEL), None)
B_SPEC = P(None, meshes.MODEL)
C_SPEC = P(meshes.DATA, meshes.MODEL)


def reference(a: jax.Array, b: jax.Array, *, mesh: str) -> jax.Array:
    """The unsharded product at full float32 precision; `mesh` does not change the result."""
    del mesh
    return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def validate(a, b, mesh: str) -> None:
    """Shapes, dtypes and divisibility by the mesh, checked before anything is placed."""
    matmul_spec.validate(a, b)
    data, model = meshes.parse_mesh_shape(mesh)
    m, n = a.shape[0], b.shape[1]
    if m % (data * model):
        raise ValueError(f"a: expected rows divisible by data*model = {data * model} "
                         f"(mesh {mesh}), got shape {tuple(a.shape)}")
    if n % model:
        raise ValueError(f"b: expected columns divisible by model = {model} (mesh {mesh}), "
                         f"got shape {tuple(b.shape)}")


def prepare(case: registry.Case, a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A and B laid out over the case's mesh (outside the timed region)."""
    mesh = meshes.make_mesh(case.kwargs["mesh"])
    return meshes.place(a, mesh, A_SPEC), meshes.place(b, mesh, B_SPEC)


def make_inputs(case: registry.Case, rng: np.random.Generator,
                distribution: str) -> tuple[np.ndarray, np.ndarray]:
    return matmul_spec.make_inputs(case, rng, distribution)


def work(case: registry.Case, direction: str) -> registry.Work:
    """FLOPs and memory bytes of the unsharded product; comm_bytes summed over all devices.

    Forward: every device receives the other model-axis devices' rows of A,
    (model - 1) * m * k elements in total. Backward: dA is reduce-scattered
    back over model (the same amount), and dB, partial on every data row of
    the mesh, is all-reduced over data: 2 (data - 1) * k * n elements by a ring.
    """
    data, model = meshes.parse_mesh_shape(case.kwargs["mesh"])
    m, n, k = case["m"], case["n"], case["k"]
    itemsize = dtypes.to_numpy(case.dtype).itemsize
    base = matmul_spec.work(case, direction)
    gathered = (model - 1) * m * k * itemsize
    if direction == "fwd":
        return registry.Work(flops=base.flops, bytes=base.bytes, comm_bytes=gathered)
    return registry.Work(flops=base.flops, bytes=base.bytes,
                         comm_bytes=gathered + 2 * (data - 1) * k * n * itemsize)


def tolerance(case: registry.Case, *, rounding: float = 0.0) -> float:
    return matmul_spec.tolerance(case, rounding=rounding)


def gradient_magnitude(inputs, c, dc, *, mesh: str):
    """As the unsharded product's: the mesh does not change the terms summed."""
    del mesh
    return matmul_spec.gradient_magnitude(inputs, c, dc)


def _case(dtype: str, m: int, n: int, k: int, mesh: str, *tags: str) -> registry.Case:
    return registry.make_case(NAME, dtype, {"m": m, "n": n, "k": k}, params={"mesh": mesh},
                              tags=tags)


# Real sizes on the meshes of 2, 4 and 8 devices (meshes.standard_shapes: 1xN, Nx1, 2xN/2): a
# product big enough that each ring step's matmul outlasts its transfer over NVLink. Tagged
# "bench" too: asv times those the machine's devices hold and skips the rest, naming the need.
GPU_MESHES = tuple(meshes.shapes_up_to(max(meshes.GPU_DEVICE_COUNTS)))


def _cases() -> tuple[registry.Case, ...]:
    # The 4x2 case is a CPU benchmark too (KERNELPERF_BENCH_FULL, on 8 host devices).
    cases = [_case("f32", 64, 32, 48, mesh, "cpu",
                   *((registry.BENCH_TAG,) if mesh == "4x2" else ()))
             for mesh in ("8x1", "4x2", "2x4")]
    cases += [_case("bf16", 8192, 8192, 4096, mesh, "gpu", registry.BENCH_TAG)
              for mesh in GPU_MESHES]
    return tuple(cases)


BAD_INPUTS = (
    registry.BadInput("rows-not-divisible",
                      lambda: (np.ones((6, 4), np.float32), np.ones((4, 4), np.float32), "2x2"),
                      ValueError, r"a: expected rows divisible by data\*model = 4"),
    registry.BadInput("bad-mesh", lambda: (np.ones((4, 4), np.float32),
                                           np.ones((4, 4), np.float32), "4by1"),
                      ValueError, r"mesh: expected 'DATAxMODEL'"),
    registry.BadInput("inner-mismatch",
                      lambda: (np.ones((4, 5), np.float32), np.ones((4, 4), np.float32), "1x1"),
                      ValueError, r"b: expected 5 rows to match a's columns"),
)

OPERATION = registry.register_operation(registry.Operation(
    name=NAME,
    description="matrix product (m, k) @ (k, n) over a (data, model) mesh",
    input_names=("a", "b"),
    reference=reference,
    make_inputs=make_inputs,
    work=work,
    tolerance=tolerance,
    cases=_cases(),
    validate=validate,
    dots=True,
    bad_inputs=BAD_INPUTS,
    gradient_magnitude=gradient_magnitude,
    # A's rows are split over data and model: m per device stays fixed as either grows.
    weak_scaling=((meshes.DATA, ("m",)), (meshes.MODEL, ("m",))),
))
