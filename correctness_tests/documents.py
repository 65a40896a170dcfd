"""The project's documents: README.md and every docs/*.md. The README check runs the commands
of all of them (test_readme.py), and the tests of documented defaults read their sentences
wherever they now stand (test_cli_defaults.py, test_asv_tools.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def paths(root: Path = ROOT) -> list[Path]:
    """README.md first, then every docs/*.md by name: the order the README check runs them."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def sentence(pattern: str, root: Path = ROOT) -> tuple[str, ...]:
    """The groups of the one match of `pattern` (a space matching any whitespace, as in a
    wrapped line) over every document: exactly one in them all, so a default is stated once
    and a second, different statement of it fails here."""
    regex = re.compile(pattern.replace(" ", r"\s+"))
    found = [(path.relative_to(root).as_posix(), match)
             for path in paths(root) for match in regex.findall(path.read_text())]
    assert len(found) == 1, (f"README.md and docs/*.md: expected one sentence matching "
                             f"{pattern!r}, got {found}")
    match = found[0][1]
    return match if isinstance(match, tuple) else (match,)
