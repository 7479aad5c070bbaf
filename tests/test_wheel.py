"""What a user installs is a wheel: every module of the source tree is in it.

``pyproject.toml`` names its packages one by one (the zoo ships from ``zoo/`` as ``archscan.zoo``);
a package left out works in the editable install the suite runs from and fails in every real
install. This builds the wheel and compares. ``.ci/wheel-check`` then installs it in a fresh venv
and runs every command from an empty directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = {"archscan": os.path.join(ROOT, "archscan"), "archscan/zoo": os.path.join(ROOT, "zoo")}


def source_files() -> set[str]:
    """Every file a wheel must carry, as its path inside the wheel."""
    out = set()
    for prefix, folder in SOURCES.items():
        for dirpath, dirnames, files in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if f.endswith((".pyc", ".pyo")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), folder).replace(os.sep, "/")
                if prefix == "archscan" and rel.startswith("zoo/"):
                    continue
                out.add(f"{prefix}/{rel}")
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel built from a copy of the sources: setuptools builds in the tree, and a ``build/``
    left there by an earlier build would lend the wheel files that pyproject.toml leaves out."""
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), tree / name)
    for folder in ("archscan", "zoo"):
        shutil.copytree(os.path.join(ROOT, folder), tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(tree)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and ("No matching distribution" in done.stderr or "Could not find" in done.stderr):
        pytest.skip(f"setuptools could not be installed to build the wheel: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("archscan-*.whl")
    return zipfile.ZipFile(built)


def test_wheel_carries_every_module(wheel):
    names = set(wheel.namelist())
    missing = sorted(source_files() - names)
    assert not missing, f"left out of the wheel: {missing} (add their package to pyproject.toml)"
    # the sub-packages the analysis imports, named: a wheel without one fails every command
    for package in ("archscan/memory", "archscan/costs", "archscan/report", "archscan/zoo"):
        assert f"{package}/__init__.py" in names


def test_wheel_entry_points(wheel):
    """``archscan`` as a console script and ``python -m archscan``."""
    (entry,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "archscan = archscan.cli:entry" in wheel.read(entry).decode()
    assert "archscan/__main__.py" in wheel.namelist()
