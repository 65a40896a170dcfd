"""What every command group parses with: argparse that reports a usage mistake in one line, and
the argument types shared between groups."""

from __future__ import annotations

import argparse
import subprocess

from kernels.core import validation

# argparse that reports a usage mistake in one line (it lives in the core, where the
# `python -m` tools below the command line parse with it too).
Parser = validation.ArgumentParser


def revision(text: str) -> str:
    """argparse type: a git revision that names a commit here."""
    from kernels.bench import asv_tools

    try:
        asv_tools.full_hash(text)
    except subprocess.CalledProcessError:
        raise argparse.ArgumentTypeError(f"expected a git revision of this repository (a branch, "
                                         f"tag or commit), got {text!r}") from None
    return text
