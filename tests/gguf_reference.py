"""GGUF test support: random-weight models written with gguf-py's ``GGUFWriter``, and an independent
float64 numpy forward pass that reads them with ``GGUFReader`` (not through pyllama's loader).

The reference follows llama.cpp's ``llama`` and ``qwen2`` graphs: RMSNorm, Q/K/V projections (+ bias
for qwen2), RoPE on ``n_rot`` dims of each head, pairs (2i, 2i+1) for ``llama`` and (i, i + n_rot/2)
for ``qwen2`` (NEOX), theta_i = pos / base^(2i / n_rot), grouped-query attention over a dense cache,
SwiGLU, and a tied classifier when the file has no ``output.weight``. Weights are dequantised with
numpy here (F16: ``astype``; Q8_0: d * qs per 32-block). With ``quantize_activations`` it also
applies llama.cpp's activation quantisation before every Q8_0 matmul (d = fp16(amax / 127),
q = round-half-even(x * 127 / amax)), and llama.cpp's products for the other block types
(``quant_reference.reference_product``: Q8_0/Q8_1/Q8_K activations, gguf-py's dequantizer), so what
remains between it and the engine is float32 rounding.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GT
from quant_reference import ACTIVATION, random_blocks, reference_product, split_weights

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"

TYPES = {
    "f32": GT.F32,
    "f16": GT.F16,
    "q8_0": GT.Q8_0,
    "bf16": GT.BF16,
    "q4_0": GT.Q4_0,
    "q4_1": GT.Q4_1,
    "q5_0": GT.Q5_0,
    "q5_1": GT.Q5_1,
    # gguf-py cannot quantise these: random blocks with small scales stand in (random_blocks)
    "iq4_nl": GT.IQ4_NL,
    "q2_k": GT.Q2_K,
    "q3_k": GT.Q3_K,
    "q4_k": GT.Q4_K,
    "q5_k": GT.Q5_K,
    "q6_k": GT.Q6_K,
}
RANDOM_BLOCK_TYPES = (GT.IQ4_NL, GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K)


def write_random_gguf(
    path: Path,
    arch: str = "llama",
    dim: int = 64,
    hidden_dim: int = 84,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    vocab: int = 96,
    context: int = 64,
    qtype: str = "f32",
    tied: bool = False,
    biases: bool | None = None,
    n_rot: int | None = None,
    rope_base: float | None = None,
    eps: float = 1e-5,
    seed: int = 0,
    with_vocab: bool = True,
    skip_keys: tuple[str, ...] = (),
    skip_tensors: tuple[str, ...] = (),
    extra_tensors: dict[str, np.ndarray] | None = None,
    tensor_types: dict[str, str] | None = None,
    extra_kv: dict[str, tuple[object, gguf.GGUFValueType]] | None = None,
    head_dim: int | None = None,
) -> Path:
    """A seeded random model. Matrices are stored as ``qtype`` (Q8_0 only where rows are whole
    32-value blocks, like llama-quantize), norms and biases as F32; ``tensor_types`` overrides per name;
    ``skip_keys``/``skip_tensors``/``extra_kv``/``extra_tensors`` make broken or unusual files."""
    rng = np.random.default_rng(seed)
    head_dim = head_dim or dim // n_heads  # another head size needs {arch}.attention.key_length in extra_kv
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    biases = (arch == "qwen2") if biases is None else biases
    w = gguf.GGUFWriter(path, arch)
    keys = {
        "context_length": (w.add_context_length, context),
        "embedding_length": (w.add_embedding_length, dim),
        "feed_forward_length": (w.add_feed_forward_length, hidden_dim),
        "block_count": (w.add_block_count, n_layers),
        "head_count": (w.add_head_count, n_heads),
        "head_count_kv": (w.add_head_count_kv, n_kv_heads),
        "layer_norm_rms_epsilon": (w.add_layer_norm_rms_eps, eps),
    }
    if n_rot is not None:
        keys["rope.dimension_count"] = (w.add_rope_dimension_count, n_rot)
    if rope_base is not None:
        keys["rope.freq_base"] = (w.add_rope_freq_base, rope_base)
    for key, (add, value) in keys.items():
        if key not in skip_keys:
            add(value)
    for key, (value, vtype) in (extra_kv or {}).items():
        w.add_key_value(key.format(arch=arch), value, vtype)
    if with_vocab:
        w.add_tokenizer_model("llama")
        w.add_token_list([f"tok{i}" for i in range(vocab)])
        w.add_token_scores([float(-i) for i in range(vocab)])
        w.add_token_types([1] * vocab)

    def matrix(rows: int, cols: int, scale: float = 0.15) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    tensors: dict[str, np.ndarray] = {"token_embd.weight": matrix(vocab, dim, 1.0)}
    tensors["output_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    if not tied:
        tensors["output.weight"] = matrix(vocab, dim, 0.2)
    for i in range(n_layers):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
        tensors[p + "attn_q.weight"] = matrix(q_dim, dim)
        tensors[p + "attn_k.weight"] = matrix(kv_dim, dim)
        tensors[p + "attn_v.weight"] = matrix(kv_dim, dim)
        if biases:
            tensors[p + "attn_q.bias"] = (0.3 * rng.standard_normal(q_dim)).astype(np.float32)
            tensors[p + "attn_k.bias"] = (0.3 * rng.standard_normal(kv_dim)).astype(np.float32)
            tensors[p + "attn_v.bias"] = (0.3 * rng.standard_normal(kv_dim)).astype(np.float32)
        tensors[p + "attn_output.weight"] = matrix(dim, q_dim)
        tensors[p + "ffn_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
        tensors[p + "ffn_gate.weight"] = matrix(hidden_dim, dim)
        tensors[p + "ffn_up.weight"] = matrix(hidden_dim, dim)
        tensors[p + "ffn_down.weight"] = matrix(dim, hidden_dim)
    tensors.update(extra_tensors or {})
    for name, array in tensors.items():
        if name in skip_tensors:
            continue
        want = TYPES[(tensor_types or {}).get(name, qtype if array.ndim == 2 else "f32")]
        if want not in (GT.F32, GT.F16, GT.BF16) and array.shape[-1] % gguf.GGML_QUANT_SIZES[want][0]:
            want = GT.F32  # like llama-quantize: a row that is not whole blocks stays float
        if want in RANDOM_BLOCK_TYPES:
            data = random_blocks(rng, want, array.shape[0], array.shape[1], scale=0.02 / array.shape[1] ** 0.5)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=want)
        elif want == GT.F32:
            w.add_tensor(name, array)
        else:
            data = gguf.quants.quantize(array, want)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=want)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantize(t) -> np.ndarray:
    """float64 values of a ``gguf.ReaderTensor`` in numpy order (rows, cols), dequantised here."""
    rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
    cols = int(t.shape[0])
    if t.tensor_type == GT.F32:
        out = np.asarray(t.data, dtype=np.float64)
    elif t.tensor_type == GT.F16:
        out = np.asarray(t.data).astype(np.float64)
    elif t.tensor_type == GT.Q8_0:
        blocks = np.asarray(t.data, dtype=np.uint8).reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float64)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)
        out = q * d
    else:  # the other block types and BF16: gguf-py's dequantizer
        out = gguf.quants.dequantize(np.asarray(t.data, dtype=np.uint8), t.tensor_type).astype(np.float64)
    return out.reshape(rows, cols) if len(t.shape) > 1 else out.reshape(cols)


def quantize_activation_q8_0(x: np.ndarray) -> np.ndarray:
    """llama.cpp's x86 activation quantisation (quantize_row_q8_0), dequantised again, in float32 steps."""
    xb = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[:, None])
    return (q * d[:, None]).reshape(-1)


