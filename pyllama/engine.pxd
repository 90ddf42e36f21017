from libc.stdint cimport int32_t

from pyllama.attention.base cimport Attention
from pyllama.kernels.matvec cimport Matrix, QuantScratch
from pyllama.kernels.rope cimport RopeSpec
from pyllama.sampler cimport Sampler

cdef struct LayerPtrs:
    const float* attn_norm
    const float* ffn_norm
    const float* bq
    const float* bk
    const float* bv
    Matrix wq
    Matrix wk
    Matrix wv
    Matrix wo
    Matrix w1
    Matrix w2
    Matrix w3

# where forward_c first saw NaN or Inf (nonfinite_stage; NonFiniteError.at describes each)
cdef enum:
    NONFINITE_EMBEDDING = 0
    NONFINITE_QKV = 1
    NONFINITE_ATTENTION = 2
    NONFINITE_WO = 3
    NONFINITE_FFN = 4
    NONFINITE_LOGITS = 5

cdef class Engine:
    cdef readonly object config
    cdef readonly object weights
    cdef readonly Attention attention
    cdef readonly int n_threads
    cdef readonly int max_block         # most positions one forward_block_c pass takes
    cdef readonly bint per_position     # the plugin's per_position_order: blocks run position by position
    cdef int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, q_dim, kv_dim, vocab_size
    cdef float eps
    cdef int arithmetic  # ARITH_RUNC or ARITH_GGML (kernels/elementwise.pxd)
    cdef Matrix tok_emb
    cdef Matrix cls
    cdef const float* final_norm
    cdef LayerPtrs* layers
    cdef RopeSpec rope
    cdef long long rope_rows
    cdef float* rope_cos
    cdef float* rope_sin
    cdef float* rope_scratch
    cdef QuantScratch qscratch
    cdef object _buffers
    cdef float* x
    cdef float* xb
    cdef float* xb2
    cdef float* hb
    cdef float* hb2
    cdef float* q
    cdef float* k
    cdef float* v
    cdef float* att_out
    cdef float* logits
    # the block forward's activations, [max_block, width] each (forward_block_c)
    cdef float* bx
    cdef float* bxb
    cdef float* bxb2
    cdef float* bhb
    cdef float* bhb2
    cdef float* bq
    cdef float* bk
    cdef float* bv
    cdef float* batt
    cdef long long* ledger              # NULL, or [max_block]: memory_bytes() after each position (set_ledger)
    cdef object _ledger_buf
    cdef readonly object logits_view
    cdef public object tracer
    cdef bint tracing
    cdef float* capture                 # NULL, or [rows, n_layers, q_dim]: each layer's attention output (set_capture)
    cdef float* capture_hidden          # NULL, or [rows, dim]: the final normed hidden state (set_capture)
    cdef Py_ssize_t capture_rows        # positions the capture buffers hold (a block's row i: position pos + i)
    cdef bint skip_logits               # set_capture(logits=False): the caller applies the classifier itself
    cdef object _capture_bufs
    cdef readonly int nonfinite_layer   # -1, or the first layer whose output held NaN/Inf (last forward)
    cdef readonly int nonfinite_stage   # NONFINITE_*: what of that layer went bad first
    cdef readonly long long nonfinite_position  # the position of nonfinite_layer (a block: its earliest bad row)
    cdef int* block_bad                 # [max_block]: each block row's first non-finite layer, -1: none
    cdef int* block_stage               # [max_block]: NONFINITE_* of that row

    cdef int forward_c(self, int token, long long pos) except -1 nogil
    cdef void _locate_nonfinite(self, int li) noexcept nogil
    cdef void _check_block_rows(self, int li, Py_ssize_t n) noexcept nogil
    cdef void _first_bad_row(self, Py_ssize_t n, long long pos) noexcept nogil
    cdef int forward_block_c(self, const int32_t* tokens, Py_ssize_t n, long long pos, float* logits) except -1 nogil
    cdef int _per_position_block(self, const int32_t* tokens, Py_ssize_t n, long long pos,
                                 float* logits) except -1 nogil
    cdef int _attend_block(self, int layer, Py_ssize_t n, long long pos) except -1 nogil
    cdef int _ledger_step(self, Py_ssize_t i, long long* last) except -1
    cdef int _trace(self, str name, int layer, const float* data, Py_ssize_t n) except -1
