"""The engine's forward on Gemma 3, Qwen3 and Llama 3's scaled RoPE, against llama.cpp 0c1e570.

Gemma 3 270M (Q4_K_M from PyPI; skipped with the reason when absent) and the tiny random ``qwen3`` and
``llama`` (Llama 3 ``rope_freqs``) files of shared/models/arch: teacher-forced on llama.cpp's greedy
tokens, traced against its eval-callback dumps, and, on Gemma, past its 512-position sliding window:
greedy on the passkey probe's 1,500- and 3,000-token prompts (tests/references/gemma3-passkey.json,
made with llama-server at 0c1e570; the file says how), what ``causal`` holds on each kind of layer,
and every built-in in its degenerate setting equal to ``causal`` bit for bit whichever layers it
governs (``layers=all|global``).

Why agreement and not equality with llama.cpp's tokens (tests/test_quant_models.py says it at length):
a last-bit difference in one product's input can flip an 8-bit rounding of the activation, and
0c1e570 multiplies its Q4_K matrices in a repacked (interleaved-row) layout whose order pyllama does
not follow, so near-ties go either way. Measured here: Gemma 98.9% of 629 positions at margin >=
0.02 (7 misses, the widest at 0.41); the tiny qwen3 and llama3rope files 98.97% of 585 and 581 (6
misses each, all below margin 0.04).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from agreement import check_agreement, llama_margins
from conftest import read_jsonl, shared_file

from pyllama.model import Model
from pyllama.trace import trace_file

REFERENCES = Path(__file__).parent / "references"
# the issue's bounds: SmolLM2's (95% of the positions at margin >= 0.02, all at >= 2.0) for Gemma 3;
# for the random tiny files the agreement bound is what their near-ties allow (measured 98.97%, see
# the docstring), and none may differ at margin 1.0 or more
GEMMA_AGREEMENT, GEMMA_ALWAYS_ABOVE = 0.95, 2.0
TINY_AGREEMENT, TINY_ALWAYS_ABOVE = 0.985, 1.0
# tensor sums: Gemma within 1e-3 relative (the bound; measured <= 2e-5), the F32 tiny files 1e-4
GEMMA_TRACE, F32_TRACE = 1e-3, 1e-4
# degenerate settings of the built-ins on a 530-position sequence (past the 512 window)
DEGENERATE = ["sliding:1000", "sink:4,1000", "kmeans:budget=1000", "tiered:window=1000", "lattice:window=1000"]


@pytest.fixture(scope="module")
def gemma(gemma3):
    return Model.load(gemma3, threads=2)


def _agreement(model: Model, rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per generated token: llama.cpp's top-2 margin, and whether pyllama's argmax is its token."""
    margins, agree = [], []
    for row in rows:
        prompt, ids = row["prompt_ids"], row["ids"]
        engine = model.engine("causal")
        engine.forward_block(np.asarray(prompt[:-1], dtype=np.int32), 0)  # no classifier for the prompt
        logits = np.zeros((len(ids), model.config.vocab_size), dtype=np.float32)
        engine.forward_block(np.asarray([prompt[-1], *ids[:-1]], dtype=np.int32), len(prompt) - 1, logits)
        agree.append(logits.argmax(axis=1) == np.array(ids))
        margins.append(llama_margins(row))
    return np.concatenate(margins), np.concatenate(agree)


def test_gemma3_teacher_forced_on_llama_cpps_tokens(gemma):
    """The four prompts' 32-token greedy runs (the 128-token runs: ``pytest -m gemma_long``)."""
    rows = [row for row in read_jsonl("reference-gemma3.jsonl") if row["n_predict"] == 32]
    check_agreement(*_agreement(gemma, rows), GEMMA_AGREEMENT, GEMMA_ALWAYS_ABOVE)


@pytest.mark.gemma_long
def test_gemma3_teacher_forced_128(gemma):
    rows = [row for row in read_jsonl("reference-gemma3.jsonl") if row["n_predict"] == 128]
    check_agreement(*_agreement(gemma, rows), GEMMA_AGREEMENT, GEMMA_ALWAYS_ABOVE)


def _trace_worst(path, prompt: str, log) -> dict[str, float]:
    _, rows = trace_file(path, prompt, None, log, 1)
    compared = [r for r in rows if r.reference is not None]
    assert len(compared) > 0.8 * len(rows)
    return {r.name: r.rel_diff for r in compared}


