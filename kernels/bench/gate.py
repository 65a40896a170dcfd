"""`python -m kernels gate-power`: the regression gate's power, measured by planted slowdowns.

In a scratch clone of this repository's HEAD (uncommitted changes are not in
it), the command commits, one at a time on top of HEAD:

  A/A          a README whitespace change (no code moves): no row may be
               called slower; each one that is, is a false positive.
  plants       in one implementation of each kernel family (a Pallas kernel,
               a Triton kernel, a CUDA kernel through ctypes, an XLA
               baseline) in each planted operation (softmax, matmul, row sum:
               `PLANTS`), each call also recomputes the kernel on a leading
               fraction of the rows, so the device does about that much more
               work (`plant_source`: text appended to the kernel's module in
               the scratch clone only, never to the package). Every plant of a
               size goes in one commit per trial; each is its own benchmark row,
               and the unplanted implementations of the same cases run beside
               them as controls.
  speed-up     the smallest plant reverted: HEAD is then that much faster
               than its parent, which must not read as a regression.

For each, it runs the CI path, `python -m kernels bench --base BASE --head HEAD`
(narrowed to the planted operations' time_device, their cases, forward; the interleaved
gate, or with `sequential` the asv-run one), with its per-row gaps and the interleaved
confirmation of slower rows, and reads its
verdicts (`--json`). Beside them, on the same asv results, it records the mark
asv's own test gives each row (`asv.commands.compare._is_result_better`) at
`-f FACTOR` and at plain asv continuous's 1.1. It prints one row per (plant,
trial), the A/A false positives over every row, and the gap each planted row had
to exceed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

from kernels.core import registry, validation, vcs

FAMILIES = ("pallas", "triton", "cuda", "xla", "sharded")


@dataclasses.dataclass(frozen=True)
class Plant:
    """Where one family's slowdown is planted: an implementation of an operation, on one of its
    cases per platform; `scale` rows recomputed per unit of slowdown wanted. `site`: for a
    sharded implementation, the function of its module that computes on one device's data
    (first argument: rows), which the plant wraps instead of the registered function."""

    family: str
    op: str
    impl: str
    # platform ("gpu", "cpu") -> case id; "gpu4" and the like: the case on a machine of at
    # least that many devices (a sharded plant's ring over every GPU there is)
    case: dict[str, str]
    scale: float = 1.0
    site: str | None = None

    def __post_init__(self) -> None:
        if (self.family == "sharded") != (self.site is not None):
            raise ValueError(f"site: expected a per-device function for a sharded plant and "
                             f"none otherwise, got {self.site!r} for family {self.family!r}")

    def case_for(self, platform: str, device_count: int) -> str:
        """The planted case on `platform` with `device_count` devices: the one declared for the
        most devices that fit (key platform + count), else the platform's own."""
        fitting = [int(key[len(platform):]) for key in self.case
                   if key.startswith(platform) and key[len(platform):].isdigit()
                   and int(key[len(platform):]) <= device_count]
        return self.case[f"{platform}{max(fitting)}"] if fitting else self.case[platform]


_SOFTMAX = {"gpu": "f32-32768x4096", "cpu": "f32-64x1000"}
_MATMUL = {"gpu": "bf16-8192x8192x8192", "cpu": "f32-129x130x257"}
_ROW_SUM = {"gpu": "f32-32768x4096", "cpu": "f32-64x1000"}
# The collective matmul over the model axis (its all-gather ring overlaps the product), the
# ring over every GPU of the host (on two, each step is one hop); on a CPU the 4x2 mesh of
# forced host devices.
_SHARDED_MATMUL = {"gpu": "bf16-8192x8192x4096-mesh1x2", "gpu4": "bf16-8192x8192x4096-mesh1x4",
                   "gpu8": "bf16-8192x8192x4096-mesh1x8", "cpu": "f32-64x32x48-mesh4x2"}
