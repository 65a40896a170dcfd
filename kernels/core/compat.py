"""Everything that differs between the JAX/Triton versions we support lives here.

Supported: jax 0.10.2 (CPU machines, Python 3.11) and jax 0.11.2 (the GPU
machine, Python 3.12). The Pallas Triton-lowering API we use
(`jax.experimental.pallas.triton`: load, store, CompilerParams(num_warps,
num_stages)) is the same in both; jax 0.11 adds a DeprecationWarning on its
use, filtered in pyproject.toml by its exact message. Mosaic GPU's `load` takes
a separate index in 0.10.2 and deprecates it in 0.11 (`mosaic_gpu_load`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import jax


@functools.cache
def on_gpu() -> bool:
    """Whether JAX's default backend is a GPU."""
    return jax.default_backend() == "gpu"


def started_gpu_device() -> jax.Device | None:
    """The first device of a JAX GPU backend this process has already started, else None.

    Starts nothing: it reads JAX's own table of started backends (private, `xla_bridge._backends`;
    keyed "cuda" in jax 0.10 and 0.11), so a check that uses it costs a CPU run nothing and
    never brings a GPU backend up just to look at it (kernels/testing/isolation.py)."""
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "_backends", None) or {}
    for platform in ("cuda", "rocm", "gpu"):
        backend = started.get(platform)
        if backend is not None:
            return backend.local_devices()[0]
    return None


def pallas_interpret() -> bool:
    """Pallas kernels run in interpret mode wherever JAX has no GPU."""
    return not on_gpu()


def pallas_triton():
    """The Pallas Triton-lowering module (`load`, `store`, `CompilerParams`)."""
    from jax.experimental.pallas import triton as pallas_triton_module

    return pallas_triton_module


class CuptiSession:
    """CUPTI kernel-activity recording around arbitrary JAX dispatches.

    The calls `jax.experimental.mosaic.gpu.profiler.measure` makes, without
    its wrapper (which jits the function, adds a warm-up call and requires
    every iteration to launch the same kernels): `start()`, dispatch anything,
    wait for it, `stop()` -> [(kernel name, milliseconds)] in launch order.
    """

    def __init__(self, extension):
        self._extension = extension

    def start(self) -> None:
        self._extension._cupti_init()

    def stop(self) -> list[tuple[str, float]]:
        # finalize=False: CUPTI stays attached between the many short sessions a measurement
        # opens (one per sample); detaching and re-attaching each time costs milliseconds.
        return list(self._extension._cupti_get_timings(False) or ())


def cupti_session() -> CuptiSession | None:
    """A CuptiSession over the Mosaic GPU extension, or None where it is not available."""
    try:
        from jax._src.lib import mosaic_gpu as mosaic_gpu_lib
    except ImportError:
        return None
    extension = getattr(mosaic_gpu_lib, "_mosaic_gpu_ext", None)
    if extension is None or not hasattr(extension, "_cupti_init"):
        return None
    return CuptiSession(extension)


class TraceSession:
    """An in-memory XProf session recording device activity only (host and Python tracers
    off): started on construction; `stop()` -> `jax.profiler.ProfileData` (planes > lines >
    events, the API trace files are read with), with no file written.

    `jaxlib._profiler.ProfilerSession` and its `stop_and_get_profile_data` are private, and
    the same in jax 0.10.2 and 0.11.2; `jax.profiler.start_trace` offers only files. On a GPU
    its device planes ('/device:GPU:i') hold one line per CUDA stream, with every kernel,
    NCCL kernel, memcpy and memset of every device on one timebase (CUPTI's timestamps
    normalised to the host clock).
    """

    def __init__(self, profiler_module):
        options = profiler_module.ProfileOptions()
        options.host_tracer_level = 0
        options.python_tracer_level = 0
        self._session = profiler_module.ProfilerSession(options)

    def stop(self):
        return self._session.stop_and_get_profile_data()


def trace_session_factory() -> Callable[[], TraceSession] | None:
    """A function that starts a TraceSession, or None where this jaxlib has none."""
    try:
        from jaxlib import _profiler
    except ImportError:
        return None
    session = getattr(_profiler, "ProfilerSession", None)
    if session is None or not hasattr(session, "stop_and_get_profile_data"):
        return None
    return functools.partial(TraceSession, _profiler)


def collective_matmul_mgpu():
    """JAX's Mosaic GPU all-gather matmul module (`all_gather_lhs_matmul`, `TuningConfig`,
    `MatmulDimension`), the same in jax 0.10.2 and 0.11.2; imported on use, since it
    imports the Mosaic GPU lowering."""
    from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as module

    return module


