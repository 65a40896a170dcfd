"""The timer against known answers on the CPU's host clock: callables whose duration is known,
the cold regime's flush seen running between calls, and the stopping rule checked against the
samples it reports."""

from __future__ import annotations

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

    for name in ("jax_flush", "numpy_flush", "torch_flush"):
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
    """README, "Timing and the roofline": converged under 0.5% CV after 20 samples and 20 ms,
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

    assert timing.median_halfwidth([1.0]) == math.inf
    for samples in ([1.0, 2.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0] * 4):
        assert timing.median_halfwidth(samples) == pytest.approx(expected(samples))
    assert timing.median_halfwidth([1.0, 2.0, 3.0], z=1.0) == pytest.approx(
        expected([1.0, 2.0, 3.0], z=1.0))
    assert timing.median_halfwidth([1.0, 2.0, 3.0] * 4) == pytest.approx(
        timing.median_halfwidth([1.0, 2.0, 3.0]) / 2)  # 4x the samples, half the width
