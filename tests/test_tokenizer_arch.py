"""The vocabularies of the newer architectures, tokenised as llama.cpp 0c1e570 tokenises them:
Gemma 3's 262,144-token SentencePiece vocabulary (no space prefix, byte fallback, control tokens
such as ``<start_of_turn>`` parsed in the text, ``</s>`` promoted to an end-of-generation control
token), and the tiny qwen3 / Llama-3-scaled llama models, which carry the qwen2 BPE and the llama
SentencePiece vocabularies. Expected ids are llama.cpp's (``llama-tokenize``, ``llama-server``);
the end-of-generation sets are the ones llama.cpp prints when it loads each file ("printing all EOG
tokens").
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import read_jsonl, shared_file

from pyllama.checkpoint import read_checkpoint
from pyllama.checkpoint.gguf_meta import read_metadata_file
from pyllama.tokenizer import tokenizer_from_records
from pyllama.tokenizer.gguf_vocab import TokenAttr

GEMMA3_EOG = {1, 106, 212}  # <eos>, <end_of_turn>, </s>


@pytest.fixture(scope="module")
def gemma3_tokenizer(gemma3):
    return tokenizer_from_records(read_metadata_file(gemma3).metadata, gemma3.name)


def test_gemma3_vectors(gemma3_tokenizer):
    rows = [json.loads(line) for line in shared_file("vocab/gemma3-vectors.jsonl").read_text().splitlines()]
    assert len(rows) == 80
    for row in rows:
        assert gemma3_tokenizer.encode(row["text"], bos=row["add_bos"]) == row["ids"], row["text"]


def test_gemma3_prompts(gemma3_tokenizer):
    for row in read_jsonl("reference-gemma3.jsonl"):
        assert gemma3_tokenizer.encode(row["prompt"]) == row["prompt_ids"]


def test_gemma3_special_tokens(gemma3_tokenizer):
    tok = gemma3_tokenizer
    assert tok.eog_ids == GEMMA3_EOG and tok.stop_ids == GEMMA3_EOG and tok.bos_id == 2 and tok.eos_id == 1
    assert not tok.vocab.add_space_prefix and tok.vocab.add_bos
    # "</s>" was text in the file; llama.cpp makes it a control token, parsed as one in a prompt
    assert tok.encode("a</s>b", bos=False) == [236746, 212, 236763]
    assert tok.attrs[212] & TokenAttr.CONTROL and tok.piece_bytes(212) == b""
    # control tokens whose text says "unused" are marked so (llama.cpp counts 6,242)
    assert sum(1 for a in tok.vocab.attrs if a & TokenAttr.UNUSED) == 6242
    assert tok.attrs[6] & TokenAttr.UNUSED and tok.encode("<unused0>", bos=False) == [6]


def test_gemma3_decodes_text_back(gemma3_tokenizer):
    """Without a leading-space prefix nothing is stripped after BOS: plain text comes back whole."""
    rows = [json.loads(line) for line in shared_file("vocab/gemma3-vectors.jsonl").read_text().splitlines()]
    plain = [row for row in rows if row["add_bos"] and "<" not in row["text"]]
    assert len(plain) > 25
    for row in plain:
        assert gemma3_tokenizer.decode(row["ids"]) == row["text"]


def test_gemma3_vocabulary_loads_fast(gemma3):
    """Parse and tokenizer well under a second of CPU (measured ~0.2 s; llama.cpp's vocabulary load
    of the same file takes 0.3-0.6 s)."""
    start = time.process_time()
    parsed = read_checkpoint(gemma3)
    tokenizer_from_records(parsed.records, gemma3.name, parsed.config.vocab_size)
    assert time.process_time() - start < 1.0


@pytest.mark.parametrize(
    "name,eog",
    [
        ("tiny-qwen3-q4_k_m.gguf", {128247, 151643, 151645}),  # </s> (text promoted), <|endoftext|>, <|im_end|>
        ("tiny-llama3rope-q4_k_m.gguf", {2}),
    ],
)
def test_tiny_arch_vocabularies(name, eog):
    tok = tokenizer_from_records(read_metadata_file(shared_file(f"arch/{name}")).metadata, name)
    assert tok.eog_ids == eog
    rows = [row for row in read_jsonl("arch/reference-arch.jsonl") if row["model"] == name]
    assert len(rows) == 8
    for row in rows:
        assert tok.encode(row["prompt"]) == row["prompt_ids"]


@pytest.mark.parametrize(
    "name,eog",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", {0, 2, 4}),  # <|endoftext|>, <|im_end|>, <reponame> (FIM repo)
        ("vocab/ggml-vocab-qwen2.gguf", {128247, 151643, 151645}),
        ("vocab/ggml-vocab-gpt-2.gguf", {50256}),
        ("stories260K-f32.gguf", {2}),
    ],
)
def test_end_of_generation_sets_are_llama_cpps(name, eog):
    tok = tokenizer_from_records(read_metadata_file(shared_file(name)).metadata, name)
    assert tok.eog_ids == eog
