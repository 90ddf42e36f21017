"""Tensor traces under llama.cpp's names, and their comparison with a ``llama-eval-callback`` log.

``trace_prompt`` teacher-forces a prompt through exact (causal) attention, one position at a time,
with an observer of the engine's stages, and keeps every intermediate tensor of every position:
``inp_embd``, ``attn_norm-L``, ``Qcur-L`` and ``Kcur-L`` (after RoPE), ``Vcur-L``,
``kqv_merged_cont-L`` (attention output, heads merged), ``kqv_out-L``, ``ffn_inp-L``,
``ffn_norm-L``, ``ffn_gate-L``, ``ffn_up-L``, ``ffn_gate_par-L`` (silu(gate) * up), ``ffn_out-L``,
``l_out-L``, ``result_norm``, ``result_output``. As in llama.cpp's graph, the last layer keeps only
the last position's row from ``ffn_inp`` on (``inp_out_ids``: only the last token's logits are
requested), and so do ``result_norm`` and ``result_output``.

``parse_evalcb_log`` reads ``llama-eval-callback`` output: per tensor a header line (``ggml_debug:``
at older llama.cpp versions, ``common_debug_cb_eval:`` at newer ones) ending in its shape ``{ne0, ne1,
ne2, ne3}``, the printed values, then ``sum = ...``. A name repeats when llama.cpp reuses it
(``Qcur-0`` is the matmul, then the RoPE result; ``norm-0`` serves both RMSNorms): the last one
wins, which is the tensor pyllama emits.

What that ``sum`` covers: at the llama.cpp version of the reference logs (Feb 2025) the callback adds
up only the values it prints, the first and last 3 along every dimension longer than 6 (e.g. 36 of
the 448 values of a [64, 7] tensor), in float32, in row-major order. ``parse_evalcb_log`` tells which
kind of log it has from the printed values themselves (a sum of only the printed corners matches
them to their 4 printed decimals, a sum over everything does not), and pyllama's sum is computed the
same way over the same elements, laid out in the log's shape.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from pyllama.engine.observer import StageCallback
from pyllama.errors import InputError
from pyllama.model import Model

# The engine's stages (pyllama.engine.observer) under the names llama.cpp's graph gives them. Its
# names moved: the logs of early 2025 (ggml_debug: lines) name the attention output kqv_merged_cont and
# Wo's kqv_out; at 0c1e570 (common_debug_cb_eval: lines) kqv_out is the attention output, Wo's output
# is unnamed but for llama's attn_out, the embedding is embd and the gated activation ffn_swiglu or
# ffn_geglu. A stage a style does not name is not traced in it.
EARLY_NAMES = {
    "embedding": "inp_embd",
    "attn_norm": "attn_norm",
    "q": "Qcur",
    "k": "Kcur",
    "v": "Vcur",
    "attention": "kqv_merged_cont",
    "attn_out": "kqv_out",
    "ffn_inp": "ffn_inp",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "ffn_gate",
    "ffn_up": "ffn_up",
    "ffn_act": "ffn_gate_par",
    "ffn_out": "ffn_out",
    "layer_out": "l_out",
    "result_norm": "result_norm",
    "logits": "result_output",
}
# From ffn_inp on, llama.cpp's last layer computes only the rows whose logits are wanted.
LAST_LAYER_LAST_ROW = ("ffn_inp", "ffn_norm", "ffn_gate", "ffn_up", "ffn_gate_par", "ffn_out", "l_out")


def current_names(arch: str) -> dict[str, str]:
    """The stage names of llama.cpp 0c1e570's graph for ``arch``."""
    names = {
        "embedding": "embd",
        "embedding_scaled": "inp_scaled",
        "attn_norm": "attn_norm",
        "q_normed": "Qcur_normed",
        "k_normed": "Kcur_normed",
        "q": "Qcur",
        "k": "Kcur",
        "v": "Vcur",
        "attention": "kqv_out",
        "attn_post_norm": "attn_post_norm",
        "ffn_inp": "sa_out" if arch == "gemma3" else "ffn_inp",
        "ffn_norm": "ffn_norm",
        "ffn_gate": "ffn_gate",
        "ffn_up": "ffn_up",
        "ffn_act": "ffn_geglu" if arch == "gemma3" else "ffn_swiglu",
        "ffn_out": "ffn_out",
        "ffn_post_norm": "ffn_post_norm",
        "layer_out": "l_out",
        "result_norm": "result_norm",
        "logits": "result_output",
    }
    if arch == "llama":
        names["attn_out"] = "attn_out"
    return names


