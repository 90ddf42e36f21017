# The one routine every built-in uses to attend one head over a set of cached rows (head.pyx).

# lanes of llama.cpp's weighted sum of the value rows (ggml_vec_dot_f32 on AVX2): the ``lanes`` scratch
# of the two routines holds GGML_LANES * head_dim floats
cdef enum:
    GGML_LANES = 32

# arithmetic: ARITH_RUNC (pyllama's own order) or ARITH_GGML (llama.cpp's; kernels/elementwise.pxd)
cdef void attend_head(const float* q, const float** keys, const float** values, const float* bias,
                      Py_ssize_t n, int head_dim, float* scores, float* out, int arithmetic,
                      float* lanes) noexcept nogil

# queries j < m of one head over contiguous rows 0 .. n + j - 1, with attend_head's bits (head.pyx)
cdef void attend_head_rows(const float* q, Py_ssize_t q_stride, const float* keys, const float* values,
                           Py_ssize_t stride, long long n, Py_ssize_t m, int head_dim, float* scores,
                           Py_ssize_t score_stride, float* out, Py_ssize_t out_stride, int arithmetic,
                           float* lanes) noexcept nogil

# queries j < m of one head over rows 0 .. fixed - 1 and fixed + j .. fixed + j + window - 1 (a window
# moving a row per query after sinks), with attend_head's bits (head.pyx); kp, vp: [fixed + window] scratch
cdef void attend_head_window(const float* q, Py_ssize_t q_stride, const float* keys, const float* values,
                             Py_ssize_t stride, long long fixed, long long window, Py_ssize_t m, int head_dim,
                             float* scores, Py_ssize_t score_stride, float* out, Py_ssize_t out_stride,
                             int arithmetic, float* lanes, const float** kp, const float** vp) noexcept nogil

# the query heads j < g of one position that share a KV head, each over the same contiguous rows
# 0 .. n - 1, with attend_head's bits; a KV head's rows read once for the g heads (head.pyx); lanes:
# [GGML_LANES, head_dim] scratch
cdef void attend_group_rows(const float* q, const float* keys, const float* values, Py_ssize_t stride,
                            long long n, int g, int head_dim, float* scores, Py_ssize_t score_stride, float* out,
                            int arithmetic, float* lanes) noexcept nogil