# A plant's scale makes its measured slowdown about its nominal size on the H100 (f32
# 32768x4096 softmax): the Pallas softmax recomputing 2.5% of the rows cost only 1.0-1.3% more
# (2026-11-25), the XLA one recomputing 2% of them 0.7-1.0% more (2026-11-26; XLA computes the
# extra rows in the same pass over the input), so they recompute 2.5x and 2x; the other
# families cost about what they recompute (Triton and CUDA 2% -> 1.024-1.026).
PLANTS = (
    Plant("pallas", "softmax", "pallas", _SOFTMAX, scale=2.5),
    Plant("triton", "softmax", "triton", _SOFTMAX),
    Plant("cuda", "softmax", "cuda", _SOFTMAX),
    Plant("xla", "softmax", "xla", _SOFTMAX, scale=2.0),
    Plant("pallas", "matmul", "pallas_mosaic", _MATMUL),
    Plant("triton", "matmul", "triton", _MATMUL),
    Plant("cuda", "matmul", "cuda_wgmma", _MATMUL),
    Plant("xla", "matmul", "xla", _MATMUL),
    Plant("cuda", "row_sum", "cuda", _ROW_SUM),
    Plant("xla", "row_sum", "xla", _ROW_SUM),
    Plant("sharded", "sharded_matmul", "collective", _SHARDED_MATMUL, site="_local_product"),
)
OPS = tuple(dict.fromkeys(plant.op for plant in PLANTS))
DEFAULT_SIZES = (0.02, 0.03)
PLAIN_FACTOR = 1.1  # asv continuous's default


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What one gate-power run does; validated so a bad flag fails before any clone."""

    families: tuple[str, ...] = FAMILIES
    ops: tuple[str, ...] = OPS
    sizes: tuple[float, ...] = DEFAULT_SIZES
    trials: int = 3
    aa_trials: int = 1
    factor: float = 1.02
    speedup: bool = True
    confirm_rounds: int = 3
    # The gate as it was (`kernels bench --sequential`: asv run on each commit, then the
    # compare); by default the interleaved gate, which measures base and head side by side.
    sequential: bool = False
    # With `sequential`, trials against one base share its first-pass asv run (each trial's
    # confirmation still measures base and head again); off, every trial runs asv on both.
    # The interleaved gate measures the base beside the head in every trial.
    reuse_base: bool = True

    def __post_init__(self) -> None:
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise ValueError(f"families: expected some of {list(FAMILIES)}, got "
                             f"{list(self.families)}")
        unknown = [o for o in self.ops if o not in OPS]
        if unknown or not self.ops:
            raise ValueError(f"ops: expected some of {list(OPS)}, got {list(self.ops)}")
        if not self.plants:
            raise ValueError(f"families, ops: no plant in families {list(self.families)} of "
                             f"operations {list(self.ops)}")
        if not self.sizes or not all(0 < s < 1 for s in self.sizes):
            raise ValueError(f"sizes: expected fractions in (0, 1), got {list(self.sizes)}")
        if self.trials < 0 or self.aa_trials < 0 or self.confirm_rounds < 0:
            raise ValueError(f"trials, aa_trials, confirm_rounds: expected >= 0, got "
                             f"{self.trials}, {self.aa_trials}, {self.confirm_rounds}")
        if not self.trials and not self.aa_trials and not self.speedup:
            raise ValueError("trials, aa_trials, speedup: expected something to run, got no "
                             "plant trial, no A/A trial and no speedup")
        if not (1 < self.factor < math.inf):
            raise ValueError(f"factor: expected a finite number > 1 (asv continuous -f), got "
                             f"{self.factor}")

    @property
    def plants(self) -> tuple[Plant, ...]:
        return tuple(p for p in PLANTS if p.family in self.families and p.op in self.ops)


# A JAX plant's extra result inside a sharded kernel, kept by adding its sum to one element of
# the kernel's own output.
_TIE = (
    "def _kernelperf_tie(out, extra):\n"
    "    import jax\n"
    "    import jax.numpy as jnp\n"
    "    zero = jax.lax.optimization_barrier(jnp.zeros((), jnp.float32))\n"
    "    total = jnp.sum(extra.astype(jnp.float32))\n"
    "    # 0 whatever the sum (never 0 * inf), yet the sum stays needed.\n"
    "    nothing = jnp.where(zero > 0, total, 0.0).astype(out.dtype)\n"
    "    return out.at[(0,) * out.ndim].add(nothing)\n\n\n")


def plant_source(op: str, impl: str, fraction: float, framework: str,
                 site: str | None = None) -> str:
    """Python appended to `impl`'s module: every call also runs the kernel on the first
    `fraction` of the rows, and never all of them (XLA merged a whole second call with the
    first: a 100% plant cost nothing). For JAX the extra result is handed to a host callback,
    an effect XLA must keep (an optimization barrier's unused outputs are pruned, seen with jax
    0.10.2); the callback's copy to the host is a memcpy, which CUPTI's kernel time leaves out,
    so only the extra kernel work is timed.

    With `site` (a sharded kernel), the function of that name in the module, which computes on
    one device's data inside the kernel, is wrapped instead: each of its calls also computes on
    the first `fraction` of its rows, and `_TIE` keeps that result (its sum added to one output
    element through a zero XLA cannot see through): no host round trip and no exchange
    between devices, which a sharded case's clock, its devices' spans, would also time. Around
    the whole kernel, the extra call's own exchanges cost their fixed latency whatever its rows
    (a 2% plant read 1.22x on 2 of 4 H100s, 2026-11-27), and a callback's wait on the host
    stretched the spans (3.1-4.0x on 2 H100s)."""
    head = ("\n\n# Planted by `python -m kernels gate-power` in a scratch clone; never committed "
            f"to\n# the package. Each call also recomputes {fraction:.1%} of the rows.\n")
    cut = (f"        rows = max(1, int(x.shape[0] * {fraction!r}))\n"
           "        if rows >= x.shape[0] > 1:\n"
           "            # Every row again is the call itself, which XLA merges with it.\n"
           "            rows = x.shape[0] - 1\n")
    if site is not None:
        if framework != "jax":
            raise ValueError(f"site: a per-device site is planted in JAX kernels only, got "
                             f"{site!r} in a {framework} implementation")
        return (head + _TIE +
                "def _kernelperf_planted_slowdown():\n"
                f"    inner = globals()[{site!r}]\n\n"
                "    def planted(x, *args, **kwargs):\n"
                "        out = inner(x, *args, **kwargs)\n"
                + cut +
                "        return _kernelperf_tie(out, inner(x[:rows], *args, **kwargs))\n\n"
                f"    globals()[{site!r}] = planted\n\n\n"
                "_kernelperf_planted_slowdown()\n")
    keep = ("        import jax\n"
            "        jax.debug.callback(lambda rows: None, extra)\n"
            if framework == "jax" else "        del extra\n")
    return (head +
            "def _kernelperf_planted_slowdown():\n"
            "    import dataclasses as _dataclasses\n"
            f"    key = ({op!r}, {impl!r})\n"
            "    inner = registry._IMPLEMENTATIONS[key].fn\n\n"
            "    def planted(x, *args, **kwargs):\n"
            "        out = inner(x, *args, **kwargs)\n"
            + cut +
            "        extra = inner(x[:rows], *args, **kwargs)\n"
            + keep +
            "        return out\n\n"
            "    registry._IMPLEMENTATIONS[key] = _dataclasses.replace(\n"
            "        registry._IMPLEMENTATIONS[key], fn=planted)\n\n\n"
            "_kernelperf_planted_slowdown()\n")


def _commit(repo: pathlib.Path, message: str, edits: dict[pathlib.Path, str]) -> str:
    """Append each text to its file on a new commit on top of `main`; returns the hash."""
    vcs.output(repo, "checkout", "-q", "-B", "head", "main")
    for path, text in edits.items():
        with open(repo / path, "a") as file:
            file.write(text)
    vcs.output(repo, "commit", "-q", "-a", "-m", message)
    return vcs.output(repo, "rev-parse", "HEAD")


@dataclasses.dataclass(frozen=True)
class RowVerdict:
    """One benchmark row of one trial: the CI path's verdict, asv's own marks beside it."""

    ratio: float | None  # head / base, first pass
    gap: float | None  # the change the row had to exceed
    confirmed: str | None  # the interleaved rounds' ratios, where they ran
    verdict: str  # kernels bench's word, after confirmation
    asv_worse: bool  # asv's own test at -f FACTOR marks it "+"
    plain_worse: bool  # ... and at plain asv continuous's 1.1


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One `kernels bench --base --head` run: its exit status, a verdict per row."""

    label: str
    exit: int
    rows: dict[tuple[str, str], RowVerdict]  # (operation, implementation) -> verdict


