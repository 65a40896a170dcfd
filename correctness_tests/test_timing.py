"""The timer against known answers on the CPU's host clock: callables whose duration is known,
the cold regime's flush seen running between calls, and the stopping rule checked against the
samples it reports."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np
import pytest

from correctness_tests import fakes
from kernels.core import fingerprint, timing

SLEEP_S = 0.004
# A call spins on the host clock until its duration has passed, so it never returns early
# (time.sleep overslept 4 ms by 4 ms on a loaded 2-core machine, in both directions of error).
# What the timer may add to a call's own duration: the call itself, never a flush (the CPU's
# flush writes tens of MB, milliseconds).
OVERHEAD_S = 0.0003


def _spin(seconds: float) -> None:
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def _sleeper(seconds: float = SLEEP_S, log: list | None = None):
    """A callable that takes `seconds` (busy, on the host clock); `log` gets (start, end)."""
    def call():
        start = time.perf_counter()
        _spin(seconds)
        if log is not None:
            log.append((start, time.perf_counter()))
    return call


def _host_timeable(fn, label: str = "sleep") -> timing.Timeable:
    """A plain callable timed by the host clock (the path a torch callable takes on a CPU)."""
    return timing.Timeable(label, "torch", fn, (), on_gpu=False)


@pytest.fixture(scope="module")
def device() -> fingerprint.Fingerprint:
    return fingerprint.fingerprint()


def _rule(**overrides) -> timing.StoppingRule:
    fields = dict(min_samples=5, min_time_s=0.0, max_noise=0.5, time_budget_s=10.0,
                  max_samples=200)
    return timing.StoppingRule(**(fields | overrides))


@pytest.mark.parametrize("regime", timing.REGIMES)
def test_samples_are_each_calls_own_duration(device, regime):
    """Every sample against the duration the call measured of itself: never shorter (a timer
    reading half the time fails), and longer only by a call's overhead (a timer that took the
    cold regime's flush into its span fails). On a busy machine the scheduler stretches both
    alike, so this holds where an absolute bound does not."""
    log: list[tuple[float, float]] = []
    m = timing.time_timeable(_host_timeable(_sleeper(log=log)), regime=regime, rule=_rule(),
                             device=device)
    assert m.method == "host-clock" and m.regime == regime
    own = np.array([end - start for start, end in log[-m.repeats:]])
    samples = np.array(m.samples)
    assert m.min_s >= SLEEP_S  # the call never takes less
    assert np.all(samples >= own), (samples, own)
    assert np.median(samples - own) < OVERHEAD_S, (samples, own)
    assert m.median_s == pytest.approx(np.median(samples))


def test_jax_callable_is_timed_to_its_result(device):
    """A jitted function that sleeps on the host for each call: the JAX host-clock path waits
    for the result (block_until_ready), so the sleep is inside every sample."""
    import jax
    import jax.numpy as jnp

    def slow_identity(x):
        _spin(SLEEP_S)
        return x

    def fn():
        x = jnp.ones(4, jnp.float32)
        return jax.pure_callback(slow_identity, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    timeable = timing.callable_timeable("jax-sleep", fn, "jax")
    m = timing.time_timeable(timeable, regime="hot", rule=_rule(), device=device)
    assert m.method == "host-clock"
    assert m.min_s >= SLEEP_S


def _gaps(log: list[tuple[float, float]]) -> np.ndarray:
    """Time from one call's end to the next call's start."""
    return np.array([later[0] - earlier[1] for earlier, later in itertools.pairwise(log)])


def test_cold_regime_flushes_between_calls_outside_the_timed_span(device):
    """Between two calls the cold regime writes the cache size; the hot regime does nothing.
    Writing that many bytes here takes `fill` seconds: the gaps between cold calls must be at
    least a quarter of it (on a loaded 2-core machine the fill timed here read 2.9 ms and the
    flushes 1.4 ms: the two are timed at different moments), the hot gaps far shorter, and
    the samples must not contain it."""
    nbytes = timing.l2_bytes(device)
    buffer = np.empty(nbytes, np.int8)
    fills = []
    for _ in range(16):
        start = time.perf_counter()
        buffer.fill(2)
        fills.append(time.perf_counter() - start)
    fill = min(fills)  # the cost itself; longer fills are the scheduler's
    logs = {}
    for regime in timing.REGIMES:
        logs[regime] = []
        timing.time_timeable(_host_timeable(_sleeper(0.001, logs[regime])), regime=regime,
                             rule=_rule(), device=device)
    cold, hot = np.median(_gaps(logs["cold"])), np.median(_gaps(logs["hot"]))
    assert cold >= 0.25 * fill, (cold, fill)
    assert hot < 0.25 * cold, (hot, cold)


def _check_stop(m: timing.Measurement, rule: timing.StoppingRule) -> None:
    """The counts the rule passes through are min_samples, then doubling (capped by max_batch
    and max_samples); it stopped at the first that met its criterion, not before or after."""
    counts, n = [], rule.min_samples
    while True:
        counts.append(n)
        if n >= rule.max_samples:
            break
        n = min(rule.max_samples, n + min(rule.max_batch, n))
    assert m.repeats in counts, (m.repeats, counts)
    samples = m.samples

    def converged(k: int) -> bool:
        head = samples[:k]
        return (k >= rule.min_samples and sum(head) >= rule.min_time_s
                and timing.coefficient_of_variation(head) <= rule.max_noise)

    earlier = [k for k in counts if k < m.repeats]
    assert not any(converged(k) for k in earlier), "kept sampling after it had converged"
    if m.stop_reason == "converged":
        assert converged(m.repeats)
    elif m.stop_reason == "max-samples":
        assert m.repeats == rule.max_samples and not converged(m.repeats)


def test_converges_at_the_first_count_with_the_minimum_time(device):
    # Any spread passes (a busy machine stretches some calls 4x): the minimum time decides.
    rule = _rule(min_samples=4, min_time_s=0.03, max_noise=100.0)
    m = timing.time_timeable(_host_timeable(_sleeper()), regime="hot", rule=rule, device=device)
    assert m.stop_reason == "converged"
    assert sum(m.samples) >= 0.03
    _check_stop(m, rule)


def test_stops_at_max_samples_when_noise_never_settles(device):
    rule = _rule(min_samples=5, max_noise=1e-12, max_samples=12)
    m = timing.time_timeable(_host_timeable(_sleeper(0.0005)), regime="hot", rule=rule,
                             device=device)
    assert (m.stop_reason, m.repeats) == ("max-samples", 12)
    _check_stop(m, rule)


def test_stops_when_the_time_budget_is_spent(device):
    rule = _rule(min_samples=3, max_noise=1e-12, time_budget_s=0.05, max_samples=10_000)
    start = time.perf_counter()
    m = timing.time_timeable(_host_timeable(_sleeper(0.01)), regime="hot", rule=rule,
                             device=device)
    elapsed = time.perf_counter() - start
    assert m.stop_reason == "time-budget"
    # 10 ms a call: batches of 3, 3, 6 reach the 50 ms budget after 6 calls, or after 3 where
    # the scheduler stretched them; before the last batch, the samples were within budget.
    assert m.repeats in (3, 6), m.samples
    assert m.repeats == 3 or sum(m.samples[:3]) < rule.time_budget_s
    assert elapsed < 1.0  # warm-up and one batch past the budget, not 10,000 samples
    _check_stop(m, rule)


# The stopping rule and the statistics on exact, made-up samples (no clock involved).
class _Steps:
    """A sampler returning `values` in turn and a clock advancing `dt` per sample from `t0`."""

    def __init__(self, values, dt=0.0, t0=0.0):
        self.values, self.dt, self.now, self.calls = list(values), dt, t0, []

    def take(self, n):
        self.calls.append(n)
        self.now += n * self.dt
        return [self.values[i % len(self.values)] for i in range(n)]

    def clock(self):
        return self.now


@pytest.mark.parametrize("fields", [dict(min_samples=1), dict(min_samples=7, max_samples=7)])
def test_stopping_rule_takes_its_edge_values(fields):
    rule = timing.StoppingRule(**fields)
    assert rule.min_samples == fields["min_samples"]


@pytest.mark.parametrize("fields", [dict(time_budget_s=0.0), dict(max_noise=0.0),
                                    dict(time_budget_s=-1.0)])
def test_stopping_rule_refuses_a_zero_budget_or_noise(fields):
    with pytest.raises(ValueError, match=r"^time_budget_s and max_noise: expected > 0, got "):
        timing.StoppingRule(**fields)


def test_coefficient_of_variation_known_values():
    assert timing.coefficient_of_variation([1.0, 3.0]) == pytest.approx(2**0.5 / 2)
    assert timing.coefficient_of_variation([2.0]) == float("inf")
    assert timing.coefficient_of_variation([0.0, 0.0]) == float("inf")
    assert timing.coefficient_of_variation([1.0, -1.0]) == float("inf")


def test_minimum_time_reached_exactly_converges():
    rule = timing.StoppingRule(min_samples=4, min_time_s=1.0, max_noise=0.5)
    sampler = _Steps([0.25])
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert (reason, len(samples)) == ("converged", 4)


def test_noise_equal_to_the_limit_converges():
    rule = timing.StoppingRule(min_samples=2, min_time_s=0.0,
                               max_noise=timing.coefficient_of_variation([1.0, 3.0]))
    sampler = _Steps([1.0, 3.0])
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert (reason, len(samples)) == ("converged", 2)


def test_time_budget_is_measured_from_the_start_not_from_zero():
    rule = timing.StoppingRule(min_samples=4, max_noise=1e-9, time_budget_s=1.0, max_samples=16)
    sampler = _Steps([1.0, 2.0], dt=0.0, t0=1000.0)  # a clock far from zero that never moves
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert (reason, len(samples)) == ("max-samples", 16)


def test_time_budget_spent_exactly_stops():
    rule = timing.StoppingRule(min_samples=8, max_noise=1e-9, time_budget_s=0.5,
                               max_samples=1000)
    sampler = _Steps([1.0, 2.0], dt=2.0**-4)  # 8 samples: exactly 0.5 s
    samples, reason = timing.collect(sampler, rule, clock=sampler.clock)
    assert (reason, len(samples)) == ("time-budget", 8)


def test_measurement_from_samples_defaults_and_keeps_clocks():
    fields = dict(label="x", method="host-clock", regime="hot", stop_reason="converged",
                  fingerprint={})
    bare = timing.Measurement.from_samples([1.0, 2.0, 3.0], **fields)
    assert bare.sm_clock_mhz == (None, None, None) and bare.throttled == (False, False, False)
    assert bare.throttled_count == 0 and bare.median_s == 2.0 and bare.repeats == 3
    clocked = timing.Measurement.from_samples([1.0, 2.0], clocks=[1980, 1500],
                                              throttled=[False, True], **fields)
    assert clocked.sm_clock_mhz == (1980, 1500) and clocked.throttled == (False, True)
    with pytest.raises(ValueError, match=r"^samples: expected at least one, got none$"):
        timing.Measurement.from_samples([], **fields)


def _largest_cpu_cache() -> int:
    """The largest cache sysfs lists for CPU 0 (read here independently of the timer)."""
    import pathlib

    sizes = []
    for entry in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        sizes.append(int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1], 0))
    return max(sizes, default=timing.CPU_CACHE_FALLBACK_BYTES)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_cold_flush_covers_the_devices_last_level_cache(monkeypatch, device, platform,
                                                       framework):
    """The cold regime's flush writes at least the device's L2 (a GPU's, from its
    fingerprint; the CPU's largest cache up to CPU_FLUSH_MAX_BYTES, since a VM may report its
    host's whole L3), whichever framework times the call; the hot regime writes nothing. A
    GPU's samplers are built from the same size (`l2_bytes`)."""
    flushes = []

    def recording_flush(nbytes, *args, **kwargs):
        flushes.append(nbytes)
        return lambda: None

    for name in ("jax_flush", "jax_host_flush", "numpy_flush", "torch_flush"):
        monkeypatch.setattr(timing, name, recording_flush)
    target = fakes.gpu_fingerprint(l2_bytes=60 << 20) if platform == "gpu" else device
    cache = target.l2_bytes if platform == "gpu" else min(_largest_cpu_cache(),
                                                          timing.CPU_FLUSH_MAX_BYTES)
    assert timing.l2_bytes(target) >= cache
    timeable = timing.Timeable("nothing", framework, lambda: None, (), on_gpu=False)
    _, method = timing.make_sampler(timeable, "cold", target)
    assert method == "host-clock"
    assert len(flushes) == 1 and flushes[0] >= cache, (flushes, cache)
    timing.make_sampler(timeable, "hot", target)
    assert len(flushes) == 1


def test_a_gpu_with_no_known_l2_refuses_the_cold_regime():
    with pytest.raises(RuntimeError, match=r"cannot flush L2 on Test GPU: its L2 size is unknown"):
        timing.l2_bytes(fakes.gpu_fingerprint(l2_bytes=0))


def test_stopping_rule_defaults_are_the_documented_ones(monkeypatch):
    """docs/profiling.md, "Timing": converged under 0.5% CV after 20 samples and 20 ms,
    else a 3 s budget on a GPU or 10,000 samples; launch cost over 20 calls."""
    monkeypatch.delenv("KERNELPERF_TIME_BUDGET", raising=False)
    rule = timing.StoppingRule()
    assert (rule.max_noise, rule.min_samples, rule.min_time_s, rule.max_samples) == \
        (0.005, 20, 0.02, 10_000)
    assert timing.default_rule(fakes.gpu_fingerprint(50 << 20)).time_budget_s == 3.0
    assert timing.LAUNCH_CALLS == 20


def test_robust_cv_is_1_4826_mads_over_the_median_and_inf_where_undefined():
    assert timing.robust_cv([]) == timing.robust_cv([5.0]) == math.inf
    assert timing.robust_cv([0.0, 0.0, 0.0]) == timing.robust_cv([-1.0, 1.0]) == math.inf
    assert timing.robust_cv([0.5, 0.5]) == 0.0  # a median under 1 is a median
    assert timing.robust_cv([1.0, 2.0]) == pytest.approx(1.4826 * 0.5 / 1.5)  # two suffice
    assert timing.robust_cv([1.0, 2.0, 3.0]) == pytest.approx(1.4826 * 1.0 / 2.0)
    assert timing.robust_cv([10.0, 11.0, 12.0, 1000.0]) == pytest.approx(1.4826 * 1.0 / 11.5)


def test_the_medians_halfwidth_is_z_standard_errors_and_shrinks_as_the_root_of_n():
    def expected(samples, z=timing.Z99):
        return z * timing.MEDIAN_SE_FACTOR * timing.robust_cv(samples) / math.sqrt(len(samples))

    assert timing.median_halfwidth([1.0]) == timing.median_halfwidth([]) == math.inf
    for samples in ([1.0, 2.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0] * 4):
        assert timing.median_halfwidth(samples) == pytest.approx(expected(samples))
    assert timing.median_halfwidth([1.0, 2.0, 3.0], z=1.0) == pytest.approx(
        expected([1.0, 2.0, 3.0], z=1.0))
    assert timing.median_halfwidth([1.0, 2.0, 3.0] * 4) == pytest.approx(
        timing.median_halfwidth([1.0, 2.0, 3.0]) / 2)  # 4x the samples, half the width


# -- what a harness reads as time: the device clock ---------------------------------------------

def test_device_clock_rounds_are_the_loaded_samples_in_order():
    """pytest-benchmark's pedantic reads timer() before and after each round: each round of a
    loaded clock must last exactly the next sample, in the order they were taken, whatever
    the clock read before (`advance`, an earlier load); a round past the last sample is an
    error, not a zero-length round."""
    clock = timing.DeviceClock()
    assert (clock.read(), clock.pending) == (0.0, 0)
    clock.advance(0.25)
    clock.advance(0.5)
    assert clock.read() == 0.75  # advance adds one sample's time to the clock
    samples = [0.375, 0.125, 0.25]  # binary fractions: every sum is exact
    clock.load(samples)
    assert clock.pending == 3
    rounds = []
    for _ in samples:
        before = clock.read()
        clock.step()
        rounds.append(clock.read() - before)
    assert rounds == samples and clock.pending == 0
    assert clock.read() == sum(samples)  # from zero again: the load restarted the clock
    with pytest.raises(RuntimeError, match=r"^DeviceClock: no device samples left; pedantic ran "
                                           r"more rounds than the measurement has samples$"):
        clock.step()


# -- the cold flush's size on a CPU, from a made-up sysfs --------------------------------------

@pytest.mark.parametrize(("sizes", "expected"), [
    ({0: "32K", 1: "48K", 2: "1280K"}, 1280 << 10),  # the largest, in KiB
    ({0: "48K", 1: "2M", 2: "12M"}, 12 << 20),  # in MiB
    ({0: "48K", 1: "3000000"}, 3_000_000),  # no suffix: bytes
    ({0: "32K", 1: "512M"}, timing.CPU_FLUSH_MAX_BYTES),  # a VM's host's L3: capped
    ({}, min(timing.CPU_CACHE_FALLBACK_BYTES, timing.CPU_FLUSH_MAX_BYTES)),  # nothing listed
])
def test_cpu_flush_size_is_the_largest_cache_sysfs_lists(monkeypatch, sizes, expected):
    """A CPU's cold flush writes its largest cache as sysfs gives it (cpu0's cache/indexN/size:
    "48K", "2M", or plain bytes), capped at CPU_FLUSH_MAX_BYTES, and the fallback size where
    sysfs lists none (a container without /sys): a size misread by its suffix would leave
    the inputs in the cache, or write far more than it holds."""
    import builtins
    import io

    prefix = "/sys/devices/system/cpu/cpu0/cache/index"

    def fake_open(path, *args, **kwargs):
        if isinstance(path, str) and path.startswith(prefix):
            index = int(path.removeprefix(prefix).split("/")[0])
            if index not in sizes:
                raise FileNotFoundError(path)
            return io.StringIO(sizes[index] + "\n")
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(timing, "open", fake_open, raising=False)  # the module's own `open`
    cpu = dataclasses.replace(fakes.gpu_fingerprint(), platform="cpu", l2_bytes=0)
    assert timing.l2_bytes(cpu) == expected


# -- Timeables made from a callable or an implementation ---------------------------------------

def test_a_torch_callable_is_timed_as_it_is_on_this_machines_device():
    """A torch callable runs as given, on the arguments given, in torch (timed by torch's
    clocks), and is on a GPU exactly when torch sees one."""
    import torch

    def add(a, b):
        return a + b

    timeable = timing.callable_timeable("add", add, "torch", (2, 3))
    assert (timeable.label, timeable.framework) == ("add", "torch")
    assert timeable.on_gpu is torch.cuda.is_available()
    assert timeable.fn(*timeable.args) == 5


def test_a_jax_callable_is_compiled_once_and_a_jitted_one_kept_as_it_is():
    """A plain JAX function is jitted: its Python body runs once (tracing), not per timed call,
    so the host's Python is not timed; a function jitted already keeps its own jit (here its
    static argument, which a second jit around it would turn into a tracer)."""
    import jax
    import jax.numpy as jnp

    from kernels.core import compat

    traces = []

    def double(x):
        traces.append(1)
        return x * 2

    timeable = timing.callable_timeable("double", double, "jax", (jnp.ones(3),))
    assert (timeable.label, timeable.framework) == ("double", "jax")
    assert timeable.on_gpu is compat.on_gpu()
    for _ in range(3):
        np.testing.assert_array_equal(timeable.fn(*timeable.args), np.full(3, 2.0))
    assert len(traces) == 1
    scaled = jax.jit(lambda x, n: x * n, static_argnums=1)
    kept = timing.callable_timeable("scale", scaled, "jax", (jnp.ones(2), 3))
    np.testing.assert_array_equal(kept.fn(*kept.args), np.full(2, 3.0))


def _made_up_implementation(framework: str, differentiable: bool = True):
    """A softmax implementation that scales by its case's `scale` parameter: its output shows
    whether the case's parameters reached it."""
    from kernels.core import registry

    def fn(x, scale, mesh):
        return x * scale

    return registry.Implementation(op="softmax", name=f"scaled-{framework}", fn=fn,
                                   framework=framework, differentiable=differentiable)


def _scaled_case(mesh: str = "1x1"):
    from kernels.core import registry

    return registry.make_case("softmax", "f32", {"rows": 4, "cols": 8},
                              params={"scale": 3.0, "mesh": mesh})


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_prepare_times_the_implementation_on_the_cases_inputs_and_parameters(framework):
    """Forward and backward timeables of an implementation: labelled by implementation, case
    and direction, in its framework, on this machine's device, computing fn(*inputs,
    **case.kwargs) (its VJP for the backward, repeatable: the benchmark calls it many times);
    a forward of an implementation that has no backward is timed too."""
    from kernels.core import checking, compat, frameworks, registry

    impl, case = _made_up_implementation(framework), _scaled_case()
    (x,) = checking.make_inputs(registry.operation("softmax"), case, 0, "normal")

    def numpy(value):
        return frameworks.torch_to_numpy(value) if framework == "torch" else np.asarray(value)

    on_gpu = compat.on_gpu() if framework == "jax" else __import__("torch").cuda.is_available()
    for direction in ("fwd", "bwd"):
        timeable = timing.prepare(impl, case, direction=direction)
        assert timeable.label == f"softmax-scaled-{framework} {case.id} {direction}"
        assert timeable.framework == framework and timeable.on_gpu is on_gpu
        for _ in range(2):  # a backward twice: torch frees a graph not retained
            out = timeable.fn(*timeable.args)
        if direction == "fwd":
            np.testing.assert_allclose(numpy(out), 3.0 * x, rtol=1e-6)  # default seed: 0
        else:
            cotangent = timing._cotangent(x.shape, np.dtype("float32"), 0)
            np.testing.assert_allclose(numpy(out[0]), 3.0 * cotangent, rtol=1e-6)
    forward_only = timing.prepare(_made_up_implementation(framework, differentiable=False), case)
    np.testing.assert_allclose(numpy(forward_only.fn(*forward_only.args)), 3.0 * x, rtol=1e-6)


def test_prepare_counts_a_meshed_cases_devices_in_both_directions():
    """The device count of a case whose `mesh` spans several devices is kept forward and
    backward: it picks the device clock over CUPTI's single-device timer."""
    impl = _made_up_implementation("jax")
    for direction in ("fwd", "bwd"):
        assert timing.prepare(impl, _scaled_case("2x1"), direction=direction).devices == 2


def test_measure_times_the_prepared_implementation_as_asked(monkeypatch):
    """measure is time_timeable of prepare(impl, case, direction, seed, inputs) in the regime
    and by the rule given: each argument reaches the part that reads it, and by default it
    times the forward, cold, of the inputs from seed 0 (those the correctness checks use)."""
    prepared = []

    def fake_prepare(impl, case, *, direction="fwd", seed=0, inputs=None):
        prepared.append((impl, case, direction, seed, inputs))
        return _host_timeable(lambda: None, label=f"{impl}/{case}/{direction}")

    monkeypatch.setattr(timing, "prepare", fake_prepare)
    rule = timing.StoppingRule(min_samples=3, max_samples=3)
    m = timing.measure("impl", "case", "bwd", "hot", rule=rule, seed=7, inputs=("x",))
    assert prepared == [("impl", "case", "bwd", 7, ("x",))]
    assert (m.label, m.regime, m.repeats) == ("impl/case/bwd", "hot", 3)
    default = timing.measure("impl", "case", rule=rule)
    assert prepared[-1] == ("impl", "case", "fwd", 0, None)
    assert default.regime == "cold"


def test_time_timeable_reports_what_it_timed_with_the_clocks_around_it(monkeypatch):
    """The measurement names its timeable, the device it was given (its fingerprint, and the
    SM clock read before the first sampled batch and after the last), and per sample the
    lower clock around its batch and whether that is throttled; left out, the regime is cold
    and the rule the device's default (KERNELPERF_TIME_BUDGET)."""
    reads = itertools.count()
    mhz = {0: 1980, 1: 1970, 2: 1000, 3: 1990}  # warm-up's two reads, then the sampled batch's

    def read_clocks():
        return fingerprint.Clocks(sm_mhz=mhz.get(next(reads), 1990), memory_mhz=2619)

    monkeypatch.setattr(fingerprint, "read_clocks", read_clocks)
    monkeypatch.setenv("KERNELPERF_TIME_BUDGET", "0.05")
    gpu = fakes.gpu_fingerprint()
    monkeypatch.setattr(timing, "numpy_flush", lambda nbytes: lambda: None)  # no 60 MB writes
    m = timing.time_timeable(_host_timeable(_sleeper(0.0002), "the-op"), device=gpu)
    assert (m.label, m.regime, m.method) == ("the-op", "cold", "host-clock")
    assert m.stop_reason in ("converged", "time-budget") and m.repeats >= 20
    assert m.fingerprint["name"] == "Test GPU"
    assert m.fingerprint["clocks_before"] == {"sm_mhz": 1000, "memory_mhz": 2619,
                                              "temperature_c": None}
    assert m.fingerprint["clocks_after"]["sm_mhz"] == 1990
    assert m.sm_clock_mhz[:20] == (1000,) * 20  # the first batch: 20 samples, the 1000 read
    assert m.throttled[:20] == (True,) * 20 and not any(m.throttled[20:])


def test_launch_overhead_waits_for_each_jax_batch_outside_the_timed_span(monkeypatch):
    """Launch overhead issues the timeable's calls on its own arguments and waits for the last
    one's result after each sample (JAX: block_until_ready on it), so no sample starts with
    the device busy; the result is labelled host-launch, hot, with the device's fingerprint,
    and with no rule it follows the device's default one."""
    import jax
    import jax.numpy as jnp

    waited = []
    real_wait = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or real_wait(x))
    monkeypatch.setenv("KERNELPERF_TIME_BUDGET", "0.05")
    issued = []

    def add(a, b):
        out = a + b
        issued.append(out)
        return out

    timeable = timing.Timeable("add", "jax", add, (jnp.ones(2), jnp.ones(2)), on_gpu=False)
    gpu = fakes.gpu_fingerprint()
    m = timing.launch_overhead(timeable, device=gpu, calls=3)
    assert (m.label, m.method, m.regime) == ("add", "host-launch", "hot")
    assert m.stop_reason in ("converged", "time-budget", "max-samples") and m.repeats >= 20
    assert m.fingerprint == gpu.to_dict()
    assert len(issued) == 3 * (m.repeats + timing.WARMUP_CALLS)
    assert len(waited) == m.repeats + timing.WARMUP_CALLS
    assert all(w is issued[3 * i + 2] for i, w in enumerate(waited))  # each batch's last call


