"""Which benchmarks asv runs: a quick set on a CPU by default, everything behind a flag or on
a GPU (perf_tests/benchmarks.py's `bench_cases` and `_suite`)."""

from __future__ import annotations

import perf_tests.benchmarks as benchmarks
from correctness_tests import fakes
from kernels.core import devices, environment, registry

CPU = fakes.cpu_machine(device_count=1)


def _suites(monkeypatch, machine: devices.Machine) -> dict[str, list]:
    monkeypatch.setattr(environment, "nvidia_gpu_present", lambda: machine.has_gpu)
    for variable in ("KERNELPERF_BENCH_IMPLS", "KERNELPERF_BENCH_CASES",
                     "KERNELPERF_BENCH_DIRECTIONS"):
        monkeypatch.delenv(variable, raising=False)
    return {cls.__name__: cls.params for op in registry.operations()
            if (cls := benchmarks._suite(op)) is not None}


def test_cpu_default_is_the_quick_set(monkeypatch):
    monkeypatch.delenv("KERNELPERF_BENCH_FULL", raising=False)
    suites = _suites(monkeypatch, CPU)
    assert list(suites) == ["Softmax"]
    impls, cases, directions = suites["Softmax"]
    # Only implementations that run on a CPU (no nvcc-built kernel) outside Triton's slow
    # interpreter, forward only.
    assert "cuda" not in impls and "triton" not in impls and {"pallas", "xla"} <= set(impls)
    assert cases == ["f32-64x1000"] and directions == ["fwd"]
    # Implementations named explicitly run, Triton's too (gate-power --families triton).
    monkeypatch.setenv("KERNELPERF_BENCH_IMPLS", "triton")
    named = {cls.__name__: cls.params for op in registry.operations()
             if (cls := benchmarks._suite(op)) is not None}
    assert named == {"Softmax": [["triton"], ["f32-64x1000"], ["fwd"]]}


def test_full_flag_and_gpu_run_every_benchmark(monkeypatch):
    monkeypatch.setenv("KERNELPERF_BENCH_FULL", "1")
    full_cpu = _suites(monkeypatch, CPU)
    assert {"Softmax", "Matmul", "Attention", "Mlp"} <= set(full_cpu)
    assert full_cpu["Softmax"][0] == [i.name for i in registry.implementations("softmax")]
    assert full_cpu["Softmax"][2] == list(registry.DIRECTIONS)
    monkeypatch.delenv("KERNELPERF_BENCH_FULL")
    gpu = _suites(monkeypatch, fakes.H100)  # a GPU is never narrowed by the flag
    assert set(gpu) == set(full_cpu)
    assert gpu["Softmax"][0] == full_cpu["Softmax"][0]
    assert gpu["Softmax"][1] == [c.id for c in registry.operation("softmax").cases
                                 if {"bench", "gpu"} <= c.tags]


def test_a_gpu_machine_leaves_out_cases_over_more_gpus_than_it_has(monkeypatch):
    """One GPU: no sharded class at all (each cost ~13 s a commit on an H100 to skip every
    case); four: the cases of meshes up to 4 devices; the single-device operations as ever."""
    sharded = {"ShardedMatmul", "ShardedVmap", "Moe", "TransformerBlock"}
    monkeypatch.setattr(environment, "nvidia_gpu_count", lambda: 1)
    one = _suites(monkeypatch, fakes.H100)
    assert not sharded & set(one) and {"Softmax", "Matmul", "Attention"} <= set(one)
    monkeypatch.setattr(environment, "nvidia_gpu_count", lambda: 4)
    four = _suites(monkeypatch, fakes.H100)
    assert sharded <= set(four)
    for name in sharded:
        meshes = [case.rsplit("mesh", 1)[1] for case in four[name][1]]
        assert meshes and all(int(m.split("x")[0]) * int(m.split("x")[1]) <= 4
                              for m in meshes), (name, meshes)
    assert four["Softmax"] == one["Softmax"]
