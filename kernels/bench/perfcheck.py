"""Performance checks for pytest: which kernels are timed, their verdict against a floor, and
the device clock that feeds pytest-benchmark.

`perf_tests/tests/test_performance.py` times each of our kernels (not baselines) on
the operation's "bench" cases for this platform, forward and backward,
together with the operation's baselines in the same process (each measured
once per session), through `kernels.core.timing`. `judge` then compares the kernel
with its floor for this GPU model (`kernels.roofline.floors`): a fraction of
the datasheet roofline, or of the best baseline timed by the same clock.
Measurements taken by different methods ("cupti", "cuda-events",
"host-clock"), or of different precisions (FP32, TF32, ...: kernels.core.precisions), are
never compared; where a floor needs a baseline and none of the kernel's precision was timed
by the kernel's method, the verdict is a refusal that names them.

`interleave` (and `PerfSession.measure_interleaved`) times a kernel and its baselines in
rounds, kernel and baselines alternating (K B1 B2, B2 B1 K, K B1 B2, ...), every sampler made
and warmed up once, so a throttled or busy stretch moves both sides of a ratio rather than
one: each round gives its own ratio, and their spread is what a floor's margin is taken
from (`python -m kernels bringup`, kernels.bench.bringup).

pytest-benchmark records each measurement with device time as its clock:
`record` replays the measurement's samples through `benchmark.pedantic`, one
round per sample, with `device_time` as the timer (a clock that advances only
by a device sample), so its statistics, saved history and
`--benchmark-compare-fail` are about device time, not Python's wall clock.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kernels.core import checking, devices, environment, fingerprint, registry, timing
from kernels.roofline import ceilings, floors, model

# Seconds of sampling per measurement (wall time, flushes included): one timed point per
# kernel and baseline. In `pytest -m gpu` the perf items sample alone on the device after
# the rest of the run (kernels/testing/perf_phase.py), so the sampling is the run's serial
# share: about 185 measurements on an H200, and 1.0 s each was most of the H100's 188 s warm
# perf run. 0.5 s still holds 20 samples of the slowest kernel (a 7 ms attention backward
# with its flushes) and hundreds of most others, far more than a floor's margin needs.
BUDGET_VARIABLE = "KERNELPERF_PERF_BUDGET"
GPU_BUDGET_S = 0.5
CPU_BUDGET_S = 0.2
# On CPU the kernels run interpreted (Pallas interpret mode, TRITON_INTERPRET), ms to
# seconds per call: only these are timed there, enough to run every step (timing, roofline,
# baselines, recording) in `make test` for a few seconds. A GPU times every kernel.
CPU_IMPLEMENTATIONS = frozenset({("softmax", "pallas")})
CPU_MIN_SAMPLES = 10
STORAGE_ROOT = ".benchmarks"
# The perf items' test function (perf_tests/tests/test_performance.py): the xdist scheduler
# finds them by it (conftest.py).
PERF_TEST = "test_kernel_performance"
# What writes a GPU model's floors (kernels.roofline.floors), named where a model has none.
BRINGUP_COMMANDS = ("python -m kernels bringup", "make bringup")


@dataclasses.dataclass(frozen=True)
class PerfItem:
    """One performance test: our implementation on one bench case in one direction."""

    impl: registry.Implementation
    case: registry.Case
    direction: str
    skip_reason: str | None = None

    @property
    def id(self) -> str:
        """`softmax-pallas-f32-32768x4096-fwd`."""
        return f"{self.impl.id}-{self.case.id}-{self.direction}"

    @property
    def group(self) -> str:
        """pytest-benchmark's group: the kernels of one case and direction side by side."""
        return f"{self.case.op} {self.case.id} {self.direction}"


def perf_items(machine: devices.Machine | None = None) -> list[PerfItem]:
    """Every (kernel, bench case, direction) of the registry, with the reason where it cannot
    be timed here. Directions a kernel does not have (no backward) are left out, and so are
    cases over several devices: a floor is a fraction of one GPU model's roof or baseline, and
    sharded work is tracked by its asv benchmarks and its scaling (kernels.bench.scaling)."""
    machine = machine or devices.this_machine()
    items = []
    for op in registry.operations():
        for case in registry.bench_cases(op, "gpu" if machine.has_gpu else "cpu"):
            for direction in registry.DIRECTIONS:
                for impl in registry.implementations(op.name):
                    if impl.baseline or not registry.has_direction(impl, direction) \
                            or impl.devices_for(case) > 1:
                        continue
                    reason = devices.case_unavailable_reason(impl, case, machine)
                    if reason is None and not machine.has_gpu \
                            and (op.name, impl.name) not in CPU_IMPLEMENTATIONS:
                        names = ", ".join(f"{o}-{i}" for o, i in sorted(CPU_IMPLEMENTATIONS))
                        reason = (f"on CPU the perf tests time only {names} (interpreted "
                                  f"kernels take up to seconds per call); a GPU times every "
                                  f"kernel")
                    items.append(PerfItem(impl, case, direction, reason))
    return items


