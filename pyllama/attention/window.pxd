# The sinks + window layout of the built-in memories, the StreamingLLM shift and their gathering (window.pyx).

from pyllama.attention.gather cimport GatherAttention, take_rows, take_ring
from pyllama.kernels.rope cimport RopeSpec


cdef inline void kept_span(long long pos, long long sinks, long long window, long long* n_sink,
                           long long* ring_start, long long* n_ring) noexcept nogil:
    """After position pos: sink positions 0 .. n_sink - 1 and the window ring_start .. pos (n_ring)."""
    n_sink[0] = pos + 1 if pos + 1 < sinks else sinks
    ring_start[0] = pos + 1 - window if pos + 1 - window > sinks else sinks
    n_ring[0] = pos + 1 - ring_start[0] if pos >= sinks else 0


cdef class WindowAttention(GatherAttention):
    cdef readonly long long sinks, window
    cdef long long* model_window  # [n_layers]: the model's own window on each layer (0: global)
    # one buffer each for keys and values, [n_layers, sinks + window, kv_dim]: a layer's sink rows, then its
    # ring, so that positions 0 .. sinks + window - 1 sit in rows 0 .. of their layer until the ring wraps
    cdef long long layer_rows     # sinks + window
    cdef float* sink_k            # layer 0's sink rows: position t < sinks in row t
    cdef float* sink_v
    cdef float* ring_k            # layer 0's ring: position t >= sinks in row (t - sinks) % window
    cdef float* ring_v
    cdef float* shifted       # [n_shifted, kv_dim] this step's re-rotated keys (shift; NULL without)
    cdef float* rope_cos      # [n_rot / 2] the RoPE row of a position delta (shift)
    cdef float* rope_sin
    cdef RopeSpec rope

    cdef int init_window(self, config, long long rows, int counters, long long n_shifted,
                         long long score_rows=*) except -1
    cdef int keep(self, int layer, long long pos, const float* k, const float* v) except -1 nogil
    cdef int attend_held_block(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                               float* out) except -1 nogil
    cdef float* span_rows         # [n_kv_heads, 2, sinks + window + BLOCK_QUERIES, head_dim] attend_window_block's
    cdef int init_window_blocks(self) except -1
    cdef int attend_window_block(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                                 float* out) except -1 nogil
    cdef int attend_kept(self, int layer, const float* q, const float* sink_keys, long long first, long long n_sink,
                         long long ring_start, long long n_ring, float* out) except -1 nogil
    cdef void leave_window(self, int layer, const float* key, const float* value) noexcept nogil
    cdef inline Py_ssize_t layer_at(self, int layer) noexcept nogil:
        """Where layer's rows start in sink_k/sink_v and ring_k/ring_v (floats)."""
        return layer * self.layer_rows * self.kv_dim

    cdef const float* moved(self, const float* keys, long long n, long long delta, long long dst) noexcept nogil

    cdef inline void visible_span(self, int layer, long long pos, long long* first_sink, long long* n_sink,
                                  long long* ring_start, long long* n_ring) noexcept nogil:
        """kept_span within the model's window on layer: sink positions first_sink .. n_sink - 1 and
        the window ring_start .. pos (n_ring), none older than pos - model_window + 1 (a plugin may
        hide rows the model would see, never show one it would not)."""
        cdef long long lo = pos + 1 - self.model_window[layer]
        kept_span(pos, self.sinks, self.window, n_sink, ring_start, n_ring)
        first_sink[0] = 0
        if self.model_window[layer] > 0 and lo > 0:
            first_sink[0] = lo if lo < n_sink[0] else n_sink[0]
            if ring_start[0] < lo:
                n_ring[0] = n_ring[0] - (lo - ring_start[0]) if n_ring[0] > lo - ring_start[0] else 0
                ring_start[0] = lo

    # one head's kept exact rows, appended to kp/vp at j (see gather.pxd's take_*); off: the KV head's channels
    cdef inline long long take_sinks(self, const float** kp, const float** vp, float* bias, long long j, int layer,
                                     const float* sink_keys, long long n_sink, Py_ssize_t off) noexcept nogil:
        """Sink positions 0 .. n_sink - 1; sink_keys: this layer's sink keys (moved by ``moved`` or not)."""
        return take_rows(kp, vp, bias, j, sink_keys + off, self.sink_v + self.layer_at(layer) + off, n_sink,
                         self.kv_dim)

    cdef inline long long take_sinks_from(self, const float** kp, const float** vp, float* bias, long long j,
                                          int layer, const float* sink_keys, long long first, long long n_sink,
                                          Py_ssize_t off) noexcept nogil:
        """Sink positions first .. n_sink - 1 (take_sinks past those the model's window hides)."""
        cdef Py_ssize_t row = first * self.kv_dim + off
        if first >= n_sink:
            return j
        return take_rows(kp, vp, bias, j, sink_keys + row, self.sink_v + self.layer_at(layer) + row,
                         n_sink - first, self.kv_dim)

    cdef inline long long take_kept(self, int h, int layer, const float* sink_keys, long long first, long long n_sink,
                                    long long ring_start, long long n_ring, Py_ssize_t off) noexcept nogil:
        """Head h's tables: sink positions first .. n_sink - 1, then the window (no bias)."""
        cdef long long j = self.take_sinks_from(self.kptr + h * self.rows, self.vptr + h * self.rows, NULL, 0, layer,
                                                sink_keys, first, n_sink, off)
        return self.take_window(self.kptr + h * self.rows, self.vptr + h * self.rows, NULL, j, layer, ring_start,
                                n_ring, off)

    cdef inline long long take_window(self, const float** kp, const float** vp, float* bias, long long j, int layer,
                                      long long ring_start, long long n_ring, Py_ssize_t off) noexcept nogil:
        """The window: ascending positions ring_start .. ring_start + n_ring - 1."""
        cdef Py_ssize_t at = self.layer_at(layer) + off
        return take_ring(kp, vp, bias, j, self.ring_k + at, self.ring_v + at,
                         (ring_start - self.sinks) % self.window, n_ring, self.window, self.kv_dim)
