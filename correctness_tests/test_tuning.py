"""Tuning: selection and record logic with a fake timer (no GPU needed)."""

import dataclasses
import functools
import json

import pytest

from kernels import cli
from kernels.core import tuning


@dataclasses.dataclass(frozen=True, kw_only=True)
class FakeConfig:
    block: int
    stages: int = 2


FAKE_TIMES = {16: 3.0, 32: 1.5, 64: 2.0}


def fake_tunable(candidates):
    def make_runner(config):
        if config.block == 128:
            raise ValueError("exceeds available shared memory")  # a config that does not fit
        return lambda: config.block

    return tuning.Tunable("fakeop", "fake", candidates, make_runner, case_id="f32-8x8")


def fake_timer(runner):
    return FAKE_TIMES[runner()]


def test_tune_picks_the_fastest_and_reports_failures():
    candidates = [FakeConfig(block=b) for b in (16, 32, 64, 128)]
    best, trials = tuning.tune(fake_tunable(candidates), fake_timer, log=lambda _: None)
    assert best.config == FakeConfig(block=32)
    assert best.time_ms == 1.5
    failed = [t for t in trials if t.time_ms is None]
    assert [t.config.block for t in failed] == [128]
    assert "exceeds available shared memory" in failed[0].error


def test_tune_with_every_config_failing_returns_none():
    best, trials = tuning.tune(fake_tunable([FakeConfig(block=128)]), fake_timer,
                               log=lambda _: None)
    assert best is None and len(trials) == 1


def test_record_and_read_back_per_model(tmp_path):
    path = tmp_path / "tuned.json"
    tuning.record("fakeop", "fake", "nvidia-h100-80gb-hbm3", FakeConfig(block=32, stages=4),
                  time_ms=1.5, case_id="f32-8x8", timer="fake", path=path)
    tuning.record("fakeop", "fake", "nvidia-a100-sxm4-80gb", FakeConfig(block=64),
                  time_ms=2.0, case_id="f32-8x8", timer="fake", path=path)
    base = FakeConfig(block=8, stages=3)
    assert tuning.tuned_config("fakeop", "fake", base, model="nvidia-h100-80gb-hbm3",
                               path=path) == FakeConfig(block=32, stages=4)
    assert tuning.tuned_config("fakeop", "fake", base, model="nvidia-a100-sxm4-80gb",
                               path=path) == FakeConfig(block=64)
    assert tuning.tuned_config("fakeop", "fake", base, model="nvidia-h200",
                               path=path) is None
    data = json.loads(path.read_text())
    assert data["fake"]["nvidia-h100-80gb-hbm3"]["time_ms"] == 1.5


def test_a_tune_records_only_what_it_chose(tmp_path):
    """The fields the candidates vary are recorded; the others come from the implementation's
    default when read back, so a default changed after the tune is not undone by the entry."""
    candidates = [FakeConfig(block=b, stages=2) for b in (16, 32, 64)]
    assert tuning.chosen_fields(candidates) == ("block",)
    path = tmp_path / "tuned.json"
    tuning.record("fakeop", "fake", "gpu", FakeConfig(block=32, stages=2), time_ms=1.5,
                  case_id="f32-8x8", timer="fake", fields=tuning.chosen_fields(candidates),
                  path=path)
    assert json.loads(path.read_text())["fake"]["gpu"]["config"] == {"block": 32}
    assert tuning.tuned_config("fakeop", "fake", FakeConfig(block=8, stages=5), model="gpu",
                               path=path) == FakeConfig(block=32, stages=5)


