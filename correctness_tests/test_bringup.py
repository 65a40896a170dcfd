"""The bring-up (`python -m kernels bringup`, kernels.bench.bringup) on CPU with fakes: the
interleaved measurement, floors from measured ratios and spreads, the never-loosen rule, the
table and diff, resumption after a cut, each model's data kept to itself, and the one-line
refusal where there is no NVIDIA GPU."""

from __future__ import annotations

import pytest

from correctness_tests import fakes
from kernels.bench import perfcheck
from kernels.core import registry, timing

H100 = "NVIDIA H100 80GB HBM3"
H100_KEY = "nvidia-h100-80gb-hbm3"


# -- the interleaved measurement ----------------------------------------------------------------

class _World:
    """A device whose speed changes by stretch: `slow` maps a round index to a factor every
    call in that round takes (a throttled stretch), rounds counted by the takes so far."""

    def __init__(self, names: int, slow: dict[int, float] | None = None):
        self.names, self.slow = names, slow or {}
        self.takes, self.log = 0, []

    def factor(self) -> float:
        return self.slow.get(self.takes // self.names, 1.0)


class _Inner:
    def __init__(self, name: str, seconds: float, world: _World, fail_at: int | None = None):
        self.name, self.seconds, self.world, self.fail_at = name, seconds, world, fail_at
        self.calls = 0

    def take(self, n: int) -> list[float]:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        if n == timing.WARMUP_CALLS and self.calls == 1:
            self.world.log.append((self.name, "warmup"))
            return [self.seconds] * n
        factor = self.world.factor()
        self.world.takes += 1
        self.world.log.append((self.name, factor))
        return [self.seconds * factor] * n


def _sampler_for(inners: dict[str, _Inner], methods: dict[str, str] | None = None):
    def make(timeable, regime, device):
        inner = inners[timeable.label]
        return timing._ClockedSampler(inner, device), (methods or {}).get(timeable.label,
                                                                          "cupti")
    return make


def _timeables(*names: str) -> dict[str, timing.Timeable]:
    return {name: timing.Timeable(name, "jax", lambda: None, (), on_gpu=True) for name in names}


# One batch a round: three samples (nine over three rounds) add up past min_time_s at once.
RULE = timing.StoppingRule(time_budget_s=3.0, min_samples=9, min_time_s=1e-6)


def test_interleaved_rounds_keep_a_throttled_stretch_out_of_the_ratio():
    """Round 2 runs 30% slow for every implementation: each round's ratio is still the true
    one (baseline 1.5 ms over kernel 1.0 ms), though the kernel's own median moved."""
    world = _World(names=3, slow={1: 1.3})
    inners = {"k": _Inner("k", 1e-3, world), "xla": _Inner("xla", 1.5e-3, world),
              "torch": _Inner("torch", 2e-3, world)}
    result = perfcheck.interleave(_timeables("k", "xla", "torch"), first="k", rounds=3,
                                  rule=RULE, device=fakes.gpu_fingerprint(),
                                  sampler_for=_sampler_for(inners))
    assert [r["k"] for r in result.rounds] == pytest.approx([1e-3, 1.3e-3, 1e-3])
    assert result.ratios() == pytest.approx((1.5, 1.5, 1.5))
    assert result.ratios("torch") == pytest.approx((2.0, 2.0, 2.0))
    assert result.kernel.repeats == 3 * 3 and set(result.baselines) == {"xla", "torch"}
    assert result.kernel.method == "cupti" and not result.errors


def test_each_round_reverses_the_order_after_one_warm_up_each():
    world = _World(names=3)
    inners = {name: _Inner(name, 1e-3, world) for name in ("k", "a", "b")}
    perfcheck.interleave(_timeables("a", "k", "b"), first="k", rounds=3, rule=RULE,
                         device=fakes.gpu_fingerprint(), sampler_for=_sampler_for(inners))
    order = [name for name, what in world.log if what != "warmup"]
    assert [name for name, what in world.log if what == "warmup"] == ["a", "k", "b"]
    assert order == ["k", "a", "b", "b", "a", "k", "k", "a", "b"]


def test_a_failing_baseline_is_named_and_dropped_and_a_failing_kernel_raises():
    world = _World(names=2)
    inners = {"k": _Inner("k", 1e-3, world), "xla": _Inner("xla", 2e-3, world, fail_at=3)}
    result = perfcheck.interleave(_timeables("k", "xla"), first="k", rounds=3, rule=RULE,
                                  device=fakes.gpu_fingerprint(),
                                  sampler_for=_sampler_for(inners))
    assert result.errors == {"xla": "RuntimeError: xla broke"}
    assert result.baselines == {} and result.ratios() == (None, None, None)
    inners = {"k": _Inner("k", 1e-3, world, fail_at=2), "xla": _Inner("xla", 2e-3, world)}
    with pytest.raises(RuntimeError, match="k broke"):
        perfcheck.interleave(_timeables("k", "xla"), first="k", rounds=2, rule=RULE,
                             device=fakes.gpu_fingerprint(), sampler_for=_sampler_for(inners))


def test_a_baseline_of_another_clock_is_never_a_ratios_peer():
    world = _World(names=2)
    inners = {"k": _Inner("k", 1e-3, world), "torch": _Inner("torch", 0.5e-3, world)}
    result = perfcheck.interleave(_timeables("k", "torch"), first="k", rounds=2, rule=RULE,
                                  device=fakes.gpu_fingerprint(),
                                  sampler_for=_sampler_for(inners, {"torch": "cuda-events"}))
    assert result.ratios() == (None, None) and result.ratios("torch") == (None, None)
    assert result.baselines["torch"].method == "cuda-events"


def test_a_perf_session_measures_an_item_interleaved_once(monkeypatch):
    op = registry.operation("softmax")
    impl, case = registry.implementation("softmax", "pallas"), op.case("f32-256x1024")
    peers = [p for p in registry.implementations("softmax") if p.baseline][:2]
    prepared = []

    def prepare(implementation, for_case, *, direction, inputs):
        prepared.append(implementation.name)
        if implementation is peers[1]:
            raise ValueError("no such layout")
        return timing.Timeable(implementation.name, "jax", lambda: None, (), on_gpu=True)

    monkeypatch.setattr(timing, "prepare", prepare)
    monkeypatch.setattr(perfcheck, "baselines_for", lambda kernel, for_case, direction: peers)
    monkeypatch.setattr(perfcheck.PerfSession, "_inputs_for", lambda self, for_case: ())
    world = _World(names=2)
    inners = {impl.name: _Inner(impl.name, 1e-3, world),
              peers[0].name: _Inner(peers[0].name, 2e-3, world)}
    session = perfcheck.PerfSession(fakes.gpu_fingerprint(), RULE)
    first = session.measure_interleaved(impl, case, "fwd", rounds=2,
                                        sampler_for=_sampler_for(inners))
    assert session.measure_interleaved(impl, case, "fwd", rounds=2) is first
    assert prepared == [impl.name, peers[0].name, peers[1].name]
    assert first.ratios() == pytest.approx((2.0, 2.0))
    assert first.errors == {peers[1].name: "ValueError: no such layout"}
