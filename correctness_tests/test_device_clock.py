"""The device clock of work over several devices ("device-span"): reading device events from a
profiler trace, cutting them into calls, and the sampler, on synthetic traces (a CPU has no
GPU planes); and the labelled host-clock fallback where there is no device trace."""

from __future__ import annotations

import dataclasses
import types
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

from correctness_tests import fakes
from kernels.core import compat, fingerprint, timing

US = 1_000.0  # nanoseconds


@pytest.fixture(autouse=True)
def _untraced(monkeypatch):
    """Each test's samplers mark the process traced; the mark is undone after it."""
    monkeypatch.setattr(timing, "_TRACED", False)
ON_GPU = jax.default_backend() == "gpu"


def event(device: int, start_us: float, end_us: float, name: str = "gemm",
          stream: str = "Stream #13(Compute)") -> timing.DeviceEvent:
    return timing.DeviceEvent(device=f"GPU:{device}", stream=stream, name=name,
                              start_ns=start_us * US, end_ns=end_us * US)


def one_call(t0: float) -> list[timing.DeviceEvent]:
    """A call on two devices from t0 (us): device 0 runs a product while its collective
    overlaps it on another stream, then a copy; device 1 starts 5 us late and ends last."""
    return [event(0, t0, t0 + 300),
            event(0, t0 + 20, t0 + 120, "ncclDevKernel_SendRecv", "Stream #40(Collective)"),
            event(0, t0 + 302, t0 + 310, "MemcpyD2D", "Stream #14(MemcpyD2D)"),
            event(1, t0 + 5, t0 + 290),
            event(1, t0 + 25, t0 + 130, "ncclDevKernel_SendRecv", "Stream #40(Collective)"),
            event(1, t0 + 292, t0 + 330)]


def calls(n: int, gap_us: float = 50.0, period_us: float = 330.0) -> list[timing.DeviceEvent]:
    out = []
    for i in range(n):
        out += one_call(i * (period_us + gap_us))
    return out


# -- reading a trace ---------------------------------------------------------------------------

TRACE = """
planes { id: 1 name: "/device:GPU:0"
  lines { id: 1 name: "Stream #13(Compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 }
    events { metadata_id: 2 offset_ps: 7000000 duration_ps: 1000000 } }
  lines { id: 2 name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 } }
  event_metadata { key: 1 value { id: 1 name: "gemm" } }
  event_metadata { key: 2 value { id: 2 name: "ncclDevKernel_SendRecv" } } }
planes { id: 2 name: "/device:GPU:1"
  lines { id: 1 name: "Stream #40(Collective)" timestamp_ns: 2000
    events { metadata_id: 1 offset_ps: 500000 duration_ps: 2000000 } }
  event_metadata { key: 1 value { id: 1 name: "ncclDevKernel_SendRecv" } } }
planes { id: 3 name: "/host:CPU"
  lines { id: 1 name: "python" timestamp_ns: 0
    events { metadata_id: 1 offset_ps: 0 duration_ps: 9000000 } }
  event_metadata { key: 1 value { id: 1 name: "call" } } }
"""


def test_device_events_read_stream_lines_of_gpu_planes_only():
    events = timing.device_events(ProfileData.from_text_proto(TRACE))
    got = sorted((e.device, e.stream, e.name, e.start_ns, e.end_ns) for e in events)
    assert got == [
        ("GPU:0", "Stream #13(Compute)", "gemm", 1000.0, 6000.0),
        ("GPU:0", "Stream #13(Compute)", "ncclDevKernel_SendRecv", 8000.0, 9000.0),
        ("GPU:1", "Stream #40(Collective)", "ncclDevKernel_SendRecv", 2500.0, 4500.0),
    ]  # the "XLA Ops" line repeats kernels and the host plane is not device time


@pytest.mark.skipif(ON_GPU, reason="a CPU's trace: a GPU's has device events")
def test_cpu_trace_has_no_device_events():
    start = compat.trace_session_factory()
    assert start is not None, "jaxlib's in-memory profiler session is missing"
    session = start()
    jax.block_until_ready(jnp.ones(64) * 2)
    assert timing.device_events(session.stop()) == []


def test_event_end_before_start_is_refused():
    with pytest.raises(ValueError, match=r"^end_ns: expected >= start_ns \(10.0\), got 5.0"):
        timing.DeviceEvent(device="GPU:0", stream="s", name="k", start_ns=10.0, end_ns=5.0)