def _environment(plants: tuple[Plant, ...], platform: str) -> dict[str, str]:
    """asv narrowed to the planted cases, forward. On a GPU every implementation of them runs
    (the unplanted ones are the trial's controls); on a CPU, where Pallas and Triton run
    interpreted, the planted implementations of every planted operation."""
    cases = sorted({plant.case[platform] for plant in plants})
    narrowed = {} if platform == "gpu" else {
        "KERNELPERF_BENCH_FULL": "1",
        "KERNELPERF_BENCH_IMPLS": ",".join(sorted({plant.impl for plant in plants}))}
    return dict(os.environ, KERNELPERF_BENCH_CASES=",".join(cases),
                KERNELPERF_BENCH_DIRECTIONS="fwd", PYTHONUNBUFFERED="1", **narrowed)


def asv_marks_worse(base, head, factor: float) -> bool:
    """asv's own per-row test (what asv continuous and compare mark "+"): the head worse by
    more than `factor`, and different by Mann-Whitney on the samples or 99% intervals."""
    from asv.commands.compare import _is_result_better

    if base is None or head is None or base.value is None or head.value is None:
        return False
    return bool(_is_result_better(base.value, head.value, (base.stats, base.samples),
                                  (head.stats, head.samples), factor))


def run_trial(repo: pathlib.Path, label: str, base: str, head: str, plants: tuple[Plant, ...],
              platform: str, settings: Settings, machine: str,
              log: Callable[[str], None]) -> Outcome:
    """`python -m kernels bench --base base --head head` in `repo`, narrowed to the plants'
    operations and cases; its verdicts, and asv's own marks on the same results."""
    from kernels.bench import asv_tools

    rows_file = repo / ".asv" / f"gate-{re.sub(r'[^A-Za-z0-9.-]+', '_', label)}.json"
    regex = "|".join(sorted({registry.benchmark_class(plant.op) for plant in plants}))
    command = [os.path.abspath(sys.executable), "-m", "kernels", "bench", "--base", base,
               "--head", head,
               "--bench", f"({regex})\\.time_device", "--json", str(rows_file),
               "--confirm-rounds", str(settings.confirm_rounds),
               *(["--sequential"] if settings.sequential else []),
               *(["--reuse-base"] if settings.sequential and settings.reuse_base else [])]
    log(f"[{label}] kernels bench --base {base[:8]} --head {head[:8]} ({regex}, "
        f"{', '.join(sorted({p.case[platform] for p in plants}))}, fwd)")
    process = subprocess.Popen(command, cwd=repo, env=_environment(plants, platform), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            # asv's steps ("· Creating environments", "· Discovering benchmarks") too: on a
            # loaded machine each takes several seconds, and a silent run reads as a hang.
            if line.startswith(("[", "·", "confirming", "  round", "confirmation", "summary",
                                "smallest", "asv on", "kernels bench", "interleaved gate",
                                "kernelperf:")) or "measured" in line:
                log(f"  {line.rstrip()}")
        returncode = process.wait()
    except KeyboardInterrupt:
        process.kill()  # leave no asv holding the GPU behind
        raise
    if returncode not in (0, 1) or not rows_file.exists():
        raise RuntimeError(f"{label}: kernels bench exited {returncode}:\n"
                           f"{''.join(output)[-3000:]}")
    results_dir = str(repo / ".asv" / "results")
    base_results = asv_tools.load(results_dir, machine, base)
    head_results = asv_tools.load(results_dir, machine, head)
    names = {registry.benchmark_class(op): op for op in OPS}
    by_row = {}
    for row in json.loads(rows_file.read_text()):
        if not row["benchmark"].endswith(".time_device"):
            continue
        key = (row["benchmark"], tuple(row["params"]))
        pair = base_results.get(key), head_results.get(key)
        op = names.get(row["benchmark"].split(".")[-2], row["benchmark"])
        by_row[(op, row["params"][0].strip("'"))] = RowVerdict(
            row["ratio"], row["gap"], row["confirmed"], row["verdict"],
            asv_marks_worse(*pair, settings.factor), asv_marks_worse(*pair, PLAIN_FACTOR))
    return Outcome(label, returncode, by_row)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _print(line: str) -> None:
    print(line, flush=True)


def main_flow(settings: Settings, *, keep: bool = False,
              log: Callable[[str], None] = _print) -> int:
    """Clone, plant, run, print the tables; exit 1 if a plant was missed, an A/A trial was
    flagged or the speed-up read as a regression."""
    from kernels.bench import asv_tools
    from kernels.core import devices

    here = devices.this_machine()
    platform = "gpu" if here.has_gpu else "cpu"
    plants = []
    for plant in settings.plants:
        # From here on a plant names its one case on this machine.
        plant = dataclasses.replace(plant, case={
            platform: plant.case_for(platform, here.device_count)})
        impl = registry.implementation(plant.op, plant.impl)
        reason = devices.case_unavailable_reason(impl, registry.operation(plant.op).case(
            plant.case[platform]))
        if reason:
            log(f"gate-power: no {plant.family} plant in {plant.op} here "
                f"({plant.op}-{plant.impl} {plant.case[platform]}: {reason})")
        else:
            plants.append(plant)
    if not plants:
        raise validation.UserError(f"families {list(settings.families)} of operations "
                                   f"{list(settings.ops)}: none can run here ({platform}); "
                                   f"on a CPU, --families xla pallas triton")
    plants = tuple(plants)
    source = pathlib.Path(vcs.output(pathlib.Path.cwd(), "rev-parse", "--show-toplevel"))
    head = vcs.output(source, "rev-parse", "HEAD")
    machine = asv_tools.register_machine()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="kernelperf-gate-"))
    log(f"gate-power: scratch clone {scratch} of {head[:8]}; machine {machine}; "
        f"{len(plants)} plants: " + ", ".join(f"{p.op}-{p.impl} {p.case[platform]}"
                                               for p in plants))
    vcs.scratch_clone(source, head, scratch, "gate-power")
    outcomes: list[tuple[str, float, Outcome]] = []  # (kind, size, outcome)
    # Interrupted (Ctrl-C, or a TERM from a time limit): report the trials done so far.
    signal.signal(signal.SIGTERM, _interrupt)
    interrupted = False
    try:
        for trial in range(settings.aa_trials):
            commit = _commit(scratch, f"A/A {trial + 1}", {pathlib.Path("README.md"): "\n"})
            outcomes.append(("A/A", 0.0, run_trial(scratch, f"A/A {trial + 1}", head, commit,
                                                   plants, platform, settings, machine, log)))
        planted: dict[float, str] = {}
        for size in settings.sizes:
            for trial in range(settings.trials):
                edits: dict[pathlib.Path, str] = {}
                for plant in plants:
                    implementation = registry.implementation(plant.op, plant.impl)
                    path = registry.module_path(plant.op, plant.impl)
                    edits[path] = edits.get(path, "") + plant_source(
                        plant.op, plant.impl, min(1.0, size * plant.scale),
                        implementation.framework, plant.site)
                label = f"+{size:.0%} trial {trial + 1}"
                commit = _commit(scratch, f"plant {label}", edits)
                planted.setdefault(size, commit)
                outcomes.append(("plant", size, run_trial(scratch, label, head, commit, plants,
                                                          platform, settings, machine, log)))
        if settings.speedup and planted:
            size = min(planted)
            vcs.output(scratch, "checkout", "-q", "-B", "faster", planted[size])
            vcs.output(scratch, "revert", "--no-edit", "HEAD")
            fast = vcs.output(scratch, "rev-parse", "HEAD")
            outcomes.append(("speed-up", size, run_trial(
                scratch, f"-{size:.0%} (plant reverted)", planted[size], fast, plants,
                platform, settings, machine, log)))
    except KeyboardInterrupt:
        interrupted = True
        log(f"gate-power: interrupted after {len(outcomes)} trial(s); reporting those")
    status = report(outcomes, settings, plants, log) or int(interrupted)
    if not keep:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    else:
        log(f"kept {scratch}")
    return status


