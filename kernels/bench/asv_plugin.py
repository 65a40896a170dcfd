"""asv environment "kernelperf": a virtualenv per commit that sees the running Python's packages.

asv builds and installs each benchmarked commit into its own environment. On
the GPU machine nothing can be downloaded, and jax (with its CUDA plugin),
torch and triton come with the machine's Python, itself a venv whose packages
a virtualenv's "system site packages" would not reach. So this environment
installs nothing from an index: it is created with virtualenv's bundled pip and
setuptools, and a .pth file adds the site-packages of the Python running asv
(and its PYTHONPATH, e.g. carried wheels) after the environment's own. The
commit's `kernels` is installed into the environment (asv.conf.json builds its
wheel by calling the commit's declared build backend, and installs it with --no-deps
--no-index --force-reinstall, which also removes the previous commit's files: one pip
process a commit, not pip's wheel, uninstall and install, about 2 s less on a 2-core
CPU), so it shadows nothing and is shadowed by nothing.

Loaded by asv through asv.conf.json's "plugins"; selected by
"environment_type": "kernelperf". Loading it (`setup`, which asv calls before
any command runs) also names the machine: unless `--machine` is given, plain
`asv run`, `asv continuous main HEAD` and `asv find` run as the normalised
GPU (or CPU) model, with its entry in ~/.asv-machine.json written or
refreshed with the device keys, exactly as `python -m kernels bench` does. So
a fresh machine needs no `asv machine` questions, and results land in
.asv/results/<model>/ whichever command made them. For `asv continuous BASE HEAD` it also
resolves the two commits as asv is about to, and says at once when they are one commit (asv
would benchmark it twice and compare it with itself, saying nothing).
"""

from __future__ import annotations

import atexit
import os
import sys
import sysconfig
import time
from pathlib import Path

from asv import util as asv_util
from asv.console import log
from asv.machine import Machine
from asv.plugins.virtualenv import Virtualenv

from kernels.bench import breakdown

PTH_NAME = "kernelperf-host-packages.pth"


def host_package_paths() -> list[str]:
    """The directories this Python imports third-party packages from, in order."""
    stdlib = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib")}
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = []
    for entry in [*extra, *sys.path]:
        if not entry or not os.path.isdir(entry):
            continue
        resolved = Path(entry).resolve()
        if resolved in stdlib or resolved == Path.cwd().resolve():
            continue
        if str(resolved) not in paths:
            paths.append(str(resolved))
    return paths


# The asv commands that pick a machine (and would otherwise ask for one at a terminal).
_MACHINE_COMMANDS = ("run", "continuous", "find", "dev", "profile")


def _command_and_machine(argv: list[str]) -> tuple[str | None, bool]:
    """(the asv subcommand that picks a machine, or None; whether --machine / -m was given)."""
    command = next((word for word in argv[1:] if word in _MACHINE_COMMANDS), None)
    given = any(w in ("--machine", "-m") or w.startswith("--machine=") for w in argv[1:])
    return command, given


def _print_breakdown(since: float) -> None:
    text = breakdown.report(since, time.time() - since)
    if text:
        print(text, flush=True)


def _continuous_revisions(argv: list[str]) -> tuple[str, str, str] | None:
    """(base, head, config file) as `asv continuous` reads them from `argv` with asv's own
    parser; None for another command, or where the base is left to asv (the head's parent,
    never the head itself)."""
    from asv import commands
    from asv.commands.continuous import Continuous

    parser, _ = commands.make_argparser()
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit:  # asv itself reports a command line it cannot parse
        return None
    if getattr(getattr(args, "func", None), "__self__", None) is not Continuous \
            or args.base is None:
        return None
    return args.base, args.branch, args.config


def same_commit_note(argv: list[str]) -> str | None:
    """The line to print before `asv continuous BASE HEAD` measures anything when BASE and
    HEAD are one commit (asv runs it twice and compares it with itself: nothing can read
    slower); None otherwise. The names are resolved by asv's own repository object, as
    Continuous.run resolves them next; a name asv cannot resolve is left to asv to report."""
    revisions = _continuous_revisions(argv)
    if revisions is None:
        return None
    base, head, config = revisions
    from asv import util
    from asv.config import Config
    from asv.repo import NoSuchNameError, get_repo

    try:
        repo = get_repo(Config.load(config))
        repo.pull()
        base_hash, head_hash = (repo.get_hash_from_name(name) for name in (base, head))
    except (NoSuchNameError, util.UserError, OSError):
        return None
    if base_hash != head_hash:
        return None
    return (f"asv continuous: {base} and {head} are the same commit ({head_hash[:8]}): asv "
            "will benchmark it twice and compare it with itself, so nothing can read slower. "
            "Commit the change to gate it; `make noise-floor` compares runs of one commit.")


# asv 0.6.6's util.human_value writes a unit only for "seconds" and "bytes": every other number
# a benchmark declares a unit for (perf_tests/benchmarks.py: TFLOP/s, GB/s, ...) comes out bare,
# as 0.13796688283128342, in asv's tables (run, show, continuous, compare) and its regressions
# feed. This writes those with 3 significant digits and their unit.
_UNITS_ASV_WRITES = ("seconds", "bytes")
_HUMAN_VALUE = asv_util.human_value


def human_value(value, unit, err=None) -> str:
    """asv's util.human_value, with the unit written for every declared unit."""
    if unit in _UNITS_ASV_WRITES or not unit or unit == "unit" or \
            not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return _HUMAN_VALUE(value, unit, err=err)
    return f"{value:.3g}" + (f"±{err:.2g}" if err is not None else "") + f" {unit}"


def _write_units() -> None:
    """asv's number formatting replaced by `human_value`, where asv's modules bound it."""
    from asv.commands import compare

    asv_util.human_value = human_value
    compare.human_value = human_value


def setup() -> None:
    """asv's plugin hook: numbers written with their units (`human_value`); name the machine
    by its device model unless asv was told one; for `asv run` and `asv continuous`, print
    where the time went when asv exits; for `asv continuous` of one commit against itself,
    say so before anything is built or measured."""
    _write_units()
    command, given = _command_and_machine(sys.argv)
    if command == "continuous":
        note = same_commit_note(sys.argv)
        if note:
            print(note, flush=True)
    if command in ("run", "continuous") and not os.environ.get(breakdown.QUIET_VARIABLE):
        atexit.register(_print_breakdown, time.time())
    if given or command is None:
        return
    from kernels.bench import asv_tools
    from kernels.core import environment

    environment.configure()
    Machine.hardcoded_machine_name = asv_tools.register_machine()


class KernelperfEnvironment(Virtualenv):
    tool_name = "kernelperf"

    def _install_requirements(self) -> None:
        """Link the running Python's packages instead of installing any."""
        result = self.run(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        site_packages = Path(result.strip().splitlines()[-1])
        paths = host_package_paths()
        (site_packages / PTH_NAME).write_text("\n".join(paths) + "\n")
        log.info(f"kernelperf environment {self.name}: linked {len(paths)} package folder(s) "
                 f"of {sys.executable}")