# -- cutting a trace into calls ----------------------------------------------------------------

def test_split_calls_gives_per_device_and_all_device_spans():
    spans = timing.split_calls(calls(3), 3)
    assert len(spans) == 3 and all(len(span.events) == 6 for span in spans)
    for span in spans:
        assert span.per_device_s == pytest.approx({"GPU:0": 310e-6, "GPU:1": 325e-6})
        assert span.largest_s == pytest.approx(325e-6)
        assert span.all_devices_s == pytest.approx(330e-6)
        assert [e.device for e in span.named("SendRecv")] == ["GPU:0", "GPU:1"]
        assert [e.device for e in span.named("SendRecv", device="GPU:1")] == ["GPU:1"]


def test_split_calls_orders_events_and_ignores_gaps_inside_a_call():
    # Shuffled input; inside each call a 2 us idle gap (300 -> 302) is not a boundary.
    events = list(reversed(calls(4, gap_us=40.0)))
    spans = timing.split_calls(events, 4)
    assert [round(s.events[0].start_ns / US) for s in spans] == [0, 370, 740, 1110]


def test_split_calls_refuses_uneven_event_counts():
    events = calls(3)
    del events[7]  # the second call lost its collective on device 0
    with pytest.raises(timing.TraceSplitError,
                       match=r"expected every call to record the same number of device events, "
                             r"got \[6, 5, 6\]"):
        timing.split_calls(events, 3)


def test_split_calls_refuses_a_gap_inside_a_call_longer_than_between_calls():
    events = calls(3, gap_us=20.0)
    # The first call's last event starts 30 us after the rest of it ended, 5 us before the
    # second call: the first boundary lands inside the first call.
    events[5] = event(1, 340, 345)
    with pytest.raises(timing.TraceSplitError, match=r"got \[5, 7, 6\]"):
        timing.split_calls(events, 3)


def test_split_calls_refuses_calls_back_to_back():
    with pytest.raises(timing.TraceSplitError,
                       match=r"idle gaps of at least 2000 ns, got a boundary gap of 500 ns"):
        timing.split_calls(calls(3, gap_us=0.5), 3)


def test_split_calls_refuses_fewer_events_than_calls_and_bad_counts():
    with pytest.raises(timing.TraceSplitError, match=r"3 calls, got 2 events"):
        timing.split_calls([event(0, 0, 1), event(0, 10, 11)], 3)
    with pytest.raises(ValueError, match=r"^calls: expected >= 1, got 0$"):
        timing.split_calls(calls(1), 0)
    with pytest.raises(ValueError, match=r"^period: expected >= 1 and dividing calls \(3\)"):
        timing.split_calls(calls(3), 3, period=2)


def test_split_calls_one_call_is_the_whole_trace():
    (span,) = timing.split_calls(calls(1), 1)
    assert span.largest_s == pytest.approx(325e-6)


def test_split_calls_with_a_flush_between_calls_compares_like_with_like():
    events = []
    for i in range(3):
        t0 = i * 800.0
        events += [event(0, t0, t0 + 40, "flush"), event(1, t0 + 1, t0 + 41, "flush")]
        events += one_call(t0 + 100)
    spans = timing.split_calls(events, 6, period=2)
    assert [len(s.events) for s in spans] == [2, 6, 2, 6, 2, 6]
    assert [s.largest_s for s in spans[1::2]] == pytest.approx([325e-6] * 3)
    del events[3]  # a call loses an event: the flushes still agree, the calls do not
    with pytest.raises(timing.TraceSplitError, match=r"of kind 2 of 2 .* got \[5, 6, 6\]"):
        timing.split_calls(events, 6, period=2)


# -- the sampler -------------------------------------------------------------------------------

