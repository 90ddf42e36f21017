"""The hyperparameters of a GGUF model: its ``{arch}.*`` keys, read as llama.cpp's loader reads them
(``llama_model::load_hparams`` in ``src/llama-model.cpp`` and each architecture's
``load_arch_hparams`` in ``src/models/*.cpp``), with llama.cpp's defaults for absent keys.

Owns what each supported architecture is (``ARCHITECTURES``): its RoPE pair layout, which optional
blocks its layers carry (Q/K/V biases, per-head QK-norm, post-attention and post-FFN norms), its FFN
activation, how it scales the embedding and the attention, and its per-layer attention: Gemma 3
puts a sliding window on five layers of six, each kind with its own RoPE base. The tensors
themselves are ``gguf.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGUFValueType, Keys

from pyllama.checkpoint.gguf_meta import MetaValue
from pyllama.checkpoint.gguf_reader import INTEGER_TYPES, CheckedReader
from pyllama.config import ARITH_GGML, FFN_GELU_TANH, FFN_SILU, ROPE_NEOX, ROPE_NORMAL, ModelConfig
from pyllama.errors import CheckpointError


@dataclass(frozen=True)
class Architecture:
    """What a GGUF ``general.architecture`` means for the forward pass (llama.cpp's graph of it);
    the defaults are the Llama block."""

    rope_style: str
    biases_required: bool = False  # Q/K/V biases must be there (qwen2); elsewhere they are optional
    qk_norm: bool = False  # blk.N.attn_q_norm / attn_k_norm (head_dim values each)
    post_norms: bool = False  # blk.N.post_attention_norm / post_ffw_norm
    ffn_activation: str = FFN_SILU
    rope_freqs: bool = False  # may carry rope_freqs.weight (Llama 3 RoPE scaling)
    sliding_window: bool = False  # reads attention.sliding_window, its layer pattern and rope.freq_base_swa
    rotates_whole_heads: bool = False  # llama.cpp refuses rope.dimension_count != head size


ARCHITECTURES = {
    "llama": Architecture(ROPE_NORMAL, rope_freqs=True, rotates_whole_heads=True),
    "qwen2": Architecture(ROPE_NEOX, biases_required=True),
    "qwen3": Architecture(ROPE_NEOX, qk_norm=True, rotates_whole_heads=True),
    "gemma3": Architecture(ROPE_NEOX, qk_norm=True, post_norms=True, ffn_activation=FFN_GELU_TANH, sliding_window=True),
}
SUPPORTED_ARCHS = tuple(ARCHITECTURES)

ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"  # the old name of rope.scaling.factor
# spelled out: gguf-py releases before 0.17 have no constant for them
ROPE_FREQ_BASE_SWA = "{arch}.rope.freq_base_swa"
SLIDING_WINDOW = "{arch}.attention.sliding_window"
SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"
PER_LAYER_SWA_KEYS = (
    "{arch}.attention.key_length_swa",
    "{arch}.attention.value_length_swa",
    "{arch}.rope.dimension_count_swa",
)
FINAL_LOGIT_SOFTCAPPING = "{arch}.final_logit_softcapping"
GEMMA3_SWA_PATTERN = 6  # llama.cpp's default for gemma3: one global layer in six, the last of each six
GEMMA3_SWA_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa when the file has no freq_base_swa
GEMMA3_27B_LAYERS = 62  # llama.cpp scales Gemma 3 27B's attention by n_embd / n_head, not the key length
# Bounds no real model comes near; a header outside them is corrupt, not a model.
MAX_DIM = 1 << 20
MAX_LAYERS = 1 << 12
MAX_CONTEXT = 1 << 26

_FLOAT_TYPES = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}


class Meta:
    """Typed access to the key/value metadata, with errors that name the file and the key."""

    def __init__(self, reader: CheckedReader, name: str) -> None:
        self.records = reader.metadata
        self.name = name

    def has(self, key: str) -> bool:
        return key in self.records

    def _wrong(self, key: str, kind: str, record: MetaValue) -> CheckpointError:
        return CheckpointError(f"{self.name}: metadata {key} should be {kind}, found {record.type_name()}")

    def string(self, key: str, default: str | None = None) -> str | None:
        record = self.records.get(key)
        if record is None:
            return default
        if record.type != GGUFValueType.STRING:
            raise self._wrong(key, "a string", record)
        try:
            return record.text().decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.name}: metadata {key} is not valid UTF-8") from None

    def integer(self, key: str, default: int | None = None, per_layer: int = 0) -> int:
        """An integer key; ``per_layer`` > 0 also accepts llama.cpp's one-value-per-layer arrays
        when every layer has the same value (pyllama has one shape for all layers)."""
        record = self.records.get(key)
        if record is None:
            if default is None:
                raise CheckpointError(f"{self.name}: metadata key {key} is missing (llama.cpp requires it too)")
            return default
        if record.type == GGUFValueType.ARRAY and per_layer and record.item_type in INTEGER_TYPES:
            values = [int(v) for v in record.numbers()]
            if len(values) != per_layer or len(set(values)) != 1:
                raise CheckpointError(
                    f"{self.name}: {key} varies per layer ({values[:8]}{' ...' if len(values) > 8 else ''}); "
                    "pyllama supports models whose layers all have the same shape"
                )
            return values[0]
        if record.type not in INTEGER_TYPES:
            raise self._wrong(key, "an integer", record)
        return int(record.scalar())

    def flags(self, key: str, n: int) -> list[bool] | None:
        """A per-layer array of bool or integer values as flags (None: the key is not an array)."""
        record = self.records.get(key)
        if record is None or record.type != GGUFValueType.ARRAY:
            return None
        if record.item_type not in (GGUFValueType.BOOL, GGUFValueType.INT32, GGUFValueType.UINT32):
            raise self._wrong(key, "an array of bool, int32 or uint32", record)
        if record.count != n:
            raise CheckpointError(f"{self.name}: {key} has {record.count} values for {n} layers")
        return [bool(v) for v in record.numbers()]

    def number(self, key: str, default: float | None = None) -> float:
        record = self.records.get(key)
        if record is None:
            if default is None:
                raise CheckpointError(f"{self.name}: metadata key {key} is missing (llama.cpp requires it too)")
            return default
        if record.type not in _FLOAT_TYPES | INTEGER_TYPES:
            raise self._wrong(key, "a number", record)
        return float(record.scalar())

    def array_length(self, key: str) -> int | None:
        record = self.records.get(key)
        if record is None:
            return None
        if record.type != GGUFValueType.ARRAY:
            raise self._wrong(key, "an array", record)
        return record.count


def _f32(x: float) -> float:
    """``x`` rounded to float32, as llama.cpp holds every hyperparameter."""
    return float(np.float32(x))


def _inv_sqrt_f32(n: int) -> float:
    """``1.0f / sqrtf(float(n))``."""
    return float(np.float32(1) / np.sqrt(np.float32(n)))


def _shape(meta: Meta, arch: str) -> dict:
    """Layer count, widths, heads and context, checked as llama.cpp checks them."""
    name, spec = meta.name, ARCHITECTURES[arch]

    def key(template: str) -> str:
        return template.format(arch=arch)

    n_layers = meta.integer(key(Keys.LLM.BLOCK_COUNT))
    dim = meta.integer(key(Keys.LLM.EMBEDDING_LENGTH))
    n_heads = meta.integer(key(Keys.Attention.HEAD_COUNT), per_layer=n_layers)
    hidden_dim = meta.integer(key(Keys.LLM.FEED_FORWARD_LENGTH), per_layer=n_layers)
    seq_len = meta.integer(key(Keys.LLM.CONTEXT_LENGTH))
    shown = f"block_count={n_layers}, embedding_length={dim}, head_count={n_heads}, feed_forward_length={hidden_dim}"
    if not (
        0 < n_layers <= MAX_LAYERS
        and 0 < dim <= MAX_DIM
        and 0 < n_heads <= dim
        and 0 < hidden_dim <= 16 * MAX_DIM
        and 0 < seq_len <= MAX_CONTEXT
    ):
        raise CheckpointError(f"{name}: implausible hyperparameters ({shown}, context_length={seq_len}): corrupt file")
    n_kv_heads = meta.integer(key(Keys.Attention.HEAD_COUNT_KV), default=n_heads, per_layer=n_layers)
    if not 0 < n_kv_heads <= n_heads or n_heads % n_kv_heads:
        raise CheckpointError(
            f"{name}: head_count={n_heads} is not a multiple of head_count_kv={n_kv_heads}: "
            "grouped-query attention needs whole groups"
        )
    if dim % n_heads and not meta.has(key(Keys.Attention.KEY_LENGTH)):
        raise CheckpointError(f"{name}: embedding_length={dim} is not a multiple of head_count={n_heads}")
    head_dim = meta.integer(key(Keys.Attention.KEY_LENGTH), default=dim // n_heads)
    value_dim = meta.integer(key(Keys.Attention.VALUE_LENGTH), default=dim // n_heads)
    if value_dim != head_dim:
        raise CheckpointError(
            f"{name}: key_length={head_dim} differs from value_length={value_dim}; pyllama needs equal head sizes"
        )
    if not 0 < head_dim <= MAX_DIM or head_dim % 2:
        raise CheckpointError(f"{name}: head size {head_dim} is not a positive even number; RoPE needs pairs")
    n_rot = meta.integer(key(Keys.Rope.DIMENSION_COUNT), default=head_dim)
    if spec.rotates_whole_heads and n_rot != head_dim:
        # llama.cpp refuses this too ("invalid n_rot"; qwen3's graph asserts it)
        raise CheckpointError(
            f"{name}: rope.dimension_count={n_rot} but the head size is {head_dim}; {arch} rotates whole heads"
        )
    if not 0 < n_rot <= head_dim or n_rot % 2:
        raise CheckpointError(f"{name}: rope.dimension_count={n_rot} must be even and at most the head size {head_dim}")
    return dict(
        dim=dim,
        hidden_dim=hidden_dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        seq_len=seq_len,
        head_dim=head_dim,
        n_rot=n_rot,
    )


def _rope_and_norm(meta: Meta, arch: str) -> dict:
    """The RoPE base (plain RoPE only: no scaling keys) and the RMSNorm epsilon; no experts."""
    name = meta.name

    def key(template: str) -> str:
        return template.format(arch=arch)

    rope_theta = _f32(meta.number(key(Keys.Rope.FREQ_BASE), default=10000.0))
    if not rope_theta > 0:
        raise CheckpointError(f"{name}: rope.freq_base={rope_theta} must be positive")
    scaling = meta.string(key(Keys.Rope.SCALING_TYPE), default="none")
    factor = meta.number(key(Keys.Rope.SCALING_FACTOR), default=0.0)
    if factor == 0.0:
        factor = meta.number(key(ROPE_SCALE_LINEAR), default=0.0)
    if scaling not in ("none", "linear") or factor not in (0.0, 1.0):
        raise CheckpointError(
            f"{name}: RoPE scaling (type {scaling}, factor {factor:g}) is not supported; "
            "pyllama runs plain RoPE and Llama 3's rope_freqs factors"
        )
    experts = meta.integer(key(Keys.LLM.EXPERT_COUNT), default=0)
    if experts:
        raise CheckpointError(f"{name}: a mixture-of-experts model ({experts} experts); pyllama runs dense models only")
    norm_eps = meta.number(key(Keys.Attention.LAYERNORM_RMS_EPS))
    if not 0 < norm_eps < 1:
        raise CheckpointError(f"{name}: layer_norm_rms_epsilon={norm_eps} is not a small positive number")
    return dict(rope_theta=rope_theta, norm_eps=norm_eps)


def _gemma3(meta: Meta, shape: dict, rope_theta: float) -> dict:
    """Gemma 3's own facts (``src/models/gemma3.cpp``): the sliding-window layers and their RoPE
    base, the embedding scale sqrtf(n_embd), the attention scale and the final soft-capping."""
    name, n_layers = meta.name, shape["n_layers"]

    def key(template: str) -> str:
        return template.format(arch="gemma3")

    for template in PER_LAYER_SWA_KEYS:
        if meta.has(key(template)):
            raise CheckpointError(f"{name}: {key(template)}: heads that differ per layer are not supported")
    window = meta.integer(key(SLIDING_WINDOW), default=0)
    if window > 0:  # llama.cpp's LLAMA_SWA_TYPE_STANDARD: p attends p0 when p - p0 < window
        local = meta.flags(key(SLIDING_WINDOW_PATTERN), n_layers)
        if local is None:  # a period n: the last layer of every n is global (n = 0: every layer local)
            n = meta.integer(key(SLIDING_WINDOW_PATTERN), default=GEMMA3_SWA_PATTERN)
            local = [n == 0 or layer % n < n - 1 for layer in range(n_layers)]
        swa_base = _f32(meta.number(key(ROPE_FREQ_BASE_SWA), default=GEMMA3_SWA_BASE))
        if not swa_base > 0:
            raise CheckpointError(f"{name}: {key(ROPE_FREQ_BASE_SWA)}={swa_base} must be positive")
        windows = tuple(window if is_local else 0 for is_local in local)
        bases = tuple(swa_base if is_local else rope_theta for is_local in local)
    else:
        windows, bases = (0,) * n_layers, (rope_theta,) * n_layers
    if n_layers == GEMMA3_27B_LAYERS:
        scale = _inv_sqrt_f32(shape["dim"] // shape["n_heads"])
    else:
        scale = _inv_sqrt_f32(shape["head_dim"])
    softcap = _f32(meta.number(key(FINAL_LOGIT_SOFTCAPPING), default=0.0))
    return dict(
        layer_windows=windows,
        layer_rope_bases=bases,
        embedding_scale=float(np.sqrt(np.float32(shape["dim"]))),  # sqrtf(n_embd)
        attention_scale=scale,
        logit_softcap=softcap,
    )


def config_of(meta: Meta, arch: str, vocab_size: int) -> ModelConfig:
    """The ``ModelConfig`` of a supported architecture's metadata (tensor facts added by the caller)."""
    spec = ARCHITECTURES[arch]
    shape = _shape(meta, arch)
    rope = _rope_and_norm(meta, arch)
    extra = _gemma3(meta, shape, rope["rope_theta"]) if spec.sliding_window else {}
    return ModelConfig(
        **shape,
        **rope,
        **extra,
        vocab_size=vocab_size,
        rope_style=spec.rope_style,
        arch=arch,
        qk_norm=spec.qk_norm,
        post_norms=spec.post_norms,
        ffn_activation=spec.ffn_activation,
        arithmetic=ARITH_GGML,  # match llama.cpp, which computes what people run these files with
    )