# From the attention's output on (gemma3: after Wo), the current graph's last layer keeps the last row only.
CURRENT_LAST_ROW = (
    "attn_post_norm",
    "sa_out",
    "ffn_inp",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_swiglu",
    "ffn_geglu",
    "ffn_out",
    "ffn_post_norm",
    "l_out",
)
FINAL_LAST_ROW = ("result_norm", "result_output")
EVALCB_EDGE = 3  # llama-eval-callback prints (and, at older versions, sums) 3 values at each end of a dimension

_HEADER = re.compile(
    r"^(?:ggml_debug|common_debug_cb_eval):\s*(?P<name>.+?) = \((?P<type>[^)]*)\)\s*(?P<op>\w+)\(.*"
    r"= \{(?P<ne>[\d,\s]+)\}\s*$"
)
_SUM = re.compile(r"^\s*sum\s*[=:]\s*(?P<value>[-+]?(?:nan|inf|[0-9.]+(?:[eE][-+]?\d+)?))\s*$", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:nan|inf|\d+\.\d*(?:[eE][-+]?\d+)?)", re.IGNORECASE)


@dataclass
class TracedTensor:
    """One tensor of the trace: ``data`` is float32 (positions, values per position)."""

    name: str
    data: np.ndarray
    shape: tuple[int, ...]  # llama.cpp's ne of one position's values (ne0 first), e.g. (head_dim, n_heads)

    @property
    def positions(self) -> int:
        return int(self.data.shape[0])


@dataclass
class EvalLogEntry:
    sum: float
    ne: tuple[int, ...]  # ne0 first, trailing 1s dropped


@dataclass
class EvalLog:
    """A ``llama-eval-callback`` log reduced to ``{name: (sum, shape)}``, last entry winning."""

    entries: dict[str, EvalLogEntry]
    corners_only: bool  # the sums cover only the printed values (first/last EVALCB_EDGE per dimension)
    current: bool = False  # a log of current llama.cpp (common_debug_cb_eval: lines, its tensor names)

    def sums(self) -> dict[str, float]:
        return {name: e.sum for name, e in self.entries.items()}


@dataclass
class TraceRow:
    """One tensor: pyllama's sum and, when a log was given, llama.cpp's."""

    name: str
    positions: int
    values: int  # how many values the sum covers
    ours: float
    reference: float | None = None
    note: str = ""

    @property
    def abs_diff(self) -> float | None:
        return None if self.reference is None else abs(self.ours - self.reference)

    @property
    def rel_diff(self) -> float | None:
        """|ours - llama.cpp| / |llama.cpp| (inf when llama.cpp's sum is 0 and ours is not)."""
        if self.reference is None:
            return None
        d = abs(self.ours - self.reference)
        if d == 0:
            return 0.0
        return d / abs(self.reference) if self.reference != 0 else math.inf

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "positions": self.positions,
            "values": self.values,
            "sum": self.ours,
            "llama_cpp": self.reference,
            "rel_diff": self.rel_diff,
            "note": self.note,
        }


@dataclass
class Trace:
    tensors: list[TracedTensor] = field(default_factory=list)

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def __getitem__(self, name: str) -> TracedTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def _last_row_only(name: str, n_layers: int, last_row: tuple[str, ...]) -> bool:
    if name in FINAL_LAST_ROW:
        return True
    base, _, layer = name.rpartition("-")
    return base in last_row and layer == str(n_layers - 1)


