"""Recompilation guard: new values of the same shapes must not compile anything again.

`check(impl, case)` calls a JAX implementation (forward, and its VJP where it
has one) with inputs from one seed, then with inputs from another seed of the
same shapes and dtypes, and counts XLA backend compiles during the second
call through JAX's monitoring events. Any compile is a failure; the report
names the argument responsible: first by comparing the abstract signature
(shape, dtype, weak type, sharding) of the two calls' arguments, then by
JAX's own explanation of each tracing-cache miss (`jax_explain_cache_misses`),
which names the jitted function and the argument path or static argument
whose value changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kernels import compat, frameworks, registry


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

    @property
    def ok(self) -> bool:
        return not self.compiles

    @property
    def culprits(self) -> tuple[str, ...]:
        """Arguments named as the cause: ours whose signature changed, then those JAX's
        explanations point at (`for f defined at ...` ... `input path [1]['scale']`)."""
        names = [change.split(":")[0] for change in self.changed_arguments]
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
        lines += ["  JAX: " + text.replace("\n", "\n       ") for text in self.explanations]
        if not self.changed_arguments and not self.explanations:
            lines.append(f"  no argument changed its signature and JAX explained no cache "
                         f"miss; traced again: {', '.join(self.traces) or 'nothing'}")
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
                   and op.differentiable and impl.differentiable)
    for call in calls.values():
        jax.block_until_ready(call(*first))
    with recording() as log:
        for call in calls.values():
            jax.block_until_ready(call(*second))
    return Report(label=f"{impl.id} {case.id} ({'+'.join(calls)})",
                  compiles=tuple(log.compiles), traces=tuple(log.traces),
                  changed_arguments=changed, explanations=tuple(log.explanations))
