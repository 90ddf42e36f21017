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
    cdef int check_in_order(self, int layer, long long pos, long long expected) except -1 nogil

    # Attention of query head h over the n rows gathered in kptr/vptr[h] (bias: NULL or one per row)
    cdef inline void attend_gathered(self, int h, const float* q, const float* bias, Py_ssize_t n,
                                     float* out) noexcept nogil:
        attend_head(q + h * self.head_dim, self.kptr + h * self.rows, self.vptr + h * self.rows, bias, n,
                    self.head_dim, self.scores + h * self.rows, out + h * self.head_dim)


# ---- sinks + a ring window (sink, lattice, tiered; kmeans attends the same span of its full cache) --
# Position t < sinks is kept in sink row t; a later position in ring row (t - sinks) % window.

cdef inline void kept_span(long long pos, long long sinks, long long window, long long* n_sink,
                           long long* ring_start, long long* n_ring) noexcept nogil:
    """After position pos: sink positions 0 .. n_sink - 1 and the window ring_start .. pos (n_ring)."""
    n_sink[0] = pos + 1 if pos + 1 < sinks else sinks
    ring_start[0] = pos + 1 - window if pos + 1 - window > sinks else sinks
    n_ring[0] = pos + 1 - ring_start[0] if pos >= sinks else 0


cdef inline bint position_rows(long long pos, int layer, long long sinks, long long window, Py_ssize_t kv_dim,
                               float* sink_k, float* sink_v, float* ring_k, float* ring_v,
                               float** key_row, float** value_row) noexcept nogil:
    """Where position pos is kept (sink_*: [layers, sinks, kv_dim], ring_*: [layers, window, kv_dim]).
    True when that ring row still holds position pos - window, which leaves the window now."""
    cdef Py_ssize_t row
    if pos < sinks:
        row = (layer * sinks + pos) * kv_dim
        key_row[0] = sink_k + row
        value_row[0] = sink_v + row
        return False
    row = (layer * window + (pos - sinks) % window) * kv_dim
    key_row[0] = ring_k + row
    value_row[0] = ring_v + row
    return pos >= sinks + window
