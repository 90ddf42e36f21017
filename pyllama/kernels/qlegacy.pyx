"""Products over ggml's 32-value block types and BF16, on their own blocks (never expanded to float32).

Block layouts (ggml-common.h), weight value per element:

* ``Q4_0`` (18 bytes): fp16 d, 16 bytes of nibbles; w = d * (q - 8). Activation: Q8_0.
* ``Q4_1`` (20 bytes): fp16 d, fp16 m, nibbles; w = d * q + m. Activation: Q8_1.
* ``Q5_0`` (22 bytes): fp16 d, 32 high bits, nibbles; w = d * (q - 16). Activation: Q8_0.
* ``Q5_1`` (24 bytes): fp16 d, fp16 m, 32 high bits, nibbles; w = d * q + m. Activation: Q8_1.
* ``IQ4_NL`` (18 bytes): fp16 d, nibbles indexing a 16-entry int8 table; w = d * table[q]. Activation: Q8_0.
* ``BF16``: bfloat16 rows, widened exactly to float32 as they are read. The activation stays float32
  (llama.cpp rounds it to BF16 for its BF16 products; as for F16, pyllama keeps the more accurate
  float32 and documents the difference). 32 float lanes (j mod 32) in a fixed reduction, then the
  last cols mod 32 products in order.

Low nibbles are the block's elements 0-15, high nibbles 16-31; high bit j of a 5-bit type is bit j
of the little-endian uint32. Per block, the integer products are summed exactly; the float part
follows, bit for bit, the kernel llama.cpp runs for the matrix on an AVX2 CPU (ggml-cpu's
arch/x86/quants.c and repack.cpp; checked against libggml-cpu's own ``vec_dot`` and
``gemv_q4_0_8x8_q8_0`` on random rows, and by tests/test_ggml_order.py):

* ``ggml_vec_dot_*`` (Q4_1, Q5_0, Q5_1; Q4_0 and IQ4_NL when the row count is not a multiple of 8):
  8 int32 lanes per block (lane l: elements 4l..4l+3), each converted to float32 and fused-multiply-
  added with ``d_w * d_x`` into ONE accumulator, block after block, then ``hsum_float_8``'s reduction
  ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). For Q4_1/Q5_1 the offset term ``m_w * s_x`` (s = d_x * sum q_x,
  from the Q8_1 activation) is a fused chain over the blocks in order, added last.
* IQ4_NL's vec_dot takes blocks in pairs into two accumulators (even, odd), adds them lane-wise, reduces
  as above, and adds an odd last block as total + (d_x * d_w) * isum (two roundings).
* Q4_0 and IQ4_NL matrices whose row count is a multiple of 8 are repacked by llama.cpp into 8-row
  groups and multiplied by ``gemv/gemm_q4_0_8x8_q8_0`` (decode and prompt alike, the same arithmetic
  per element): per block the whole 32-product integer sum, then one float chain
  acc = fma((float)isum, d_w * d_x, acc). pyllama computes those matrices eight rows at a time
  (an eight-row ``RowProduct``), lane j of one vector being row j's chain, without repacking the mapped
  file: the activation block is loaded once for the eight rows and, for Q4_0, the nibbles are used
  unsigned, (q - 8)·x = q·x - 8·Σx, which is the same integer.

In a block of positions (prompts, teacher forcing) the vec_dot types take four positions at a time: one
row (``RowProduct.tile4``), or four rows where the row count is a multiple of 4 (``dot4x4``,
qlegacy_rows4.h), so that four rows share each activation load. Every element is still the row dot's.

AVX2 (with FMA) and the portable C path compute the same integers and the same float operations (one
rounding per fused multiply-add: ``_mm256_fmadd_ps`` or ``fmaf``), so the two builds give identical
bits (checked: every type at several row counts and lengths, an AVX2 build against a portable one, bit
for bit); the tests compare either against gguf-py and the emulation of ggml's order. With AVX-512 (F
and BW; VNNI when the CPU has it) the integer part takes two blocks per 512-bit register (and two rows
of an eight-row group); its lanes are the AVX2 lanes, converted and fused into the same 8-lane float
chain block by block, so an AVX-512 build gives the AVX2 bits too. BF16 keeps its 32 float lanes in two
zmm registers. ``PYLLAMA_EMULATE_AVX512`` builds that path on a CPU without AVX-512 (README, Build
options), which is how a machine of either kind tests it.
"""

from libc.stdint cimport uint8_t

from pyllama.kernels.matvec cimport (Matrix, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1,
                                     QTYPE_IQ4_NL, QTYPE_BF16)
from pyllama.kernels.qproduct cimport (
    pyllama_qact, row_dot_fn, group8_dot_fn, group8x4_dot_fn, group4x4_dot_fn, tile4_dot_fn, RowProduct, ACT_Q8_0,
    ACT_Q8_1, ACT_F32,
)

