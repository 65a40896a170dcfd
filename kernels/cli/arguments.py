"""What every command group parses with: argparse that reports a usage mistake in one line, and
the argument types shared between groups."""

from __future__ import annotations

import argparse
import subprocess


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line (argparse prints the usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def revision(text: str) -> str:
    """argparse type: a git revision that names a commit here."""
    from kernels.bench import asv_tools

    try:
        asv_tools.full_hash(text)
    except subprocess.CalledProcessError:
        raise argparse.ArgumentTypeError(f"expected a git revision of this repository (a branch, "
                                         f"tag or commit), got {text!r}") from None
    return text
