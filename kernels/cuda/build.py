"""Compile `.cu` sources with nvcc into shared libraries, through a content-addressed cache.

A library's file name carries a hash of everything that decides its contents:
the source, the shared headers beside this module (common.cuh), the nvcc flags
(target architecture included) and nvcc's own version string. So a changed
source is rebuilt, an unchanged one never is, and two nvcc versions or targets
never share a file. The cache lives in `$KERNELPERF_CUDA_CACHE`, else
`$XDG_CACHE_HOME/kernelperf/cuda`, else `~/.cache/kernelperf/cuda`.

Concurrent builders (pytest-xdist workers, several `make cuda`) take a file
lock per library (`fcntl.flock`, released by the kernel if the holder dies),
look again once they hold it, and compile into a temporary file that
`os.replace` renames into place: a library file is either absent or complete,
so a reader that finds it needs no lock.

Targets: the compute capability of the GPU present (read through torch), else
`KERNELPERF_CUDA_ARCH`, else sm_90a (the H100) so CPU machines compile exactly
what the GPU machine runs. Hopper builds always use the arch-specific target
sm_90a: it is sm_90 plus wgmma/setmaxnreg, valid on exactly the chip we
compile for, so no source needs its own flag.

`python -m kernels.cuda.build` (and `make cuda`) builds every source ahead of time and
prints how many times nvcc ran.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

CACHE_VARIABLE = "KERNELPERF_CUDA_CACHE"
NVCC_VARIABLE = "KERNELPERF_NVCC"
ARCH_VARIABLE = "KERNELPERF_CUDA_ARCH"
# The H100 this suite is measured on; also the target of CPU-only (compile-check) builds.
DEFAULT_ARCH = "90a"
# Compute capabilities whose arch-specific target ("a") we build for: Hopper's wgmma.
ARCH_SPECIFIC = frozenset({(9, 0)})
# Where nvcc is looked for when it is neither named nor on PATH.
CUDA_HOMES = ("/usr/local/cuda",)

INCLUDE_DIR = Path(__file__).resolve().parent
KERNELS_DIR = INCLUDE_DIR.parent
FLAGS = ("-O3", "-std=c++17", "-lineinfo", "--shared", "-Xcompiler", "-fPIC")

NVCC_HELP = (
    "nvcc (the CUDA compiler) was not found. Install the CUDA Toolkit "
    "(https://developer.nvidia.com/cuda-downloads, or `apt install cuda-nvcc-13-0` from "
    "NVIDIA's repository), then put its bin/ on PATH, set CUDA_HOME to the toolkit, or set "
    f"{NVCC_VARIABLE} to the nvcc executable.")


class CudaBuildError(RuntimeError):
    """A CUDA source could not be built."""


class NvccNotFoundError(CudaBuildError):
    """No nvcc on this machine."""


class CompileError(CudaBuildError):
    """nvcc rejected a source; the message carries nvcc's own output."""


_counter_lock = threading.Lock()
_nvcc_runs = 0


def nvcc_invocations() -> int:
    """How many compilations this process has started (cache misses)."""
    return _nvcc_runs


def find_nvcc() -> Path:
    """The nvcc executable: $KERNELPERF_NVCC, PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, CUDA_HOMES."""
    named = os.environ.get(NVCC_VARIABLE)
    if named:
        if not os.access(named, os.X_OK):
            raise NvccNotFoundError(f"{NVCC_VARIABLE}={named!r} is not an executable. {NVCC_HELP}")
        return Path(named)
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *CUDA_HOMES]
    for home in filter(None, homes):
        candidate = Path(home) / "bin" / "nvcc"
        if os.access(candidate, os.X_OK):
            return candidate
    raise NvccNotFoundError(NVCC_HELP)


@functools.cache
def nvcc_version(nvcc: Path) -> str:
    """nvcc's full `--version` text: part of every cache key."""
    result = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True)
    if result.returncode != 0:
        raise NvccNotFoundError(f"{nvcc} --version failed: {result.stderr.strip()}. {NVCC_HELP}")
    return result.stdout.strip()


def arch_for(capability: tuple[int, int]) -> str:
    """'90a' for (9, 0), '80' for (8, 0): the target string nvcc's -gencode takes."""
    major, minor = capability
    return f"{major}{minor}" + ("a" if (major, minor) in ARCH_SPECIFIC else "")


def _check_arch(arch: str) -> str:
    if not re.fullmatch(r"[1-9]\d{1,2}a?", arch):
        raise ValueError(f"arch: expected a target like '90a' or '80', got {arch!r}")
    return arch


