"""The bring-up (`python -m kernels bringup`, kernels.bench.bringup) on CPU with fakes: the
interleaved measurement, floors from measured ratios and spreads, the never-loosen rule, the
table and diff, resumption after a cut, each model's data kept to itself, and the one-line
refusal where there is no NVIDIA GPU."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import signal
import subprocess
import sys

import pytest

from correctness_tests import fakes
from kernels.bench import bringup, perfcheck
from kernels.core import modeldata, registry, timing
from kernels.roofline import floors

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


# -- floors from measured values -----------------------------------------------------------------

def test_the_margin_is_twice_the_widest_spread_within_its_bounds():
    """Known spreads: 3% between runs -> a 6% margin under the lowest run; a quiet item gets
    the 4% least; a 6% spread between one run's rounds asks for 12% and is held to 10%,
    flagged noisy."""
    between_runs = bringup.derive([[1.0, 1.0, 1.0], [0.97, 0.97, 0.97]])
    assert between_runs.spread_runs == pytest.approx(1 / 0.97 - 1)
    assert between_runs.margin == pytest.approx(2 * (1 / 0.97 - 1))
    assert between_runs.fraction == 0.909  # 0.97 x (1 - 0.0619), rounded down
    assert not between_runs.noisy
    quiet = bringup.derive([[0.8, 0.8], [0.8, 0.801]])
    assert quiet.margin == bringup.MIN_MARGIN and quiet.fraction == 0.768
    rounds = bringup.derive([[1.0, 1.06, 1.03], [1.03, 1.03, 1.03]])
    assert rounds.spread_rounds == pytest.approx(0.06) and rounds.spread_runs == 0.0
    assert rounds.margin == bringup.MAX_MARGIN and rounds.noisy
    assert rounds.fraction == 0.927  # the lowest run's median, 1.03, less 10%
    assert bringup.derive([[2.4, 2.4], [2.4, 2.4]]).fraction == 1.5  # Floor's bound


def test_a_floor_needs_two_runs_of_positive_values():
    with pytest.raises(ValueError, match="at least 2 runs"):
        bringup.derive([[1.0, 1.0], []])
    with pytest.raises(ValueError, match="positive finite"):
        bringup.derive([[1.0], [0.0]])


SOFTMAX_BIG = {"id": "softmax-pallas-f32-32768x4096-fwd", "op": "softmax", "impl": "pallas",
               "case": "f32-32768x4096", "direction": "fwd"}
SOFTMAX_SMALL = {"id": "softmax-pallas-f32-256x1024-fwd", "op": "softmax", "impl": "pallas",
                 "case": "f32-256x1024", "direction": "fwd"}
SGEMM = {"id": "matmul-cuda_sgemm-f32-4096x4096x4096-fwd", "op": "matmul",
         "impl": "cuda_sgemm", "case": "f32-4096x4096x4096", "direction": "fwd"}


def _record(kernel: float, baselines: dict[str, float], roofline: float | None,
            bound: str = "memory", rounds: int = 3, method: str = "cupti") -> dict:
    return {"method": method, "bound": bound,
            "rounds": [{"kernel": kernel, "baselines": dict(baselines), "roofline": roofline}
                       for _ in range(rounds)]}


def _decide(item, records, old=None, allow_loosen=False):
    return bringup.decide(item, records, old, allow_loosen=allow_loosen, date="2026-12-02",
                          commit="0123456789abcdef", driver="580.159.04", session="s1")


def test_each_item_gets_the_kind_of_floor_its_measurements_call_for():
    big = [_record(1e-3, {"xla": 1.1e-3}, 0.9), _record(1e-3, {"xla": 1.1e-3}, 0.9)]
    assert bringup.choose_kind(SOFTMAX_BIG, big, None) == ("roofline", None)
    small = [_record(2e-6, {"xla": 2.6e-6}, 0.3), _record(2e-6, {"xla": 2.6e-6}, 0.3)]
    assert bringup.choose_kind(SOFTMAX_SMALL, small, None) == ("baseline", None)
    compute = [_record(1e-3, {"xla": 1e-3}, 0.9, bound="compute")] * 2
    assert bringup.choose_kind(SOFTMAX_BIG, compute, None) == ("baseline", None)
    # No peer named: the rounds hold the baselines of the kernel's precision only.
    assert bringup.choose_kind(SGEMM, compute, None) == ("baseline", None)
    old = floors.Floor(op="softmax", impl="pallas", against="baseline", fraction=0.5,
                       reason="reviewed")
    assert bringup.choose_kind(SOFTMAX_BIG, big, old) == ("baseline", None)


def test_a_new_floor_carries_its_measurements_in_its_note():
    records = [_record(1e-3, {"xla": 1.2e-3, "torch": 1.5e-3}, 0.5, bound="compute"),
               _record(1e-3, {"xla": 1.19e-3}, 0.5, bound="compute")]
    decision = _decide(SOFTMAX_BIG, records)
    assert decision.status == "new" and decision.written
    floor = decision.new
    assert (floor.against, floor.baseline, floor.case, floor.direction) == \
        ("baseline", None, "f32-32768x4096", "fwd")
    assert floor.note["measured"] == [[pytest.approx(1.2)] * 3, [pytest.approx(1.19)] * 3]
    assert floor.fraction == decision.derived.fraction == floor.note["derived"]
    assert floor.fraction < 1.19
    for key, value in (("date", "2026-12-02"), ("commit", "0123456789abcdef"),
                       ("driver", "580.159.04"), ("clock", "cupti"), ("previous", None),
                       ("margin_rule", bringup.MARGIN_RULE)):
        assert floor.note[key] == value, key
    assert "2026-12-02 (01234567)" in floor.reason and len(floor.reason) <= 200
    assert floor.note["margin"] == pytest.approx(decision.derived.margin)


def test_a_floor_never_goes_down_unless_asked_and_then_says_so():
    records = [_record(1e-3, {"xla": 1.0e-3}, None, bound="compute")] * 2
    old = floors.Floor(op="softmax", impl="pallas", against="baseline", fraction=0.99,
                       reason="earlier run", case="f32-32768x4096", direction="fwd")
    kept = _decide(SOFTMAX_BIG, records, old)
    assert kept.status == "kept" and kept.new is None and not kept.written
    assert "derived 0.960 < 0.990: kept" in kept.why
    loosened = _decide(SOFTMAX_BIG, records, old, allow_loosen=True)
    assert loosened.status == "loosened" and loosened.new.fraction == 0.96
    assert loosened.new.note["previous"] == 0.99 and loosened.new.note["status"] == "loosened"
    lower = dataclasses.replace(old, fraction=0.9)
    assert _decide(SOFTMAX_BIG, records, lower).status == "tightened"
    same = dataclasses.replace(old, fraction=0.96)
    assert _decide(SOFTMAX_BIG, records, same).status == "same"


def test_no_floor_without_two_runs_or_a_same_clock_peer_and_it_says_why():
    one = _decide(SOFTMAX_BIG, [_record(1e-3, {"xla": 1e-3}, 0.9),
                                {"failed": "RuntimeError: out of memory"}])
    assert one.status == "none" and "measured in 1 run(s)" in one.why
    assert "out of memory" in one.why
    lonely = _decide(SGEMM, [_record(1e-3, {}, None, bound="compute")] * 2)
    assert lonely.status == "none" and "a baseline of its precision timed by cupti" in lonely.why
    mixed = _decide(SOFTMAX_BIG, [_record(1e-3, {}, 0.9),
                                  _record(1e-3, {}, 0.9, method="cuda-events")])
    assert mixed.status == "none" and "different clocks" in mixed.why


def test_apply_replaces_an_items_entry_in_place_and_keeps_every_other_word_for_word():
    hand = {"op": "softmax", "impl": ["pallas", "triton"], "against": "roofline",
            "fraction": 0.5, "reason": "by hand", "comment": "kept as it was"}
    earlier = floors.to_entry(floors.Floor(op="softmax", impl="pallas", against="baseline",
                                           fraction=0.5, reason="old run",
                                           case="f32-32768x4096", direction="fwd"))
    data = {"device": "NVIDIA H200", "floors": [hand, earlier]}
    records = [_record(1e-3, {"xla": 1e-3}, None, bound="compute")] * 2
    tightened = _decide(SOFTMAX_BIG, records, floors.from_entry(earlier)[0])
    new = _decide(SOFTMAX_SMALL, records)
    kept = _decide(SOFTMAX_SMALL, records, dataclasses.replace(new.new, fraction=0.99))
    out = bringup.apply(data, [tightened, new, kept], device="NVIDIA H200",
                        model="nvidia-h200")
    assert out["floors"][0] == hand
    assert out["floors"][1] == floors.to_entry(tightened.new)
    assert out["floors"][2] == floors.to_entry(new.new) and len(out["floors"]) == 3
    with pytest.raises(ValueError, match="expected the file of 'NVIDIA H100 80GB HBM3'"):
        bringup.apply(data, [], device=H100, model=H100_KEY)


def test_the_table_shows_old_new_status_measured_spread_and_margin():
    records = [_record(1e-3, {"xla": 1.0e-3}, None, bound="compute"),
               _record(1e-3, {"xla": 0.98e-3}, None, bound="compute")]
    old = floors.Floor(op="softmax", impl="pallas", against="baseline", fraction=0.99,
                       reason="earlier")
    text = bringup.floor_table([_decide(SOFTMAX_BIG, records, old),
                                _decide(SOFTMAX_SMALL, records)])
    header, rule, kept, new = text.splitlines()
    assert header.split() == ["floor", "against", "old", "new", "status", "measured", "per",
                              "run", "spread", "margin", "why"]
    assert kept.split()[:10] == ["softmax-pallas-f32-32768x4096-fwd", "best", "baseline",
                                 "0.990", "(0.940)", "kept", "1.000", "0.980", "2.0%", "4.1%"]
    assert new.split()[:9] == ["softmax-pallas-f32-256x1024-fwd", "best", "baseline", "-",
                               "0.940", "new", "1.000", "0.980", "2.0%"]


# -- the review diff ------------------------------------------------------------------------------

def _git(root: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout


def test_the_review_diff_shows_changed_and_new_data_files_and_only_names_results(tmp_path):
    _git(tmp_path, "init", "-q")
    floors_file = tmp_path / "kernels/models/nvidia-h200/floors.json"
    floors_file.parent.mkdir(parents=True)
    floors_file.write_text('{\n  "fraction": 0.5\n}\n')
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "data")
    floors_file.write_text('{\n  "fraction": 0.7\n}\n')
    (floors_file.parent / "ceilings.json").write_text('{"bandwidth": 4.1}\n')
    result = tmp_path / "perf_tests/results/asv/nvidia-h200/abc-env.json"
    result.parent.mkdir(parents=True)
    result.write_text('{"a lot": "of numbers"}\n')
    paths = [pathlib.Path("kernels/models/nvidia-h200"),
             pathlib.Path("perf_tests/results/asv/nvidia-h200")]
    text = bringup.review_diff(tmp_path, paths)
    assert '-  "fraction": 0.5' in text and '+  "fraction": 0.7' in text
    assert '+{"bandwidth": 4.1}' in text
    assert "perf_tests/results/asv/nvidia-h200/abc-env.json" in text
    assert "of numbers" not in text
    tuned, code = tmp_path / "kernels/ops/matmul/tuned.json", tmp_path / "kernels/ops/matmul/x.py"
    tuned.parent.mkdir(parents=True)
    tuned.write_text("{}\n")
    code.write_text("A = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ops")
    tuned.write_text('{"nvidia-h200": {}}\n')
    code.write_text("A = 2\n")
    text = bringup.review_diff(tmp_path, bringup.data_paths("nvidia-h200", tmp_path))
    assert '+{"nvidia-h200": {}}' in text and "A = 2" not in text  # tuned configs, not code
    plain = tmp_path.with_name(tmp_path.name + "-plain")
    plain.mkdir()
    assert bringup.review_diff(plain, paths) == (
        f"{plain} is not a git checkout: no diff to show (.ci/device/bringup.sh packs the files "
        f"written into $OUT)")


# -- the steps, with fake workers on a fake clock -------------------------------------------------

ITEMS = [SOFTMAX_BIG, SOFTMAX_SMALL, SGEMM]
SKIPPED = {"id": "matmul-cuda_mma-f32-4096x4096x4096-fwd", "op": "matmul", "impl": "cuda_mma",
           "case": "f32-4096x4096x4096", "direction": "fwd", "skip": "takes bf16/f16"}
ITEM_S = 10.0  # fake seconds a worker spends on one perf item


class _Process:
    """A worker that writes its journal as the fake clock passes: (seconds after its start,
    event) pairs; `hang` keeps it running after its last event until it is signalled."""

    def __init__(self, clock, journal, script, status=0, hang=False):
        self.clock, self.journal, self.script = clock, journal, list(script)
        self.started, self.status, self.hang = clock.monotonic(), status, hang
        self.signalled: list[int] = []
        self.pid = 0

    def poll(self):
        # A hung worker holds on through SIGINT (a kernel that never returns); SIGKILL ends it.
        if self.signalled and not (self.hang and self.signalled[-1] != 9):
            return -self.signalled[-1]
        while self.script and self.clock.monotonic() - self.started >= self.script[0][0]:
            bringup.write_event(self.journal, self.script.pop(0)[1])
        if self.script or self.hang:
            return None
        return self.status

    def wait(self):
        return self.poll()


class _Workers:
    """The spawn of a bring-up's Runner: a fake worker per command, made from the step's
    script; every command is kept."""

    def __init__(self, clock, values=None, hang_on=None, ceiling=None):
        self.clock, self.commands, self.processes = clock, [], []
        self.values = values or {}  # item id -> run -> (kernel s, {baseline: s}, roofline)
        self.hang_on = hang_on
        self.ceiling = ceiling

    def spawn(self, command, *, cwd, log):
        self.commands.append(list(command))
        step = command[command.index("--worker") + 1]
        journal = pathlib.Path(command[command.index("--journal") + 1])
        only = json.loads(pathlib.Path(command[command.index("--only") + 1]).read_text())
        script, hang = getattr(self, f"_{step}")(command, only)
        process = _Process(self.clock, journal, script, hang=hang)
        self.processes.append(process)
        return process

    def signals(self, process, number):
        process.signalled.append(number)

    def _ceilings(self, command, only):
        return [(0, {"event": "items", "items": [{"id": "ceilings"}]}),
                (0, {"event": "start", "id": "ceilings", "limit_s": 900}),
                (5, {"event": "done", "id": "ceilings", "ceiling": self.ceiling,
                     "fingerprint": {"name": self.ceiling["device"]}})], False

    def _perf(self, command, only):
        run = command[command.index("--run") + 1]
        listed = [{**item, "skip": None, "limit_s": 60.0} for item in ITEMS] + [SKIPPED]
        script, at = [(0, {"event": "items", "items": listed})], 0.0
        for item in ITEMS:
            if only is not None and item["id"] not in only:
                continue
            script.append((at, {"event": "start", "id": item["id"], "limit_s": 60.0}))
            if item["id"] == self.hang_on:
                return script, True
            at += ITEM_S
            kernel, peers, roof = self.values[item["id"]][run]
            script.append((at, {"event": "done", "id": item["id"], "run": int(run),
                                "method": "cupti", "bound": "memory" if roof else "compute",
                                "errors": {}, "throttled": 0, "seconds": ITEM_S,
                                "rounds": [{"kernel": kernel, "baselines": peers,
                                            "roofline": roof}] * 3}))
        return script, False

    def measured(self) -> list[tuple[str, str]]:
        """(run, item) of every item a perf worker was asked to measure, in order."""
        asked = []
        for command in self.commands:
            if command[command.index("--worker") + 1] != "perf":
                continue
            only = json.loads(pathlib.Path(command[command.index("--only") + 1]).read_text())
            run = command[command.index("--run") + 1]
            asked += [(run, item["id"]) for item in ITEMS if only is None or item["id"] in only]
        return asked


H200_CEILING = {"device": "NVIDIA H200", "kind": "measured", "bandwidth": 4.2e12,
                "flops": {"bf16": 8.1e14}, "source": "copy", "method": "cupti"}


def _values(scale: float = 1.0) -> dict:
    """Two runs of every item: the big softmax at 0.86/0.88 of the roof, the small one and the
    sgemm against their peers."""
    return {SOFTMAX_BIG["id"]: {"1": (3.0e-4, {"xla": 3.2e-4}, 0.88 * scale),
                                "2": (3.0e-4, {"xla": 3.2e-4}, 0.86 * scale)},
            SOFTMAX_SMALL["id"]: {"1": (2.0e-6 / scale, {"xla": 2.6e-6}, 0.3),
                                  "2": (2.0e-6 / scale, {"xla": 2.5e-6}, 0.3)},
            # The perf worker records a round's baselines of the kernel's precision only
            # (FP32: torch's GEMM, not XLA's TF32 one; test_a_round_keeps_...).
            SGEMM["id"]: {"1": (3.2e-3 / scale, {"torch": 2.7e-3}, None),
                          "2": (3.2e-3 / scale, {"torch": 2.7e-3}, None)}}


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A models folder holding the H100's real floors file, and nothing of the H200."""
    root = tmp_path / "models"
    (root / H100_KEY).mkdir(parents=True)
    (root / H100_KEY / "floors.json").write_bytes(
        (modeldata.ROOT / H100_KEY / "floors.json").read_bytes())
    monkeypatch.setattr(floors, "FLOORS", dict(floors.FLOORS))  # reload() writes into it
    return root


