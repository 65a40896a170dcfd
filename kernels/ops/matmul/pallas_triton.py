"""Matmul in Pallas (Triton lowering): tiled, float32 accumulation, grouped tile order; custom VJP.

A 1-D grid of programs, one per (block_m, block_n) tile of C. Program ids are
mapped to tiles in groups of `group_m` tile rows (the Triton matmul tutorial's
"grouped ordering"): programs running together share A row panels and B
column panels, so they hit L2 instead of device memory. Each program walks K
in steps of `block_k`, accumulating tl.dot products in float32. Edges that are
not multiples of a block are masked loads (zeros) and masked stores, so no
shape needs padding.

Backward: dA = dC B^T and dB = A^T dC through the same kernel, on transposes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.core import compat, precisions, registry, tuning, validation
from kernels.ops.matmul import spec

plt = compat.pallas_triton()
IMPL = "pallas_triton"


MatmulConfig = spec.TileConfig

# Untuned GPUs: 128x128x64 tiles with 8 warps and 3 stages fit every sm_80+
# shared memory (3 * (128*64 + 64*128) * 2 B = 96 KiB for 16-bit inputs).
GPU_DEFAULT = MatmulConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8,
                           num_stages=3)
# float32 tiles take twice the shared memory per stage.
GPU_DEFAULT_F32 = MatmulConfig(block_m=128, block_n=128, block_k=32, group_m=8, num_warps=8,
                               num_stages=3)
# Interpreted on CPU: the cost is per program, so a few large tiles are fastest.
INTERPRET_DEFAULT = MatmulConfig(block_m=64, block_n=64, block_k=64, group_m=2)


def default_config(m: int, n: int, k: int, dtype, interpret: bool) -> MatmulConfig:
    """Tuned config for this GPU model (kernels/ops/matmul/tuned.json: the plain entry for
    16-bit dtypes, "pallas_triton:f32" for float32), else the fixed default, shrunk so that
    small problems do not pay for tiles far larger than themselves."""
    if interpret:
        base = INTERPRET_DEFAULT
    elif dtype == jnp.float32:
        base = tuning.tuned_config(spec.NAME, IMPL, GPU_DEFAULT_F32, variant="f32") \
            or GPU_DEFAULT_F32
    else:
        base = tuning.tuned_config(spec.NAME, IMPL, GPU_DEFAULT) or GPU_DEFAULT
    fit = lambda block, size: max(16, min(block, pl.next_power_of_2(size)))  # noqa: E731
    return dataclasses.replace(base, block_m=fit(base.block_m, m), block_n=fit(base.block_n, n),
                               block_k=fit(base.block_k, k))


def _tile_of_program(pid, m: int, n: int, config: MatmulConfig):
    """Grouped ordering: consecutive programs sweep group_m tile rows column by column."""
    tiles_m = pl.cdiv(m, config.block_m)
    tiles_n = pl.cdiv(n, config.block_n)
    per_group = config.group_m * tiles_n
    group = pid // per_group
    first_m = group * config.group_m
    rows_in_group = jnp.minimum(tiles_m - first_m, config.group_m)
    tile_m = first_m + (pid % per_group) % rows_in_group
    tile_n = (pid % per_group) // rows_in_group
    return tile_m, tile_n


def matmul_kernel(
    # Inputs
    a_ref,
    b_ref,
    # Outputs
    c_ref,
    *,
    config: MatmulConfig,
):
    m, k = a_ref.shape
    _, n = b_ref.shape
    tile_m, tile_n = _tile_of_program(pl.program_id(0), m, n, config)
    rows = tile_m * config.block_m + jnp.arange(config.block_m)
    cols = tile_n * config.block_n + jnp.arange(config.block_n)
    row_ok = rows < m
    col_ok = cols < n

    def step(i, acc):
        start = i * config.block_k
        ks = start + jnp.arange(config.block_k)
        k_ok = ks < k
        a = plt.load(a_ref.at[pl.ds(tile_m * config.block_m, config.block_m),
                              pl.ds(start, config.block_k)],
                     mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = plt.load(b_ref.at[pl.ds(start, config.block_k),
                              pl.ds(tile_n * config.block_n, config.block_n)],
                     mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        return acc + jnp.dot(a, b, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, pl.cdiv(k, config.block_k), step,
                            jnp.zeros((config.block_m, config.block_n), jnp.float32))
    plt.store(c_ref.at[pl.ds(tile_m * config.block_m, config.block_m),
                       pl.ds(tile_n * config.block_n, config.block_n)],
              acc.astype(c_ref.dtype), mask=row_ok[:, None] & col_ok[None, :])


def _launch(a: jax.Array, b: jax.Array, config: MatmulConfig | None,
            interpret: bool) -> jax.Array:
    m, k = a.shape
    _, n = b.shape
    config = config or default_config(m, n, k, a.dtype, interpret)
    grid = pl.cdiv(m, config.block_m) * pl.cdiv(n, config.block_n)
    return pl.pallas_call(
        functools.partial(matmul_kernel, config=config),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        grid=(grid,),
        compiler_params=plt.CompilerParams(num_warps=config.num_warps,
                                           num_stages=config.num_stages),
        interpret=interpret,
        name="matmul",
    )(a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(a, b, config, interpret):
    return _launch(a, b, config, interpret)


def _matmul_fwd(a, b, config, interpret):
    return _launch(a, b, config, interpret), (a, b)


def _matmul_bwd(config, interpret, residuals, dc):
    a, b = residuals
    # The forward config's tiles are for (m, n, k); the gradients have other shapes.
    da = _launch(dc, b.T, None, interpret)
    db = _launch(a.T, dc, None, interpret)
    return da, db


_matmul.defvjp(_matmul_fwd, _matmul_bwd)
_matmul_jit = jax.jit(_matmul, static_argnums=(2, 3))


def matmul(a: jax.Array, b: jax.Array, *, config: MatmulConfig | None = None,
           interpret: bool | None = None) -> jax.Array:
    """a @ b for (m, k) and (k, n) arrays of one dtype (f32, bf16, f16); differentiable.

    Args:
      config: tiles; `default_config` (tuned per GPU model where recorded) when None.
      interpret: run the Pallas interpreter; by default wherever JAX has no GPU.
    Returns:
      (m, n) array in the inputs' dtype, accumulated in float32.
    """
    spec.validate(a, b)
    validation.check_config(config, MatmulConfig)
    validation.check_flag("interpret", interpret)
    validation.check_index_range("a", a)
    validation.check_index_range("b", b)
    if (empty := spec.empty_product(a, b)) is not None:
        return empty
    if interpret is None:
        interpret = compat.pallas_interpret()
    return _matmul_jit(a, b, config, interpret)


# The grid `python -m kernels tune matmul` times on the operation's bf16 8192^3 case.
TUNING_CANDIDATES = tuple(
    MatmulConfig(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3),
        (256, 128, 64, 8, 3), (128, 256, 32, 8, 4), (64, 256, 64, 4, 4),
        (128, 128, 32, 4, 5), (256, 128, 32, 8, 4),
    ])
tuning.register_tunable(spec.NAME, IMPL, functools.partial(
    tuning.sweep, spec.NAME, IMPL, TUNING_CANDIDATES, "bf16-8192x8192x8192"))
# float32 (TF32 dots) on the f32 4096^3 case, as "pallas_triton:f32": 4-byte tiles take twice
# the shared memory of the grid above per stage ((block_m + block_n) block_k 4 B; 192 KiB at
# most, 128x128x64 in 3 stages). The first is the untuned default (GPU_DEFAULT_F32), which
# ran at 0.19x of XLA's TF32 on the H200 (issue 51).
F32_TUNING_CASE = "f32-4096x4096x4096"
F32_TUNING_CANDIDATES = tuple(
    MatmulConfig(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (128, 128, 32, 8, 3), (128, 128, 32, 4, 4), (128, 256, 32, 8, 3),
        (256, 128, 32, 8, 3), (128, 128, 64, 8, 3), (128, 256, 16, 8, 4),
        (64, 128, 32, 4, 4), (128, 64, 32, 4, 4),
    ])
tuning.register_tunable(spec.NAME, tuning.slot(IMPL, "f32"), functools.partial(
    tuning.sweep, spec.NAME, IMPL, F32_TUNING_CANDIDATES, F32_TUNING_CASE, variant="f32"))

registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name=IMPL,
    fn=matmul,
    # jnp.dot at the default precision: the Triton lowering maps DEFAULT (and HIGH) to
    # input_precision TF32 for float32 (jax/_src/pallas/triton/lowering.py,
    # _dot_general_lowering); interpret mode runs the dot on XLA:CPU, in FP32.
    precision=precisions.TF32_ON_GPU,
    description="Pallas (Triton lowering), tiled, grouped tile order, f32 accumulation; "
                "custom VJP through the same kernel",
))
