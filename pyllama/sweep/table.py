"""The results table: one row per cell, persisted as each cell finishes, written as Parquet and CSV.

An output folder holds

* ``rows.jsonl`` — the row store: one JSON object per finished cell, appended and flushed to disk
  the moment the cell's result arrives, so an interrupted sweep loses only the cells in flight
  (floats are written with ``repr``, which reads back bit for bit; NaN as ``NaN``);
* ``results.parquet`` and ``results.csv`` — the table of the study's cells, in study order, written
  at the end of a run from the store;
* with per-position rows, ``positions/<cell>.parquet`` per cell and ``positions.parquet`` for all.

``--resume`` reads the store: a cell whose key has a row without an error is not run again; a cell
that failed runs again and its new row replaces the old one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from pyllama.errors import InputError

__all__ = ["RowStore", "to_frame", "COLUMN_ORDER", "output_files"]

ROWS = "rows.jsonl"
TABLE = "results.parquet"
CSV = "results.csv"
POSITIONS_DIR = "positions"
POSITIONS = "positions.parquet"

COLUMN_ORDER = (
    "cell", "model", "model_sha256", "tokenizer", "probe", "reference", "plugin", "spec", "budget", "seed",
)  # fmt: skip
TEXT_COLUMNS = {"error", "notes", "first_diff_sequence", "last_sequence", "tokenizer", "worker"}
LAYER_SUFFIXES = ("_err_mean", "_err_max")
TAIL = ("error", "notes", "seconds", "positions_per_second", "worker", "threads", "pyllama_version", "model_path")


def output_files(out: str | os.PathLike | None, per_position: bool = False) -> list[tuple[str, Path]]:
    """What a sweep writes into ``out``, each named by the option that chose the folder (the folder
    itself first: an existing file of that name cannot become one)."""
    if out is None:
        return []
    folder = Path(out)
    names = (ROWS, TABLE, CSV, POSITIONS) if per_position else (ROWS, TABLE, CSV)
    return [("--out", folder)] + [("--out", folder / name) for name in names]


class RowStore:
    """The rows of a sweep, kept in memory and, given a folder, appended to its ``rows.jsonl``."""

    def __init__(self, out: str | os.PathLike | None, resume: bool = False) -> None:
        self.out = Path(out) if out is not None else None
        self.rows: dict[str, dict[str, Any]] = {}
        if self.out is None:
            return
        store = self.out / ROWS
        if store.exists() and not resume:
            raise InputError(f"{store} exists: pass --resume (resume=True) to continue it, or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        if store.exists():
            for line in store.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.rows[row["cell"]] = row  # a later row of a cell replaces an earlier one

    def done(self, key: str) -> bool:
        row = self.rows.get(key)
        return row is not None and not row.get("error")

    def append(self, row: dict[str, Any], positions: dict | None = None) -> None:
        self.rows[row["cell"]] = row
        if self.out is None:
            return
        if positions is not None:
            _write_positions(self.out / POSITIONS_DIR / f"{row['cell']}.parquet", positions)
        with open(self.out / ROWS, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=_json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def frame(self, keys: list[str]):
        return to_frame([self.rows[k] for k in keys if k in self.rows])

    def write(self, keys: list[str], per_position: bool = False):
        """Write the table of ``keys`` (study order) as Parquet and CSV; return it as a DataFrame."""
        df = self.frame(keys)
        if self.out is not None:
            df.to_parquet(self.out / TABLE, index=False)
            df.to_csv(self.out / CSV, index=False)
            if per_position:
                _concat_positions([self.out / POSITIONS_DIR / f"{k}.parquet" for k in keys], self.out / POSITIONS)
        return df


def to_frame(rows: list[dict[str, Any]]):
    """A DataFrame of rows with the columns in a fixed order: config, knobs, metrics, layers, run."""
    import pandas as pd  # lazy: pandas only for the DataFrame

    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    knobs = sorted(n for n in names if n.startswith("knob_"))
    layers = sorted(
        (n for n in names if n.startswith("layer") and n.endswith(("_err_mean", "_err_max"))), key=_layer_key
    )
    head = [n for n in COLUMN_ORDER]
    tail = [n for n in TAIL]
    middle = [n for n in names if n not in head and n not in tail and n not in knobs and n not in layers]
    columns = head + knobs + middle + layers + tail
    df = pd.DataFrame([{c: row.get(c) for c in columns} for row in rows], columns=columns)
    for c in df.columns:
        if c not in TEXT_COLUMNS and df[c].dtype == object:
            df[c] = _numeric(df[c])
    return df


def _numeric(col):
    """A column of ints (of floats) with missing values as nullable Int64 (float64); others unchanged."""
    values = col.dropna()
    if len(values) == 0 or not values.map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)).all():
        return col
    return col.astype("Int64") if values.map(lambda v: isinstance(v, int)).all() else col.astype("float64")


def _layer_key(name: str) -> tuple[int, str]:
    digits = name[len("layer") :].split("_", 1)[0]
    return (int(digits) if digits.isdigit() else 0, name)


def _json_default(v: Any):
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def _write_positions(path: Path, columns: dict) -> None:
    import pyarrow as pa  # lazy, here and below: pyarrow only when per-position tables are written
    import pyarrow.parquet as pq

    n = len(columns["position"])
    data = {k: (np.full(n, v, dtype=object) if isinstance(v, str) else v) for k, v in columns.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.table(data), tmp)
    os.replace(tmp, path)  # a half-written file never has the final name


def _concat_positions(paths: list[Path], dest: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in paths if p.exists()]
    if tables:
        pq.write_table(pa.concat_tables(tables, promote_options="default"), dest)