def default_arch() -> str:
    """$KERNELPERF_CUDA_ARCH, else the first GPU's target (via torch), else DEFAULT_ARCH."""
    named = os.environ.get(ARCH_VARIABLE)
    if named:
        return _check_arch(named)
    from kernels.core import environment

    if environment.nvidia_gpu_present():
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            return arch_for(torch.cuda.get_device_capability(0))
    return DEFAULT_ARCH


def compile_flags(arch: str) -> tuple[str, ...]:
    _check_arch(arch)
    return (*FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}")


def cache_dir() -> Path:
    named = os.environ.get(CACHE_VARIABLE)
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kernelperf" / "cuda"


def headers() -> list[Path]:
    """The shared headers every source may include (-I INCLUDE_DIR)."""
    return sorted(INCLUDE_DIR.glob("*.cuh"))


def cache_key(source: Path, flags: Sequence[str], version: str) -> str:
    digest = hashlib.sha256()
    for part in [source.read_bytes(),
                 *(h.name.encode() + b"\0" + h.read_bytes() for h in headers()),
                 "\0".join(flags).encode(), version.encode()]:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()[:20]


def sources() -> list[Path]:
    """Every CUDA source of the package (beside its operation under kernels/ops/)."""
    return sorted((KERNELS_DIR / "ops").rglob("*.cu"))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclasses.dataclass(frozen=True)
class Built:
    source: Path
    library: Path
    compiled: bool  # False: found in the cache
    seconds: float


def _compile(nvcc: Path, source: Path, flags: Sequence[str], output: Path) -> None:
    global _nvcc_runs
    with _counter_lock:
        _nvcc_runs += 1
    command = [str(nvcc), *flags, "-I", str(INCLUDE_DIR), "-o", str(output), str(source)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"nvcc failed on {source} (exit {result.returncode}):\n"
                           f"{(result.stderr or result.stdout).strip()}\n"
                           f"command: {' '.join(command)}")


def build_one(source: Path | str, arch: str | None = None) -> Built:
    """Build `source` for `arch` (default: `default_arch()`) unless the cache has it."""
    start = time.perf_counter()
    source = Path(source).resolve()
    if not source.is_file():
        raise FileNotFoundError(f"source: expected a CUDA source file, got {source} (not found)")
    nvcc = find_nvcc()
    flags = compile_flags(arch or default_arch())
    library = cache_dir() / f"{source.stem}-{cache_key(source, flags, nvcc_version(nvcc))}.so"
    if library.exists():
        return Built(source, library, False, time.perf_counter() - start)
    library.parent.mkdir(parents=True, exist_ok=True)
    with _locked(library.with_suffix(".lock")):
        if library.exists():  # another process built it while we waited
            return Built(source, library, False, time.perf_counter() - start)
        handle, temporary = tempfile.mkstemp(prefix=f".{library.stem}.", suffix=".so.tmp",
                                             dir=library.parent)
        os.close(handle)
        try:
            _compile(nvcc, source, flags, Path(temporary))
            os.chmod(temporary, 0o755)  # mkstemp made it private; the cache may be shared
            os.replace(temporary, library)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    return Built(source, library, True, time.perf_counter() - start)


def build(source: Path | str, arch: str | None = None) -> Path:
    """Path of the shared library for `source`, compiling it only if the cache lacks it."""
    return build_one(source, arch).library


def build_all(paths: Sequence[Path] | None = None, arch: str | None = None,
              jobs: int | None = None) -> list[Built]:
    """Build every source (default: all of the package's), `jobs` nvcc processes at a time."""
    paths = list(paths) if paths is not None else sources()
    arch = arch or default_arch()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count()) as pool:
        return list(pool.map(lambda path: build_one(path, arch), paths))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.cuda.build",
                                     description="Build the CUDA kernels into the cache.")
    parser.add_argument("sources", nargs="*", type=Path, help="default: every .cu of the package")
    parser.add_argument("--arch", help="target, e.g. 90a (default: the GPU present, else 90a)")
    parser.add_argument("--jobs", type=int, help="parallel nvcc processes (default: CPU count)")
    args = parser.parse_args(argv)
    arch = _check_arch(args.arch) if args.arch else default_arch()
    try:
        built = build_all(args.sources or None, arch, args.jobs)
    except CudaBuildError as error:
        print(error, file=sys.stderr)
        return 1
    root = KERNELS_DIR.parent
    for item in built:
        how = f"compiled in {item.seconds:.1f} s" if item.compiled else "cached"
        name = item.source.relative_to(root) if item.source.is_relative_to(root) else item.source
        print(f"{name}: {how} -> {item.library}")
    compiled = sum(item.compiled for item in built)
    print(f"sm_{arch}: {len(built)} libraries, nvcc ran {compiled} times (cache {cache_dir()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
