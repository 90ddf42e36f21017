# The one routine every built-in uses to attend one head over a set of cached rows (head.pyx).

cdef void attend_head(const float* q, const float** keys, const float** values, const float* bias,
                      Py_ssize_t n, int head_dim, float* scores, float* out) noexcept nogil
