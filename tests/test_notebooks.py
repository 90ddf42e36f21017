"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel, headless, without an error,
and shows its figures. The notebooks load the real stories260K from shared/models beside the
repository, so they skip when it is absent. Each one runs with notebooks/ as its working directory,
as it does when opened in Jupyter."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, shared_file

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need the [test] extra (nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need the [test] extra (nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="the notebook tests need the [test] extra (nbclient, ipykernel)")

NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
TIMEOUT = 300  # seconds per cell; the slowest notebook takes about 20 s on two cores


def test_the_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == [
        "divergence.ipynb",
        "past_context.ipynb",
        "sweep.ipynb",
        "write_your_own.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code"
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: clear the outputs of cells {dirty} before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path):
    shared_file("stories260K.bin")
    shared_file("tok512.bin")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any exception in the notebook
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, f"{path.name} wrote to stderr: {stderr}"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    figures = sum("plots." in c.source or ".plot()" in c.source for c in nb.cells if c.cell_type == "code")
    assert len(images) == figures >= 1, f"{path.name}: {len(images)} figures shown, {figures} cells draw one"
