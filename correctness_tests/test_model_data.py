"""A GPU model's data files (kernels/models/<model>/): the floors moved there from code, each
model's files read for that model only, and the ceilings and noise floors shipped there used
where a machine of the model has none of its own."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from correctness_tests import fakes
from kernels.bench import asv_tools
from kernels.core import modeldata
from kernels.roofline import ceilings, floors

ROOT = pathlib.Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
H100_KEY = "nvidia-h100-80gb-hbm3"
# The last commit whose kernels/roofline/floors.py held the H100's floors as code.
FLOORS_AS_CODE = "fa7eaeb"


def _old_h100_floors() -> tuple:
    shown = subprocess.run(["git", "-C", str(ROOT), "show",
                            f"{FLOORS_AS_CODE}:kernels/roofline/floors.py"],
                           capture_output=True, text=True)
    if shown.returncode:
        pytest.skip(f"needs the git history back to {FLOORS_AS_CODE} (a full clone): "
                    f"{shown.stderr.strip()[:200]}")
    spec = importlib.util.spec_from_loader("floors_as_code", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    try:
        exec(compile(shown.stdout, "floors_as_code.py", "exec"), module.__dict__)
    finally:
        del sys.modules[spec.name]
    return module.FLOORS[H100]


def _fields(floor) -> tuple:
    return tuple(getattr(floor, name) for name in (
        "op", "impl", "against", "fraction", "reason", "direction", "case", "baseline"))


# Bench cases added after the floors moved to data, whose H100 floors are set by analogy.
ADDED_SINCE = {"2048x50257"}


def test_every_h100_floor_survives_the_move_to_its_data_file():
    """Each floor of the code that held them, every field, in order, and nothing else but the
    floors of cases added since (ADDED_SINCE: no H100 measured them)."""
    old = _old_h100_floors()
    assert len(old) == 40
    moved = [f for f in floors.FLOORS[H100] if f.case not in ADDED_SINCE]
    assert [_fields(f) for f in moved] == [_fields(f) for f in old]
    assert {f.case for f in floors.FLOORS[H100]} >= ADDED_SINCE
    assert all(f.note is None for f in floors.FLOORS[H100])  # written by hand: no note


def test_a_floors_file_round_trips(tmp_path):
    """Entries to floors and back, a note included; and a written file loads as it was."""
    for floor in floors.FLOORS[H100]:
        assert floors.from_entry(floors.to_entry(floor)) == (floor,)
    noted = dataclasses.replace(floors.FLOORS[H100][0], note={"measured": [[0.9, 0.91]]})
    (back,) = floors.from_entry(json.loads(json.dumps(floors.to_entry(noted))))
    assert back == noted and back.note == {"measured": [[0.9, 0.91]]}
    data = modeldata.read(H100_KEY, modeldata.FLOORS)
    modeldata.write(H100_KEY, modeldata.FLOORS, data, tmp_path)
    assert floors.load(tmp_path) == {H100: floors.FLOORS[H100]}
    assert (tmp_path / H100_KEY / "floors.json").read_text() == \
        (modeldata.ROOT / H100_KEY / "floors.json").read_text()


def test_an_entry_for_several_kernels_is_one_floor_each_and_unknown_fields_are_refused():
    made = floors.from_entry({"op": "softmax", "impl": ["pallas", "triton"],
                              "against": "roofline", "fraction": 0.5, "reason": "r",
                              "comment": "a group's note"})
    assert [f.impl for f in made] == ["pallas", "triton"]
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['margin'\]"):
        floors.from_entry({"op": "softmax", "impl": "pallas", "against": "roofline",
                           "fraction": 0.5, "reason": "r", "margin": 0.1})


def _floors_file(root: pathlib.Path, model: str, device: str, fraction: float) -> None:
    modeldata.write(model, modeldata.FLOORS, {"device": device, "floors": [
        {"op": "softmax", "impl": "pallas", "against": "baseline", "fraction": fraction,
         "reason": f"{device}'s run"}]}, root)


def test_each_model_is_judged_by_the_floors_of_its_own_file(tmp_path):
    _floors_file(tmp_path, "nvidia-h200", "NVIDIA H200", 0.9)
    _floors_file(tmp_path, H100_KEY, H100, 0.2)
    loaded = floors.load(tmp_path)
    assert set(loaded) == {"NVIDIA H200", H100}
    assert [f.fraction for f in loaded["NVIDIA H200"]] == [0.9]
    assert [f.fraction for f in loaded[H100]] == [0.2]
    (tmp_path / H100_KEY / "floors.json").unlink()
    assert floors.load(tmp_path) == {"NVIDIA H200": loaded["NVIDIA H200"]}  # no H100 floors


def test_a_floors_file_in_another_models_folder_is_refused(tmp_path):
    """A copied file judges nothing: its device (or its model field) names another model."""
    _floors_file(tmp_path, "nvidia-h200", "NVIDIA H200", 0.9)
    copied = tmp_path / H100_KEY
    copied.mkdir()
    text = (tmp_path / "nvidia-h200" / "floors.json").read_text()
    (copied / "floors.json").write_text(text)
    with pytest.raises(ValueError, match="the data of 'nvidia-h200'; a model's file is never "
                                         "read for another"):
        floors.load(tmp_path)
    (copied / "floors.json").write_text(text.replace('"model": "nvidia-h200"',
                                                     f'"model": "{H100_KEY}"'))
    with pytest.raises(ValueError, match=r"expected a file measured on nvidia-h100-80gb-hbm3 .* "
                                         r"got device 'NVIDIA H200'"):
        floors.load(tmp_path)


def test_reload_refreshes_the_floor_table_in_place(tmp_path, monkeypatch):
    table = floors.FLOORS
    monkeypatch.setattr(floors, "FLOORS", dict(table))
    same = floors.FLOORS
    _floors_file(tmp_path, "nvidia-h200", "NVIDIA H200", 0.7)
    assert floors.reload(tmp_path) is same
    assert set(same) == {"NVIDIA H200"} and floors.table(H100) is None


def test_the_floor_naming_the_longest_case_wins_where_one_case_id_contains_another(monkeypatch):
    fields = dict(op="attention", impl="triton", against="baseline", reason="r",
                  direction="fwd")
    plain = floors.Floor(**fields, fraction=0.8, case="bf16-4x4096x16x128")
    causal = floors.Floor(**fields, fraction=0.6, case="bf16-4x4096x16x128-causal")
    monkeypatch.setitem(floors.FLOORS, "GPU", (plain, causal))
    assert floors.floor_for("GPU", "attention", "triton", "bf16-4x4096x16x128-causal",
                            "fwd") is causal
    assert floors.floor_for("GPU", "attention", "triton", "bf16-4x4096x16x128", "fwd") is plain


def test_model_folders_are_named_by_normalised_models_only(tmp_path):
    for bad in ("../x", "NVIDIA H200", ""):
        with pytest.raises(ValueError, match="model: expected a normalised GPU model name"):
            modeldata.path(bad, modeldata.FLOORS, tmp_path)
    assert modeldata.models(tmp_path / "none") == []
    written = modeldata.write("nvidia-h200", "x.json", {"b": 1, "a": [1]}, tmp_path)
    assert written.read_text() == '{\n  "a": [\n    1\n  ],\n  "b": 1,\n  "model": ' \
        '"nvidia-h200"\n}\n'
    assert modeldata.models(tmp_path) == ["nvidia-h200"]


# Ceilings and noise floors shipped for a model


def _gpu(name: str):
    from kernels.core import fingerprint

    return dataclasses.replace(fakes.gpu_fingerprint(), name=name,
                               model=fingerprint.normalise(name))


def test_shipped_ceilings_are_used_by_their_own_model_and_clock_only(tmp_path, monkeypatch):
    monkeypatch.setattr(modeldata, "ROOT", tmp_path / "models")
    monkeypatch.setenv("KERNELPERF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ceilings, "default_method", lambda device: "cupti")
    h200 = _gpu("NVIDIA H200")
    roof = ceilings.Ceiling("NVIDIA H200", "measured", 4.1e12, {"bf16": 8e14}, "copy",
                            "cupti")
    modeldata.write("nvidia-h200", modeldata.CEILINGS, {"device": "NVIDIA H200",
                                                        "ceiling": roof.to_dict()})
    assert ceilings.shipped(h200) == roof
    assert ceilings.for_device(h200, allow_measure=False) == (ceilings.datasheet("NVIDIA H200"),
                                                              roof)
    assert ceilings.shipped(_gpu(H100)) is None  # the H200's are never the H100's
    modeldata.write(H100_KEY, modeldata.CEILINGS, {"device": H100, "ceiling": roof.to_dict()})
    assert ceilings.shipped(_gpu(H100)) is None  # nor is a copy of them in the H100's folder
    monkeypatch.setattr(ceilings, "default_method", lambda device: "host-clock")
    assert ceilings.shipped(h200) is None  # timed by another clock than points here
    monkeypatch.setattr(ceilings, "default_method", lambda device: "cupti")
    cached = ceilings.cache_path("nvidia-h200")
    cached.parent.mkdir(parents=True)
    mine = dataclasses.replace(roof, bandwidth=4.0e12)
    cached.write_text(json.dumps({"ceiling": mine.to_dict()}))
    assert ceilings.for_device(h200, allow_measure=False)[1] == mine  # this machine's first


def test_shipped_noise_floors_serve_a_machine_of_their_model_with_none_of_its_own(tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr(modeldata, "ROOT", tmp_path / "models")
    results = tmp_path / ".asv" / "results"
    modeldata.write("nvidia-h200", modeldata.NOISE_FLOORS, {
        "device": "NVIDIA H200", "floors": {"benchmarks.Softmax.time_device(a)": 0.03}})
    assert asv_tools.load_floors("nvidia-h200", str(results)) == {
        "benchmarks.Softmax.time_device(a)": 0.03}
    assert asv_tools.load_floors(H100_KEY, str(results)) == {}  # never another model's
    assert asv_tools.load_floors("2x-nvidia-h200", str(results)) == {}  # nor another machine
    own = asv_tools.floors_path("nvidia-h200", str(results))
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"floors": {"benchmarks.Softmax.time_device(a)": 0.01}}))
    assert asv_tools.load_floors("nvidia-h200", str(results)) == {
        "benchmarks.Softmax.time_device(a)": 0.01}