def _context(tmp_path, data_root, workers, clock, **options) -> bringup.Context:
    lines = []
    ctx = bringup.Context(model="nvidia-h200", device="NVIDIA H200", driver="580.159.04",
                          commit="feedface" * 5, root=tmp_path, worker=["py", "--worker"],
                          runner=bringup.Runner(clock=clock, spawn=workers.spawn,
                                                signals=workers.signals),
                          data_root=data_root, log=lines.append, **options)
    ctx.lines = lines
    return ctx


def test_a_bring_up_writes_the_models_ceilings_and_floors_and_nothing_of_another_model(
        tmp_path, data_root):
    clock = fakes.Clock()
    workers = _Workers(clock, _values(), ceiling=H200_CEILING)
    h100_before = (data_root / H100_KEY / "floors.json").read_bytes()
    ctx = _context(tmp_path, data_root, workers, clock)
    assert bringup.run(ctx, ["ceilings", "perf", "floors"]) is True
    shipped = modeldata.read("nvidia-h200", modeldata.CEILINGS, data_root)
    assert shipped["ceiling"] == H200_CEILING and shipped["device"] == "NVIDIA H200"
    written = modeldata.read("nvidia-h200", modeldata.FLOORS, data_root)
    assert written["device"] == "NVIDIA H200"
    by_item = {(e["op"], e["impl"], e["case"]): e for e in written["floors"]}
    big = by_item[("softmax", "pallas", "f32-32768x4096")]
    assert big["against"] == "roofline" and big["note"]["per_run"] == [0.88, 0.86]
    assert big["fraction"] == 0.82  # 0.86 less 2 x 2.3% (0.88 / 0.86 - 1)
    assert big["note"]["previous"] is None  # the H100's floor of this kernel is not the H200's
    sgemm = by_item[("matmul", "cuda_sgemm", "f32-4096x4096x4096")]
    assert sgemm["against"] == "baseline" and sgemm["fraction"] < 2.7 / 3.2
    assert (data_root / H100_KEY / "floors.json").read_bytes() == h100_before
    assert floors.table("NVIDIA H200") and floors.floor_for(
        "NVIDIA H200", "softmax", "pallas", "f32-32768x4096", "fwd").fraction == 0.82
    assert floors.floor_for(H100, "softmax", "pallas", "f32-32768x4096", "fwd").fraction == 0.8
    state = modeldata.read("nvidia-h200", modeldata.BRINGUP, data_root)
    assert set(state["session"]["steps"]) == {"ceilings", "perf", "floors"}
    assert state["session"]["perf"]["items"][SKIPPED["id"]]["skip"] == "takes bf16/f16"
    assert workers.measured() == [(run, item["id"]) for run in "12" for item in ITEMS]
    assert any(line.startswith("perf run 2/2 [3/3] matmul-cuda_sgemm") for line in ctx.lines)


