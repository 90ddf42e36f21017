"""Products over ggml's K-quants (super-blocks of 256 values), on their own blocks, times Q8_K activations.

Block layouts (ggml-common.h; every fp16 is a binary16, scales are unsigned unless said):

* ``Q2_K`` (84 bytes): 16 bytes of (4-bit scale | 4-bit min << 4) per 16 values, 64 bytes of 2-bit q,
  fp16 d, fp16 dmin; w = d * sc * q - dmin * m.
* ``Q3_K`` (110 bytes): 32 bytes of high-bit mask, 64 bytes of 2-bit q, 12 bytes of 16 packed 6-bit
  scales (minus 32), fp16 d; w = d * sc * (q - 4 * (1 - high bit)).
* ``Q4_K`` (144 bytes): fp16 d, fp16 dmin, 12 bytes of 8 packed 6-bit (scale, min) per 32 values, 128
  bytes of nibbles; w = d * sc * q - dmin * m.
* ``Q5_K`` (176 bytes): as Q4_K plus 32 bytes of fifth bits.
* ``Q6_K`` (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales per 16 values,
  fp16 d; w = d * sc * (q - 32).

As llama.cpp does it, the activation is quantised once per product to Q8_K (256 int8 with one float32
scale d_x and the sums of each 16 q_x; ggml's ``quantize_row_q8_K_ref``, which x86 runs), and each
super-block contributes ``d_x * d * Σ_j sc_j Σ q_w q_x - d_x * dmin * Σ_j m_j Σ q_x``, the sums exact in
int32.

**The float order is that of the kernel llama.cpp runs on AVX2**, so a row product has llama.cpp's bits
(checked against ggml's own ``vec_dot`` and repacked gemv, called on the same bytes, over random rows of
every type). ggml's AVX2 ``ggml_vec_dot_qN_K_q8_K`` keeps 8 int32 lanes per super-block: for each run c
of 32 values, lane l holds scale16[2c + l/4] * Σ q_w q_x over the run's values 4l..4l+3 (``maddubs``,
then ``madd`` with the 16-value scales), summed over the 8 runs. Per super-block, with d = d_x * d_w and
dm = -d_x * dmin_w (float32 products):

* every type: acc[l] = fma(d, float(lane[l]), acc[l]), 8 float32 accumulators across the row;
* Q2_K first fuses its mins into the same 8: acc[l] = fma(dm, float(m[2l] bs[2l] + m[2l+1] bs[2l+1]),
  acc[l]);
* Q4_K fuses its mins into 4 more accumulators, lane l taking the 32-value runs 2l and 2l+1; Q5_K into
  one scalar, fma(dm, float(Σ_j m_j Σ q_x), summs);
* Q6_K multiplies the unsigned 6-bit codes and subtracts 32 * (bs[2l] sc[2l] + bs[2l+1] sc[2l+1]) from
  lane l (an integer step: its lanes differ from those of q - 32, their float conversions too);
* the row's result is ggml's ``hsum_float_8``, ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), plus Q4_K's
  (m0+m2)+(m1+m3) or Q5_K's scalar.

Every Q4_K matrix takes the ``vec_dot`` order above, whatever its row count. Newer llama.cpp builds
repack a Q4_K matrix of 8k rows into 8-row groups on AVX2 (``ggml_gemv_q4_K_8x8_q8_K``, another float
order); the build that wrote this project's llama.cpp references did not: with the ``vec_dot`` order
the tiny Q4_K_M and Q3_K_M models give the references' margins to their 6 decimals at every position
of most runs, with the repacked order they part within 3 to 18 tokens (tests/test_quant_models.py).
llama.cpp's batched products of 8 or more positions for K types go through its tiled
kernel (``tiled/tiled.cpp``), another order; pyllama's block products keep the one-position order, so
that a block equals the positions one by one, bit for bit.

fma is ``fmaf`` in the portable C path and ``_mm256_fmadd_ps`` with AVX2, one rounding either way; the
lanes are exact integers, computed in registers (AVX2) or from the unpacked int8[256] (portable), so
the AVX2 and portable (``PYLLAMA_PORTABLE=1``) builds give identical bits. tests/test_kquant_order.py
writes the same order out in numpy from gguf-py's integers. With AVX-512 (F and BW; ``vpdpwssd`` when the
CPU has VNNI) the lanes take 64 values per step, two runs in one register, folded into the same 8 exact
int32 lanes before the float part, which stays 8-wide: an AVX-512 build gives the AVX2 bits
(``PYLLAMA_EMULATE_AVX512`` tests that path on a CPU without AVX-512). llama.cpp on AVX-512 repacks
Q2_K matrices, which is not followed.

The kernels issue no software prefetch: the hardware prefetcher streams the rows, and prefetching 4
KiB ahead cost a third of the decode speed of the 42M shapes.
"""

