"""The registry: each operation declared once, implementations registered against it.

An `Operation` carries everything tests, benchmarks and the roofline need to
know about a computation: its jnp reference, how to make inputs for a `Case`,
its work model (FLOPs and minimum bytes, forward and backward), its tolerance
and its case sets. An `Implementation` is one way to compute it (a Pallas
kernel, a Triton kernel, an XLA or torch baseline), with what it needs to run.

Operations and implementations live under `kernels/ops/<operation>/`; every
module there is imported by `load()`, so a new kernel is one file that calls
`register_implementation` once. A module whose import fails is recorded (see
`import_failures()`) rather than registered. A private module (`_name.py`) registers
nothing: its operation's modules import it when they are called, so what it imports (a
framework only one implementation uses) is not paid by every process that loads the
registry.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pathlib
import pkgutil
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kernels.core import dtypes, precisions, validation
from kernels.core.hlo_rules import HloExpectation

DIRECTIONS = ("fwd", "bwd")


@dataclasses.dataclass(frozen=True)
class Case:
    """One problem instance: named dimensions, a dtype, call parameters and input variant.

    `params` are keyword arguments passed to both the reference and the
    implementation (e.g. `causal=True`); `variant` selects how inputs are made
    (e.g. "masked" puts -inf into softmax rows); `tags` place the case in case
    sets ("cpu": small enough to interpret; "gpu": real sizes).
    """

    op: str
    dims: tuple[tuple[str, int], ...]
    dtype: str
    params: tuple[tuple[str, Any], ...] = ()
    variant: str = ""
    tags: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.dtype not in dtypes.NAMES:
            raise ValueError(f"dtype: expected one of {sorted(dtypes.NAMES)}, got {self.dtype!r}")
        for name, size in self.dims:
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"{name}: expected a positive int, got {size!r}")

    def __getitem__(self, dim: str) -> int:
        for name, size in self.dims:
            if name == dim:
                return size
        names = [name for name, _ in self.dims]
        raise KeyError(f"{self.op} case has no dimension {dim!r}; it has {names}")

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def shape_id(self) -> str:
        parts = ["x".join(str(size) for _, size in self.dims)]
        parts += [name if value is True else f"{name}{value}" for name, value in self.params
                  if value is not False]
        if self.variant:
            parts.append(self.variant)
        return "-".join(parts)

    @property
    def id(self) -> str:
        """`f32-1024x1000-masked`: dtype, then shape, parameters and variant."""
        return f"{self.dtype}-{self.shape_id}"


def make_case(op: str, dtype: str, dims: Mapping[str, int], *, params: Mapping[str, Any] = {},
              variant: str = "", tags: Iterable[str] = ()) -> Case:
    return Case(op=op, dims=tuple(dims.items()), dtype=dtype, params=tuple(params.items()),
                variant=variant, tags=frozenset(tags))


@dataclasses.dataclass(frozen=True)
class Work:
    """The work a case demands: FLOPs, the fewest bytes it must move through device memory,
    and (for sharded operations) the bytes that must cross between devices."""

    flops: float
    bytes: float
    comm_bytes: float = 0.0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exchange:
    """One collective a call of a sharded case issues, as nccl-tests names and sizes it: kind
    ("all-to-all", ...), S = bytes per rank by nccl-tests' definition for that kind, the ranks
    it spans, and fragments of the device kernels' names that carry it in a profiler trace
    (NCCL's all-to-all runs as grouped send/recv: "SendRecv"). kernels.bench.scaling reads
    each one's bandwidth inside the operation from the device trace."""

    label: str  # what it does in the operation: "dispatch", "combine"
    kind: str
    size_bytes: int
    ranks: int
    kernels: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.size_bytes < 1 or self.ranks < 2 or not self.kernels:
            raise ValueError(f"{self.label}: expected size_bytes >= 1, ranks >= 2 and kernel "
                             f"names, got {self.size_bytes}, {self.ranks}, {self.kernels}")


@dataclasses.dataclass(frozen=True)
class BadInput:
    """An invalid call every one of our implementations must reject with a clear error."""

    label: str
    make_args: Callable[[], tuple[Any, ...]]
    error: type[Exception]
    match: str


@dataclasses.dataclass(frozen=True)
class Operation:
    """The single declaration of a computation.

    reference: plain jax.numpy, called with inputs upcast to float32 and the
        case's params; the truth every implementation is compared with.
    make_inputs: (case, rng, distribution) -> numpy arrays in the case's dtype.
        Never zeros; `distribution` is one of `distributions`.
    work: (case, direction) -> Work, direction "fwd" or "bwd".
    tolerance: case -> relative error allowed on the forward output computed in the case
        dtype's own precision; gradients get `gradient_tolerance_factor` times that. An
        operation with matrix products (`dots`) takes `rounding=` too: the relative rounding
        of float32 operands its products add beyond float32's (precisions.ROUNDING: TF32
        2^-11), so that the tolerance follows each implementation's declared precision
        (`tolerance_at`).
    dots: whether the computation has matrix products whose float32 arithmetic is an
        implementation's choice (FP32, TF32, ...): its implementations then declare it
        (Implementation.precision), and rows and ratios compare those of one precision.
    validate: raises ValueError/TypeError for bad inputs; shared by our kernels.
    gradient_magnitude: (inputs, output, cotangent, **case params) -> per input, the size of
        the terms summed into its gradient (float32 jnp arrays), where the
        gradient can cancel far below them; errors are measured against it.
    reference_bytes: case -> device bytes the float32 reference, its VJP and the gradient
        magnitudes hold at their peak beyond float32 copies of the inputs, output and
        gradients, where that is more (attention's seq x seq probabilities); the test
        scheduler (kernels/testing/scheduling.py) reads it to share one GPU between workers.
    weak_scaling: sharded operations: (mesh axis, dimensions) pairs; in weak scaling (a
        fixed share of work per device, kernels.bench.scaling) those dimensions grow with
        that mesh axis, e.g. (("data", ("batch",)), ("model", ("mlp",))).
    exchanges: sharded operations: (case, direction) -> the Exchanges one call issues, for
        their bandwidth inside the operation.
    """

    name: str
    description: str
    input_names: tuple[str, ...]
    reference: Callable[..., Any]
    make_inputs: Callable[[Case, np.random.Generator, str], tuple[np.ndarray, ...]]
    work: Callable[[Case, str], Work]
    tolerance: Callable[[Case], float]
    cases: tuple[Case, ...]
    validate: Callable[..., None]
    dots: bool = False
    bad_inputs: tuple[BadInput, ...] = ()
    distributions: tuple[str, ...] = ("normal", "large")
    differentiable: bool = True
    gradient_tolerance_factor: float = 4.0
    gradient_magnitude: Callable[..., tuple[Any, ...]] | None = None
    reference_bytes: Callable[[Case], float] | None = None
    weak_scaling: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exchanges: Callable[[Case, str], tuple[Exchange, ...]] | None = None

    def cases_tagged(self, tag: str) -> tuple[Case, ...]:
        return tuple(case for case in self.cases if tag in case.tags)

    def tolerance_at(self, case: Case, precision: str) -> float:
        """The forward tolerance of `case` computed in `precision` (a precisions name): an FP32
        implementation is held to float32's tolerance, a TF32 one gets TF32's rounding on top."""
        rounding = precisions.rounding(precision, case.dtype)
        if not self.dots:
            if rounding:
                raise ValueError(f"precision: {self.name} has no matrix products, so a "
                                 f"{case.dtype} case computes in {precisions.OF_DTYPE[case.dtype]}"
                                 f", got {precision!r}")
            return self.tolerance(case)
        return self.tolerance(case, rounding=rounding)

    def case(self, case_id: str) -> Case:
        """The declared case with this id; ValueError naming the ids there are."""
        for case in self.cases:
            if case.id == case_id:
                return case
        raise validation.UnknownName(
            f"case: expected one of {[c.id for c in self.cases]}, got {case_id!r}")


@dataclasses.dataclass(frozen=True)
class Requirements:
    """What an implementation needs from the machine.

    gpu: needs a CUDA GPU (no interpreter path on CPU).
    min_compute_capability: e.g. (9, 0) for Hopper-only code.
    devices: how many devices of the default backend it runs over.
    modules: Python modules that must import (e.g. "torch", "triton").
    """

    gpu: bool = False
    min_compute_capability: tuple[int, int] | None = None
    devices: int = 1
    modules: tuple[str, ...] = ()

    def describe(self) -> str:
        needs = []
        if self.gpu:
            cc = self.min_compute_capability
            needs.append(f"CUDA GPU (sm_{cc[0]}{cc[1]}+)" if cc else "CUDA GPU")
        if self.devices > 1:
            needs.append(f"{self.devices} devices")
        needs += list(self.modules)
        return ", ".join(needs) or "nothing special"


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way to compute an operation.

    fn: called as fn(*inputs, **case.kwargs) with inputs already in the
        framework's arrays (see kernels.core.frameworks); returns the output.
    framework: "jax" or "torch": how inputs are placed and gradients taken.
    baseline: a peer we measure against (XLA, cuDNN, torch), not our kernel.
    supports: case -> None, or the reason this implementation cannot run it.
    prepare: optional (case, *framework_inputs) -> inputs for fn, run once
        outside any timed region (e.g. placing inputs with a sharding).
    hlo: optional rules its compiled HLO must follow per platform (kernels.guards.hlo).
    precision: what its matrix products multiply float32 inputs in, per platform
        (precisions.DotPrecision); required where the operation has `dots`, None where it
        has none (float32 is then computed in FP32). See `precision_on`.
    autotunes: its first call on a shape picks a config by timing candidates on the device
        (Triton's autotuner; XLA's GEMM autotuner for the dots it compiles), and later calls
        run that choice: a first call beside other work on the device picks by contended
        timings (the perf phase warms such an implementation up only once it has the device
        to itself, kernels.bench.perfcheck.PerfSession.warm_up).
    """

    op: str
    name: str
    fn: Callable[..., Any]
    framework: str = "jax"
    requires: Requirements = Requirements()
    baseline: bool = False
    differentiable: bool = True
    supports: Callable[[Case], str | None] = lambda case: None
    prepare: Callable[..., tuple[Any, ...]] | None = None
    description: str = ""
    hlo: HloExpectation | None = None
    precision: precisions.DotPrecision | None = None
    autotunes: bool = False

    def __post_init__(self) -> None:
        if self.precision is not None and not isinstance(self.precision,
                                                         precisions.DotPrecision):
            raise TypeError(f"precision: expected a precisions.DotPrecision or None for "
                            f"{self.op}-{self.name}, got {self.precision!r}")

    def precision_on(self, case: Case, platform: str) -> str:
        """The precision `case` computes in on `platform` ("gpu" or "cpu"): FP32, TF32,
        BF16x3 for a float32 case as declared, BF16 or FP16 for a 16-bit one."""
        return precisions.resolve(self.precision, case.dtype, platform, label=self.id)

    def devices_for(self, case: Case) -> int:
        """Devices `case` runs over: the size of its `mesh` parameter ("4x2": 8) where it
        names one (the sharded operations), else `requires.devices`."""
        mesh = case.kwargs.get("mesh")
        if isinstance(mesh, str):
            return mesh_size(mesh)
        return self.requires.devices

    def place(self, case: Case, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """Inputs as `fn` takes them: `prepare` applied, if any."""
        return tuple(self.prepare(case, *args)) if self.prepare else tuple(args)

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


_OPERATIONS: dict[str, Operation] = {}
_IMPLEMENTATIONS: dict[tuple[str, str], Implementation] = {}
_IMPORT_FAILURES: dict[str, str] = {}
_loaded = False


def register_operation(op: Operation) -> Operation:
    if op.name in _OPERATIONS and _OPERATIONS[op.name] is not op:
        raise ValueError(f"operation {op.name!r} is already registered")
    for case in op.cases:
        if case.op != op.name:
            raise ValueError(f"case {case.id} belongs to {case.op!r}, not {op.name!r}")
    if op.dots:
        _check_dot_tolerance(op)
    _OPERATIONS[op.name] = op
    return op


def _check_dot_tolerance(op: Operation) -> None:
    """An operation with matrix products must loosen its tolerance for TF32's rounding: one
    that ignored `rounding` would hold a TF32 kernel to float32's tolerance, or (loosened for
    TF32 regardless) an FP32 one to TF32's."""
    f32 = [case for case in op.cases if case.dtype == "f32"]
    if not f32:
        return
    plain = op.tolerance(f32[0], rounding=0.0)
    if not op.tolerance(f32[0], rounding=precisions.ROUNDING[precisions.TF32]) > plain:
        raise ValueError(f"{op.name}.tolerance: expected a tolerance that grows with the "
                         f"operands' rounding (TF32's 2^-11) for an operation with dots, got "
                         f"{plain:.3e} either way")


