"""Faults planted in kernels on purpose: real ones (an out-of-bounds CUDA store, an endless
Triton loop, a Pallas barrier nobody arrives at) and CPU stand-ins (an abort, a call that
never returns, a sticky CUDA error), as text for a kernel's module and as test-only
implementations.

`plant_source` returns Python appended to an implementation's module in a scratch clone
(kernels/testing/drill.py, as `gate-power` plants slowdowns): it replaces the registered
implementation's function by one that faults. Every plant is self-contained text that uses
only what its module already imports, so it never enters the package.

The pytest option `--plant-fault OP:FAULT[:CASE]` (this module is a plugin of the root
conftest.py) registers a stand-in beside the operation's real implementations, named
`fault_<fault>`, for one case (the operation's first CPU case unless named): the tests of
kernels/testing/isolation.py run the suite over it. Without the option nothing is
registered.
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from kernels.core import registry

KINDS = ("crash", "hang", "sticky")
# What a planted sticky stand-in raises: what torch shows for CUDA_ERROR_ILLEGAL_ADDRESS.
STICKY_MESSAGE = ("CUDA error: an illegal memory access was encountered "
                  "(CUDA_ERROR_ILLEGAL_ADDRESS; a planted stand-in)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fault:
    """One fault and how it is planted: `body` is the text of `planted(x, *args, **kwargs)`
    (4-space indented, `inner` the implementation's own function), `preamble` module-level
    text before it (a kernel of its own)."""

    name: str
    kind: str  # crash, hang or sticky: what the process sees
    summary: str
    body: str
    preamble: str = ""
    # Where its plant runs: "gpu", "cpu" (a stand-in, or a real kernel interpreted).
    platforms: tuple[str, ...] = ("gpu", "cpu")
    # The implementation the drill plants it in: (operation, implementation).
    target: tuple[str, str] = ("softmax", "xla")
    # A stand-in for a sticky error: once it faulted, every implementation of the operation
    # fails in this process (`spare_self`: except the planted one, whose fault the next
    # sync, or the device check, would find).
    poisons: bool = False
    spare_self: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        if not self.platforms or set(self.platforms) - {"gpu", "cpu"}:
            raise ValueError(f"platforms: expected some of ('gpu', 'cpu'), got "
                             f"{self.platforms}")


_SPIN_KERNEL = '''
@triton.jit
def _kernelperf_planted_spin(flag_ptr, count_ptr):
    # flag_ptr holds 0 and nothing writes it: the loop never ends. The volatile load and the
    # store keep the compiler from hoisting the test or dropping the loop.
    count = 0
    while tl.load(flag_ptr, volatile=True) == 0:
        count += 1
        tl.store(count_ptr, count)
'''

FAULTS = (
    Fault(name="cuda-oob", kind="sticky", target=("softmax", "cuda"), platforms=("gpu",),
          summary="the CUDA softmax launched with its output pointer 16 TiB past its input: "
                  "an out-of-bounds store (CUDA_ERROR_ILLEGAL_ADDRESS, sticky)",
          body='''
    rows, cols = runtime.rows_and_cols(x)
    config = default_config(cols, 1)
    LIBRARY.launch("kernelperf_softmax", x.device, x.data_ptr(), x.data_ptr() + (1 << 44),
                   rows, cols, runtime.dtype_code(x), config.threads_per_row,
                   config.rows_per_block, config.vectors_per_thread, 0, int(config.online),
                   runtime.current_stream(x))
    return inner(x, *args, **kwargs)
'''),
    Fault(name="triton-loop", kind="hang", target=("softmax", "triton"),
          summary="a Triton kernel that spins on a flag nobody sets, launched before the "
                  "softmax (interpreted on a CPU)",
          preamble=_SPIN_KERNEL,
          body='''
    import torch as _torch

    flag = _torch.zeros(2, dtype=_torch.int32, device=x.device)
    _kernelperf_planted_spin[(1,)](flag, flag[1:])
    return inner(x, *args, **kwargs)
'''),
    Fault(name="pallas-barrier", kind="hang", target=("softmax", "pallas"),
          summary="a Pallas (Mosaic GPU) kernel that waits on a barrier nobody arrives at, "
                  "its result kept by a host callback (the Mosaic GPU interpreter on a CPU)",
          body='''
    import jax as _jax
    import jax.numpy as _jnp

    plgpu = compat.pallas_mosaic_gpu()

    def wait(out_ref, barrier_ref):
        plgpu.barrier_wait(barrier_ref.at[0])  # no thread ever arrives

    stuck = plgpu.kernel(
        wait, out_type=_jax.ShapeDtypeStruct((128,), _jnp.float32),
        scratch_types=[plgpu.Barrier(num_arrivals=1, num_barriers=1)],
        interpret=False if compat.on_gpu() else compat.mosaic_gpu_interpret_params())
    # A result nobody uses would be pruned; a host callback is an effect XLA keeps.
    _jax.debug.callback(lambda value: None, stuck())
    return inner(x, *args, **kwargs)
'''),
    Fault(name="abort", kind="crash",
          summary="stand-in: the call aborts its process (SIGABRT), as a crashing driver does",
          body='''
    import os as _os

    _os.abort()
'''),
    Fault(name="hang", kind="hang",
          summary="stand-in: the call never returns (blocked with the GIL released, as in a "
                  "device sync)",
          body='''
    import threading as _threading

    _threading.Event().wait()  # nobody sets it
'''),
    Fault(name="gil-hang", kind="hang",
          summary="stand-in: the call never returns and holds the GIL (a regular expression "
                  "backtracking inside re's C loop, as a spinning C call would)",
          body='''
    import re as _re

    _re.match(r"(a+)+$", "a" * 64 + "b")  # 2**64 steps
'''),
    Fault(name="sticky", kind="sticky", target=("softmax", "torch"), platforms=("cpu",),
          poisons=True,
          summary="stand-in: the call raises CUDA_ERROR_ILLEGAL_ADDRESS, and so does every "
                  "later call of the operation's implementations in the process",
          body='''
    _KERNELPERF_FAULT_STATE["error"] = STICKY
    raise RuntimeError(STICKY)
'''),
    Fault(name="sticky-async", kind="sticky", platforms=("cpu",), poisons=True, spare_self=True,
          summary="stand-in: the call returns the right result but leaves the process "
                  "poisoned (a fault seen only by the next sync, or by the device check)",
          body='''
    out = inner(x, *args, **kwargs)
    _KERNELPERF_FAULT_STATE["error"] = STICKY
    return out
'''),
)
_BY_NAME = {fault.name: fault for fault in FAULTS}
# What the drill plants by default where it runs: the real kernels where they can run, the
# sticky stand-in where the CUDA kernel cannot (a CPU).
DRILL_DEFAULTS = {"gpu": ("cuda-oob", "triton-loop", "pallas-barrier", "abort"),
                  "cpu": ("sticky", "triton-loop", "pallas-barrier", "abort")}


def fault(name: str) -> Fault:
    """The fault called `name`; ValueError naming the ones there are."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"fault: expected one of {sorted(_BY_NAME)}, got {name!r}") from None


# The sticky stand-ins keep their state in the module they are planted in, and make every
# implementation of their operation fail once it is set, as a CUDA context does.
_STICKY_STATE = '''
_KERNELPERF_FAULT_STATE = {"error": None}


def _kernelperf_sticky(op, spared):
    import dataclasses as _dataclasses
    import functools as _functools

    def poisonable(impl):
        if impl.op != op or impl.name == spared or getattr(impl.fn, "_kernelperf_poisonable",
                                                           False):
            return impl

        @_functools.wraps(impl.fn)
        def call(*args, **kwargs):
            if _KERNELPERF_FAULT_STATE["error"]:
                raise RuntimeError(_KERNELPERF_FAULT_STATE["error"])
            return fn(*args, **kwargs)

        fn = impl.fn
        call._kernelperf_poisonable = True
        return _dataclasses.replace(impl, fn=call)

    for key, impl in list(registry._IMPLEMENTATIONS.items()):
        registry._IMPLEMENTATIONS[key] = poisonable(impl)
    register = registry.register_implementation
    # Implementations registered later (modules imported after this one) too.
    registry.register_implementation = lambda impl: register(poisonable(impl))
'''


def plant_source(name: str, op: str, impl: str, *, register_as: str | None = None,
                 only_case: str | None = None) -> str:
    """Python that, run at the end of `impl`'s module (names `registry` and the module's own
    in scope), makes `op`'s implementation `impl` fault as `name` says.

    With `register_as`, the faulty copy is registered beside `impl` under that name, instead
    of replacing it, and with `only_case` it runs that case only (the others skip).
    """
    planted = fault(name)
    name_there = register_as or impl
    where = (f"registered as {register_as!r} beside {op}-{impl}" if register_as else
             f"in {op}-{impl}")
    lines = [f"\n\n# Planted by kernels/testing/faults.py ({name}, {where}); never part of "
             f"the package.\n# {planted.summary}\n"]
    if planted.poisons:
        lines.append(_STICKY_STATE + f"STICKY = {STICKY_MESSAGE!r}\n")
    lines.append(textwrap.dedent(planted.preamble))
    supports = "" if only_case is None else (
        f"        supports=lambda case: None if case.id == {only_case!r} else "
        f"'fault stand-in: runs {only_case} only',\n")
    replace = (f"    registry.register_implementation(_dataclasses.replace(\n"
               f"        registry._IMPLEMENTATIONS[key], name={register_as!r}, fn=planted,\n"
               f"        description={planted.summary!r},\n{supports}"
               f"    ))\n" if register_as else
               "    registry._IMPLEMENTATIONS[key] = _dataclasses.replace(\n"
               "        registry._IMPLEMENTATIONS[key], fn=planted)\n")
    lines.append(
        "\n\ndef _kernelperf_planted_fault():\n"
        "    import dataclasses as _dataclasses\n\n"
        f"    key = ({op!r}, {impl!r})\n"
        "    inner = registry._IMPLEMENTATIONS[key].fn\n\n"
        "    def planted(x, *args, **kwargs):"
        + textwrap.indent(textwrap.dedent(planted.body), "        ").rstrip() + "\n\n"
        + replace
        + (f"    _kernelperf_sticky({op!r}, "
           f"{name_there if planted.spare_self else None!r})\n" if planted.poisons else "")
        + "\n\n_kernelperf_planted_fault()\n")
    return "".join(lines)


# -- test-only implementations: the --plant-fault option ---------------------------------------

def register_stand_in(op: str, name: str, case: str | None = None) -> registry.Implementation:
    """Register `fault_<name>` beside `op`'s implementations: a copy of its XLA (else first)
    implementation that faults as `name` says, on `case` only (default: the operation's first
    CPU case). Sticky stand-ins also tell the device check (isolation.add_health_probe)."""
    from kernels.testing import isolation

    operation = registry.operation(op)
    planted = fault(name)
    case = case or operation.cases_tagged("cpu")[0].id
    operation.case(case)  # UnknownName for a case the operation does not have
    names = [impl.name for impl in registry.implementations(op)]
    base = "xla" if "xla" in names else names[0]
    register_as = f"fault_{name.replace('-', '_')}"
    namespace = {"registry": registry}
    exec(plant_source(name, op, base, register_as=register_as, only_case=case), namespace)
    if planted.poisons:
        state = namespace["_KERNELPERF_FAULT_STATE"]
        isolation.add_health_probe(lambda: state["error"])
    return registry.implementation(op, register_as)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("isolation").addoption(
        "--plant-fault", action="append", default=[], dest="plant_fault",
        metavar="OP:FAULT[:CASE]",
        help="register a test-only implementation of OP that faults as FAULT says (one of "
        f"{', '.join(f.name for f in FAULTS if 'cpu' in f.platforms)}), beside the real ones, "
        "on CASE only (default: OP's first CPU case); repeatable")


def pytest_configure(config: pytest.Config) -> None:
    for spec in config.getoption("plant_fault"):
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise pytest.UsageError(f"--plant-fault: expected OP:FAULT[:CASE], got {spec!r}")
        try:
            register_stand_in(*parts)
        except (ValueError, KeyError) as error:
            raise pytest.UsageError(f"--plant-fault {spec}: {error}") from None
