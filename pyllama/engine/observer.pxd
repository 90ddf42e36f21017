# What a forward pass reports to whoever observes it (observer.pyx): the one seam between the engine
# and the tools that read its intermediate values (the diff's capture and ledger, the tracer).

# The stages a pass reports, in the order of one layer. Rows are [n, width] float32, row i being
# position pos + i; layer -1 for the stages outside the layers.
cdef enum:
    STAGE_EMBEDDING = 0        # x after the embedding lookup (dim)
    STAGE_ATTN_NORM = 1        # the attention block's normed input (dim)
    STAGE_Q = 2                # queries after RoPE (q_dim)
    STAGE_K = 3                # keys after RoPE (kv_dim)
    STAGE_V = 4                # values (kv_dim)
    STAGE_ATTENTION = 5        # the plugin's attention output, heads merged (q_dim)
    STAGE_ATTN_OUT = 6         # Wo times it (dim)
    STAGE_FFN_INP = 7          # the residual stream after the attention block (dim)
    STAGE_FFN_NORM = 8         # the FFN's normed input (dim)
    STAGE_FFN_GATE = 9         # w1 x (hidden_dim)
    STAGE_FFN_UP = 10          # w3 x (hidden_dim)
    STAGE_FFN_ACT = 11         # silu(w1 x) * w3 x (hidden_dim)
    STAGE_FFN_OUT = 12         # w2 times it (dim)
    STAGE_LAYER_OUT = 13       # the residual stream after the layer (dim)
    STAGE_RESULT_NORM = 14     # the final normed hidden state (dim)
    STAGE_LOGITS = 15          # the logits (vocab_size), when the pass computes them
    STAGE_Q_PRE_ROPE = 16      # queries before RoPE (q_dim), reported before STAGE_Q
    STAGE_EMBEDDING_SCALED = 17  # the embedding times the model's scale (Gemma 3's sqrt(dim))
    STAGE_Q_NORMED = 18        # queries after QK-norm, before RoPE (qwen3, gemma3)
    STAGE_K_NORMED = 19        # keys after QK-norm, before RoPE
    STAGE_ATTN_POST_NORM = 20  # Wo's output after its RMSNorm (gemma3)
    STAGE_FFN_POST_NORM = 21   # the FFN's output after its RMSNorm (gemma3)
    STAGE_COUNT = 22

# stage(owner, stage, layer, pos, n, rows, width): rows [n, width] at positions pos .. pos + n - 1
ctypedef int (*stage_hook)(void* owner, int stage, int layer, long long pos, Py_ssize_t n, const float* rows,
                           Py_ssize_t width) except -1 nogil
# attended(owner, layer, pos, i): the plugin has just attended position pos (row i of the pass) of layer;
# set, it makes the engine call the plugin one position at a time
ctypedef int (*attended_hook)(void* owner, int layer, long long pos, Py_ssize_t i) except -1 nogil

cdef struct Observer:
    void* owner                # borrowed: the EngineObserver object (Engine keeps it alive)
    stage_hook stage           # NULL: nobody observes (a plain generate pays one NULL test per stage)
    attended_hook attended     # NULL: the plugin takes a layer's rows at once
    unsigned int stages        # bit s set: stage s is reported
    bint per_position          # passes of one row each (what a tracer compares position by position)


cdef class EngineObserver:
    """Base of the observers (observer.pyx): a subclass fills ``hooks`` in its ``__cinit__``."""
    cdef Observer hooks


cdef inline bint observes(const Observer* o, int stage) noexcept nogil:
    return o.stage != NULL and (o.stages >> stage) & 1


cdef inline int report(const Observer* o, int stage, int layer, long long pos, Py_ssize_t n, const float* rows,
                       Py_ssize_t width) except -1 nogil:
    if o.stage != NULL and (o.stages >> stage) & 1:
        o.stage(o.owner, stage, layer, pos, n, rows, width)
    return 0
