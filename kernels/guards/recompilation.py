"""Recompilation guard: new values of the same shapes must not compile anything again.

`check(impl, case)` calls a JAX implementation (forward, and its VJP where it
has one) with inputs from one seed, then with inputs from another seed of the
same shapes and dtypes, and counts XLA backend compiles during the second
call through JAX's monitoring events. Any compile is a failure; the report
names the argument responsible:

- the implementation's own arguments whose abstract signature (shape, dtype,
  weak type, sharding) differs between the calls;
- the arguments of each function JAX traced again: two more calls with new
  values run under `sys.setprofile`, which records what the retraced Python
  function was called with (a static argument shows its two values);
- JAX's explanation of each tracing-cache miss (`jax_explain_cache_misses`;
  jax 0.10.2 names the argument path, 0.11.2 cannot explain a changed static
  keyword argument, hence the recording above).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kernels.core import compat, frameworks, registry


@dataclasses.dataclass
class CompileLog:
    """Backend compiles (by function name), traces and JAX's cache-miss explanations."""

    compiles: list[str] = dataclasses.field(default_factory=list)
    traces: list[str] = dataclasses.field(default_factory=list)
    explanations: list[str] = dataclasses.field(default_factory=list)


class _Explanations(logging.Handler):
    def __init__(self, log: CompileLog):
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "CACHE MISS" in message:
            self.log.explanations.append(message)


@contextlib.contextmanager
def recording() -> Iterator[CompileLog]:
    """Record compiles, traces and cache-miss explanations made inside the block."""
    log = CompileLog()

    def listener(event: str, seconds: float, **metadata: Any) -> None:
        name = str(metadata.get("fun_name", "?"))
        if event == compat.BACKEND_COMPILE_EVENT:
            log.compiles.append(name)
        elif event == compat.TRACE_EVENT:
            log.traces.append(name)

    handler = _Explanations(log)
    jax_logger = logging.getLogger("jax")
    remove = compat.add_duration_listener(listener)
    jax_logger.addHandler(handler)
    try:
        with compat.explain_cache_misses():
            yield log
    finally:
        jax_logger.removeHandler(handler)
        remove()


def signature(args: tuple[Any, ...], names: tuple[str, ...]) -> dict[str, str]:
    """Per argument, what jax.jit keys its cache on: shape, dtype, weak type, sharding
    (arrays), or the value itself (anything else, as a static argument would be)."""
    described = {}
    for name, arg in zip(names, args, strict=True):
        if hasattr(arg, "shape") and hasattr(arg, "dtype"):
            weak = " (weak type)" if getattr(arg, "weak_type", False) else ""
            sharding = getattr(arg, "sharding", None)
            described[name] = f"{arg.dtype}{list(arg.shape)}{weak} {sharding}"
        else:
            described[name] = repr(arg)
    return described


@dataclasses.dataclass(frozen=True)
class Report:
    label: str
    compiles: tuple[str, ...]
    traces: tuple[str, ...]
    changed_arguments: tuple[str, ...]
    explanations: tuple[str, ...]
    retraced_arguments: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.compiles

    @property
    def culprits(self) -> tuple[str, ...]:
        """Arguments named as the cause: ours whose signature changed, then those JAX's
        explanations point at (`for f defined at ...` ... `input path [1]['scale']`)."""
        names = [change.split(":")[0] for change in self.changed_arguments]
        names += [change.split(" (")[0] for change in self.retraced_arguments]
        for text in self.explanations:
            function = re.search(r"\bfor (\S+) defined at", text)
            for path in re.findall(r"input path (\S+?),", text):
                names.append(f"{path} of {function.group(1) if function else '?'}")
        return tuple(dict.fromkeys(names))

    def __str__(self) -> str:
        if self.ok:
            return f"{self.label}: no recompilation on new values of the same shapes"
        lines = [f"{self.label}: {len(self.compiles)} compile(s) on the second call with new "
                 f"values of the same shapes: {', '.join(self.compiles)}"]
        if self.culprits:
            lines.append(f"  caused by: {'; '.join(self.culprits)}")
        lines += [f"  argument {change}" for change in self.changed_arguments]
        lines += [f"  retraced with {change}" for change in self.retraced_arguments]
        lines += ["  JAX: " + text.replace("\n", "\n       ") for text in self.explanations]
        if not self.culprits:
            lines.append(f"  no argument differs between the calls (a function defined anew "
                         f"per call?); traced again: {', '.join(self.traces) or 'nothing'}")
        return "\n".join(lines)


