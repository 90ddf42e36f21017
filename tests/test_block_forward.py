"""The block forward (``Engine.forward_block``): the same bits as one ``forward`` per position.

Logits for block sizes 1, 7, 64 and the whole sequence at 1 and 2 threads, with every loop forced
onto a team (``parallel_always``); ``pyllama diff`` reports identical with and without blocks for
every built-in against causal (memory column included); the attention contract's block rules
(per_position_order, attend_block, a Python plugin's views). The default run takes a
representative slice; ``pytest -m block_grid tests/test_block_forward.py`` runs the whole grid
(every model x block size x thread count x plugin).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import make_checkpoint, shared_file

from pyllama.attention.base import Attention
from pyllama.attention.registry import create_plugin
from pyllama.diff import run_diff
from pyllama.diff._capture import DiffCapture
from pyllama.engine import Engine
from pyllama.errors import PositionError
from pyllama.model import Model

MODELS = [
    "stories260K",
    "stories15M-shape",
    "stories260K-f32.gguf",
    "stories260K-f16.gguf",
    "stories260K-q8_0.gguf",
    # llama-quantize's mixes: Q4_0 + Q6_K; Q5_1 (Q8_1 activations); Q3_K, Q4_K, Q5_K, Q5_0, Q6_K
    "quant/tiny-llama-q4_0.gguf",
    "quant/tiny-llama-q5_1.gguf",
    "quant/tiny-llama-q3_k_m.gguf",
]
# small windows, so every plugin evicts, quantises, clusters or merges within the sequence
BUILTINS = [
    "causal",
    "sliding:16",
    "sink:4,12",
    "sink:2,10,shift",
    "kmeans:clusters=4,budget=8,sinks=2,window=8,recluster=16",
    "tiered:sinks=2,window=8,warm=32,group=16,block=8",
    "lattice:sinks=2,window=8,base=4",
    "quest:capacity=32,dense_layers=1,dense_context=false",
    "kvquant:k=f16,v=bf16",  # the quantised types need heads of a multiple of 32 (test_kvquant.py)
]
N_TOKENS = 150
grid = pytest.mark.block_grid


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    cache: dict[str, Model] = {}

    def get(name: str) -> Model:
        if name not in cache:
            if name == "stories15M-shape":
                path = make_checkpoint(tmp_path_factory.mktemp("ckpt") / "s15m.bin", "stories15M", "--seed", "7")
            elif name == "stories260K":
                path = shared_file("stories260K.bin")
            else:
                path = shared_file(name)
            cache[name] = Model.load(path, threads=1)
        return cache[name]

    return get


def _tokens(model: Model, n: int = N_TOKENS) -> np.ndarray:
    n = min(n, model.config.seq_len)  # the GGUF conversions hold 128 positions
    return np.random.default_rng(11).integers(0, model.config.vocab_size, size=n, dtype=np.int32)


def _per_position(model: Model, spec: str, tokens: np.ndarray, threads: int) -> np.ndarray:
    engine = Engine(model.config, model.weights, create_plugin(spec), threads)
    return np.stack([np.array(engine.forward(int(t), p)) for p, t in enumerate(tokens)])


def _blocks(model: Model, spec: str, tokens: np.ndarray, threads: int, block: int) -> np.ndarray:
    engine = Engine(model.config, model.weights, create_plugin(spec), threads, max_block=block)
    out = np.zeros((len(tokens), model.config.vocab_size), dtype=np.float32)
    engine.forward_block(tokens, 0, out)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _check_logits(model: Model, spec: str, threads: int, blocks: list[int], n: int = N_TOKENS) -> None:
    tokens = _tokens(model, n)
    expect = _per_position(model, spec, tokens, threads)
    for block in blocks:
        got = _blocks(model, spec, tokens, threads, block or len(tokens))
        assert _same_bits(got, expect), (spec, threads, block)


# the default run: every model, both thread counts among them, 80 positions (blocks of 64 + 16)
SLICE = [
    ("stories260K", 2),
    ("stories15M-shape", 1),
    ("stories260K-f32.gguf", 1),
    ("stories260K-q8_0.gguf", 2),
    ("stories260K-f16.gguf", 2),
    ("quant/tiny-llama-q4_0.gguf", 2),
    ("quant/tiny-llama-q5_1.gguf", 1),
    ("quant/tiny-llama-q3_k_m.gguf", 2),
]


@pytest.mark.parametrize(("name", "threads"), SLICE)
def test_block_logits_equal_per_position_logits(models, name, threads, parallel_always):
    _check_logits(models(name), "causal", threads, [1, 7, 64, 0], n=80)


# (a spec that attends every position up to position 100, then fewer; one that attends every position of
# the sequence, equal to causal): sliding and sink's rows, kmeans before it clusters (sinks + window + budget)
HELD_WHOLE = [
    ("sliding:100", "sliding:200"),
    ("sink:4,96", "sink:4,196"),
    ("sink:4,96,shift", "sink:4,196,shift"),
    ("kmeans:clusters=4,budget=88,sinks=4,window=8,recluster=16", "kmeans:clusters=4,budget=188,sinks=4,window=8"),
]


@pytest.mark.parametrize(("spec", "roomy"), HELD_WHOLE)
@pytest.mark.parametrize("name", ["stories260K", "quant/tiny-llama-q4_0.gguf", "stories260K-q8_0.gguf"])
def test_blocks_attending_every_position_attend_as_causal_does(models, name, spec, roomy, parallel_always):
    # sliding, sink and kmeans attend a block in which each position attends every one before it as causal
    # does (its queries together); a block within which one leaves, one position at a time: blocks of 7
    # and 64 against a limit of 100 take both ways (64 + 64 crosses 100), and the bits are the
    # per-position ones either way. A wrong row offset (sink's ring not right after its sink rows) fails it.
    model = models(name)
    _check_logits(model, spec, 2, [7, 64, 100, 0])
    tokens = _tokens(model, N_TOKENS)
    assert _same_bits(_blocks(model, roomy, tokens, 2, 64), _per_position(model, "causal", tokens, 2))


@pytest.mark.parametrize("name", ["stories260K", "quant/tiny-llama-q4_k_m.gguf"])
def test_long_prompt_last_logits(models, name):
    """Without a logits array, only the last block applies the classifier: the last position's logits
    are still those of one forward per position, and an earlier block's would-be logits are never
    written into the returned view (it is the last position's after the call)."""
    model = models(name)
    tokens = _tokens(model, 80)
    expect = _per_position(model, "causal", tokens, 1)
    engine = Engine(model.config, model.weights, create_plugin("causal"), 1, max_block=16)
    got = np.array(engine.forward_block(tokens, 0))
    assert _same_bits(got, expect[-1])
    engine.reset()
    got = np.array(engine.forward_block(tokens[:33], 0))  # blocks of 16, 16 and 1
    assert _same_bits(got, expect[32])


@grid
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("spec", BUILTINS)
def test_block_logits_grid(models, name, threads, spec, parallel_always):
    _check_logits(models(name), spec, threads, [1, 7, 64, 0])


def _report_fields(report) -> dict:
    out = {}
    for f in dataclasses.fields(report):
        if f.name != "seconds":  # timing aside, every column and summary
            out[f.name] = getattr(report, f.name)
    return out


def _check_diff(model: Model, spec: str, threads: int, block: int) -> None:
    probe = _tokens(model, 140)
    config, weights = model.config, model.weights
    per_pos = run_diff(config, weights, "causal", spec, probe=probe, threads=threads, blocks=False, progress=False)
    blocked = run_diff(config, weights, "causal", spec, probe=probe, threads=threads, block=block, progress=False)
    a, b = _report_fields(per_pos), _report_fields(blocked)
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key], equal_nan=True), (spec, key)
        else:
            assert a[key] == b[key], (spec, key)
    assert per_pos.mem_b.max() > 0