def report(outcomes, settings: Settings, plants: tuple[Plant, ...],
           log: Callable[[str], None]) -> int:
    """The per-trial table, the A/A false positives over every row, and the verdict."""
    from kernels.core.tables import table

    planted = {(plant.op, plant.impl): plant for plant in plants}
    rows, failures, false_positives, aa_rows = [], [], 0, 0
    for kind, size, outcome in outcomes:
        for (op, impl), row in sorted(outcome.rows.items()):
            plant = planted.get((op, impl))
            if kind == "A/A" or plant is None:
                aa_rows += 1
                wrong = row.verdict in ("slower", "FAILED on head")
                false_positives += wrong
                if not wrong and plant is None:
                    continue  # an unplanted control that stayed quiet: counted, not listed
                result = "FALSE POSITIVE" if wrong else f"ok ({row.verdict})"
            elif kind == "speed-up":
                wrong = row.verdict in ("slower", "FAILED on head")
                result = "READ AS REGRESSION" if wrong else f"ok ({row.verdict})"
            else:
                wrong = row.verdict != "slower"
                result = "caught" if not wrong else "MISSED"
            if wrong:
                failures.append(f"{outcome.label} {op}-{impl}")
            change = {"A/A": "A/A", "speed-up": f"-{size:.0%}"}.get(
                kind, f"+{size:.0%}" if plant else "control")
            rows.append([plant.family if plant else "-", f"{op}-{impl}", change, outcome.label,
                         f"{row.ratio:.3f}" if row.ratio is not None else "-",
                         f"{row.gap:.1%}" if row.gap is not None else "-",
                         row.confirmed or "-", row.verdict,
                         "+" if row.asv_worse else ".", "+" if row.plain_worse else ".",
                         result])
    log(table(rows, ["family", "implementation", "change", "trial", "head/base", "gap",
                     "re-measured", "kernels bench", f"asv -f {settings.factor}", "asv 1.1",
                     "result"]))
    log("(asv columns: '+' is asv's own per-row 'worse' mark on the same results)")
    log(f"A/A and unplanted controls: {false_positives} false positive(s) in {aa_rows} "
        f"benchmark rows")
    if failures:
        log(f"gate-power: FAILED for {', '.join(failures)}")
        return 1
    log("gate-power: every plant caught, no false positive, no speed-up read as a regression")
    return 0
