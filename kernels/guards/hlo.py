"""HLO guards: what an implementation's optimized HLO must look like, checked per platform.

An implementation may declare an `HloExpectation` in the registry: per platform
("cpu", "gpu"), how many fusions its forward compiles to, which custom calls
(Pallas/Triton kernels, cuBLAS) it must contain and no others, ops that must not
run as kernels of their own (an unfused `copy` or `transpose` is an extra pass
over memory), and whether dynamic shapes are forbidden. `check(impl, case)`
compiles the forward with `jax.jit(...).lower(...).compile()`, reads the
optimized HLO text and returns a report whose failures quote the offending
HLO lines.

Kernels are counted in the computations that launch them: the entry
computation and whatever it runs (while bodies and conditions, conditional
branches, calls, async wrappers), not inside fused computations. A fusion
whose root is a forbidden op (XLA:GPU's `transpose_fusion`, `copy_fusion`)
counts as that op.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

from kernels.core import registry
from kernels.core.hlo_rules import HloRules

# HLO ops that make or use shapes known only at run time.
DYNAMIC_SHAPE_OPS = ("set-dimension-size", "get-dimension-size")
DYNAMIC_SHAPE_CUSTOM_CALLS = ("SliceToDynamic", "PadToStatic")
# Attributes through which one computation runs another as kernels (not fused into one).
_CALLED_ATTRIBUTES = ("body", "condition", "branch_computations", "true_computation",
                      "false_computation", "calls", "to_apply")
_KERNEL_LAUNCHING_OPS = ("while", "conditional", "call", "async-start", "async-update",
                         "async-done")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    shape: str
    line: str  # the HLO line, metadata removed
    computation: str


@dataclasses.dataclass(frozen=True)
class Module:
    """The parts of an optimized HLO module the guards read."""

    computations: dict[str, list[Instruction]]
    entry: str

    def root(self, computation: str) -> Instruction | None:
        instructions = self.computations.get(computation, [])
        roots = [i for i in instructions if i.line.startswith("ROOT ")]
        return (roots or instructions or [None])[-1]

    def kernel_level(self) -> list[Instruction]:
        """Instructions of the entry computation and of every computation it runs unfused."""
        seen, order, pending = set(), [], [self.entry]
        while pending:
            name = pending.pop(0)
            if name in seen or name not in self.computations:
                continue
            seen.add(name)
            for instruction in self.computations[name]:
                order.append(instruction)
                if instruction.opcode in _KERNEL_LAUNCHING_OPS:
                    pending.extend(_called(instruction.line))
        return order


_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\(")
_METADATA = re.compile(r",\s*metadata=\{[^}]*\}")


def _called(line: str) -> list[str]:
    names = []
    for attribute in _CALLED_ATTRIBUTES:
        for match in re.finditer(rf"\b{attribute}=(\{{[^}}]*\}}|%?[\w.\-]+)", line):
            names += [n.strip().lstrip("%") for n in match.group(1).strip("{}").split(",")]
    return [n for n in names if n]


def parse(text: str) -> Module:
    """Split optimized HLO text into computations and their instructions."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for raw in text.splitlines():
        header = _HEADER.match(raw)
        if header:
            current = header.group(2)
            computations[current] = []
            if header.group(1):
                entry = current
            continue
        if raw.startswith("}"):
            current = None
            continue
        if current is None:
            continue
        match = _INSTRUCTION.match(raw)
        if match:
            # Metadata and backend configs (JSON, long on GPU) would bury the op in a message.
            line = _METADATA.sub("", raw).split(", backend_config=")[0].strip()
            computations[current].append(Instruction(match.group(1), match.group(3),
                                                     match.group(2), line, current))
    if not entry:
        raise ValueError("text: expected an HLO module with an ENTRY computation")
    return Module(computations, entry)


def _fusion_root(module: Module, fusion: Instruction) -> Instruction | None:
    called = _called(fusion.line)
    return module.root(called[0]) if called else None


def _custom_call_target(instruction: Instruction) -> str:
    match = re.search(r'custom_call_target="([^"]*)"', instruction.line)
    return match.group(1) if match else "?"


def _elements(shape: str) -> int:
    """Elements of an array shape such as `f32[37,128]{1,0}` (tuples: their sum)."""
    total = 0
    for dims in re.findall(r"\w+\[([^\]]*)\]", shape):
        count = 1
        for dim in filter(None, dims.split(",")):
            count *= int(dim.strip().lstrip("<="))
        total += count
    return total


@dataclasses.dataclass(frozen=True)
class Report:
    """What one compiled forward contains and which rules it breaks."""

    label: str
    platform: str
    fusions: int
    custom_calls: tuple[str, ...]
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        calls = ", ".join(self.custom_calls) or "none"
        head = (f"{self.label} on {self.platform}: {self.fusions} fusion(s), "
                f"custom calls: {calls}")
        if self.ok:
            return f"{head}: ok"
        return "\n".join([f"{head}: {len(self.failures)} rule(s) broken", *self.failures])


