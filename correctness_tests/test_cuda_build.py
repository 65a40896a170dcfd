"""The nvcc build: every kernel compiles (no GPU needed), the cache rebuilds exactly what
changed, concurrent builders compile once, and failures explain themselves."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernels.core import registry
from kernels.cuda import build

pytestmark = pytest.mark.cuda

try:
    NVCC = build.find_nvcc()
except build.NvccNotFoundError:
    NVCC = None
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc (CUDA Toolkit); not found")

PROBE = """
#include "common.cuh"
__global__ void kernelperf_probe(float* x) { x[threadIdx.x] = VALUE; }
KP_EXPORT int kernelperf_probe_launch(float* x, void* stream) {
  kernelperf_probe<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(x);
  return cudaGetLastError();
}
"""


def _libraries() -> dict[Path, object]:
    """Each registered CUDA implementation's CudaLibrary, by source."""
    found = {}
    for impl in registry.implementations():
        library = getattr(sys.modules[impl.fn.__module__], "LIBRARY", None)
        if library is not None:
            found[library.source.resolve()] = library
    return found


@needs_nvcc
@pytest.mark.parametrize("source", build.sources(), ids=lambda p: p.name)
def test_every_source_compiles_and_exports_its_entry_points(source):
    """Compile-only on CPU (the .so is not run): a kernel that does not build fails CI."""
    library = build.build(source, build.default_arch())
    lib = ctypes.CDLL(str(library))  # static CUDA runtime: loads without a GPU or driver
    lib.kernelperf_error_string.restype = ctypes.c_char_p
    assert lib.kernelperf_error_string(0) == b"no error"
    declared = _libraries().get(source.resolve())
    assert declared is not None, f"{source.name} has no launcher (a registered CudaLibrary)"
    for name in declared.signatures:
        assert hasattr(lib, name), f"{source.name} does not export {name}"


def test_sources_sit_beside_their_operations():
    assert build.sources(), "no .cu files found under kernels/ops"
    for source in build.sources():
        assert (source.parent / "spec.py").exists(), source


@pytest.fixture
def cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv(build.CACHE_VARIABLE, str(directory))
    return directory


def _probe(directory: Path, value: str = "1.0f") -> Path:
    source = directory / "probe.cu"
    source.write_text(PROBE.replace("VALUE", value))
    return source


@needs_nvcc
def test_unchanged_source_is_never_rebuilt_and_a_change_is(cache, tmp_path):
    source = _probe(tmp_path)
    before = build.nvcc_invocations()
    first = build.build_one(source, "90a")
    again = build.build_one(source, "90a")
    assert first.compiled and not again.compiled
    assert again.library == first.library
    assert build.nvcc_invocations() - before == 1

    _probe(tmp_path, "2.0f")
    changed = build.build_one(source, "90a")
    assert changed.compiled and changed.library != first.library
    assert build.nvcc_invocations() - before == 2
    assert first.library.exists()  # the old build stays valid for the old source

    other_target = build.build_one(source, "80")
    assert other_target.compiled and other_target.library != changed.library
    assert build.nvcc_invocations() - before == 3
    assert sorted(p.suffix for p in cache.iterdir() if p.suffix != ".lock") == [".so"] * 3


def test_cache_key_covers_source_flags_version_and_headers(tmp_path, monkeypatch):
    source = _probe(tmp_path)
    flags = build.compile_flags("90a")
    key = build.cache_key(source, flags, "nvcc 13.0")
    assert build.cache_key(source, flags, "nvcc 13.0") == key
    assert build.cache_key(source, flags, "nvcc 13.1") != key
    assert build.cache_key(source, build.compile_flags("80"), "nvcc 13.0") != key
    header = tmp_path / "extra.cuh"
    header.write_text("// v1")
    monkeypatch.setattr(build, "headers", lambda: [header])
    with_header = build.cache_key(source, flags, "nvcc 13.0")
    header.write_text("// v2")
    assert build.cache_key(source, flags, "nvcc 13.0") != with_header


def test_hopper_builds_use_the_arch_specific_target():
    assert build.arch_for((9, 0)) == "90a"
    assert build.arch_for((8, 0)) == "80"
    assert "-gencode=arch=compute_90a,code=sm_90a" in build.compile_flags("90a")
    with pytest.raises(ValueError, match="arch: expected a target like '90a'"):
        build.compile_flags("sm_90")


@needs_nvcc
def test_concurrent_builders_compile_once(cache, tmp_path):
    """Four processes race for an empty cache: nvcc runs once, all get the same library."""
    source = _probe(tmp_path, "3.0f")
    log = tmp_path / "nvcc.log"
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *--version*) ;; *) echo compile >> "{log}" ;; esac
        exec "{NVCC}" "$@"
        """))
    wrapper.chmod(0o755)
    env = {**os.environ, build.NVCC_VARIABLE: str(wrapper), build.CACHE_VARIABLE: str(cache),
           "PYTHONPATH": str(build.KERNELS_DIR.parent)}
    code = f"from kernels.cuda import build; print(build.build({str(source)!r}, '90a'))"
    workers = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [worker.communicate(timeout=300) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers), results
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    assert log.read_text().splitlines() == ["compile"]
    ctypes.CDLL(paths.pop())
    assert not list(cache.glob("*.tmp")), "a temporary file was left behind"


@needs_nvcc
def test_compile_error_carries_nvcc_message(cache, tmp_path):
    source = tmp_path / "broken.cu"
    source.write_text("__global__ void kernelperf_broken() { undeclared_name = 1; }\n")
    with pytest.raises(build.CompileError, match=r"(?s)nvcc failed on .*broken\.cu.*"
                                                 r"undeclared_name.*command: "):
        build.build(source, "90a")
    assert not [p for p in cache.iterdir() if p.suffix != ".lock"], "a failed build left files"


def test_missing_nvcc_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv(build.NVCC_VARIABLE, raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "CUDA_HOMES", (str(tmp_path),))
    with pytest.raises(build.NvccNotFoundError, match=r"nvcc \(the CUDA compiler\) was not "
                                                      r"found\. Install the CUDA Toolkit"):
        build.build(_probe(tmp_path), "90a")


def test_named_nvcc_must_be_an_executable(tmp_path, monkeypatch):
    monkeypatch.setenv(build.NVCC_VARIABLE, str(tmp_path / "no-such-nvcc"))
    with pytest.raises(build.NvccNotFoundError, match=f"{build.NVCC_VARIABLE}=.*no-such-nvcc"):
        build.find_nvcc()


def test_missing_source_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"source: expected a CUDA source file, got .*"
                                                r"nothing\.cu \(not found\)"):
        build.build(tmp_path / "nothing.cu", "90a")


@needs_nvcc
def test_build_command_reports_what_it_compiled(cache, tmp_path, capsys):
    source = _probe(tmp_path, "4.0f")
    assert build.main([str(source), "--arch", "90a"]) == 0
    assert "nvcc ran 1 times" in capsys.readouterr().out
    assert build.main([str(source), "--arch", "90a"]) == 0
    out = capsys.readouterr().out
    assert "probe.cu: cached" in out and "nvcc ran 0 times" in out
