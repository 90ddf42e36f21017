"""``quest``: the pages each query attends against the numpy reference (kv_methods_reference.quest) on
random data and on SmolLM2, the attention over them against the shared routine, ``causal`` bit for bit
when the capacity covers the sequence, the ledger, the knobs' refusals and the thread count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS, make_checkpoint, shared_file
from kv_methods_reference import quest

from pyllama.attention.base import Attention
from pyllama.attention.head import attend_rows
from pyllama.config import ModelConfig
from pyllama.engine import Pool
from pyllama.errors import PluginError
from pyllama.model import Model
from pyllama.plugins.quest import Quest

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUANT_MODELS = sorted((MODELS / "quant").glob("*.gguf"))
SHAPE = ModelConfig(dim=64, hidden_dim=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=16, seq_len=400)


def bind(plugin, config=SHAPE, threads=1):
    pool = Pool(threads)
    plugin._configure(config, pool)
    plugin.init(config, pool)
    return plugin


def compare(trace, attended, T, n_kv):
    """Positions attended by the plugin against the reference's, step by step; a difference is allowed
    only on pages whose bound lay within the reference's tolerance of the selection boundary. Returns
    how many (step, KV head) selections differed that way."""
    near_misses = 0
    for t in range(T):
        for g in range(n_kv):
            want, got = trace.attended[t][g], attended[t][g]
            if np.array_equal(want, got):
                continue
            differ = np.setxor1d(want, got)
            assert np.isin(differ, trace.near[t][g]).all(), (t, g, differ, trace.near[t][g])
            assert len(got) == len(want), (t, g)
            near_misses += 1
    return near_misses


def split(rows, config):
    """[T, width] rows as [T, heads, head_dim]."""
    return rows.reshape(rows.shape[0], -1, config.head_dim)


@pytest.mark.parametrize("event", [None, 150])
def test_pages_per_query_against_the_reference_on_random_data(event):
    T, capacity = 300, 64
    rng = np.random.default_rng(3)
    # [layer, position, width]: a layer's rows are contiguous
    q = (rng.standard_normal((SHAPE.n_layers, T, SHAPE.q_dim)) * 1.5).astype(np.float32)
    k = (rng.standard_normal((SHAPE.n_layers, T, SHAPE.kv_dim)) * 1.5).astype(np.float32)
    v = rng.standard_normal((SHAPE.n_layers, T, SHAPE.kv_dim)).astype(np.float32)
    plugin = bind(Quest(capacity, dense_context=event is not None))
    attended = {layer: [] for layer in range(SHAPE.n_layers)}
    for t in range(T):
        for layer in range(SHAPE.n_layers):
            out = np.zeros(SHAPE.q_dim, np.float32)
            plugin.attend(layer, t, q[layer, t], k[layer, t], v[layer, t], out)
            rows = [plugin.attended(g) for g in range(SHAPE.n_kv_heads)]
            attended[layer].append(rows)
            # the shared routine over the chosen rows (every KV head attends its own selection)
            want = np.zeros(SHAPE.q_dim, np.float32)
            for g in range(SHAPE.n_kv_heads):
                one = np.zeros(SHAPE.q_dim, np.float32)
                attend_rows(SHAPE, q[layer, t], k[layer, : t + 1], v[layer, : t + 1], one, rows=rows[g])
                heads = slice(g * 2 * SHAPE.head_dim, (g + 1) * 2 * SHAPE.head_dim)
                want[heads] = one[heads]
            assert out.tobytes() == want.tobytes(), (t, layer)
        if t == event:
            plugin.compress(t)
    for layer in range(SHAPE.n_layers):
        trace = quest(
            split(q[layer], SHAPE),
            split(k[layer], SHAPE),
            split(v[layer], SHAPE),
            capacity,
            context_end=event,
            layer=layer,
        )
        misses = compare(trace, attended[layer], T, SHAPE.n_kv_heads)
        assert misses <= 2, misses
        if layer >= 2:  # selected from step capacity // 16 pages on (after the event, if any)
            first = max(64, (event or 0) + 1)
            assert len(attended[layer][first][0]) == 48 + first % 16 + 1
    assert plugin.memory_bytes() == SHAPE.n_layers * (2 * T + 2 * -(-T // 16)) * SHAPE.kv_dim * 4
    assert [h.tolist() for h in plugin.held_positions(2)] == [list(range(T))] * SHAPE.n_kv_heads


class Recorder(Attention):
    """quest inside the engine, recording each call of some layers: q, k, v and what each KV head attended."""

    name = "quest-recorder"
    description = "quest, recording the queries, keys, values and selections of some layers"

    def __init__(self, inner: Quest, layers: tuple[int, ...]):
        self.inner, self.layers = inner, layers
        self.calls: dict[int, list] = {layer: [] for layer in layers}

    def init(self, config, pool):
        self.inner._configure(config, pool)
        self.inner.init(config, pool)

    def reset(self):
        self.inner.reset()
        for calls in self.calls.values():
            calls.clear()

    def compress(self, pos):
        self.inner.compress(pos)

    def memory_bytes(self):
        return self.inner.memory_bytes()

    def attend(self, layer, pos, q, k, v, out):
        self.inner.attend(layer, pos, q, k, v, out)
        if layer in self.calls:
            n_kv = self.inner.config.n_kv_heads
            self.calls[layer].append((q.copy(), k.copy(), v.copy(), [self.inner.attended(g) for g in range(n_kv)]))


def test_pages_per_query_against_the_reference_on_smollm2():
    model = Model.load(shared_file(SMOLLM2), threads=2)
    cfg = model.config
    ids = model.tokenize(" ".join((REPO / "docs" / "methods.md").read_text().split()))[:240]
    event, layers = 80, (2, 15, 29)
    recorder = Recorder(Quest(96), layers)
    model.generate(ids, steps=len(ids), attention=recorder, compress_at=event)
    total = 0
    for layer in layers:
        calls = recorder.calls[layer]
        assert len(calls) == len(ids)
        q, k, v = (np.stack([c[i] for c in calls]) for i in range(3))
        trace = quest(split(q, cfg), split(k, cfg), split(v, cfg), 96, context_end=event, layer=layer)
        total += compare(trace, [c[3] for c in calls], len(ids), cfg.n_kv_heads)
        assert len(calls[event][3][0]) == event + 1 and len(calls[-1][3][0]) < len(ids)  # dense, then selected
    assert total <= 3, total


# ---- identities -------------------------------------------------------------------------------------
def test_a_capacity_covering_the_sequence_is_causal_bit_for_bit():
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=2)
    for blocks in (True, False):
        report = model.diff(
            "causal", "quest:capacity=512,dense_layers=0,dense_context=false", probe="stories", blocks=blocks
        )
        assert report.summary["exact"] and report.summary["max_abs_dlogit"] == 0.0, report.table()
    smol = Model.load(shared_file(SMOLLM2), threads=2)
    ids = smol.tokenize("The grass is green. The sky is blue. " * 20)[:150]
    report = smol.diff("causal", "quest:capacity=160,dense_context=false", probe=ids)
    assert report.summary["exact"] and report.summary["max_abs_dlogit"] == 0.0, report.table()
    # with the compression event (the passkey's context ends before its question) too
    report = smol.diff("causal", "quest:capacity=256", probe="passkey:length=200")
    assert report.summary["exact"] and report.summary["max_abs_dlogit"] == 0.0, report.table()
    # and a capacity that does not cover it selects
    assert not smol.diff("causal", "quest:capacity=32,dense_context=false", probe=ids).summary["exact"]


def test_dense_through_the_context_without_an_event_is_causal():
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=2)
    report = model.diff("causal", "quest:capacity=16,dense_layers=0", probe="stories")
    assert report.summary["exact"], report.table()
    assert Quest(16).compresses_at_event and not Quest(16, dense_context=False).compresses_at_event


@pytest.mark.kv_grid
@pytest.mark.parametrize("blocks", [True, False])
@pytest.mark.parametrize("path", [MODELS / SMOLLM2, *QUANT_MODELS], ids=lambda p: getattr(p, "name", p))
def test_covering_capacity_is_causal_on_every_gguf(path, blocks):
    model = Model.load(shared_file(path.relative_to(MODELS).as_posix()), threads=2)
    spec = "quest:capacity=8192,dense_layers=0,dense_context=false"
    report = model.diff("causal", spec, probe="stories", blocks=blocks)
    assert report.summary["exact"] and report.summary["max_abs_dlogit"] == 0.0, report.table()


# ---- knobs, ledger, threads ----------------------------------------------------------------------------
def test_a_capacity_smaller_than_a_page_is_refused_in_one_line():
    for make in (lambda: Quest(15), lambda: Quest(40, page=64)):
        with pytest.raises(PluginError) as err:
            make()
        assert "\n" not in str(err.value) and str(err.value).startswith("quest: capacity=")
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"))
    with pytest.raises(PluginError, match="quest: capacity=8 is smaller than a page"):
        model.generate("Once", steps=3, attention="quest:capacity=8")
    with pytest.raises(PluginError, match="quest: missing capacity"):
        model.generate("Once", steps=3, attention="quest")


def test_the_thread_count_changes_no_bit(tmp_path, parallel_always):
    shape = "--dim 96 --hidden-dim 64 --layers 3 --heads 6 --kv-heads 2 --vocab 64 --seq-len 600 --seed 5"
    path = make_checkpoint(tmp_path / "gqa.bin", "custom", *shape.split())
    model = Model.load(path)
    ids = np.random.default_rng(4).integers(0, 64, 500)
    spec = "quest:capacity=48,dense_layers=1,dense_context=false"
    assert model.logits(ids, spec, threads=1).tobytes() == model.logits(ids, spec, threads=2).tobytes()


def test_the_token_loop_allocates_nothing(stories260k):
    """test_engine_alloc's measurement (tracemalloc's peak for 4 positions and for 400) with quest selecting."""
    from test_engine_alloc import MEASURE

    script = MEASURE.replace('model.engine("causal")', "model.engine(sys.argv[3])")
    spec = "quest:capacity=32,dense_layers=1,dense_context=false"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(stories260k), "clean", spec], capture_output=True, text=True, check=True
    )
    for short, long in json.loads(proc.stdout):
        assert long == short and long[0] < 4096
