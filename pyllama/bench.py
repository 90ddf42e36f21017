"""``pyllama bench``: decode speed of one model and what it implies about memory bandwidth.

Decode is memory-bound: every token multiplies every layer matrix and the classifier once, so
``bytes_per_token`` (those matrices as stored, quantised sizes included) times tok/s is the
bandwidth the engine achieves. tok/s is measured as ``generate`` measures it (run.c's way: from the
end of the first forward pass), greedy and ignoring end tokens so every run has the same length;
the figure is the best of ``repeats`` runs.

Prompt processing is timed like llama.cpp's ``llama-bench -p N``: ``prompt_tokens`` seeded random
ids run from position 0 as blocks of positions (``Engine.forward_block``, logits of the last
position only), best of ``repeats``; N is clamped to what the plugin holds.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from pyllama.attention.registry import resolve_spec
from pyllama.attention.spec import PluginSpec
from pyllama.checkpoint.weights import Weights
from pyllama.errors import InputError
from pyllama.model import Model

PROMPT = "Once upon a time"
BOS = 1
PROMPT_TOKENS = 512  # llama-bench's pp512


def bytes_per_token(weights: Weights) -> int:
    """Bytes of weights one decode step streams: every layer matrix and the classifier, as stored.

    The token embedding counts only as the classifier when the two are shared (a step reads one
    embedding row, which is left out, as are the norm vectors and biases: a few KiB at most).
    """
    n = sum(
        t.nbytes
        for layer in weights.layers
        for t in (layer.wq, layer.wk, layer.wv, layer.wo, layer.w1, layer.w2, layer.w3)
    )
    return int(n + weights.classifier.nbytes)


def weights_bytes(weights: Weights) -> int:
    """Bytes of every weight as stored: matrices (the embedding once), norm vectors and biases."""
    n = sum(t.nbytes for t in weights.tensors()) + weights.final_norm.nbytes
    for layer in weights.layers:
        n += layer.attn_norm.nbytes + layer.ffn_norm.nbytes
        n += sum(b.nbytes for b in (layer.bq, layer.bk, layer.bv) if b is not None)
    return int(n)


@dataclass
class BenchResult:
    """The figures ``pyllama bench`` prints (``to_json`` is its ``--json`` object)."""

    checkpoint: str
    attention: str
    threads: int
    steps: int  # positions per run, prompt included
    repeats: int
    tok_per_s: float  # best of the runs
    load_ms: float  # Model.load: map the checkpoint, check its header, read the tokenizer
    weights_bytes: int
    bytes_per_token: int
    gb_per_s: float  # bytes_per_token * tok_per_s / 1e9
    memory_bytes: int  # the attention plugin's ledger at the end of the last run
    prompt_tokens: int = 0  # positions of the prompt-processing runs
    prompt_tok_per_s: float = 0.0  # best of the runs
    tok_per_s_runs: list[float] = field(default_factory=list)
    prompt_tok_per_s_runs: list[float] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out = asdict(self)
        del out["notices"]
        return out


def run_bench(
    checkpoint: str | os.PathLike,
    tokenizer: str | os.PathLike | None = None,
    steps: int = 256,
    threads: int = 0,
    attention: str | PluginSpec = "causal",
    repeats: int = 3,
    prompt_tokens: int = PROMPT_TOKENS,
) -> BenchResult:
    """Load ``checkpoint``; time ``repeats`` greedy generations of ``steps`` positions and ``repeats``
    prompt passes of ``prompt_tokens`` positions. ``attention`` is resolved once, before the model loads."""
    if repeats < 1:
        raise InputError(f"repeats {repeats}: need at least one run")
    spec = resolve_spec(attention)
    t0 = time.perf_counter()
    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads)
    load_ms = (time.perf_counter() - t0) * 1e3
    prompt: str | list[int] = PROMPT if model.tokenizer is not None else [BOS]
    runs: list[float] = []
    for _ in range(repeats):
        out = model.generate(prompt, steps=steps, temperature=0.0, attention=spec, ignore_eos=True)
        runs.append(out.tok_per_s)
    best = max(runs)
    prompt_runs, n_prompt = _prompt_runs(model, spec, prompt_tokens, repeats)
    per_token = bytes_per_token(model.weights)
    return BenchResult(
        checkpoint=os.fspath(checkpoint),
        attention=spec.canonical,
        threads=model.threads,
        steps=out.steps,
        repeats=repeats,
        tok_per_s=best,
        load_ms=load_ms,
        weights_bytes=weights_bytes(model.weights),
        bytes_per_token=per_token,
        gb_per_s=per_token * best / 1e9,
        memory_bytes=out.memory_bytes,
        tok_per_s_runs=runs,
        prompt_tokens=n_prompt,
        prompt_tok_per_s=max(prompt_runs),
        prompt_tok_per_s_runs=prompt_runs,
        notices=out.notices,
    )


def _prompt_runs(model, attention: PluginSpec, n_tokens: int, repeats: int) -> tuple[list[float], int]:
    """Prompt tok/s of ``repeats`` block passes over ``n_tokens`` seeded random ids (clamped to the plugin),
    after one untimed pass: as llama-bench, whose timed runs follow a warm-up and find the cache
    memory already touched (a new engine's buffers are mapped on first use, which the first pass of
    the 110M shape paid for at 512 positions)."""
    engine = model.engine(attention)
    n = max(1, min(n_tokens, engine.max_positions))
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, size=n, dtype=np.int32)
    engine.forward_block(tokens, 0)  # the warm-up
    runs = []
    for _ in range(repeats):
        engine.reset()
        t0 = time.perf_counter()
        engine.forward_block(tokens, 0)
        runs.append(n / (time.perf_counter() - t0))
    return runs, n