def baselines_for(impl: registry.Implementation, case: registry.Case, direction: str,
                  machine: devices.Machine | None = None) -> list[registry.Implementation]:
    """The operation's baselines that run `case` in `direction` on this machine."""
    machine = machine or devices.this_machine()
    return [peer for peer in registry.implementations(impl.op)
            if peer.baseline and registry.has_direction(peer, direction)
            and devices.case_unavailable_reason(peer, case, machine) is None]


def stopping_rule(device: fingerprint.Fingerprint) -> timing.StoppingRule:
    """nvbench's rule with a short wall-time budget: $KERNELPERF_PERF_BUDGET seconds (and
    fewer samples at least on CPU, whose floors are not checked)."""
    gpu = device.platform == "gpu"
    default = GPU_BUDGET_S if gpu else CPU_BUDGET_S
    text = os.environ.get(BUDGET_VARIABLE, "")
    try:
        budget = float(text) if text else default
    except ValueError:
        raise ValueError(f"{BUDGET_VARIABLE}: expected seconds as a number, got {text!r}") \
            from None
    if gpu:
        return timing.StoppingRule(time_budget_s=budget)
    return timing.StoppingRule(time_budget_s=budget, min_samples=CPU_MIN_SAMPLES)


class PerfSession:
    """Measurements of one pytest session: each (implementation, case, direction) once.

    Inputs are made once per case and kept for one case at a time (real-size
    inputs take GiBs); run the items of one case together (the test order does).
    """

    def __init__(self, device: fingerprint.Fingerprint, rule: timing.StoppingRule):
        self.device, self.rule = device, rule
        self._measurements: dict[tuple[str, str, str], timing.Measurement] = {}
        self._errors: dict[tuple[str, str, str], str] = {}
        self._inputs: tuple[tuple[str, str], tuple[np.ndarray, ...]] | None = None
        self._warmed: set[tuple[str, str, str]] = set()
        self.warm_up_errors: dict[tuple[str, str, str], str] = {}
        self._interleaved: dict[tuple[str, str, str, int], Interleaved] = {}

    def _inputs_for(self, case: registry.Case) -> tuple[np.ndarray, ...]:
        key = (case.op, case.id)
        if self._inputs is None or self._inputs[0] != key:
            self._inputs = None  # free the previous case's arrays before making new ones
            self._inputs = key, checking.make_inputs(registry.operation(case.op), case, 0,
                                                     "normal")
        return self._inputs[1]

    def warm_up(self, impl: registry.Implementation, case: registry.Case,
                direction: str) -> int:
        """Run `impl` and the operation's baselines on `case` once each, untimed, where not
        done yet this session: inputs made, programs compiled and autotuned, flush programs
        too, so that their measurements later pay for sampling alone. Returns how many it ran.

        A call that raises here is left for its measurement, which runs it again with the
        device to itself and reports what it raises then (a warm-up beside other workers can
        run out of memory where the measurement would not). An implementation that
        `autotunes` is left for its measurement too: beside other workers its autotuner would
        time its candidates contended and keep a slower choice (Triton's bf16 8192^3 matmul
        read 0.842x XLA in the H200's `pytest -m gpu`, where the bring-up's runs, which warm
        nothing beside other work, read 0.897-0.901x: 2026-12-02).
        """
        ran = 0
        for peer in (impl, *baselines_for(impl, case, direction)):
            key = (peer.id, case.id, direction)
            if peer.autotunes or key in self._warmed or key in self._measurements:
                continue
            self._warmed.add(key)
            try:
                timeable = timing.prepare(peer, case, direction=direction,
                                          inputs=self._inputs_for(case))
                sampler, _ = timing.make_sampler(timeable, "cold", self.device)
                sampler.take(1)
            except Exception as error:  # noqa: BLE001 - measured again alone, reported there
                self.warm_up_errors[key] = f"{type(error).__name__}: {error}"
            ran += 1
        return ran

    def measure(self, impl: registry.Implementation, case: registry.Case,
                direction: str) -> timing.Measurement:
        key = (impl.id, case.id, direction)
        if key not in self._measurements:
            timeable = timing.prepare(impl, case, direction=direction,
                                      inputs=self._inputs_for(case))
            self._measurements[key] = timing.time_timeable(timeable, rule=self.rule,
                                                           device=self.device)
        return self._measurements[key]

    def measure_baselines(self, impl: registry.Implementation, case: registry.Case,
                          direction: str) -> tuple[dict[str, timing.Measurement], dict[str, str]]:
        """({name: measurement}, {name: error}) of the operation's baselines on this case.

        A baseline that raises is the peer's problem, not our kernel's: it is left out
        and named with its error in the verdict (where a floor then has no baseline to
        compare with, the verdict is a refusal, which fails).
        """
        measured, errors = {}, {}
        for peer in baselines_for(impl, case, direction):
            key = (peer.id, case.id, direction)
            if key in self._errors:
                errors[peer.name] = self._errors[key]
                continue
            try:
                measured[peer.name] = self.measure(peer, case, direction)
            except Exception as error:  # reported in the verdict and extra_info, never hidden
                self._errors[key] = errors[peer.name] = f"{type(error).__name__}: {error}"
        return measured, errors


    def measure_interleaved(self, impl: registry.Implementation, case: registry.Case,
                            direction: str, rounds: int = 3,
                            sampler_for: Callable[..., Any] | None = None) -> Interleaved:
        """`impl` and the operation's baselines on `case`, timed interleaved (`interleave`),
        once per session. A baseline that cannot be prepared or timed is left out and named
        in `errors` (where a floor then has no baseline to compare with, the verdict is a
        refusal); the kernel's own failure raises."""
        key = (impl.id, case.id, direction, rounds)
        if key not in self._interleaved:
            inputs = self._inputs_for(case)
            timeables = {impl.name: timing.prepare(impl, case, direction=direction,
                                                    inputs=inputs)}
            errors = {}
            for peer in baselines_for(impl, case, direction):
                try:
                    timeables[peer.name] = timing.prepare(peer, case, direction=direction,
                                                          inputs=inputs)
                except Exception as error:  # the peer's problem, named in the verdict
                    errors[peer.name] = f"{type(error).__name__}: {error}"
            self._interleaved[key] = interleave(
                timeables, first=impl.name, rounds=rounds, rule=self.rule, device=self.device,
                sampler_for=sampler_for or timing.make_sampler, errors=errors)
        return self._interleaved[key]