cdef extern from "qlegacy.h":
    int PL_Q4_0, PL_Q4_1, PL_Q5_0, PL_Q5_1, PL_IQ4_NL
    float dot_q4_0 "pyllama_dot_q4_0"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q4_1 "pyllama_dot_q4_1"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q5_0 "pyllama_dot_q5_0"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q5_1 "pyllama_dot_q5_1"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    void tile4_q4_1 "pyllama_tile4_q4_1"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    void tile4_q5_0 "pyllama_tile4_q5_0"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    void tile4_q5_1 "pyllama_tile4_q5_1"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    float dot_iq4_nl "pyllama_dot_iq4_nl"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_bf16 "pyllama_dot_bf16"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    void dequantize_legacy "pyllama_dequantize_legacy"(int kind, const uint8_t* data, Py_ssize_t row, float* out,
                                                       Py_ssize_t cols) noexcept nogil
    Py_ssize_t legacy_row_bytes "pyllama_legacy_row_bytes"(int kind, Py_ssize_t cols) noexcept nogil
    float bf16_to_float "pyllama_bf2f"(unsigned short h) noexcept nogil

cdef extern from "qlegacy_rows8.h":
    void dot8_q4_0_chain "pyllama_dot8_q4_0_chain"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                                   Py_ssize_t n, float* out) noexcept nogil
    void dot8_iq4_nl_chain "pyllama_dot8_iq4_nl_chain"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                                       Py_ssize_t n, float* out) noexcept nogil
    void dot8x4_q4_0_chain "pyllama_dot8x4_q4_0_chain"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                                       Py_ssize_t n, float* out, Py_ssize_t out_stride) noexcept nogil
    void dot8x4_iq4_nl_chain "pyllama_dot8x4_iq4_nl_chain"(const uint8_t* w, Py_ssize_t row_bytes,
                                                           const pyllama_qact* a, Py_ssize_t n, float* out,
                                                           Py_ssize_t out_stride) noexcept nogil

cdef extern from "qlegacy_rows4.h":
    void rows4x4_q4_1 "pyllama_rows4x4_q4_1"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                             Py_ssize_t n, float* out, Py_ssize_t out_stride) noexcept nogil
    void rows4x4_q5_0 "pyllama_rows4x4_q5_0"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                             Py_ssize_t n, float* out, Py_ssize_t out_stride) noexcept nogil
    void rows4x4_q5_1 "pyllama_rows4x4_q5_1"(const uint8_t* w, Py_ssize_t row_bytes, const pyllama_qact* a,
                                             Py_ssize_t n, float* out, Py_ssize_t out_stride) noexcept nogil


cdef inline int legacy_kind(int qtype) noexcept nogil:
    if qtype == QTYPE_Q4_0:
        return PL_Q4_0
    if qtype == QTYPE_Q4_1:
        return PL_Q4_1
    if qtype == QTYPE_Q5_0:
        return PL_Q5_0
    if qtype == QTYPE_Q5_1:
        return PL_Q5_1
    return PL_IQ4_NL


cdef RowProduct qlegacy_product(const Matrix* m) noexcept nogil:
    """How a matrix of this module's types is multiplied (dispatch on m.qtype)."""
    cdef RowProduct plan
    plan.dot, plan.dot8, plan.act = <row_dot_fn>dot_q4_0, NULL, ACT_Q8_0
    plan.tile4 = NULL
    plan.dot8x4 = NULL
    plan.dot4x4 = NULL
    plan.row_bytes = legacy_row_bytes(legacy_kind(m.qtype), m.cols) if m.qtype != QTYPE_BF16 else m.cols * 2
    # llama.cpp repacks Q4_0 and IQ4_NL matrices whose row count is a multiple of 8 (see the docstring)
    if m.rows % 8 == 0 and (m.qtype == QTYPE_Q4_0 or m.qtype == QTYPE_IQ4_NL):
        plan.dot8 = <group8_dot_fn>(dot8_q4_0_chain if m.qtype == QTYPE_Q4_0 else dot8_iq4_nl_chain)
        plan.dot8x4 = <group8x4_dot_fn>(dot8x4_q4_0_chain if m.qtype == QTYPE_Q4_0 else dot8x4_iq4_nl_chain)
    if m.qtype == QTYPE_BF16:
        plan.dot, plan.act = <row_dot_fn>dot_bf16, ACT_F32
    elif m.qtype == QTYPE_Q4_1:
        plan.dot, plan.tile4, plan.act = <row_dot_fn>dot_q4_1, <tile4_dot_fn>tile4_q4_1, ACT_Q8_1
        plan.dot4x4 = <group4x4_dot_fn>rows4x4_q4_1
    elif m.qtype == QTYPE_Q5_0:
        plan.dot, plan.tile4 = <row_dot_fn>dot_q5_0, <tile4_dot_fn>tile4_q5_0
        plan.dot4x4 = <group4x4_dot_fn>rows4x4_q5_0
    elif m.qtype == QTYPE_Q5_1:
        plan.dot, plan.tile4, plan.act = <row_dot_fn>dot_q5_1, <tile4_dot_fn>tile4_q5_1, ACT_Q8_1
        plan.dot4x4 = <group4x4_dot_fn>rows4x4_q5_1
    elif m.qtype == QTYPE_IQ4_NL:
        plan.dot = <row_dot_fn>dot_iq4_nl
    return plan


cdef void dequantize_row_qlegacy(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    cdef Py_ssize_t j
    cdef const unsigned short* h
    if m.qtype == QTYPE_BF16:
        h = (<const unsigned short*>m.data) + row * m.cols
        for j in range(m.cols):
            out[j] = bf16_to_float(h[j])
        return
    dequantize_legacy(legacy_kind(m.qtype), <const uint8_t*>m.data, row, out, m.cols)