def _lines(instructions: list[Instruction], limit: int = 12) -> str:
    shown = [f"    {i.computation}: {i.line}" for i in instructions[:limit]]
    if len(instructions) > limit:
        shown.append(f"    ... and {len(instructions) - limit} more")
    return "\n".join(shown)


def check_text(text: str, rules: HloRules, *, label: str, platform: str,
               case: registry.Case | None = None) -> Report:
    """Apply `rules` (for `case`) to optimized HLO `text`; failures quote the offending lines."""
    module = parse(text)
    kernels = module.kernel_level()
    fusions = [i for i in kernels if i.opcode == "fusion"]
    calls = [i for i in kernels if i.opcode == "custom-call"]
    targets = tuple(_custom_call_target(i) for i in calls)
    failures = []

    if rules.fusions is not None:
        low, high = rules.fusion_range(case)
        if not low <= len(fusions) <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            failures.append(f"  fusions: expected {expected}, got {len(fusions)}; the kernels:\n"
                            + _lines(fusions + calls))

    if rules.custom_calls is not None:
        unexpected = [i for i, t in zip(calls, targets, strict=True)
                      if not any(fnmatch.fnmatchcase(t, p) for p in rules.custom_calls)]
        missing = [p for p in rules.custom_calls
                   if not any(fnmatch.fnmatchcase(t, p) for t in targets)]
        if unexpected:
            failures.append(f"  custom calls: expected only {list(rules.custom_calls)}, "
                            f"got unexpected:\n" + _lines(unexpected))
        if missing:
            failures.append(f"  custom calls: expected {missing}, got {list(targets) or 'none'}")

    if rules.forbidden:
        offending = []
        for instruction in kernels:
            if _elements(instruction.shape) <= 1:
                continue
            if instruction.opcode in rules.forbidden:
                offending.append(instruction)
            elif instruction.opcode == "fusion":
                root = _fusion_root(module, instruction)
                if root and root.opcode in rules.forbidden:
                    # Quote the fusion and the forbidden op it was built around.
                    offending += [instruction, root]
        if offending:
            failures.append(f"  forbidden ops {list(rules.forbidden)} run as kernels of their "
                            f"own:\n" + _lines(offending))

    if rules.static_shapes:
        dynamic = [i for computation in module.computations.values() for i in computation
                   if "<=" in i.shape or i.opcode in DYNAMIC_SHAPE_OPS
                   or (i.opcode == "custom-call"
                       and _custom_call_target(i) in DYNAMIC_SHAPE_CUSTOM_CALLS)]
        if dynamic:
            failures.append("  dynamic shapes where static ones were expected:\n"
                            + _lines(dynamic))

    return Report(label, platform, len(fusions), targets, tuple(failures))


def platform() -> str:
    """"gpu" or "cpu": which of an expectation's rules apply to JAX's default backend."""
    import jax

    return "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"


def compiled_text(fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any] | None = None) -> str:
    """Optimized HLO of `fn(*args, **kwargs)` as XLA compiles it for the default backend."""
    import jax

    from kernels.core import compat

    lowered = jax.jit(functools.partial(fn, **(kwargs or {}))).lower(*args)
    return lowered.compile(compiler_options=compat.guard_compile_options()).as_text()


def case_arguments(impl: registry.Implementation, case: registry.Case) -> tuple[Any, ...]:
    """The implementation's inputs for `case` (seed 0), placed as it takes them."""
    import numpy as np

    from kernels.core import frameworks, registry

    op = registry.operation(impl.op)
    inputs = op.make_inputs(case, np.random.default_rng(0), op.distributions[0])
    return impl.place(case, frameworks.framework(impl.framework).from_numpy(inputs))


def check(impl: registry.Implementation, case: registry.Case,
          fn: Callable[..., Any] | None = None) -> Report | None:
    """Compile `impl`'s forward for `case` and apply its rules for this platform.

    Returns None where the implementation declares no rules for this platform.
    `fn` replaces `impl.fn` (tests plant faults this way).
    """
    if impl.framework != "jax":
        raise ValueError(f"impl: expected a JAX implementation, got {impl.id} "
                         f"({impl.framework})")
    where = platform()
    rules = impl.hlo.for_platform(where) if impl.hlo else None
    if rules is None:
        return None
    text = compiled_text(fn or impl.fn, case_arguments(impl, case), case.kwargs)
    return check_text(text, rules, label=f"{impl.id} {case.id} fwd", platform=where, case=case)


def expectations() -> Iterator[registry.Implementation]:
    """Registered JAX implementations that declare an HLO expectation."""
    from kernels.core import registry

    for impl in registry.implementations():
        if impl.framework == "jax" and impl.hlo is not None:
            yield impl