def test_a_cut_bring_up_goes_on_where_it_stopped_and_measures_nothing_twice(tmp_path,
                                                                            data_root):
    clock = fakes.Clock()
    workers = _Workers(clock, _values())
    # Cut 25 fake seconds in: two items of run 1 done, the third in flight.
    ctx = _context(tmp_path, data_root, workers, clock, deadline=clock.monotonic() + 25)
    assert bringup.run(ctx, ["perf", "floors"]) is False
    state = modeldata.read("nvidia-h200", modeldata.BRINGUP, data_root)
    assert sorted(state["session"]["perf"]["runs"]["1"]) == sorted(
        [SOFTMAX_BIG["id"], SOFTMAX_SMALL["id"]])
    assert "perf" not in state["session"]["steps"]
    assert workers.processes[0].signalled  # the worker in flight was ended at the deadline
    again = _context(tmp_path, data_root, workers, clock)
    assert bringup.run(again, ["perf", "floors"]) is True
    assert any("continuing the session" in line for line in again.lines)
    assert workers.measured() == [("1", SOFTMAX_BIG["id"]), ("1", SOFTMAX_SMALL["id"]),
                                  ("1", SGEMM["id"]), ("1", SGEMM["id"]),
                                  *(("2", item["id"]) for item in ITEMS)]
    state = modeldata.read("nvidia-h200", modeldata.BRINGUP, data_root)
    assert all(len(state["session"]["perf"]["runs"][run]) == 3 for run in "12")
    assert {"perf", "floors"} <= set(state["session"]["steps"])


