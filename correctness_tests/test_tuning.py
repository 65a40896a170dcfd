"""Tuning: selection and record logic with a fake timer (no GPU needed)."""

import dataclasses
import json

import pytest

from kernels import cli, tuning


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
    assert tuning.tuned_config("fakeop", "fake", FakeConfig, model="nvidia-h100-80gb-hbm3",
                               path=path) == FakeConfig(block=32, stages=4)
    assert tuning.tuned_config("fakeop", "fake", FakeConfig, model="nvidia-a100-sxm4-80gb",
                               path=path) == FakeConfig(block=64)
    assert tuning.tuned_config("fakeop", "fake", FakeConfig, model="nvidia-h200",
                               path=path) is None
    data = json.loads(path.read_text())
    assert data["fake"]["nvidia-h100-80gb-hbm3"]["time_ms"] == 1.5


def test_model_key_normalises_device_names():
    assert tuning.model_key("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert tuning.model_key("cpu") == "cpu"


def test_matmul_implementations_are_tunable():
    assert {"pallas_triton", "pallas_mosaic"} <= set(tuning.tunables("matmul"))


def test_tune_command_without_gpu_says_what_it_needs(capsys):
    from kernels import devices

    if devices.this_machine().has_gpu:
        pytest.skip("checks the CPU-only message")
    assert cli.main(["tune", "matmul"]) == 2
    assert "tune needs a CUDA GPU" in capsys.readouterr().err


def test_tune_command_rejects_unknown_impl(capsys):
    assert cli.main(["tune", "matmul", "--impl", "nope"]) == 2
    assert "--impl: expected one of" in capsys.readouterr().err
