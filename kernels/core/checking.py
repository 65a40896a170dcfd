"""Correctness harness: one comparison for every framework, hard to fool.

`check(impl, case, seed, distribution)` makes fresh inputs, runs the
implementation with NaN-poisoned output buffers, compares the output and the
gradients (vector-Jacobian product with a random cotangent) against the
operation's jnp reference computed in float32, and checks that the inputs were
not modified. The tolerance is the operation's at the precision the implementation
declares for this platform (`tolerance_for`: FP32, TF32, ...; docs/precision.md).
`compare` is the single comparison: relative error in norm and in max-abs, plus
guards against outputs that are NaN, all zeros or constant where the reference is
not (kernels returning zeros have passed absolute tolerances in public harnesses).

Inputs, reference output, reference gradients and their term magnitudes depend
only on (operation, case, seed, distribution), not on the implementation: a
`ReferenceCache` keeps them, bounded in bytes, so the implementations of one
case share one computation (the test suite runs them back to back). The
reference is one jitted program (forward, VJP, magnitudes). On a GPU it stays
on the device, and comparisons of large arrays run there as one fused
reduction that sends a few scalars back; on CPU everything is NumPy as before.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels.core import compat, dtypes, environment, frameworks, phases, registry

# Arrays smaller than this are compared on the host: copying them is cheaper than compiling
# a device reduction for their shape.
DEVICE_COMPARE_MIN_SIZE = 1 << 16
# A result spread over several devices is gathered onto one of them for its comparison up to
# this size: the comparison's program is then one per shape and dtype for every mesh. Laid out
# as the result, it compiled once per layout: on 8 host devices 24 comparisons of one shape in
# 24 layouts took 110 s laid out, 16 s gathered; on 2 H100s the comparisons of `pytest -m
# multi_gpu` took 24.2 s, against 26.6 s in a run of that morning before the change.
GATHER_MAX_BYTES = 1 << 30
# Seed offset of the cotangent's generator, so it never repeats an input's stream.
COTANGENT_SEED_OFFSET = 1_000_003
CACHE_VARIABLE = "KERNELPERF_REFERENCE_CACHE_MB"
# Enough for every reference of one real-size case and distribution (softmax f32
# 32768 x 4096: output, gradient and magnitude, 512 MiB each, plus the pristine input).
DEFAULT_CACHE_MB = {"gpu": 4096, "cpu": 512}


def platform() -> str:
    """Where this process's implementations run, as precisions are declared per platform:
    "gpu" where JAX's default backend is a GPU, else "cpu"."""
    return "gpu" if compat.on_gpu() else "cpu"


def tolerance_for(impl: registry.Implementation, case: registry.Case,
                  on: str | None = None) -> float:
    """The forward tolerance `impl` is held to on `case`: its operation's, at the precision it
    declares for `on` ("gpu" or "cpu"; this process's platform by default). An implementation
    declared FP32 is held to float32's tolerance, so one that secretly multiplies in TF32
    fails."""
    op = registry.operation(impl.op)
    return op.tolerance_at(case, impl.precision_on(case, on or platform()))


def relative_tolerance(dtype: str, reduction_length: int, accumulator: str = "f32") -> float:
    """Relative error allowed for a result in `dtype` reduced over `reduction_length` terms.

    One rounding of the output (eps of its dtype) plus accumulation error that
    grows like sqrt(length) in the accumulator's precision (random-walk rounding).
    """
    return dtypes.eps(dtype) + 2.0 * dtypes.eps(accumulator) * math.sqrt(reduction_length)