@dataclasses.dataclass(frozen=True)
class Interleaved:
    """A kernel and its baselines timed in alternating rounds (`interleave`).

    name: the kernel's implementation name. kernel / baselines: each one's samples of every
    round as one Measurement. rounds: per round, implementation name -> the median of its
    samples in that round (the kernel's under `name`). errors: baseline name -> the error
    that left it out.
    """

    name: str
    kernel: timing.Measurement
    baselines: dict[str, timing.Measurement]
    rounds: tuple[dict[str, float], ...]
    errors: dict[str, str]

    def ratios(self, peer: str | None = None) -> tuple[float | None, ...]:
        """Per round, a baseline's median over the kernel's (above 1: ours is faster):
        `peer`'s, or else the fastest baseline of that round timed by the kernel's clock;
        None for a round without it."""
        same = {name for name, m in self.baselines.items() if m.method == self.kernel.method}
        wanted = same & {peer} if peer else same
        found = []
        for medians in self.rounds:
            peers = [medians[name] for name in wanted if name in medians]
            found.append(min(peers) / medians[self.name] if peers else None)
        return tuple(found)


def _round_rule(rule: timing.StoppingRule, rounds: int) -> timing.StoppingRule:
    """One round's share of `rule`: its wall-time budget and minimum sample count split over
    `rounds` (at least 3 samples a round, so each round has a median of its own)."""
    return dataclasses.replace(rule, time_budget_s=rule.time_budget_s / rounds,
                               min_samples=max(3, math.ceil(rule.min_samples / rounds)),
                               min_time_s=rule.min_time_s / rounds)


