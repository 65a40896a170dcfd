"""`python -m kernels gate-power`: the regression gate's power, measured by planted slowdowns.

In a scratch clone of this repository's HEAD (uncommitted changes are not in
it), the command commits, one at a time on top of HEAD:

  A/A          a README whitespace change (no code moves): every verdict
               must be "same"; each flagged row is a false positive.
  plants       in one implementation of each kernel family (a Pallas kernel,
               a Triton kernel, a CUDA kernel through ctypes, an XLA
               baseline), each call also recomputes the kernel on a leading
               fraction of the rows, so the device does about that much more
               work (`plant_source`: text appended to the kernel's module in
               the scratch clone only, never to the package). All families
               are planted in one commit per size and trial; each is its own
               benchmark row.
  speed-up     the smallest plant reverted: HEAD is then that much faster
               than its parent, which must not read as a regression.

For each, it runs `asv continuous -f FACTOR BASE HEAD` (narrowed to the
planted operation's time_device, one case, forward), records asv's exit
status and, per implementation, the mark asv gives the row (asv's own test,
`asv.commands.compare._is_result_better`) at that factor and at plain asv
continuous's 1.1 on the same results, and the direction-aware compare's verdict
(`kernels.bench.asv_tools.compare`). It prints one row per (family, plant, trial) and
the A/A false-positive count, then, per benchmark, the smallest slowdown the
gate can catch given its noise: the smallest shift d for which asv's test
(`asv._stats.is_different`, Mann-Whitney on the samples or 99% intervals)
tells the A/A base samples from the same samples scaled by 1 + d, and the
factor it must also exceed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable

from kernels.bench import vcs
from kernels.core import validation

# One implementation of each family, all on one operation whose input has leading rows.
FAMILIES = {"pallas": "pallas", "triton": "triton", "cuda": "cuda", "xla": "xla"}
PLANT_OP = "softmax"
BENCH_CASE = {"gpu": "f32-32768x4096", "cpu": "f32-64x1000"}
DEFAULT_SIZES = (0.05, 0.10)
PLAIN_FACTOR = 1.1  # asv continuous's default
# Rows recomputed per unit of slowdown wanted. The Pallas softmax recomputing 2.5% of the
# rows cost only 1.0-1.3% more device time on the H100 (f32 32768x4096; the other families
# cost about what they recompute: 5% of the rows, 1.054-1.056), so it recomputes 2.5x.
PLANT_SCALE = {"pallas": 2.5}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What one gate-power run does; validated so a bad flag fails before any clone."""

    families: tuple[str, ...] = tuple(FAMILIES)
    sizes: tuple[float, ...] = DEFAULT_SIZES
    trials: int = 3
    aa_trials: int = 5
    factor: float = 1.05
    speedup: bool = True
    case: str | None = None

    def __post_init__(self) -> None:
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise ValueError(f"families: expected some of {sorted(FAMILIES)}, got "
                             f"{list(self.families)}")
        if not self.sizes or not all(0 < s < 1 for s in self.sizes):
            raise ValueError(f"sizes: expected fractions in (0, 1), got {list(self.sizes)}")
        if self.trials < 0 or self.aa_trials < 0:
            raise ValueError(f"trials, aa_trials: expected >= 0, got {self.trials}, "
                             f"{self.aa_trials}")
        if not self.trials and not self.aa_trials and not self.speedup:
            raise ValueError("trials, aa_trials, speedup: expected something to run, got no "
                             "plant trial, no A/A trial and no speedup")
        if not (1 < self.factor < math.inf):
            raise ValueError(f"factor: expected a finite number > 1 (asv continuous -f), got "
                             f"{self.factor}")


def bench_case(case: str | None = None) -> str:
    """The softmax case planted: `case`, else the operation's real size on a GPU, a CPU
    case on a CPU."""
    from kernels.core import devices

    return case or BENCH_CASE["gpu" if devices.this_machine().has_gpu else "cpu"]


def runnable_families(case: str | None = None) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the families whose planted implementation runs `case` on this machine, why each
    other one cannot): gate-power's default, so a CPU machine plants the ones it can run."""
    from kernels.core import devices, registry

    op = registry.operation(PLANT_OP)
    chosen = op.case(bench_case(case))
    why = {family: reason for family, impl in FAMILIES.items() if (
        reason := devices.case_unavailable_reason(registry.implementation(PLANT_OP, impl),
                                                  chosen))}
    return tuple(family for family in FAMILIES if family not in why), why


