# Matrix-vector products over weights in their stored format (see matvec.pyx).

cdef enum:
    QTYPE_F32 = 0
    QTYPE_F16 = 1
    QTYPE_Q8_0 = 2
    QTYPE_Q8_GROUPS = 3
    # ggml block types multiplied by qlegacy.pyx and kquants.pyx (the table: kernels/qtypes.py)
    QTYPE_Q4_0 = 4
    QTYPE_Q4_1 = 5
    QTYPE_Q5_0 = 6
    QTYPE_Q5_1 = 7
    QTYPE_IQ4_NL = 8
    QTYPE_BF16 = 9
    QTYPE_Q2_K = 10
    QTYPE_Q3_K = 11
    QTYPE_Q4_K = 12
    QTYPE_Q5_K = 13
    QTYPE_Q6_K = 14

# the most matrices that one grouped block product (matmul_many) takes
cdef enum:
    MAX_MANY = 4

cdef struct Matrix:
    int qtype
    const void* data
    const float* scales      # QTYPE_Q8_GROUPS: one float32 per group
    int group_size           # QTYPE_Q8_GROUPS
    Py_ssize_t rows          # outputs
    Py_ssize_t cols          # inputs

cdef struct QuantScratch:
    # the activation vector quantised once per matvec for the integer kernels
    signed char* q           # int8[cols]
    # scales: one per group of 32 (Q8_0, Q8_1), 256 (Q8_K) or group_size (Q8_GROUPS); room for cols per
    # position, of which matmul_q8_0 uses the rest for a side-by-side copy
    float* scales
    float* sums              # Q8_1: fp16(d * sum(q)) per group of 32
    short* bsums             # Q8_K: the sum of each 16 int8 values

cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil
cdef void matvec_f32(float* out, const float* w, const float* x, Py_ssize_t rows, Py_ssize_t cols,
                     int n_threads) noexcept nogil
cdef object quant_scratch(QuantScratch* scratch, Py_ssize_t cols, Py_ssize_t n_pos=*)
cdef void matvec(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil
# out[n_pos, m.rows] = x[n_pos, m.cols] @ W^T, each weight row read once per block; element (p, r)
# bit-identical to matvec on x[p]
cdef void matmul(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                 int n_threads) noexcept nogil
# matmul of count <= MAX_MANY matrices over the same x (same columns; n_pos = 1 too) in one parallel loop
# where their types allow (all F32, all Q8_0, block-quantised types of one activation type), else one
# matmul after another; the same bits either way
cdef void matmul_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                      QuantScratch* scratch, int n_threads) noexcept nogil


# A grouped product splits each of its matrices into units of unit_rows rows (a strip, a row pair) and
# numbers them one matrix after another: first[k] is matrix k's first unit, first[count] the total.
cdef inline Py_ssize_t number_units(Py_ssize_t* first, const Matrix** ms, int count,
                                    Py_ssize_t unit_rows) noexcept nogil:
    cdef int k
    first[0] = 0
    for k in range(count):
        first[k + 1] = first[k] + (ms[k].rows + unit_rows - 1) // unit_rows
    return first[count]


cdef inline int matrix_of_unit(const Py_ssize_t* first, int count, Py_ssize_t t) noexcept nogil:
    """The matrix that unit t belongs to (see number_units)."""
    cdef int k = 0
    while k + 1 < count and t >= first[k + 1]:
        k += 1
    return k


cdef void embedding_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil
cdef Matrix matrix_of(object tensor)
