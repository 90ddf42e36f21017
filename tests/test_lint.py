"""The sources stay lint-clean: ruff (check and format) for Python, cython-lint for Cython.

The linters come with the test extras; a machine without them skips with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    return subprocess.run([exe, *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_check_is_clean():
    proc = _run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_clean():
    proc = _run("ruff", "format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cython_lint_is_clean():
    sources = sorted(
        str(p.relative_to(REPO)) for d in ("pyllama", "plugins", "experiments") for p in (REPO / d).rglob("*.pyx")
    )
    assert sources, "no .pyx files found"
    proc = _run("cython-lint", *sources)
    assert proc.returncode == 0, proc.stdout + proc.stderr