class FakeDevices:
    """Two simulated GPUs: each call appends one_call's events at a simulated clock; a
    session returns what was appended while it ran, as ProfileData's planes > lines > events."""

    def __init__(self, per_call=one_call, record=True):
        self.now = 0.0
        self.log: list[timing.DeviceEvent] = []
        self.per_call, self.record = per_call, record
        self.sessions = 0
        self.pauses: list[float] = []

    def call(self):
        self.log += self.per_call(self.now) if self.record else []
        self.now += 400.0
        return None

    def sleep(self, seconds: float) -> None:  # the host's pause passes on the simulated clock
        self.pauses.append(seconds)
        self.now += seconds * 1e6

    def start_session(self):
        self.sessions += 1
        first = len(self.log)

        def stop():
            events = self.log[first:]
            planes = {}
            for e in events:
                plane = planes.setdefault(e.device, {})
                plane.setdefault(e.stream, []).append(types.SimpleNamespace(
                    name=e.name, start_ns=e.start_ns, end_ns=e.end_ns))
            return types.SimpleNamespace(planes=[
                types.SimpleNamespace(name=f"/device:{device}", lines=[
                    types.SimpleNamespace(name=stream, events=line)
                    for stream, line in lines.items()])
                for device, lines in planes.items()])

        return types.SimpleNamespace(stop=stop)


def test_sampler_takes_largest_per_device_span_and_keeps_all_device_span(monkeypatch):
    fake = FakeDevices()
    assert not timing.traced_here()
    sampler = timing._DeviceSpanSampler(fake.call, None, lambda _: None, fake.start_session)
    assert timing.traced_here()  # CUPTI timing in this process is off limits from now on
    assert fake.sessions == 1  # the probe that checks the trace holds device activity
    assert sampler.take(5) == pytest.approx([325e-6] * 5)
    assert fake.sessions == 2  # one session for the five calls
    assert sampler.all_devices == pytest.approx([330e-6] * 5)
    sampler.reset()
    assert sampler.all_devices == []


def test_sampler_without_device_activity_says_why():
    fake = FakeDevices(record=False)
    with pytest.raises(timing.DeviceTraceUnavailable, match=r"recorded no GPU activity for "
                                                            r"the-op .* another CUPTI user"):
        timing._DeviceSpanSampler(fake.call, None, lambda _: None, fake.start_session,
                                  "the-op")


def test_sampler_propagates_a_trace_it_cannot_split():
    counter = iter(range(1000))

    def uneven(t0):  # every third call records one event fewer
        events = one_call(t0)
        return events[:-1] if next(counter) % 3 == 2 else events

    fake = FakeDevices(per_call=uneven)
    sampler = timing._DeviceSpanSampler(fake.call, None, lambda _: None, fake.start_session)
    with pytest.raises(timing.TraceSplitError, match="same number of device events"):
        sampler.take(6)


def late_peer(t0: float, idle_us: float = 150.0) -> list[timing.DeviceEvent]:
    """A call whose second device starts `idle_us` after the first one's kernel ended: an idle
    gap inside the call longer than the 400 - (150 + idle_us) us between calls of
    FakeDevices."""
    return [event(0, t0, t0 + 100), event(1, t0 + 100 + idle_us, t0 + 150 + idle_us)]


def test_sampler_pauses_longer_than_the_widest_gap_inside_a_call():
    fake = FakeDevices(per_call=late_peer)
    with pytest.raises(timing.TraceSplitError):  # calls back to back: a cut inside a call
        timing.split_calls(late_peer(0) + late_peer(400) + late_peer(800), 3)
    sampler = timing._DeviceSpanSampler(fake.call, None, lambda _: None, fake.start_session,
                                        sleep=fake.sleep)
    assert fake.pauses == [timing.PAUSE_PROBE_S]
    assert sampler.pause_s == pytest.approx(timing.PAUSE_PER_GAP * 150e-6)
    assert sampler.take(6) == pytest.approx([100e-6] * 6)  # device 0's span is the largest
    assert sampler.all_devices == pytest.approx([300e-6] * 6)
    assert fake.pauses[1:] == [sampler.pause_s] * 6


def test_sampler_doubles_its_pause_when_a_trace_cannot_be_cut():
    wide = iter([False] * 2 + [True] * 1000)  # warm-up and probe narrow; later calls not

    def widening(t0):
        return late_peer(t0, 220.0) if next(wide) else [event(0, t0, t0 + 100)]

    fake = FakeDevices(per_call=widening)
    sampler = timing._DeviceSpanSampler(fake.call, None, lambda _: None, fake.start_session,
                                        sleep=fake.sleep)
    assert sampler.pause_s == timing.PAUSE_MIN_S  # no gap in the probe
    assert sampler.take(4) == pytest.approx([100e-6] * 4)
    assert sampler.all_devices == pytest.approx([370e-6] * 4)
    # 100 us pauses leave 130 us between calls, under the 220 inside; 200 us leave 230.
    assert sampler.pause_s == 2 * timing.PAUSE_MIN_S
    assert fake.sessions == 3  # the probe, a trace cut wrong, the same calls again