def test_a_hung_item_fails_alone_and_a_fresh_worker_measures_the_rest(tmp_path, data_root):
    clock = fakes.Clock()
    workers = _Workers(clock, _values(), hang_on=SOFTMAX_SMALL["id"])
    ctx = _context(tmp_path, data_root, workers, clock, runs=2)
    assert bringup.run(ctx, ["perf"]) is True
    runs = modeldata.read("nvidia-h200", modeldata.BRINGUP, data_root)["session"]["perf"]["runs"]
    assert runs["1"][SOFTMAX_SMALL["id"]] == {
        "failed": "ran past its time limit of 60 s; the worker was ended"}
    assert "rounds" in runs["1"][SGEMM["id"]] and "rounds" in runs["2"][SOFTMAX_BIG["id"]]
    assert workers.processes[0].signalled == [2, 9]  # SIGINT, then SIGKILL after the grace


def test_a_second_bring_up_refines_and_keeps_a_floor_that_would_go_down(tmp_path, data_root):
    clock = fakes.Clock()
    first = _context(tmp_path, data_root, _Workers(clock, _values(), ceiling=H200_CEILING),
                     clock)
    assert bringup.run(first, ["ceilings", "perf", "floors"])
    written = (data_root / "nvidia-h200" / "floors.json").read_text()
    # Every step of the session is done once the rest are: mark them so, as a full run would.
    state = modeldata.read("nvidia-h200", modeldata.BRINGUP, data_root)
    state["session"]["steps"].update({s: {"done": "x"} for s in ("tune", "noise", "history")})
    modeldata.write("nvidia-h200", modeldata.BRINGUP, state, data_root)
    slower = _context(tmp_path, data_root, _Workers(clock, _values(0.9),
                                                    ceiling=H200_CEILING), clock)
    assert bringup.run(slower, ["perf", "floors"])
    assert any("new session (the last session finished: refining)" in line
               for line in slower.lines)
    assert {d.status for d in slower.decisions} == {"kept"}
    assert (data_root / "nvidia-h200" / "floors.json").read_text() == written
    allowed = _context(tmp_path, data_root, _Workers(clock, _values(0.9)), clock,
                       allow_loosen=True)
    assert bringup.run(allowed, ["perf", "floors"], restart=True)
    assert {d.status for d in allowed.decisions} == {"loosened"}
    assert floors.floor_for("NVIDIA H200", "softmax", "pallas", "f32-32768x4096",
                            "fwd").fraction < 0.82