def _counting_flush(log: list):
    """A flush factory for make_sampler's monkeypatched flushes: logs its size when made and
    "flush" each time it runs."""
    def make(nbytes, *args, **kwargs):
        log.append(("made", nbytes, *args))
        return lambda: log.append("flush")
    return make


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_the_cold_flush_runs_before_every_host_clock_sample(monkeypatch, framework):
    """On the host clock every sample of the cold regime follows its own flush, and the timed
    call is the timeable's function on the timeable's arguments, whichever framework."""
    import jax.numpy as jnp

    log: list = []
    for name in ("jax_flush", "jax_host_flush", "numpy_flush"):
        monkeypatch.setattr(timing, name, _counting_flush(log))
    args = (jnp.ones(2),) if framework == "jax" else (np.ones(2),)
    timeable = timing.Timeable("call", framework, lambda x: log.append(("call", x)) or x, args,
                               on_gpu=False)
    sampler, _ = timing.make_sampler(timeable, "cold", fakes.gpu_fingerprint(1 << 20))
    sampler.take(3)
    assert log[0] == ("made", 1 << 20)
    assert [e if e == "flush" else e[0] for e in log[1:]] == ["flush", "call"] * 3
    assert all(e[1] is args[0] for e in log[1:] if e != "flush")


def test_jax_flushes_write_the_size_asked_and_the_host_clocks_waits(monkeypatch):
    """The host clock's JAX flush waits for its write (else the write runs into the timed
    call), CUPTI's does not (its session records the flush's kernels before the call); the
    several-device flush writes `nbytes` on each device given, at once, and waits."""
    import jax

    waited = []
    real_wait = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or real_wait(x))
    written = timing.jax_flush(4096)()
    assert len(waited) == 1 and written.nbytes == 4096
    assert timing.jax_flush(4096, wait=False)().nbytes == 4096 and len(waited) == 1
    devices = jax.devices()[1:3]  # not the default device
    writes = timing.jax_flush_devices(4096, devices)()
    assert len(waited) == 2 and waited[1] is writes
    assert [w.nbytes for w in writes] == [4096, 4096]
    assert [list(w.devices()) for w in writes] == [[d] for d in devices]
    in_place = timing.jax_host_flush(4096)()  # a CPU's host clock: waits for its write too
    assert len(waited) == 3 and in_place.nbytes == 4096


