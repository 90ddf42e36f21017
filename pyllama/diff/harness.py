"""Teacher forcing through two plugins that share one set of weights.

Both engines see the same tokens at the same positions: every sequence of the probe is fed from
position 0 after a reset, in blocks of positions (``Engine.forward_block``: each weight read once
per block, the same bits as one pass per position). An observer of each engine
(``_capture.DiffCapture``) copies its per-layer attention output, its final hidden state and the
plugin's ledger after each position into buffers of one row per position, and the engine skips its
classifier: the logits of a block of positions are computed afterwards by ``classify_block``, the
same per-element arithmetic with the classifier read once per block (bit-identical to
``Engine.forward``'s logits; the tests check it). With two or more threads the two engines run a block
concurrently (from DIFF_THREADS_FROM multiply-adds per position; below it a diff runs on one thread),
half the thread budget each (a native plugin's forward releases the GIL; a Python plugin holds it only
inside its ``attend``). Each side reduces its block of logits to its log-softmax's per-row constants
(one exp per logit, ``_metrics.RowSoftmax``); the comparison metrics then take one compiled pass over
both sides' rows per block (``_metrics.compare``), with exactly the values of ``metrics.py``'s numpy.

A sequence longer than one plugin's ``max_positions`` is compared over the positions both hold,
and the report says so.

Each side's spec is resolved once, on entry (``registry.resolve_attention``): the resolved spec
builds the plugin, names the side in the report (its canonical form) and keys its record.
Side A, the reference, is recorded on disk when it is a built-in plugin of a model file, and a
later diff with the same model file, canonical spec and probe replays it instead of running it
(:mod:`pyllama.diff.side_cache`, :class:`pyllama.diff.sides.ReplaySide`): the same report, one
forward per position instead of two, and the live side takes the whole thread budget.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.guard import plugin_calls, plugin_label
from pyllama.attention.registry import create_plugin, resolve_attention
from pyllama.attention.spec import PluginSpec
from pyllama.diff import metrics
from pyllama.diff._metrics import compare
from pyllama.diff.probes import Probe, ProbeSource, load_probe
from pyllama.diff.report import DiffReport, RecallRow, SegmentInfo
from pyllama.diff.retrieval_scores import diff_rows
from pyllama.diff.side_cache import RecordWriter, SideCache, model_fingerprint, probe_fingerprint, recorded_spec
from pyllama.diff.sides import LiveSide, ReplaySide
from pyllama.engine import Engine
from pyllama.errors import InputError
from pyllama.options import check_compress_at, compress_position
from pyllama.outputs import diff_inputs

if TYPE_CHECKING:
    from pyllama.checkpoint.weights import Weights
    from pyllama.config import ModelConfig
    from pyllama.tokenizer.base import Tokenizer

BLOCK = 128  # positions per block, at most: side A holds block x vocab float64 exps
BLOCK_VALUES = 1 << 22  # so the block shrinks for large vocabularies (Qwen2's 151,936 -> 27 positions)
PROGRESS_MIN_POSITIONS = 2000  # show a progress bar (on a terminal) for probes at least this long


def run_diff(
    config: ModelConfig,
    weights: Weights,
    a: str | PluginSpec | Attention | None,
    b: str | PluginSpec | Attention | None,
    probe: ProbeSource = "standard",
    *,
    tokenizer: Tokenizer | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    block: int = BLOCK,
    blocks: bool = True,
    name: str = "model",
    greedy: bool = True,
    cache: bool | str | os.PathLike | SideCache | None = False,
    model_file: str | os.PathLike | None = None,
    compress_at: int | str | None = "context",
) -> DiffReport:
    """Teacher-force ``probe`` through plugins ``a`` and ``b`` on one set of weights: a DiffReport.

    ``a``, ``b``: spec strings (resolved here, once), PluginSpecs (``resolve_spec``, used as they
    are) or Attention instances; the report names each by its canonical spec. ``tokenizer`` turns
    a probe's text into ids (not needed for token ids); ``threads``: the budget of both engines
    together (default 1); ``name``: the model, for the report. ``blocks=False`` runs one forward per
    position instead of blocks of ``block`` positions: the same report (timing aside), slower.
    ``greedy``: on a retrieval probe, decode the greedy answer for real where a side's chain leaves
    the key (its prompt runs again; see :mod:`pyllama.diff.retrieval_scores`). ``compress_at``: the
    plugins' compression event (``Attention.compress``) after each sequence's context ("context": a
    retrieval probe's haystack, before its question; none for probes without one), after a position,
    or never ("none"); a block ends there, and the ledger row of that position is taken after it.

    ``cache`` with ``model_file`` (the file ``weights`` were read from): replay a side whose
    recorded run exists, and record side A when it is a built-in plugin (:mod:`pyllama.diff.side_cache`;
    True: the default folder, a path: that folder, False: neither). The report is the same, bit
    for bit; ``report.replayed`` names the sides that were replayed."""
    t_start = time.perf_counter()
    block = max(1, min(block, BLOCK_VALUES // config.vocab_size))
    if isinstance(a, Attention) and a is b:
        raise InputError("diff needs two plugin instances (each owns its cache): pass two specs or two objects")
    a, b = resolve_attention(a), resolve_attention(b)
    where = check_compress_at(compress_at)
    pr = load_probe(probe, tokenizer, config.seq_len)
    _check_probe_ids(pr, config.vocab_size)
    events = [compress_position(where, seg.context_end) for seg in pr.segments]
    total_threads = max(1, int(threads or 1)) if config.position_work >= DIFF_THREADS_FROM else 1
    store = SideCache.from_option(cache) if model_file is not None else None
    keys = _record_keys(store, model_file, config, pr, events, a, b)
    sides, concurrent = _make_sides(store, keys, pr, config, weights, (a, b), block, blocks, total_threads)
    seg_infos, notes = _segment_infos(pr, sides, events)
    recording = _start_recording(store, keys[0], sides[0], pr, seg_infos, config)
    cols = _columns(sum(s.compared for s in seg_infos), config.n_layers)
    offsets = _run_recorded(pr, seg_infos, sides, cols, progress, concurrent, total_threads, store, recording, keys[0])
    retrieval = _retrieval_rows(pr, seg_infos, offsets, cols, sides, tokenizer, greedy)
    return DiffReport(
        a=sides[0].label,
        b=sides[1].label,
        model=name,
        probe=pr.name,
        n_layers=config.n_layers,
        kv_bytes_per_position=2 * config.n_layers * config.kv_dim * 4,
        layer_windows=tuple(int(w) for w in config.layer_windows) if any(config.layer_windows) else (),
        segments=seg_infos,
        recall=_recall_rows(pr, seg_infos, offsets, cols),
        retrieval=retrieval,
        rank_a=cols.pop("rank_a"),
        rank_b=cols.pop("rank_b"),
        notes=notes,
        replayed=[s for s, side in zip("AB", sides, strict=True) if side.replayed],
        seconds=time.perf_counter() - t_start,
        threads=total_threads,
        inputs=diff_inputs(model_file, tokenizer, probe, a, b),
        **cols,
    )


def _run_recorded(pr, seg_infos, sides, cols, progress, concurrent, total_threads, store, recording, key) -> list[int]:
    """``_teacher_force`` with its progress bar and thread pool, finishing side A's record when one
    is being made (discarding it if the run fails); the first row of each segment."""
    bar = _progress_bar(progress, len(cols["segment"]), sides)
    pool = ThreadPoolExecutor(max_workers=1) if concurrent else None
    try:
        offsets = _teacher_force(pr, seg_infos, sides, cols, pool, bar, total_threads)
    except BaseException:
        if recording is not None:
            store.discard(recording)
        raise
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.shutdown()
        for side in sides:
            side.release()
    if recording is not None:
        sides[0].recording = None
        store.finish(recording, key)
    return offsets


# A diff uses its threads only from this many multiply-adds per position. Below it (stories260K, 0.26M;
# the stories15M shape has 15M) a side's block is shorter than handing it to a second Python thread
# (a diff of 128 positions: 22.6 ms on one thread, 25.2 ms as two concurrent sides, idle), and a team
# for its classifier and metrics, outside any engine's thread controller, stalls beside a busy core
# (139 ms against 27 ms on one thread, two sides in turn on two threads).
DIFF_THREADS_FROM = 1 << 20


def _make_sides(store, keys, pr, config, weights, specs, block, blocks, total_threads):
    """``(sides, concurrent)``: each side replayed from its record or run live. Two live sides run a
    block concurrently with half the threads each (from 2 threads); one live side takes them all."""
    shape = (config.n_layers, config.q_dim)
    records = [store.open(k, _rows_of(pr), config.vocab_size, shape) if k else None for k in keys]
    concurrent = total_threads >= 2 and records == [None, None]
    per_engine = max(1, total_threads // 2) if concurrent else total_threads
    sides: list[LiveSide | ReplaySide] = []
    for spec, record in zip(specs, records, strict=True):
        label = plugin_label(spec)
        if record is not None:
            sides.append(ReplaySide(label, spec, record, block, config, weights, per_engine, keep_exps=not sides))
            continue
        plugin = create_plugin(spec)
        with plugin_calls(label, "init"):
            engine = Engine(config, weights, plugin, per_engine, max_block=block)
        sides.append(LiveSide(label, engine, block, config, weights, per_engine, blocks, keep_exps=not sides))
    return sides, concurrent


def _rows_of(pr: Probe):
    """The rows per sequence that a side holding ``max_positions`` positions records."""
    return lambda max_positions: [min(len(seg), max_positions) for seg in pr.segments]


def _record_keys(store: SideCache | None, model_file, config: ModelConfig, pr: Probe, events, a, b) -> list[str | None]:
    """Each side's record key, on the canonical spec its report shows and the probe's tokens and
    compression events: None when there is no cache, no model file or not a built-in plugin."""
    model = model_fingerprint(model_file) if store is not None else None
    if model is None:
        return [None, None]
    probe = probe_fingerprint([seg.tokens for seg in pr.segments], events)
    specs = [recorded_spec(side) for side in (a, b)]
    return [SideCache.key(model, spec, repr(config), probe) if spec else None for spec in specs]


def _start_recording(
    store: SideCache | None, key: str | None, side, pr: Probe, infos: list[SegmentInfo], config: ModelConfig
) -> RecordWriter | None:
    """Side A records its run when it is live, has a key, and every sequence is compared over all
    the positions it holds (a record holds each sequence up to the plugin's own limit)."""
    if store is None or key is None or side.replayed:
        return None
    held = _rows_of(pr)(side.max_positions)
    if any(info.compared != n for info, n in zip(infos, held, strict=True)):
        return None
    writer = store.start(held, side.max_positions, config.vocab_size, (config.n_layers, config.q_dim))
    side.recording = writer
    return writer


def _progress_bar(progress: bool | None, total: int, sides: list[LiveSide | ReplaySide]):
    """A tqdm bar over the positions (None: none); ``progress`` None: only for long probes, on a terminal."""
    if not (progress if progress is not None else total >= PROGRESS_MIN_POSITIONS):
        return None
    from tqdm.auto import tqdm  # lazy: tqdm only when a bar is shown

    desc = f"diff {sides[0].label} vs {sides[1].label}"
    return tqdm(total=total, unit="pos", desc=desc, leave=False, disable=None if progress is None else False)


def _retrieval_rows(pr, seg_infos, offsets, cols, sides, tokenizer, greedy: bool) -> list:
    """The retrieval probe rows of the report; ``greedy``: decode each side's answer where needed,
    its prompt run with the sequence's compression event, as teacher forcing ran it."""
    decoders: list = [None, None]
    if greedy:
        events = {id(seg): info.event for seg, info in zip(pr.segments, seg_infos, strict=True)}
        decoders = [lambda seg, side=side: side.greedy(seg, events[id(seg)]) for side in sides]
    return diff_rows(pr, [s.compared for s in seg_infos], offsets, cols, decoders, tokenizer)


def _check_probe_ids(pr: Probe, vocab_size: int) -> None:
    for seg in pr.segments:
        bad = (seg.tokens < 0) | (seg.tokens >= vocab_size)
        if bad.any():
            raise InputError(
                f"probe {pr.name}, {seg.name}: token id {int(seg.tokens[bad][0])} is outside the "
                f"model's vocabulary of {vocab_size}: wrong tokenizer?"
            )


def _segment_infos(pr: Probe, sides: list[LiveSide | ReplaySide], events) -> tuple[list[SegmentInfo], list[str]]:
    """Each segment is compared over the positions both plugins hold; the notes say where that is
    shorter, and when a plugin that acts at the compression event never sees one."""
    held = [(side.label, side.max_positions) for side in sides]
    notes: list[str] = []
    infos: list[SegmentInfo] = []
    for seg, event in zip(pr.segments, events, strict=True):
        n = min(len(seg), *(m for _, m in held))
        note = seg.note
        if n < len(seg):
            holders = [f"{lab} holds {m:,}" for lab, m in held if m < len(seg)]
            cover = f"compared positions 0..{n - 1} of {len(seg):,} ({', '.join(holders)})"
            notes.append(f"{seg.name}: {cover}")
            note = f"{note}; {cover}" if note else cover
        event = event if event < n - 1 else -1  # after the last compared position: no event
        if event >= 0:
            at = f"compression event after position {event}"
            note = f"{note}; {at}" if note else at
        infos.append(SegmentInfo(seg.name, seg.kind, len(seg), n, note, event))
    for side in sides:
        if side.compresses_at_event and all(info.event < 0 for info in infos):
            notes.append(
                f"{side.label} compresses at the compression event, and no sequence of this probe had one "
                "(--compress-at POS, or a probe with a context such as passkey): it ran as causal"
            )
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
    block = side_a.block
    row = 0
    offsets = []
    for si, (seg, info) in enumerate(zip(pr.segments, seg_infos, strict=True)):
        offsets.append(row)
        side_a.reset()
        side_b.reset()
        c0 = 0
        while c0 < info.compared:
            c1 = min(info.compared, c0 + block)
            if c0 <= info.event < c1:
                c1 = info.event + 1  # the block ends at the compression event
            m, event = c1 - c0, c1 - 1 == info.event
            toks = seg.tokens[c0:c1]
            where = f"{pr.name}/{seg.name}"
            if pool is not None:
                fut = pool.submit(side_b.run, toks, c0, where, si, event)
                side_a.run(toks, c0, where, si, event)
                fut.result()
            else:
                side_a.run(toks, c0, where, si, event)
                side_b.run(toks, c0, where, si, event)
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
            c0 = c1
            if bar is not None:
                bar.update(m)
    return offsets


def _compare(
    cols: dict[str, np.ndarray],
    r: slice,
    side_a: LiveSide | ReplaySide,
    side_b: LiveSide | ReplaySide,
    nxt: np.ndarray,
    n_threads: int,
) -> None:
    """The metrics of one block of positions (rows ``r``), from both sides' buffers: what
    metrics.max_abs_diff, kl_divergence, top1, teacher_logprob and teacher_rank give, in one pass."""
    m = r.stop - r.start
    n_layers = cols["layer_err"].shape[1]
    sa, sb = side_a.softmax, side_b.softmax
    max_abs, kl, logp_a, logp_b, rank_a, rank_b = (
        cols[k][r] for k in ("max_abs_dlogit", "kl", "logp_a", "logp_b", "rank_a", "rank_b")
    )
    la, lb = side_a.logits[:m], side_b.logits[:m]
    compare(sa, sb, la, lb, nxt, max_abs, kl, logp_a, logp_b, rank_a, rank_b, n_threads=n_threads)
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
