"""Teacher forcing through two plugins that share one set of weights.

Both engines see the same tokens at the same positions: every sequence of the probe is fed from
position 0 after a reset, in blocks of positions (``Engine.forward_block``: each weight read once
per block, the same bits as one ``forward`` per position, the plugin's ledger reported per position
through ``Engine.set_ledger``). Each engine copies its per-layer attention output and its final
hidden state into capture buffers (``Engine.set_capture``, one row per position) and skips its
classifier: the logits of a
block of positions are computed afterwards by ``classify_block``, the same per-element arithmetic
with the classifier read once per block (bit-identical to ``Engine.forward``'s logits; the tests
check it). With two or more threads the two engines run a block concurrently, half the thread
budget each (a native plugin's forward releases the GIL; a Python plugin holds it only inside its
``attend``). Each side reduces its block of logits to its log-softmax's per-row constants (one exp
per logit, ``_metrics.RowSoftmax``); the comparison metrics then take one compiled pass over both
sides' rows per block (``_metrics.compare``), with exactly the values of ``metrics.py``'s numpy.

A sequence longer than one plugin's ``max_positions`` is compared over the positions both hold,
and the report says so.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.guard import checked_memory_bytes, plugin_calls, plugin_label
from pyllama.attention.registry import create_plugin
from pyllama.diff import metrics
from pyllama.diff._block import classify_block
from pyllama.diff._metrics import RowSoftmax, compare
from pyllama.diff.probes import Probe, ProbeSource, load_probe
from pyllama.diff.report import DiffReport, RecallRow, SegmentInfo
from pyllama.diff.retrieval_scores import diff_rows, greedy_decode
from pyllama.engine import Engine
from pyllama.errors import InputError, PluginError, PyllamaError

if TYPE_CHECKING:
    from pyllama.checkpoint.weights import Weights
    from pyllama.config import ModelConfig
    from pyllama.tokenizer.base import Tokenizer

BLOCK = 64  # positions per block, at most: side A holds block x vocab float64 exps
BLOCK_VALUES = 1 << 21  # so the block shrinks for large vocabularies (Qwen2's 151,936 -> 13 positions)
PROGRESS_MIN_POSITIONS = 2000  # show a progress bar (on a terminal) for probes at least this long


class _Side:
    """One engine with its block buffers. The engine skips its classifier; ``run`` applies it to the
    whole block afterwards (``classify_block``: the same arithmetic, weights read once per block),
    then the log-softmax of every row (``softmax``; ``keep_exps``: side A, whose probabilities KL
    weighs with).

    ``blocks``: the engine runs a block of positions at once (``Engine.forward_block``: the same bits
    as one ``forward`` per position; the ledger of each position comes from ``set_ledger``); False:
    one ``forward`` per position, asking ``memory_bytes()`` after each."""

    def __init__(
        self,
        label: str,
        engine: Engine,
        block: int,
        config: ModelConfig,
        weights: Weights,
        n_threads: int,
        blocks: bool = True,
        keep_exps: bool = True,
    ) -> None:
        self.label = label
        self.engine = engine
        self.classifier = weights.classifier
        self.n_threads = n_threads
        self.blocks = blocks
        self.hidden = np.zeros((block, config.dim), dtype=np.float32)
        self.logits = np.zeros((block, config.vocab_size), dtype=np.float32)
        self.att = np.zeros((block, config.n_layers, config.q_dim), dtype=np.float32)
        self.mem = np.zeros(block, dtype=np.int64)
        self.bad_layer = np.full(block, -1, dtype=np.int32)  # the engine's nonfinite_layer per position
        self.softmax = RowSoftmax(block, config.vocab_size, keep_exps)
        if blocks:
            engine.set_capture(self.att, self.hidden, logits=False)
            engine.set_ledger(self.mem)
        else:
            self.capture = np.zeros((config.n_layers, config.q_dim), dtype=np.float32)
            self.final = np.zeros(config.dim, dtype=np.float32)
            engine.set_capture(self.capture, self.final, logits=False)

    def run(self, tokens: np.ndarray, start: int, where: str) -> None:
        m = tokens.shape[0]
        self.at = f"position {start}" if m == 1 else f"positions {start}..{start + m - 1}"
        try:
            if self.blocks:
                self.engine.forward_block(np.ascontiguousarray(tokens, dtype=np.int32), start)
                self.bad_layer[:m] = self.engine.block_nonfinite_layers[:m]
            else:
                self._run_positions(tokens, start)
        except PyllamaError:
            raise
        except Exception as exc:  # the plugin's failure (its attend or memory_bytes), in one line
            raise PluginError(f"{self.label}: failed at {where} {self.at} ({type(exc).__name__}: {exc})") from exc
        classify_block(self.classifier, self.hidden[:m], self.logits, self.n_threads)
        self.softmax.compute(self.logits[:m], self.n_threads)  # here: the two sides run concurrently

    def _run_positions(self, tokens: np.ndarray, start: int) -> None:
        engine = self.engine
        attention = engine.attention
        for i in range(tokens.shape[0]):
            pos = start + i
            self.at = f"position {pos}"  # where a failure is reported (run's one wrapper)
            engine.forward(int(tokens[i]), pos)
            self.hidden[i] = self.final
            self.att[i] = self.capture
            self.bad_layer[i] = engine.nonfinite_layer
            self.mem[i] = checked_memory_bytes(attention, self.label)


def run_diff(
    config: ModelConfig,
    weights: Weights,
    a: str | Attention | None,
    b: str | Attention | None,
    probe: ProbeSource = "standard",
    *,
    tokenizer: Tokenizer | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    block: int = BLOCK,
    blocks: bool = True,
    name: str = "model",
    greedy: bool = True,
) -> DiffReport:
    """Teacher-force ``probe`` through plugins ``a`` and ``b`` on one set of weights: a DiffReport.

    ``tokenizer`` turns a probe's text into ids (not needed for token ids); ``threads``: the budget
    of both engines together (default 1); ``name``: the model, for the report. ``blocks=False`` runs
    one forward per position instead of blocks of ``block`` positions: the same report (timing
    aside), slower; for checking the block path. ``greedy``: on a retrieval probe, decode the greedy
    answer for real where a side's chain leaves the key (its prompt runs again; see
    :mod:`pyllama.diff.retrieval_scores`)."""
    t_start = time.perf_counter()
    block = max(1, min(block, BLOCK_VALUES // config.vocab_size))
    if isinstance(a, Attention) and a is b:
        raise InputError("diff needs two plugin instances (each owns its cache): pass two specs or two objects")
    pr = load_probe(probe, tokenizer, config.seq_len)
    _check_probe_ids(pr, config.vocab_size)
    total_threads = max(1, int(threads or 1))
    concurrent = total_threads >= 2
    per_engine = max(1, total_threads // 2) if concurrent else total_threads
    sides = []
    for spec in (a, b):
        label, plugin = plugin_label(spec), create_plugin(spec)
        with plugin_calls(label, "init"):
            engine = Engine(config, weights, plugin, per_engine, max_block=block)
        sides.append(_Side(label, engine, block, config, weights, per_engine, blocks, keep_exps=not sides))
    seg_infos, notes = _segment_infos(pr, sides)
    total = sum(s.compared for s in seg_infos)
    cols = _columns(total, config.n_layers)
    bar = _progress_bar(progress, total, sides)
    pool = ThreadPoolExecutor(max_workers=1) if concurrent else None
    try:
        offsets = _teacher_force(pr, seg_infos, sides, cols, pool, bar, total_threads)
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.shutdown()
        for side in sides:
            side.engine.set_capture()
            side.engine.set_ledger()
    retrieval = _retrieval_rows(pr, seg_infos, offsets, cols, sides, tokenizer, greedy)
    return DiffReport(
        a=sides[0].label,
        b=sides[1].label,
        model=name,
        probe=pr.name,
        n_layers=config.n_layers,
        kv_bytes_per_position=2 * config.n_layers * config.kv_dim * 4,
        segments=seg_infos,
        recall=_recall_rows(pr, seg_infos, offsets, cols),
        retrieval=retrieval,
        rank_a=cols.pop("rank_a"),
        rank_b=cols.pop("rank_b"),
        notes=notes,
        seconds=time.perf_counter() - t_start,
        threads=total_threads,
        **cols,
    )


def _progress_bar(progress: bool | None, total: int, sides: list[_Side]):
    """A tqdm bar over the positions (None: none); ``progress`` None: only for long probes, on a terminal."""
    if not (progress if progress is not None else total >= PROGRESS_MIN_POSITIONS):
        return None
    from tqdm.auto import tqdm

    desc = f"diff {sides[0].label} vs {sides[1].label}"
    return tqdm(total=total, unit="pos", desc=desc, leave=False, disable=None if progress is None else False)


def _retrieval_rows(pr, seg_infos, offsets, cols, sides, tokenizer, greedy: bool) -> list:
    """The retrieval probe rows of the report; ``greedy``: decode each side's answer where needed."""
    decoders = [None, None]
    if greedy:
        decoders = [
            lambda seg, e=side.engine: greedy_decode(e, seg.tokens[: seg.target.prompt], seg.target.length)
            for side in sides
        ]
    return diff_rows(pr, [s.compared for s in seg_infos], offsets, cols, decoders, tokenizer)


