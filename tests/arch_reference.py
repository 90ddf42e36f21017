"""An independent numpy forward pass of the GGUF architectures ``llama`` (with Llama 3's
``rope_freqs``), ``qwen3`` and ``gemma3``: what the engine's forward for them is tested against.

Written from llama.cpp's graphs at 0c1e570 (``src/models/llama.cpp``, ``qwen3.cpp``, ``gemma3.cpp``
and ``llm_graph_context``'s ``build_norm``, ``build_ffn``, ``build_attn`` in ``src/llama-graph.cpp``),
not from pyllama: the file is read by ``gguf_file`` (a small reader written from the GGUF spec) and
every matrix dequantised by gguf-py's ``gguf.quants.dequantize``. The hyperparameters are read here
as llama.cpp's loader reads them (``src/llama-model.cpp``: defaults for absent keys; Gemma 3's
sliding-window layers from ``attention.sliding_window`` and ``sliding_window_pattern``, default one
global layer in six, and their RoPE base ``rope.freq_base_swa``, default 10,000).

Arithmetic: ggml's. Activations are float32 and every op rounds its result to float32 where ggml
does (products and dot products are summed in float64 first, which ggml does in float32 lanes:
the difference is that rounding, ~1e-7). This matters more than it seems: a product with a
quantised matrix first quantises its input to the matrix's activation type (Q8_0 for
Q4_0/Q5_0/Q8_0, Q8_K for the K-quants, F16 for F16; ``quant_reference``), and Gemma 3's
embeddings (Q8_0 values times sqrtf(640)) put inputs exactly on Q8_0 rounding ties, where a
float64 RMSNorm rounds the other way and moves a product by 1e-3. RMSNorm sums its squares in
float64 and scales in float32 (``ggml_compute_forward_rms_norm_f32``); Gemma's GELU goes through
ggml's fp16 table (``ggml_vec_geglu_f32``); RoPE angles are built as ``ggml_rope_cache_init`` builds
them, in float32 (theta_scale = base^(-2/n_rot), each angle divided by its frequency factor); the
embedding scale sqrtf(n_embd) and the attention scale 1/sqrtf(key length) are float32 numbers.

``reference_forward(path_or_model, tokens)`` runs all positions as one batch (as one
``llama_decode``) and returns the logits of every position and ``{tensor name: sum}`` in
llama.cpp's eval-callback names, with its semantics: a name that several ops carry holds the last
one's sum (``Qcur-N`` is the RoPE output, ``norm-N`` the FFN pre-norm, ``norm`` the final RMSNorm),
and the last layer after attention, the final norm and the logits cover the last position only.
Names that match llama.cpp's eval-callback names: ``embd``, ``inp_scaled`` (gemma3), and per layer N
``norm-N``, ``attn_norm-N``, ``Qcur-N``, ``Kcur-N``, ``Vcur-N``, ``Qcur_normed-N``, ``Kcur_normed-N``
(qwen3, gemma3), ``kq-N``, ``kq_soft_max-N``, ``kqv-N``, ``kqv_out-N``, ``attn_out-N`` (llama only:
qwen3 and gemma3 leave Wo's output unnamed, ``node_<id>`` in a gemma3 log), ``ffn_inp-N`` (llama,
qwen3), ``attn_post_norm-N``, ``sa_out-N``, ``ffn_post_norm-N`` (gemma3), ``ffn_norm-N``,
``ffn_gate-N``, ``ffn_up-N``, ``ffn_swiglu-N`` / ``ffn_geglu-N``, ``ffn_out-N``, ``l_out-N``, and
``norm``, ``result_norm``, ``result_output``. ``Qcur_scaled-N`` (gemma3's ``ggml_scale`` of the
query, also a ``node_<id>``) is this module's name. The ``kq-N`` sum covers every pair of positions,
the future ones included (llama.cpp masks after the product), over llama.cpp's zero-filled cells.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf_file import GGUFFile
from quant_reference import ACTIVATION, QUANTIZERS, reference_product, split_weights

GEMMA3_SWA_PATTERN = 6
GEMMA3_SWA_BASE = 10000.0
OUTPUT_CHUNK = 1 << 15  # vocabulary rows dequantised at a time for the logits


@dataclass
class ReferenceModel:
    """A GGUF model's hyperparameters, as llama.cpp derives them, and its tensors as stored."""

    path: Path
    arch: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_rot: int
    eps: float
    neox: bool  # RoPE pairs (i, i + n_rot/2); else (2i, 2i+1)
    windows: list[int]  # per layer; 0: global
    rope_bases: list[float]  # per layer
    freq_factors: np.ndarray | None  # float32[n_rot / 2]
    embedding_scale: float  # 1.0: none
    query_scale: float  # gemma3: Q is scaled before the product (kq_scale 1); 0: scores scaled instead
    kq_scale: float
    logit_softcap: float
    gelu: bool  # GeGLU (gemma3), else SwiGLU
    tensors: dict  # name -> gguf_file.StoredTensor

    @property
    def vocab_size(self) -> int:
        return int(self.tensors["token_embd.weight"].shape[1])