def _on_gpu_timeable(fake: FakeDevices) -> timing.Timeable:
    # Claimed to be on a GPU, so that make_sampler takes the device-trace path on a CPU.
    return timing.Timeable("fake-op", "jax", lambda x: fake.call(), (jnp.ones(2),), True)


def test_make_sampler_uses_the_device_clock_when_asked(monkeypatch):
    fake = FakeDevices()
    monkeypatch.setattr(compat, "trace_session_factory", lambda: fake.start_session)
    measurement = timing.time_timeable(
        _on_gpu_timeable(fake), regime="hot", clock="device-span",
        rule=timing.StoppingRule(min_samples=4, max_samples=4),
        device=fingerprint.fingerprint())
    assert measurement.method == "device-span"
    assert measurement.samples == pytest.approx((325e-6,) * 4)
    assert measurement.all_devices_s == pytest.approx((330e-6,) * 4)  # warm-up left out
    again = timing.Measurement.from_dict(measurement.to_dict())
    assert again.all_devices_s == measurement.all_devices_s


def test_work_over_a_mesh_is_timed_by_the_device_span_though_its_inputs_sit_on_one(
        monkeypatch):
    """An operation that lays its inputs out over the mesh itself (MoE on a 4-GPU host): the
    case's device count picks the device clock; CUPTI's single-device timer dropped records
    and aborted its worker there."""
    fake = FakeDevices()
    monkeypatch.setattr(compat, "trace_session_factory", lambda: fake.start_session)
    monkeypatch.setattr(compat, "cupti_session", lambda: None)
    plain = _on_gpu_timeable(fake)
    meshed = dataclasses.replace(plain, devices=2)
    with warnings.catch_warnings():  # the host clock's warning (CUPTI missing), said once
        warnings.simplefilter("ignore", RuntimeWarning)
        assert timing.make_sampler(plain, "hot", fingerprint.fingerprint())[1] == "host-clock"
    assert timing.make_sampler(meshed, "hot", fingerprint.fingerprint())[1] == "device-span"
    assert len(timing.devices_of(plain.args)) == 1
    assert timing.devices_of(plain.args, 2) == jax.devices()[:2]


def test_after_a_device_trace_no_cupti_timer_is_started(monkeypatch):
    """Mosaic's CUPTI timer started after a profiler session aborts the process: once this
    process has recorded a device trace, JAX work is timed by the device span and torch work
    by CUDA events, each said once."""
    fake = FakeDevices()
    monkeypatch.setattr(compat, "trace_session_factory", lambda: fake.start_session)

    def no_cupti():
        raise AssertionError("a CUPTI session was asked for after a device trace")

    monkeypatch.setattr(compat, "cupti_session", no_cupti)
    monkeypatch.setattr(timing, "_TRACED", True)
    device = fingerprint.fingerprint()
    assert timing.make_sampler(_on_gpu_timeable(fake), "hot", device)[1] == "device-span"
    torch_work = timing.Timeable("torch-op", "torch", lambda: None, (), True)
    timing._warn_traced.cache_clear()
    with pytest.warns(RuntimeWarning, match=r"recorded a device trace.*: torch is timed by "
                                             r"cuda-events"):
        assert timing.make_sampler(torch_work, "hot", device)[1] == "cuda-events"


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (forced host devices)")
def test_prepare_counts_the_devices_of_a_sharded_case():
    from kernels.core import registry

    impl = registry.implementation("moe", "xla")
    case = next(c for c in registry.operation("moe").cases if c.kwargs["mesh"] == "4x2")
    assert timing.prepare(impl, case).devices == 8
    softmax = registry.implementation("softmax", "xla")
    assert timing.prepare(softmax, registry.operation("softmax").cases[0]).devices == 1


def test_make_sampler_falls_back_to_the_labelled_host_clock(monkeypatch, capsys):
    fake = FakeDevices(record=False)
    monkeypatch.setattr(compat, "trace_session_factory", lambda: fake.start_session)
    timing._warn_no_trace.cache_clear()
    with pytest.warns(RuntimeWarning, match="timed by the host clock"):
        _, method = timing.make_sampler(_on_gpu_timeable(fake), "hot",
                                        fingerprint.fingerprint(), clock="device-span")
    assert method == "host-clock"
    assert "recorded no GPU activity for fake-op" in capsys.readouterr().err  # names the work
    with pytest.raises(ValueError, match=r"^clock: expected one of \('auto', 'device-span'\), "
                                         r"got 'wall'$"):
        timing.make_sampler(_on_gpu_timeable(fake), "hot", fingerprint.fingerprint(),
                            clock="wall")


