"""Mosaic GPU collective matmul: A's row blocks travel between GPUs from the GEMM's own
shared-memory tiles while the products run (JAX's `all_gather_lhs_matmul`), over a 1xN mesh.

The kernel is `jax.experimental.pallas.ops.gpu.collective_matmul_mgpu.all_gather_lhs_matmul`
(jax 0.10.2 and 0.11.2): Hopper's warp-specialised TMA + wgmma matmul
(`hopper_matmul_mgpu.kernel`) with a pipeline callback that, on each A tile's first column
pass, copies the tile from shared memory into the next device's scratch buffer
(`plgpu.remote_ref`, a peer pointer over NVLink) and signals a semaphore there; device step s
multiplies the block that arrived in step s - 1. No NCCL kernel, no copies into collective
memory, no zeros + update-slice assembly: the ring's overheads (NCCL's SMs and HBM traffic
beside the GEMM, ~96 us of 1700 on an H100 pair; 80 us of zeros; 93 us of copies) are gone.
Peer pointers only: no multicast, nothing NVLS (never use `plgpu.multicast_ref`).

What it needs (the kernel, and jaxlib/mosaic/gpu/custom_call.cc):
- bf16 or f16 (wgmma with TMA);
- a collective axis over every device of the program (`axis_size == jax.device_count()`:
  the custom call takes its peers from a clique of all devices), so a 1xN mesh over all N
  GPUs: 1x2 on two, 1x4 on four, never 2x2; one process for all GPUs or one per GPU;
- a 1-D mesh: `pl.semaphore_signal` takes one device id per mesh axis ("got 1 ids for a 2D
  mesh"), so the kernel runs on a 1-D `model` mesh over the 1xN mesh's devices, in the same
  order (the same layout: nothing moves);
- m / N rows divisible by tile_m (twice that with wg_dimension M), n / N columns by tile_n
  (twice that with wg_dimension N), k by tile_k.

Measured on 2x H100 (this session's probes, perf_tests/RESULTS.md): 1587 us for bf16 16384 x
8192 x 8192 against 1342 us for the products alone, 0.883 of the communication hidden, where
the XLA ring reached 0.811 (both by the device clock), output identical to cuBLAS's.

Backward: a custom_vjp in plain XLA collectives (the kernel has no transpose): dA is the
reduce-scatter over `model` of dC_local @ B_local^T, dB_local is all-gather(A)^T @ dC_local.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kernels.core import compat, precisions, registry
from kernels.ops.sharded_matmul import spec
from kernels.sharding import meshes

DTYPES = ("bf16", "f16")
DIMENSIONS = ("M", "N")
# Per device on the 1-D mesh: A's rows, B's and C's columns over `model`.
A_LINE, B_LINE, C_LINE = P(meshes.MODEL, None), P(None, meshes.MODEL), P(None, meshes.MODEL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """The kernel's TuningConfig, as in hopper_matmul_mgpu: CTA tile (tile_m x tile_n, two
    warpgroups side by side along wg_dimension), K step tile_k, pipeline depth
    max_concurrent_steps, epilogue tile, and the tile order: grid_minor_dim varies fastest in
    bands of grid_tile_width tiles (planar snake)."""

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    max_concurrent_steps: int = 4
    epi_tile_m: int = 64
    epi_tile_n: int = 64
    grid_minor_dim: str = "N"
    grid_tile_width: int = 8
    wg_dimension: str = "N"

    def __post_init__(self) -> None:
        for name in ("tile_m", "tile_n", "tile_k", "epi_tile_m", "epi_tile_n",
                     "grid_tile_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if self.max_concurrent_steps < 2:  # the sends hold each A tile one step longer
            raise ValueError(f"max_concurrent_steps: expected >= 2, got "
                             f"{self.max_concurrent_steps}")
        if self.tile_m % self.epi_tile_m or self.tile_n % self.epi_tile_n:
            raise ValueError(f"epi_tile_m, epi_tile_n: expected divisors of tile_m={self.tile_m}"
                             f", tile_n={self.tile_n}, got {self.epi_tile_m}, {self.epi_tile_n}")
        for name in ("grid_minor_dim", "wg_dimension"):
            if getattr(self, name) not in DIMENSIONS:
                raise ValueError(f"{name}: expected one of {DIMENSIONS}, got "
                                 f"{getattr(self, name)!r}")

    @property
    def block_rows(self) -> int:
        """Rows of A per CTA: m / N must be a multiple."""
        return self.tile_m * (2 if self.wg_dimension == "M" else 1)

    @property
    def block_columns(self) -> int:
        """Columns of B per CTA: n / N must be a multiple."""
        return self.tile_n * (2 if self.wg_dimension == "N" else 1)

    def tuning_config(self):
        module = compat.collective_matmul_mgpu()
        dims = module.MatmulDimension
        return module.TuningConfig(
            tile_m=self.tile_m, tile_n=self.tile_n, tile_k=self.tile_k,
            max_concurrent_steps=self.max_concurrent_steps, epi_tile_m=self.epi_tile_m,
            epi_tile_n=self.epi_tile_n, grid_minor_dim=getattr(dims, self.grid_minor_dim),
            grid_tile_width=self.grid_tile_width, wg_dimension=getattr(dims, self.wg_dimension))


def default_config(case: registry.Case | None = None) -> Config:
    """The best of the probes on 2x H100 (128x128x64 tiles, 4 stages, N-minor bands of 8,
    warpgroups side by side along N: 0.883 hidden; bands of 16: 0.811; M: 0.782; 128x64:
    0.655; 128x256 and 256x128 need 360 and 295 KB of shared memory, over the 232 KB)."""
    return Config()


def unsupported_reason(m: int, n: int, k: int, dtype: str, mesh: str,
                       config: Config) -> str | None:
    """None if the kernel can run this product on this mesh here, else why not."""
    if dtype not in DTYPES:
        return f"needs bf16 or f16 (Mosaic GPU wgmma through TMA), got {dtype}"
    data, model = meshes.parse_mesh_shape(mesh)
    if data != 1 or model < 2:
        return (f"needs a 1xN mesh with N >= 2 (the kernel gathers A over one axis that spans "
                f"every device), got mesh {mesh}")
    if model != jax.device_count():
        return (f"needs the mesh to span all {jax.device_count()} devices of the program "
                f"(the Mosaic GPU collective takes its peers from a clique of every device), "
                f"got mesh {mesh}")
    if jax.process_count() > 1 and jax.local_device_count() != 1:
        return (f"needs one process for all GPUs or one per GPU, got {jax.process_count()} "
                f"processes with {jax.local_device_count()} devices each")
    for name, size, multiple in (("m / N", m // model, config.block_rows),
                                 ("n / N", n // model, config.block_columns),
                                 ("k", k, config.tile_k)):
        if size % multiple:
            return f"needs {name} divisible by {multiple} (the config's tiles), got {size}"
    return None


def supports(case: registry.Case) -> str | None:
    return unsupported_reason(case["m"], case["n"], case["k"], case.dtype, case.kwargs["mesh"],
                              default_config(case))


@functools.cache
def line_mesh(mesh_shape: str) -> jax.sharding.Mesh:
    """A 1-D `model` mesh over the devices of a 1xN mesh, in its order."""
    devices = list(meshes.make_mesh(mesh_shape).devices.flat)
    return compat.make_mesh((len(devices),), (meshes.MODEL,), devices=devices)


def kernel_body(config: Config, dtype) -> Callable[..., jax.Array]:
    """Per device: (m/N, k) block of A, (k, n/N) block of B -> (m, n/N), by the Mosaic kernel."""
    module = compat.collective_matmul_mgpu()
    return functools.partial(module.all_gather_lhs_matmul, axis_name=meshes.MODEL,
                             config=config.tuning_config(), dtype=dtype)


def _backward_body(a_block: jax.Array, b_block: jax.Array, dc_block: jax.Array):
    da = jax.lax.psum_scatter(dc_block @ b_block.T, meshes.MODEL, scatter_dimension=0,
                              tiled=True)
    db = jax.lax.all_gather(a_block, meshes.MODEL, tiled=True).T @ dc_block
    return da, db


@functools.cache
def build(mesh_shape: str, config: Config, dtype_name: str,
          body: Callable[[Config, object], Callable[..., jax.Array]] = kernel_body):
    """The jitted, differentiable product on the 1-D mesh; `body(config, dtype)` gives the
    per-device forward (tests on CPU pass a plain gather-then-multiply in its place)."""
    line = line_mesh(mesh_shape)
    forward = compat.shard_map(body(config, jax.numpy.dtype(dtype_name)), mesh=line,
                               in_specs=(A_LINE, B_LINE), out_specs=C_LINE, check_vma=False)
    backward = compat.shard_map(_backward_body, mesh=line, in_specs=(A_LINE, B_LINE, C_LINE),
                                out_specs=(A_LINE, B_LINE))

    @jax.custom_vjp
    def product(a, b):
        return forward(a, b)

    def product_fwd(a, b):
        return forward(a, b), (a, b)

    def product_bwd(residuals, dc):
        return backward(*residuals, dc)

    product.defvjp(product_fwd, product_bwd)
    return jax.jit(product)


def place_on_line(mesh_shape: str, a, b) -> tuple[jax.Array, jax.Array]:
    """A and B laid out on the 1-D mesh over a 1xN mesh's devices (the 1xN layout)."""
    line = line_mesh(mesh_shape)
    return (jax.device_put(a, NamedSharding(line, A_LINE)),
            jax.device_put(b, NamedSharding(line, B_LINE)))


