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

# one row times four positions (a4[0..3]) into out[p * out_stride], each element the row kernel's
ctypedef void (*tile4_dot_fn)(const unsigned char* w, const pyllama_qact* a4, Py_ssize_t cols, float* out,
                              Py_ssize_t out_stride) noexcept nogil
# eight rows times four positions into out[p * out_stride + j], each element the eight-row kernel's
ctypedef void (*group8x4_dot_fn)(const unsigned char* w, Py_ssize_t row_bytes, const pyllama_qact* a4,
                                 Py_ssize_t cols, float* out, Py_ssize_t out_stride) noexcept nogil

# four consecutive rows times four positions into out[p * out_stride + j], each element the row kernel's
ctypedef group8x4_dot_fn group4x4_dot_fn

# how one matrix is multiplied: its row kernel, or its eight-row kernel (then rows % 8 == 0), its
# four-position kernels for blocks, the activation type it pairs with and the bytes of a row
# (qlegacy_product, kquant_product)
ctypedef struct RowProduct:
    row_dot_fn dot
    group8_dot_fn dot8       # NULL: one row at a time with dot
    tile4_dot_fn tile4       # NULL: a block one position at a time with dot (unused with dot8)
    group8x4_dot_fn dot8x4   # with dot8: a block four positions at a time
    group4x4_dot_fn dot4x4   # without dot8: a block four rows and four positions at a time (rows % 4 == 0)
    int act
    Py_ssize_t row_bytes

# out_k[p, r] = W_k[r] · x[p] for count <= MAX_MANY matrices of x's columns whose products share one
# activation type (plans[k].act): x quantised once, the rows of all of them in one parallel loop
cdef void quant_product_many(int count, float** outs, const Matrix** ms, const RowProduct* plans, const float* x,
                             Py_ssize_t n_pos, QuantScratch* scratch, int n_threads) noexcept nogil
