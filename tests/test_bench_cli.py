"""pyllama bench: the figures are present and consistent with the checkpoint (timings are never asserted)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.bench import bytes_per_token
from pyllama.checkpoint import load_checkpoint
from pyllama.cli import main

FIELDS = {
    "checkpoint",
    "attention",
    "threads",
    "steps",
    "repeats",
    "tok_per_s",
    "load_ms",
    "weights_bytes",
    "bytes_per_token",
    "gb_per_s",
    "memory_bytes",
    "tok_per_s_runs",
    "prompt_tokens",
    "prompt_tok_per_s",
    "prompt_tok_per_s_runs",
}


def header(path: Path) -> tuple[int, ...]:
    return struct.unpack("<7i", path.read_bytes()[:28])


def matrix_floats(dims: tuple[int, ...]) -> tuple[int, int, int]:
    """(floats of the layer matrices, of one vocab x dim table, of the RoPE tables) from a llama2.c header."""
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = dims
    hs = dim // n_heads
    layers = n_layers * (2 * dim * dim + 2 * dim * n_kv * hs + 3 * dim * hidden)
    return layers, abs(vocab) * dim, seq * hs


def bench_json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_bench_json_on_stories260k():
    ckpt, tok = shared_file("stories260K.bin"), shared_file("tok512.bin")
    out = bench_json("-c", str(ckpt), "-z", str(tok), "--steps", "16", "--repeats", "2", "--threads", "1")
    assert set(out) == FIELDS
    dims = header(ckpt)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = dims
    layers, table, rope = matrix_floats(dims)
    assert vocab > 0  # shared classifier: the embedding is the classifier, streamed once per token
    assert out["bytes_per_token"] == 4 * (layers + table) == 1_037_312
    norms = 4 * (2 * n_layers + 1) * dim
    assert out["weights_bytes"] == 4 * (layers + table) + norms == ckpt.stat().st_size - 28 - 4 * rope
    assert len(out["tok_per_s_runs"]) == 2 and out["tok_per_s"] == max(out["tok_per_s_runs"]) > 0
    assert out["gb_per_s"] == pytest.approx(out["bytes_per_token"] * out["tok_per_s"] / 1e9, rel=1e-12)
    assert out["load_ms"] > 0
    # prompt processing: the model's whole context of 512 positions (llama-bench's pp512), best of the runs
    assert out["prompt_tokens"] == seq == 512
    assert len(out["prompt_tok_per_s_runs"]) == 2 and out["prompt_tok_per_s"] == max(out["prompt_tok_per_s_runs"]) > 0
    assert (out["steps"], out["repeats"], out["threads"], out["attention"]) == (16, 2, 1, "causal:positions=0")
    kv_dim = n_kv * (dim // n_heads)
    assert out["memory_bytes"] == 2 * n_layers * 16 * kv_dim * 4  # causal: K and V of all 16 positions


def test_bench_reports_the_plugin_memory():
    ckpt, tok = shared_file("stories260K.bin"), shared_file("tok512.bin")
    out = bench_json("-c", str(ckpt), "-z", str(tok), "--steps", "24", "--repeats", "1", "--attention", "sliding:8")
    dim, _, n_layers, n_heads, n_kv, _, _ = header(ckpt)
    assert out["attention"] == "sliding:window=8" and out["steps"] == 24  # the canonical spec
    assert out["memory_bytes"] == 2 * n_layers * 8 * n_kv * (dim // n_heads) * 4  # the window, not the sequence


def test_bench_unshared_classifier_counts_the_classifier_not_the_embedding(gqa_unshared):
    dims = header(gqa_unshared)
    assert dims[5] < 0  # negative vocab_size: a separate classifier follows the RoPE tables
    layers, table, rope = matrix_floats(dims)
    out = bench_json("-c", str(gqa_unshared), "--steps", "8", "--repeats", "1")  # no tokenizer: BOS as the prompt
    assert out["bytes_per_token"] == 4 * (layers + table)
    # stored: the embedding and the classifier (two tables), the layer matrices and the norms
    assert out["weights_bytes"] == gqa_unshared.stat().st_size - 28 - 4 * rope
    norms = 4 * (2 * dims[2] + 1) * dims[0]
    assert out["weights_bytes"] == 4 * (layers + 2 * table) + norms


def test_bytes_per_token_uses_stored_sizes_of_quantised_files():
    from gguf import GGUFReader

    path = shared_file("stories260K-q8_0.gguf")
    reader = GGUFReader(path)
    streamed = [t for t in reader.tensors if len(t.shape) == 2 and t.name != "token_embd.weight"]
    assert any(t.tensor_type.name == "Q8_0" for t in streamed)
    _, weights = load_checkpoint(path)
    assert bytes_per_token(weights) == sum(int(t.n_bytes) for t in streamed)


def test_bench_table_and_errors(tmp_path):
    ckpt, tok = shared_file("stories260K.bin"), shared_file("tok512.bin")
    result = CliRunner().invoke(main, ["bench", "-c", str(ckpt), "-z", str(tok), "--steps", "8", "--repeats", "1"])
    assert result.exit_code == 0, result.stderr
    labels = [line.split("  ")[0] for line in result.stdout.splitlines()]
    assert labels == [
        "checkpoint",
        "attention",
        "threads",
        "steps",
        "decode tok/s",
        "prompt tok/s",
        "load ms",
        "weights bytes",
        "bytes/token",
        "effective GB/s",
        "attention memory",
    ]
    assert "bytes/token       1,037,312" in result.stdout

    missing = CliRunner().invoke(main, ["bench", "-c", str(tmp_path / "nope.bin")])
    assert missing.exit_code != 0 and "Traceback" not in missing.output
    assert missing.stderr.strip() == f"error: {tmp_path / 'nope.bin'}: no such file"