from libc.stdint cimport uint8_t

from pyllama.kernels.matvec cimport Matrix, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K
from pyllama.kernels.qproduct cimport pyllama_qact, row_dot_fn, tile4_dot_fn, RowProduct, ACT_Q8_K

cdef extern from "kquants.h":
    int PK_Q2_K, PK_Q3_K, PK_Q4_K, PK_Q5_K, PK_Q6_K
    float dot_q2_k "pyllama_dot_q2_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q3_k "pyllama_dot_q3_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q4_k "pyllama_dot_q4_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q5_k "pyllama_dot_q5_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    float dot_q6_k "pyllama_dot_q6_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n) noexcept nogil
    void tile4_q2_k "pyllama_tile4_q2_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    void tile4_q3_k "pyllama_tile4_q3_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    void tile4_q4_k "pyllama_tile4_q4_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    void tile4_q5_k "pyllama_tile4_q5_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    void tile4_q6_k "pyllama_tile4_q6_k"(const uint8_t* w, const pyllama_qact* a, Py_ssize_t n, float* out,
                                         Py_ssize_t stride) noexcept nogil
    Py_ssize_t kquant_row_bytes "pyllama_kquant_row_bytes"(int kind, Py_ssize_t cols) noexcept nogil
    void dequantize_kquant "pyllama_dequantize_kquant"(int kind, const uint8_t* data, Py_ssize_t row, float* out,
                                                       Py_ssize_t cols) noexcept nogil


cdef inline int kquant_kind(int qtype) noexcept nogil:
    if qtype == QTYPE_Q2_K:
        return PK_Q2_K
    if qtype == QTYPE_Q3_K:
        return PK_Q3_K
    if qtype == QTYPE_Q4_K:
        return PK_Q4_K
    if qtype == QTYPE_Q5_K:
        return PK_Q5_K
    return PK_Q6_K


cdef RowProduct kquant_product(const Matrix* m) noexcept nogil:
    """How a K-quant matrix is multiplied (dispatch on m.qtype): one row at a time against Q8_K, a block
    four positions at a time per row (kquants.h's tile4, each element the row dot's steps)."""
    cdef RowProduct plan
    plan.dot8 = NULL
    plan.dot8x4 = NULL
    plan.dot4x4 = NULL
    plan.act = ACT_Q8_K
    plan.row_bytes = kquant_row_bytes(kquant_kind(m.qtype), m.cols)
    plan.dot, plan.tile4 = <row_dot_fn>dot_q6_k, <tile4_dot_fn>tile4_q6_k
    if m.qtype == QTYPE_Q2_K:
        plan.dot, plan.tile4 = <row_dot_fn>dot_q2_k, <tile4_dot_fn>tile4_q2_k
    elif m.qtype == QTYPE_Q3_K:
        plan.dot, plan.tile4 = <row_dot_fn>dot_q3_k, <tile4_dot_fn>tile4_q3_k
    elif m.qtype == QTYPE_Q4_K:
        plan.dot, plan.tile4 = <row_dot_fn>dot_q4_k, <tile4_dot_fn>tile4_q4_k
    elif m.qtype == QTYPE_Q5_K:
        plan.dot, plan.tile4 = <row_dot_fn>dot_q5_k, <tile4_dot_fn>tile4_q5_k
    return plan


cdef void dequantize_row_kquant(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    """out[cols] = row ``row`` of m as float32 (the token embedding lookup)."""
    dequantize_kquant(kquant_kind(m.qtype), <const uint8_t*>m.data, row, out, m.cols)
