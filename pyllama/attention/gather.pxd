# Base of the built-in plugins: shapes, per-layer counters, row tables and the loops that fill them (gather.pyx).

from pyllama.attention.base cimport Attention
from pyllama.attention.head cimport GGML_LANES, attend_group_rows, attend_head, attend_head_rows

# queries of a block attended together over contiguous rows (attend_prefix): 16 rows of scores of an
# 8k cache are 512 KiB per head
cdef enum:
    BLOCK_QUERIES = 16


cdef class GatherAttention(Attention):
    cdef list _owned                 # numpy arrays whose memory the pointers below point into
    cdef int n_layers, n_heads, n_kv_heads, head_dim, kv_dim, kv_mul
    cdef long long rows              # the most rows one head attends in one step
    cdef long long score_rows        # floats of scores per head: rows, or more for a block's queries
    cdef float* scores               # [n_heads, score_rows] the shared routine's scratch
    cdef float* lanes                # [n_heads, GGML_LANES * head_dim] its scratch in llama.cpp's arithmetic
    cdef int arithmetic              # the model's: ARITH_RUNC or ARITH_GGML (kernels/elementwise.pxd)
    cdef const float** kptr          # [n_heads, rows] key rows gathered for the shared routine
    cdef const float** vptr          # [n_heads, rows] value rows
    cdef object _counts              # [counters, n_layers] int64 per-layer counters (None: none); reset() zeroes them
    cdef long long* length           # row 0 of _counts: positions seen by each layer (blocks run layer by layer)

    cdef int init_gather(self, config, long long rows, int counters=*, long long score_rows=*) except -1
    cdef void* own(self, array) except NULL
    cdef int check_in_order(self, int layer, long long pos, long long expected) except -1 nogil
    # store position pos of layer's rows (in order): the layouts' own (dense.pyx, window.pyx)
    cdef int keep(self, int layer, long long pos, const float* k, const float* v) except -1 nogil

    # Attention of query head h over the n rows gathered in kptr/vptr[h] (bias: NULL or one per row)
    cdef inline void attend_gathered(self, int h, const float* q, const float* bias, Py_ssize_t n,
                                     float* out) noexcept nogil:
        attend_head(q + h * self.head_dim, self.kptr + h * self.rows, self.vptr + h * self.rows, bias, n,
                    self.head_dim, self.scores + h * self.score_rows, out + h * self.head_dim, self.arithmetic,
                    self.lanes + h * GGML_LANES * self.head_dim)

    # Query head h at positions pos .. pos + m - 1 (q, out: m rows of n_heads * head_dim floats), query j
    # over the contiguous rows 0 .. pos + j of its KV head (keys/values + t * stride): the shared routine
    # BLOCK_QUERIES queries at a time, with attend_head's bits. The scores scratch holds BLOCK_QUERIES rows
    # of score_rows / BLOCK_QUERIES floats per head (init_gather's score_rows).
    cdef inline void attend_prefix(self, int h, const float* q, const float* keys, const float* values,
                                   Py_ssize_t stride, long long pos, Py_ssize_t m, float* out) noexcept nogil:
        cdef Py_ssize_t c, j0, q_dim = self.n_heads * self.head_dim
        cdef int hd = self.head_dim
        for c in range((m + BLOCK_QUERIES - 1) // BLOCK_QUERIES):
            j0 = c * BLOCK_QUERIES
            attend_head_rows(q + j0 * q_dim + h * hd, q_dim, keys, values, stride, pos + j0 + 1,
                             min(<Py_ssize_t>BLOCK_QUERIES, m - j0), hd, self.scores + h * self.score_rows,
                             self.score_rows // BLOCK_QUERIES, out + j0 * q_dim + h * hd, q_dim, self.arithmetic,
                             self.lanes + h * GGML_LANES * hd)

    # The query heads of one position that share a KV head, from head h0 on, count of them (q, out:
    # n_heads * head_dim floats), over that KV head's contiguous rows 0 .. n - 1 (keys/values +
    # t * stride): the rows read once for the heads, with attend_head's bits for each
    cdef inline void attend_heads(self, int h0, int count, const float* q, const float* keys, const float* values,
                                  Py_ssize_t stride, long long n, float* out) noexcept nogil:
        attend_group_rows(q + h0 * self.head_dim, keys, values, stride, n, count, self.head_dim,
                          self.scores + h0 * self.score_rows, self.score_rows, out + h0 * self.head_dim,
                          self.arithmetic, self.lanes + h0 * GGML_LANES * self.head_dim)

    # How many parts a KV head's query heads are split into for a team of threads: one (its rows read
    # once per step) unless there are fewer KV heads than threads. Part p of KV head g is the heads
    # g * kv_mul + p * size .. of size = ceil(kv_mul / parts) (a last part may be short or empty).
    cdef inline int group_parts(self, int team) noexcept nogil:
        if self.n_kv_heads >= team:
            return 1
        return min(self.kv_mul, (team + self.n_kv_heads - 1) // self.n_kv_heads)

    # Part u (0 .. n_kv_heads * parts - 1) of a step's query heads split as group_parts gives: its KV
    # head is u // parts, its first query head part_first, and part_heads of them (0: an empty last part)
    cdef inline int part_first(self, int u, int parts) noexcept nogil:
        return (u // parts) * self.kv_mul + (u % parts) * ((self.kv_mul + parts - 1) // parts)

    cdef inline int part_heads(self, int u, int parts) noexcept nogil:
        cdef int size = (self.kv_mul + parts - 1) // parts
        return max(0, min(size, (u // parts + 1) * self.kv_mul - self.part_first(u, parts)))

# ---- gathering: append rows to one head's tables kp/vp at index j; return the new count ------------
# keys/values point at the first row (already offset to the KV head); rows are `stride` floats apart.
# bias: NULL, or this head's per-row bias, set to 0 for the exact rows appended.

cdef inline long long take_rows(const float** kp, const float** vp, float* bias, long long j, const float* keys,
                                const float* values, long long n, Py_ssize_t stride) noexcept nogil:
    """n consecutive rows."""
    cdef long long i
    for i in range(n):
        kp[j + i] = keys + i * stride
        vp[j + i] = values + i * stride
    if bias != NULL:
        for i in range(n):
            bias[j + i] = 0.0
    return j + n


cdef inline long long take_listed(const float** kp, const float** vp, float* bias, long long j, const float* keys,
                                  const float* values, const long long* rows, long long n,
                                  Py_ssize_t stride) noexcept nogil:
    """The n rows listed in rows[0 .. n-1], in that order."""
    cdef long long i
    for i in range(n):
        kp[j + i] = keys + rows[i] * stride
        vp[j + i] = values + rows[i] * stride
    if bias != NULL:
        for i in range(n):
            bias[j + i] = 0.0
    return j + n


cdef inline long long take_ring(const float** kp, const float** vp, float* bias, long long j, const float* keys,
                                const float* values, long long slot, long long n, long long ring,
                                Py_ssize_t stride) noexcept nogil:
    """n rows of a ring buffer of `ring` rows, from row `slot` on, wrapping around."""
    cdef long long i
    for i in range(n):
        kp[j + i] = keys + slot * stride
        vp[j + i] = values + slot * stride
        slot = slot + 1
        if slot == ring:
            slot = 0
    if bias != NULL:
        for i in range(n):
            bias[j + i] = 0.0
    return j + n
