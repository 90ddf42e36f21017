# The base of the methods that evict every step (h2o, tova, scissorhands): step.pyx.

from pyllama.attention.rows cimport RowStore


cdef class StepAttention(RowStore):
    cdef bint one_set   # one selection per layer, the same rows evicted from every KV head (TOVA)

    cdef int init_step(self, config, int state_bytes) except -1
    cdef int evict_step(self, int layer, long long pos) except -1 nogil
    # the method: a score per row of KV head g (n rows, position pos just attended); the lowest goes
    cdef void step_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil
    cdef void head_mean(self, int first, int n_heads, long long n, double* out) noexcept nogil
