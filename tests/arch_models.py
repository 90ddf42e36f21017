"""The tiny random-weight ``qwen3`` and Llama-3-scaled ``llama`` models of ``shared/models/arch``, in
their F32 originals, rebuilt byte for byte from the recipe of that folder's README (seeded numpy,
gguf-py's writer, every ``tokenizer.*`` key copied from a shared vocabulary file). Only their Q4_K_M
quantisations are shared; llama.cpp's eval-callback sums were taken on these originals.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
ARCH = MODELS / "arch"


@dataclass(frozen=True)
class TinyModel:
    arch: str
    name: str  # general.name
    seed: int
    vocab_file: str  # in shared/models/vocab: where the tokenizer keys come from
    rope_base: float
    eps: float
    head_dim: int
    qk_norm: bool  # attn_q_norm / attn_k_norm
    llama3_rope: bool  # rope_freqs (factor 8, low 1, high 4, original context 8192)
    tied: bool
    bytes: int
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}-f32.gguf"


TINY = {
    "qwen3": TinyModel(
        "qwen3",
        "tiny-qwen3",
        20240611,
        "ggml-vocab-qwen2.gguf",
        1_000_000.0,
        1e-6,
        64,
        True,
        False,
        True,
        175_418_528,
        "674261dc164e97a21e7e91960aa2566d6f067ecedc6274f1eda12814336fe5a0",
    ),
    "llama3rope": TinyModel(
        "llama",
        "tiny-llama3rope",
        20240612,
        "ggml-vocab-llama-spm.gguf",
        500_000.0,
        1e-5,
        32,
        False,
        True,
        False,
        77_543_712,
        "33c4df1704c06a914b05442cc43ba8036ff001eb88204778b4ae1aad10aadd40",
    ),
}
DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, CONTEXT = 256, 704, 4, 8, 2, 4096


def llama3_rope_factors(
    head_dim: int, base: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0, original: int = 8192
) -> np.ndarray:
    """``convert_hf_to_gguf.py``'s rope_freqs for ``rope_scaling = {rope_type: llama3, ...}``, in float32."""
    freqs = 1.0 / np.float32(base) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))
    out = []
    for freq in freqs.astype(np.float32):
        wavelen = 2 * np.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _tensors(spec: TinyModel, vocab: int) -> dict[str, np.ndarray]:
    """Every tensor in file order, drawn in that order from one seeded generator."""
    rng = np.random.default_rng(spec.seed)
    q_dim, kv_dim = HEADS * spec.head_dim, KV_HEADS * spec.head_dim

    def matrix(rows: int, cols: int, std: float = 0.06) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)

    def norm(n: int) -> np.ndarray:
        return np.float32(1) + rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)

    out = {"token_embd.weight": matrix(vocab, DIM)}
    if spec.llama3_rope:
        out["rope_freqs.weight"] = llama3_rope_factors(spec.head_dim, spec.rope_base)
    for i in range(LAYERS):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = norm(DIM)
        out[p + "attn_q.weight"] = matrix(q_dim, DIM, 0.1)
        out[p + "attn_k.weight"] = matrix(kv_dim, DIM, 0.1)
        out[p + "attn_v.weight"] = matrix(kv_dim, DIM)
        if spec.qk_norm:
            out[p + "attn_q_norm.weight"] = norm(spec.head_dim)
            out[p + "attn_k_norm.weight"] = norm(spec.head_dim)
        out[p + "attn_output.weight"] = matrix(DIM, q_dim)
        out[p + "ffn_norm.weight"] = norm(DIM)
        out[p + "ffn_gate.weight"] = matrix(HIDDEN, DIM)
        out[p + "ffn_up.weight"] = matrix(HIDDEN, DIM)
        out[p + "ffn_down.weight"] = matrix(DIM, HIDDEN)
    out["output_norm.weight"] = norm(DIM)
    if not spec.tied:
        out["output.weight"] = matrix(vocab, DIM)
    return out


def write_tiny_f32(kind: str, path: Path) -> Path:
    """Write the F32 original of ``TINY[kind]`` to ``path``."""
    spec = TINY[kind]
    vocab_reader = gguf.GGUFReader(MODELS / "vocab" / spec.vocab_file)
    vocab = len(vocab_reader.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(path, spec.arch)
    w.add_name(spec.name)
    w.add_file_type(0)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    if spec.arch == "qwen3":
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(spec.eps)
    w.add_rope_dimension_count(spec.head_dim)
    for field in vocab_reader.fields.values():
        if field.name.startswith("tokenizer."):
            value_type = gguf.GGUFValueType(field.types[0])
            sub_type = gguf.GGUFValueType(field.types[-1]) if value_type == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    w.add_vocab_size(vocab)
    for name, array in _tensors(spec, vocab).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