def test_the_torch_flush_writes_its_size_on_the_gpu(monkeypatch):
    """The torch flush is a buffer of `nbytes` bytes on the GPU that each call overwrites
    (faked on the CPU: torch.empty is asked for CUDA and given host memory)."""
    import torch

    asked = []
    real_empty = torch.empty

    def empty(size, *, dtype, device):
        asked.append(device)
        return real_empty(size, dtype=dtype)

    monkeypatch.setattr(torch, "empty", empty)
    flush = timing.torch_flush(4096)
    buffer = flush()
    assert asked == ["cuda"]
    assert buffer.numel() * buffer.element_size() == 4096 and bool((buffer == 0).all())


class _FakeEvents:
    """torch.cuda.Event on a simulated device clock (seconds), which the flush and the call
    advance by their own durations: samples are exact, whatever the host's load."""

    def __init__(self):
        self.now = 0.0
        clock = self

        class Event:
            def __init__(self, enable_timing: bool):
                assert enable_timing
                self.at = None

            def record(self):
                self.at = clock.now

            def elapsed_time(self, end) -> float:  # milliseconds, as CUDA events give them
                return (end.at - self.at) * 1e3

        self.Event = Event

    def run(self, seconds: float):
        self.now += seconds


def test_cuda_events_time_each_call_and_leave_the_flush_out(monkeypatch):
    """Asked for cuda-events, torch work on a GPU is timed between an event pair around each
    call, its own arguments given, the cold flush before the start event; on the GPU's
    clocks (throttle flags read against the device given). Events faked on a simulated
    clock: the flush takes 3 ms, the call 1 ms."""
    import torch

    events = _FakeEvents()
    monkeypatch.setenv(timing.TORCH_TIMER_VARIABLE, "cuda-events")
    monkeypatch.setattr(torch.cuda, "Event", events.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "torch_flush", lambda nbytes: lambda: events.run(3e-3))
    monkeypatch.setattr(fingerprint, "read_clocks", lambda: fingerprint.Clocks(sm_mhz=1000))
    timeable = timing.Timeable("op", "torch", events.run, (1e-3,), on_gpu=True)
    sampler, method = timing.make_sampler(timeable, "cold", fakes.gpu_fingerprint())
    assert method == "cuda-events"
    assert sampler.take(3) == pytest.approx([1e-3] * 3)
    assert events.now == pytest.approx(3 * (3e-3 + 1e-3))  # each call after its own flush
    assert sampler.throttled == [True] * 3