def test_gemma3_trace_matches_the_eval_callback_dump(gemma3):
    worst = _trace_worst(gemma3, "Hello world", shared_file("evalcb-gemma3-hello_world.log"))
    assert {"Kcur_normed-5", "l_out-11", "ffn_geglu-17", "result_output"} <= set(worst)  # past the first global
    assert max(worst.values()) <= GEMMA_TRACE, {n: d for n, d in worst.items() if d > GEMMA_TRACE}


def test_tiny_f32_trace_matches_the_eval_callback_sums(tiny_f32, tmp_path):
    from pyllama.trace import summarize, trace_prompt

    kind, path = tiny_f32
    model = Model.load(path, threads=1)
    ids = {"qwen3": [9707, 1879], "llama3rope": [1, 15043, 3186]}[kind]
    sums = json.loads(shared_file(f"arch/evalcb-tiny-{kind}-f32-hello_world.sums.json").read_text())
    rows = summarize(trace_prompt(model, ids, current=True))
    compared = {r.name: abs(r.ours - sums[r.name]) / abs(sums[r.name]) for r in rows if r.name in sums}
    assert len(compared) >= 0.9 * len(rows) and "result_output" in compared
    assert max(compared.values()) <= F32_TRACE, {n: d for n, d in compared.items() if d > F32_TRACE}


@pytest.mark.parametrize("name", ["tiny-qwen3-q4_k_m.gguf", "tiny-llama3rope-q4_k_m.gguf"])
def test_tiny_models_teacher_forced_on_llama_cpps_tokens(name):
    model = Model.load(shared_file(f"arch/{name}"), threads=1)
    rows = [row for row in read_jsonl("arch/reference-arch.jsonl") if row["model"] == name]
    check_agreement(*_agreement(model, rows), TINY_AGREEMENT, TINY_ALWAYS_ABOVE)


@pytest.fixture(scope="module")
def passkey_reference() -> dict:
    return json.loads((REFERENCES / "gemma3-passkey.json").read_text())


@pytest.mark.parametrize("length", [1500, pytest.param(3000, marks=pytest.mark.gemma_long)])
def test_gemma3_past_its_window_greedy_is_llama_cpps(gemma, passkey_reference, length):
    """The passkey's prompt (haystack, question, "The pass key is"): the same 16 greedy tokens as
    llama.cpp (every margin >= 0.77), the key among them: full attention retrieves it on Gemma 3."""
    row = next(r for r in passkey_reference["rows"] if r["length"] == length)
    prompt = row["prompt_ids"]
    engine = gemma.engine("causal")
    gen = gemma.generate(prompt, steps=len(prompt) + 16, temperature=0.0, ignore_eos=True)
    assert gen.ids[:16] == row["ids"]
    assert row["key"] in gemma.tokenizer.decode([prompt[-1], *gen.ids[:6]])
    # what causal holds: the model's 512 rows on each local layer, every position on a global one
    engine.forward_block(np.asarray(prompt, dtype=np.int32), 0)
    n, cfg = len(prompt), gemma.config
    for layer, window in enumerate(cfg.layer_windows):
        held = engine.attention.held_positions(layer)[0]
        expect = np.arange(n - 512, n) if window else np.arange(n)
        assert np.array_equal(held, expect), layer
    local = sum(1 for w in cfg.layer_windows if w)
    assert engine.attention.memory_bytes() == 2 * cfg.kv_dim * 4 * (local * 512 + (cfg.n_layers - local) * n)


@pytest.fixture(scope="module")
def past_the_window(gemma) -> tuple[np.ndarray, np.ndarray]:
    """530 random tokens (past the 512 window) and causal's logits at the last one."""
    tokens = np.asarray([2, *np.random.default_rng(3).integers(3, gemma.config.vocab_size, 529)], dtype=np.int32)
    return tokens, gemma.engine("causal").forward_block(tokens, 0).copy()


@pytest.mark.parametrize("spec", DEGENERATE)
@pytest.mark.parametrize("layers", ["all", "global"])
def test_gemma3_builtins_degenerate_are_causal(gemma, past_the_window, spec, layers):
    tokens, expect = past_the_window
    assert np.array_equal(expect, gemma.engine(f"{spec},layers={layers}").forward_block(tokens, 0))


def test_gemma3_sliding_window_hides_the_key(gemma, passkey_reference):
    """A plugin may hide rows the model would see: sliding:600 keeps 512 on the local layers (the
    model's window) and 600 on the global ones, short of the needle, and loses the key."""
    row = next(r for r in passkey_reference["rows"] if r["length"] == 1500)
    gen = gemma.generate(row["prompt_ids"], steps=len(row["prompt_ids"]) + 6, temperature=0.0, attention="sliding:600")
    assert row["key"] not in gemma.tokenizer.decode([row["prompt_ids"][-1], *gen.ids])
