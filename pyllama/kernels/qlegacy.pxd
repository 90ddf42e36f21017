# 32-value block types and BF16 (see qlegacy.pyx). qlegacy_product: how matvec.pyx multiplies a matrix of them.
from pyllama.kernels.matvec cimport Matrix
from pyllama.kernels.qproduct cimport RowProduct

cdef void dequantize_row_qlegacy(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
cdef RowProduct qlegacy_product(const Matrix* m) noexcept nogil