def _f32(x: float) -> float:
    return float(np.float32(x))


def _inv_sqrtf(n: int) -> float:
    return float(np.float32(1) / np.sqrt(np.float32(n)))


def load_reference(path: str | os.PathLike) -> ReferenceModel:
    """Read ``path``'s hyperparameters and tensors (llama.cpp's defaults for absent keys)."""
    reader = GGUFFile(path)
    arch = reader.fields["general.architecture"]

    def key(name: str, default=None):
        return reader.fields.get(f"{arch}.{name}", default)

    dim, n_layers, n_heads = key("embedding_length"), key("block_count"), key("attention.head_count")
    head_dim = key("attention.key_length", dim // n_heads)
    tensors = reader.tensors
    rope_base = _f32(key("rope.freq_base", 10000.0))
    windows, bases = [0] * n_layers, [rope_base] * n_layers
    window = key("attention.sliding_window", 0) if arch == "gemma3" else 0
    if window:
        pattern = key("attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
        local = (
            [bool(v) for v in pattern]
            if isinstance(pattern, list)
            else [pattern == 0 or i % pattern < pattern - 1 for i in range(n_layers)]
        )
        swa_base = _f32(key("rope.freq_base_swa", GEMMA3_SWA_BASE))
        windows = [window if loc else 0 for loc in local]
        bases = [swa_base if loc else rope_base for loc in local]
    factors = tensors.get("rope_freqs.weight") if arch == "llama" else None
    gemma = arch == "gemma3"
    query_scale = 0.0
    if gemma:  # Gemma 3 27B (62 layers) scales by n_embd / n_head, the others by the key length
        query_scale = _inv_sqrtf(dim // n_heads) if n_layers == 62 else _inv_sqrtf(head_dim)
    return ReferenceModel(
        path=Path(path),
        arch=arch,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=key("attention.head_count_kv", n_heads),
        head_dim=head_dim,
        n_rot=key("rope.dimension_count", head_dim),
        eps=key("attention.layer_norm_rms_epsilon"),
        neox=arch in ("qwen2", "qwen3", "gemma3"),
        windows=windows,
        rope_bases=bases,
        freq_factors=None if factors is None else np.asarray(factors.data, dtype=np.float32).copy(),
        embedding_scale=float(np.sqrt(np.float32(dim))) if gemma else 1.0,
        query_scale=query_scale,
        kq_scale=1.0 if gemma else _inv_sqrtf(head_dim),
        logit_softcap=_f32(key("final_logit_softcapping", 0.0)) if gemma else 0.0,
        gelu=gemma,
        tensors=tensors,
    )


# ---- the operations, as ggml computes them -----------------------------------------------------------

F32 = np.float32


def _raw_rows(t) -> np.ndarray:
    """A stored matrix's bytes (or values), one row per output."""
    return np.asarray(t.data).reshape(int(np.prod(t.shape[1:])), -1)


def dequantize_rows(t, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
    """float32 values of rows of a stored matrix, (rows, cols): gguf-py's dequantiser (exact)."""
    raw = _raw_rows(t)[rows]
    if t.tensor_type in (GT.F32, GT.F16):
        return raw.astype(F32)
    return gguf.quants.dequantize(np.ascontiguousarray(raw, dtype=np.uint8), t.tensor_type).astype(F32)


def _activation(t, x: np.ndarray) -> np.ndarray:
    """``x`` (n, cols) as ggml hands it to the product with ``t``, as float64: quantised to the
    matrix's activation type and dequantised (exact), or x itself for F32."""
    if t.tensor_type == GT.F32:
        return x.astype(np.float64)
    if t.tensor_type == GT.F16:
        return x.astype(np.float16).astype(np.float64)
    q, d, _ = QUANTIZERS[ACTIVATION[t.tensor_type]](x.reshape(-1))
    block = 256 if ACTIVATION[t.tensor_type] == "Q8_K" else 32
    return (q.astype(np.float64) * np.repeat(d.astype(np.float64), block)).reshape(x.shape)


def matmul(t, x: np.ndarray, quantize: bool = True) -> np.ndarray:
    """``x @ W.T`` for a stored matrix W (rows = outputs), as llama.cpp's MUL_MAT computes it."""
    if quantize and ACTIVATION.get(t.tensor_type) == "Q8_1":  # the offset meets the activation's own sum
        raw = np.ascontiguousarray(_raw_rows(t), dtype=np.uint8)
        split = split_weights(raw, t.tensor_type)
        return np.stack([reference_product(raw, t.tensor_type, row, split)[0] for row in x]).astype(F32)
    xq = _activation(t, x) if quantize else x.astype(np.float64)
    rows = _raw_rows(t).shape[0]
    out = np.empty((x.shape[0], rows), F32)
    for start in range(0, rows, OUTPUT_CHUNK):
        part = slice(start, min(start + OUTPUT_CHUNK, rows))
        out[:, part] = xq @ dequantize_rows(t, part).astype(np.float64).T
    return out


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm over the last axis: squares summed in float64, the scale in float32 (the
    weight is a separate MUL)."""
    mean = (np.sum((x * x).astype(np.float64), axis=-1, keepdims=True) / x.shape[-1]).astype(F32)
    scale = F32(1) / np.sqrt(mean + F32(eps))
    return x * scale


def _gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: for every fp16 value, ggml_gelu_f32 of it in float32, rounded to fp16."""
    f = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
    a, c = F32(0.044715), F32(0.79788456080286535587989211986876)
    with np.errstate(over="ignore", invalid="ignore"):
        g = F32(0.5) * f * (F32(1) + np.tanh(c * f * (F32(1) + a * f * f)))
    return g.astype(np.float16).astype(F32)


_GELU = _gelu_table()


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """ggml_vec_geglu_f32 with GGML_GELU_FP16: 0 below -10, the identity above 10, the table between."""
    table = _GELU[gate.astype(np.float16).view(np.uint16)]
    return np.where(gate <= -10, F32(0), np.where(gate >= 10, gate, table)) * up


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(F32)


def rope_angles(n_rot: int, base: float, positions: np.ndarray, factors: np.ndarray | None) -> np.ndarray:
    """(n, n_rot/2) float32 angles as ggml_rope_cache_init makes them: theta_0 = p, theta_{i+1} =
    theta_i * base^(-2/n_rot), each divided by its frequency factor (freq_scale 1, no YaRN)."""
    theta_scale = np.power(F32(base), F32(-2.0) / F32(n_rot), dtype=F32)
    ff = np.ones(n_rot // 2, F32) if factors is None else factors.astype(F32)
    theta = positions.astype(F32)
    out = np.empty((len(positions), n_rot // 2), F32)
    for i in range(n_rot // 2):
        out[:, i] = theta / ff[i]
        theta = theta * theta_scale
    return out


def rope(x: np.ndarray, angles: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """RoPE of (n, heads, head_dim) by (n, n_rot/2) angles; dims from n_rot on pass through."""
    out = x.copy()
    half = n_rot // 2
    lo, hi = (np.arange(half), np.arange(half) + half) if neox else (np.arange(0, n_rot, 2), np.arange(1, n_rot, 2))
    c, s = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[:, :, lo], x[:, :, hi]
    out[:, :, lo], out[:, :, hi] = a * c - b * s, a * s + b * c
    return out


def attention_mask(positions: np.ndarray, sequences: np.ndarray, window: int) -> np.ndarray:
    """(n, n) additive mask: a token attends the tokens of its own sequence at its position or
    before, and on a sliding-window layer only those with p - p0 < window (llama.cpp's
    LLAMA_SWA_TYPE_STANDARD)."""
    p1, p0 = positions[:, None], positions[None, :]
    masked = (sequences[:, None] != sequences[None, :]) | (p0 > p1) | ((window > 0) & (p1 - p0 >= window))
    return np.where(masked, -np.inf, 0.0)


# ---- the forward pass ------------------------------------------------------------------------------------


class _Sums(dict):
    """``{name: sum}`` with eval-callback semantics: a later op of the same name replaces the sum."""

    def __init__(self, tensors: dict | None = None) -> None:
        super().__init__()
        self.rows = slice(None)  # the positions the current tensors cover in llama.cpp's graph
        self.tensors = tensors  # when given: {name: the tensor itself}, for comparisons value by value

    def __call__(self, name: str, x: np.ndarray, rows: slice | None = None) -> np.ndarray:
        covered = x[self.rows if rows is None else rows]
        self[name] = float(np.sum(covered, dtype=np.float64))
        if self.tensors is not None:
            self.tensors[name] = covered
        return x


def _vector(t, name: str) -> np.ndarray:
    return np.asarray(t[name].data, dtype=F32)


def _attention(m: ReferenceModel, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask, rec: _Sums):
    """softmax(scale * q.k + mask) . v per query head; q (n, heads, hd), k/v (n, kv_heads, hd)."""
    n, group = q.shape[0], m.n_heads // m.n_kv_heads
    kh = np.repeat(k, group, axis=1).astype(np.float64)  # query head h reads KV head h // group
    vh = np.repeat(v, group, axis=1).astype(np.float64)
    kq = np.einsum("thd,chd->htc", q.astype(np.float64), kh).astype(F32)  # llama.cpp masks after the product
    rec(f"kq-{layer}", kq, rows=slice(None))
    scores = (kq * F32(m.kq_scale)).astype(np.float64) + mask[None]
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = (weights / weights.sum(axis=-1, keepdims=True)).astype(F32)
    rec(f"kq_soft_max-{layer}", weights, rows=slice(None))
    out = np.einsum("htc,chd->thd", weights.astype(np.float64), vh).astype(F32)
    rec(f"kqv-{layer}", out, rows=slice(None))
    return rec(f"kqv_out-{layer}", out.reshape(n, -1), rows=slice(None))


def _qkv(m: ReferenceModel, layer: int, h: np.ndarray, positions: np.ndarray, quantize: bool, rec: _Sums):
    """Q, K, V of layer ``layer`` from the normed input: projections (+ biases), QK-norm, RoPE."""
    t, p, n = m.tensors, f"blk.{layer}.", h.shape[0]
    angles = rope_angles(m.n_rot, m.rope_bases[layer], positions, m.freq_factors)
    out = {}
    for kind, heads in (("q", m.n_heads), ("k", m.n_kv_heads), ("v", m.n_kv_heads)):
        x = matmul(t[p + f"attn_{kind}.weight"], h, quantize)
        if p + f"attn_{kind}.bias" in t:
            x = x + _vector(t, p + f"attn_{kind}.bias")
        name = f"{kind.upper()}cur-{layer}"
        x = rec(name, x.reshape(n, heads, m.head_dim))
        if kind != "v":
            if p + f"attn_{kind}_norm.weight" in t:
                x = rec(f"norm-{layer}", rms_norm(x, m.eps)) * _vector(t, p + f"attn_{kind}_norm.weight")
                rec(f"{kind.upper()}cur_normed-{layer}", x)
            x = rec(name, rope(x, angles, m.n_rot, m.neox))
        out[kind] = x
    if m.query_scale:
        out["q"] = rec(f"Qcur_scaled-{layer}", out["q"] * F32(m.query_scale))
    return out["q"], out["k"], out["v"]


def _layer(m: ReferenceModel, layer: int, x: np.ndarray, batch: tuple, quantize: bool, rec: _Sums):
    t, p = m.tensors, f"blk.{layer}."
    positions, sequences = batch

    def norm(y: np.ndarray, weight: str, name: str, norm_name: str | None = None) -> np.ndarray:
        y = rec(norm_name or f"norm-{layer}", rms_norm(y, m.eps))
        return rec(name, y * _vector(t, p + weight))

    h = norm(x, "attn_norm.weight", f"attn_norm-{layer}")
    q, k, v = _qkv(m, layer, h, positions, quantize, rec)
    attn = _attention(m, layer, q, k, v, attention_mask(positions, sequences, m.windows[layer]), rec)
    attn = rec(f"attn_out-{layer}", matmul(t[p + "attn_output.weight"], attn, quantize))
    if layer == m.n_layers - 1:
        rec.rows = slice(x.shape[0] - 1, None)  # llama.cpp's inp_out_ids: the last layer goes on with the last row
    if m.gelu:  # gemma3's sandwich: post-attention norm, residual, pre-FFN norm ... post-FFN norm, residual
        residual = rec(f"sa_out-{layer}", norm(attn, "post_attention_norm.weight", f"attn_post_norm-{layer}") + x)
    else:
        residual = rec(f"ffn_inp-{layer}", attn + x)
    h = norm(residual, "ffn_norm.weight", f"ffn_norm-{layer}")
    gate = rec(f"ffn_gate-{layer}", matmul(t[p + "ffn_gate.weight"], h, quantize))
    up = rec(f"ffn_up-{layer}", matmul(t[p + "ffn_up.weight"], h, quantize))
    act = rec(f"ffn_geglu-{layer}", geglu(gate, up)) if m.gelu else rec(f"ffn_swiglu-{layer}", swiglu(gate, up))
    ffn = rec(f"ffn_out-{layer}", matmul(t[p + "ffn_down.weight"], act, quantize))
    if m.gelu:
        ffn = norm(ffn, "post_ffw_norm.weight", f"ffn_post_norm-{layer}", norm_name="norm")
    return rec(f"l_out-{layer}", ffn + residual)


def reference_forward(
    path_or_model: str | os.PathLike | ReferenceModel,
    tokens: list[int],
    quantize_activations: bool = True,
    tensors: dict | None = None,
    sequence_ids: list[int] | None = None,
    last_only: bool = False,
) -> tuple[np.ndarray, dict[str, float]]:
    """Logits float32[n, vocab] of every position of ``tokens`` (one batch from position 0) and the
    eval-callback sums of llama.cpp's graph for that batch (see the module docstring).
    ``quantize_activations``: quantise each product's input as ggml does (only matters for
    quantised matrices; F32 matrices take float inputs either way). ``tensors``: a dict that
    receives each named tensor (the rows its sum covers), for value-by-value comparisons.
    ``sequence_ids``: one per token, to run several sequences as one batch (llama.cpp's seq_id):
    a token attends its own sequence only, at positions counted from that sequence's start.
    ``last_only``: the logits of the last position alone (float32[1, vocab]), as llama.cpp computes
    them for a prompt; the rest of a long sequence's logits would not fit in memory."""
    m = path_or_model if isinstance(path_or_model, ReferenceModel) else load_reference(path_or_model)
    t, n = m.tensors, len(tokens)
    sequences = np.zeros(n, np.int64) if sequence_ids is None else np.asarray(sequence_ids)
    positions = np.array([np.count_nonzero(sequences[:i] == sequences[i]) for i in range(n)])
    rec = _Sums(tensors)
    x = rec("embd", dequantize_rows(t["token_embd.weight"], np.asarray(tokens)))
    if m.embedding_scale != 1.0:
        x = rec("inp_scaled", x * F32(m.embedding_scale))
    for layer in range(m.n_layers):
        x = _layer(m, layer, x, (positions, sequences), quantize_activations, rec)
    if last_only:
        x = x[-1:]
        rec.rows = slice(None)
    h = rec("result_norm", rec("norm", rms_norm(x, m.eps)) * _vector(t, "output_norm.weight"))
    output = t.get("output.weight", t["token_embd.weight"])  # tied: the embedding is the classifier
    logits = matmul(output, h, quantize_activations)
    if m.logit_softcap:
        c = F32(m.logit_softcap)
        logits = (np.tanh(logits / c) * c).astype(F32)
    rec("result_output", logits)
    return logits, dict(rec)


def teacher_forced_logits(path_or_model: str | os.PathLike | ReferenceModel, sequences: list[list[int]]) -> list:
    """The logits of every position of each sequence, all run as one batch (each weight is
    dequantised once): ``reference_forward``'s logits, split by sequence."""
    tokens = [token for sequence in sequences for token in sequence]
    ids = [i for i, sequence in enumerate(sequences) for _ in sequence]
    logits, _ = reference_forward(path_or_model, tokens, sequence_ids=ids)
    return np.split(logits, np.cumsum([len(sequence) for sequence in sequences])[:-1])
