"""Block-size tuning: time a grid of config dataclasses on this GPU, keep the best per GPU model.

Each tunable implementation registers a `Tunable`: usually `sweep(op, impl,
candidates, case_id)`, which runs the registered function with `config=` on
one of the operation's own cases, or a hand-made one (the grid of candidates,
a case id, and how to run one config). `tune()`
times every candidate with the injected timer, drops those that fail to
compile or run (shared memory overflow, unsupported layouts), and records the
fastest in `kernels/ops/<op>/tuned.json` under the normalised GPU model name
(`nvidia-h100-80gb-hbm3`). Implementations read their defaults through
`tuned_config()`, which lays the recorded fields (those the candidates vary)
over the implementation's own default, falling back to that default for
models that were never tuned.

An implementation may have several grids, one per path whose best tiles differ
(float32 products, whose operands take twice the shared memory of 16-bit ones;
rows too wide for one block): each is a *variant*, registered, named and
recorded as `impl:variant` (`slot`), e.g. "triton:f32", beside the
implementation's plain entry, which keeps meaning what it always meant. The
file's layout is unchanged ({slot: {model: entry}}), so files written before
variants existed read as they did.

`python -m kernels tune OP [--impl NAME]` is the command line (see
`add_commands`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any

OPS_DIR = pathlib.Path(__file__).parents[1] / "ops"
TUNED_FILE = "tuned.json"


def model_key(device_kind: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`: the key results are filed under."""
    return re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-")


def this_model() -> str:
    from kernels.core import devices

    return model_key(devices.this_machine().device_kind)


def tuned_path(op: str) -> pathlib.Path:
    return OPS_DIR / op / TUNED_FILE


VARIANT_SEPARATOR = ":"


def slot(impl: str, variant: str = "") -> str:
    """Where a tune of `impl`'s `variant` grid is registered and recorded: `impl` itself for
    its plain grid, else "impl:variant" ("triton:f32")."""
    if VARIANT_SEPARATOR in impl or VARIANT_SEPARATOR in variant:
        raise ValueError(f"impl, variant: expected names without {VARIANT_SEPARATOR!r}, got "
                         f"{impl!r}, {variant!r}")
    return f"{impl}{VARIANT_SEPARATOR}{variant}" if variant else impl


def impl_of(name: str) -> str:
    """The implementation a tunable's name (`slot`) belongs to: "triton:f32" -> "triton"."""
    return name.split(VARIANT_SEPARATOR, 1)[0]


def read_tuned(op: str, path: pathlib.Path | None = None) -> dict[str, Any]:
    """The whole tuned file of `op`: {impl: {model: {"config": {...}, ...}}}; {} if absent."""
    path = path or tuned_path(op)
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def tuned_config(op: str, impl: str, base: Any, model: str | None = None,
                 path: pathlib.Path | None = None, *, variant: str = ""):
    """`base` (a config dataclass) with the fields recorded for `impl` (its `variant` grid,
    where named) on `model` (default: this GPU), or None when that model was never tuned
    there. Fields an entry does not name keep `base`'s values: a tune records what it chose
    (`chosen_fields`), not the defaults of its day. A variant never reads the plain entry:
    tiles tuned for 16-bit operands are no answer for float32 ones."""
    entry = read_tuned(op, path).get(slot(impl, variant), {}).get(model or this_model())
    if entry is None:
        return None
    fields = {field.name for field in dataclasses.fields(base)}
    return dataclasses.replace(base, **{k: v for k, v in entry["config"].items() if k in fields})


def chosen_fields(candidates: Sequence[Any]) -> tuple[str, ...]:
    """The fields in which `candidates` differ: what a tune over them chooses."""
    return tuple(field.name for field in dataclasses.fields(candidates[0])
                 if len({getattr(c, field.name) for c in candidates}) > 1)


