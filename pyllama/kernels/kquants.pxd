# K-quants (see kquants.pyx). matmul_kquant: out[n_pos, rows] = x[n_pos, cols] · Wᵀ.
from pyllama.kernels.matvec cimport Matrix, QuantScratch
from pyllama.kernels.qproduct cimport RowProduct

cdef void matmul_kquant(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                        int n_threads) noexcept nogil
cdef void dequantize_row_kquant(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
cdef RowProduct kquant_product(const Matrix* m) noexcept nogil
