"""Compress once, branch many: a branch from a recorded context gives the bits of the run from position 0.

The reference is the method's own run from position 0 (every position through the engine, the
compression event after the context), and for greedy answers also ``Model.generate`` with the event
(the engine's own token loop, another path). A branch starts at the context's end in one of the
ways of ``pyllama.leaderboard.starts`` and runs only the question and the answer, or after its
exact prefix and runs the rest of the context too; compared
are the final hidden states of every position after the context (so every logit), the ledger after
the event and at the end, the positions held by every layer, and the greedy answer.

The event methods are every registered plugin whose class has ``compresses_at_event`` and
``start_from`` (the methods on ``attention/event.pyx``), at every ratio of the default board, with
two variants (AdaKV over Expected Attention, KeyDiff compressing again every 8 positions). The replay
is checked on ``causal``, on ``quest`` (dense until the event, so a recorded context replays into its
pages) and on KNorm with its ``start_from`` hidden. The prefix start is checked on sliding, sink
(with and without shift) and kmeans (with and without estimates) at every ratio, built from the
record and replayed, and one position past the prefix is shown to be wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gemma3_file, shared_file
from numpy_reference import NumpyLlama

from pyllama.attention.registry import create_plugin, plugin_infos, register
from pyllama.diff.branch import answer_positions, decode_answer, teacher_force_rows
from pyllama.diff.probes import load_probe
from pyllama.diff.probes.ruler_metrics import postprocess
from pyllama.diff.retrieval_scores import score_sequence
from pyllama.errors import PositionError
from pyllama.leaderboard.board import DEFAULT_RATIOS
from pyllama.leaderboard.methods import kept_positions, method_spec
from pyllama.leaderboard.record import ContextRecord, record_bytes
from pyllama.leaderboard.starts import FromRecord, Prefilled, ReplayAttention, branch_way, start_for
from pyllama.leaderboard.unit import Branch, Unit, run_unit, sized_plugin
from pyllama.model import Model
from pyllama.plugins.knorm import KNorm
from pyllama.sweep.plan import file_sha256

RATIOS = tuple(r for r in DEFAULT_RATIOS if r > 0)
STORIES_PROBE = "ruler:task=niah_single_1,length=400,seed=3"
SMOLLM2_PROBE = "ruler:task=niah_multikey_1,length=320,seed=1"
GEMMA3_PROBE = "ruler:task=niah_single_1,length=640,seed=2"


class KNormWithoutStart(KNorm):
    """KNorm without ``start_from``: a method that compresses at the event and can only be replayed."""

    name = "test-knorm-replay"
    start_from = None


register(KNormWithoutStart, replace=True)

EVENT_METHODS = sorted(
    info.name
    for info in plugin_infos(include_errors=False)
    if getattr(info.cls, "compresses_at_event", False) is True and callable(getattr(info.cls, "start_from", None))
)
EVENT_SPECS = [*EVENT_METHODS, "adakv:scorer=expected", "keydiff:every=8"]
assert {"snapkv", "pyramidkv", "adakv", "knorm", "keydiff", "expected", "random"} <= set(EVENT_METHODS)


@pytest.fixture(scope="module")
def stories(stories260k, tok512):
    return Model.load(stories260k, tokenizer=tok512, threads=1)


@pytest.fixture(scope="module")
def sample(stories):
    (seg,) = load_probe(STORIES_PROBE, stories.tokenizer, stories.config.seq_len).segments
    context = seg.context_end + 1
    causal = stories.engine("causal", threads=1)
    return seg, ContextRecord.run(causal, seg.tokens[:context]), causal


def _run(model, spec: str, seg, start, event: int):
    """Every position after the context, its hidden state (so its logits), the ledgers, what each
    layer holds at the end, and the greedy answer: from position 0 (``start`` None) or from ``start``."""
    engine = model.engine(spec, threads=1)
    rows = np.arange(event + 1, len(seg))
    kept = teacher_force_rows(engine, seg, rows, spec, event, start)
    held = [
        [h.tolist() for h in engine.attention.held_positions(layer) or []] for layer in range(model.config.n_layers)
    ]
    return kept, held, decode_answer(engine, seg, event, start)


def _assert_same(model, spec: str, seg, start, event: int):
    whole, held_w, greedy_w = _run(model, spec, seg, None, event)
    branch, held_b, greedy_b = _run(model, spec, seg, start, event)
    np.testing.assert_array_equal(branch.hidden, whole.hidden, err_msg=spec)
    assert (branch.event_bytes, branch.last_bytes) == (whole.event_bytes, whole.last_bytes), spec
    assert held_b == held_w, spec
    assert greedy_b == greedy_w, spec
    assert branch.positions == len(seg) - event - 1 and whole.positions == len(seg)
    return whole, greedy_w


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("method", EVENT_SPECS)
def test_an_event_method_branched_from_the_record_is_its_run_from_position_0(stories, sample, method, ratio):
    seg, record, _ = sample
    spec = method_spec(method, ratio, record.positions)
    assert branch_way(create_plugin(spec)) == "record"
    whole, greedy = _assert_same(stories, spec, seg, FromRecord(record), record.positions - 1)
    assert whole.event_bytes < record.causal_bytes  # it compressed at the event
    t = seg.target
    gen = stories.generate(
        seg.tokens[: t.prompt].tolist(),
        steps=t.prompt + t.generate,
        attention=spec,
        compress_at=record.positions - 1,
        threads=1,
    )
    assert gen.ids[: len(greedy)] == greedy  # the engine's own token loop decodes the same answer


@pytest.mark.parametrize("method", ["causal", "quest", KNormWithoutStart.name])
def test_a_method_whose_attention_is_replayed_over_the_record_is_its_run_from_position_0(stories, sample, method):
    seg, record, _ = sample
    spec = method_spec(method, 0.0 if method == "causal" else 0.5, record.positions)
    if method != "causal":
        assert branch_way(create_plugin(spec)) == "replay"
    _assert_same(stories, spec, seg, ReplayAttention(record), record.positions - 1)


def test_a_method_that_evicts_from_position_0_is_not_branched(stories, sample):
    """h2o with a ratio evicts from its fourth position on, so it computes other keys than causal
    from there: replaying causal's record would not give its run (checked), so it runs whole."""
    seg, record, _ = sample
    spec = method_spec("h2o", 0.5, record.positions)
    plugin = create_plugin(spec)
    assert branch_way(plugin) == "whole" and plugin.exact_prefix == 0
    whole, _, _ = _run(stories, spec, seg, None, record.positions - 1)
    replayed, _, _ = _run(stories, spec, seg, ReplayAttention(record), record.positions - 1)
    assert not np.array_equal(whole.hidden, replayed.hidden)


