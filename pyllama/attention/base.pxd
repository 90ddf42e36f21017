# The attention contract (DESIGN.md "The attention contract"); see base.pyx.

from pyllama.kernels.threads cimport team_size

cdef class Attention:
    cdef public object config          # ModelConfig: shapes and rope facts
    cdef public long long max_positions  # positions this plugin can hold; 0 until init: the context
    cdef public int n_threads          # from the pool: threads the plugin may use
    cdef public bint native            # True: attend_c is implemented in C (no GIL, no Python per layer)
    cdef object _bound_block           # the engine's row buffers (q, k, v, out) [rows, width], for the Python path
    cdef const float* _block_q
    cdef Py_ssize_t _block_rows
    cdef object _pre_rope_rows         # the engine's queries before RoPE [rows, q_dim], or None (wants_pre_rope_query)
    cdef const float* _pre_rope_q
    cdef int _q_dim, _kv_dim
    cdef public object query_before_rope  # Python path: this call's queries before RoPE (wants_pre_rope_query)
    cdef public str layer_policy       # the spec's layers=: "all" (default) or "global" (layers.pyx)

    cdef Py_ssize_t bound_row(self, const float* q, Py_ssize_t n) except -2 nogil
    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil
    # positions pos .. pos + n - 1 of one layer, in order: q, out [n, q_dim], k, v [n, kv_dim] rows
    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil

    # the queries before RoPE of the engine's row that q points at, or NULL (see wants_pre_rope_query)
    cdef inline const float* pre_rope_query(self, const float* q) noexcept nogil:
        if self._pre_rope_q == NULL or self._block_q == NULL:
            return NULL
        return self._pre_rope_q + (q - self._block_q)


cdef inline int threads_for(int n_threads, long long work) noexcept nogil:
    # Attention over few cached rows is cheaper on the calling thread than waking the team
    # (pyllama/kernels/threads.pyx has the rule and its setting); results do not change (a head is
    # computed by one thread either way). work: rows attended x n_heads x head_dim.
    return team_size(n_threads, work)