@pytest.mark.parametrize("spec", BUILTINS)
def test_diff_reports_are_identical_with_and_without_blocks(models, spec, parallel_always):
    _check_diff(models("stories260K"), spec, 2, 64)


@grid
@pytest.mark.parametrize("block", [7, 64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("spec", BUILTINS)
def test_diff_grid(models, name, threads, spec, block, parallel_always):
    _check_diff(models(name), spec, threads, block)


@pytest.mark.parametrize("spec", BUILTINS)
def test_block_ledger_is_the_per_position_ledger(models, spec):
    # what memory_bytes() says after each position, against the ledger a block reports for it
    model = models("stories260K")
    tokens = _tokens(model, 100)
    one = Engine(model.config, model.weights, create_plugin(spec), 1)
    expect = []
    for p, t in enumerate(tokens):
        one.forward(int(t), p)
        expect.append(one.attention.memory_bytes())
    engine = Engine(model.config, model.weights, create_plugin(spec), 1, max_block=32)
    ledger = np.zeros(32, dtype=np.int64)
    capture = DiffCapture(engine.attention, model.config, ledger=ledger)
    engine.set_observer(capture)
    got = []
    for c in range(0, len(tokens), 32):
        capture.begin(c)
        engine.forward_block(tokens[c : c + 32], c)
        got.extend(ledger[: len(tokens[c : c + 32])].tolist())
    assert got == expect
    assert engine.attention.memory_bytes() == expect[-1]


class Recorder(Attention):
    """A Python plugin: exact attention over a dense cache, recording the order of its calls."""

    name = "recorder"
    description = "records (layer, pos) calls"

    def init(self, config, pool):
        self.keys = np.zeros((config.n_layers, config.seq_len, config.kv_dim), dtype=np.float32)
        self.values = np.zeros_like(self.keys)
        self.calls: list[tuple[int, int]] = []
        self.held = np.zeros(config.n_layers, dtype=np.int64)

    def memory_bytes(self):
        return int(self.held.sum()) * self.config.kv_dim * 8

    def attend(self, layer, pos, q, k, v, out):
        self.calls.append((layer, pos))
        self.keys[layer, pos] = k
        self.values[layer, pos] = v
        self.held[layer] = pos + 1
        cfg = self.config
        hd, kv_mul = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
        for h in range(cfg.n_heads):
            g = h // kv_mul
            keys = self.keys[layer, : pos + 1, g * hd : (g + 1) * hd]
            s = keys @ q[h * hd : (h + 1) * hd] / np.float32(np.sqrt(hd))
            w = np.exp(s - s.max())
            out[h * hd : (h + 1) * hd] = (w / w.sum()) @ self.values[layer, : pos + 1, g * hd : (g + 1) * hd]


class InOrder(Recorder):
    per_position_order = True


class WholeBlocks(Recorder):
    def attend_block(self, layer, pos, q, k, v, out):
        self.blocks.append((layer, pos, q.shape[0]))
        for i in range(q.shape[0]):
            self.attend(layer, pos + i, q[i], k[i], v[i], out[i])

    def init(self, config, pool):
        super().init(config, pool)
        self.blocks: list[tuple[int, int, int]] = []


def _run(model: Model, plugin: Attention, tokens: np.ndarray, block: int) -> np.ndarray:
    engine = Engine(model.config, model.weights, plugin, 1, max_block=block)
    out = np.zeros((len(tokens), model.config.vocab_size), dtype=np.float32)
    engine.forward_block(tokens, 0, out)
    return out


def test_python_plugins_in_blocks(models):
    model = models("stories260K")
    tokens = _tokens(model, 20)
    L = model.config.n_layers
    ref = Recorder()
    expect = _run(model, ref, tokens, 1)
    assert ref.calls == [(li, p) for p in range(20) for li in range(L)]  # block of 1: position by position

    blocked = Recorder()
    assert _same_bits(_run(model, blocked, tokens, 8), expect)
    # layer-major inside each block of 8 positions (the contract's block order)
    order = [(li, p) for c in range(0, 20, 8) for li in range(L) for p in range(c, min(c + 8, 20))]
    assert blocked.calls == order

    in_order = InOrder()
    assert _same_bits(_run(model, in_order, tokens, 8), expect)
    assert in_order.calls == ref.calls  # per_position_order: the usual order, blocks or not

    whole = WholeBlocks()
    assert _same_bits(_run(model, whole, tokens, 8), expect)
    assert whole.blocks == [(li, c, min(8, 20 - c)) for c in range(0, 20, 8) for li in range(L)]


def test_model_logits_and_generate_report_prompt_speed(models):
    model = models("stories260K")
    tokens = _tokens(model, 70)
    got = model.logits(tokens)
    assert got.dtype == np.float32 and _same_bits(got, _per_position(model, "causal", tokens, model.threads))
    out = model.generate([1, *tokens[:40].tolist()], steps=60, temperature=0.0, ignore_eos=True)
    assert out.prompt_tok_per_s > 0 and out.tok_per_s > 0 and out.to_json()["prompt_tok_per_s"] > 0
    # the same ids as a prompt fed position by position through the engine and sampled greedily
    engine = Engine(model.config, model.weights, create_plugin("causal"), model.threads)
    ids = [1, *tokens[:40].tolist()]
    for p in range(60):
        logits = engine.forward(ids[p], p)
        if p >= len(ids) - 1:
            ids.append(int(np.argmax(logits)))
    assert out.ids == ids[41:]


def test_block_forward_checks_its_input(models):
    model = models("stories260K")
    engine = Engine(model.config, model.weights, create_plugin("causal"), 1, max_block=8)
    with pytest.raises(PositionError, match="outside the vocabulary"):
        engine.forward_block(np.array([1, 99999], dtype=np.int32), 0)
    with pytest.raises(ValueError, match="at least one token"):
        engine.forward_block(np.zeros(0, dtype=np.int32), 0)
    engine.set_observer(DiffCapture(engine.attention, model.config, ledger=np.zeros(8, dtype=np.int64)))
    with pytest.raises(ValueError, match="outside its 8 rows"):
        engine.forward_block(np.ones(16, dtype=np.int32), 0)
    assert engine.block_buffer_bytes() > 0


def test_cli_diff_json_is_the_same_with_and_without_blocks(tmp_path):
    import json

    from click.testing import CliRunner

    from pyllama.cli import main

    ckpt, tok = str(shared_file("stories260K.bin")), str(shared_file("tok512.bin"))
    outs = []
    for flag in ("--blocks", "--no-blocks"):
        path = tmp_path / f"{flag}.json"
        args = ["diff", "causal", "sink:4,12", "-c", ckpt, "-z", tok, "--probe", "recall", flag, "--json", str(path)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        out = json.loads(path.read_text())
        for key in ("seconds", "positions_per_second"):  # timing aside
            out["summary"].pop(key)
        outs.append(out)
    assert outs[0] == outs[1] and outs[0]["rows"]