PREFIX_SPECS = ["sliding", "sink", "sink:shift=true", "kmeans", "kmeans:estimate=true"]


def _assert_prefix_start(model, spec: str, seg, record: ContextRecord, replay: bool = False) -> int:
    """A branch of ``spec`` started after its ``exact_prefix`` from the record (its ``start_from``, or
    its calls replayed) against its run from position 0; returns the prefix."""
    plugin = model.engine(spec, threads=1).attention
    assert branch_way(plugin) == "prefix", spec
    prefix = int(plugin.exact_prefix)
    assert 0 < prefix < record.positions, spec  # it departs from causal before the event
    start = ReplayAttention(record, prefix) if replay else start_for("prefix", record, plugin)
    assert isinstance(start, ReplayAttention if replay else FromRecord) and start.position == prefix
    event = record.positions - 1
    whole, held_w, greedy_w = _run(model, spec, seg, None, event)
    rows = np.arange(event + 1, len(seg))
    engine = model.engine(spec, threads=1)
    branch = teacher_force_rows(engine, seg, rows, spec, event, start)
    held_b = [
        [h.tolist() for h in engine.attention.held_positions(layer) or []] for layer in range(model.config.n_layers)
    ]
    np.testing.assert_array_equal(branch.hidden, whole.hidden, err_msg=spec)
    assert (branch.event_bytes, branch.last_bytes) == (whole.event_bytes, whole.last_bytes), spec
    assert held_b == held_w, spec
    assert decode_answer(engine, seg, event, start) == greedy_w, spec
    assert branch.positions == len(seg) - prefix and whole.positions == len(seg)
    return prefix


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("method", PREFIX_SPECS)
def test_a_method_that_departs_before_the_event_starts_after_its_exact_prefix(stories, sample, method, ratio):
    """sliding, sink and kmeans attend their first positions as causal does (sliding:N its N, sink its
    sinks and window, kmeans those and its budget): built from the record there, the model run from
    there on (the event included), they give the bits of their run from position 0."""
    seg, record, _ = sample
    spec = method_spec(method, ratio, record.positions)
    prefix = _assert_prefix_start(stories, spec, seg, record)
    kept = kept_positions(ratio, record.positions)  # the positions it keeps: kmeans at least its sinks and window
    assert prefix == kept if not method.startswith("kmeans") else prefix == max(kept, 68), (prefix, kept)