def test_floors_need_this_sessions_perf_runs(tmp_path, data_root):
    ctx = _context(tmp_path, data_root, _Workers(fakes.Clock()), fakes.Clock())
    with pytest.raises(ValueError, match="floors: needs the perf step's runs"):
        bringup.run(ctx, ["floors"])


def test_a_session_is_one_devices_and_more_runs_reopen_the_perf_step():
    clock = fakes.Clock()
    state, said = bringup.session_for(None, device="NVIDIA H200", commit="c", runs=2, rounds=3,
                                      restart=False, clock=clock)
    assert said == "new session (first bring-up of this model)"
    state["session"]["steps"]["perf"] = {"done": "x"}
    state["session"]["steps"]["floors"] = {"done": "x"}
    again, said = bringup.session_for(state, device="NVIDIA H200", commit="c", runs=3,
                                      rounds=3, restart=False, clock=clock)
    assert said.startswith("continuing the session") and again["session"]["runs"] == 3
    assert "perf" not in again["session"]["steps"] and "floors" not in again["session"]["steps"]
    with pytest.raises(ValueError, match="cannot be continued on 'NVIDIA H100 80GB HBM3'"):
        bringup.session_for(state, device=H100, commit="c", runs=2, rounds=3, restart=False,
                            clock=clock)


