"""Softmax in Pallas (Triton lowering): online softmax over column blocks, custom VJP.

Each program owns `block_rows` rows and walks their columns in blocks of
`block_cols`. When a row fits one block it is read once, normalised in
registers and written. Otherwise the first pass keeps a running max m and sum
l = sum(exp(x - m)), rescaling l by exp(m_old - m_new) whenever the max grows
(Milakov & Gimelshein, "Online normalizer calculation for softmax", 2018), and
the second pass writes exp(x - m) / l. Out-of-range rows and columns are
masked loads (-inf) and masked stores, so no shape needs padding.

Backward: dx = y * (dy - sum(y * dy)), from the saved output y, in the same
block structure. Arithmetic is float32 whatever the input dtype.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.core import compat, registry, tuning, validation
from kernels.core.hlo_rules import HloExpectation, HloRules
from kernels.ops.softmax import spec

plt = compat.pallas_triton()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftmaxConfig:
    """Block shape (powers of two, as Triton requires) and warps per program."""

    block_rows: int
    block_cols: int
    num_warps: int

    def __post_init__(self) -> None:
        validation.check_powers_of_two(self, ("block_rows", "block_cols", "num_warps"))


# Widest column block held in registers: 16 KiB of float32 per row keeps 8 warps
# at 16 values per thread, without spilling.
MAX_BLOCK_COLS = 4096
# Fewest elements a program should own; small rows are batched up to this.
MIN_BLOCK_ELEMENTS = 2048
IMPL = "pallas"

# The grid `python -m kernels tune softmax` times for float32 rows wider than MAX_BLOCK_COLS,
# on 4096x32768 forward and backward together (they share the config): "pallas:f32-wide" in
# tuned.json. The first is today's default there (one row of 4096-column blocks, 8 warps:
# 0.67x of the CUDA kernel forward on the H200, issue 51).
WIDE_TUNING_CASE = "f32-4096x32768"
WIDE_TUNING_CANDIDATES = tuple(
    SoftmaxConfig(block_rows=rows, block_cols=cols, num_warps=warps)
    for rows, cols, warps in [(1, 4096, 8), (1, 4096, 4), (1, 4096, 16), (1, 2048, 4),
                              (1, 2048, 8), (1, 8192, 8), (1, 8192, 16), (1, 16384, 16),
                              (1, 32768, 16), (2, 4096, 16)])


def default_config(rows: int, cols: int, dtype=None, *, on_gpu: bool = False) -> SoftmaxConfig:
    """Block shape and warps for (rows, cols): up to MAX_BLOCK_COLS columns a block, short rows
    batched to MIN_BLOCK_ELEMENTS; compiled for a GPU (`on_gpu`), float32 rows wider than a
    block take this model's tuned config where a tune recorded one ("pallas:f32-wide")."""
    if on_gpu and cols > MAX_BLOCK_COLS and dtype is not None and jnp.dtype(dtype) == jnp.float32:
        tuned = tuning.tuned_config(spec.NAME, IMPL, WIDE_TUNING_CANDIDATES[0],
                                    variant="f32-wide")
        if tuned is not None:
            return tuned
    block_cols = min(pl.next_power_of_2(cols), MAX_BLOCK_COLS)
    block_rows = min(pl.next_power_of_2(rows), max(1, MIN_BLOCK_ELEMENTS // block_cols))
    elements = block_rows * block_cols
    num_warps = 8 if elements >= 4096 else 4 if elements >= 1024 else 1
    return SoftmaxConfig(block_rows=block_rows, block_cols=block_cols, num_warps=num_warps)


def _block(ref, row_start, col_start, rows: int, cols: int, config: SoftmaxConfig):
    """Index and mask of one (block_rows, block_cols) tile, for masked load/store."""
    row_ids = row_start + jnp.arange(config.block_rows)
    col_ids = col_start + jnp.arange(config.block_cols)
    mask = (row_ids < rows)[:, None] & (col_ids < cols)[None, :]
    index = ref.at[pl.ds(row_start, config.block_rows), pl.ds(col_start, config.block_cols)]
    return index, mask


def _load_f32(ref, row_start, col_start, rows, cols, config, other):
    index, mask = _block(ref, row_start, col_start, rows, cols, config)
    return plt.load(index, mask=mask, other=other).astype(jnp.float32)


def _store(ref, value, row_start, col_start, rows, cols, config):
    index, mask = _block(ref, row_start, col_start, rows, cols, config)
    plt.store(index, value.astype(ref.dtype), mask=mask)


def _num_col_blocks(cols: int, config: SoftmaxConfig) -> int:
    return pl.cdiv(cols, config.block_cols)


def softmax_forward_kernel(
    # Inputs
    x_ref,
    # Outputs
    y_ref,
    *,
    config: SoftmaxConfig,
):
    rows, cols = x_ref.shape
    row_start = pl.program_id(0) * config.block_rows
    load = functools.partial(_load_f32, x_ref, row_start, rows=rows, cols=cols, config=config,
                             other=-jnp.inf)
    store = functools.partial(_store, y_ref, row_start=row_start, rows=rows, cols=cols,
                              config=config)
    num_blocks = _num_col_blocks(cols, config)

    if num_blocks == 1:
        x = load(0)
        numerator = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
        store(numerator / jnp.sum(numerator, axis=1, keepdims=True), col_start=0)
        return

    def accumulate(block, carry):
        m, row_sum = carry
        x = load(block * config.block_cols)
        m_new = jnp.maximum(m, jnp.max(x, axis=1))
        # A row whose entries so far are all -inf has m_new = -inf; shift by 0
        # instead so exp() gives 0, not NaN from (-inf) - (-inf).
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        row_sum = row_sum * jnp.exp(m - shift) + jnp.sum(jnp.exp(x - shift[:, None]), axis=1)
        return m_new, row_sum

    init = (jnp.full((config.block_rows,), -jnp.inf, jnp.float32),
            jnp.zeros((config.block_rows,), jnp.float32))
    m, row_sum = jax.lax.fori_loop(0, num_blocks, accumulate, init)

    def write(block, _):
        col_start = block * config.block_cols
        x = load(col_start)
        store(jnp.exp(x - m[:, None]) / row_sum[:, None], col_start=col_start)
        return _

    jax.lax.fori_loop(0, num_blocks, write, 0)


def softmax_backward_kernel(
    # Inputs
    y_ref,
    dy_ref,
    # Outputs
    dx_ref,
    *,
    config: SoftmaxConfig,
):
    rows, cols = y_ref.shape
    row_start = pl.program_id(0) * config.block_rows
    where = dict(rows=rows, cols=cols, config=config)
    num_blocks = _num_col_blocks(cols, config)

    def load_pair(col_start):
        return (_load_f32(y_ref, row_start, col_start, other=0.0, **where),
                _load_f32(dy_ref, row_start, col_start, other=0.0, **where))

    if num_blocks == 1:
        y, dy = load_pair(0)
        dot = jnp.sum(y * dy, axis=1, keepdims=True)
        _store(dx_ref, y * (dy - dot), row_start, 0, **where)
        return

    def accumulate(block, dot):
        y, dy = load_pair(block * config.block_cols)
        return dot + jnp.sum(y * dy, axis=1)

    dot = jax.lax.fori_loop(0, num_blocks, accumulate,
                            jnp.zeros((config.block_rows,), jnp.float32))

    def write(block, _):
        col_start = block * config.block_cols
        y, dy = load_pair(col_start)
        _store(dx_ref, y * (dy - dot[:, None]), row_start, col_start, **where)
        return _

    jax.lax.fori_loop(0, num_blocks, write, 0)


def _launch(kernel, inputs, config: SoftmaxConfig, interpret: bool, name: str):
    rows, _ = inputs[0].shape
    return pl.pallas_call(
        functools.partial(kernel, config=config),
        out_shape=jax.ShapeDtypeStruct(inputs[0].shape, inputs[0].dtype),
        grid=(pl.cdiv(rows, config.block_rows),),
        compiler_params=plt.CompilerParams(num_warps=config.num_warps, num_stages=1),
        interpret=interpret,
        name=name,
    )(*inputs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _softmax_2d(x: jax.Array, config: SoftmaxConfig, interpret: bool) -> jax.Array:
    return _launch(softmax_forward_kernel, (x,), config, interpret, "softmax_forward")


def _softmax_2d_fwd(x, config, interpret):
    y = _softmax_2d(x, config, interpret)
    return y, y


def _softmax_2d_bwd(config, interpret, y, dy):
    return (_launch(softmax_backward_kernel, (y, dy), config, interpret, "softmax_backward"),)


_softmax_2d.defvjp(_softmax_2d_fwd, _softmax_2d_bwd)


@functools.partial(jax.jit, static_argnames=("config", "interpret"))
def _softmax(x: jax.Array, config: SoftmaxConfig | None, interpret: bool) -> jax.Array:
    rows = x.size // x.shape[-1]
    x2 = x.reshape(rows, x.shape[-1])
    config = config or default_config(*x2.shape, x.dtype, on_gpu=not interpret)
    return _softmax_2d(x2, config, interpret).reshape(x.shape)


def softmax(x: jax.Array, *, config: SoftmaxConfig | None = None,
            interpret: bool | None = None) -> jax.Array:
    """Softmax of `x` over its last axis; differentiable.

    Args:
      x: float32, bfloat16 or float16 array of rank >= 1; leading axes are
        flattened into rows.
      config: block shape; `default_config(rows, cols)` when None.
      interpret: run the Pallas interpreter; by default wherever JAX has no GPU.
    Returns:
      An array of x's shape and dtype.
    """
    spec.validate(x)
    validation.check_config(config, SoftmaxConfig)
    validation.check_flag("interpret", interpret)
    validation.check_index_range("x", x)
    if x.size == 0:  # no rows: nothing to launch (the grid would divide by zero)
        return jnp.zeros_like(x)
    if interpret is None:
        interpret = compat.pallas_interpret()
    return _softmax(x, config, interpret)


tuning.register_tunable(spec.NAME, tuning.slot(IMPL, "f32-wide"), functools.partial(
    tuning.sweep, spec.NAME, IMPL, WIDE_TUNING_CANDIDATES, WIDE_TUNING_CASE,
    variant="f32-wide", directions=("fwd", "bwd")))

registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name=IMPL,
    fn=softmax,
    description="Pallas (Triton lowering), online softmax over column blocks; custom VJP",
    # On GPU the forward is exactly one Triton kernel and nothing around it; interpreted
    # on CPU, only that no array is copied or transposed and shapes stay static.
    hlo=HloExpectation(cpu=HloRules(custom_calls=()),
                       gpu=HloRules(fusions=0, custom_calls=("__gpu$xla.gpu.triton",))),
))