def plant_source(op: str, impl: str, fraction: float, framework: str) -> str:
    """Python appended to `impl`'s module: every call also runs the kernel on the first
    `fraction` of the rows. For JAX the extra result is handed to a host callback, an
    effect XLA must keep (an optimization barrier's unused outputs are pruned, seen with
    jax 0.10.2); the callback's copy to the host is a memcpy, which CUPTI's kernel time
    leaves out, so only the extra kernel work is timed."""
    keep = ("    import jax\n    jax.debug.callback(lambda rows: None, extra)\n"
            if framework == "jax" else "    del extra\n")
    return (
        "\n\n# Planted by `python -m kernels gate-power` in a scratch clone; never committed to\n"
        f"# the package. Each call also recomputes {fraction:.1%} of the rows.\n"
        "def _kernelperf_planted_slowdown():\n"
        "    import dataclasses as _dataclasses\n"
        f"    key = ({op!r}, {impl!r})\n"
        "    inner = registry._IMPLEMENTATIONS[key].fn\n\n"
        "    def planted(x, *args, **kwargs):\n"
        "        out = inner(x, *args, **kwargs)\n"
        f"        rows = max(1, int(x.shape[0] * {fraction!r}))\n"
        "        extra = inner(x[:rows], *args, **kwargs)\n"
        + "".join("    " + line + "\n" for line in keep.splitlines()) +
        "        return out\n\n"
        "    registry._IMPLEMENTATIONS[key] = _dataclasses.replace(\n"
        "        registry._IMPLEMENTATIONS[key], fn=planted)\n\n\n"
        "_kernelperf_planted_slowdown()\n")


