"""Issue 38: which of XLA's windowed-einsum options give a wrong sharded product on this
machine's GPUs. Per mesh and option set, the relative error (Frobenius) of the partitioned
matmul against the same product on one device, f32 at full precision (64x48 @ 48x32) and
bf16 at the overlap script's size. From the repository root:
    python3 .ci/device/windowed_check.py
"""

import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

sys.path.insert(0, ".")
from kernels.ops.sharded_matmul import spec, xla  # noqa: E402
from kernels.sharding import meshes  # noqa: E402

OPTIONS = list(xla.WINDOWED_OPTIONS)
rng = np.random.default_rng(0)
print(f"{jax.device_count()} x {jax.devices()[0].device_kind}, jax {jax.__version__}")
print(f"{'mesh':>5} {'size':>22} {'options':<60} rel. error")
for mesh_shape in [m for m in ("1x2", "1x4", "2x2") if not meshes.unavailable_reason(m)]:
    mesh = meshes.make_mesh(mesh_shape)
    layouts = (NamedSharding(mesh, spec.A_SPEC), NamedSharding(mesh, spec.B_SPEC))
    for (m, n, k), dtype in (((64, 32, 48), np.float32), ((16384, 8192, 8192), jnp.bfloat16)):
        a = rng.standard_normal((m, k), dtype=np.float32).astype(dtype)
        b = rng.standard_normal((k, n), dtype=np.float32).astype(dtype)
        with jax.default_matmul_precision("highest"):
            ref = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(b)), np.float64)
            for count in range(len(OPTIONS) + 1):
                for chosen in itertools.combinations(OPTIONS, count):
                    if count and OPTIONS[0] not in chosen:
                        continue  # without the threshold there is no windowed einsum
                    fn = jax.jit(jnp.matmul, in_shardings=layouts,
                                 out_shardings=NamedSharding(mesh, spec.C_SPEC),
                                 compiler_options={o: xla.WINDOWED_OPTIONS[o] for o in chosen})
                    out = np.asarray(fn(jax.device_put(a, layouts[0]),
                                        jax.device_put(b, layouts[1])), np.float64)
                    error = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                    names = ",".join(o.replace("xla_gpu_", "") for o in chosen) or "(defaults)"
                    print(f"{mesh_shape:>5} {f'{m}x{n}x{k}':>22} {names:<60} {error:.2e}",
                          flush=True)
