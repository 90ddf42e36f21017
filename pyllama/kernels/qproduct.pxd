# The product driver shared by the block-quantised types (see qproduct.pyx).
from pyllama.kernels.matvec cimport Matrix, QuantScratch

cdef extern from "qblocks.h":
    ctypedef struct pyllama_qact:
        const signed char* q
        const float* d
        const float* s
        const short* bsums
        const float* x

# what the activation is quantised to before the row products (llama.cpp's vec_dot_type)
cdef enum:
    ACT_Q8_0 = 0
    ACT_Q8_1 = 1
    ACT_Q8_K = 2
    ACT_F32 = 3      # kept as float32 (BF16 weights; see qlegacy.pyx)

ctypedef float (*row_dot_fn)(const unsigned char* w, const pyllama_qact* a, Py_ssize_t cols) noexcept nogil
# eight consecutive rows (w, w + row_bytes, ...) into out[0..7]
ctypedef void (*group8_dot_fn)(const unsigned char* w, Py_ssize_t row_bytes, const pyllama_qact* a, Py_ssize_t cols,
                               float* out) noexcept nogil

cdef void quant_product(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                        int n_threads, row_dot_fn dot, int act, Py_ssize_t row_bytes) noexcept nogil
cdef void quant_product_groups8(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos,
                                QuantScratch* scratch, int n_threads, group8_dot_fn dot8, int act,
                                Py_ssize_t row_bytes) noexcept nogil