def module_path(op: str, impl: str) -> pathlib.Path:
    """The file (relative to the repository) that registers `impl` of `op`."""
    from kernels.core import registry

    module = registry.implementation(op, impl).fn.__module__
    return pathlib.Path(*module.split(".")).with_suffix(".py")


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
    """One planted benchmark row of one trial: asv's verdict at both factors and ours."""

    ratio: float | None  # head / base
    asv_worse: bool  # asv continuous -f FACTOR marks it "+"
    plain_worse: bool  # plain asv continuous (factor 1.1) would
    verdict: str  # the direction-aware compare's word


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One asv continuous run: its exit status, and a verdict per implementation."""

    label: str
    asv_exit: int
    compare_exit: int
    rows: dict[str, RowVerdict]


def _environment(impls: list[str], case: str) -> dict[str, str]:
    return dict(os.environ, KERNELPERF_BENCH_IMPLS=",".join(impls),
                KERNELPERF_BENCH_CASES=case, KERNELPERF_BENCH_DIRECTIONS="fwd",
                PYTHONUNBUFFERED="1")


def asv_marks_worse(base, head, factor: float) -> bool:
    """asv's own per-row test (what asv continuous and compare mark "+"): the head worse by
    more than `factor`, and different by Mann-Whitney on the samples or 99% intervals."""
    from asv.commands.compare import _is_result_better

    if base is None or head is None or base.value is None or head.value is None:
        return False
    return bool(_is_result_better(base.value, head.value, (base.stats, base.samples),
                                  (head.stats, head.samples), factor))


def run_trial(repo: pathlib.Path, label: str, base: str, head: str, impls: list[str],
              case: str, settings: Settings, machine: str, log: Callable[[str], None]) -> Outcome:
    """`asv continuous -f FACTOR base head` in `repo`, then the plain and direction-aware
    verdicts on its results."""
    from kernels.bench import asv_tools

    command = [sys.executable, "-m", "asv", "continuous", "-f", str(settings.factor),
               "-b", f"{''.join(p.title() for p in PLANT_OP.split('_'))}.time_device",
               base, head]
    log(f"[{label}] {' '.join(command[2:])}  (implementations: {', '.join(impls)})")
    # asv's progress lines are passed on as they come (a run takes minutes); the rest is kept
    # for the error message.
    process = subprocess.Popen(command, cwd=repo, env=_environment(impls, case), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if line.startswith(("[", "·", "|", "BENCHMARKS", "SOME", "PERFORMANCE")):
                log(f"  {line.rstrip()}")
        returncode = process.wait()
    except KeyboardInterrupt:
        process.kill()  # leave no asv holding the GPU behind
        raise
    if returncode not in (0, 1):
        raise RuntimeError(f"{label}: asv continuous exited {returncode}:\n"
                           f"{''.join(output)[-3000:]}")
    results_dir = str(repo / ".asv" / "results")
    base_results = asv_tools.load(results_dir, machine, base)
    head_results = asv_tools.load(results_dir, machine, head)
    rows = asv_tools.compare(base_results, head_results, asv_tools.DEFAULT_MIN_GAP)
    by_impl = {}
    for row in rows:
        if row.benchmark.endswith(".time_device"):
            key = (row.benchmark, row.params)
            pair = base_results.get(key), head_results.get(key)
            by_impl[row.params[0].strip("'")] = RowVerdict(
                row.ratio, asv_marks_worse(*pair, settings.factor),
                asv_marks_worse(*pair, PLAIN_FACTOR), row.verdict)
    return Outcome(label, returncode, asv_tools.exit_status(rows), by_impl)


def detectable_shift(samples: list[float], factor: float) -> tuple[float, float]:
    """(smallest relative slowdown asv's test tells from `samples`, the smallest the gate
    calls: that or the factor, whichever is larger)."""
    from asv import _stats
    from asv_runner.statistics import compute_stats

    _, base_stats = compute_stats(samples, 1)
    shift = None
    for step in range(1, 1001):  # 0.1% steps up to 100%
        d = step / 1000
        slowed = [s * (1 + d) for s in samples]
        _, slowed_stats = compute_stats(slowed, 1)
        if _stats.is_different(samples, slowed, base_stats, slowed_stats):
            shift = d
            break
    if shift is None:
        return float("inf"), float("inf")
    return shift, max(shift, factor - 1)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _print(line: str) -> None:
    print(line, flush=True)


def main_flow(settings: Settings, *, keep: bool = False,
              log: Callable[[str], None] = _print) -> int:
    """Clone, plant, run, print the tables; exit 1 if a plant of at least the factor was
    missed, an A/A trial was flagged or the speed-up read as a regression."""
    from kernels.bench import asv_tools
    from kernels.core import devices, registry

    case = bench_case(settings.case)
    op = registry.operation(PLANT_OP)
    op.case(case)  # an unknown case fails here, before any clone
    impls = [FAMILIES[f] for f in settings.families]
    for impl in impls:
        reason = devices.case_unavailable_reason(registry.implementation(PLANT_OP, impl),
                                                 op.case(case))
        if reason:
            raise validation.UserError(f"{PLANT_OP}-{impl} cannot run {case} here: {reason}")
    source = pathlib.Path(vcs.output(pathlib.Path.cwd(), "rev-parse", "--show-toplevel"))
    head = vcs.output(source, "rev-parse", "HEAD")
    machine = asv_tools.register_machine()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="kernelperf-gate-"))
    log(f"gate-power: scratch clone {scratch} of {head[:8]}; machine {machine}; case {case}; "
        f"asv continuous -f {settings.factor}")
    vcs.output(scratch, "clone", "-q", str(source), ".")
    vcs.output(scratch, "checkout", "-q", "-B", "main", head)
    vcs.output(scratch, "config", "user.email", "gate-power@kernelperf")
    vcs.output(scratch, "config", "user.name", "kernelperf gate-power")
    outcomes: list[tuple[str, float, Outcome]] = []  # (kind, size, outcome)
    aa_samples: dict[str, list[float]] = {}
    # Interrupted (Ctrl-C, or a TERM from a time limit): report the trials done so far.
    signal.signal(signal.SIGTERM, _interrupt)
    interrupted = False
    try:
        for trial in range(settings.aa_trials):
            commit = _commit(scratch, f"A/A {trial + 1}", {pathlib.Path("README.md"): "\n"})
            outcome = run_trial(scratch, f"A/A {trial + 1}", head, commit, impls, case, settings,
                                machine, log)
            outcomes.append(("A/A", 0.0, outcome))
            if not aa_samples:
                for key, result in asv_tools.load(str(scratch / ".asv" / "results"), machine,
                                                  head).items():
                    if key[0].endswith(".time_device") and result.samples:
                        aa_samples[key[1][0].strip("'")] = result.samples
        planted: dict[float, str] = {}
        for size in settings.sizes:
            for trial in range(settings.trials):
                edits = {}
                for impl in impls:
                    implementation = registry.implementation(PLANT_OP, impl)
                    fraction = min(1.0, size * PLANT_SCALE.get(impl, 1.0))
                    edits[module_path(PLANT_OP, impl)] = plant_source(
                        PLANT_OP, impl, fraction, implementation.framework)
                label = f"+{size:.0%} trial {trial + 1}"
                commit = _commit(scratch, f"plant {label}", edits)
                planted.setdefault(size, commit)
                outcomes.append(("plant", size, run_trial(scratch, label, head, commit, impls, case,
                                                          settings, machine, log)))
        if settings.speedup and planted:
            size = min(planted)
            vcs.output(scratch, "checkout", "-q", "-B", "faster", planted[size])
            vcs.output(scratch, "revert", "--no-edit", "HEAD")
            fast = vcs.output(scratch, "rev-parse", "HEAD")
            outcomes.append(("speed-up", size, run_trial(
                scratch, f"-{size:.0%} (plant reverted)", planted[size], fast, impls, case,
                settings, machine, log)))
    except KeyboardInterrupt:
        interrupted = True
        log(f"gate-power: interrupted after {len(outcomes)} trial(s); reporting those")
    status = report(outcomes, settings, impls, aa_samples, log) or int(interrupted)
    if not keep:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    else:
        log(f"kept {scratch}")
    return status


def report(outcomes, settings: Settings, impls: list[str], aa_samples: dict[str, list[float]],
           log: Callable[[str], None]) -> int:
    """The per-trial table, the summary per (family, plant) and the detectable shifts."""
    from kernels.core.tables import table

    family_of = {impl: family for family, impl in FAMILIES.items()}
    rows, failures, false_positives = [], [], 0
    for kind, size, outcome in outcomes:
        for impl in impls:
            row = outcome.rows.get(impl, RowVerdict(None, False, False, "missing"))
            if kind == "A/A":
                wrong = row.asv_worse or row.plain_worse or row.verdict != "same"
                false_positives += wrong
                result = "false positive" if wrong else "ok (same)"
            elif kind == "speed-up":
                wrong = row.asv_worse or row.plain_worse or row.verdict == "slower"
                result = "read as regression" if wrong else f"ok ({row.verdict})"
            else:
                caught = row.asv_worse and row.verdict == "slower"
                # A plant at or above the factor must be caught by both; at or above 10%,
                # by plain asv continuous too.
                wrong = size + 1e-9 >= settings.factor - 1 and not caught
                plain_missed = size + 1e-9 >= PLAIN_FACTOR - 1 and not row.plain_worse
                wrong |= plain_missed
                result = ("caught" if caught else "MISSED") + (
                    "; plain asv missed it" if plain_missed else "")
            if wrong:
                failures.append(f"{outcome.label} {impl}")
            mark = "+" if row.asv_worse else "."
            rows.append([family_of[impl], impl, kind if kind != "plant" else f"+{size:.0%}",
                         outcome.label, f"{mark} (exit {outcome.asv_exit})",
                         "+" if row.plain_worse else ".",
                         f"{row.verdict} (exit {outcome.compare_exit})",
                         f"{row.ratio:.3f}" if row.ratio is not None else "-", result])
    log(table(rows, ["family", "implementation", "change", "trial",
                     f"asv -f {settings.factor}", "asv (1.1)", "compare", "head/base",
                     "result"]))
    log("(asv columns: '+' is asv's own per-row 'worse' mark; exit is the run's status)")
    aa_count = sum(1 for kind, _, _ in outcomes if kind == "A/A") * len(impls)
    log(f"A/A: {false_positives} false positive(s) in {aa_count} benchmark-trials")
    shifts = []
    for impl, samples in sorted(aa_samples.items()):
        statistical, gate = detectable_shift(samples, settings.factor)
        cv = statistics.stdev(samples) / statistics.fmean(samples) if len(samples) > 1 else 0
        shifts.append([family_of.get(impl, "?"), impl, str(len(samples)), f"{cv:.2%}",
                       f"{statistical:.1%}", f"{gate:.1%}"])
    if shifts:
        log(table(shifts, ["family", "implementation", "samples", "CV", "asv test detects from",
                           f"gate (-f {settings.factor}) catches from"]))
    if failures:
        log(f"gate-power: FAILED for {', '.join(failures)}")
        return 1
    log("gate-power: every plant at or above the factor caught, no false positive")
    return 0