class CheckFailure(AssertionError):
    """A result that does not match its reference; the message says how."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    name: str
    relative_error: float  # ||out - ref|| / ||ref|| over the finite reference entries
    max_error: float  # max |out - ref| / max |ref|
    tolerance: float

    def __str__(self) -> str:
        return (f"{self.name}: rel {self.relative_error:.2e}, max {self.max_error:.2e} "
                f"(tol {self.tolerance:.1e})")


@dataclasses.dataclass(frozen=True)
class _Stats:
    """Everything `compare` judges, reduced from the two arrays (flat indices into them)."""

    finite_count: int  # reference entries that are finite
    bad_count: int  # of those, entries where the result is NaN/inf
    first_bad: int
    mismatch: bool  # a non-finite reference entry the result does not reproduce
    first_mismatch: int
    first_finite: int
    peak: float  # max over finite entries of max(|ref|, |magnitude|)
    expected_absmax: float
    actual_any: bool  # any non-zero result where the reference is finite
    expected_ptp: float
    actual_ptp: float
    norm_expected: float
    norm_size: float
    norm_diff: float
    worst: int
    worst_diff: float


def _stats(xp, actual, expected, magnitude, norm: Callable) -> dict[str, Any]:
    """The reductions behind `compare`, written once for NumPy and for jnp under jit: masks
    instead of boolean indexing, so the non-finite reference entries drop out of every sum."""
    a, e = actual.reshape(-1), expected.reshape(-1)
    finite = xp.isfinite(e)
    bad = finite & ~xp.isfinite(a)
    mismatched = ~finite & ~((a == e) | (xp.isnan(a) & xp.isnan(e)))
    zero = xp.zeros((), e.dtype)
    e0, a0 = xp.where(finite, e, zero), xp.where(finite, a, zero)
    size = xp.abs(e0)
    if magnitude is not None:
        size = xp.maximum(size, xp.where(finite, xp.abs(magnitude.reshape(-1)), zero))
    peak = xp.max(size)
    inf = xp.asarray(np.inf, e.dtype)

    def ptp(x):
        return xp.max(xp.where(finite, x, -inf)) - xp.min(xp.where(finite, x, inf))

    diff = xp.abs(a0 - e0)
    worst = xp.argmax(diff)
    return dict(
        finite_count=xp.sum(finite), bad_count=xp.sum(bad), first_bad=xp.argmax(bad),
        mismatch=xp.any(mismatched), first_mismatch=xp.argmax(mismatched),
        first_finite=xp.argmax(finite), peak=peak, expected_absmax=xp.max(xp.abs(e0)),
        actual_any=xp.any(a0 != 0), expected_ptp=ptp(e), actual_ptp=ptp(a),
        norm_expected=norm(e0, peak), norm_size=norm(size, peak), norm_diff=norm(diff, peak),
        worst=worst, worst_diff=diff[worst])


def _host_norm(x: np.ndarray, peak) -> float:
    """Euclidean norm, squared and accumulated in float64 (a chunk at a time, so the float64
    copy stays small): 10^8 float32 squares lose nothing, and none underflows or overflows
    (float32 squares of values under 1e-19 are 0, so a result 20% off at 1e-25 passed)."""
    del peak
    flat = x.reshape(-1)
    chunks = (c.astype(np.float64) for c in np.array_split(flat, max(1, flat.size // 2**20)))
    return float(np.sqrt(sum(np.dot(c, c) for c in chunks)))


def _device_norm(x, peak):
    """Euclidean norm in float32, scaled by the peak first so the squares cannot overflow."""
    import jax.numpy as jnp

    scale = jnp.where(peak > 0, peak, 1.0)
    return scale * jnp.sqrt(jnp.sum(jnp.square(x / scale)))


def _jit_unautotuned(fn):
    """jax.jit without XLA's GPU autotuning: how fast the harness's own programs (the
    reference, the comparisons) run does not matter, and on an H100 trying GEMM algorithms
    for the reference's float32 dots took most of its compile (up to a minute per
    attention case, cold cache). The dots keep their declared precision either way."""
    import jax

    options = {"xla_gpu_autotune_level": 0} if _device_platform() == "gpu" else None
    return jax.jit(fn, compiler_options=options)


@functools.cache
def _device_stats_program(with_magnitude: bool):
    import jax.numpy as jnp

    def program(actual, expected, *magnitude):
        upcast = [x.astype(jnp.float32) for x in (actual, expected, *magnitude)]
        return _stats(jnp, upcast[0], upcast[1], upcast[2] if with_magnitude else None,
                      _device_norm)

    return _jit_unautotuned(program)


def _to_stats(raw: dict[str, Any]) -> _Stats:
    values = {}
    for field in dataclasses.fields(_Stats):
        value = np.asarray(raw[field.name])
        values[field.name] = (bool(value) if field.type == "bool" else
                              int(value) if field.type == "int" else float(value))
    return _Stats(**values)


def _device_platform() -> str | None:
    """Where references stay and large comparisons run: "gpu" on a GPU machine; None (the
    host, NumPy) elsewhere. Tests point it at "cpu" to run the device path without a GPU."""
    return "gpu" if compat.on_gpu() else None


def _sharded_like(arrays: list[Any], platform: str) -> list[Any] | None:
    """Where one of `arrays` is a JAX array spread over several devices of `platform` (a
    sharded operation's result): all of them on one device, the reference's, if the result
    is at most GATHER_MAX_BYTES, else laid out as it is; either way copied device to device,
    not through the host. None when there is no such array or the shapes differ."""
    import jax

    sharded = next((a for a in arrays if isinstance(a, jax.Array) and len(a.devices()) > 1
                    and all(d.platform == platform for d in a.devices())), None)
    if sharded is None or any(getattr(a, "shape", None) != sharded.shape for a in arrays):
        return None
    if any(type(a).__module__.startswith("torch") for a in arrays):
        return None
    if sharded.nbytes > GATHER_MAX_BYTES:
        return [a if a is sharded else jax.device_put(a, sharded.sharding) for a in arrays]
    alone = [next(iter(a.devices())) for a in arrays
             if isinstance(a, jax.Array) and len(a.devices()) == 1]
    home = next((d for d in alone if d.platform == platform),
                min(sharded.devices(), key=lambda d: d.id))
    return [jax.device_put(a, home) for a in arrays]


def _device_arrays(*arrays):
    """The arrays as JAX arrays on the device (torch through DLPack), when all are and are
    big enough to be worth a device reduction: on one device, or, where one is spread over
    several, laid out as that one is; else None (compare on host)."""
    platform = _device_platform()
    if platform is None:
        return None
    present = [a for a in arrays if a is not None]
    # JAX runs without x64: float64 stays on the host, in float64. By name: torch.float64 is
    # not equal to np.float64, and a torch float64 result went to the device, into float32.
    if any(dtypes.name_of(getattr(a, "dtype", None)) == "float64" for a in present):
        return None
    converted = (_sharded_like(present, platform)
                 or [frameworks.as_device_array(a, platform) for a in present])
    if any(c is None for c in converted) or converted[0].size < DEVICE_COMPARE_MIN_SIZE:
        return None
    it = iter(converted)
    return tuple(None if a is None else next(it) for a in arrays)


def _host_array(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        return frameworks.torch_to_numpy(x)
    return np.asarray(x)


def compare(actual: Any, expected: Any, *, tolerance: float, name: str,
            magnitude: Any | None = None) -> Comparison:
    """Compare `actual` with `expected`; raise CheckFailure on mismatch.

    Errors are relative to `expected`, or to `magnitude` (the size of the terms
    that were summed into `expected`, same shape) where that is larger: a result
    that cancels to almost nothing cannot be expected to keep relative accuracy.
    Arrays may be NumPy, JAX or torch. Large GPU arrays are reduced on a device in
    float32 (exact for 16-bit and float32 results), a sharded one gathered onto one
    device first unless it is very large; otherwise on the host, in float32 unless
    either side is float64.
    """
    on_device = _device_arrays(actual, expected, magnitude)
    if on_device is not None:
        actual, expected, magnitude = on_device
        work_dtype = np.float32
        if actual.shape != expected.shape:
            raise CheckFailure(f"{name}: shape {actual.shape}, expected {expected.shape}")
        if magnitude is not None and magnitude.shape != expected.shape:
            raise ValueError(f"magnitude: expected shape {expected.shape}, got {magnitude.shape}")
        import jax

        extra = () if magnitude is None else (magnitude,)
        # One transfer of the scalars, not one per field.
        stats = _to_stats(jax.device_get(
            _device_stats_program(magnitude is not None)(actual, expected, *extra)))
    else:
        actual, expected = _host_array(actual), _host_array(expected)
        work_dtype = np.float64 if np.float64 in (actual.dtype, expected.dtype) else np.float32
        actual = actual.astype(work_dtype, copy=False)
        expected = expected.astype(work_dtype, copy=False)
        if actual.shape != expected.shape:
            raise CheckFailure(f"{name}: shape {actual.shape}, expected {expected.shape}")
        if magnitude is not None:
            magnitude = _host_array(magnitude).astype(work_dtype, copy=False)
        if expected.size == 0:
            return Comparison(name, 0.0, 0.0, tolerance)
        stats = _to_stats(_stats(np, actual, expected, magnitude, _host_norm))
    return _judge(stats, actual, expected, work_dtype, tolerance=tolerance, name=name)


def _judge(s: _Stats, actual, expected, work_dtype, *, tolerance: float, name: str) -> Comparison:
    """Raise CheckFailure naming the first guard `s` breaks; else the Comparison."""
    shape = tuple(expected.shape)

    def at(x, flat: int):
        """(index, value) of a flat position; the value as its dtype prints it (a float32's
        0.1 as "0.1", where an f-string would print its float64 expansion)."""
        index = tuple(int(i) for i in np.unravel_index(flat, shape))
        return index, str(np.asarray(x[index]).astype(work_dtype)[()])

    size = math.prod(shape)
    if s.bad_count:
        first, value = at(actual, s.first_bad)
        raise CheckFailure(f"{name}: {s.bad_count} of {size} elements are NaN/inf where the "
                           f"reference is finite (first at {first}: {value})")
    if s.mismatch:
        first, value = at(actual, s.first_mismatch)
        raise CheckFailure(f"{name}: reference is {at(expected, s.first_mismatch)[1]} at "
                           f"{first}, got {value}")
    # Degenerate outputs, judged only where the reference stands clear of rounding.
    if s.finite_count and s.expected_absmax > tolerance * s.peak and not s.actual_any:
        raise CheckFailure(f"{name}: output is all zeros; the reference is not")
    if s.finite_count > 1 and s.expected_ptp > tolerance * s.peak and s.actual_ptp == 0:
        raise CheckFailure(f"{name}: output is constant ({at(actual, s.first_finite)[1]}); "
                           f"the reference is not")
    scale = max(s.norm_expected, s.norm_size)
    relative = s.norm_diff / (scale or 1.0)
    max_error = (s.worst_diff if s.finite_count else 0.0) / (s.peak or 1.0)
    result = Comparison(name, relative, max_error, tolerance)
    if not (relative <= tolerance and max_error <= tolerance):
        worst, value = at(actual, s.worst)
        raise CheckFailure(f"{result}; worst at {worst}: got {value}, "
                           f"expected {at(expected, s.worst)[1]}")
    return result


@functools.cache
def _reference_program(op_name: str, params: tuple, with_grad: bool):
    """The operation's float32 reference as one jitted program: output alone, or output,
    gradients for a cotangent and their term magnitudes. Inputs come in the case dtype and
    are upcast inside, on the device."""
    import jax
    import jax.numpy as jnp

    op = registry.operation(op_name)
    kwargs = dict(params)

    def forward(*inputs):
        return op.reference(*(jnp.asarray(x, dtype=jnp.float32) for x in inputs), **kwargs)

    if not with_grad:
        return _jit_unautotuned(forward)

    def forward_and_vjp(inputs, cotangent):
        upcast = [jnp.asarray(x, dtype=jnp.float32) for x in inputs]
        out, pullback = jax.vjp(lambda *a: op.reference(*a, **kwargs), *upcast)
        cotangent = jnp.asarray(cotangent, dtype=jnp.float32)
        grads = pullback(cotangent)
        magnitudes = (tuple(op.gradient_magnitude(upcast, out, cotangent, **kwargs))
                      if op.gradient_magnitude else None)
        return out, tuple(grads), magnitudes

    return _jit_unautotuned(forward_and_vjp)


def reference_outputs(op: registry.Operation, case: registry.Case, inputs: tuple[np.ndarray, ...],
                      cotangent: np.ndarray | None):
    """Reference output, input gradients for `cotangent` and their term magnitudes, in float32,
    as NumPy arrays (magnitudes None per input where the operation declares none)."""
    out, grads, magnitudes = _run_reference(op, case, inputs, cotangent)
    if grads is None:
        return np.asarray(out), None, None
    return (np.asarray(out), tuple(np.asarray(g) for g in grads),
            tuple(None if m is None else np.asarray(m) for m in magnitudes))


def _run_reference(op, case, inputs, cotangent):
    """Device arrays: output, gradients (None without a cotangent), magnitudes per input."""
    import jax

    if cotangent is None:
        out = jax.block_until_ready(_reference_program(op.name, case.params, False)(*inputs))
        return out, None, None
    out, grads, magnitudes = jax.block_until_ready(
        _reference_program(op.name, case.params, True)(tuple(inputs), cotangent))
    return out, grads, magnitudes if magnitudes is not None else (None,) * len(grads)


class ChunkedGenerator:
    """A NumPy Generator whose large standard_normal and random draws are filled in
    CHUNKS pieces on threads (NumPy fills without holding the GIL), each piece from its own
    child of SeedSequence((seed, draw number)): the values depend on the seed alone, never
    on the thread count. Smaller draws, and every other method, are the seed's own
    Generator's, so small cases draw exactly what default_rng(seed) does.

    Why: at GPU sizes (10^8 elements) host input generation was the largest phase of a
    warm `pytest -m gpu` on an H100 (434 of 800 s of item time), one core per worker.
    """

    CHUNKS = 16
    MIN_ELEMENTS = 1 << 22

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._draws = 0
        self._rng = np.random.default_rng(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rng, name)

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        return self._fill("standard_normal", size, dtype, out)

    def random(self, size=None, dtype=np.float64, out=None):
        return self._fill("random", size, dtype, out)

    def _fill(self, method: str, size, dtype, out):
        count = math.prod(size) if isinstance(size, tuple) else size
        if out is not None or count is None or count < self.MIN_ELEMENTS:
            return getattr(self._rng, method)(size, dtype=dtype, out=out)
        from concurrent.futures import ThreadPoolExecutor

        self._draws += 1
        children = np.random.SeedSequence((self._seed, self._draws)).spawn(self.CHUNKS)
        result = np.empty(size, dtype=dtype)
        pieces = np.array_split(result.reshape(-1), self.CHUNKS)

        def fill(piece, child):
            getattr(np.random.default_rng(child), method)(dtype=dtype, out=piece)

        threads = max(1, min(self.CHUNKS, environment.cpu_count() // environment.xdist_workers()))
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fill, pieces, children))
        return result


def make_inputs(op: registry.Operation, case: registry.Case, seed: int,
                distribution: str) -> tuple[np.ndarray, ...]:
    if distribution not in op.distributions:
        raise ValueError(f"distribution: expected one of {op.distributions}, got {distribution!r}")
    rng = ChunkedGenerator(seed)
    inputs = op.make_inputs(case, rng, distribution)
    expected_dtype = dtypes.to_numpy(case.dtype)
    for name, x in zip(op.input_names, inputs, strict=True):
        if x.dtype != expected_dtype:
            raise TypeError(f"{op.name}.make_inputs: {name} has dtype {x.dtype}, case wants "
                            f"{expected_dtype}")
        if x.size and not np.any(x != 0):
            raise ValueError(f"{op.name}.make_inputs: {name} is all zeros; inputs must not be")
    return inputs


@dataclasses.dataclass(frozen=True)
class Reference:
    """Inputs for one (operation, case, seed, distribution) and the reference's answers.

    `inputs` are read-only NumPy arrays in the case dtype. The answers live where the
    comparisons read them: device arrays on a GPU, NumPy elsewhere; `device_inputs` are
    pristine device copies of the inputs (GPU only) for the input-modification check.
    """

    inputs: tuple[np.ndarray, ...]
    output: Any
    cotangent: np.ndarray | None = None
    grads: tuple[Any, ...] | None = None
    magnitudes: tuple[Any, ...] | None = None
    device_inputs: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if (self.cotangent is None) != (self.grads is None):
            raise ValueError("grads: expected exactly when a cotangent is given")

    @property
    def with_grad(self) -> bool:
        return self.grads is not None

    @property
    def nbytes(self) -> int:
        arrays = [*self.inputs, self.output, self.cotangent, *(self.grads or ()),
                  *(self.magnitudes or ()), *(self.device_inputs or ())]
        return sum(int(a.nbytes) for a in arrays if a is not None)


def compute_reference(op: registry.Operation, case: registry.Case, seed: int, distribution: str,
                      *, with_grad: bool, timer: phases.PhaseTimer | None = None) -> Reference:
    """Fresh inputs and the float32 reference for them (and its VJP with a random cotangent)."""
    import jax

    timer = timer or phases.PhaseTimer()
    with timer.phase("inputs"):
        inputs = make_inputs(op, case, seed, distribution)
        for x in inputs:
            x.setflags(write=False)  # shared by every implementation of the case
        cotangent = None
        if with_grad:
            shape = jax.eval_shape(_reference_program(op.name, case.params, False), *inputs).shape
            # Rounded to the case dtype so kernel and reference see the same values.
            cotangent = ChunkedGenerator(seed + COTANGENT_SEED_OFFSET).standard_normal(
                shape, dtype=np.float32).astype(dtypes.to_numpy(case.dtype))
            cotangent.setflags(write=False)
    with timer.phase("reference"):
        out, grads, magnitudes = _run_reference(op, case, inputs, cotangent)
        device_inputs = None
        if _device_platform():
            device_inputs = jax.block_until_ready(tuple(jax.device_put(x) for x in inputs))
        else:
            out = np.asarray(out)
            if grads is not None:
                grads = tuple(np.asarray(g) for g in grads)
                magnitudes = tuple(None if m is None else np.asarray(m) for m in magnitudes)
    return Reference(inputs=inputs, output=out, cotangent=cotangent, grads=grads,
                     magnitudes=magnitudes, device_inputs=device_inputs)


# A case's mesh says how the work is laid out over devices, never what it computes (every
# sharded reference drops it): the meshes of one problem share its inputs and reference. On
# 4 GPUs each of 5 meshes of a case made its own, and inputs, reference and placing them took
# 27% of `pytest -m multi_gpu`'s item time.
LAYOUT_PARAM = "mesh"
REFERENCE_MESH = "1x1"


def reference_case(case: registry.Case) -> registry.Case:
    """`case` as its inputs and reference are made and kept: its mesh, if any, set to one
    device."""
    params = dict(case.params)
    if params.get(LAYOUT_PARAM, REFERENCE_MESH) == REFERENCE_MESH:
        return case
    params[LAYOUT_PARAM] = REFERENCE_MESH
    return dataclasses.replace(case, params=tuple(params.items()))


class ReferenceCache:
    """References by (operation, case, seed, distribution), at most `max_bytes` of arrays
    held, and only those of the latest case asked for; within it the least recently used
    go first. An entry larger than the bound is computed, handed out and not kept. One per
    process; not thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes: expected >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[tuple, Reference] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return sum(ref.nbytes for ref in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, op: registry.Operation, case: registry.Case, seed: int, distribution: str, *,
            with_grad: bool, timer: phases.PhaseTimer | None = None) -> Reference:
        case = reference_case(case)
        # By id, not by the case itself: tags differ between the meshes of one problem.
        key = (op.name, case.id, seed, distribution)
        ref = self._entries.get(key)
        if ref is not None and (ref.with_grad or not with_grad):
            self._entries.move_to_end(key)
            self.hits += 1
            return ref
        self.misses += 1
        # The suite runs the items of one case back to back, so a new case means the
        # references of the cases before it are done with: drop them before computing, so
        # they do not add to the computation's own peak.
        for stale in [k for k in self._entries if k[:2] != key[:2] or k == key]:
            del self._entries[stale]
        ref = compute_reference(op, case, seed, distribution, with_grad=with_grad, timer=timer)
        self._make_room(ref.nbytes)
        if ref.nbytes <= self.max_bytes:
            self._entries[key] = ref
        return ref

    def _make_room(self, nbytes: int) -> None:
        while self._entries and self.nbytes + nbytes > self.max_bytes:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


@functools.cache
def shared_references() -> ReferenceCache:
    """This process's cache, bounded by $KERNELPERF_REFERENCE_CACHE_MB (default 4096 MiB on
    a GPU, 512 MiB on CPU)."""
    default = DEFAULT_CACHE_MB["gpu" if compat.on_gpu() else "cpu"]
    value = os.environ.get(CACHE_VARIABLE, "").strip()
    try:
        megabytes = int(value) if value else default
    except ValueError:
        raise ValueError(f"{CACHE_VARIABLE}: expected a whole number of MiB, got {value!r}") \
            from None
    return ReferenceCache(megabytes * 2**20)


def _unchanged(before: np.ndarray, pristine: Any, after: Any, fw) -> bool:
    """Whether the call left an input as it was: on the device where both copies are there,
    else through the host."""
    on_device = None if pristine is None else _device_arrays(pristine, after)
    if on_device is not None:
        return bool(_same_program()(*on_device))
    return np.array_equal(before, fw.to_numpy(after), equal_nan=True)


@functools.cache
def _same_program():
    import jax.numpy as jnp

    return _jit_unautotuned(lambda a, b: jnp.array_equal(a, b, equal_nan=True))


def check(impl: registry.Implementation, case: registry.Case, *, seed: int = 0,
          distribution: str = "normal", gradients: bool = True,
          references: ReferenceCache | None = None,
          timer: phases.PhaseTimer | None = None) -> list[Comparison]:
    """Run `impl` on fresh inputs for `case` and compare with the reference; raise on mismatch.

    references: where to find (and keep) the inputs and reference for (case, seed,
        distribution); by default they are computed for this call alone.
    timer: receives the wall time of each phase (kernels.core.phases).
    """
    op = registry.operation(impl.op)
    fw = frameworks.framework(impl.framework)
    timer = timer or phases.PhaseTimer()
    with_grad = gradients and registry.has_direction(impl, "bwd")
    precision = impl.precision_on(case, platform())
    label = f"{impl.id}[{case.id}, {distribution}, seed {seed}, {precision}]"
    if references is None:
        references = ReferenceCache(0)
    ref = references.get(op, case, seed, distribution,
                                                with_grad=with_grad, timer=timer)

    with timer.phase("place"):
        args = fw.synchronize(impl.place(case, fw.from_numpy(ref.inputs)))
    with timer.phase("forward"), frameworks.poisoned_outputs():
        out = fw.synchronize(impl.fn(*args, **case.kwargs))
    out_dtype = dtypes.short_name(out.dtype)
    if out_dtype != case.dtype:
        raise CheckFailure(f"{label} output: dtype {dtypes.name_of(out.dtype)}, "
                           f"expected {case.dtype}")

    tol = op.tolerance_at(case, precision)
    with timer.phase("compare"):
        results = [compare(out, ref.output, tolerance=tol, name=f"{label} output")]
        pristine = ref.device_inputs or (None,) * len(ref.inputs)
        for name, before, device_before, after in zip(op.input_names, ref.inputs, pristine, args,
                                                      strict=True):
            if not _unchanged(before, device_before, after, fw):
                raise CheckFailure(f"{label}: input {name} was modified by the call")

    if with_grad:
        with timer.phase("place"):
            grad_args = fw.synchronize(impl.place(case, fw.from_numpy(ref.inputs)))
        with timer.phase("gradients"), frameworks.poisoned_outputs():
            _, grads = fw.vjp(impl.fn, grad_args, ref.cotangent, case.kwargs)
            grads = fw.synchronize(grads)
        magnitudes = ref.magnitudes or (None,) * len(grads)
        with timer.phase("compare"):
            for name, grad, ref_grad, magnitude in zip(op.input_names, grads, ref.grads,
                                                       magnitudes, strict=True):
                results.append(compare(grad, ref_grad, magnitude=magnitude,
                                       tolerance=tol * op.gradient_tolerance_factor,
                                       name=f"{label} d{name}"))
    return results