def _per_position_shape(name: str, n: int, config) -> tuple[int, ...]:
    base = name.rpartition("-")[0]
    if base == "Qcur" and n == config.q_dim:
        return (config.head_dim, config.n_heads)
    if base == "Kcur" and n == config.kv_dim:
        return (config.head_dim, config.n_kv_heads)
    return (n,)


def trace_prompt(model, ids: list[int], threads: int | None = None, current: bool | None = None) -> Trace:
    """Run ``ids`` (BOS first) through ``model`` with causal attention, keeping every traced tensor
    (in the order the engine first emitted them), named as llama.cpp 0c1e570 names them
    (``current``) or as its logs of early 2025 did; None: the current names for the architectures
    that only it runs (gemma3, qwen3, Llama 3's scaled RoPE), the early ones for the others."""
    if current is None:
        config = model.config
        current = config.arch not in ("llama", "qwen2") or config.rope_freq_factors is not None
    ids = [int(t) for t in ids]
    if not ids:
        raise InputError("trace: the prompt has no tokens")
    engine = model.engine("causal", threads)
    if len(ids) > engine.max_positions:
        raise InputError(f"trace: the prompt is {len(ids)} tokens, the model holds {engine.max_positions} positions")
    n_layers = model.config.n_layers
    last = len(ids) - 1
    rows: dict[str, list[np.ndarray]] = {}
    names = current_names(model.config.arch) if current else EARLY_NAMES
    last_row = CURRENT_LAST_ROW if current else LAST_LAYER_LAST_ROW

    def tracer(stage: str, layer: int, pos: int, values: np.ndarray) -> None:
        name = names[stage] if layer < 0 else f"{names[stage]}-{layer}"
        if pos != last and _last_row_only(name, n_layers, last_row):
            return
        rows.setdefault(name, []).append(values.ravel())

    engine.reset()
    engine.set_observer(StageCallback(tracer, stages=tuple(names), per_position=True))
    try:
        for pos, token in enumerate(ids):
            engine.forward(token, pos)
    finally:
        engine.set_observer(None)
    trace = Trace()
    for name, parts in rows.items():
        data = np.stack(parts)
        trace.tensors.append(TracedTensor(name, data, _per_position_shape(name, data.shape[1], model.config)))
    return trace


def _float32_sum(values: np.ndarray) -> float:
    """Sum in float32, one value after the other (what the callback's ``float sum += v`` does)."""
    flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
    return float(np.cumsum(flat, dtype=np.float32)[-1]) if flat.size else 0.0


def _corners(array: np.ndarray, edge: int) -> np.ndarray:
    """The elements llama-eval-callback prints: first and last ``edge`` along every dimension longer than 2*edge."""
    index = []
    for size in array.shape:
        if size > 2 * edge:
            index.append(np.r_[0:edge, size - edge : size])
        else:
            index.append(np.arange(size))
    return array[np.ix_(*index)] if index else array