# -- who is served -------------------------------------------------------------------------------

def _sysfs(root: pathlib.Path, devices: dict[str, tuple[str, str]]) -> pathlib.Path:
    for name, (kind, vendor) in devices.items():
        (root / name).mkdir(parents=True)
        (root / name / "class").write_text(kind + "\n")
        (root / name / "vendor").write_text(vendor + "\n")
    return root


def test_gpu_vendors_are_read_from_the_display_and_accelerator_devices(tmp_path):
    root = _sysfs(tmp_path, {"0000:00:01.0": ("0x060000", "0x8086"),  # a bridge
                             "0000:01:00.0": ("0x030000", "0x1002"),  # a VGA controller
                             "0000:02:00.0": ("0x030200", "0x10de"),  # a 3D controller
                             "0000:03:00.0": ("0x120000", "0x1e3e")})  # an accelerator
    assert bringup.gpu_vendors(root) == ["AMD", "NVIDIA", "vendor 0x1e3e"]
    assert bringup.gpu_vendors(tmp_path / "none") == []


def _main(monkeypatch, capsys, *, nvidia: bool, vendors: list[str]):
    from kernels import cli
    from kernels.core import environment, fingerprint

    monkeypatch.setattr(environment, "nvidia_gpu_present", lambda: nvidia)
    monkeypatch.setattr(bringup, "gpu_vendors", lambda: vendors)
    monkeypatch.setattr(fingerprint, "identity", lambda: fingerprint.Identity(
        "cpu", "AMD EPYC 7B13", "amd-epyc-7b13", None, None, None))
    status = cli.main(["bringup"])
    return status, capsys.readouterr()


def test_a_machine_without_a_gpu_is_refused_in_one_line(monkeypatch, capsys):
    status, out = _main(monkeypatch, capsys, nvidia=False, vendors=[])
    assert status == 2 and out.out == ""
    assert out.err == ("python -m kernels bringup: error: needs an NVIDIA GPU (it measures "
                       "through CUPTI and NVML); this machine has no GPU (AMD EPYC 7B13): "
                       "nothing brought up\n")


def test_a_gpu_of_another_vendor_is_refused_in_one_line_naming_it(monkeypatch, capsys):
    status, out = _main(monkeypatch, capsys, nvidia=False, vendors=["AMD"])
    assert status == 2 and out.out == "" and out.err.count("\n") == 1
    assert "this machine's GPU is AMD, not NVIDIA (AMD EPYC 7B13): nothing brought up" in out.err


# -- tune, noise and history, as their workers report -------------------------------------------

class _StepWorkers(_Workers):
    def _tune(self, command, only):
        names = ["matmul/pallas_triton", "attention/pallas_mosaic"]
        script = [(0, {"event": "items", "items": [{"id": n} for n in names]})]
        for at, name in enumerate(n for n in names if only is None or n in only):
            script += [(at * 20, {"event": "start", "id": name, "limit_s": 100}),
                       (at * 20 + 19, {"event": "done", "id": name, "config": {"block_m": 128},
                                       "time_ms": 1.5, "case": "bf16-x",
                                       "path": f"kernels/ops/{name.split('/')[0]}/tuned.json"})]
        return script, False

    def _noise(self, command, only):
        names = ["Matmul", "Softmax"]
        script = [(0, {"event": "items", "items": [{"id": n} for n in names]})]
        for at, name in enumerate(n for n in names if only is None or n in only):
            script += [(at * 50, {"event": "start", "id": name, "limit_s": 100}),
                       (at * 50 + 49, {"event": "done", "id": name, "commit": "c0ffee",
                                       "floors": {f"benchmarks.{name}.time_device(a)": 0.02}})]
        return script, False


