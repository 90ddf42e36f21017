"""A plain float32 numpy forward pass over the same memory-mapped weights: the benchmark's numpy peer.

It is written the obvious way (one ``W @ x`` per matrix through numpy's BLAS, a dense cache,
vectorised attention), which is what a researcher would write in an afternoon.
"""

from __future__ import annotations

import numpy as np


class NumpyForward:
    def __init__(self, config, weights):
        self.c = config
        self.w = weights
        self.emb = np.asarray(weights.token_embedding.data).reshape(config.vocab_size, config.dim)
        self.cls = np.asarray(weights.classifier.data).reshape(config.vocab_size, config.dim)
        self.layers = [
            {
                k: np.asarray(getattr(lw, k).data).reshape(getattr(lw, k).rows, getattr(lw, k).cols)
                for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
            }
            | {"an": lw.attn_norm, "fn": lw.ffn_norm}
            for lw in weights.layers
        ]
        half = config.head_dim // 2
        freqs = 1.0 / (config.rope_theta ** (np.arange(half, dtype=np.float32) * 2 / config.head_dim))
        ang = np.outer(np.arange(config.seq_len, dtype=np.float32), freqs)
        self.cos, self.sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        self.k = np.zeros((config.n_layers, config.seq_len, config.n_kv_heads, config.head_dim), np.float32)
        self.v = np.zeros_like(self.k)

    @staticmethod
    def _norm(x, w):
        return w * (x / np.sqrt(np.mean(x * x) + np.float32(1e-5)))

    def _rope(self, x, pos):
        x = x.reshape(-1, self.c.head_dim // 2, 2)
        a, b = x[..., 0], x[..., 1]
        c, s = self.cos[pos], self.sin[pos]
        return np.stack([a * c - b * s, a * s + b * c], -1).reshape(-1)

    def forward(self, token: int, pos: int) -> np.ndarray:
        c = self.c
        x = self.emb[token].astype(np.float32)
        g = c.n_heads // c.n_kv_heads
        for i, lw in enumerate(self.layers):
            xb = self._norm(x, lw["an"])
            q = self._rope(lw["wq"] @ xb, pos).reshape(c.n_heads, c.head_dim)
            self.k[i, pos] = self._rope(lw["wk"] @ xb, pos).reshape(c.n_kv_heads, c.head_dim)
            self.v[i, pos] = (lw["wv"] @ xb).reshape(c.n_kv_heads, c.head_dim)
            keys = np.repeat(self.k[i, : pos + 1], g, axis=1)  # (t, n_heads, hd)
            vals = np.repeat(self.v[i, : pos + 1], g, axis=1)
            att = np.einsum("hd,thd->ht", q, keys) / np.float32(np.sqrt(c.head_dim))
            att = np.exp(att - att.max(axis=1, keepdims=True))
            att /= att.sum(axis=1, keepdims=True)
            out = np.einsum("ht,thd->hd", att, vals).reshape(-1)
            x = x + lw["wo"] @ out
            xb = self._norm(x, lw["fn"])
            h1 = lw["w1"] @ xb
            x = x + lw["w2"] @ (h1 / (1 + np.exp(-h1)) * (lw["w3"] @ xb))
        return self.cls @ self._norm(x, self.w.final_norm)
