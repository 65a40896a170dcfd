"""Triton and Gluon kernels compiled for a GPU that is not here: resources and SASS.

Triton's own compiler and the ptxas and cuobjdump its wheel carries turn a kernel and the
arguments it would be launched with into a cubin for any CUDA target, on a machine without a
GPU. What the assembler reports (registers per thread, stack frame, shared memory) and the SASS
say how many CTAs fit on an SM and whether the matrix instructions and waits are the intended
ones, at no device time: tests check the Hopper kernels' schedules this way on CPU machines.

Triton's interpreter (TRITON_INTERPRET=1, which CPU test runs set) turns every @triton.jit
function, the language's own helpers included, into one that cannot be compiled, so `report`
compiles in a fresh Python without it:

    python -m kernels.profile.triton_aot MODULE:FUNCTION '{"keyword": "arguments"}'

FUNCTION(**arguments) returns (kernel, args, kwargs) as the kernel would be launched (CPU
tensors of the launch's shapes and dtypes will do); the command prints the report as JSON.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

TARGET = ("cuda", 90, 32)  # backend, compute capability, warp size: sm_90 (H100, H200)


@dataclasses.dataclass(frozen=True)
class Report:
    """What one thread and one CTA of a compiled kernel take, and its SASS."""

    registers: int  # per thread
    stack_bytes: int  # per thread; spills land here
    shared_bytes: int  # per CTA, static and dynamic
    sass: str


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_for(kernel, *args, target: tuple[str, int, int] = TARGET, **kwargs):
    """`kernel` (a @triton.jit or @gluon.jit function) compiled as `kernel[grid](*args, **kwargs)`
    would compile it, for `target` instead of this machine's GPU. Tensors stand for themselves
    by dtype and alignment only. Needs a process without Triton's interpreter."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import create_function_from_signature

    gpu = GPUTarget(*target)
    backend = make_backend(gpu)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound,
                                                              specialization, options)
    source = ASTSource
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton_compile(source(kernel, signature, constexprs, attrs), target=gpu,
                          options=options.__dict__)


def _cuobjdump(compiled, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([_tool("cuobjdump"), flag, cubin.name], capture_output=True,
                              text=True, check=True).stdout


def describe(compiled) -> Report:
    usage = _cuobjdump(compiled, "-res-usage")
    registers, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    if not registers or not stack:
        raise RuntimeError(f"cuobjdump -res-usage: no REG/STACK in {usage!r}")
    return Report(registers=int(registers.group(1)), stack_bytes=int(stack.group(1)),
                  shared_bytes=int(compiled.metadata.shared), sass=_cuobjdump(compiled, "-sass"))


def report(launch: str, **arguments) -> Report:
    """The Report of the launch `launch` ("module:function") builds from `arguments`,
    compiled in a fresh Python without Triton's interpreter."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", __name__, launch, json.dumps(arguments)],
                          env=environment, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"compiling {launch}({arguments}) failed:\n{done.stderr[-3000:]}")
    return Report(**json.loads(done.stdout))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or ":" not in argv[0]:
        print("usage: python -m kernels.profile.triton_aot MODULE:FUNCTION "
              "'{json keyword arguments}'",
              file=sys.stderr)
        return 2
    module_name, function = argv[0].split(":", 1)
    try:
        arguments = json.loads(argv[1])
        if not isinstance(arguments, dict):
            raise ValueError(f"got {type(arguments).__name__}")
    except ValueError as error:
        print(f"arguments: expected a JSON object of keyword arguments, {error}", file=sys.stderr)
        return 2
    try:
        build = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as error:
        print(f"MODULE:FUNCTION: expected an importable function, got {argv[0]!r} ({error})",
              file=sys.stderr)
        return 2
    kernel, args, kwargs = build(**arguments)
    print(json.dumps(dataclasses.asdict(describe(compile_for(kernel, *args, **kwargs)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