def _check_probe_ids(pr: Probe, vocab_size: int) -> None:
    for seg in pr.segments:
        bad = (seg.tokens < 0) | (seg.tokens >= vocab_size)
        if bad.any():
            raise InputError(
                f"probe {pr.name}, {seg.name}: token id {int(seg.tokens[bad][0])} is outside the "
                f"model's vocabulary of {vocab_size}: wrong tokenizer?"
            )


def _segment_infos(pr: Probe, sides: list[_Side]) -> tuple[list[SegmentInfo], list[str]]:
    """Each segment is compared over the positions both plugins hold; the notes say where that is shorter."""
    held = [(side.label, side.engine.max_positions) for side in sides]
    notes: list[str] = []
    infos: list[SegmentInfo] = []
    for seg in pr.segments:
        n = min(len(seg), *(m for _, m in held))
        note = seg.note
        if n < len(seg):
            holders = [f"{lab} holds {m:,}" for lab, m in held if m < len(seg)]
            cover = f"compared positions 0..{n - 1} of {len(seg):,} ({', '.join(holders)})"
            notes.append(f"{seg.name}: {cover}")
            note = f"{note}; {cover}" if note else cover
        infos.append(SegmentInfo(seg.name, seg.kind, len(seg), n, note))
    return infos, notes