def _check_precision(impl: Implementation, op: Operation) -> None:
    """The declaration an implementation of `op` must carry: one exactly where the operation
    has matrix products."""
    if op.dots and impl.precision is None:
        raise ValueError(f"{impl.id}: precision: expected a precisions.DotPrecision (what its "
                         f"matrix products multiply float32 inputs in: "
                         f"{', '.join(precisions.FLOAT32_PATHS)}), got None")
    if not op.dots and impl.precision is not None:
        raise ValueError(f"{impl.id}: precision: expected None ({op.name} has no matrix "
                         f"products: it computes in the case dtype), got {impl.precision}")


def register_implementation(impl: Implementation) -> Implementation:
    key = (impl.op, impl.name)
    if key in _IMPLEMENTATIONS and _IMPLEMENTATIONS[key] is not impl:
        raise ValueError(f"implementation {impl.id!r} is already registered")
    if impl.framework not in ("jax", "torch"):
        raise ValueError(f"framework: expected 'jax' or 'torch', got {impl.framework!r}")
    if impl.op in _OPERATIONS:
        _check_precision(impl, _OPERATIONS[impl.op])
    _IMPLEMENTATIONS[key] = impl
    return impl


def unregister_implementation(op: str, name: str) -> None:
    """Remove an implementation (tests plant faulty ones and take them away)."""
    _IMPLEMENTATIONS.pop((op, name), None)


