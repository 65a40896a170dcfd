"""`bringup`: the GPU in hand brought up as data (kernels.bench.bringup): its ceilings, floors,
tuned configs, noise floors and asv history, then the diff of what was written and a table of
every floor.

`python -m kernels bringup --worker STEP` is the child process each GPU step runs in (never
typed by a user): it measures, appending one JSON line per event to --journal, while the
parent watches it (time limits per item, the deadline) and records each finished item.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from kernels.core import environment, fingerprint, validation

# Exit status of a bring-up cut by --deadline before its steps were done: run it again (the
# same steps) to go on where it stopped (.ci/device/bringup.sh loops on it).
EXIT_UNFINISHED = 75
PROBE_TIMEOUT_S = 300  # JAX's first GPU start, cold caches
# Per-item limits of the workers that have no case to size them by (the perf items take theirs
# from the isolation plugin's, kernels.testing.isolation.GPU_LIMITS).
CEILINGS_LIMIT_S = 900.0
TUNE_LIMIT_S = 1500.0
NOISE_LIMIT_S = 3600.0
ASV_STEPS = ("noise", "history")


def _regex(text: str) -> str:
    """argparse type: a regular expression (asv's --bench), checked as it is parsed."""
    try:
        re.compile(text)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"expected a regular expression, got {text!r} "
                                         f"({error})") from None
    return text


def _one_gpu() -> str | None:
    """Narrows CUDA_VISIBLE_DEVICES to one GPU where several are visible (the bring-up
    measures one device of the model; asv names a machine of several GPUs apart); what it
    said, or None."""
    count = environment.nvidia_gpu_count()
    if count <= 1:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0].strip() if visible else "0"
    os.environ["CUDA_VISIBLE_DEVICES"] = first
    return f"{count} GPUs visible: the bring-up measures one (CUDA_VISIBLE_DEVICES={first})"


def _jax_platform() -> str:
    """The platform of JAX's first device, asked of a child process (this one keeps no CUDA
    context)."""
    done = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else \
        f"none ({(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]})"


def _commit(root: pathlib.Path) -> str:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown (no git checkout)"


def cmd_bringup(args: argparse.Namespace) -> int:
    if args.worker:
        return WORKERS[args.worker](args)
    from kernels.bench import bringup

    identity = fingerprint.identity()
    refused = bringup.refusal(nvidia=environment.nvidia_gpu_present(),
                              vendors=bringup.gpu_vendors(), description=identity.name)
    if refused:
        raise validation.UserError(refused)
    said = _one_gpu()
    if said:
        print(f"kernels bringup: {said}", flush=True)
        fingerprint.identity.cache_clear()
        identity = fingerprint.identity()
    wanted = [step for step in ASV_STEPS if step in args.steps]
    if wanted and importlib.util.find_spec("asv") is None:
        others = " ".join(s for s in args.steps if s not in ASV_STEPS)
        raise validation.UserError(
            f"--steps: {', '.join(wanted)} run asv, which is not installed (pip install "
            f"asv==0.6.6; on the lent GPU machine .ci/device/bringup.sh carries its wheels)"
            + (f"; --steps {others} needs none" if others else ""))
    platform = _jax_platform()
    if platform != "gpu":
        raise validation.UserError(f"an NVIDIA GPU is here ({identity.name}) but JAX sees none "
                                   f"(its first device: {platform}): install jax[cuda13] (or "
                                   f"cuda12) to bring it up")
    root = pathlib.Path.cwd()
    ctx = bringup.Context(
        model=identity.model, device=identity.name, driver=identity.driver,
        commit=_commit(root), root=root,
        worker=[sys.executable, "-m", "kernels", "bringup", "--worker"],
        runs=args.runs, rounds=args.rounds, budget_s=args.budget,
        allow_loosen=args.allow_loosen,
        deadline=None if args.deadline is None else time.monotonic() + args.deadline,
        history_commits=args.history_commits, history_window=args.history_window,
        history_bench=args.history_bench, noise_runs=args.noise_runs,
        log=lambda line: print(line, flush=True))
    failure = None
    try:
        finished = bringup.run(ctx, args.steps, restart=args.restart)
    except ValueError as error:  # a step's precondition (history without git, floors first)
        raise validation.UserError(str(error)) from None
    except RuntimeError as error:  # a step that failed; what it and the others did is kept
        finished, failure = False, str(error)
    print("\n== what was written (git diff of the data files)", flush=True)
    print(bringup.review_diff(root, bringup.data_paths(ctx.model, root)))
    lines = ctx.session["steps"].get("floors", {}).get("table")
    if lines:
        print(f"\n== floors of {ctx.device} (this session)")
        print("\n".join(lines))
    if failure:
        print(f"kernels bringup: failed: {failure}", file=sys.stderr, flush=True)
        return 1
    if not finished:
        print("kernels bringup: not finished (the deadline); run it again to go on",
              flush=True)
        return EXIT_UNFINISHED
    print(f"kernels bringup: {', '.join(args.steps)} done for {ctx.device}; review the diff "
          f"above and commit it")
    return 0