def test_tune_and_noise_record_what_each_worker_finished_and_go_on_after_a_cut(tmp_path,
                                                                              data_root):
    clock = fakes.Clock()
    workers = _StepWorkers(clock)
    cut = _context(tmp_path, data_root, workers, clock, deadline=clock.monotonic() + 30)
    assert bringup.run(cut, ["tune", "noise"]) is False  # one kernel tuned, then the deadline
    tune = modeldata.read("nvidia-h200", modeldata.BRINGUP, data_root)["session"]["tune"]
    assert tune["matmul/pallas_triton"]["config"] == {"block_m": 128}
    assert "attention/pallas_mosaic" not in tune
    rest = _context(tmp_path, data_root, workers, clock)
    assert bringup.run(rest, ["tune", "noise"]) is True
    tune_onlys = [json.loads(pathlib.Path(c[c.index("--only") + 1]).read_text())
                  for c in workers.commands if "tune" in c]
    assert tune_onlys == [None, ["attention/pallas_mosaic"]]
    shipped = modeldata.read("nvidia-h200", modeldata.NOISE_FLOORS, data_root)
    assert shipped["device"] == "NVIDIA H200"
    assert shipped["floors"] == {"benchmarks.Matmul.time_device(a)": 0.02,
                                 "benchmarks.Softmax.time_device(a)": 0.02}
    assert shipped["learned"]["benchmarks.Softmax.time_device(a)"]["commit"] == "c0ffee"
    assert not (data_root / H100_KEY / "noise-floors.json").exists()


def test_the_tune_runs_before_the_perf_runs_so_the_floors_measure_the_configs_that_ship(
        tmp_path, data_root):
    clock = fakes.Clock()
    workers = _StepWorkers(clock, _values())
    ctx = _context(tmp_path, data_root, workers, clock)
    assert bringup.run(ctx, ["perf", "floors", "tune"]) is True  # asked in any order
    kinds = [c[c.index("--worker") + 1] for c in workers.commands]
    assert kinds == ["tune", "perf", "perf"]


def _result(root: pathlib.Path, machine: str, commit: str, classes: list[str]) -> None:
    fakes.asv_result_file(root, machine, commit, {
        f"benchmarks.{name}.time_device": [[1e-3, None], [["'a'", "'b'"]], "1", 1]
        for name in classes})


def test_complete_commits_are_those_with_every_class_any_commit_measured(tmp_path):
    _result(tmp_path, "m", "a" * 40, ["Softmax", "Matmul"])
    _result(tmp_path, "m", "b" * 40, ["Softmax"])
    fakes.asv_result_file(tmp_path, "m", "c" * 40, {
        "benchmarks.Matmul.time_device": [[None, None], [["'a'", "'b'"]], "1", 1],
        "benchmarks.Softmax.time_device": [[1e-3], [["'a'"]], "1", 1]})
    assert bringup.complete_commits(tmp_path / "m") == (1, 3, ["Matmul", "Softmax"])
    assert bringup.complete_commits(tmp_path / "none") == (0, 0, [])


class _History:
    """asv's history run as a fake: fetch makes the worktree, run writes `per_run` new commits'
    results (every class) into it."""

    def __init__(self, clock, root: pathlib.Path, per_run: int):
        self.clock, self.root, self.per_run, self.commands = clock, root, per_run, []
        self.made = 0

    def spawn(self, command, *, cwd, log):
        self.commands.append(command)
        worktree = self.root / ".asv" / "history"
        if "fetch" in command:
            (worktree / ".git").mkdir(parents=True, exist_ok=True)
        else:
            for _ in range(self.per_run):
                self.made += 1
                _result(worktree, "nvidia-h200", f"{self.made:08x}" + "0" * 32,
                        ["Softmax", "Matmul"])
            (worktree / "benchmarks.json").write_text('{"benchmarks.Softmax.time_device": {}}')
        return _Process(self.clock, self.root / "unused.jsonl", [])

    def signals(self, process, number):
        process.signalled.append(number)


def test_history_fills_the_shipped_results_to_the_commits_asked_for(tmp_path, data_root):
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
         "--allow-empty", "-m", "root")
    shipped = tmp_path / "perf_tests/results/asv"
    _result(shipped, "nvidia-h200", "f" * 40, ["Softmax"])  # a partial commit shipped before
    clock = fakes.Clock()
    history = _History(clock, tmp_path, per_run=2)
    ctx = _context(tmp_path, data_root, history, clock, history_commits=3)
    ctx.runner = bringup.Runner(clock=clock, spawn=history.spawn, signals=history.signals)
    assert bringup.run(ctx, ["history"]) is True
    assert bringup.complete_commits(shipped / "nvidia-h200")[:2] == (4, 5)
    assert (tmp_path / ".asv/history/nvidia-h200" / ("f" * 8 + "-env.json")).exists()
    runs = [c for c in history.commands if "run" in c]
    # 1 complete of 1 first (the partial commit was all there was); then 2 of 3, the partial
    # one no longer complete once Matmul is measured.
    assert [c[c.index("--max-commits") + 1] for c in runs] == ["2", "1"]
    assert all(c[c.index("--machine") + 1] == "nvidia-h200" for c in runs)
    assert all(c[c.index("--bench") + 1] == "time_device" for c in runs)
    assert json.loads((shipped / "benchmarks.json").read_text()) == {
        "benchmarks.Softmax.time_device": {}}


