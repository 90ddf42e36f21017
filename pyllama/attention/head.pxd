# The one routine every built-in uses to attend one head over a set of cached rows (head.pyx).

cdef void attend_head(const float* q, const float** keys, const float** values, const float* bias,
                      Py_ssize_t n, int head_dim, float* scores, float* out) noexcept nogil

# queries j < m of one head over contiguous rows 0 .. n + j - 1, with attend_head's bits (head.pyx)
cdef void attend_head_rows(const float* q, Py_ssize_t q_stride, const float* keys, const float* values,
                           Py_ssize_t stride, long long n, Py_ssize_t m, int head_dim, float* scores,
                           Py_ssize_t score_stride, float* out, Py_ssize_t out_stride) noexcept nogil