# -- workers: the child processes that measure ----------------------------------------------------

def _journal(args: argparse.Namespace) -> Callable[..., None]:
    from kernels.bench import bringup

    path = pathlib.Path(args.journal)
    return lambda **event: bringup.write_event(path, event)


def _only(args: argparse.Namespace) -> set[str] | None:
    if not args.only:
        return None
    wanted = json.loads(pathlib.Path(args.only).read_text())
    return None if wanted is None else set(wanted)


def _failed(write, item: str, error: BaseException) -> bool:
    """Journal `item` as failed; whether the error left the device unusable (the worker then
    ends, and the parent starts a fresh one for the rest)."""
    from kernels.testing import isolation

    sticky = isolation.sticky_in_exception(error)
    write(event="failed", id=item, reason=(f"{type(error).__name__}: {error}".splitlines()
                                           or ["?"])[0][:300])
    return sticky is not None


def worker_ceilings(args: argparse.Namespace) -> int:
    from kernels.roofline import ceilings

    write = _journal(args)
    write(event="items", items=[{"id": "ceilings"}])
    write(event="start", id="ceilings", limit_s=CEILINGS_LIMIT_S)
    device = fingerprint.fingerprint()
    measured = ceilings.measured(device, refresh=True)
    if measured is None:
        write(event="failed", id="ceilings", reason="not measured (torch missing?)")
        return 1
    write(event="done", id="ceilings", ceiling=measured.to_dict(), fingerprint=device.to_dict())
    return 0


def _round_records(item, result, device) -> tuple[list[dict[str, Any]], str | None]:
    from kernels.core import registry
    from kernels.roofline import ceilings, model

    sheet = ceilings.datasheet(device.name)
    work = registry.operation(item.impl.op).work(item.case, item.direction)
    # A round's ratio is over the baselines of the kernel's clock and precision only (a TF32
    # GEMM beside an FP32 kernel measures the precision: kernels.core.precisions).
    same = {name for name, m in result.baselines.items() if m.method == result.kernel.method
            and m.precision == result.kernel.precision}
    rounds = []
    for medians in result.rounds:
        placed = model.place(work, medians[result.name], sheet, item.case.dtype) if sheet \
            else None
        rounds.append({"kernel": medians[result.name],
                       "baselines": {n: s for n, s in medians.items() if n in same},
                       "roofline": placed.fraction if placed else None})
    bound = model.place(work, result.kernel.median_s, sheet, item.case.dtype).bound \
        if sheet else None
    return rounds, bound


def worker_perf(args: argparse.Namespace) -> int:
    """Every perf item of this GPU (or those --only names) measured interleaved, one journal
    line each."""
    from kernels.bench import perfcheck
    from kernels.core import devices, registry, timing
    from kernels.testing import isolation

    write = _journal(args)
    device = fingerprint.fingerprint()
    machine = devices.this_machine()
    items = perfcheck.perf_items(machine)
    listed = []
    for item in items:
        peers = perfcheck.baselines_for(item.impl, item.case, item.direction, machine)
        # The kernel and each baseline compile and sample: the item limit of a kernel test
        # (sized by the case's bytes) for each of them.
        limit = isolation.GPU_LIMITS.for_case(registry.operation(item.impl.op), item.case) * \
            (1 + len(peers))
        listed.append({"id": item.id, "op": item.impl.op, "impl": item.impl.name,
                       "case": item.case.id, "direction": item.direction,
                       "skip": item.skip_reason, "limit_s": limit})
    write(event="items", items=listed)
    limits = {entry["id"]: entry["limit_s"] for entry in listed}
    wanted = _only(args)
    session = perfcheck.PerfSession(device, timing.StoppingRule(time_budget_s=args.budget))
    for item in items:
        if item.skip_reason or (wanted is not None and item.id not in wanted):
            continue
        write(event="start", id=item.id, limit_s=limits[item.id])
        started = time.monotonic()
        try:
            result = session.measure_interleaved(item.impl, item.case, item.direction,
                                                 rounds=args.rounds)
            rounds, bound = _round_records(item, result, device)
        except Exception as error:  # the item fails; the rest are measured
            if _failed(write, item.id, error):
                return isolation.EXIT_POISONED
            continue
        write(event="done", id=item.id, run=args.run, method=result.kernel.method,
              rounds=rounds, bound=bound, errors=dict(result.errors),
              throttled=result.kernel.throttled_count
              + sum(m.throttled_count for m in result.baselines.values()),
              seconds=round(time.monotonic() - started, 2))
    return 0