def _columns(total: int, n_layers: int) -> dict[str, np.ndarray]:
    """The report's per-position columns, for ``total`` positions."""
    return {
        "segment": np.zeros(total, dtype=np.int32),
        "position": np.zeros(total, dtype=np.int64),
        "token": np.zeros(total, dtype=np.int32),
        "next_token": np.zeros(total, dtype=np.int32),
        "max_abs_dlogit": np.zeros(total),
        "kl": np.zeros(total),
        "top1_a": np.zeros(total, dtype=np.int32),
        "top1_b": np.zeros(total, dtype=np.int32),
        "logp_a": np.zeros(total),
        "logp_b": np.zeros(total),
        "rank_a": np.zeros(total, dtype=np.int64),
        "rank_b": np.zeros(total, dtype=np.int64),
        "layer_err": np.zeros((total, n_layers)),
        "mem_a": np.zeros(total, dtype=np.int64),
        "mem_b": np.zeros(total, dtype=np.int64),
        "nonfinite_a": np.full(total, -1, dtype=np.int32),
        "nonfinite_b": np.full(total, -1, dtype=np.int32),
    }


def _teacher_force(pr, seg_infos, sides, cols, pool, bar, n_threads: int) -> list[int]:
    """Every segment through both sides, block by block, into ``cols``; the first row of each segment."""
    side_a, side_b = sides
    block = side_a.mem.shape[0]
    row = 0
    offsets = []
    for si, (seg, info) in enumerate(zip(pr.segments, seg_infos, strict=True)):
        offsets.append(row)
        side_a.engine.reset()
        side_b.engine.reset()
        for c0 in range(0, info.compared, block):
            c1 = min(info.compared, c0 + block)
            m = c1 - c0
            toks = seg.tokens[c0:c1]
            where = f"{pr.name}/{seg.name}"
            if pool is not None:
                fut = pool.submit(side_b.run, toks, c0, where)
                side_a.run(toks, c0, where)
                fut.result()
            else:
                side_a.run(toks, c0, where)
                side_b.run(toks, c0, where)
            nxt = np.full(m, -1, dtype=np.int32)
            avail = min(c1 + 1, len(seg)) - (c0 + 1)
            nxt[:avail] = seg.tokens[c0 + 1 : c0 + 1 + avail]
            r = slice(row, row + m)
            cols["segment"][r] = si
            cols["position"][r] = np.arange(c0, c1)
            cols["token"][r] = toks
            cols["next_token"][r] = nxt
            _compare(cols, r, side_a, side_b, nxt, n_threads)
            row += m
            if bar is not None:
                bar.update(m)
    return offsets


