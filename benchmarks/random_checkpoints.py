"""Seeded random-weight checkpoints of the tinyllamas shapes, shared by the benchmarks.

Speed does not depend on weight values, so every benchmark measures files written by the shared
``tools/make_llama2c_checkpoint.py`` (seed 0), made once per folder and reused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def random_checkpoint(shape: str, workdir: Path) -> Path:
    """``workdir/{shape}-random.bin``, written now unless it is already there."""
    path = workdir / f"{shape}-random.bin"
    if not path.exists():
        tool = SHARED / "tools" / "make_llama2c_checkpoint.py"
        subprocess.run([sys.executable, str(tool), shape, str(path), "--seed", "0"], check=True, capture_output=True)
    return path