@pytest.mark.parametrize("method", ["sliding", "kmeans"])
def test_a_prefix_replayed_is_the_prefix_built_from_the_record(stories, sample, method):
    """The other way to the same state: the plugin's calls over its prefix made again from the record."""
    seg, record, _ = sample
    _assert_prefix_start(stories, method_spec(method, 0.5, record.positions), seg, record, replay=True)


@pytest.mark.parametrize("method", ["sliding", "sink"])
def test_the_exact_prefix_is_the_last_position_a_record_can_give(stories, sample, method):
    """One position more than ``exact_prefix`` is refused by ``start_from``, and replayed it gives
    other bits than the run from position 0: the position where the method departs from causal."""
    seg, record, _ = sample
    spec = method_spec(method, 0.5, record.positions)
    engine = stories.engine(spec, threads=1)
    prefix = int(engine.attention.exact_prefix)
    with pytest.raises(PositionError, match="exact_prefix"):
        FromRecord(record, prefix + 1).enter(engine)
    event = record.positions - 1
    rows = np.arange(event + 1, len(seg))
    whole, _, _ = _run(stories, spec, seg, None, event)
    late_start = ReplayAttention(record, prefix + 1)
    late = teacher_force_rows(stories.engine(spec, threads=1), seg, rows, spec, event, late_start)
    assert not np.array_equal(late.hidden, whole.hidden)


def test_start_from_refuses_a_memory_without_an_exact_prefix(stories, sample):
    """lattice keeps its window's rows but summarises what leaves it: it declares no exact prefix, so
    the window's ``start_from`` takes no position from a record."""
    _, record, _ = sample
    engine = stories.engine("lattice", threads=1)
    assert engine.attention.exact_prefix == 0 and branch_way(engine.attention) == "whole"
    with pytest.raises(PositionError, match="only its first 0"):
        engine.attention.start_from(0, record.keys[0, :1], record.values[0, :1])


# the record against the float64 numpy forward: float32 rounding through five layers (see
# test_engine_reference.py's REL_TOL, the same bound for the logits), relative to the largest value
RECORD_REL_TOL = 2e-5


