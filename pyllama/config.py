"""ModelConfig: every hyperparameter of a Llama-style decoder, the sizes derived from them and the
rope facts an attention plugin needs to own positions (base, rotated dims, pair layout).

It is plain data: loaders produce it, the engine reads it, plugins receive it in ``init``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyllama.kernels.rope import rerotate as _rerotate

ROPE_NORMAL = "normal"  # pairs (2i, 2i+1): llama2.c and GGUF `llama`
ROPE_NEOX = "neox"  # pairs (i, i + n_rot/2): GGUF `qwen2`
# whose elementwise arithmetic (rmsnorm, SwiGLU) the engine reproduces bit for bit: llama2.c's run.c
# for llama2.c checkpoints, ggml's CPU backend (llama.cpp) for GGUF files; see kernels/elementwise.pyx
ARITH_RUNC = "run.c"
ARITH_GGML = "ggml"
ARITHMETICS = (ARITH_RUNC, ARITH_GGML)


@dataclass(frozen=True)
class ModelConfig:
    dim: int  # residual stream width
    hidden_dim: int  # FFN width
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (grouped-query attention when < n_heads)
    vocab_size: int
    seq_len: int  # trained context
    head_dim: int = 0  # 0: dim // n_heads
    n_rot: int = 0  # rotated dims per head; 0: head_dim
    rope_theta: float = 10000.0
    rope_style: str = ROPE_NORMAL
    norm_eps: float = 1e-5
    arch: str = "llama"
    shared_classifier: bool = True
    qkv_bias: bool = False
    arithmetic: str = ARITH_RUNC

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_rot == 0:
            object.__setattr__(self, "n_rot", self.head_dim)

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (= dim for llama2.c models)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together."""
        return self.n_kv_heads * self.head_dim

    @property
    def kv_mul(self) -> int:
        """Query heads per KV head: query head h reads KV head h // kv_mul."""
        return self.n_heads // self.n_kv_heads

    def rerotate(self, vec: np.ndarray, delta: int) -> None:
        """Rotate post-RoPE key or query heads in place by ``delta`` positions.

        ``vec`` is float32[n * head_dim] for any number of heads n. Used by plugins that re-assign
        positions inside their cache (StreamingLLM's position shift) without knowing the model.
        """
        _rerotate(self, vec, delta)

    def describe(self) -> dict:
        return {
            "arch": self.arch,
            "dim": self.dim,
            "hidden_dim": self.hidden_dim,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "rope_theta": self.rope_theta,
            "n_rot": self.n_rot,
            "rope_style": self.rope_style,
            "arithmetic": self.arithmetic,
            "norm_eps": self.norm_eps,
            "shared_classifier": self.shared_classifier,
        }
