"""The package layout: old module names still import, and each import-linter contract in
.importlinter fails when an import that breaks it is planted (in a copy of the package)."""

from __future__ import annotations

import importlib
import pathlib
import shutil
import subprocess
import sys

import pytest

import kernels

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")


@pytest.mark.parametrize("old", sorted(kernels.MOVED))
def test_old_module_names_are_the_moved_modules(old: str) -> None:
    moved = importlib.import_module(f"kernels.{old}")
    home = importlib.import_module(f"kernels.{kernels.MOVED[old]}")
    assert moved is home
    assert moved.__spec__.name == f"kernels.{kernels.MOVED[old]}"  # its own spec, not the alias's


def test_old_module_names_run_with_python_m() -> None:
    done = subprocess.run([sys.executable, "-m", "kernels.history", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fetch" in done.stdout


# (module to plant in, import line, the contract that must break, what the report names)
PLANTS = [
    ("kernels/ops/softmax/xla.py", "from kernels.bench import gate", "Layers",
     "kernels.ops.softmax.xla -> kernels.bench.gate"),
    ("kernels/core/timing.py", "from kernels.roofline import model", "The core imports nothing",
     "kernels.core.timing -> kernels.roofline.model"),
    ("kernels/bench/asv_tools.py", "from kernels.cli import arguments", "Nothing but",
     "kernels.bench.asv_tools -> kernels.cli.arguments"),
    ("kernels/ops/softmax/spec.py", "from kernels.ops.matmul import spec as _m",
     "Operations are independent", "kernels.ops.softmax.spec -> kernels.ops.matmul.spec"),
    ("kernels/core/dtypes.py", "from kernels.core import registry as _r", "No import cycles",
     ".dtypes -> .registry"),
]


@pytest.fixture(scope="module")
def lint_imports():
    if not LINT_IMPORTS.exists():
        pytest.skip(f"needs import-linter's lint-imports beside {sys.executable} (make install)")

    def run(workdir: pathlib.Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=workdir, text=True,
                              capture_output=True, timeout=120,
                              env={"PYTHONPATH": str(workdir), "PATH": "/usr/bin:/bin"})
    return run


def test_contracts_are_kept(lint_imports, tmp_path: pathlib.Path) -> None:
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path)
    done = lint_imports(tmp_path)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(("module", "line", "contract", "named"), PLANTS,
                         ids=[plant[2].split()[0].lower() for plant in PLANTS])
def test_a_planted_import_breaks_its_contract(lint_imports, tmp_path: pathlib.Path, module: str,
                                              line: str, contract: str, named: str) -> None:
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path)
    with open(tmp_path / module, "a") as planted:
        planted.write(f"\n{line}  # planted\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout
    broken = [row for row in done.stdout.splitlines() if " BROKEN" in row]
    assert any(row.startswith(contract) for row in broken), done.stdout
    assert named in done.stdout
