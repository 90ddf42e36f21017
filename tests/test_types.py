"""The types hold: mypy is clean on the package.

mypy comes with the test extras; a machine without it skips with the reason. mypy keeps its cache in
the repository's ``.mypy_cache`` (git-ignored): a first run takes ~8 s, a later one under 1 s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True)


def test_mypy_is_clean_on_the_package():
    proc = _run("mypy")  # the files and options: pyproject.toml's [tool.mypy]
    assert proc.returncode == 0, proc.stdout + proc.stderr
