"""What the suite knows of one GPU model, as data: the folder `kernels/models/<model>/` and its
JSON files (floors, measured ceilings, noise floors, the bring-up's record).

A GPU model is data, not code: `python -m kernels bringup` writes these files on the model
in hand and they are reviewed as a diff. The folder is named by the normalised model
(`fingerprint.normalise`, e.g. `nvidia-h200`), the key results and caches are kept under,
and every file names the exact driver name it was measured on (`device`), so a reader can
check that a file is its model's and never takes another's. One folder per model keeps
everything one bring-up wrote side by side, where a reviewer sees it; tuned block configs
stay beside their kernels (kernels/ops/<op>/tuned.json, keyed by the same model) and the asv
history with the other shipped results (perf_tests/results/asv/<model>/).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from kernels.core import fingerprint

ROOT = pathlib.Path(__file__).resolve().parents[1] / "models"
FLOORS = "floors.json"
CEILINGS = "ceilings.json"
NOISE_FLOORS = "noise-floors.json"
BRINGUP = "bringup.json"


def check_key(model: str) -> str:
    """`model` if it is a normalised model name (a folder name that cannot leave ROOT)."""
    if not model or fingerprint.normalise(model) != model:
        raise ValueError(f"model: expected a normalised GPU model name such as 'nvidia-h200', "
                         f"got {model!r}")
    return model


def path(model: str, name: str, root: pathlib.Path | None = None) -> pathlib.Path:
    """The file `name` of `model`'s folder (which need not exist yet)."""
    return (root or ROOT) / check_key(model) / name


def models(root: pathlib.Path | None = None) -> list[str]:
    """The models that have a folder, sorted."""
    root = root or ROOT
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read(model: str, name: str, root: pathlib.Path | None = None) -> dict[str, Any] | None:
    """The JSON object in `model`'s file `name`, or None where there is none.

    Raises ValueError when the file names another model than its folder (a copied file)."""
    file = path(model, name, root)
    if not file.is_file():
        return None
    data = json.loads(file.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(data).__name__}")
    named = data.get("model")
    if named is not None and named != model:
        raise ValueError(f"{file}: expected the data of {model!r} (its folder), got the data of "
                         f"{named!r}; a model's file is never read for another")
    return data


def write(model: str, name: str, data: dict[str, Any],
          root: pathlib.Path | None = None) -> pathlib.Path:
    """Write `data` (with `model` set) as `model`'s file `name`, atomically, in a stable
    layout (sorted keys, two-space indent, a final newline) so a re-run diffs only what
    changed."""
    file = path(model, name, root)
    file.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**data, "model": model}, indent=2, sort_keys=True) + "\n"
    partial = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    os.replace(partial, file)
    return file