def _inputs(impl: registry.Implementation, case: registry.Case, seed: int) -> tuple[Any, ...]:
    op = registry.operation(impl.op)
    arrays = op.make_inputs(case, np.random.default_rng(seed), op.distributions[0])
    return impl.place(case, frameworks.framework("jax").from_numpy(arrays))


def _calls(fn: Callable[..., Any], kwargs: dict[str, Any],
           differentiable: bool) -> dict[str, Callable[..., Any]]:
    """The calls to repeat: forward, and a VJP with a cotangent of ones (its values matter not)."""
    import jax
    import jax.numpy as jnp

    forward = functools.partial(fn, **kwargs)
    calls = {"fwd": forward}
    if differentiable:
        def backward(*args):
            out, pullback = jax.vjp(forward, *args)
            return pullback(jnp.ones_like(out))
        calls["bwd"] = backward
    return calls


def _describe(value: Any) -> str:
    """What jit keys on: an array's (or tracer's) type, else the value."""
    aval = getattr(value, "aval", None)
    if aval is not None and hasattr(aval, "shape"):
        weak = " (weak type)" if getattr(aval, "weak_type", False) else ""
        return f"{aval.dtype}{list(aval.shape)}{weak}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _arguments_when_traced(call: Callable[..., Any], args: tuple[Any, ...],
                           functions: set[str]) -> dict[str, dict[str, str]]:
    """Per Python function named in `functions`, the arguments of its first call during
    `call(*args)` (tracing calls the function being jitted)."""
    import jax

    seen: dict[str, dict[str, str]] = {}

    def profiler(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name in functions and code.co_name not in seen:
            names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            seen[code.co_name] = {name: _describe(frame.f_locals[name]) for name in names
                                  if name in frame.f_locals}

    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        jax.block_until_ready(call(*args))
    finally:
        sys.setprofile(previous)
    return seen


def _retraced_differences(calls: dict[str, Callable[..., Any]], inputs: list[tuple[Any, ...]],
                          log: CompileLog) -> tuple[str, ...]:
    """Arguments of the retraced functions that differ between two more calls."""
    functions = set(log.traces) | {name.removeprefix("jit(").removesuffix(")")
                                   for name in log.compiles}
    differences = []
    for call in calls.values():
        before, after = (_arguments_when_traced(call, args, functions) for args in inputs)
        for function in before.keys() & after.keys():
            for name, value in before[function].items():
                if after[function].get(name, value) != value:
                    differences.append(f"{name} of {function} ({value} then "
                                       f"{after[function][name]})")
    return tuple(dict.fromkeys(differences))


def check(impl: registry.Implementation, case: registry.Case,
          fn: Callable[..., Any] | None = None,
          directions: tuple[str, ...] = registry.DIRECTIONS) -> Report:
    """Call `impl` (or `fn` in its place) twice per direction, seeds 0 then 1; count compiles
    in the second call. "bwd" is skipped where the implementation has no backward."""
    import jax

    if impl.framework != "jax":
        raise ValueError(f"impl: expected a JAX implementation, got {impl.id} ({impl.framework})")
    op = registry.operation(impl.op)
    first, second = _inputs(impl, case, 0), _inputs(impl, case, 1)
    before = signature(first, op.input_names)
    after = signature(second, op.input_names)
    changed = tuple(f"{name}: {before[name]} then {after[name]}" for name in op.input_names
                    if before[name] != after[name])
    calls = _calls(fn or impl.fn, case.kwargs, "bwd" in directions
                   and registry.has_direction(impl, "bwd"))
    for call in calls.values():
        jax.block_until_ready(call(*first))
    with recording() as log:
        for call in calls.values():
            jax.block_until_ready(call(*second))
    retraced = ()
    if log.compiles:
        retraced = _retraced_differences(calls, [_inputs(impl, case, 2), _inputs(impl, case, 3)],
                                         log)
    return Report(label=f"{impl.id} {case.id} ({'+'.join(calls)})",
                  compiles=tuple(log.compiles), traces=tuple(log.traces),
                  changed_arguments=changed, explanations=tuple(log.explanations),
                  retraced_arguments=retraced)