def _compare(cols: dict[str, np.ndarray], r: slice, side_a: _Side, side_b: _Side, nxt: np.ndarray, n_threads) -> None:
    """The metrics of one block of positions (rows ``r``), from both sides' buffers: what
    metrics.max_abs_diff, kl_divergence, top1, teacher_logprob and teacher_rank give, in one pass."""
    m = r.stop - r.start
    n_layers = cols["layer_err"].shape[1]
    sa, sb = side_a.softmax, side_b.softmax
    outs = [cols[k][r] for k in ("max_abs_dlogit", "kl", "logp_a", "logp_b", "rank_a", "rank_b")]
    compare(sa, sb, side_a.logits[:m], side_b.logits[:m], nxt, *outs, n_threads=n_threads)
    cols["top1_a"][r] = sa.top1[:m]
    cols["top1_b"][r] = sb.top1[:m]
    cols["layer_err"][r] = metrics.relative_l2(side_a.att[:m], side_b.att[:m])
    cols["mem_a"][r] = side_a.mem[:m]
    cols["mem_b"][r] = side_b.mem[:m]
    cols["nonfinite_a"][r] = metrics.nonfinite_layer(side_a.bad_layer[:m], sa.finite[:m], n_layers)
    cols["nonfinite_b"][r] = metrics.nonfinite_layer(side_b.bad_layer[:m], sb.finite[:m], n_layers)


def _recall_rows(
    pr: Probe, infos: list[SegmentInfo], offsets: list[int], cols: dict[str, np.ndarray]
) -> list[RecallRow]:
    """P(name) at each mention: the teacher log-probabilities of the name's tokens, summed."""
    out = []
    for seg, info, off in zip(pr.segments, infos, offsets, strict=True):
        prev = None
        for k, mark in enumerate(seg.marks):
            first_row = mark.start - 1  # the row whose teacher token is the name's first token
            last_row = mark.start + mark.length - 2
            if first_row < 0 or last_row >= info.compared:
                prev = mark.start
                continue
            rows = slice(off + first_row, off + last_row + 1)
            out.append(
                RecallRow(
                    segment=seg.name,
                    name=mark.label,
                    mention=k,
                    position=mark.start,
                    distance=mark.start - prev if prev is not None else 0,
                    logp_a=float(cols["logp_a"][rows].sum()),
                    logp_b=float(cols["logp_b"][rows].sum()),
                )
            )
            prev = mark.start
    return out