def test_the_record_holds_causal_s_rows_and_is_the_size_it_says(stories, sample, stories260k):
    """Each layer's keys and values are those of an independent numpy forward of the context's
    first positions, the queries are their pre-RoPE queries rotated, and the size is as stated."""
    seg, record, _ = sample
    config = stories.config
    T = record.positions
    assert record.nbytes == record_bytes(config, T) == 4 * T * config.n_layers * 2 * (config.q_dim + config.kv_dim)
    assert record.causal_bytes == 2 * T * config.n_layers * config.kv_dim * 4  # causal's ledger after T positions
    ref = NumpyLlama(stories260k)
    n = 48
    for pos in range(n):
        ref.forward(int(seg.tokens[pos]), pos)
    for layer in range(config.n_layers):
        for got, want in ((record.keys, ref.k_cache), (record.values, ref.v_cache)):
            want = np.stack(want[layer]).reshape(n, -1)
            assert np.abs(got[layer, :n] - want).max() <= RECORD_REL_TOL * np.abs(want).max()
        rotated = np.stack([ref.rope(record.queries_pre_rope[layer, p].astype(np.float64), p) for p in range(T)])
        assert np.abs(record.queries[layer] - rotated).max() <= RECORD_REL_TOL * np.abs(rotated).max()
    assert not np.array_equal(record.queries, record.queries_pre_rope)


def test_the_prefilled_causal_branch_is_causal_from_position_0_twice(stories, sample):
    """The engine that ran the context serves causal's first branch as it is (the teacher-forced
    answer), and the greedy answer comes from its snapshot: both are causal's run from position 0."""
    seg, record, _ = sample
    causal = stories.engine("causal", threads=1)
    fresh = ContextRecord.run(causal, seg.tokens[: record.positions])
    assert fresh.causal_bytes == record.causal_bytes
    start = Prefilled(causal, ReplayAttention(fresh))
    branched = score_sequence(causal, seg, stories.tokenizer, "causal", record.positions - 1, start)
    whole = score_sequence(stories.engine("causal", threads=1), seg, stories.tokenizer, "causal", record.positions - 1)
    assert branched.score == whole.score and branched.last_bytes == whole.last_bytes
    assert start.engine is None  # used up by the first run


@pytest.mark.parametrize(
    "length, methods, ways",
    [
        (
            400,
            [("snapkv", 0.5), ("expected", 0.9), ("sink", 0.5), ("sliding", 0.9)],
            ["record", "record", "prefix", "prefix"],
        ),
        # its greedy answer runs 120 tokens past the sequence's end: the unit's plugins must hold them
        (300, [("h2o", 0.5), ("snapkv", 0.75)], ["whole", "record"]),
    ],
)
def test_a_unit_s_rows_are_the_scores_of_each_method_run_from_position_0(
    stories, stories260k, tok512, length, methods, ways
):
    """run_unit (the context once, every branch from it, its plugins sized to the sample) against
    score_sequence of each spec from position 0 (plugins sized to the model's context)."""
    (seg,) = load_probe(f"ruler:task=niah_single_1,length={length},seed=3", stories.tokenizer, 512).segments
    context = seg.context_end + 1
    path = str(stories260k.resolve())
    branches = tuple(Branch(f"k{i}", m, r) for i, (m, r) in enumerate([("causal", 0.0), *methods]))
    unit = Unit("u", path, file_sha256(path), str(tok512.resolve()), "niah_single_1", length, 3, branches)
    rows = {r["method"]: r for r in run_unit(unit, threads=1)}
    assert [rows[m]["way"] for m, _ in [("causal", 0), *methods]] == ["context", *ways]
    for method, ratio in [("causal", 0.0), *methods]:
        row = rows[method]
        assert row["error"] is None, row["error"]
        spec = method_spec(method, ratio, context)
        engine = stories.engine(spec, threads=1)
        whole = score_sequence(engine, seg, stories.tokenizer, spec, context - 1)
        s = whole.score
        assert row["spec"] == spec
        assert (row["logp"], row["max_rank"], row["greedy"]) == (s.logp, s.max_rank, s.greedy), method
        assert row["score"] == 100.0 * s.match_all and row["event_bytes"] == whole.event_bytes
        if method == "causal":
            causal_bytes = whole.event_bytes  # causal's ledger after the context and its event
        assert row["bytes_removed"] == 1 - whole.event_bytes / causal_bytes
        assert row["context"] == context and row["causal_bytes"] == causal_bytes
    if length == 300:
        greedy = decode_answer(stories.engine("causal", threads=1), seg)
        assert seg.target.prompt + len(greedy) > len(seg) + 100
        assert answer_positions(seg) == seg.target.prompt + len(greedy)