def test_model_key_normalises_device_names():
    assert tuning.model_key("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert tuning.model_key("cpu") == "cpu"


def test_matmul_implementations_are_tunable():
    assert {"pallas_triton", "pallas_mosaic"} <= set(tuning.tunables("matmul"))


def test_tune_command_without_gpu_says_what_it_needs(capsys):
    from kernels.core import devices

    if devices.this_machine().has_gpu:
        pytest.skip("checks the CPU-only message")
    assert cli.main(["tune", "matmul"]) == 2
    assert "tune: error: expected a machine with a CUDA GPU" in capsys.readouterr().err


def test_tune_command_rejects_unknown_impl(capsys):
    assert cli.main(["tune", "matmul", "--impl", "nope"]) == 2
    assert "--impl: expected one of" in capsys.readouterr().err


def test_triton_attention_picks_its_config_by_gpu_head_dim_and_causal(monkeypatch):
    """head_dim 64 has one config per mask (its best forward differs: 128-query tiles by
    pointer loads without the mask, 64 by TMA with it), head_dim 128 one for both. Another
    sm_90 GPU (the H200) takes the H100's configs (the generic ones ran its head_dim 128
    backward at 0.30x); other GPUs the generic config."""
    import torch

    from kernels.ops.attention import triton as attention_triton

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    h100 = attention_triton.CONFIGS["NVIDIA H100 80GB HBM3"]
    pick = functools.partial(attention_triton.default_config, torch.bfloat16)
    assert pick(64, cuda, False) == h100[(64, False)]
    assert pick(64, cuda, True) == h100[(64, True)] != h100[(64, False)]
    assert pick(128, cuda, True) == pick(128, cuda, False) == h100[128]
    assert pick(64, torch.device("cpu"), False) == attention_triton.INTERPRETER_CONFIG
    assert attention_triton.default_config(torch.float32, 64, cuda) == \
        attention_triton.FLOAT32_CONFIG
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert pick(128, cuda, False) == h100[128]
    assert pick(64, cuda, False) == h100[(64, False)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert pick(128, cuda, False) == attention_triton.GENERIC_CONFIG


def test_the_tune_command_records_the_fastest_by_what_it_chose(monkeypatch, tmp_path, capsys):
    """`python -m kernels tune` on a (stand-in) GPU: the fastest candidate's varied fields go
    to the op's tuned file under the GPU model, and nothing else of its config."""
    from kernels.core import devices

    gpu = devices.Machine(platform="gpu", device_kind="NVIDIA Test GPU", device_count=1,
                          compute_capability=(9, 0))
    monkeypatch.setattr(devices, "this_machine", lambda: gpu)
    candidates = [FakeConfig(block=b, stages=7) for b in (16, 32, 64, 128)]
    monkeypatch.setattr(tuning, "tunables",
                        lambda op: {"fake": lambda: fake_tunable(candidates)})
    monkeypatch.setattr(tuning, "device_timer", fake_timer)
    monkeypatch.setattr(tuning, "tuned_path", lambda op: tmp_path / "tuned.json")
    assert cli.main(["tune", "fakeop"]) == 0
    entry = json.loads((tmp_path / "tuned.json").read_text())["fake"]["nvidia-test-gpu"]
    assert entry["config"] == {"block": 32} and entry["time_ms"] == 1.5
    assert "best FakeConfig(block=32, stages=7)" in capsys.readouterr().out


def test_a_variant_is_recorded_and_read_beside_the_plain_entry(tmp_path):
    """tuned.json keeps its layout: a variant's grid goes under "impl:variant", and neither
    entry answers for the other (a file from before variants reads as it did)."""
    path = tmp_path / "tuned.json"
    base = FakeConfig(block=8)
    tuning.record("fakeop", "fake", "gpu", FakeConfig(block=32), time_ms=1.0, case_id="c",
                  timer="t", path=path)
    assert tuning.tuned_config("fakeop", "fake", base, model="gpu", path=path,
                               variant="f32") is None
    tuning.record("fakeop", tuning.slot("fake", "f32"), "gpu", FakeConfig(block=64),
                  time_ms=2.0, case_id="c", timer="t", path=path)
    assert sorted(json.loads(path.read_text())) == ["fake", "fake:f32"]
    assert tuning.tuned_config("fakeop", "fake", base, model="gpu", path=path) == \
        FakeConfig(block=32)
    assert tuning.tuned_config("fakeop", "fake", base, model="gpu", path=path,
                               variant="f32") == FakeConfig(block=64)
    assert tuning.impl_of("fake:f32") == tuning.impl_of("fake") == "fake"
    with pytest.raises(ValueError, match="without ':'"):
        tuning.slot("fake", "f32:wide")


def test_tune_impl_names_select_every_grid_of_an_implementation(monkeypatch, tmp_path, capsys):
    from kernels.core import devices

    gpu = devices.Machine(platform="gpu", device_kind="NVIDIA Test GPU", device_count=1,
                          compute_capability=(9, 0))
    monkeypatch.setattr(devices, "this_machine", lambda: gpu)
    candidates = [FakeConfig(block=b) for b in (16, 32)]
    made = []

    def factory(variant):
        made.append(variant)
        return dataclasses.replace(fake_tunable(candidates), variant=variant)

    monkeypatch.setattr(tuning, "tunables", lambda op: {
        "fake": functools.partial(factory, ""), "fake:f32": functools.partial(factory, "f32"),
        "other": functools.partial(factory, "")})
    monkeypatch.setattr(tuning, "device_timer", fake_timer)
    monkeypatch.setattr(tuning, "tuned_path", lambda op: tmp_path / "tuned.json")
    assert cli.main(["tune", "fakeop", "--impl", "fake"]) == 0
    assert made == ["", "f32"]
    assert sorted(json.loads((tmp_path / "tuned.json").read_text())) == ["fake", "fake:f32"]
    made.clear()
    assert cli.main(["tune", "fakeop", "--impl", "fake:f32"]) == 0
    assert made == ["f32"]
    assert "fakeop/fake:f32 on nvidia-test-gpu: 2 configs, case f32-8x8 fwd" in \
        capsys.readouterr().out
    assert cli.main(["tune", "fakeop", "--impl", "fake:bf16"]) == 2
    assert "--impl: expected one of ['fake', 'fake:f32', 'other']" in capsys.readouterr().err


def test_a_sweep_runs_each_direction_and_is_timed_in_its_framework(monkeypatch):
    """A torch kernel's candidates are timed as torch work (torch's flush and wait, not
    JAX's), the forward and the backward of one config in one run."""
    from kernels.core import timing
    from kernels.ops.softmax import triton as softmax_triton

    tunable = tuning.sweep("softmax", "triton", softmax_triton.WIDE_TUNING_CANDIDATES[:1],
                           "f32-5x4097", variant="f32-wide", directions=("fwd", "bwd"))
    assert tunable.name == "triton:f32-wide"
    run = tunable.make_runner(softmax_triton.SoftmaxConfig(block=1024, num_warps=4))
    assert isinstance(run, tuning.Run) and run.framework == "torch"
    assert [t.label.split()[-1] for t in run.timeables] == ["fwd", "bwd"]
    y, (dx,) = run()
    assert tuple(y.shape) == tuple(dx.shape) == (5, 4097)
    timed = []
    monkeypatch.setattr(timing, "time_timeable", lambda timeable: timed.append(timeable) or
                        timing.Measurement.from_samples(
                            [2e-3], label="x", method="host-clock", regime="cold",
                            stop_reason="converged", fingerprint={}))
    assert tuning.device_timer(run) == pytest.approx(2.0)
    assert timed[0].framework == "torch" and timed[0].fn is run
    tuning.device_timer(lambda: None)
    assert timed[1].framework == "jax"
