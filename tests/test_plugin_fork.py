"""Forking: after ``restore(snapshot)`` a plugin continues with the bits of its run from position 0.

The reference is a fresh run of the same tokens from position 0 on another engine: every position's
logits, the ledger and what each layer holds must be equal. Between the snapshot and the restore
the plugin runs other tokens (and, when the snapshot comes before the context's end, its own
compression event), so a state the snapshot misses shows. Every built-in forks, at a setting where
it evicts, compresses, clusters or quantises within the sequence. Then the drivers: a retrieval
sequence's greedy answer decoded from the fork (``score_sequence``) against the engine's own token
loop (``Model.generate``) from position 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gemma3_file

from pyllama.attention.base import Attention
from pyllama.attention.registry import BUILTINS
from pyllama.diff.probes import load_probe
from pyllama.diff.probes.ruler_metrics import postprocess
from pyllama.diff.retrieval_scores import score_sequence
from pyllama.leaderboard.methods import method_spec, ratio_methods
from pyllama.model import Model

PREFIX, TAIL, EVENT = 260, 40, 199  # positions before the fork, after it; the context's last position

# every built-in at a setting that acts within PREFIX positions of stories260K
SPECS = {m: method_spec(m, 0.5, EVENT + 1) for m in ratio_methods()}
SPECS |= {
    "causal": "causal",
    "kmeans": "kmeans:clusters=8,budget=32,sinks=4,window=16,recluster=64",
    "tiered": "tiered:sinks=4,window=16,warm=64,group=16",
    "lattice": "lattice:sinks=4,window=16,base=4",
    "kvquant": "kvquant:k=f16,v=bf16",  # stories260K's heads of 8 take no 32-value blocks
    "adakv:expected": "adakv:scorer=expected,ratio=0.5",
    "keydiff:every": "keydiff:ratio=0.5,every=8",
}
assert set(BUILTINS) <= set(SPECS), "a built-in without a fork test"


@pytest.fixture(scope="module")
def stories(stories260k, tok512):
    return Model.load(stories260k, tokenizer=tok512, threads=1)


def _tokens(model, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, model.config.vocab_size, n).astype(np.int32)


def _run(engine, tokens: np.ndarray, pos: int, event: int) -> np.ndarray:
    """Every position's logits of ``tokens`` from ``pos``, the block ending at ``event`` and the event there."""
    out = np.zeros((len(tokens), engine.config.vocab_size), dtype=np.float32)
    cut = event + 1 - pos if pos <= event < pos + len(tokens) - 1 else len(tokens)
    engine.forward_block(np.ascontiguousarray(tokens[:cut]), pos, out[:cut])
    if pos <= event < pos + cut:
        engine.compress(event)
    if cut < len(tokens):
        engine.forward_block(np.ascontiguousarray(tokens[cut:]), pos + cut, out[cut:])
    return out


def _state(engine, model) -> tuple:
    held = [engine.attention.held_positions(layer) for layer in range(model.config.n_layers)]
    return engine.attention.memory_bytes(), [None if h is None else [a.tolist() for a in h] for h in held]


def _fork_against_whole(
    model, spec: str, prefix: np.ndarray, other: np.ndarray, tail: np.ndarray, fork: int, event: int = EVENT
) -> None:
    """Snapshot after position ``fork`` - 1, run ``other`` onwards (its event 17 positions early),
    restore, run ``tail`` onwards: the bits of ``prefix[:fork]`` + ``tail`` from position 0, the
    context's last position ``event``."""
    engine = model.engine(spec, threads=1)
    _run(engine, prefix[:fork], 0, event)
    snapshot = engine.attention.snapshot()
    assert snapshot is not None, f"{spec} does not fork"
    _run(engine, other, fork, event - 17)  # a detour with its event elsewhere
    engine.attention.restore(snapshot)
    forked = _run(engine, tail, fork, event)
    fresh = model.engine(spec, threads=1)
    _run(fresh, prefix[:fork], 0, event)
    whole = _run(fresh, tail, fork, event)
    np.testing.assert_array_equal(forked, whole, err_msg=spec)
    assert _state(engine, model) == _state(fresh, model), spec
    diverted = model.engine(spec, threads=1)
    _run(diverted, prefix[:fork], 0, event)
    assert not np.array_equal(_run(diverted, other, fork, event)[-1], whole[-1])  # the detour was another run


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_restored_plugin_continues_as_its_run_from_position_0(stories, name):
    spec = SPECS[name]
    prefix = _tokens(stories, PREFIX + TAIL, 1)
    other = _tokens(stories, PREFIX + TAIL - 150, 2)
    _fork_against_whole(stories, spec, prefix, other[-TAIL:], prefix[PREFIX:], PREFIX)  # after the event
    _fork_against_whole(stories, spec, prefix, other, prefix[150:], 150)  # before it: the event runs in both


def test_a_python_plugin_does_not_fork_and_says_so():
    class Plain(Attention):
        def memory_bytes(self):
            return 0

    assert Plain().snapshot() is None
    with pytest.raises(NotImplementedError, match="does not fork"):
        Plain().restore(None)


def test_a_snapshot_of_another_plugin_is_refused(stories):
    a, b = stories.engine("h2o:ratio=0.5", threads=1), stories.engine("sliding:window=8", threads=1)
    with pytest.raises(ValueError, match="another plugin"):
        b.attention.restore(a.attention.snapshot())


def test_gemma3_forks_its_local_window_and_its_global_layers():
    """Gemma 3: ``h2o`` governs the global layers, the model's ring of 512 the local ones (LayerSplit)."""
    model = Model.load(gemma3_file(), threads=1)
    prefix = _tokens(model, 600, 3)
    other = _tokens(model, 24, 4)
    # the context ends at 540, past the local layers' window: their ring has wrapped
    _fork_against_whole(model, "h2o:ratio=0.5", prefix, other, prefix[576:], 576, event=540)


STORIES_PROBE = "ruler:task=niah_single_1,length=400,seed=3"


@pytest.mark.parametrize("name", ["causal", "sliding", "sink", "kmeans", "h2o", "tova", "scissorhands", "snapkv"])
def test_the_greedy_answer_decoded_from_the_fork_is_the_engine_s_own_from_position_0(stories, name):
    """score_sequence snapshots where the answer begins and decodes the greedy answer from there;
    Model.generate (the engine's token loop, the prompt from position 0, the same event) is the reference."""
    (seg,) = load_probe(STORIES_PROBE, stories.tokenizer, stories.config.seq_len).segments
    t, event = seg.target, seg.context_end
    spec = SPECS[name] if name in ("causal", "kmeans") else method_spec(name, 0.5, event + 1)
    scored = score_sequence(stories.engine(spec, threads=1), seg, stories.tokenizer, spec, event)
    assert scored.score.max_rank > 1  # the teacher-forced chain leaves the answer: the answer is decoded
    gen = stories.generate(
        seg.tokens[: t.prompt].tolist(), steps=t.prompt + t.generate, attention=spec, compress_at=event, threads=1
    )
    stop = [i for i, tok in enumerate(gen.ids) if tok in t.stop]
    ids = gen.ids[: stop[0]] if stop else gen.ids
    assert scored.score.greedy == postprocess(stories.tokenizer.decode([int(seg.tokens[t.prompt - 1]), *ids])), spec
