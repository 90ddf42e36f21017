"""DiffReport: the per-position record of one diff and everything derived from it.

Per position (numpy arrays, one entry per compared position, in probe order): the sequence and
position, the token and the teacher token (the next one), max |Δlogit|, KL(P_a ‖ P_b), the top-1 of
each side, the teacher token's log-probability under each side, each layer's relative L2 error of
the attention output, each plugin's ``memory_bytes()``, and where each side first held NaN or Inf
(a non-finite row is a difference in every metric; see :mod:`pyllama.diff.metrics`). ``summary`` condenses them;
``to_pandas``/``to_csv``/``to_json`` export every row; ``table()`` is what the CLI prints
(:mod:`pyllama.diff.report_text` renders it);
``plot()`` draws the figures of :mod:`pyllama.plots`.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from pyllama.diff.metrics import perplexity
from pyllama.diff.report_text import report_table, sig3
from pyllama.diff.retrieval_scores import RetrievalRow, summarize
from pyllama.outputs import check_outputs


@dataclass
class SegmentInfo:
    name: str
    kind: str
    length: int  # tokens in the probe
    compared: int  # positions run through both plugins
    note: str = ""
    event: int = -1  # the compression event came after this position (-1: none)


@dataclass
class RecallRow:
    segment: str
    name: str
    mention: int  # 0 = the first mention (not scored), 1.. = recurrences
    position: int  # first token of the name
    distance: int  # tokens since the previous mention started
    logp_a: float  # log P(name's tokens | context), summed over its tokens
    logp_b: float

    @property
    def p_a(self) -> float:
        return math.exp(self.logp_a)

    @property
    def p_b(self) -> float:
        return math.exp(self.logp_b)


@dataclass
class DiffReport:
    a: str  # spec of plugin A (the reference side of KL)
    b: str
    model: str
    probe: str
    n_layers: int
    kv_bytes_per_position: int  # what a dense cache holds per position (all layers, keys and values)
    segments: list[SegmentInfo]
    # per-position arrays, all of the same length
    segment: np.ndarray  # int index into ``segments``
    position: np.ndarray
    token: np.ndarray
    next_token: np.ndarray  # -1 at the end of a sequence
    max_abs_dlogit: np.ndarray
    kl: np.ndarray
    top1_a: np.ndarray
    top1_b: np.ndarray
    logp_a: np.ndarray  # log P(next token) under A; NaN at the end of a sequence
    logp_b: np.ndarray
    layer_err: np.ndarray  # [positions, n_layers]
    mem_a: np.ndarray
    mem_b: np.ndarray
    # per position: -1 all finite; else the first layer whose output held NaN/Inf (n_layers: the logits only)
    nonfinite_a: np.ndarray | None = None
    nonfinite_b: np.ndarray | None = None
    recall: list[RecallRow] = field(default_factory=list)
    # per position: the teacher token's rank under each side (1 = the argmax; 0 = no teacher token)
    rank_a: np.ndarray | None = None
    rank_b: np.ndarray | None = None
    retrieval: list[RetrievalRow] = field(default_factory=list)  # passkey / needle / copy sequences
    notes: list[str] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)  # "A"/"B": sides replayed from a recorded run
    seconds: float = 0.0
    threads: int = 1
    inputs: dict[str, str] = field(default_factory=dict)  # the files the diff read: no writer replaces them
    # the model's attention window per layer (0 = global; empty: every layer global), for causal_bytes
    layer_windows: tuple[int, ...] = ()

    # ---- derived per position -----------------------------------------------------------------
    @property
    def n_positions(self) -> int:
        return int(self.position.shape[0])

    @property
    def agree(self) -> np.ndarray:
        """Same top-1 on both sides (a non-finite row has top-1 -1 and agrees with nothing)."""
        return (self.top1_a == self.top1_b) & (self.top1_a >= 0)

    def _nonfinite(self, side: str) -> np.ndarray:
        col = self.nonfinite_a if side == "A" else self.nonfinite_b
        return col if col is not None else np.full(self.n_positions, -1, dtype=np.int32)

    def first_nonfinite(self) -> dict | None:
        """The earliest position (in probe order) where either side held NaN or Inf, with its layer."""
        best: tuple[int, str, int | None] | None = None  # (row, side, layer; None: the logits only)
        for side in ("A", "B"):
            col = self._nonfinite(side)
            rows = np.nonzero(col >= 0)[0]
            if not rows.size:
                continue
            i = int(rows[0])
            if best is None or i < best[0]:
                layer = int(col[i])
                best = (i, side, None if layer >= self.n_layers else layer)
        if best is None:
            return None
        i, side, first_layer = best
        return {
            "position": int(self.position[i]),
            "sequence": self.segments[self.segment[i]].name,
            "side": side,
            "layer": first_layer,
        }

    @property
    def dlogp(self) -> np.ndarray:
        """log P_b(teacher) - log P_a(teacher)."""
        return self.logp_b - self.logp_a

    @property
    def exact(self) -> bool:
        """True when every compared logit is bit-identical (max |Δlogit| == 0)."""
        return bool(self.n_positions > 0 and float(self.max_abs_dlogit.max()) == 0.0)

    def causal_bytes(self, position: int) -> int:
        """What ``causal`` holds after ``position`` (0-based): every position so far on a global
        layer, the model's window on a local one (Gemma 3's sliding-window layers)."""
        return int(self.causal_bytes_curve(np.array([position]))[0])

    def causal_bytes_curve(self, positions: np.ndarray) -> np.ndarray:
        """``causal_bytes`` at each of ``positions`` (int64)."""
        seen = np.asarray(positions, dtype=np.int64) + 1
        if not self.layer_windows:
            return seen * self.kv_bytes_per_position
        per_layer = self.kv_bytes_per_position // max(self.n_layers, 1)
        held = sum(np.minimum(seen, w) if w > 0 else seen for w in self.layer_windows)
        return np.asarray(held, dtype=np.int64) * per_layer

    # ---- summary --------------------------------------------------------------------------------
    @cached_property
    def summary(self) -> dict:
        n = self.n_positions
        s: dict = {
            "a": self.a,
            "b": self.b,
            "model": self.model,
            "probe": self.probe,
            "sequences": len(self.segments),
            "positions": n,
            "seconds": round(self.seconds, 3),
        }
        if n == 0:
            return s
        differs = np.nonzero(self.max_abs_dlogit > 0)[0]
        first = None
        if differs.size:
            i = int(differs[np.argmin(self.position[differs])])
            first = {"position": int(self.position[i]), "sequence": self.segments[self.segment[i]].name}
        layer_any = np.nonzero((self.layer_err > 0).any(axis=0))[0]
        last = self._last_row()
        pos_last = int(self.position[last])
        causal = self.causal_bytes(pos_last)
        ppl_a, ppl_b = perplexity(self.logp_a), perplexity(self.logp_b)
        s.update(
            {
                "exact": self.exact,
                "max_abs_dlogit": float(self.max_abs_dlogit.max()),
                "mean_kl": float(self.kl.mean()),
                "p99_kl": _p99(self.kl),
                "max_kl": float(self.kl.max()),
                "top1_agreement": float(self.agree.mean()),
                "first_diff": first,
                "first_nonfinite": self.first_nonfinite(),
                "first_diff_layer": int(layer_any[0]) if layer_any.size else None,
                "layer_err_mean": [float(x) for x in self.layer_err.mean(axis=0)],
                "layer_err_max": [float(x) for x in self.layer_err.max(axis=0)],
                "ppl_a": ppl_a,
                "ppl_b": ppl_b,
                "ppl_ratio": ppl_b / ppl_a if ppl_a and math.isfinite(ppl_a) else float("nan"),
                "last": {"sequence": self.segments[self.segment[last]].name, "position": pos_last},
                "bytes_last_a": int(self.mem_a[last]),
                "bytes_last_b": int(self.mem_b[last]),
                "bytes_causal_last": causal,
                "bytes_ratio_a": int(self.mem_a[last]) / causal,
                "bytes_ratio_b": int(self.mem_b[last]) / causal,
                "positions_per_second": n / self.seconds if self.seconds > 0 else None,
            }
        )
        if self.recall:
            s["recall_mean_p_a"] = float(np.mean([r.p_a for r in self.recall if r.mention > 0] or [np.nan]))
            s["recall_mean_p_b"] = float(np.mean([r.p_b for r in self.recall if r.mention > 0] or [np.nan]))
        if self.retrieval:
            s.update(summarize(self.retrieval, "a"))
            s.update(summarize(self.retrieval, "b"))
        return s

    def _last_row(self) -> int:
        """The last row of the longest compared sequence (where memory is largest)."""
        longest = max(range(len(self.segments)), key=lambda i: self.segments[i].compared)
        rows = np.nonzero(self.segment == longest)[0]
        return int(rows[-1]) if rows.size else self.n_positions - 1

    def _rank(self, side: str) -> np.ndarray:
        col = self.rank_a if side == "a" else self.rank_b
        return col if col is not None else np.zeros(self.n_positions, dtype=np.int64)

    # ---- export ---------------------------------------------------------------------------------
    def columns(self) -> dict[str, np.ndarray]:
        """Every per-position column, by name (the CSV/JSON/pandas layout)."""
        names = np.array([s.name for s in self.segments], dtype=object)
        cols: dict[str, np.ndarray] = {
            "sequence": names[self.segment] if self.n_positions else np.array([], dtype=object),
            "position": self.position,
            "token": self.token,
            "next_token": self.next_token,
            "max_abs_dlogit": self.max_abs_dlogit,
            "kl": self.kl,
            "top1_a": self.top1_a,
            "top1_b": self.top1_b,
            "agree": self.agree,
            "logp_a": self.logp_a,
            "logp_b": self.logp_b,
            "dlogp": self.dlogp,
            "rank_a": self._rank("a"),
            "rank_b": self._rank("b"),
            "mem_a": self.mem_a,
            "mem_b": self.mem_b,
            "nonfinite_a": self._nonfinite("A"),
            "nonfinite_b": self._nonfinite("B"),
        }
        for layer in range(self.n_layers):
            cols[f"layer{layer}_err"] = self.layer_err[:, layer]
        return cols

    def to_pandas(self):
        """A DataFrame with one row per compared position (needs pandas)."""
        try:
            import pandas as pd  # lazy here and below: pandas only for a DataFrame
        except ImportError as exc:  # pragma: no cover - pandas is optional
            raise ImportError("DiffReport.to_pandas() needs pandas: pip install pandas") from exc
        return pd.DataFrame(self.columns())

    def retrieval_frame(self):
        """A DataFrame with one row per retrieval sequence (depth, length, distance, each side's scores)."""
        import pandas as pd

        return pd.DataFrame([r.flat() for r in self.retrieval])

    def rows(self) -> list[dict]:
        cols = self.columns()
        keys = list(cols)
        return [{k: _jsonable(cols[k][i]) for k in keys} for i in range(self.n_positions)]

    def to_dict(self) -> dict:
        return {
            "summary": {k: _jsonable(v) for k, v in self.summary.items()},
            "notes": self.notes,
            "sequences": [vars(s) for s in self.segments],
            "recall": [dict(vars(r), p_a=_jsonable(r.p_a), p_b=_jsonable(r.p_b)) for r in self.recall],
            "retrieval": [_jsonable(r.flat()) for r in self.retrieval],
            "rows": self.rows(),
        }

    def to_json(self, path: str | os.PathLike) -> None:
        check_outputs(self.inputs, {"DiffReport.to_json": path})
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, allow_nan=False, default=_jsonable)
            f.write("\n")

    def to_csv(self, path: str | os.PathLike) -> None:
        """Every per-position row; with a retrieval probe, also one row per scored sequence in
        ``retrieval_path(path)`` (``rows.csv`` -> ``rows.retrieval.csv``)."""
        check_outputs(self.inputs, {"DiffReport.to_csv": path})
        cols = self.columns()
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(list(cols))
            for i in range(self.n_positions):
                w.writerow([_csv_value(cols[k][i]) for k in cols])
        if self.retrieval:
            self.retrieval_to_csv(retrieval_path(path))

    def retrieval_to_csv(self, path: str | os.PathLike) -> None:
        """One row per retrieval sequence (``RetrievalRow.flat``; lists joined by ``|``)."""
        flat = [r.flat() for r in self.retrieval]
        keys = list(dict.fromkeys(k for row in flat for k in row))
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(keys)
            for row in flat:
                w.writerow([_csv_value(row.get(k)) for k in keys])

    # ---- display --------------------------------------------------------------------------------
    def plot(self, path: str | os.PathLike | None = None):
        """The overview figure (divergence, per-layer error, memory, recall); saved when ``path`` is given."""
        from pyllama.plots import report_figure  # lazy: matplotlib only when a figure is drawn

        if path is not None:
            check_outputs(self.inputs, {"DiffReport.plot": path})
        fig = report_figure(self)
        if path is not None:
            fig.savefig(path, dpi=120, bbox_inches="tight")
        return fig

    def table(self) -> str:
        """The terminal report: one line per sequence, then the summary (see report_text)."""
        return report_table(self)

    def __repr__(self) -> str:
        if self.n_positions == 0:
            return f"DiffReport({self.a} vs {self.b}: nothing compared)"
        s = self.summary
        return (
            f"DiffReport({self.a} vs {self.b}, {self.probe}: {self.n_positions} positions, "
            f"max|Δlogit| {sig3(s['max_abs_dlogit'])}, mean KL {sig3(s['mean_kl'])}, "
            f"top-1 {100 * s['top1_agreement']:.1f}%, ppl B/A {s['ppl_ratio']:.4f})"
        )


def _p99(kl: np.ndarray) -> float:
    """The 99th percentile of KL; +inf when it falls among infinite (non-finite) rows."""
    with np.errstate(invalid="ignore"):  # interpolating between two infinities gives NaN
        p = float(np.percentile(kl, 99))
    return float("inf") if math.isnan(p) else p


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def retrieval_path(path: str | os.PathLike) -> str:
    """Where ``to_csv(path)`` writes the per-sequence retrieval rows: ``.retrieval`` before the suffix."""
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.retrieval{ext or '.csv'}"


def _csv_value(v):
    if isinstance(v, (np.floating, float)):
        return "" if not math.isfinite(float(v)) else repr(float(v))
    if isinstance(v, (np.bool_, bool)):
        return int(v)
    if isinstance(v, (list, tuple)):
        return "|".join(str(x) for x in v)
    return "" if v is None else v
