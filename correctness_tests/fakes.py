"""Made-up things the tests share, so that none needs the real one: a GPU's fingerprint and
machines, an array-like with only a shape, a softmax with a planted gradient error, a matmul
that runs in TF32 on a CPU, and asv results (values, and a results folder as asv writes it).

Not a test module (pytest collects test_*.py only); the tests import it as
`from correctness_tests import fakes`. Third-party packages (jax, asv) are imported where
they are used, so a test that needs none of them imports this module without them.
"""

from __future__ import annotations

import json
from pathlib import Path

from kernels.core import devices, fingerprint

# The machine devices.this_machine() describes on one H100.
H100 = devices.Machine(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", device_count=1,
                       compute_capability=(9, 0))


def cpu_machine(device_count: int) -> devices.Machine:
    """A CPU machine with `device_count` JAX host devices."""
    return devices.Machine(platform="cpu", device_kind="cpu", device_count=device_count,
                           compute_capability=None)


def gpu_fingerprint(l2_bytes: int = 60 << 20) -> fingerprint.Fingerprint:
    """A made-up GPU ("Test GPU": 132 SMs, 80 GiB, compute capability 9.0, a fixed 1980 MHz
    clock) with `l2_bytes` of L2: the timer reads its sampler, flush size and time budget from
    the fingerprint, so no GPU is needed."""
    return fingerprint.Fingerprint(
        platform="gpu", name="Test GPU", model="test-gpu", sm_count=132, memory_bytes=80 << 30,
        l2_bytes=l2_bytes, compute_capability="90", driver="580", cuda="13.0",
        default_sm_mhz=1980, max_sm_mhz=1980, versions=())


class Shape:
    """An array-like with a shape and nothing else (a JAX array has no strides), or with
    torch's `stride()` when `strides` is given: what validation.check_index_range reads,
    at sizes no test could allocate."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...] | None = None):
        self.shape = shape
        if strides is not None:
            self.stride = lambda: strides


def softmax_with_scaled_gradient(scale: float):
    """A correct jax softmax over the last axis whose VJP is multiplied by `scale`: a gradient
    error of exactly |scale - 1| in norm and in max, the output untouched."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    def forward(x):
        y = softmax(x)
        return y, y

    def backward(y, dy):
        dx = y * (dy - jnp.sum(y * dy, axis=-1, keepdims=True))
        return (dx * scale,)

    softmax.defvjp(forward, backward)
    return softmax


def to_tf32(x):
    """float32 `x` rounded to TF32's 10 mantissa bits (to nearest, ties to even), as float32:
    what tensor cores read of a float32 operand in TF32 mode (jnp, so it runs under jit)."""
    import jax
    import jax.numpy as jnp

    bits = jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)
    dropped = 23 - 10
    odd = (bits >> dropped) & 1  # ties to even: round up a half only onto an even result
    rounded = (bits + (1 << (dropped - 1)) - 1 + odd) & ~jnp.uint32((1 << dropped) - 1)
    return jax.lax.bitcast_convert_type(rounded, jnp.float32)


def tf32_matmul(a, b):
    """a @ b with both operands rounded to TF32 and float32 products and sums: a matmul that
    runs in TF32, on a CPU. Differentiable: the rounding passes gradients straight through,
    so the backward's products see one rounded operand each, as a TF32 backward's do."""
    import jax
    import jax.numpy as jnp

    def rounded(x):
        return x + jax.lax.stop_gradient(to_tf32(x) - x)

    return jnp.matmul(rounded(a), rounded(b), precision=jax.lax.Precision.HIGHEST)


def asv_result(samples: list[float]):
    """An asv_tools.Result of timing `samples`, with the value and statistics asv computes
    from them (asv_runner's compute_stats)."""
    from asv_runner import statistics

    from kernels.bench import asv_tools

    value, stats = statistics.compute_stats(samples, 1)
    return asv_tools.Result(value, samples, stats)


def asv_timed(center: float, spread: float, n: int = 20, seed: int = 0):
    """asv_result of `n` samples drawn normal around `center` with deviation `spread`."""
    import numpy as np

    return asv_result(list(center + spread * np.random.default_rng(seed).standard_normal(n)))


def asv_result_file(root: Path, machine: str, commit: str, rows: dict[str, list],
                    columns: tuple[str, ...] = ("result", "params", "version",
                                                "started_at"),
                    params: dict[str, str] | None = None, date: int = 1) -> Path:
    """`commit`'s result file of `machine` in the asv results folder `root` (its
    machine.json too), as asv 0.6 stores it: `rows` maps a benchmark to its row, one entry
    per name in `columns`; `params` are machine keys asv copied in beside the name; `date`
    the commit's (ms, asv orders a machine's history by it)."""
    (root / machine).mkdir(parents=True, exist_ok=True)
    (root / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    path = root / machine / f"{commit[:8]}-env.json"
    path.write_text(json.dumps({
        "commit_hash": commit, "env_name": "env", "date": date, "python": "3.12",
        "params": {"machine": machine, **(params or {})}, "requirements": {}, "env_vars": {},
        "durations": {},
        "version": 2, "result_columns": list(columns), "results": rows}))
    return path


def asv_results_folder(root: Path, machine: str, listing: dict,
                       results: dict[str, dict[str, tuple]]) -> Path:
    """An asv results folder at `root`: `machine`'s machine.json, `listing` as
    benchmarks.json, and per commit a result file whose rows are
    benchmark -> (params, version, started_at), every value 1.0."""
    (root / machine).mkdir(parents=True)
    (root / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    for commit, rows in results.items():
        asv_result_file(root, machine, commit, {
            name: [[1.0] * len(params[0]), params, version, started]
            for name, (params, version, started) in rows.items()})
    (root / "benchmarks.json").write_text(json.dumps({**listing, "version": 2}))
    return root


class Clock:
    """A stand-in for the `time` module that moves only when slept on (or when a test moves
    `now`). Waiting past every limit a supervisor has (hours) fails the test at once,
    rather than hanging it."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    perf_counter = monotonic

    def time(self):
        return 1.7e9 + self.now

    def sleep(self, seconds):
        self.now += seconds
        assert self.now < 1000.0 + 10_000, "waited past every limit"
