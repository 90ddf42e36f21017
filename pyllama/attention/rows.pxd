# The per-KV-head row store of the KV-cache methods (rows.pyx) and the ranking every selection uses.

from libc.math cimport floor

from pyllama.attention.gather cimport GatherAttention

# queries of a block attended together (a row of scores each, as causal)
cdef enum:
    QUERIES = 16


# One candidate of a selection: ranked by score, then position, then KV head (the lowest go first).
cdef struct Ranked:
    double score
    long long position
    long long head
    long long row


cdef inline long long kept_of(long long n, double ratio, long long capacity) noexcept nogil:
    """Rows a selection over n rows keeps: min(n, capacity), or n - floor(ratio n + 1e-9)."""
    if capacity > 0:
        return n if n < capacity else capacity
    return n - <long long>floor(ratio * n + 1e-9)  # 1e-9: budget.SHARE_SLACK, the binary rounding of the ratio


# float64 dot products of the methods' scores: eight partial sums (lane i takes elements i, i + 8, ...),
# added in one fixed order at the end, so that the compiler may keep the lanes in vectors while every
# thread count and every call give the same bits (a plain running sum is a chain no compiler may reorder)
cdef inline double dot_lanes(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        s0 = s0 + <double>a[i] * b[i]
        s1 = s1 + <double>a[i + 1] * b[i + 1]
        s2 = s2 + <double>a[i + 2] * b[i + 2]
        s3 = s3 + <double>a[i + 3] * b[i + 3]
        s4 = s4 + <double>a[i + 4] * b[i + 4]
        s5 = s5 + <double>a[i + 5] * b[i + 5]
        s6 = s6 + <double>a[i + 6] * b[i + 6]
        s7 = s7 + <double>a[i + 7] * b[i + 7]
        i += 8
    while i < n:
        s0 = s0 + <double>a[i] * b[i]
        i += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


cdef inline double dot_lanes_f64(const double* a, const double* b, Py_ssize_t n) noexcept nogil:
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        s0 = s0 + a[i] * b[i]
        s1 = s1 + a[i + 1] * b[i + 1]
        s2 = s2 + a[i + 2] * b[i + 2]
        s3 = s3 + a[i + 3] * b[i + 3]
        s4 = s4 + a[i + 4] * b[i + 4]
        s5 = s5 + a[i + 5] * b[i + 5]
        s6 = s6 + a[i + 6] * b[i + 6]
        s7 = s7 + a[i + 7] * b[i + 7]
        i += 8
    while i < n:
        s0 = s0 + a[i] * b[i]
        i += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


cdef inline bint is_protected(long long position, long long t, long long sinks, long long window) noexcept nogil:
    """The sinks (p < sinks) and the window (t - window < p <= t) after position t are never evicted."""
    return position < sinks or position > t - window


cdef long long mark_lowest(const double* score, const long long* held, long long n, long long t, long long sinks,
                           long long window, long long target, Ranked* ranked, unsigned char* evict) noexcept nogil
cdef void sort_ranked(Ranked* ranked, long long n) noexcept nogil


cdef class RowStore(GatherAttention):
    cdef readonly double ratio
    cdef readonly long long capacity, sinks, window, positions
    cdef long long P                  # rows per KV head and layer (the most one holds, the appended one included)
    cdef float* keys                  # [n_layers, n_kv_heads, P, head_dim]: a KV head's rows, position order
    cdef float* values
    cdef long long* held              # [n_layers, n_kv_heads, P] the positions of those rows, ascending
    cdef char* row_state              # [n_layers, n_kv_heads, P, state_bytes] a method's state per row, or NULL
    cdef int state_bytes              # bytes of it per row (0: none)
    cdef double* score                # [n_kv_heads, P] a selection's score per row
    cdef Ranked* ranked               # [n_kv_heads, P] a selection's sort scratch
    cdef unsigned char* evict         # [n_kv_heads, P] a selection's flags: the row goes
    cdef long long* count             # counters rows 1 .. n_kv_heads: [n_kv_heads, n_layers] rows held
    cdef long long* extra             # counters rows after those: a subclass's per-layer counters

    cdef int init_rows(self, config, int state_bytes, int extra_counters, long long score_rows) except -1
    cdef int append(self, int layer, long long pos, const float* k, const float* v) except -1 nogil
    cdef void attend_rows(self, int layer, const float* q, float* out, Py_ssize_t m) noexcept nogil
    cdef long long remove_marked(self, int layer, int g, const unsigned char* flags) noexcept nogil
    cdef long long window_at(self, long long target) noexcept nogil
    cdef long long state_bytes_of(self, int layer)

    cdef inline Py_ssize_t row_of(self, int layer, int g) noexcept nogil:
        """The index of KV head g's first row in layer (rows of keys, values, held, row_state)."""
        return (<Py_ssize_t>layer * self.n_kv_heads + g) * self.P

    cdef inline long long* rows_held(self, int layer, int g) noexcept nogil:
        return self.count + <Py_ssize_t>g * self.n_layers + layer