def interleave(timeables: Mapping[str, timing.Timeable], *, first: str, rounds: int,
               rule: timing.StoppingRule, device: fingerprint.Fingerprint,
               regime: str = "cold", sampler_for: Callable[..., Any] = timing.make_sampler,
               errors: Mapping[str, str] | None = None) -> Interleaved:
    """Time `timeables` (name -> Timeable; `first` is the kernel, the rest its baselines) in
    `rounds` rounds: every sampler is made and warmed up once, then each round takes one
    batch from each, by `rule`'s per-round share (`_round_rule`), in an order that reverses
    every round (K B1 B2, B2 B1 K, ...) so that a clock drifting one way over the rounds
    weighs on both sides alike. A baseline that raises is dropped with its error; the
    kernel's error propagates. `sampler_for`: timing.make_sampler (tests give fakes)."""
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    if first not in timeables:
        raise ValueError(f"first: expected one of {sorted(timeables)}, got {first!r}")
    failed = dict(errors or {})
    samplers, methods = {}, {}

    def drop(name: str, error: Exception) -> None:
        if name == first:
            raise error
        failed[name] = f"{type(error).__name__}: {error}"
        samplers.pop(name, None)

    for name, timeable in timeables.items():
        try:
            samplers[name], methods[name] = sampler_for(timeable, regime, device)
            samplers[name].take(timing.WARMUP_CALLS)  # compiles and warms up, untimed
            samplers[name].reset()
        except Exception as error:  # a baseline's failure is named, the kernel's raised
            drop(name, error)
    per_round = _round_rule(rule, rounds)
    taken: dict[str, list[float]] = {name: [] for name in samplers}
    reasons: dict[str, set[str]] = {name: set() for name in samplers}
    medians: list[dict[str, float]] = []
    order = [first, *(name for name in timeables if name != first)]
    for index in range(rounds):
        this_round = {}
        for name in order if index % 2 == 0 else order[::-1]:
            if name not in samplers:
                continue
            try:
                samples, reason = timing.collect(samplers[name], per_round)
            except Exception as error:  # noqa: BLE001 - a baseline's failure is named
                drop(name, error)
                continue
            taken[name] += samples
            reasons[name].add(reason)
            this_round[name] = statistics.median(samples)
        medians.append(this_round)
    measured = {}
    for name, sampler in samplers.items():
        identity = device.to_dict()
        identity["clocks_before"] = dataclasses.asdict(sampler.first_clocks) \
            if sampler.first_clocks else None
        identity["clocks_after"] = dataclasses.asdict(sampler.last_clocks) \
            if sampler.last_clocks else None
        stop = next((r for r in ("time-budget", "max-samples") if r in reasons[name]),
                    "converged")
        measured[name] = timing.Measurement.from_samples(
            taken[name], clocks=sampler.clocks, throttled=sampler.throttled,
            label=timeables[name].label, method=methods[name], regime=regime,
            stop_reason=stop, fingerprint=identity,
            precision=getattr(timeables[name], "precision", ""))
    return Interleaved(
        name=first, kernel=measured.pop(first),
        baselines=measured,
        rounds=tuple({name: value for name, value in medians_.items() if name in samplers}
                     for medians_ in medians),
        errors={name: error for name, error in failed.items() if name not in samplers})


