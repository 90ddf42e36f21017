# A dense cache of every position (causal, kmeans): its layout, storing a position, gathering rows (dense.pyx).

from pyllama.attention.gather cimport GatherAttention, take_listed, take_rows


cdef class DenseAttention(GatherAttention):
    cdef float* keys          # [n_layers, positions, row_floats]: position t of a layer in row t
    cdef float* values
    cdef readonly long long positions
    cdef readonly Py_ssize_t row_floats   # floats from one cached position to the next (kv_dim, padded)

    cdef int init_dense(self, config, long long rows, int counters, long long score_rows=*) except -1
    cdef int keep(self, int layer, long long pos, const float* k, const float* v) except -1 nogil
    cdef int attend_every_row(self, int layer, long long pos, Py_ssize_t n, float* q, const float* k,
                              const float* v, float* out) except -1 nogil

    # one head's rows, appended to kp/vp at j (see gather.pxd's take_*); off: the KV head's channels
    cdef inline long long take_positions(self, const float** kp, const float** vp, float* bias, long long j,
                                         int layer, long long first, long long n, Py_ssize_t off) noexcept nogil:
        """Positions first .. first + n - 1 of layer."""
        cdef Py_ssize_t row = (layer * self.positions + first) * self.row_floats + off
        return take_rows(kp, vp, bias, j, self.keys + row, self.values + row, n, self.row_floats)

    cdef inline long long take_listed_positions(self, const float** kp, const float** vp, float* bias, long long j,
                                                int layer, const long long* listed, long long n,
                                                Py_ssize_t off) noexcept nogil:
        """The n positions listed[0 .. n-1] of layer, in that order."""
        cdef Py_ssize_t row = layer * self.positions * self.row_floats + off
        return take_listed(kp, vp, bias, j, self.keys + row, self.values + row, listed, n, self.row_floats)