def test_history_needs_a_git_checkout_with_main(tmp_path, data_root):
    ctx = _context(tmp_path, data_root, _Workers(fakes.Clock()), fakes.Clock())
    with pytest.raises(ValueError, match="history: needs a git checkout with a branch main"):
        bringup.run(ctx, ["history"])


# -- the real pieces: a worker process, and the perf worker on this CPU ------------------------

def test_a_real_worker_past_its_items_limit_is_ended_with_its_process_group(tmp_path,
                                                                           monkeypatch):
    """...at the SIGINT, even where this process was started with SIGINT ignored (a shell's
    background job: make test's own commands, CI), not after the grace before SIGKILL."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    monkeypatch.setattr(bringup, "GRACE_S", 20.0)
    journal = tmp_path / "w.jsonl"
    script = ("import json, sys, time\n"
              "open(sys.argv[1], 'a').write(json.dumps({'event': 'start', 'id': 'x', "
              "'limit_s': 0.5}) + '\\n')\n"
              "time.sleep(60)\n")
    events = []
    outcome = bringup.Runner().run([sys.executable, "-c", script, str(journal)], cwd=tmp_path,
                                   log=tmp_path / "w.log", journal=journal,
                                   on_event=events.append, deadline=None)
    assert outcome.hung == "x" and outcome.limit_s == 0.5 and outcome.status is not None
    signal.signal(signal.SIGINT, previous)
    assert outcome.seconds < 10 and events == [{"event": "start", "id": "x", "limit_s": 0.5}]


def test_the_perf_worker_measures_this_cpus_items_interleaved(tmp_path, monkeypatch):
    """The worker as the bring-up starts it, on the CPU's one timed kernel: its items listed,
    then one item measured in two rounds against its baselines."""
    from kernels import cli

    items = [item for item in perfcheck.perf_items() if item.skip_reason is None]
    assert items, "a CPU times at least one perf item"
    journal, only = tmp_path / "perf.jsonl", tmp_path / "only.json"
    only.write_text(json.dumps([items[0].id]))
    status = cli.main(["bringup", "--worker", "perf", "--journal", str(journal), "--only",
                       str(only), "--run", "1", "--rounds", "2", "--budget", "0.1"])
    assert status == 0
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [e["event"] for e in events] == ["items", "start", "done"]
    listed = {e["id"]: e for e in events[0]["items"]}
    assert set(listed) == {item.id for item in perfcheck.perf_items()}
    assert listed[items[0].id]["limit_s"] > 0 and listed[items[0].id]["skip"] is None
    done = events[2]
    assert done["id"] == items[0].id and done["method"] == "host-clock"
    assert len(done["rounds"]) == 2 and all(r["kernel"] > 0 for r in done["rounds"])
    assert all(r["baselines"] for r in done["rounds"]) and done["bound"] is None


def test_history_stops_when_asv_adds_no_commit(tmp_path, data_root):
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
         "--allow-empty", "-m", "root")
    clock = fakes.Clock()
    history = _History(clock, tmp_path, per_run=0)
    ctx = _context(tmp_path, data_root, history, clock, history_commits=3)
    ctx.runner = bringup.Runner(clock=clock, spawn=history.spawn, signals=history.signals)
    with pytest.raises(RuntimeError, match="history: asv added no commit"):
        bringup.run(ctx, ["history"])


def test_a_round_keeps_the_baselines_of_the_kernels_clock_and_precision_only():
    """The perf worker's round records divide by peers of the kernel's precision and clock:
    an FP32 SGEMM's rounds hold torch's FP32 GEMM, not XLA's TF32 one (8x faster: a floor of
    it would measure the precision) nor a baseline timed by another clock."""
    from kernels.cli import bringup as cli_bringup

    impl = registry.implementation("matmul", "cuda_sgemm")
    case = next(c for c in registry.operation("matmul").cases if c.id == "f32-4096x4096x4096")
    item = perfcheck.PerfItem(impl, case, "fwd")

    def m(seconds, precision, method="cupti"):
        return timing.Measurement.from_samples([seconds], label="m", method=method,
                                               regime="cold", stop_reason="converged",
                                               fingerprint={}, precision=precision)

    result = perfcheck.Interleaved(
        name=impl.name, kernel=m(3.2e-3, "FP32"),
        baselines={"torch": m(2.7e-3, "FP32"), "xla": m(3.4e-4, "TF32"),
                   "torch_tf32": m(3.0e-4, "TF32"), "events": m(2.6e-3, "FP32", "cuda-events")},
        rounds=({impl.name: 3.2e-3, "torch": 2.7e-3, "xla": 3.4e-4, "torch_tf32": 3.0e-4,
                 "events": 2.6e-3},), errors={})
    rounds, _ = cli_bringup._round_records(item, result, fakes.gpu_fingerprint())
    assert [r["baselines"] for r in rounds] == [{"torch": 2.7e-3}]