def placements(impl: registry.Implementation, case: registry.Case, direction: str,
               seconds: float, method: str, device: fingerprint.Fingerprint
               ) -> tuple[model.Placement | None, model.Placement | None]:
    """(datasheet, measured) placements of a time taken by `method` under this device's roofs.

    Floors use the datasheet roofs: fixed numbers, the same for every run. Measured
    ceilings are used where cached on a GPU (and only if timed by `method`), and
    measured on a CPU, which has no datasheet (about 2 s, cached).
    """
    sheet, measured = ceilings.for_device(device, allow_measure=device.platform != "gpu")
    if measured is not None and measured.method != method:
        measured = None  # a roof timed by another clock than the point is not its roof
    work = registry.operation(impl.op).work(case, direction)
    found = []
    for ceiling in (sheet, measured):
        found.append(None if ceiling is None else
                     model.place(work, seconds, ceiling, case.dtype,
                                 devices=impl.devices_for(case)))
    return found[0], found[1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """The floor check of one kernel measurement.

    status: "pass", "fail", "refused" (the floor needs a baseline and none was timed
        by the same clock, or the kernel had only the host clock on a GPU: a failure
        too) or "skipped" (a CPU, no floors for this GPU model, or none for this kernel).
    value: what was compared with the floor (a fraction of the roofline, or the
        baseline's time over ours); None when not checked.
    """

    status: str
    message: str
    method: str  # the clock of the kernel's measurement (and of every baseline compared)
    value: float | None = None
    floor: floors.Floor | None = None
    speedup: float | None = None
    best_baseline: str | None = None
    refused_baselines: tuple[str, ...] = ()
    # Baselines of another precision than the kernel's, as shown: "torch (FP32, 2674.00 us)".
    other_precision: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in ("pass", "fail", "refused", "skipped"):
            raise ValueError(f"status: expected pass, fail, refused or skipped, got "
                             f"{self.status!r}")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us"


def describe_measurement(m: timing.Measurement) -> str:
    throttled = f", {m.throttled_count} throttled" if m.throttled_count else ""
    return (f"{_us(m.median_s)} median ({m.method}, {m.regime} L2, {m.repeats} samples, "
            f"cv {m.cv:.2%}, {m.stop_reason}{throttled})")


def judge(*, label: str, device: fingerprint.Fingerprint, measured: timing.Measurement,
          baselines: Mapping[str, timing.Measurement], placement: model.Placement | None,
          floor: floors.Floor | None, has_floors: bool,
          baseline_errors: Mapping[str, str] | None = None) -> Verdict:
    """The kernel's measurement against its floor.

    Baselines timed by another method than the kernel, or of another precision
    (Measurement.precision: a TF32 kernel beside cuBLAS's FP32 GEMM), are left out of every
    comparison and listed, the latter labelled with their precision; the speedup is over
    the fastest baseline of the kernel's precision timed by the same clock, and so is a
    floor against "the best baseline". `has_floors`: whether `device` has a floor table at
    all (a model without one, or a CPU, skips the check and says why).
    """
    device_name = device.name
    fastest = timing.speedup(measured, baselines)
    left_out = {*fastest.other_clock, *fastest.other_precision}
    same = {name: m for name, m in baselines.items() if name not in left_out}
    refused = tuple(f"{name} ({baselines[name].method})" for name in fastest.other_clock)
    other_precision = tuple(timing.labelled(name, baselines[name])
                            for name in fastest.other_precision)
    best, speedup = fastest.best, fastest.value
    lines = [f"measured: {describe_measurement(measured)}"]
    if placement is not None:
        lines.append(f"roofline: {placement.fraction:.3f} of {placement.ceiling} "
                     f"({placement.bound}-bound; {placement.achieved_bandwidth / 1e9:.0f} GB/s, "
                     f"{placement.achieved_flops / 1e12:.2f} TFLOP/s)")
    for name, m in sorted(same.items(), key=lambda item: item[1].median_s):
        lines.append(f"baseline {name}: {describe_measurement(m)}; ours is "
                     f"{m.median_s / measured.median_s:.3f}x its speed")
    if refused:
        lines.append(f"not compared (another clock than {measured.method}): "
                     f"{', '.join(refused)}; {timing.comparable(measured, *baselines.values())}")
    if other_precision:
        lines.append(f"not compared (another precision than "
                     f"{measured.precision or 'unknown'}): {', '.join(other_precision)}")
    for name, error in (baseline_errors or {}).items():
        lines.append(f"baseline {name} could not be timed: {error.splitlines()[0][:300]}")
    common = dict(method=measured.method, speedup=speedup, best_baseline=best,
                  refused_baselines=refused, other_precision=other_precision)
    if floor is None:
        if device.platform != "gpu":
            why = (f"floors are per GPU model; this is a CPU ({device_name}): numbers recorded "
                   f"with the host clock, floor check skipped")
        elif has_floors:
            why = f"no floor for {label} on {device_name} (add one: python -m kernels bringup)"
        else:
            why = (f"no floors for GPU model {device_name!r} (python -m kernels bringup writes "
                   f"kernels/models/{device.model}/): numbers recorded, floor check skipped")
        return Verdict(status="skipped", message="\n".join([why, *lines]), **common)
    if device.platform == "gpu" and measured.method == "host-clock":
        # Host time on a GPU counts dispatch and Python (a 1.8 us kernel read 38.9 us): a
        # floor in device time cannot be judged from it, either way.
        message = (f"{label}: refusing to judge a floor from the host clock on a GPU (no "
                   f"device clock was available for it); floors are device time")
        return Verdict(status="refused", message="\n".join([message, *lines]), floor=floor,
                       **common)
    if floor.against == "roofline":
        if placement is None:
            raise ValueError(f"floor of {label} is a fraction of the roofline, but "
                             f"{device_name} has no datasheet ceilings")
        value = placement.fraction
        compared = f"{value:.3f} of the datasheet roofline"
    else:
        peer = floor.baseline or best
        if floor.baseline in fastest.other_precision:
            theirs = baselines[floor.baseline].precision or "an unknown precision"
            message = (f"{label}: refusing to compare with baseline {floor.baseline}: it "
                       f"computed in {theirs}, {label} in "
                       f"{measured.precision or 'an unknown precision'}; a ratio "
                       f"across precisions measures the precisions (floors name a baseline of "
                       f"the kernel's precision, or none: the best of it)")
            return Verdict(status="refused", message="\n".join([message, *lines]),
                           floor=floor, **common)
        if peer is None and fastest.other_precision and not fastest.other_clock:
            message = (f"{label}: refusing to compare with a baseline: no baseline computed in "
                       f"{measured.precision or 'its precision'} (baselines: "
                       f"{', '.join(other_precision)})")
            return Verdict(status="refused", message="\n".join([message, *lines]),
                           floor=floor, **common)
        if peer is None or peer not in same:
            available = ", ".join([*(f"{n} ({m.method})" for n, m in baselines.items()),
                                   *(f"{n} (failed)" for n in baseline_errors or {})]) or "none"
            message = (f"{label}: refusing to compare with "
                       f"{'baseline ' + floor.baseline if floor.baseline else 'a baseline'}: "
                       f"{label} was timed by {measured.method}, and no such baseline was "
                       f"timed by the same clock (baselines: {available})")
            return Verdict(status="refused", message="\n".join([message, *lines]),
                           floor=floor, **common)
        value = same[peer].median_s / measured.median_s
        compared = f"{value:.3f}x the speed of baseline {peer} ({_us(same[peer].median_s)})"
    passed = value >= floor.fraction
    head = (f"{label} on {device_name}: {compared} "
            f"{'>=' if passed else '<'} floor {floor.fraction:.2f} ({floor.reason})")
    if not passed:
        head = "under its floor: " + head
    return Verdict(status="pass" if passed else "fail", message="\n".join([head, *lines]),
                   value=value, floor=floor, **common)


def parallel_reason(alone: bool = False) -> str | None:
    """Why the device cannot be timed in this process: pytest-xdist workers share it and
    this one does not hold it alone (`alone`: it holds the device lock of
    kernels/testing/perf_phase.py exclusive, every other worker done), so a kernel's time
    would not be its own."""
    workers = environment.xdist_workers()
    if workers <= 1 or alone:
        return None
    return (f"{workers} pytest-xdist workers share the device and this one does not hold it "
            f"alone (no device lock in this run: kernels/testing/perf_phase.py not loaded?), "
            f"so timings would not be the kernel's: `pytest -m perf` runs the perf tests in "
            f"one process (or -n 0)")


def finding(*, device_name: str, platform: str, has_floors: bool,
            statuses: Mapping[str, int], timed: str | None = None) -> str:
    """The run's one line on what its perf items judged: on a GPU model without floors that
    this is a finding (named, with the bring-up command), not a silent skip; on a CPU what
    the run did instead; else how the verdicts went. `statuses`: verdict status -> count
    (pass, fail, refused, skipped); `timed`: on a CPU, the kernels it timed."""
    recorded = sum(statuses.values())
    if platform != "gpu":
        what = f"timed {timed} " if timed else ""
        return (f"kernelperf: perf items on a CPU ({device_name}): {recorded} recorded, "
                f"{what}with the host clock, not judged: floors are per GPU model")
    if not has_floors:
        commands = " or ".join(f"`{command}`" for command in BRINGUP_COMMANDS)
        return (f"kernelperf: no performance floors for GPU model {device_name!r}: "
                f"{recorded} perf items recorded, not judged; bring it up with {commands}")
    counts = ", ".join(f"{statuses[status]} {word}" for status, word in
                       (("pass", "passed"), ("fail", "under their floor"),
                        ("refused", "refused"), ("skipped", "without a floor"))
                       if statuses.get(status))
    return f"kernelperf: perf items judged against the floors of {device_name!r}: {counts}"


def compare_refusal(saved_extra: Mapping[str, Any], saved_device: Mapping[str, Any] | None,
                    measured: timing.Measurement, device: fingerprint.Fingerprint,
                    source: str) -> str | None:
    """Why a saved pytest-benchmark record must not be compared with this measurement
    (another clock method or another device model), or None."""
    saved_method = saved_extra.get("clock_method")
    if saved_method != measured.method:
        return (f"refusing to compare with the saved run {source}: it was timed by "
                f"{saved_method or 'an unknown method'}, this run by {measured.method}; "
                f"device times from different clocks are not comparable")
    saved_model = (saved_device or {}).get("model")
    if saved_model != device.model:
        return (f"refusing to compare with the saved run {source}: it ran on "
                f"{saved_model or 'an unknown device'}, this run on {device.model}")
    return None


def extra_info(*, measured: timing.Measurement, work: registry.Work,
               sheet: model.Placement | None, measured_roof: model.Placement | None,
               verdict: Verdict, baselines: Mapping[str, timing.Measurement],
               device: fingerprint.Fingerprint,
               baseline_errors: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What each pytest-benchmark record carries beside its device-time statistics."""
    primary = sheet or measured_roof

    def finite(value: float | None) -> float | None:
        return value if value is not None and math.isfinite(value) else None

    return {
        "clock_method": measured.method,
        "regime": measured.regime,
        "stop_reason": measured.stop_reason,
        "cv": finite(measured.cv),
        "throttled_samples": measured.throttled_count,
        "tflops": work.flops / measured.median_s / 1e12,
        "gbps": work.bytes / measured.median_s / 1e9,
        "roofline_fraction": primary.fraction if primary else None,
        "roofline_ceiling": primary.ceiling if primary else None,
        "bound": primary.bound if primary else None,
        "measured_roofline_fraction": measured_roof.fraction if measured_roof else None,
        "precision": measured.precision or None,
        "speedup": verdict.speedup,
        "best_baseline": verdict.best_baseline,
        "baselines": {name: {"median_s": m.median_s, "method": m.method, "cv": finite(m.cv),
                             "precision": m.precision or None}
                      for name, m in baselines.items()},
        "other_precision_baselines": list(verdict.other_precision),
        "baseline_errors": dict(baseline_errors or {}),
        "floor": dataclasses.asdict(verdict.floor) if verdict.floor else None,
        "floor_value": verdict.value,
        "floor_verdict": verdict.status,
        "fingerprint": device.to_dict(),
    }


@functools.cache
def _clock() -> timing.DeviceClock:
    """The one clock pytest-benchmark reads, made on first use: nothing of timing runs at
    import (mutmut's forced-fail check of the timing target failed on it at collection)."""
    return timing.DeviceClock()


def device_time() -> float:
    """pytest-benchmark's `timer` for the perf tests (`@pytest.mark.benchmark(timer=...)`)."""
    return _clock().read()


def record(benchmark: Any, measured: timing.Measurement, info: Mapping[str, Any]) -> None:
    """Record `measured` through pytest-benchmark's `benchmark` fixture, one round per device
    sample, and check that what it recorded is those samples.

    The fixture's timer must be `device_time` (the perf tests' marker sets it). When
    benchmarks are disabled (xdist, --benchmark-disable) pytest-benchmark runs the
    target once and records nothing; there is nothing to check then.
    """
    benchmark.extra_info.update(info)
    clock = _clock()
    clock.load(measured.samples)
    benchmark.pedantic(clock.step, rounds=len(measured.samples), iterations=1,
                       warmup_rounds=0)
    if getattr(benchmark, "disabled", False):
        return
    recorded = list(benchmark.stats.stats.data)
    expected = list(measured.samples)
    if len(recorded) != len(expected) or not np.allclose(recorded, expected, rtol=1e-9,
                                                          atol=1e-15):
        raise AssertionError(
            f"pytest-benchmark recorded {len(recorded)} durations (median "
            f"{np.median(recorded) if recorded else float('nan'):.3e} s), not the "
            f"{len(expected)} device samples (median {measured.median_s:.3e} s): is its "
            f"timer kernels.bench.perfcheck.device_time? (the perf tests' benchmark marker)")


def default_storage(model_name: str) -> str:
    """pytest-benchmark storage for this device model: history is kept per GPU model."""
    return f"file://./{STORAGE_ROOT}/{model_name}"
