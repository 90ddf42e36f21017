# The forward pass (forward.pyx): n >= 1 known tokens through every layer; decode is a pass of one row.

from libc.stdint cimport int32_t

from pyllama.attention.base cimport Attention
from pyllama.engine.state cimport RopeTables, Transformer

cdef void rope_rows_at(RopeTables* rope, long long pos, const float** cos_row, const float** sin_row) noexcept nogil
cdef int forward_rows(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                      float* logits, bint classify) except -1 nogil
cdef int forward(Transformer* t, Attention attention, int token, long long pos) except -1 nogil
cdef int forward_block(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                       float* logits, bint classify=*) except -1 nogil
