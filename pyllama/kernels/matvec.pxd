# Matrix-vector products over weights in their stored format (see matvec.pyx).

cdef enum:
    QTYPE_F32 = 0
    QTYPE_F16 = 1
    QTYPE_Q8_0 = 2
    QTYPE_Q8_GROUPS = 3

cdef struct Matrix:
    int qtype
    const void* data
    const float* scales      # QTYPE_Q8_GROUPS: one float32 per group
    int group_size           # QTYPE_Q8_GROUPS
    Py_ssize_t rows          # outputs
    Py_ssize_t cols          # inputs

cdef struct QuantScratch:
    # the activation quantised once per product for the integer kernels; matmul: n_pos vectors,
    # position p's at q + p * cols and scales + p * (cols // group) (sized by quant_scratch)
    signed char* q           # int8[n_pos, cols]
    float* scales            # one per group of 32 (Q8_0) or group_size (Q8_GROUPS)

cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil
cdef void matvec_f32(float* out, const float* w, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil
cdef void matmul_f32(float* out, const float* w, const float* x, Py_ssize_t n_pos, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil
cdef object quant_scratch(QuantScratch* scratch, Py_ssize_t cols, Py_ssize_t n_pos=*)
cdef void matvec(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil
# out[n_pos, m.rows] = x[n_pos, m.cols] @ W^T, each weight row read once per block; element (p, r)
# bit-identical to matvec on x[p]
cdef void matmul(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                 int n_threads) noexcept nogil
cdef void embedding_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
cdef Matrix matrix_of(object tensor)