def test_a_unit_sizes_its_plugins_to_the_sample(stories):
    """The unit's plugins hold the sample's positions, not the model's 512 (the test above: the same
    bits as plugins sized to the context); a plugin without the ``positions`` knob is built as given."""
    for spec in ("causal", "h2o:ratio=0.5", "quest:capacity=64"):
        sized = stories.engine(sized_plugin(spec, 400), threads=1)
        assert sized.max_positions == 400, spec
        assert sized.attention.planned_bytes(stories.config) < stories.engine(spec, threads=1).attention.planned_bytes(
            stories.config
        ), spec
    sink = stories.engine(sized_plugin("sink:4,60", 400), threads=1)
    assert sink.max_positions == stories.engine("sink:4,60", threads=1).max_positions


def test_a_diff_decodes_its_greedy_answer_with_the_compression_event(stories):
    """A diff's greedy answer of a side that compresses at the event comes from its prompt run with
    the event (before, it was decoded without: the answer of another cache than the one scored)."""
    spec = method_spec("knorm", 0.9, 300)
    report = stories.diff("causal", spec, probe=STORIES_PROBE, compress_at="context")
    (row,) = report.retrieval
    (seg,) = load_probe(STORIES_PROBE, stories.tokenizer, stories.config.seq_len).segments
    t = seg.target
    gen = stories.generate(
        seg.tokens[: t.prompt].tolist(), steps=t.prompt + t.generate, attention=spec, compress_at=seg.context_end,
        threads=1,
    )  # fmt: skip
    assert row.b.greedy == postprocess(stories.tokenizer.decode([int(seg.tokens[t.prompt - 1]), *gen.ids]))
    uncompressed = stories.generate(
        seg.tokens[: t.prompt].tolist(), steps=t.prompt + t.generate, attention=spec, compress_at="none", threads=1
    )
    assert uncompressed.ids != gen.ids  # the event changes this answer: the test can tell the two apart


def _smollm2_branches(probe: str, specs: list[str], ratios: tuple[float, ...]) -> None:
    model = Model.load(shared_file("SmolLM2-135M-Instruct.Q4_1.gguf"), threads=1)
    (seg,) = load_probe(probe, model.tokenizer, model.config.seq_len).segments
    record = ContextRecord.run(model.engine("causal", threads=1), seg.tokens[: seg.context_end + 1])
    for method in specs:
        for ratio in ratios:
            _assert_same(
                model, method_spec(method, ratio, record.positions), seg, FromRecord(record), record.positions - 1
            )


def test_smollm2_event_methods_branch_bit_for_bit():
    """On SmolLM2 (30 layers, 9 query heads over 3 KV heads, chat template), a short RULER sequence."""
    _smollm2_branches(SMOLLM2_PROBE, ["snapkv", "expected", "adakv"], (0.5,))


@pytest.mark.leaderboard_long
def test_smollm2_every_event_method_branches_bit_for_bit_at_every_ratio():
    _smollm2_branches("ruler:task=niah_multikey_1,length=1200,seed=1", EVENT_SPECS, RATIOS)


def _smollm2_prefix_starts(probe: str, ratios: tuple[float, ...]) -> None:
    model = Model.load(shared_file("SmolLM2-135M-Instruct.Q4_1.gguf"), threads=1)
    (seg,) = load_probe(probe, model.tokenizer, model.config.seq_len).segments
    record = ContextRecord.run(model.engine("causal", threads=1), seg.tokens[: seg.context_end + 1])
    for method in ("sliding", "sink", "kmeans"):
        for ratio in ratios:
            _assert_prefix_start(model, method_spec(method, ratio, record.positions), seg, record)


def test_smollm2_methods_start_after_their_exact_prefix_bit_for_bit():
    _smollm2_prefix_starts(SMOLLM2_PROBE, (0.5,))


