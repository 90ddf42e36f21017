"""One cell of a study: one diff, run where Dask puts it, turned into one row of the results table.

A cell is a pure function of (model file, tokenizer, reference spec, plugin spec, probe, seed): the
engine is bit-identical for any thread count, so a row does not depend on the worker or its threads,
only the timing columns do. A worker process keeps every model it has mapped (``_MODELS``) and reuses it
for the next cell of the same model. Any exception of the cell (a plugin that raises, a probe too long
for a plugin) becomes the row's one-line ``error``: the sweep goes on.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from pyllama.errors import PyllamaError
from pyllama.model import Model
from pyllama.version import __version__

__all__ = ["Cell", "run_cell", "summary_columns"]

_MODELS: dict[tuple[str, str | None], Any] = {}  # per worker process: (path, tokenizer) -> Model

# the scalar metrics of DiffReport.summary that become columns as they are
SUMMARY_SCALARS = (
    "sequences",
    "positions",
    "exact",
    "max_abs_dlogit",
    "mean_kl",
    "p99_kl",
    "max_kl",
    "top1_agreement",
    "first_diff_layer",
    "ppl_a",
    "ppl_b",
    "ppl_ratio",
    "bytes_last_a",
    "bytes_last_b",
    "bytes_causal_last",
    "bytes_ratio_a",
    "bytes_ratio_b",
    "recall_mean_p_a",
    "recall_mean_p_b",
    # retrieval probes (passkey, needle, copy): see pyllama.diff.retrieval_scores
    "retrieval_a",
    "retrieval_b",
    "key_logp_a",
    "key_logp_b",
    "greedy_match_a",
    "greedy_match_b",
    "copy_loss_a",
    "copy_loss_b",
    "copy_rank1_a",
    "copy_rank1_b",
)
TIMING_COLUMNS = ("seconds", "positions_per_second", "worker", "threads")  # what may differ between two runs


@dataclass(frozen=True)
class Cell:
    """Everything one diff needs, and the key that names its row."""

    key: str  # hash of what determines the result (see plan.cell_key)
    model: str  # absolute path
    model_sha256: str
    tokenizer: str | None
    reference: str  # canonical spec of side A
    family: str  # the plugin's name as the study writes it
    spec: str  # canonical spec of side B
    knobs: tuple[tuple[str, Any], ...]
    probe: str  # a probe name or an absolute text-file path
    seed: int | None = None
    budget: int | None = None  # bytes, when the spec was sized to an equal-memory budget
    entry: int | None = None  # its [[plugins]] index in the study, for messages (not part of the key)

    def config_columns(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "cell": self.key,
            "model": os.path.basename(self.model),
            "model_path": self.model,
            "model_sha256": self.model_sha256,
            "tokenizer": self.tokenizer,
            "probe": self.probe,
            "reference": self.reference,
            "plugin": self.family,
            "spec": self.spec,
            "budget": self.budget,
            "seed": self.seed,
        }
        row.update({f"knob_{name}": value for name, value in self.knobs})
        return row

    def error_row(self, exc: BaseException) -> dict[str, Any]:
        """The row of a cell that produced no report (its task failed, or its worker was lost for good)."""
        row = self.config_columns()
        row["error"] = one_line(exc)
        return row


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, PyllamaError) else f"{type(exc).__name__}: {text}"


def worker_model(path: str, tokenizer: str | None):
    """The model of ``path``, mapped once per process and reused by every later cell."""
    key = (path, tokenizer)
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS[key] = Model.load(path, tokenizer=tokenizer)
    return model


@contextmanager
def pinned_threads(threads: int):
    """BLAS/OpenMP pools of this process limited to ``threads`` while a cell runs (numpy's metrics
    must not oversubscribe the cores the other workers use); the engine takes its count explicitly."""
    with threadpool_limits(limits=threads):
        yield


def summary_columns(report) -> dict[str, Any]:
    """The row's metric columns from a DiffReport: the summary's scalars, the first difference, the
    last position, and the per-layer mean and max relative error of the attention output."""
    s = report.summary
    row: dict[str, Any] = {k: _plain(s.get(k)) for k in SUMMARY_SCALARS}
    first = s.get("first_diff") or {}
    row["first_diff_position"] = first.get("position")
    row["first_diff_sequence"] = first.get("sequence")
    last = s.get("last") or {}
    row["last_sequence"] = last.get("sequence")
    row["last_position"] = last.get("position")
    for i, v in enumerate(s.get("layer_err_mean", [])):
        row[f"layer{i}_err_mean"] = float(v)
    for i, v in enumerate(s.get("layer_err_max", [])):
        row[f"layer{i}_err_max"] = float(v)
    row["notes"] = "; ".join(report.notes) or None
    return row


def _plain(v: Any) -> Any:
    """A numpy scalar as the Python value (the row store is JSON)."""
    return v.item() if isinstance(v, np.generic) else v


def run_cell(cell: Cell, threads: int = 1, per_position: bool = False) -> tuple[dict[str, Any], dict | None]:
    """Run one diff; ``(row, per-position columns or None)``. Never raises for the cell's own failure."""
    row = cell.config_columns()
    positions = None
    t0 = time.perf_counter()
    try:
        with pinned_threads(threads):
            model = worker_model(cell.model, cell.tokenizer)
            report = model.diff(cell.reference, cell.spec, probe=cell.probe, threads=threads, progress=False)
            row.update(summary_columns(report))
            if per_position:
                positions = {"cell": cell.key, **report.columns()}
        row["error"] = None
    except Exception as exc:  # the cell's failure is its row, the sweep goes on
        row["error"] = one_line(exc)
    seconds = time.perf_counter() - t0
    row["seconds"] = seconds
    row["positions_per_second"] = row["positions"] / seconds if row.get("positions") and seconds > 0 else None
    row["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    row["threads"] = threads
    row["pyllama_version"] = __version__
    return row, positions
