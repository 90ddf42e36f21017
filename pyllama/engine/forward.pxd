# One token at one position through every layer (forward.pyx): run.c's forward().

from pyllama.attention.base cimport Attention
from pyllama.engine.state cimport RopeTables, Transformer

cdef void rope_rows_at(RopeTables* rope, long long pos, const float** cos_row, const float** sin_row) noexcept nogil
cdef int forward(Transformer* t, Attention attention, int token, long long pos) except -1 nogil
