"""kernelperf: a performance regression suite for GPU kernels.

The packages, lowest layer first (`.importlinter` holds the rules, `make lint` checks them):

  core/      the measurement core: registry, inputs and references, checking, frameworks,
             timing, fingerprint, validation, devices, compat; imports nothing else of ours
  cuda/ sharding/   what kernels are built on: the nvcc build cache and ctypes runtime;
             meshes, collectives and jax.distributed
  ops/       one package per operation: spec.py and one module per implementation
  roofline/ guards/ the roofline model and floors; HLO, recompilation and memory guards
  bench/ profile/ testing/   asv and the gate, dashboard and history; profilers and audits;
             pytest plugins and mutation testing
  cli/       `python -m kernels`: one module per command group; nothing imports it

Importing this package is cheap and imports no framework; `kernels.core.registry`
loads the operations and their implementations on first use.

Modules that lived at the top before the packages (`kernels.registry`, `kernels.timing`,
`kernels.checking`, ...) still import, as the same module objects as their new homes, and
`python -m kernels.history` and the like still run: `MOVED` lists each old name's home.
The asv benchmarks use these old names on purpose, since they run against the `kernels` of
every commit in the history, older layouts included.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

MOVED = {
    **{name: f"core.{name}" for name in (
        "registry", "checking", "frameworks", "timing", "fingerprint", "validation", "devices",
        "compat", "environment", "dtypes", "phases", "tuning", "compilation_cache", "vcs")},
    **{name: f"guards.{name}" for name in ("hlo", "recompilation", "memory")},
    **{name: f"bench.{name}" for name in (
        "asv_plugin", "asv_tools", "gate", "history", "dashboard", "find_planted", "perfcheck")},
    **{name: f"profile.{name}" for name in (
        "profiling", "bottleneck", "crosscheck", "triton_aot", "gpu_sweep")},
    "cuda.bench": "profile.cuda_bench",
    "sharding": "sharding.meshes", "distributed": "testing.distributed",
    "sharded_bench": "bench.scaling",
    **{name: f"testing.{name}" for name in (
        "phases_plugin", "compilation_cache_plugin", "scheduling", "mutation")},
    "measure_cli": "cli.measure", "profiling_cli": "cli.profile",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `kernels.<old name>` as the module at its new home: one module object under both
    names (so patching either patches both), and runnable with `python -m` (get_code)."""

    def __init__(self) -> None:
        self._specs = {}

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix(f"{__name__}.")
        if old == fullname or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def _target(self, fullname: str) -> str:
        return f"{__name__}.{MOVED[fullname.removeprefix(f'{__name__}.')]}"

    def create_module(self, spec):
        module = importlib.import_module(self._target(spec.name))
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # Already executed under its new name; importlib has just set the alias's spec on it,
        # and the module keeps its own (reload, pickling and mutmut read it).
        module.__spec__ = self._specs[module.__name__]

    def get_code(self, fullname):
        return importlib.util.find_spec(self._target(fullname)).loader.get_code(
            self._target(fullname))


# `kernels.sharding` is both a package now and an old module name: the package wins.
MOVED.pop("sharding")
sys.meta_path.append(_Alias())
