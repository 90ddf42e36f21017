# A block of known tokens (a prompt, teacher forcing) through every layer, each weight read once
# per block (block.pyx).

from libc.stdint cimport int32_t

from pyllama.attention.base cimport Attention
from pyllama.engine.state cimport Transformer

cdef int forward_block(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                       float* logits, bint classify=*) except -1 nogil