def worker_tune(args: argparse.Namespace) -> int:
    """Every tunable kernel (kernels.core.tuning) tuned on this GPU, recorded under its model."""
    from kernels.core import devices, registry, tuning
    from kernels.testing import isolation

    write = _journal(args)
    registry.load()
    found = {f"{op}/{impl}": factory for (op, impl), factory in sorted(tuning._TUNABLES.items())}
    write(event="items", items=[{"id": name} for name in found])
    model = tuning.model_key(devices.this_machine().device_kind)
    wanted = _only(args)
    for name, factory in found.items():
        if wanted is not None and name not in wanted:
            continue
        write(event="start", id=name, limit_s=TUNE_LIMIT_S)
        op, impl = name.split("/")
        try:
            tunable = factory()
            best, _ = tuning.tune(tunable, tuning.device_timer)
        except Exception as error:  # this kernel's tune fails; the others go on
            if _failed(write, name, error):
                return isolation.EXIT_POISONED
            continue
        if best is None:
            write(event="failed", id=name, reason="every config failed; nothing recorded")
            continue
        path = tuning.record(op, impl, model, best.config, time_ms=best.time_ms,
                             case_id=tunable.case_id, timer=tuning.TIMER_NAME,
                             fields=tuning.chosen_fields(tunable.candidates))
        write(event="done", id=name, config=dataclasses.asdict(best.config),
              time_ms=best.time_ms, case=tunable.case_id, path=str(path))
    return 0


def worker_noise(args: argparse.Namespace) -> int:
    """The noise floors of each asv benchmark class, one class at a time (`kernels
    noise-floor --bench`), as this machine learns them."""
    from kernels.bench import asv_tools
    from kernels.cli import bench

    write = _journal(args)
    import perf_tests.benchmarks as suite

    classes = sorted(name for name, value in vars(suite).items()
                     if isinstance(value, type) and hasattr(value, "time_device")
                     and not name.startswith("_"))
    write(event="items", items=[{"id": name} for name in classes])
    wanted = _only(args)
    commit = asv_tools.full_hash("HEAD")
    for name in classes:
        if wanted is not None and name not in wanted:
            continue
        write(event="start", id=name, limit_s=NOISE_LIMIT_S)
        try:
            learned = asv_tools.learn_floors("HEAD", args.runs,
                                             bench_regex=bench.floor_regex(rf"\.{name}\."))
        except Exception as error:  # asv failed for this class; the next one goes on
            _failed(write, name, error)
            continue
        write(event="done", id=name, floors=learned, commit=commit)
    return 0


WORKERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "ceilings": worker_ceilings, "perf": worker_perf, "tune": worker_tune,
    "noise": worker_noise}


def add_commands(subparsers) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `bringup` on `subparsers`."""
    from kernels.bench import bringup

    parser = subparsers.add_parser(
        "bringup", help="bring up the GPU in hand: measure its ceilings, perf items, floors, "
        "tuned configs, noise floors and asv history, and write them as data for review")
    parser.add_argument("--steps", nargs="+", choices=bringup.STEPS, default=list(bringup.STEPS),
                        help=f"the steps to run (default all; they run in this order: "
                        f"{' '.join(bringup.STEPS)}); a step done in this session is skipped")
    parser.add_argument("--runs", type=validation.int_at_least(2), default=2,
                        help="fresh processes measuring every perf item, at least 2 (their "
                        "spread is each floor's margin; default 2)")
    parser.add_argument("--rounds", type=validation.int_at_least(2), default=3,
                        help="interleaved rounds of kernel and baselines per item and run "
                        "(default 3)")
    parser.add_argument("--budget", type=validation.positive_float, default=1.0,
                        help="seconds of sampling per implementation and item, over its "
                        "rounds (default 1.0, as the pytest perf items)")
    parser.add_argument("--allow-loosen", action="store_true",
                        help="write a floor lower than the one there (shown as loosened); "
                        "without it a lower floor is kept and reported")
    parser.add_argument("--restart", action="store_true",
                        help="start a new session even where the last one is unfinished")
    parser.add_argument("--deadline", type=validation.positive_float, metavar="SECONDS",
                        help=f"stop starting work after SECONDS and cut what runs, keeping "
                        f"what finished; exit {EXIT_UNFINISHED} until every step is done "
                        f"(10-minute device calls)")
    parser.add_argument("--history-commits", type=validation.positive_int, default=12,
                        help="commits of main with every benchmark class in the shipped asv "
                        "history (default 12)")
    parser.add_argument("--history-window", type=validation.positive_int, default=140,
                        help="how far back along main's first parents they are spread "
                        "(default 140)")
    parser.add_argument("--history-bench", type=_regex, default="time_device",
                        help="asv --bench regex of the history (default time_device: every "
                        "operation's device time; '' for every benchmark)")
    parser.add_argument("--noise-runs", type=validation.int_at_least(2), default=2,
                        help="asv runs per benchmark class for its noise floors (default 2)")
    worker = parser.add_argument_group("worker (the child processes; not for typing)")
    worker.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    worker.add_argument("--journal", type=pathlib.Path, help=argparse.SUPPRESS)
    worker.add_argument("--only", type=pathlib.Path, help=argparse.SUPPRESS)
    worker.add_argument("--run", type=int, default=1, help=argparse.SUPPRESS)
    return {"bringup": cmd_bringup}