# XLA flags that make CPU compiles of small test programs cheaper without changing what they
# compute: the older elemental emitters instead of the MLIR fusion emitters, and one LLVM module
# per program instead of parallel codegen's split (threads a 2-core machine's other test
# processes already use). Together they cut XLA's compile time in the CPU kernel checks to
# 30% of -O0's alone (65 compiles of Pallas softmax and attention: 7.7 s -> 2.3 s, jaxlib
# 0.10.2, 2026-12-02). jaxlib 0.11.2 no longer knows the first (its CPU client refused it on
# the GPU machine, 2026-12-02), and XLA ends the process at an unknown flag, so each is asked
# for first (`accepted_xla_flags`).
CPU_FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false",
                          "--xla_cpu_parallel_codegen_split_count=1")


def xla_flags_accepted(flags: str, timeout: float = 120.0) -> bool:
    """Whether this jaxlib's CPU client starts with XLA_FLAGS=`flags` (a fresh Python process,
    as XLA aborts its process on a flag it does not know)."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env,
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def accepted_xla_flags(base: str, candidates: tuple[str, ...]) -> list[str]:
    """The `candidates` this jaxlib accepts beside the XLA_FLAGS `base`: all of them where one
    process starts with all (one probe where every one is known), else each asked alone."""
    if xla_flags_accepted(" ".join([base, *candidates])):
        return list(candidates)
    if len(candidates) == 1:
        return []
    return [flag for flag in candidates if xla_flags_accepted(f"{base} {flag}")]


def guard_compile_options() -> dict[str, object] | None:
    """Per-compile options for the HLO and memory guards: where XLA_FLAGS turned XLA:CPU's
    fusion emitters off (CPU_FAST_COMPILE_FLAGS, as the CPU test runs do), they are turned back
    on for the guard's compile, since the emitters decide which fusions XLA forms and the
    guards' expectations are declared for XLA's default pipeline (with them off, a planted
    row-by-row softmax compiled to as many fusions as the real one). None otherwise."""
    if CPU_FAST_COMPILE_FLAGS[0] in os.environ.get("XLA_FLAGS", "").split():
        return {"xla_cpu_use_fusion_emitters": True}
    return None


# JAX's monitoring events (jax._src.dispatch, compiler), the same names in 0.10.2 and 0.11.2:
# one backend compile per miss of the in-memory caches (persistent-cache hits included),
# one trace per jaxpr traced, and the persistent cache's requests and hits.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
CACHE_REQUEST_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def add_duration_listener(listener) -> Callable[[], None]:
    """Register `listener(event, seconds, **metadata)`; returns the function that removes it."""
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(listener)
    return functools.partial(monitoring.unregister_event_duration_listener, listener)


def add_event_listener(listener) -> Callable[[], None]:
    """Register `listener(event, **metadata)`; returns the function that removes it."""
    from jax import monitoring

    monitoring.register_event_listener(listener)
    return functools.partial(monitoring.unregister_event_listener, listener)


@contextlib.contextmanager
def explain_cache_misses() -> Iterator[None]:
    """While active, JAX logs (logger "jax", WARNING) why each tracing-cache miss happened."""
    before = jax.config.jax_explain_cache_misses
    jax.config.update("jax_explain_cache_misses", True)
    try:
        yield
    finally:
        jax.config.update("jax_explain_cache_misses", before)


def profile_data(xplane_path):
    """A trace's XSpace as `jax.profiler.ProfileData` (planes > lines > events, with stats);
    the same API in jax 0.10.2 and 0.11.2."""
    from jax.profiler import ProfileData

    return ProfileData.from_file(str(xplane_path))


def patch_triton_interpreter() -> None:
    """Let Triton's interpreter loop over runtime bounds with NumPy >= 2.4; idempotent.

    Triton 3.6's interpreter converts a scalar tensor (data of shape (1,)) to a
    Python int with `int(data)`, which NumPy 2.4 refuses ("only 0-dimensional
    arrays can be converted to Python scalars"): every `range(start, end)` over
    a runtime bound fails. Its per-launch patch of `tl.tensor` is wrapped so
    that `__index__` goes through `.item()`.

    Its `tl.dot` also multiplies bfloat16 operands as the raw uint16 bits it
    stores them in (garbage); they are widened to float32 first, which is
    exact, as the GPU's bf16 x bf16 -> f32 products are. Compiled kernels are
    unaffected by either.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "kernelperf_patched", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    def widen(handle):
        if handle.dtype != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    original_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    patch_lang_tensor.kernelperf_patched = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter.InterpreterBuilder.create_dot = create_dot


def make_mesh(shape, axis_names, devices=None):
    """`jax.make_mesh` with Auto axes (the compiler propagates shardings), on a device subset.

    Auto is spelled out because newer JAX releases change the default axis type.
    """
    from jax.sharding import AxisType

    return jax.make_mesh(tuple(shape), tuple(axis_names),
                         axis_types=(AxisType.Auto,) * len(axis_names), devices=devices)


def shard_map(f, *, mesh, in_specs, out_specs, check_vma: bool = True):
    """`jax.shard_map` (top-level since jax 0.7; both supported versions have it)."""
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=check_vma)