def record(op: str, impl: str, model: str, config: Any, *, time_ms: float, case_id: str,
           timer: str, fields: Sequence[str] | None = None,
           path: pathlib.Path | None = None) -> pathlib.Path:
    """Write `config`'s `fields` (default: all) as the best for (impl, model), keeping every
    other entry of the file."""
    path = path or tuned_path(op)
    data = read_tuned(op, path)
    values = dataclasses.asdict(config)
    data.setdefault(impl, {})[model] = {
        "config": {name: values[name] for name in fields} if fields is not None else values,
        "time_ms": round(time_ms, 6),
        "case": case_id,
        "timer": timer,
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


@dataclasses.dataclass(frozen=True)
class Tunable:
    """What `tune` needs from an implementation.

    candidates: the grid of configs to time (config dataclass instances).
    make_runner: config -> a zero-argument callable that runs the kernel once
        on the representative case (it may raise for configs that do not
        compile or fit); a `Run` says which framework's clock times it.
    case_id: names the representative case in the record.
    variant: "" for the implementation's plain grid, else which of its paths
        this grid is for ("f32"); the record goes to `slot(impl, variant)`.
    directions: what one run times: ("fwd",), or ("fwd", "bwd") for a config
        that the forward and the backward share (their times added).
    """

    op: str
    impl: str
    candidates: Sequence[Any]
    make_runner: Callable[[Any], Callable[[], Any]]
    case_id: str
    variant: str = ""
    directions: tuple[str, ...] = ("fwd",)

    @property
    def name(self) -> str:
        return slot(self.impl, self.variant)


@dataclasses.dataclass(frozen=True)
class Run:
    """One candidate ready to time: each prepared `kernels.core.timing.Timeable` (a forward,
    then a backward) called in turn, all of one framework, which `device_timer` times it by
    (a torch kernel waited for by torch, its L2 flushed by torch)."""

    timeables: tuple[Any, ...]

    def __post_init__(self) -> None:
        frameworks = {t.framework for t in self.timeables}
        if len(frameworks) != 1:
            raise ValueError(f"timeables: expected one or more of one framework, got "
                             f"{sorted(frameworks)}")

    @property
    def framework(self) -> str:
        return self.timeables[0].framework

    @property
    def on_gpu(self) -> bool:
        return self.timeables[0].on_gpu

    @property
    def label(self) -> str:
        return " + ".join(t.label for t in self.timeables)

    def __call__(self) -> list[Any]:
        return [t.fn(*t.args) for t in self.timeables]


def sweep(op: str, impl: str, candidates: Sequence[Any], case_id: str, *, variant: str = "",
          directions: Sequence[str] = ("fwd",)) -> Tunable:
    """The usual Tunable: `impl`'s registered function called with `config=` each candidate,
    on the operation's own case `case_id` in `directions`, its inputs made once and placed
    as the tests and benchmarks make them (kernels.core.timing.prepare)."""
    import functools

    from kernels.core import checking, registry, timing

    implementation = registry.implementation(op, impl)
    operation = registry.operation(op)
    case = operation.case(case_id)
    inputs = functools.cache(lambda: checking.make_inputs(operation, case, 0, "normal"))
    for direction in directions:
        registry.check_direction(direction)

    def make_runner(config):
        configured = dataclasses.replace(
            implementation, fn=functools.partial(implementation.fn, config=config))
        return Run(tuple(timing.prepare(configured, case, direction=direction, inputs=inputs())
                         for direction in directions))

    return Tunable(op, impl, candidates, make_runner, case_id, variant=variant,
                   directions=tuple(directions))


@dataclasses.dataclass(frozen=True)
class Trial:
    config: Any
    time_ms: float | None  # None: the config failed
    error: str = ""


def tune(tunable: Tunable, timer: Callable[[Callable[[], Any]], float],
         log: Callable[[str], None] = print) -> tuple[Trial | None, list[Trial]]:
    """Time every candidate with `timer(runner) -> ms`; the best trial (None if all failed)."""
    trials = []
    for config in tunable.candidates:
        try:
            runner = tunable.make_runner(config)
            time_ms = timer(runner)
        except Exception as error:  # configs that do not fit this GPU are expected, not fatal
            message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            trials.append(Trial(config, None, message[:200]))
            log(f"  {config}: failed ({message[:120]})")
            continue
        trials.append(Trial(config, time_ms))
        log(f"  {config}: {time_ms:.4f} ms")
    ok = [trial for trial in trials if trial.time_ms is not None]
    best = min(ok, key=lambda trial: trial.time_ms) if ok else None
    return best, trials


def device_timer(runner: Callable[[], Any]) -> float:
    """Median milliseconds of `runner` through kernels.core.timing: CUPTI kernel time on a GPU,
    L2 flushed before each sample, samples until the noise settles. A `Run` is timed in its
    own framework; any other callable is taken for a JAX call."""
    from kernels.core import compat, timing

    if isinstance(runner, Run):
        timeable = timing.Timeable(f"tune {runner.label}", runner.framework, runner, (),
                                   on_gpu=runner.on_gpu)
    else:
        timeable = timing.Timeable("tune", "jax", runner, (), on_gpu=compat.on_gpu())
    return timing.time_timeable(timeable).median_s * 1e3


TIMER_NAME = "kernels.core.timing median (CUPTI on a GPU, cold L2)"


# Registered by implementation modules: (op, slot) -> factory returning a Tunable.
_TUNABLES: dict[tuple[str, str], Callable[[], Tunable]] = {}


def register_tunable(op: str, name: str, factory: Callable[[], Tunable]) -> None:
    """`name`: the implementation, or `slot(impl, variant)` for a variant's grid (the factory's
    Tunable must carry that impl and variant: its record goes under the name)."""
    _TUNABLES[(op, name)] = factory


def tunables(op: str) -> dict[str, Callable[[], Tunable]]:
    """The tunables of `op` by name (`slot`: "pallas_triton", "pallas_triton:f32")."""
    from kernels.core import registry

    registry.load()
    return {impl: factory for (o, impl), factory in _TUNABLES.items() if o == op}
