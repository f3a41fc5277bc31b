"""The project as a user has it: installed, imported from a folder outside the repository, beside
packages whose names our folders share (Hugging Face's `kernels`, which transformers needs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = PYPROJECT["tool"]["setuptools"]["packages"]
FOLDERS = [ROOT / name.split(".")[0] for name in PACKAGES if name not in PYPROJECT["tool"]["setuptools"]["package-dir"]]
FOLDERS += [ROOT / folder for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values()]

PROBE = """
import importlib, json, sys
found = {name: importlib.import_module(name).__file__ for name in sys.argv[1:]}
import transformers, kernels  # theirs, beside ours
found["kernels"] = kernels.__file__
print(json.dumps(found))
"""


def test_every_package_imports_from_the_project_outside_the_repository(tmp_path):
    run = subprocess.run([sys.executable, "-c", PROBE, *PACKAGES], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    found = {name: Path(file).resolve() for name, file in json.loads(run.stdout.splitlines()[-1]).items()}
    for name in PACKAGES:
        assert _ours(found[name]), (name, found[name])
    assert not _ours(found["kernels"]), found["kernels"]  # Hugging Face's, not our kernels/


def test_no_package_of_ours_takes_a_name_of_a_known_pypi_package():
    top_level = {name.split(".")[0] for name in PACKAGES}
    assert not top_level & {"kernels", "server", "eval", "bench", "tests"}, top_level


def test_the_test_run_itself_sees_the_installed_names():
    """The repository root must not come before site-packages here either (it once hid the
    collision: pytest put the root first and the parity tests passed by path order alone)."""
    import kernels

    assert not _ours(Path(kernels.__file__).resolve()), kernels.__file__


def _ours(path: Path) -> bool:
    return any(path.is_relative_to(folder) for folder in FOLDERS)