# Where operations and their implementations are declared: every module under it registers
# what it declares when imported.
OPS_PACKAGE = "kernels.ops"


def load() -> None:
    """Import every module under kernels.ops once, which registers what they declare."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    # By name, not by an import statement: the operations sit above the core, which finds
    # them as plugins (the layers contract in .importlinter checks static imports).
    ops = importlib.import_module(OPS_PACKAGE)
    for module in pkgutil.walk_packages(ops.__path__, prefix=f"{OPS_PACKAGE}."):
        if module.name.rpartition(".")[2].startswith("_"):
            continue  # imported on use by its operation's own modules
        try:
            importlib.import_module(module.name)
        except Exception as error:  # a backend whose framework is missing is not registered
            _IMPORT_FAILURES[module.name] = "".join(
                traceback.format_exception_only(type(error), error)).strip()
    for impl in _IMPLEMENTATIONS.values():
        if impl.op not in _OPERATIONS:
            raise ValueError(f"implementation {impl.id!r} names unknown operation {impl.op!r}")
        _check_precision(impl, _OPERATIONS[impl.op])


def operations() -> list[Operation]:
    load()
    return list(_OPERATIONS.values())


def precision_of(impl: Implementation, case: Case, platform: str) -> str:
    """`impl.precision_on(case, platform)`; by this name for perf_tests/benchmarks.py, which
    runs against every commit's kernels and finds it only on those that declare precisions."""
    return impl.precision_on(case, platform)


