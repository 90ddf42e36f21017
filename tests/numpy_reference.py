"""An independent float64 numpy Llama forward pass, written for the tests.

It reads a llama2.c legacy (version 0) checkpoint by itself (not through pyllama's loader) and
follows the model definition (llama2.c model.py): RMSNorm, RoPE on pairs (2i, 2i+1) with
theta_i = pos / 10000^(2i/head_size), grouped-query attention with a dense cache, SwiGLU.
Everything is float64, so against it the engine's float32 result differs only by float32 rounding.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


class NumpyLlama:
    def __init__(self, path: Path):
        raw = Path(path).read_bytes()
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", raw, 0)
        shared = vocab > 0
        vocab = abs(vocab)
        hs = dim // n_heads
        kv_dim = n_kv * hs
        data = np.frombuffer(raw, dtype="<f4", offset=28).astype(np.float64)
        sizes = [
            ("emb", (vocab, dim)),
            ("rms_att", (n_layers, dim)),
            ("wq", (n_layers, dim, dim)),
            ("wk", (n_layers, kv_dim, dim)),
            ("wv", (n_layers, kv_dim, dim)),
            ("wo", (n_layers, dim, dim)),
            ("rms_ffn", (n_layers, dim)),
            ("w1", (n_layers, hidden, dim)),
            ("w2", (n_layers, dim, hidden)),
            ("w3", (n_layers, hidden, dim)),
            ("rms_final", (dim,)),
            ("freqs", (seq_len * hs,)),
        ]
        if not shared:
            sizes.append(("cls", (vocab, dim)))
        off = 0
        self.w = {}
        for name, shape in sizes:
            n = int(np.prod(shape))
            self.w[name] = data[off : off + n].reshape(shape)
            off += n
        assert off == data.size, "reference reader: size mismatch"
        if shared:
            self.w["cls"] = self.w["emb"]
        self.dim, self.hidden, self.n_layers = dim, hidden, n_layers
        self.n_heads, self.n_kv, self.vocab, self.seq_len, self.hs = n_heads, n_kv, vocab, seq_len, hs
        self.reset()

    def reset(self) -> None:
        self.k_cache = [[] for _ in range(self.n_layers)]
        self.v_cache = [[] for _ in range(self.n_layers)]

    @staticmethod
    def rmsnorm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return w * x / np.sqrt(np.mean(x * x) + 1e-5)

    def rope(self, vec: np.ndarray, pos: int) -> np.ndarray:
        heads = vec.reshape(-1, self.hs // 2, 2)
        i = np.arange(self.hs // 2)
        theta = pos / 10000.0 ** (2 * i / self.hs)
        c, s = np.cos(theta), np.sin(theta)
        a, b = heads[..., 0], heads[..., 1]
        return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(-1)

    def forward(self, token: int, pos: int) -> np.ndarray:
        w = self.w
        x = w["emb"][token].copy()
        group = self.n_heads // self.n_kv
        for layer in range(self.n_layers):
            xb = self.rmsnorm(x, w["rms_att"][layer])
            q = self.rope(w["wq"][layer] @ xb, pos)
            k = self.rope(w["wk"][layer] @ xb, pos)
            v = w["wv"][layer] @ xb
            self.k_cache[layer].append(k.reshape(self.n_kv, self.hs))
            self.v_cache[layer].append(v.reshape(self.n_kv, self.hs))
            keys = np.stack(self.k_cache[layer])  # (t, n_kv, hs)
            values = np.stack(self.v_cache[layer])
            out = np.empty((self.n_heads, self.hs))
            for h in range(self.n_heads):
                kh = keys[:, h // group, :]
                scores = kh @ q.reshape(self.n_heads, self.hs)[h] / np.sqrt(self.hs)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                out[h] = p @ values[:, h // group, :]
            x = x + w["wo"][layer] @ out.reshape(-1)
            xb = self.rmsnorm(x, w["rms_ffn"][layer])
            h1 = w["w1"][layer] @ xb
            h3 = w["w3"][layer] @ xb
            x = x + w["w2"][layer] @ (h1 / (1.0 + np.exp(-h1)) * h3)
        x = self.rmsnorm(x, w["rms_final"])
        return w["cls"] @ x