@pytest.mark.skipif(ON_GPU, reason="the CPU's fallback; GPUs: test_sharded_work_on_gpus_...")
def test_sharded_work_on_cpu_keeps_the_host_clock():
    if jax.device_count() < 2:
        pytest.skip("needs 2 host devices")
    mesh = compat.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    x = jax.device_put(jnp.ones(8), jax.sharding.NamedSharding(mesh,
                                                               jax.sharding.PartitionSpec("x")))
    timeable = timing.callable_timeable("double", lambda v: v * 2, "jax", (x,))
    assert timing.spans_devices(timeable.args) and not timeable.on_gpu
    _, method = timing.make_sampler(timeable, "hot", fingerprint.fingerprint())
    assert method == "host-clock"
    assert timing.trace_calls(timeable) is None  # no device trace on a CPU


@pytest.mark.multi_gpu
@pytest.mark.skipif(not ON_GPU or jax.device_count() < 2,
                    reason=f"needs 2 GPUs; this machine has {jax.device_count()} "
                           f"{jax.default_backend()} device(s)")
def test_sharded_work_on_gpus_is_timed_by_its_device_span():
    """On real GPUs: an all-gather over two of them is cut into its calls, each call's span
    covers its NCCL kernel on both devices, and the span over all devices is no shorter."""
    mesh = compat.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    layout = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    x = jax.device_put(jnp.ones(1 << 22, jnp.float32), layout)  # 16 MiB gathered
    gather = jax.jit(lambda v: v * 2, out_shardings=jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))
    timeable = timing.callable_timeable("all-gather", gather, "jax", (x,))
    measurement = timing.time_timeable(timeable, regime="hot",
                                       rule=timing.StoppingRule(min_samples=10, max_samples=10))
    assert measurement.method == "device-span", measurement.method
    assert len(measurement.all_devices_s) == measurement.repeats == 10
    assert all(a >= s * 0.999 for a, s in zip(measurement.all_devices_s, measurement.samples,
                                              strict=True))
    spans = timing.trace_calls(timeable, 4)
    assert spans is not None and len(spans) == 4
    for span in spans:
        assert set(span.per_device_s) == {"GPU:0", "GPU:1"}, span.per_device_s
        assert {e.device for e in span.named("AllGather", "ncclDevKernel")} == {"GPU:0", "GPU:1"}
    # Cold: each call follows an L2 flush of both GPUs, left out of the samples.
    cold = timing.time_timeable(timeable, regime="cold",
                                rule=timing.StoppingRule(min_samples=5, max_samples=5))
    assert cold.method == "device-span"
    assert 0.5 < cold.median_s / measurement.median_s < 2.0


# -- reading and cutting, the edges ------------------------------------------------------------

def _profile(planes: dict[str, dict[str, list[timing.DeviceEvent]]]):
    """ProfileData's shape (planes > lines > events) from {plane name: {line name: events}},
    in the order given."""
    return types.SimpleNamespace(planes=[
        types.SimpleNamespace(name=plane, lines=[
            types.SimpleNamespace(name=line, events=[types.SimpleNamespace(
                name=e.name, start_ns=e.start_ns, end_ns=e.end_ns) for e in events])
            for line, events in lines.items()])
        for plane, lines in planes.items()])


def test_device_events_read_every_gpu_plane_whatever_the_order_of_planes_and_lines():
    """A host plane or a non-stream line may come before the GPU planes' stream lines (the
    profiler orders them as it likes): they are skipped, never the end of the reading."""
    kernel, copy, op = event(0, 0, 5, "gemm"), event(1, 1, 3, "memcpy"), event(0, 0, 5, "op")
    profile = _profile({"/host:CPU": {"python": [op]},
                        "/device:GPU:0": {"XLA Ops": [op], "Stream #13(Compute)": [kernel]},
                        "/device:GPU:1": {"XLA Modules": [op], "Stream #14(Memcpy)": [copy]}})
    got = [(e.device, e.name) for e in timing.device_events(profile)]
    assert got == [("GPU:0", "gemm"), ("GPU:1", "memcpy")]


