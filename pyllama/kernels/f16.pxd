# F16 rows (see f16.pyx).
from pyllama.kernels.matvec cimport Matrix

cdef void matvec_f16(float* out, const Matrix* m, const float* x, int n_threads) noexcept nogil
# out[n_pos, rows] = x[n_pos, cols] @ W^T, element (p, i) bit-identical to matvec_f16 on x[p]
cdef void matmul_f16(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, int n_threads) noexcept nogil