def _strip_ones(ne: tuple[int, ...]) -> tuple[int, ...]:
    ne = tuple(ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne = ne[:-1]
    return ne


def summarize(trace: Trace, log: EvalLog | None = None) -> list[TraceRow]:
    """One row per traced tensor. Without a log: the float32 sum of all its values. With one: the sum
    llama-eval-callback computes (its elements, its order, in the log's shape) and llama.cpp's."""
    out = []
    for t in trace.tensors:
        full_ne = _strip_ones((*t.shape, t.positions))
        entry = log.entries.get(t.name) if log is not None else None
        if log is None or entry is None:
            out.append(
                TraceRow(
                    t.name,
                    t.positions,
                    t.data.size,
                    _float32_sum(t.data),
                    note="not in the log" if log is not None else "",
                )
            )
            continue
        ne = entry.ne if math.prod(entry.ne) == t.data.size else full_ne
        note = "" if ne == entry.ne else f"llama.cpp's shape {list(entry.ne)} has a different size"
        array = t.data.reshape(ne[::-1])  # numpy order: slowest dimension (ne3) first
        if log.corners_only:
            array = _corners(array, EVALCB_EDGE)
        reference = entry.sum if not note else None
        out.append(TraceRow(t.name, t.positions, int(array.size), _float32_sum(array), reference, note))
    return out


def parse_evalcb_log(path: str | os.PathLike) -> EvalLog:
    """Read a ``llama-eval-callback`` log (see the module docstring)."""
    entries: dict[str, EvalLogEntry] = {}
    style = ""  # the first header's prefix: ggml_debug (early 2025) or common_debug_cb_eval (current)
    votes_corners = votes_all = 0
    current: str | None = None
    ne: tuple[int, ...] = ()
    printed: list[float] = []
    elided = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _HEADER.match(line)
            if m:
                style = style or line.split(":", 1)[0].strip()
                current = m.group("name").strip()
                ne = _strip_ones(tuple(int(v) for v in m.group("ne").split(",") if v.strip()))
                printed, elided = [], False
                continue
            if current is None:
                continue
            s = _SUM.match(line)
            if s:
                total = float(s.group("value"))
                entries.pop(current, None)  # a repeated name moves to where it was last computed
                entries[current] = EvalLogEntry(total, ne)
                if elided and printed and math.isfinite(total):
                    # each printed value is rounded to 4 decimals; the sum is printed with 6
                    slack = 5e-5 * len(printed) + 1e-6 * (1 + abs(total))
                    if abs(math.fsum(printed) - total) <= slack:
                        votes_corners += 1
                    else:
                        votes_all += 1
                current = None
                continue
            if "..." in line:
                elided = True
            printed.extend(float(v) for v in _NUMBER.findall(line))
    if not entries:
        raise InputError(
            f"{os.fspath(path)}: no tensor sums found: expected llama-eval-callback output "
            "(lines 'ggml_debug: NAME = (f32) OP(...) = {ne}' followed by 'sum = ...')"
        )
    return EvalLog(entries, corners_only=votes_corners >= votes_all, current=style == "common_debug_cb_eval")


def format_rows(rows: list[TraceRow]) -> str:
    with_ref = any(r.reference is not None for r in rows)
    width = max([len(r.name) for r in rows] + [6])
    header = f"{'tensor':<{width}}  {'positions':>9}  {'values':>7}  {'pyllama sum':>15}"
    if with_ref:
        header += f"  {'llama.cpp sum':>15}  {'rel diff':>9}"
    lines = [header]
    for r in rows:
        line = f"{r.name:<{width}}  {r.positions:>9}  {r.values:>7}  {r.ours:>15.6f}"
        if with_ref:
            if r.reference is None:
                line += f"  {'-':>15}  {'-':>9}  {r.note}"
            else:
                line += f"  {r.reference:>15.6f}  {r.rel_diff:>9.2e}"
        lines.append(line)
    return "\n".join(lines)


def trace_file(
    model_path: str | os.PathLike,
    prompt: str,
    tokenizer: str | os.PathLike | None = None,
    log: str | os.PathLike | None = None,
    threads: int | None = None,
) -> tuple[list[int], list[TraceRow]]:
    """``pyllama trace``: tokenise ``prompt`` (BOS first, as llama.cpp does), trace it through the
    model file and, given a ``llama-eval-callback`` log, attach llama.cpp's sums."""
    model = Model.load(model_path, tokenizer=tokenizer, threads=threads or 0)
    ids = model.tokenize(prompt)
    reference = parse_evalcb_log(log) if log is not None else None
    current = reference.current if reference is not None else None
    rows = summarize(trace_prompt(model, ids, threads, current), reference)
    if reference is not None and not any(r.reference is not None for r in rows):
        raise InputError(
            f"{log}: none of its tensors matches this model's run of the prompt (names or sizes differ): "
            "pass the llama-eval-callback log of the same model file and prompt"
        )
    return ids, rows