def test_a_zero_length_event_counts_and_a_call_needs_one():
    """A memset or a tiny copy may start and end on the same tick: it is an event; a call
    with none is refused, and a call of one event has no idle gap inside it."""
    instant = event(0, 7, 7, "memset")
    assert instant.end_ns == instant.start_ns
    (span,) = timing.split_calls([instant], 1)
    assert span.largest_s == 0.0 and timing.widest_gap_s(span) == 0.0
    with pytest.raises(ValueError, match=r"^events: expected at least one device event per "
                                         r"call, got none$"):
        timing.CallSpan(events=())


def test_split_calls_accepts_a_boundary_gap_of_exactly_the_minimum():
    """`min_gap_ns` is the least idle gap a boundary may have: one of exactly that is one."""
    events = calls(3, gap_us=50.0)  # each call ends at t0 + 330 us; the next starts 50 us on
    assert len(timing.split_calls(events, 3, min_gap_ns=50 * US)) == 3
    with pytest.raises(timing.TraceSplitError, match="got a boundary gap of 50000 ns"):
        timing.split_calls(events, 3, min_gap_ns=50 * US + 1)


# -- the sampler: flushes, waits, retries --------------------------------------------------------

class FlushingDevices(FakeDevices):
    """FakeDevices whose L2 flush writes on both devices, device 1's `skew_us` after device 0's
    (a flush dispatched per device), 20 us each; `waited` logs what each wait was given."""

    def __init__(self, skew_us: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.skew_us, self.waited, self.flushes = skew_us, [], 0

    def flush(self):
        self.flushes += 1
        self.log += [event(0, self.now, self.now + 20, "flush"),
                     event(1, self.now + self.skew_us, self.now + self.skew_us + 20, "flush")]
        self.now += 400.0
        return ("flushed", self.flushes)

    def call(self):
        super().call()
        return ("called", len(self.log))

    def wait(self, result):
        self.waited.append(result)


def test_cold_device_span_samples_leave_every_flush_out_and_wait_for_each():
    """In the cold regime each call follows its own flush, each waited for, and each paused
    before: the samples and the all-device spans are the calls' alone, one per call. The
    compiling call and the first flush are waited for before anything is recorded."""
    fake = FlushingDevices()
    sampler = timing._DeviceSpanSampler(fake.call, fake.flush, fake.wait, fake.start_session,
                                        sleep=fake.sleep)
    assert fake.waited[:2] == [("called", 6), ("flushed", 1)]
    assert sampler.take(3) == pytest.approx([325e-6] * 3)
    assert sampler.all_devices == pytest.approx([330e-6] * 3)
    assert fake.flushes == 1 + 1 + 3  # the first, the probe's, one per sample
    assert [w[0] for w in fake.waited[2:]] == ["flushed", "called"] * 4  # probe and 3 calls
    # Before each flush and each call: the probe's pause, then the one it set.
    assert fake.pauses == [timing.PAUSE_PROBE_S] * 2 + [sampler.pause_s] * 6


def test_the_pause_outlasts_a_gap_inside_the_flush_too():
    """The probe's widest gap is taken over the flush as well as the call: a flush whose
    second device starts late (dispatched per device) has a gap that a boundary must
    outlast, or a cut lands inside it."""
    fake = FlushingDevices(skew_us=150.0)
    sampler = timing._DeviceSpanSampler(fake.call, fake.flush, fake.wait, fake.start_session,
                                        sleep=fake.sleep)
    assert sampler.pause_s == pytest.approx(timing.PAUSE_PER_GAP * 130e-6)  # 20 -> 150 us


def test_a_trace_that_cannot_be_cut_is_recorded_again_up_to_the_retries():
    """SPLIT_RETRIES traces in a row that cannot be cut are recorded again, each with the
    pause doubled; the one after them is the error."""
    bad = {"left": timing.SPLIT_RETRIES}
    real_split = timing.split_calls

    def flaky(events, n, **kwargs):
        if n > 1 and bad["left"]:
            bad["left"] -= 1
            raise timing.TraceSplitError("cut inside a call")
        return real_split(events, n, **kwargs)

    fake = FakeDevices()
    sampler = timing._DeviceSpanSampler(fake.call, None, lambda _: None, fake.start_session,
                                        sleep=fake.sleep)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing, "split_calls", flaky)
        assert len(sampler.take(3)) == 3
        assert sampler.pause_s == timing.PAUSE_MIN_S * 2 ** timing.SPLIT_RETRIES
        bad["left"] = timing.SPLIT_RETRIES + 1
        with pytest.raises(timing.TraceSplitError, match="cut inside a call"):
            sampler.take(3)


