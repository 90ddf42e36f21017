"""The sources stay lint-clean: ruff (check and format) for Python, cython-lint for Cython, and no
Cython ``DEF`` (which Cython 3 deprecates).

The linters come with the test extras; a machine without them skips with the reason.
"""

from __future__ import annotations

import re
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


# Kernels being reworked for the table of weight types; their DEFs go with that change. A file
# listed here without a DEF fails the test too, so the list only shrinks.
DEF_PENDING: set[str] = set()  # files allowed a DEF for now (none)


def test_no_cython_def_constants():
    """A compile-time constant is a ``cdef enum`` member (an int, usable as an array size), a
    module-level ``cdef const`` (a float) or a Python value: Cython 3 deprecates ``DEF``."""
    found: dict[str, list[str]] = {}
    cython = (".pyx", ".pxd", ".pxi")
    for path in sorted(
        p for d in ("pyllama", "plugins", "experiments") for p in (REPO / d).rglob("*") if p.suffix in cython
    ):
        lines = path.read_text(encoding="utf-8").splitlines()
        defs = [f"{i}: {line.strip()}" for i, line in enumerate(lines, 1) if re.match(r"\s*DEF\s", line)]
        if defs:
            found[path.relative_to(REPO).as_posix()] = defs
    offenders = [f"{rel}:{d}" for rel, defs in found.items() if rel not in DEF_PENDING for d in defs]
    assert not offenders, "DEF lines (use cdef enum, cdef const or a Python value):\n" + "\n".join(offenders)
    stale = sorted(DEF_PENDING - found.keys())
    assert not stale, f"no DEF left in {', '.join(stale)}: remove it from DEF_PENDING"