def mesh_size(mesh: str) -> int:
    """Devices of a mesh parameter: "4x2" -> 8."""
    return math.prod(int(size) for size in mesh.lower().split("x"))


def benchmark_class(op_name: str) -> str:
    """The name perf_tests/benchmarks.py gives the asv class of operation `op_name`:
    softmax -> Softmax, row_sum -> RowSum (the benchmarks spell it out themselves: they run
    against every commit's kernels)."""
    return "".join(part.title() for part in op_name.split("_"))


def module_path(op: str, impl: str) -> pathlib.Path:
    """The file, relative to the repository, that registers `impl` of `op` (where the
    planting tools append their slowdowns and faults)."""
    module = implementation(op, impl).fn.__module__
    return pathlib.Path(*module.split(".")).with_suffix(".py")


def check_direction(direction: str) -> None:
    """ValueError unless `direction` is one of DIRECTIONS."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")


def has_direction(impl: Implementation, direction: str) -> bool:
    """Whether `impl` runs in `direction`: every implementation has a forward; a backward
    needs both the operation and the implementation to be differentiable."""
    return direction == "fwd" or (operation(impl.op).differentiable and impl.differentiable)


def operation(name: str) -> Operation:
    load()
    try:
        return _OPERATIONS[name]
    except KeyError:
        raise validation.UnknownName(
            f"unknown operation {name!r}; known: {sorted(_OPERATIONS)}") from None


def implementations(op: str | None = None) -> list[Implementation]:
    load()
    return [impl for impl in _IMPLEMENTATIONS.values() if op is None or impl.op == op]


def implementation(op: str, name: str) -> Implementation:
    load()
    try:
        return _IMPLEMENTATIONS[(op, name)]
    except KeyError:
        known = sorted(n for o, n in _IMPLEMENTATIONS if o == op)
        raise validation.UnknownName(
            f"unknown implementation {name!r} of {op!r}; known: {known}") from None


def import_failures() -> dict[str, str]:
    load()
    return dict(_IMPORT_FAILURES)


def select_cases(op: Operation, tags: Sequence[str]) -> list[Case]:
    """Cases carrying any of `tags`, in declaration order."""
    return [case for case in op.cases if case.tags & set(tags)]


BENCH_TAG = "bench"


def bench_cases(op: Operation, platform: str) -> list[Case]:
    """The operation's benchmark cases sized for `platform` ("gpu" or "cpu"): tagged
    BENCH_TAG and the platform, in declaration order (asv and the perf tests both time these)."""
    return [case for case in op.cases if {BENCH_TAG, platform} <= case.tags]


def check_tags(tags: Sequence[str], ops: Sequence[Operation]) -> None:
    """UnknownName unless every tag is carried by some case of `ops` (a misspelt tag would
    otherwise select nothing and report an empty, successful run)."""
    known = set().union(*(case.tags for op in ops for case in op.cases))
    missing = sorted(set(tags) - known)
    if missing:
        raise validation.UnknownName(f"tags: expected some of {sorted(known)}, got {missing}")