def test_the_sampler_keeps_the_last_batchs_spans_and_every_batchs_all_device_span():
    fake = FakeDevices()
    sampler = timing._DeviceSpanSampler(fake.call, None, lambda _: None, fake.start_session)
    sampler.take(2)
    sampler.take(3)
    assert len(sampler.last_spans) == 3 and sampler.last_spans[0].largest_s == \
        pytest.approx(325e-6)
    assert sampler.all_devices == pytest.approx([330e-6] * 5)  # both batches, in order


def test_a_profiler_that_cannot_start_says_why_and_the_host_clock_takes_over(monkeypatch,
                                                                            capsys):
    def busy():
        raise RuntimeError("another session is active")

    with pytest.raises(timing.DeviceTraceUnavailable,
                       match=r"^cannot start a profiler session: another session is active$"):
        timing._DeviceSpanSampler(lambda: None, None, lambda _: None, busy)
    monkeypatch.setattr(compat, "trace_session_factory", lambda: None)
    timing._warn_no_trace.cache_clear()
    with pytest.warns(RuntimeWarning, match=r"no device trace \(this jaxlib has no in-memory "
                                            r"profiler session\)"):
        _, method = timing.make_sampler(_on_gpu_timeable(FakeDevices()), "hot",
                                        fingerprint.fingerprint(), clock="device-span")
    assert method == "host-clock"


# -- make_sampler and trace_calls: the device clock's flush and fallbacks -----------------------

def test_the_cold_device_clock_flushes_the_l2_of_every_device_the_work_runs_on(monkeypatch):
    """Cold work over two devices whose inputs sit on one: the flush writes the device's L2 on
    both devices of the mesh (`devices_of` the arguments, at least the timeable's count),
    before each call and out of its samples; and where no trace can be had, the host
    clock's fallback flushes the same devices before each sample and waits for each call."""
    import jax

    fake = FlushingDevices()
    made = []

    def flush_devices(nbytes, devices):
        made.append((nbytes, devices))
        return fake.flush

    monkeypatch.setattr(timing, "jax_flush_devices", flush_devices)
    monkeypatch.setattr(compat, "trace_session_factory", lambda: fake.start_session)
    gpu = fakes.gpu_fingerprint(l2_bytes=50 << 20)
    meshed = dataclasses.replace(_on_gpu_timeable(fake), devices=2)
    sampler, method = timing.make_sampler(meshed, "cold", gpu)
    assert method == "device-span"
    assert made == [(50 << 20, jax.devices()[:2])]
    assert sampler.take(2) == pytest.approx([325e-6] * 2)
    assert fake.flushes == 1 + 1 + 2
    # No trace: the host clock, the same flush before every sample, each call waited for.
    fake = FlushingDevices()
    calls_made = []
    meshed = dataclasses.replace(meshed, fn=lambda x: calls_made.append(x) or x)
    monkeypatch.setattr(compat, "trace_session_factory", lambda: None)
    timing._warn_no_trace.cache_clear()
    with pytest.warns(RuntimeWarning, match="timed by the host clock"):
        sampler, method = timing.make_sampler(meshed, "cold", gpu)
    assert method == "host-clock" and made[-1] == (50 << 20, jax.devices()[:2])
    flushes = fake.flushes
    waited = []
    real_wait = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or real_wait(x))
    assert len(sampler.take(3)) == 3
    assert fake.flushes - flushes == 3
    assert len(calls_made) == 3 and all(w is meshed.args[0] for w in waited)
    assert sampler.throttled == [False] * 3


