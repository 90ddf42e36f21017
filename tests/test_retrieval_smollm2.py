"""Retrieval on a real 8k-context instruct model (SmolLM2-135M-Instruct, Q4_1): exact attention finds
the pass key, and StreamingLLM's sinks + window finds it exactly when the window reaches it.

About 5,600 positions in all through the block forward (a few minutes on one loaded core); the full
needle grid to the 8,192-token context is ``pytest -m retrieval_grid tests/test_retrieval_smollm2.py``."""

from __future__ import annotations

import pytest
from conftest import shared_file

from pyllama.diff.probes import load_probe
from pyllama.diff.retrieval_scores import score_retrieval
from pyllama.model import Model

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
PASSKEY = "passkey:depth=0.5,length=1200"  # the key about 600 tokens before the answer


@pytest.fixture(scope="module")
def smollm2() -> Model:
    return Model.load(shared_file(SMOLLM2), threads=1)


@pytest.fixture(scope="module")
def passkey(smollm2):
    (seg,) = load_probe(PASSKEY, smollm2.tokenizer, smollm2.config.seq_len).segments
    return seg


def test_the_probe_is_rendered_with_the_chat_template(smollm2, passkey):
    text = smollm2.tokenizer.decode([0, *passkey.tokens.tolist()])
    assert passkey.tokens[0] == 1 and list(passkey.tokens).count(1) == 3  # system, user, assistant turns
    assert text.rstrip().endswith(f"The pass key is {passkey.target.key}")
    assert 1100 <= len(passkey) <= 1200


def test_causal_retrieves_the_key_at_several_depths(smollm2):
    run = score_retrieval(smollm2, "causal", "needle:depths=0/1,lengths=1000", greedy=True)
    run_mid = score_retrieval(smollm2, "causal", PASSKEY, greedy=True)
    rows = run.rows + run_mid.rows
    assert [r.depth for r in rows] == [0.0, 1.0, 0.5]
    for r in rows:
        assert r.a.retrieves, (r.segment, r.a.ranks)
        assert r.a.match and r.a.greedy.strip() == r.key


def test_sink_with_a_window_short_of_the_key_fails(smollm2, passkey):
    window = 256
    assert passkey.target.distance > window + 64  # the key is well outside the window
    (row,) = score_retrieval(smollm2, f"sink:4,{window}", PASSKEY, greedy=True).rows
    assert not row.a.retrieves and row.a.max_rank > 1
    assert not row.a.match


def test_sink_with_a_window_covering_the_key_retrieves(smollm2, passkey):
    window = 768
    t = passkey.target
    assert t.distance + 16 < window and 4 + window < len(passkey)  # covers the key, but not everything
    (row,) = score_retrieval(smollm2, f"sink:4,{window}", PASSKEY, greedy=True).rows
    assert row.a.retrieves and row.a.match


# The one point of the default grid where the model itself does not find the key: the needle 8,127
# positions back, at the edge of its 8,192-token context. llama.cpp, given the same token ids (f32 K/V
# cache, greedy), also answers "1. The pass key" there instead of the digits, so the point is the
# model's failure, not the engine's (docs/probes.md, "Exact attention and llama.cpp").
MODEL_FAILS = {"passkey-d0-n8192"}


@pytest.mark.retrieval_grid
def test_causal_retrieves_over_the_whole_needle_grid(smollm2):
    """The default needle grid: depths 0, 0.25, 0.5, 0.75, 1 at 2,048, 4,096 and 8,192 tokens."""
    run = score_retrieval(smollm2, "causal", "needle", threads=2, greedy=True)
    assert len(run.rows) == 15
    failed = {r.segment for r in run.rows if not (r.a.retrieves and r.a.match)}
    assert failed == MODEL_FAILS
