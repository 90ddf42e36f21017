# SnapKV's score, shared by snapkv, pyramidkv and adakv:scorer=snapkv (observed.pyx).

from pyllama.attention.event cimport EventAttention


cdef class ObservedAttention(EventAttention):
    cdef readonly long long kernel
    cdef readonly str pool
    cdef bint max_pool
    cdef float* seen      # [n_layers, window, q_dim] the last window post-RoPE queries, position p in row p % window

    cdef void pool_candidates(self, const double* x, long long n, double* out) noexcept nogil
