"""Matmul in Pallas Mosaic GPU (Hopper): TMA pipeline, warp-specialised wgmma, persistent grid.

One CTA per SM loops over output tiles (`plgpu.nd_loop`), visiting them in a
planar snake (`plgpu.planar_snake`, bands of `grid_tile_width` tiles) so that
CTAs running at once share A and B panels in L2. Inside a CTA, a producer
warpgroup streams (tile_m, tile_k) slices of A and (tile_k, n) slices of B
into a `max_concurrent_steps`-deep ring of swizzled shared-memory buffers by
TMA, and two consumer warpgroups each issue wgmma into their own float32
accumulator in registers (the CTA tile is two warpgroup tiles side by side
along `wg_dimension`). The epilogue stages each accumulator through shared
memory in (epi_tile_m, epi_tile_n) pieces and writes them by TMA.

Shapes that are not multiples of the CTA tile (or K of tile_k) are zero-padded
before the call and the result sliced: zeros add nothing to the products. The
copy costs one pass over the operands, and only for such shapes.

bf16 and f16 only: wgmma has no float32 operands (it reads them as TF32, and
only K-major, which B here is not).

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

IMPL = "pallas_mosaic"
SUPPORTED_DTYPES = ("bf16", "f16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MosaicMatmulConfig:
    """Per-warpgroup tile, TMA pipeline depth, epilogue piece and tile order.

    The CTA tile is (2 tile_m, tile_n) when wg_dimension is "m", else
    (tile_m, 2 tile_n). grid_tile_width: width of the planar-snake bands.
    """

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    max_concurrent_steps: int = 4
    epi_tile_m: int = 64
    epi_tile_n: int = 64
    grid_tile_width: int = 8
    wg_dimension: str = "n"

    def __post_init__(self) -> None:
        if self.tile_m != 64 and self.tile_m % 64:
            raise ValueError(f"tile_m: expected a multiple of 64 (one wgmma), got {self.tile_m}")
        for name in ("tile_n", "tile_k", "epi_tile_m", "epi_tile_n"):
            value = getattr(self, name)
            if value < 8 or value % 8:
                raise ValueError(f"{name}: expected a positive multiple of 8, got {value}")
        if self.tile_m % self.epi_tile_m or self.tile_n % self.epi_tile_n:
            raise ValueError(f"epilogue tile ({self.epi_tile_m}, {self.epi_tile_n}) must divide "
                             f"the warpgroup tile ({self.tile_m}, {self.tile_n})")
        if self.max_concurrent_steps < 2:
            raise ValueError(f"max_concurrent_steps: expected >= 2, got "
                             f"{self.max_concurrent_steps}")
        if self.wg_dimension not in ("m", "n"):
            raise ValueError(f"wg_dimension: expected 'm' or 'n', got {self.wg_dimension!r}")

    @property
    def cta_tile(self) -> tuple[int, int]:
        if self.wg_dimension == "m":
            return 2 * self.tile_m, self.tile_n
        return self.tile_m, 2 * self.tile_n


# 128x256 CTA tiles, 64-wide K slices, 4 stages: 4 * (16 + 32) KiB of operands
# plus 32 KiB of epilogue buffers fits Hopper's 227 KiB of shared memory.
GPU_DEFAULT = MosaicMatmulConfig()
# The interpreter simulates every thread; the smallest legal tiles keep it quick.
INTERPRET_DEFAULT = MosaicMatmulConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                                       epi_tile_m=64, epi_tile_n=64, grid_tile_width=2)


def default_config(interpret: bool) -> MosaicMatmulConfig:
    if interpret:
        return INTERPRET_DEFAULT
    return tuning.tuned_config(spec.NAME, IMPL, GPU_DEFAULT) or GPU_DEFAULT


def _swizzled(block_minor: int, dtype) -> tuple:
    """TMA/wgmma layout of a shared-memory tile whose minor dimension is `block_minor` wide."""
    plgpu = compat.pallas_mosaic_gpu()
    swizzle = plgpu.find_swizzle(block_minor * jnp.dtype(dtype).itemsize * 8)
    elems = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle)


def _kernel(a_gmem, b_gmem, out_gmem, *, config: MosaicMatmulConfig):
    plgpu = compat.pallas_mosaic_gpu()
    dtype = a_gmem.dtype
    m, k = a_gmem.shape
    _, n = b_gmem.shape
    cta_m, cta_n = config.cta_tile
    m_iters, n_iters, k_iters = m // cta_m, n // cta_n, k // config.tile_k
    transforms = _swizzled(config.tile_k, dtype)
    out_transforms = _swizzled(config.epi_tile_n, dtype)
    epi_pieces_n = config.tile_n // config.epi_tile_n
    # Two epilogue slots per warpgroup: one is written while the other drains by TMA.
    slots = min(2, (config.tile_m // config.epi_tile_m) * epi_pieces_n)

    def pipeline(body, compute_context):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k_iters,),
            memory_registers=40,  # the producer needs few; setmaxnreg gives the rest away
            in_specs=[
                plgpu.BlockSpec((cta_m, config.tile_k), lambda kk: (0, kk),
                                transforms=transforms, memory_space=plgpu.SMEM),
                plgpu.BlockSpec((config.tile_k, cta_n), lambda kk: (kk, 0),
                                transforms=transforms, memory_space=plgpu.SMEM),
            ],
            wg_axis="wg",
            num_compute_wgs=2,
            max_concurrent_steps=config.max_concurrent_steps,
            compute_context=compute_context,
        )

    ignore = lambda *_, **__: None  # noqa: E731  (bodies do not affect allocations)

    @functools.partial(
        pl.run_scoped,
        allocations=pipeline(ignore, ignore).get_allocations(a_gmem, b_gmem),
        out_smem=plgpu.SMEM((2, slots, config.epi_tile_m, config.epi_tile_n), dtype,
                            transforms=out_transforms),
        collective_axes="wg",
    )
    def _scope(allocations, out_smem):
        wg = jax.lax.axis_index("wg")

        @plgpu.nd_loop((m_iters * n_iters,), collective_axes="sm")
        def _tile_loop(loop_info):
            (linear,) = loop_info.index
            m_idx, n_idx = plgpu.planar_snake(linear, (m_iters, n_iters), 1,
                                              config.grid_tile_width)
            cta_rows = pl.ds(m_idx * cta_m, cta_m)
            cta_cols = pl.ds(n_idx * cta_n, cta_n)
            if config.wg_dimension == "m":
                wg_rows, wg_cols = pl.ds(wg * config.tile_m, config.tile_m), slice(None)
            else:
                wg_rows, wg_cols = slice(None), pl.ds(wg * config.tile_n, config.tile_n)

            def compute_context(run_pipeline):
                @functools.partial(pl.run_scoped,
                                   acc_ref=plgpu.ACC((config.tile_m, config.tile_n), jnp.float32))
                def _acc_scope(acc_ref):
                    run_pipeline(acc_ref)
                    acc = acc_ref[...].astype(dtype)
                    # The previous tile's stores must have left the slots we reuse.
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    for i in range(config.tile_m // config.epi_tile_m):
                        for j in range(epi_pieces_n):
                            rows = slice(i * config.epi_tile_m, (i + 1) * config.epi_tile_m)
                            cols = slice(j * config.epi_tile_n, (j + 1) * config.epi_tile_n)
                            slot = (i * epi_pieces_n + j) % slots
                            plgpu.wait_smem_to_gmem(slots - 1, wait_read_only=True)
                            out_smem[wg, slot] = acc[rows, cols]
                            plgpu.commit_smem()
                            plgpu.copy_smem_to_gmem(
                                out_smem.at[wg, slot],
                                out_gmem.at[cta_rows, cta_cols].at[wg_rows, wg_cols]
                                .at[rows, cols])

            def mma(_, a_smem, b_smem, acc_ref):
                plgpu.wgmma(acc_ref, a_smem.at[wg_rows], b_smem.at[:, wg_cols])
                plgpu.wgmma_wait(0)
                return acc_ref

            pipeline(mma, compute_context)(
                a_gmem.at[cta_rows, :], b_gmem.at[:, cta_cols], allocations=allocations)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _pad_to(x: jax.Array, rows: int, cols: int) -> jax.Array:
    pad_rows, pad_cols = -x.shape[0] % rows, -x.shape[1] % cols
    if pad_rows or pad_cols:
        x = jnp.pad(x, ((0, pad_rows), (0, pad_cols)))
    return x


def _launch(a: jax.Array, b: jax.Array, config: MosaicMatmulConfig | None,
            interpret: bool) -> jax.Array:
    plgpu = compat.pallas_mosaic_gpu()
    config = config or default_config(interpret)
    m, _ = a.shape
    _, n = b.shape
    cta_m, cta_n = config.cta_tile
    a_p = _pad_to(a, cta_m, config.tile_k)
    b_p = _pad_to(b, config.tile_k, cta_n)
    tiles = (a_p.shape[0] // cta_m) * (b_p.shape[1] // cta_n)
    out = plgpu.kernel(
        functools.partial(_kernel, config=config),
        out_type=jax.ShapeDtypeStruct((a_p.shape[0], b_p.shape[1]), a.dtype),
        grid=(min(tiles, compat.multiprocessor_count()),),
        grid_names=("sm",),
        num_threads=3,  # two consumer warpgroups and the TMA producer
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=compat.mosaic_gpu_interpret_params() if interpret else False,
    )(a_p, b_p)
    return out[:m, :n] if out.shape != (m, n) else out


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(a, b, config, interpret):
    return _launch(a, b, config, interpret)


def _matmul_fwd(a, b, config, interpret):
    return _launch(a, b, config, interpret), (a, b)


def _matmul_bwd(config, interpret, residuals, dc):
    a, b = residuals
    return _launch(dc, b.T, config, interpret), _launch(a.T, dc, config, interpret)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)
_matmul_jit = jax.jit(_matmul, static_argnums=(2, 3))


# JAX's Mosaic GPU interpreter simulates every thread, TMA and barrier: about a minute per
# case with gradients on a CPU core even for tiny shapes. CPU runs interpret one awkward case
# (which also exercises the zero padding), with normal inputs, in
# correctness_tests/test_pallas_matmul.py; the GPU runs them all.
INTERPRETED_CASE = "bf16-33x17x65"


def supports(case: registry.Case) -> str | None:
    if case.dtype not in SUPPORTED_DTYPES:
        return (f"Mosaic GPU wgmma takes bf16/f16 operands here, not {case.dtype} (f32 would be "
                f"TF32 and needs both operands K-major); pallas_triton covers f32")
    if not compat.on_gpu():
        if not compat.mosaic_gpu_interpret_available():
            return compat.MOSAIC_GPU_INTERPRET_MISSING
        return (f"needs a Hopper GPU to run {case.id}: without one, the Mosaic GPU "
                f"interpreter (~1 min per case) runs only {INTERPRETED_CASE} (normal inputs, "
                f"test_pallas_matmul.py::test_mosaic_interpreted)")
    return None


def matmul(a: jax.Array, b: jax.Array, *, config: MosaicMatmulConfig | None = None,
           interpret: bool | None = None) -> jax.Array:
    """a @ b for bf16/f16 (m, k) and (k, n) arrays on Hopper; differentiable.

    Args:
      config: tiles and pipeline depth; tuned per GPU model where recorded.
      interpret: run JAX's Mosaic GPU interpreter; by default wherever JAX has no GPU.
    Returns:
      (m, n) array in the inputs' dtype, accumulated in float32.
    """
    spec.validate(a, b)
    if str(a.dtype) not in ("bfloat16", "float16"):
        raise TypeError(f"a: expected dtype bfloat16 or float16 (wgmma operands), got {a.dtype}")
    validation.check_config(config, MosaicMatmulConfig)
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
    MosaicMatmulConfig(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=s,
                       grid_tile_width=w, wg_dimension=d)
    for tm, tn, s, w, d in [
        (128, 128, 4, 8, "n"), (128, 128, 4, 16, "n"), (128, 128, 4, 8, "m"),
        (128, 128, 3, 8, "n"), (64, 256, 4, 8, "m"), (128, 128, 4, 4, "n"),
    ])
tuning.register_tunable(spec.NAME, IMPL, functools.partial(
    tuning.sweep, spec.NAME, IMPL, TUNING_CANDIDATES, "bf16-8192x8192x8192"))

registry.register_implementation(registry.Implementation(
    op=spec.NAME,
    name=IMPL,
    fn=matmul,
    precision=precisions.NO_FLOAT32,  # wgmma on bf16/f16 (supports)
    requires=registry.Requirements(min_compute_capability=(9, 0)),
    supports=supports,
    description="Pallas Mosaic GPU: TMA pipeline, 2 wgmma consumer warpgroups, persistent "
                "planar-snake grid; zero-padded edges; custom VJP",
))
