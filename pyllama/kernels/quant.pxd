from pyllama.kernels.matvec cimport MAX_MANY, Matrix, QuantScratch, matrix_of_unit, number_units

cdef void matvec_q8_0(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil
# matvec_q8_0 of count <= MAX_MANY matrices of the same columns over one x, in one parallel loop
cdef void matvec_q8_0_many(int count, float** outs, const Matrix** ms, const float* x, QuantScratch* scratch,
                           int n_threads) noexcept nogil
cdef void matvec_q8_groups(float* out, const Matrix* m, const float* x, QuantScratch* scratch,
                           int n_threads) noexcept nogil
# the block products: out[n_pos, rows] = x[n_pos, cols] @ W^T, element (p, i) bit-identical to matvec on x[p]
cdef void matmul_q8_0(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                      int n_threads) noexcept nogil
# matmul_q8_0 of count <= MAX_MANY matrices of the same columns over one x, in one parallel loop
cdef void matmul_q8_0_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                           QuantScratch* scratch, int n_threads) noexcept nogil
cdef void matmul_q8_groups(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                           int n_threads) noexcept nogil
cdef void dequantize_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
cdef void quantize_q8_0(signed char* q, float* scales, const float* x, Py_ssize_t n) noexcept nogil