def pallas_mosaic_gpu():
    """The Pallas Mosaic GPU module (`kernel`, `emit_pipeline`, `wgmma`, `BlockSpec`, ...)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu


def mosaic_gpu_load(ref, *, layout):
    """`plgpu.load` of a whole (already indexed) ref: jax 0.10.2 requires the index argument,
    jax 0.11 deprecates passing it apart from the ref."""
    import inspect

    plgpu = pallas_mosaic_gpu()
    index = inspect.signature(plgpu.load).parameters["idx"]
    if index.default is inspect.Parameter.empty:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


MOSAIC_GPU_INTERPRET_MISSING = (
    "needs a Hopper GPU: this jax has no Mosaic GPU interpreter (InterpretGPUParams) to run "
    "Mosaic GPU kernels on CPU")


def _interpret_gpu_params_class():
    # Public as plgpu.InterpretGPUParams in jax 0.11; private module in 0.10.2.
    plgpu = pallas_mosaic_gpu()
    if hasattr(plgpu, "InterpretGPUParams"):
        return plgpu.InterpretGPUParams
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:
        return None
    return InterpretGPUParams


def mosaic_gpu_interpret_available() -> bool:
    # The interpreter's parameters module alone where it is (jax 0.10.2's private one): it
    # imports none of the Mosaic GPU lowering, which cost every process that asks (each
    # pytest worker and CLI command, through the registry's unavailability reasons) 0.2 s of
    # CPU on the 2-core machine. Else whatever `_interpret_gpu_params_class` finds.
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # noqa: F401
    except ImportError:
        return _interpret_gpu_params_class() is not None
    return True


def mosaic_gpu_interpret_params():
    """Parameters that make `plgpu.kernel` run in JAX's GPU interpreter (simulated TMA,
    barriers and wgmma on CPU)."""
    cls = _interpret_gpu_params_class()
    if cls is None:
        raise RuntimeError(MOSAIC_GPU_INTERPRET_MISSING)
    return cls()


@functools.cache
def multiprocessor_count() -> int:
    """Streaming multiprocessors of the default device (persistent grids); 1 without a GPU,
    (the Mosaic GPU interpreter simulates one block at a time)."""
    device = jax.devices()[0]
    return int(getattr(device, "core_count", 0) or 0) if on_gpu() else 1


@contextlib.contextmanager
def torch_matmul_precision(precision: str) -> Iterator[None]:
    """torch's float32 CUDA matmuls in `precision` ("tf32" or "ieee") inside the block, the
    previous setting restored after (it is process-wide, read by each cuBLAS call).

    torch 2.9+ sets it through torch.backends.cuda.matmul.fp32_precision and then refuses to
    read the legacy allow_tf32 ("mix of the legacy and new APIs", seen with torch 2.13), so the
    new attribute is used wherever it exists; older torch has allow_tf32 alone."""
    if precision not in ("tf32", "ieee"):
        raise ValueError(f"precision: expected 'tf32' or 'ieee', got {precision!r}")
    import torch

    matmul = torch.backends.cuda.matmul
    if hasattr(torch._C, "_get_fp32_precision_getter"):  # torch 2.9+
        before = matmul.fp32_precision
        matmul.fp32_precision = precision
        try:
            yield
        finally:
            matmul.fp32_precision = before
        return
    before = matmul.allow_tf32
    matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        matmul.allow_tf32 = before


def benchmark_off_for_xdist_only(session, config) -> bool:
    """Whether pytest-benchmark's `session` turned itself off only because xdist is active (not
    for the user's --benchmark-disable or --benchmark-skip). pytest-benchmark 5.3 says so in
    `xdist_warning`; 5.2 (the GPU machine's) only sets `disabled`, so there it is read from the
    options that would have set it otherwise."""
    if hasattr(session, "xdist_warning"):
        return bool(session.xdist_warning)
    asked_off = (config.getoption("benchmark_disable", False)
                 and not config.getoption("benchmark_enable", False))
    return bool(session.disabled and not session.skip and not asked_off)