class NumpyGGUF:
    """float64 forward pass of a GGUF ``llama`` / ``qwen2`` model, one token at a time."""

    def __init__(self, path: Path, quantize_activations: bool = False) -> None:
        r = gguf.GGUFReader(path)
        self.arch = r.fields["general.architecture"].contents()

        def key(name: str, default=None):
            f = r.fields.get(f"{self.arch}.{name}")
            return default if f is None else f.contents()

        self.dim = key("embedding_length")
        self.n_layers = key("block_count")
        self.n_heads = key("attention.head_count")
        self.n_kv = key("attention.head_count_kv", self.n_heads)
        self.hs = self.dim // self.n_heads
        self.n_rot = key("rope.dimension_count", self.hs)
        self.base = key("rope.freq_base", 10000.0)
        self.eps = key("attention.layer_norm_rms_epsilon")
        tensors = {t.name: t for t in r.tensors}
        self.w = {name: dequantize(t) for name, t in tensors.items()}
        self.q8 = {name for name, t in tensors.items() if t.tensor_type == GT.Q8_0}
        # the other block types: raw blocks, multiplied as llama.cpp does (quant_reference.reference_product)
        self.blocks = {}
        for name, t in tensors.items():
            if t.tensor_type in ACTIVATION and t.tensor_type != GT.Q8_0:
                raw = np.asarray(t.data, dtype=np.uint8).reshape(int(np.prod(t.shape[1:])), -1)
                self.blocks[name] = (raw, t.tensor_type, split_weights(raw, t.tensor_type))
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
            if "token_embd.weight" in self.q8:
                self.q8.add("output.weight")
            if "token_embd.weight" in self.blocks:
                self.blocks["output.weight"] = self.blocks["token_embd.weight"]
        self.quantize_activations = quantize_activations
        self.reset()

    def reset(self) -> None:
        self.k_cache = [[] for _ in range(self.n_layers)]
        self.v_cache = [[] for _ in range(self.n_layers)]

    def mm(self, name: str, x: np.ndarray) -> np.ndarray:
        if self.quantize_activations and name in self.blocks:
            raw, ggml_type, split = self.blocks[name]
            return reference_product(raw, ggml_type, x, split)[0]
        if self.quantize_activations and name in self.q8:
            x = quantize_activation_q8_0(x)
        return self.w[name] @ x

    def rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return weight * x / np.sqrt(np.mean(x * x) + self.eps)

    def rope(self, vec: np.ndarray, pos: int) -> np.ndarray:
        heads = vec.reshape(-1, self.hs).copy()
        half = self.n_rot // 2
        i = np.arange(half)
        theta = pos / self.base ** (2 * i / self.n_rot)
        c, s = np.cos(theta), np.sin(theta)
        if self.arch == "qwen2":  # NEOX: pairs (i, i + n_rot/2)
            a, b = heads[:, i].copy(), heads[:, i + half].copy()
            heads[:, i], heads[:, i + half] = a * c - b * s, a * s + b * c
        else:  # pairs (2i, 2i+1)
            a, b = heads[:, 2 * i].copy(), heads[:, 2 * i + 1].copy()
            heads[:, 2 * i], heads[:, 2 * i + 1] = a * c - b * s, a * s + b * c
        return heads.reshape(-1)

    def forward(self, token: int, pos: int) -> np.ndarray:
        w = self.w
        x = w["token_embd.weight"][token].copy()
        group = self.n_heads // self.n_kv
        for layer in range(self.n_layers):
            p = f"blk.{layer}."
            xb = self.rmsnorm(x, w[p + "attn_norm.weight"])
            q, k, v = (self.mm(p + f"attn_{n}.weight", xb) for n in "qkv")
            if p + "attn_q.bias" in w:
                q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
            q, k = self.rope(q, pos), self.rope(k, pos)
            self.k_cache[layer].append(k.reshape(self.n_kv, self.hs))
            self.v_cache[layer].append(v.reshape(self.n_kv, self.hs))
            keys, values = np.stack(self.k_cache[layer]), np.stack(self.v_cache[layer])
            out = np.empty((self.n_heads, self.hs))
            for h in range(self.n_heads):
                scores = keys[:, h // group, :] @ q.reshape(self.n_heads, self.hs)[h] / np.sqrt(self.hs)
                e = np.exp(scores - scores.max())
                out[h] = (e / e.sum()) @ values[:, h // group, :]
            x = x + self.mm(p + "attn_output.weight", out.reshape(-1))
            xb = self.rmsnorm(x, w[p + "ffn_norm.weight"])
            gate, up = self.mm(p + "ffn_gate.weight", xb), self.mm(p + "ffn_up.weight", xb)
            x = x + self.mm(p + "ffn_down.weight", gate / (1.0 + np.exp(-gate)) * up)
        x = self.rmsnorm(x, w["output_norm.weight"])
        return self.mm("output.weight", x)
