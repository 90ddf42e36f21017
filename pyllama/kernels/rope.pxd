# Rotary position embedding (see rope.pyx).

cdef enum:
    ROPE_NORMAL = 0   # pairs (2i, 2i+1)
    ROPE_NEOX = 1     # pairs (i, i + n_rot/2)

cdef enum:
    ROPE_MAX_PAIRS = 512  # n_rot / 2 at most (head dims up to 1024)

cdef struct RopeSpec:
    int head_dim
    int n_rot
    int style
    float theta
    int ggml          # ggml's angles and rotation (GGUF files) instead of run.c's, see rope.pyx
    bint scaled       # each angle divided by its frequency factor (Llama 3's rope_freqs)
    float factors[ROPE_MAX_PAIRS]

cdef void rope_row(const RopeSpec* spec, long pos, float* cos_out, float* sin_out) noexcept nogil
cdef void rope_apply(const RopeSpec* spec, float* vec, int n_heads, const float* cos_row,
                     const float* sin_row) noexcept nogil
cdef void rope_rotate_delta(const RopeSpec* spec, float* vec, int n_heads, long delta) noexcept nogil
# the RoPE of config's layers whose base is ``base`` (each layer of a model may have its own)
cdef RopeSpec rope_spec_of(object config, double base) except *
