"""ModelConfig: every hyperparameter of a Llama-style decoder, the sizes derived from them and the
rope facts an attention plugin needs to own positions (base, rotated dims, pair layout), per layer
where a model attends differently per layer (Gemma 3's sliding-window layers).

It is plain data: loaders produce it, the engine reads it, plugins receive it in ``init``.
``ModelConfig.check_forward`` says whether the engine's forward pass computes such a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyllama.errors import CheckpointError
from pyllama.kernels.rope import rerotate as _rerotate

ROPE_NORMAL = "normal"  # pairs (2i, 2i+1): llama2.c and GGUF `llama`
ROPE_NEOX = "neox"  # pairs (i, i + n_rot/2): GGUF `qwen2`, `qwen3`, `gemma3`
FFN_SILU = "silu"  # SwiGLU: silu(W1 x) * W3 x
FFN_GELU_TANH = "gelu_tanh"  # GeGLU: gelu(W1 x) * W3 x, GELU's tanh form (ggml_gelu; through its fp16 table on CPU)
FFN_ACTIVATIONS = (FFN_SILU, FFN_GELU_TANH)
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
    # Per layer, the model's own attention: the window in positions (0: global, every earlier position;
    # w > 0: position p attends p0 with p - p0 < w, itself included, as llama.cpp's standard sliding
    # window) and the RoPE base. (): global with rope_theta on every layer. rope_theta stays the base
    # of the global layers.
    layer_windows: tuple[int, ...] = ()
    layer_rope_bases: tuple[float, ...] = ()
    # Llama 3 RoPE scaling: frequency i (of n_rot / 2) is divided by factor i (the float32 values of
    # the GGUF's rope_freqs.weight); None: plain RoPE
    rope_freq_factors: tuple[float, ...] | None = None
    qk_norm: bool = False  # RMSNorm of every query and key head (weights of head_dim) before RoPE: qwen3, gemma3
    post_norms: bool = False  # RMSNorm of the attention and FFN outputs before each residual add: gemma3
    ffn_activation: str = FFN_SILU
    embedding_scale: float = 1.0  # the embedding row times this (gemma3: sqrtf(dim) in float32)
    # Scores are q.k times this; 0: 1/sqrtf(head_dim) in float32 (llama.cpp's kq_scale). gemma3 scales
    # the query by it before the product (llama.cpp's ggml_scale of Qcur), the others the scores: the
    # same bits whenever it is a power of two (Gemma 3 270M-12B: 1/16).
    attention_scale: float = 0.0
    logit_softcap: float = 0.0  # logits = c * tanh(logits / c) when c > 0 (gemma3's final_logit_softcapping)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_rot == 0:
            object.__setattr__(self, "n_rot", self.head_dim)
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (0,) * self.n_layers)
        if not self.layer_rope_bases:
            object.__setattr__(self, "layer_rope_bases", (float(self.rope_theta),) * self.n_layers)
        if self.attention_scale == 0.0:
            object.__setattr__(self, "attention_scale", float(np.float32(1) / np.sqrt(np.float32(self.head_dim))))
        for name in ("layer_windows", "layer_rope_bases"):
            if len(getattr(self, name)) != self.n_layers:
                raise ValueError(f"{name} has {len(getattr(self, name))} values for {self.n_layers} layers")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.n_rot // 2:
            raise ValueError(
                f"rope_freq_factors has {len(self.rope_freq_factors)} values, n_rot / 2 is {self.n_rot // 2}"
            )
        if self.ffn_activation not in FFN_ACTIVATIONS:
            raise ValueError(f"ffn_activation must be one of {FFN_ACTIVATIONS}, not {self.ffn_activation!r}")

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (= dim for llama2.c models)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together."""
        return self.n_kv_heads * self.head_dim

    @property
    def position_work(self) -> int:
        """Multiply-adds of one position through the weight matrices, classifier included: what the
        thread policy and a diff's sides weigh a block by."""
        per_layer = self.dim * (2 * self.q_dim + 2 * self.kv_dim) + 3 * self.dim * self.hidden_dim
        return self.n_layers * per_layer + self.dim * self.vocab_size

    @property
    def kv_mul(self) -> int:
        """Query heads per KV head: query head h reads KV head h // kv_mul."""
        return self.n_heads // self.n_kv_heads

    @property
    def global_layers(self) -> tuple[int, ...]:
        """The layers that attend every earlier position (window 0)."""
        return tuple(i for i, w in enumerate(self.layer_windows) if w == 0)

    def check_forward(self, name: str = "") -> None:
        """Raise ``CheckpointError`` (one line) unless the engine's forward pass computes this model.

        The engine runs llama2.c and GGUF ``llama`` (Llama 3's scaled RoPE too), ``qwen2``, ``qwen3``
        and ``gemma3`` blocks, with scores scaled by 1/sqrt(head_dim) (Gemma 3 27B scales by another
        number). Loading and ``pyllama info`` accept more (the config describes it); this check
        keeps such a model from running with wrong numbers."""
        missing = _forward_gaps(self)
        if missing:
            where = f"{name}: " if name else ""
            raise CheckpointError(
                f"{where}architecture {self.arch}: the forward pass does not support it yet (the model has "
                f"{', '.join(missing)}); pyllama info shows what the file holds"
            )

    def rerotate(self, vec: np.ndarray, delta: int, layer: int | None = None) -> None:
        """Rotate post-RoPE key or query heads in place by ``delta`` positions.

        ``vec`` is float32[n * head_dim] for any number of heads n. Used by plugins that re-assign
        positions inside their cache (StreamingLLM's position shift) without knowing the model.
        ``layer``: with that layer's RoPE base (``layer_rope_bases``); None: the global one.
        """
        _rerotate(self, vec, delta, layer)

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
            "layer_windows": list(self.layer_windows),
            "layer_rope_bases": list(self.layer_rope_bases),
            "rope_freq_factors": None if self.rope_freq_factors is None else list(self.rope_freq_factors),
            "qk_norm": self.qk_norm,
            "post_norms": self.post_norms,
            "ffn_activation": self.ffn_activation,
            "embedding_scale": self.embedding_scale,
            "attention_scale": self.attention_scale,
            "logit_softcap": self.logit_softcap,
        }


FORWARD_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")  # the architectures pyllama/engine/forward computes


def _forward_gaps(config: ModelConfig) -> list[str]:
    """What ``config`` asks of the forward pass that the engine does not compute (empty: it runs)."""
    plain_scale = float(np.float32(1) / np.sqrt(np.float32(config.head_dim)))
    gaps = [
        (config.arch not in FORWARD_ARCHS, f"the {config.arch} block"),
        (config.attention_scale != plain_scale, f"attention scale {config.attention_scale:g}"),
    ]
    return [what for missing, what in gaps if missing]
