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


def read_tuned(op: str, path: pathlib.Path | None = None) -> dict[str, Any]:
    """The whole tuned file of `op`: {impl: {model: {"config": {...}, ...}}}; {} if absent."""
    path = path or tuned_path(op)
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def tuned_config(op: str, impl: str, base: Any, model: str | None = None,
                 path: pathlib.Path | None = None):
    """`base` (a config dataclass) with the fields recorded for `impl` on `model` (default:
    this GPU), or None when that model was never tuned. Fields an entry does not name keep
    `base`'s values: a tune records what it chose (`chosen_fields`), not the defaults of its
    day."""
    entry = read_tuned(op, path).get(impl, {}).get(model or this_model())
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
        on the representative case and blocks until it is done (it may raise
        for configs that do not compile or fit).
    case_id: names the representative case in the record.
    """

    op: str
    impl: str
    candidates: Sequence[Any]
    make_runner: Callable[[Any], Callable[[], Any]]
    case_id: str


def sweep(op: str, impl: str, candidates: Sequence[Any], case_id: str) -> Tunable:
    """The usual Tunable: `impl`'s registered function called with `config=` each candidate,
    on the operation's own case `case_id`, its inputs made once and placed as the tests and
    benchmarks make them (kernels.core.timing.prepare)."""
    import functools

    from kernels.core import checking, registry, timing

    implementation = registry.implementation(op, impl)
    operation = registry.operation(op)
    case = operation.case(case_id)
    inputs = functools.cache(lambda: checking.make_inputs(operation, case, 0, "normal"))

    def make_runner(config):
        configured = dataclasses.replace(
            implementation, fn=functools.partial(implementation.fn, config=config))
        timeable = timing.prepare(configured, case, inputs=inputs())
        return functools.partial(timeable.fn, *timeable.args)

    return Tunable(op, impl, candidates, make_runner, case_id)


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
    """Median milliseconds of `runner` (a JAX call) through kernels.core.timing: CUPTI kernel time
    on a GPU, L2 flushed before each sample, samples until the noise settles."""
    from kernels.core import compat, timing

    timeable = timing.Timeable("tune", "jax", runner, (), on_gpu=compat.on_gpu())
    return timing.time_timeable(timeable).median_s * 1e3


TIMER_NAME = "kernels.core.timing median (CUPTI on a GPU, cold L2)"


# Registered by implementation modules: (op, impl) -> factory returning a Tunable.
_TUNABLES: dict[tuple[str, str], Callable[[], Tunable]] = {}


def register_tunable(op: str, impl: str, factory: Callable[[], Tunable]) -> None:
    _TUNABLES[(op, impl)] = factory


def tunables(op: str) -> dict[str, Callable[[], Tunable]]:
    from kernels.core import registry

    registry.load()
    return {impl: factory for (o, impl), factory in _TUNABLES.items() if o == op}