class _SilentCuptiSession:
    """A CUPTI session that records nothing: the call launched no kernel."""

    def start(self):
        pass

    def stop(self):
        return []


def test_torch_cupti_waits_for_the_device_and_names_the_call(monkeypatch):
    """torch work timed by CUPTI synchronizes the device before each session stops (torch's
    kernels are asynchronous), and a call that launched no kernel is named in the error."""
    import torch

    from kernels.core import compat

    monkeypatch.delenv(timing.TORCH_TIMER_VARIABLE, raising=False)
    monkeypatch.setattr(timing, "_TRACED", False)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(1))

    monkeypatch.setattr(compat, "cupti_session", _SilentCuptiSession)
    timeable = timing.Timeable("torch-view", "torch", lambda: None, (), on_gpu=True)
    sampler, method = timing.make_sampler(timeable, "hot", fakes.gpu_fingerprint())
    assert method == "cupti" and synced == [1]  # the compiling call, waited for
    with pytest.raises(timing.NoKernel, match=r"^CUPTI recorded no kernel for torch-view:"):
        sampler.take(1)
    assert synced == [1, 1]


def test_jax_cupti_names_the_call_that_launched_no_kernel(monkeypatch):
    from kernels.core import compat

    monkeypatch.setattr(timing, "_TRACED", False)

    monkeypatch.setattr(compat, "cupti_session", _SilentCuptiSession)
    timeable = timing.Timeable("jax-view", "jax", lambda: None, (), on_gpu=True)
    sampler, method = timing.make_sampler(timeable, "hot", fakes.gpu_fingerprint())
    assert method == "cupti"
    with pytest.raises(timing.NoKernel, match=r"^CUPTI recorded no kernel for jax-view:"):
        sampler.take(1)