def place(case: registry.Case, a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The case's inputs on the 1-D mesh (outside the timed region)."""
    return place_on_line(case.kwargs["mesh"], a, b)


def matmul(a: jax.Array, b: jax.Array, mesh: str, config: Config | None = None) -> jax.Array:
    """C = A @ B by the Mosaic GPU collective matmul over a 1xN `mesh` spanning every GPU."""
    spec.validate(a, b, mesh)
    config = config or default_config()
    from kernels.core import dtypes

    dtype = dtypes.short_name(a.dtype)
    reason = unsupported_reason(a.shape[0], b.shape[1], a.shape[1], dtype, mesh, config)
    if reason:
        raise ValueError(f"mesh, a, b: the Mosaic collective matmul {reason}")
    return build(mesh, config, jax.numpy.dtype(a.dtype).name)(a, b)


registry.register_implementation(registry.Implementation(
    op=spec.NAME, name="mosaic", fn=matmul, prepare=place, supports=supports,
    precision=precisions.NO_FLOAT32,  # wgmma on bf16/f16 (supports)
    requires=registry.Requirements(gpu=True, min_compute_capability=(9, 0), devices=2),
    description="Mosaic GPU all_gather_lhs_matmul: TMA sends of A's tiles to the peer inside "
                "the GEMM (1xN mesh over every GPU)",
))
