# The weight-type table (qtypes.h, one row per type) and the one product loop over it (see qproduct.pyx).
from pyllama.kernels.matvec cimport Matrix, PackSlot, QuantScratch

cdef extern from "qtype.h":
    const int QTYPE_F32 "PYLLAMA_F32"
    ctypedef struct pyllama_matrix:
        const void* data
        const void* packed
        const float* scales
        int group_size
        Py_ssize_t rows
        Py_ssize_t cols
    ctypedef struct pyllama_acts:
        signed char* q
        float* d
        float* s
        short* bsums
        int* isums
        const float* x
        Py_ssize_t cols
        Py_ssize_t n_pos
        Py_ssize_t d_stride
        int group_size
    ctypedef struct ActRow "pyllama_act":
        const char* name
        void (*quantise)(const pyllama_acts* a, Py_ssize_t p) noexcept nogil
    ctypedef struct QTypeRow "pyllama_qtype":
        const char* name
        int ggml
        int block
        int block_bytes
        int act
        int work_div
        Py_ssize_t (*units)(const pyllama_matrix* m, Py_ssize_t n_pos) noexcept nogil
        void (*vec)(const pyllama_matrix* m, Py_ssize_t u0, Py_ssize_t u1, const pyllama_acts* a,
                    float* out) noexcept nogil
        void (*mat)(const pyllama_matrix* m, Py_ssize_t u0, Py_ssize_t u1, const pyllama_acts* a,
                    float* out) noexcept nogil
        void (*dequantize_row)(const pyllama_matrix* m, Py_ssize_t r, float* out) noexcept nogil
        Py_ssize_t (*packed_bytes)(Py_ssize_t rows, Py_ssize_t cols) noexcept nogil
        void (*pack)(const pyllama_matrix* m, Py_ssize_t g0, Py_ssize_t g1, unsigned char* out) noexcept nogil

# the row of a type id (Matrix.qtype)
cdef const QTypeRow* qtype_row(int qtype) noexcept nogil
# outs[k][n_pos, ms[k].rows] = x[n_pos, cols] @ W_k^T for k < count <= MAX_MANY, every W_k with x's columns:
# in one parallel loop when their rows share an activation, else one product after another; element (p, r)
# bit-identical to the product of W_k alone at x[p]
cdef void product_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                       QuantScratch* scratch, int n_threads) noexcept nogil
# out[cols] = row ``row`` of m as float32 (its type's dequantiser)
cdef void dequantize_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil

# The packed copy of one tensor (qpacked.h): made by the first product of a Matrix whose pack points at
# its slot, once per process; the tensor holds it (Tensor.packing), so every engine shares it.
cdef class PackedCopy:
    cdef PackSlot slot
    cdef readonly object source       # the tensor's stored bytes, which the packer reads
    cdef readonly object copy         # the packed bytes (numpy), once made
    cdef readonly int qtype
    cdef readonly Py_ssize_t rows, cols
    cdef readonly double seconds      # how long the packing took
    cdef object lock                  # one maker: engines in other Python threads wait for its copy
    cdef void make(self, int n_threads)
    cdef void make_locked(self, int n_threads)

# the bytes of a rows x cols matrix of type qtype packed, 0 when it is multiplied from the file's layout
cdef Py_ssize_t packed_size(int qtype, Py_ssize_t rows, Py_ssize_t cols) noexcept nogil