@pytest.mark.leaderboard_long
def test_smollm2_methods_start_after_their_exact_prefix_at_every_ratio():
    _smollm2_prefix_starts("ruler:task=niah_multikey_1,length=1200,seed=1", RATIOS)


def test_gemma3_methods_start_after_their_exact_prefix_bit_for_bit():
    """Gemma 3: sliding and sink keep their window within the local layers' (model_windows); kmeans
    governs the global layers, the local ones filled by replay. At ratio 0.1 the prefix (558
    positions) is longer than the local layers' window of 512: their ring has wrapped within it."""
    model = Model.load(gemma3_file(), threads=1)
    (seg,) = load_probe(GEMMA3_PROBE, model.tokenizer, model.config.seq_len).segments
    record = ContextRecord.run(model.engine("causal", threads=1), seg.tokens[: seg.context_end + 1])
    for method, ratio in (("sliding", 0.1), ("sink", 0.75), ("kmeans", 0.1)):
        prefix = _assert_prefix_start(model, method_spec(method, ratio, record.positions), seg, record)
        assert prefix > 512 or ratio > 0.5


def test_gemma3_event_methods_branch_bit_for_bit():
    """Gemma 3: the method governs the global layers; the model's window on the local ones keeps the
    record's rows (``LayerSplit.start_local``), from the record and replayed alike."""
    model = Model.load(gemma3_file(), threads=1)
    (seg,) = load_probe(GEMMA3_PROBE, model.tokenizer, model.config.seq_len).segments
    assert seg.context_end > 512  # past the local layers' window: their ring has wrapped
    record = ContextRecord.run(model.engine("causal", threads=1), seg.tokens[: seg.context_end + 1])
    for method, way, start in (("snapkv", "record", FromRecord), ("expected", "record", FromRecord),
                               ("quest", "replay", ReplayAttention)):  # fmt: skip
        spec = method_spec(method, 0.75, record.positions)
        assert branch_way(model.engine(spec, threads=1).attention) == way
        _assert_same(model, spec, seg, start(record), record.positions - 1)


def test_a_local_layer_s_window_kept_from_the_record_is_the_one_attending_leaves(stories):
    """``LayerSplit.start_local``: causal's rows past the window kept without attending leave the
    window attending leaves: the same positions held, and the next positions attended to the same bits;
    a global layer is refused."""
    from kv_methods_drive import attach

    from pyllama.attention.layers import LayerSplit

    config = stories.config
    windows = tuple(8 if layer % 2 == 0 else 0 for layer in range(config.n_layers))
    rng = np.random.default_rng(3)
    T, more = 21, 5  # the ring of 8 has wrapped twice
    q = rng.standard_normal((T + more, config.q_dim)).astype(np.float32)
    k = rng.standard_normal((T + more, config.kv_dim)).astype(np.float32)
    v = rng.standard_normal((T + more, config.kv_dim)).astype(np.float32)
    kept = attach(LayerSplit(create_plugin("causal"), windows), config)
    attended = attach(LayerSplit(create_plugin("causal"), windows), config)
    kept.start_local(0, k[:T], v[:T])
    attended.attend_block(0, 0, q[:T], k[:T], v[:T], np.zeros((T, config.q_dim), dtype=np.float32))
    assert kept.held_positions(0)[0].tolist() == attended.held_positions(0)[0].tolist() == list(range(T - 8, T))
    outs = [np.zeros((more, config.q_dim), dtype=np.float32) for _ in range(2)]
    for split, out in zip((kept, attended), outs, strict=True):
        for t in range(T, T + more):
            split.attend(0, t, q[t], k[t], v[t], out[t - T])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.abs(outs[0]).sum() > 0
    with pytest.raises(ValueError, match="global layer"):
        kept.start_local(1, k[:T], v[:T])
    assert kept.local_layers == tuple(layer for layer, w in enumerate(windows) if w > 0)
