# 32-value block types and BF16 (see qlegacy.pyx). matmul_qlegacy: out[n_pos, rows] = x[n_pos, cols] · Wᵀ.
from pyllama.kernels.matvec cimport Matrix, QuantScratch
from pyllama.kernels.qproduct cimport RowProduct

cdef void matmul_qlegacy(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                         int n_threads) noexcept nogil
cdef void dequantize_row_qlegacy(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
cdef RowProduct qlegacy_product(const Matrix* m) noexcept nogil
