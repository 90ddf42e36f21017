# The base of the methods that compress at the event (snapkv, pyramidkv, adakv, knorm, ...): event.pyx.

from pyllama.attention.rows cimport RowStore


cdef class EventAttention(RowStore):
    cdef readonly long long every
    cdef public double alpha         # < 0: select per KV head; >= 0: across the layer's KV heads (adakv's floor)
    cdef long long* due              # [n_layers] the position of the next compression + 1 (0: none)
    cdef long long* events           # [n_layers] compressions so far
    cdef double* work                # [n_kv_heads, work_size] a scorer's float64 scratch per KV head
    cdef Py_ssize_t work_size

    cdef int init_event(self, config, Py_ssize_t work_size) except -1
    cdef int compress_layer(self, int layer, long long pos) except -1 nogil
    cdef void select_across(self, int layer, long long pos) noexcept nogil
    # the method: what it keeps of each position it sees (observation queries, query statistics) ...
    cdef int observe(self, int layer, long long pos, const float* q, const float* q_pre) except -1 nogil
    # ... what it computes once per compression, before the KV heads are scored (in parallel) ...
    cdef int prepare(self, int layer, long long pos) except -1 nogil
    # ... a float64 score per row of KV head g (n rows; the lowest go), with work + g * work_size ...
    cdef void event_scores(self, int layer, long long pos, int g, long long n, double* score) noexcept nogil
    # ... and the rows a KV head of layer keeps of n (default: the knobs' target)
    cdef long long event_target(self, int layer, long long n) noexcept nogil
