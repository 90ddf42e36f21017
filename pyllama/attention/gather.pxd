# Base of the built-in plugins: shapes, row tables and buffers for gathering rows per head (gather.pyx).

from pyllama.attention.base cimport Attention
from pyllama.attention.head cimport attend_head


cdef class GatherAttention(Attention):
    cdef list _owned                 # numpy arrays whose memory the pointers below point into
    cdef int n_layers, n_heads, n_kv_heads, head_dim, kv_dim, kv_mul
    cdef long long rows              # the most rows one head attends in one step
    cdef float* scores               # [n_heads, rows] the shared routine's scratch
    cdef const float** kptr          # [n_heads, rows] key rows gathered for the shared routine
    cdef const float** vptr          # [n_heads, rows] value rows

    cdef int init_gather(self, config, long long rows) except -1
    cdef void* own(self, array) except NULL

    # Attention of query head h over the n rows gathered in kptr/vptr[h] (bias: NULL or one per row)
    cdef inline void attend_gathered(self, int h, const float* q, const float* bias, Py_ssize_t n,
                                     float* out) noexcept nogil:
        attend_head(q + h * self.head_dim, self.kptr + h * self.rows, self.vptr + h * self.rows, bias, n,
                    self.head_dim, self.scores + h * self.rows, out + h * self.head_dim)
