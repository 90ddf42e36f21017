# The products the engine calls (see matvec.pyx): every stored type, through the type table (qproduct.pyx).

# the most matrices that one grouped product (matmul_many) takes
cdef enum:
    MAX_MANY = 4

# The packed copy of a matrix (qpacked.h), made on the first product that needs it and shared by every
# Matrix of the same tensor (qproduct.pyx's PackedCopy holds it)
cdef enum:
    PACK_PENDING = 0         # not made yet: the next product makes it
    PACK_READY = 1           # packed points at it
    PACK_MAPPED = 2          # none will be made (no memory for it): the products read the file's layout

cdef struct PackSlot:
    const void* packed
    int state
    void* owner              # the PackedCopy it belongs to (borrowed: the tensor holds that)

cdef struct Matrix:
    int qtype                # the type's id: its row of the table (pyllama.kernels.qtypes.QType)
    const void* data         # the blocks as stored (the memory-mapped file)
    PackSlot* pack           # NULL: the products always read data
    const float* scales      # Q8_GROUPS: one float32 per group
    int group_size           # Q8_GROUPS; 0 for every other type
    Py_ssize_t rows          # outputs
    Py_ssize_t cols          # inputs

cdef struct QuantScratch:
    # the activation vector quantised once per product for the integer kernels
    signed char* q           # int8[cols]
    # scales: one per group of 32 (Q8_0, Q8_1), 256 (Q8_K) or group_size (Q8_GROUPS); room for cols per
    # position, of which Q8_0's block product uses the rest for a side-by-side copy
    float* scales
    float* sums              # Q8_1: fp16(d * sum(q)) per group of 32
    short* bsums             # Q8_K: the sum of each 16 int8 values
    int* isums               # Q8_0: the sums of each 4 and of each 32 int8 values (cols / 4 + cols / 32)

cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil
cdef object quant_scratch(QuantScratch* scratch, Py_ssize_t cols, Py_ssize_t n_pos=*)
cdef void matvec(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil
# out[n_pos, m.rows] = x[n_pos, m.cols] @ W^T, each weight row read once per block; element (p, r)
# bit-identical to matvec on x[p]
cdef void matmul(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                 int n_threads) noexcept nogil
# matmul of count <= MAX_MANY matrices over the same x (same columns; n_pos = 1 too) in one parallel loop
# where their rows share an activation type (all float: F32, F16, BF16; Q8_0; the 32-value types that take
# Q8_0, or Q8_1; the K-quants), else one matmul after another; the same bits either way
cdef void matmul_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                      QuantScratch* scratch, int n_threads) noexcept nogil

cdef void embedding_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
# the kernel's view of a Tensor; pack=False: never its packed copy (the products read the file's layout)
cdef Matrix matrix_of(object tensor, bint pack=*)
