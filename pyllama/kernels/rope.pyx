"""RoPE: rotate each (query or key) head's pairs by position-dependent angles.

The angle of pair i at position p is ``p * freq_i`` with ``freq_i = 1 / theta^(2i / n_rot)``,
computed in float32 in exactly llama2.c run.c's expression order (``1.0f / powf(theta, 2i /
(float)n_rot)``, then ``pos * freq``, then ``cosf``/``sinf``), so a table row is bit-identical to
what run.c computes on the fly. Pairs are (2i, 2i+1) for llama2.c/GGUF ``llama`` and
(i, i + n_rot/2) for NEOX-style models (GGUF ``qwen2``); dims past ``n_rot`` are not rotated.

GGUF models (``ModelConfig.arithmetic == "ggml"``) take ggml's CPU rope instead, so that their queries
and keys carry llama.cpp's bits (checked against its tensors): the angle of pair i is built by
repeated multiplication, ``theta_0 = (float)pos``, ``theta_{i+1} = theta_i * powf(base, -2.0f /
n_rot)``, with libm's ``cosf``/``sinf``, and the pair rotates as GCC compiles ggml's ``x0*cos -
x1*sin`` and ``x0*sin + x1*cos``: one product rounded, the other fused, ``fmaf(x0, cos, -(x1*sin))``
and ``fmaf(x0, sin, x1*cos)``. Llama 3's scaled RoPE divides angle i by the frequency factor i of
the file's ``rope_freqs`` (ggml_rope_cache_init's ``theta / ff``), and a model whose layers differ in
their base (Gemma 3: 10,000 on its sliding-window layers, 1,000,000 on the global ones) has one
``RopeSpec`` per base: ``rope_spec_of(config, base)``.
"""

from libc.math cimport cosf, fmaf, sinf, powf
from libc.stdlib cimport malloc, free

from pyllama.kernels.elementwise cimport ARITH_GGML, arithmetic_of

import numpy as np


cdef RopeSpec rope_spec_of(object config, double base) except *:
    cdef RopeSpec s
    cdef int i
    s.head_dim = config.head_dim
    s.n_rot = config.n_rot
    if s.n_rot // 2 > ROPE_MAX_PAIRS:
        raise ValueError(f"RoPE over {s.n_rot} dims: at most {2 * ROPE_MAX_PAIRS} are supported")
    s.style = ROPE_NEOX if config.rope_style == "neox" else ROPE_NORMAL
    s.theta = base
    s.ggml = arithmetic_of(config) == ARITH_GGML
    factors = getattr(config, "rope_freq_factors", None)
    s.scaled = factors is not None
    for i in range(s.n_rot // 2):
        s.factors[i] = factors[i] if s.scaled else 1.0
    return s


def layer_base(config, layer=None) -> float:
    """The RoPE base of ``layer`` (None: the model's global base, ``rope_theta``)."""
    if layer is None:
        return float(config.rope_theta)
    bases = getattr(config, "layer_rope_bases", ())
    if not 0 <= layer < len(bases):
        raise ValueError(f"layer {layer} is outside the model's {len(bases)} layers")
    return float(bases[layer])


cdef void rope_row(const RopeSpec* spec, long pos, float* cos_out, float* sin_out) noexcept nogil:
    cdef int i
    cdef float freq, val, step
    if spec.ggml:
        step = -2.0
        step = powf(spec.theta, step / <float>spec.n_rot)
        val = <float>pos
        for i in range(spec.n_rot // 2):
            if spec.scaled:
                cos_out[i] = cosf(val / spec.factors[i])
                sin_out[i] = sinf(val / spec.factors[i])
            else:
                cos_out[i] = cosf(val)
                sin_out[i] = sinf(val)
            val = val * step
        return
    for i in range(spec.n_rot // 2):
        freq = 1.0 / powf(spec.theta, (2 * i) / <float>spec.n_rot)
        if spec.scaled:
            freq = freq / spec.factors[i]
        val = pos * freq
        cos_out[i] = cosf(val)
        sin_out[i] = sinf(val)


cdef void rope_apply(const RopeSpec* spec, float* vec, int n_heads, const float* cos_row,
                     const float* sin_row) noexcept nogil:
    cdef int h, i, a, b
    cdef int half = spec.n_rot // 2
    cdef float v0, v1, fcr, fci
    cdef float* head
    for h in range(n_heads):
        head = vec + h * spec.head_dim
        for i in range(half):
            if spec.style == ROPE_NORMAL:
                a = 2 * i
                b = 2 * i + 1
            else:
                a = i
                b = i + half
            fcr = cos_row[i]
            fci = sin_row[i]
            v0 = head[a]
            v1 = head[b]
            if spec.ggml:
                head[a] = fmaf(v0, fcr, -(v1 * fci))
                head[b] = fmaf(v0, fci, v1 * fcr)
            else:
                head[a] = v0 * fcr - v1 * fci
                head[b] = v0 * fci + v1 * fcr


cdef void rope_rotate_delta(const RopeSpec* spec, float* vec, int n_heads, long delta) noexcept nogil:
    """Rotate already-rotated heads by ``delta`` more positions (negative: back)."""
    cdef float cos_row[512]
    cdef float sin_row[512]
    cdef float* c = cos_row
    cdef float* s = sin_row
    cdef int half = spec.n_rot // 2
    if half > 512:
        c = <float*>malloc(half * sizeof(float))
        s = <float*>malloc(half * sizeof(float))
    rope_row(spec, delta, c, s)
    rope_apply(spec, vec, n_heads, c, s)
    if half > 512:
        free(c)
        free(s)


def rope_table(config, long n_positions, layer=None):
    """(cos, sin) float32[n_positions, n_rot/2] for positions 0..n_positions-1 (of ``layer``'s base)."""
    cdef RopeSpec spec = rope_spec_of(config, layer_base(config, layer))
    half = max(spec.n_rot // 2, 1)
    cos_t = np.zeros((n_positions, half), dtype=np.float32)
    sin_t = np.zeros((n_positions, half), dtype=np.float32)
    cdef float[:, ::1] c = cos_t
    cdef float[:, ::1] s = sin_t
    cdef long p
    for p in range(n_positions):
        rope_row(&spec, p, &c[p, 0], &s[p, 0])
    return cos_t, sin_t


def apply(config, float[::1] vec, long pos, layer=None):
    """Rotate ``vec`` (whole heads of ``config.head_dim``) in place as for position ``pos`` (with
    ``layer``'s RoPE base; None: the global one)."""
    cdef RopeSpec spec = rope_spec_of(config, layer_base(config, layer))
    if vec.shape[0] % spec.head_dim:
        raise ValueError(f"rope: {vec.shape[0]} values is not a whole number of heads of {spec.head_dim}")
    rope_rotate_delta(&spec, &vec[0], vec.shape[0] // spec.head_dim, pos)


def rerotate(config, float[::1] vec, long delta, layer=None):
    """Rotate post-RoPE heads in ``vec`` in place by ``delta`` positions (``layer``'s RoPE)."""
    apply(config, vec, delta, layer)