def test_trace_calls_gives_the_spans_of_hot_calls_of_jax_work_on_a_gpu(monkeypatch):
    """trace_calls records `calls` calls (5 unless told), with no flush between them, of JAX
    work on a GPU; torch work, work off the GPU and a jaxlib without a trace give None."""
    fake = FakeDevices()
    monkeypatch.setattr(compat, "trace_session_factory", lambda: fake.start_session)
    monkeypatch.setattr(timing, "jax_flush_devices", lambda *a: pytest.fail("flushed"))
    timeable = _on_gpu_timeable(fake)
    spans = timing.trace_calls(timeable)
    assert len(spans) == 5 and all(s.largest_s == pytest.approx(325e-6) for s in spans)
    assert len(timing.trace_calls(timeable, 2)) == 2
    assert timing.trace_calls(dataclasses.replace(timeable, on_gpu=False)) is None
    assert timing.trace_calls(dataclasses.replace(timeable, framework="torch")) is None
    monkeypatch.setattr(compat, "trace_session_factory", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert timing.trace_calls(timeable) is None


def test_devices_of_lists_the_arrays_devices_in_id_order():
    """The devices the arrays live on, sorted by id (the flush is dispatched to them in that
    order), however the mesh lists them; JAX's first devices where they live on fewer than
    asked for."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 host devices")
    devices = jax.devices()
    assert timing.devices_of((jax.device_put(jnp.ones(2), devices[3]),)) == [devices[3]]
    mesh = compat.make_mesh((3,), ("x",), devices=[devices[5], devices[2], devices[7]])
    x = jax.device_put(jnp.ones(6), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("x")))
    assert timing.devices_of({"x": x}) == [devices[2], devices[5], devices[7]]
    assert timing.devices_of({"x": x}, 3) == [devices[2], devices[5], devices[7]]
    assert timing.devices_of({"x": x}, 4) == devices[:4]
    assert timing.devices_of(()) == devices[:1]


def test_the_device_clocks_flush_goes_to_the_devices_holding_the_inputs(monkeypatch):
    """Inputs on a device other than JAX's first (a one-device run beside a mesh run, pinned
    to its GPU): the cold flush writes that device's L2, not the first device's, on the
    device clock and on the host clock that stands in for it where there is no trace."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 host devices")
    made = []
    fake = FlushingDevices()

    def flush_devices(nbytes, devices):
        made.append(devices)
        return fake.flush

    monkeypatch.setattr(timing, "jax_flush_devices", flush_devices)
    monkeypatch.setattr(compat, "trace_session_factory", lambda: fake.start_session)
    third = jax.devices()[3]
    timeable = timing.Timeable("pinned", "jax", lambda x: fake.call(),
                               (jax.device_put(jnp.ones(2), third),), True)
    assert timing.make_sampler(timeable, "cold", fakes.gpu_fingerprint(),
                               clock="device-span")[1] == "device-span"
    monkeypatch.setattr(compat, "trace_session_factory", lambda: None)
    with warnings.catch_warnings():  # the host clock's warning, said once
        warnings.simplefilter("ignore", RuntimeWarning)
        assert timing.make_sampler(timeable, "cold", fakes.gpu_fingerprint(),
                                   clock="device-span")[1] == "host-clock"
    assert made == [[third], [third]]


def test_the_hot_host_clock_fallback_flushes_nothing(monkeypatch):
    """Hot work that was to be timed by the device span and falls back to the host clock runs
    back to back as the hot regime says: no flush is made for it."""
    monkeypatch.setattr(timing, "jax_flush_devices", lambda *a: pytest.fail("flushed hot"))
    monkeypatch.setattr(compat, "trace_session_factory", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sampler, method = timing.make_sampler(_on_gpu_timeable(FakeDevices()), "hot",
                                              fingerprint.fingerprint(), clock="device-span")
    assert method == "host-clock" and len(sampler.take(2)) == 2


def test_torch_without_cupti_says_so_not_that_a_trace_was_taken(monkeypatch):
    """Before any device trace, torch on a GPU where CUPTI cannot be had falls back to CUDA
    events saying CUPTI is missing; asked for events, it says nothing."""
    monkeypatch.setattr(compat, "cupti_session", lambda: None)
    monkeypatch.delenv(timing.TORCH_TIMER_VARIABLE, raising=False)
    torch_work = timing.Timeable("torch-op", "torch", lambda: None, (), True)
    timing._warn_no_cupti.cache_clear()
    timing._warn_traced.cache_clear()
    with pytest.warns(RuntimeWarning, match=r"^kernelperf: CUPTI is not available here .*: "
                                            r"torch is timed by cuda-events"):
        assert timing.make_sampler(torch_work, "hot", fingerprint.fingerprint())[1] == \
            "cuda-events"
    monkeypatch.setenv(timing.TORCH_TIMER_VARIABLE, "cuda-events")
    monkeypatch.setattr(timing, "_TRACED", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert timing.make_sampler(torch_work, "hot", fingerprint.fingerprint())[1] == \
            "cuda-events"
