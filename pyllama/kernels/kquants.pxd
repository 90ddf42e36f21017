# K-quants (see kquants.pyx). kquant_product: how matvec.pyx multiplies a matrix of them.
from pyllama.kernels.matvec cimport Matrix
from pyllama.kernels.qproduct cimport RowProduct

cdef void dequantize_row_kquant(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
cdef RowProduct kquant_product(const Matrix* m) noexcept nogil
