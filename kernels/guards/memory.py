"""Peak device memory per (implementation, case, direction), from XLA and from the device.

Compiled peak: XLA's memory analysis of the executable (`compiled.memory_analysis()`):
arguments + outputs + temporaries - bytes aliased between arguments and outputs.
It is a static property of the compiled program, so it is the same on every run
of a commit and is what asv tracks (`track_peak_memory`).

Live peak (GPU only): the allocator's high-water mark (`device.memory_stats()
["peak_bytes_in_use"]`) over placing the inputs and one call, less the bytes in
use before. JAX cannot reset that mark, so it only counts when the call raises
it (and compiling, which autotunes in device memory, counts too): `measure_isolated`
runs each measurement in a fresh process to make sure.

"bwd" is one program: the forward and the vector-Jacobian product with a given
cotangent, so what the forward keeps for the backward (or rematerialises) shows.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels.core import environment, registry


@dataclasses.dataclass(frozen=True)
class MemoryUse:
    """Bytes of one compiled program and, on GPU, of one run of it."""

    impl: str
    case: str
    direction: str
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    live_peak_bytes: int | None = None  # None: not a GPU, or the mark was not raised

    @property
    def compiled_peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes


def program(impl: registry.Implementation, case: registry.Case,
            direction: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The function to compile for `direction` and its arguments (seed 0), on the device."""
    import jax
    import jax.numpy as jnp

    from kernels.core import frameworks

    if impl.framework != "jax":
        raise ValueError(f"impl: expected a JAX implementation, got {impl.id} ({impl.framework})")
    registry.check_direction(direction)
    op = registry.operation(impl.op)
    if not registry.has_direction(impl, direction):
        raise ValueError(f"direction: {impl.id} has no backward, got 'bwd'")
    rng = np.random.default_rng(0)
    inputs = op.make_inputs(case, rng, op.distributions[0])
    args = impl.place(case, frameworks.framework("jax").from_numpy(inputs))
    forward = functools.partial(impl.fn, **case.kwargs)
    if direction == "fwd":
        return forward, args
    output = jax.eval_shape(forward, *args)
    cotangent = jnp.asarray(rng.standard_normal(output.shape, dtype=np.float32), output.dtype)

    def backward(cotangent, *args):
        return jax.vjp(forward, *args)[1](cotangent)

    return backward, (cotangent, *args)


def _bytes_in_use(device) -> tuple[int, int] | None:
    stats = device.memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return int(stats["bytes_in_use"]), int(stats["peak_bytes_in_use"])


def measure(impl: registry.Implementation, case: registry.Case, direction: str = "fwd",
            live: bool | None = None) -> MemoryUse:
    """Compiled peak, and the live peak of one run where the device reports one (GPU).

    live: run the program and read the allocator's high-water mark; by default
    wherever the device keeps memory statistics.
    """
    import jax

    device = jax.devices()[0]
    start = _bytes_in_use(device)
    if start is not None:
        # Arrays already dead but not yet collected would count in the live peak's base. Only
        # where the device keeps statistics: a CPU's collection measured nothing and cost
        # 0.12 s a call (`kernels memory mlp` spent 2 of its 14 CPU-s in it).
        gc.collect()
        start = _bytes_in_use(device)
    fn, args = program(impl, case, direction)
    from kernels.core import compat

    compiled = jax.jit(fn).lower(*args).compile(compiler_options=compat.guard_compile_options())
    analysis = compiled.memory_analysis()
    live_peak = None
    if start is not None and (live is None or live):
        # Compiling (autotuning) allocates too: the run must raise the mark above that.
        _, peak_compiled = _bytes_in_use(device)
        jax.block_until_ready(compiled(*args))
        _, peak_run = _bytes_in_use(device)
        if peak_run > peak_compiled:
            live_peak = peak_run - start[0]
    return MemoryUse(impl=impl.id, case=case.id, direction=direction,
                     argument_bytes=int(analysis.argument_size_in_bytes),
                     output_bytes=int(analysis.output_size_in_bytes),
                     temp_bytes=int(analysis.temp_size_in_bytes),
                     alias_bytes=int(analysis.alias_size_in_bytes),
                     live_peak_bytes=live_peak)


def measure_isolated(impl: registry.Implementation, case: registry.Case,
                     direction: str = "fwd") -> MemoryUse:
    """`measure` in a fresh Python process, so the device's high-water mark starts at zero.

    Two processes on a GPU: the first compiles (autotuning, whose trial buffers raise the
    mark above what one run of a small program reaches) and writes XLA's autotuning
    results; the second compiles the same program from those results, allocating no trial
    buffers, and runs it.
    """
    package_root = str(pathlib.Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    # Allocate on demand: this process may already hold most of the device (JAX preallocates).
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    # The high-water mark is the BFC allocator's statistic; the platform allocator (which
    # the test workers on a shared GPU use) keeps none.
    env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "bfc"
    described = json.dumps({"dtype": case.dtype, "dims": case.dims, "params": case.params,
                            "variant": case.variant})

    def run(flag: str) -> MemoryUse:
        flags = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
        result = subprocess.run([sys.executable, "-m", "kernels.guards.memory", impl.op, impl.name,
                                 described, direction], capture_output=True, text=True,
                                env=dict(env, XLA_FLAGS=flags), check=False)
        if result.returncode != 0:
            raise RuntimeError(f"measuring {impl.id} {case.id} {direction} in a subprocess "
                               f"failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
        return MemoryUse(**json.loads(result.stdout.strip().splitlines()[-1]))

    if not environment.nvidia_gpu_present():
        return run("")
    with tempfile.TemporaryDirectory() as scratch:
        results = os.path.join(scratch, "autotune.textproto")
        first = run(f"--xla_gpu_dump_autotune_results_to={results}")
        if first.live_peak_bytes is not None or not os.path.exists(results):
            return first
        return run(f"--xla_gpu_load_autotune_results_from={results}")


def human(size: int | None) -> str:
    """1.5 GiB, 24.0 MiB, 512 B; '-' for None."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


if __name__ == "__main__":
    # python -m kernels.guards.memory OP IMPL CASE_JSON DIRECTION: one measurement, JSON on the last
    # line. The case travels as JSON: it need not be one of the operation's declared cases.
    from kernels.core import environment

    environment.configure()
    op_name, impl_name, case_json, direction_name = sys.argv[1:5]
    fields = json.loads(case_json)
    chosen = registry.make_case(op_name, fields["dtype"], dict(fields["dims"]),
                                params=dict(fields["params"]), variant=fields["variant"])
    use = measure(registry.implementation(op_name, impl_name), chosen, direction_name)
    print(json.dumps(dataclasses.asdict(use)))
