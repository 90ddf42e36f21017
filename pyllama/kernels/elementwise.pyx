"""Elementwise and row kernels: fast exp, softmax, rmsnorm, SwiGLU, add.

rmsnorm and SwiGLU come in two arithmetics, chosen per model (``ModelConfig.arithmetic``): run.c's
(float sum of squares, ``w * (s * x)``, ``x * (1 / (1 + e^-x))`` with ``fast_expf``), which llama2.c
checkpoints use so that greedy ids equal run.c's, and ggml's (double sum of squares, ``(x * s) * w``,
``x / (1 + e^-x)`` with ggml's own exp, ``ggml_math.h``), which GGUF files use so that every
intermediate tensor carries the bits llama.cpp's CPU backend computes. A one-ulp difference in a
normalised row is enough to flip an int8 rounding when the next product quantises it.

These touch vectors of at most a few thousand floats per token, so they run on one thread; the
reductions (rmsnorm's sum of squares, softmax's max and sum) are serial in index order so that
their result does not depend on how anything else was parallelised.

``fast_expf`` — why and how accurate: libm's ``expf`` is a function call the compiler cannot
vectorise, and attention softmax and SiLU call it for every score and hidden unit. ``fast_expf``
is branch-free (clamp, Cody-Waite reduction x = k ln2 + r with |r| <= ln2/2, degree-6 polynomial
for e^r, exponent bits for 2^k) so loops over it vectorise. Measured maximum relative error
against float64 ``exp`` over [-87, 88]: below 2.5e-7 (about 2 ulp of float32); the tests assert
3e-7. Inputs below -87.3 give exactly 0 (e^-87.3 is below the smallest normal float).
"""

from libc.math cimport sqrtf, floorf
from libc.stdint cimport int32_t
from libc.string cimport memcpy

import numpy as np

cdef float LOG2E = 1.4426950408889634
# ln2 split in a high part with trailing zero bits (exact k*LN2_HI for |k| < 2^10) and the rest
cdef float LN2_HI = 0.693359375
cdef float LN2_LO = -2.12194440e-4
cdef float EXP_LO = -87.33654  # below this e^x is not a normal float: return 0
cdef float EXP_HI = 88.3762626647949  # above this 2^k would overflow the exponent field


cdef int arithmetic_code(name) except -1:
    """ARITH_RUNC for "run.c", ARITH_GGML for "ggml" (ModelConfig.arithmetic); anything else is refused."""
    if name == "ggml":
        return ARITH_GGML
    if name == "run.c":
        return ARITH_RUNC
    raise ValueError(f"arithmetic must be 'run.c' or 'ggml', not {name!r}")


cdef int arithmetic_of(config) except -1:
    return arithmetic_code(getattr(config, "arithmetic", "run.c"))


cdef float fast_expf(float x) noexcept nogil:
    return fast_expf_inline(x)


cdef inline float fast_expf_inline(float x) noexcept nogil:
    # fast_expf's body, inlined into the loops below so that they vectorise (a call per element had
    # cost 4% of a teacher-forced diff of the stories42M shape); locals, not the module's globals,
    # which a store through x could alias
    cdef float log2e = LOG2E, ln2_hi = LN2_HI, ln2_lo = LN2_LO, exp_lo = EXP_LO, exp_hi = EXP_HI
    cdef float xc = x
    if xc > exp_hi:
        xc = exp_hi
    if xc < exp_lo:
        xc = exp_lo
    cdef float k = floorf(xc * log2e + 0.5)
    cdef float r = xc - k * ln2_hi
    r = r - k * ln2_lo
    # Taylor coefficients of e^r to r^6; on |r| <= 0.347 the truncation error is < 1e-8 relative
    cdef float p = 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    cdef int32_t bits = (<int32_t>k + 127) << 23
    cdef float scale
    memcpy(&scale, &bits, 4)
    cdef float result = p * scale
    if x < exp_lo:
        result = 0.0
    return result


cdef void exp_inplace(float* x, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        x[i] = fast_expf_inline(x[i])


cdef void rmsnorm(float* out, const float* x, const float* weight, Py_ssize_t n, float eps) noexcept nogil:
    # the same expression order as llama2.c's run.c
    cdef float ss = 0.0
    cdef Py_ssize_t j
    for j in range(n):
        ss = ss + x[j] * x[j]
    ss = ss / n
    ss = ss + eps
    ss = 1.0 / sqrtf(ss)
    for j in range(n):
        out[j] = weight[j] * (ss * x[j])


cdef void softmax(float* x, Py_ssize_t n) noexcept nogil:
    if n <= 0:
        return
    cdef float max_val = x[0]
    cdef Py_ssize_t i
    for i in range(1, n):
        if x[i] > max_val:
            max_val = x[i]
    for i in range(n):
        x[i] = x[i] - max_val
    exp_inplace(x, n)
    cdef float total = 0.0
    for i in range(n):
        total = total + x[i]
    cdef float inv = 1.0 / total
    for i in range(n):
        x[i] = x[i] * inv


cdef void softmax4(float* x, Py_ssize_t stride, Py_ssize_t n0) noexcept nogil:
    """softmax of four rows at once, row j at x + j * stride with n0 + j values (a block's consecutive
    queries): each row's max, exp and sum exactly as softmax computes them, in index order, with the
    four rows' serial chains (max, then sum) interleaved so that they run side by side instead of
    one after another (alone, each is a chain of dependent float operations: a 512-token block of
    the 42M shape spent 5% of its time in softmax's compares and adds)."""
    cdef float* r0 = x
    cdef float* r1 = x + stride
    cdef float* r2 = x + 2 * stride
    cdef float* r3 = x + 3 * stride
    cdef float m0 = r0[0], m1 = r1[0], m2 = r2[0], m3 = r3[0]
    cdef Py_ssize_t i, j
    for i in range(1, n0):
        if r0[i] > m0:
            m0 = r0[i]
        if r1[i] > m1:
            m1 = r1[i]
        if r2[i] > m2:
            m2 = r2[i]
        if r3[i] > m3:
            m3 = r3[i]
    # the later rows' last values, in their order
    for i in range(n0, n0 + 3):
        if i < n0 + 1 and r1[i] > m1:
            m1 = r1[i]
        if i < n0 + 2 and r2[i] > m2:
            m2 = r2[i]
        if r3[i] > m3:
            m3 = r3[i]
    cdef float maxes[4]
    maxes[0], maxes[1], maxes[2], maxes[3] = m0, m1, m2, m3
    cdef float* row
    for j in range(4):
        row = x + j * stride
        for i in range(n0 + j):
            row[i] = row[i] - maxes[j]
        exp_inplace(row, n0 + j)
    cdef float s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    for i in range(n0):
        s0 = s0 + r0[i]
        s1 = s1 + r1[i]
        s2 = s2 + r2[i]
        s3 = s3 + r3[i]
    for i in range(n0, n0 + 3):
        if i < n0 + 1:
            s1 = s1 + r1[i]
        if i < n0 + 2:
            s2 = s2 + r2[i]
        s3 = s3 + r3[i]
    cdef float inv
    cdef float sums[4]
    sums[0], sums[1], sums[2], sums[3] = s0, s1, s2, s3
    for j in range(4):
        row = x + j * stride
        inv = 1.0 / sums[j]
        for i in range(n0 + j):
            row[i] = row[i] * inv


cdef void swiglu(float* hb, const float* hb2, Py_ssize_t n) noexcept nogil:
    """hb = silu(hb) * hb2, with silu(v) = v * sigmoid(v) as run.c writes it."""
    cdef Py_ssize_t i
    cdef float val
    for i in range(n):
        val = hb[i]
        val = val * (1.0 / (1.0 + fast_expf_inline(-val)))
        hb[i] = val * hb2[i]


cdef extern from "ggml_math.h":
    float pyllama_ggml_expf(float x) nogil
    void pyllama_ggml_swiglu(float* hb, const float* hb2, long n) nogil
    void pyllama_ggml_gelu_init() nogil
    void pyllama_ggml_geglu(float* hb, const float* hb2, long n) nogil

pyllama_ggml_gelu_init()  # ggml's fp16 GELU table, once (ggml_cpu_init does the same)


cdef void rmsnorm_ggml(float* out, const float* x, const float* weight, Py_ssize_t n, float eps) noexcept nogil:
    # ggml's rms_norm then mul: the squares (each rounded to float) summed in double, the mean
    # rounded to float, x * scale rounded before the weight multiplies it
    cdef double ss = 0.0
    cdef Py_ssize_t j
    cdef float mean, scale
    for j in range(n):
        ss = ss + <double>(x[j] * x[j])
    mean = <float>(ss / n)
    scale = 1.0 / sqrtf(mean + eps)
    for j in range(n):
        out[j] = (x[j] * scale) * weight[j]


cdef void swiglu_ggml(float* hb, const float* hb2, Py_ssize_t n) noexcept nogil:
    """hb = silu(hb) * hb2 with ggml's silu, x / (1 + e^-x), and its exp (ggml_math.h)."""
    pyllama_ggml_swiglu(hb, hb2, n)


cdef void geglu_ggml(float* hb, const float* hb2, Py_ssize_t n) noexcept nogil:
    """hb = gelu(hb) * hb2 as ggml_vec_geglu_f32 on the CPU: GELU's tanh form through ggml's fp16 table."""
    pyllama_ggml_geglu(hb, hb2, n)


cdef void ffn_act_as(int activation, int arithmetic, float* hb, const float* hb2, Py_ssize_t n) noexcept nogil:
    """The FFN's gated activation: SwiGLU (FFN_SILU) in the model's arithmetic, or GeGLU (FFN_GELU_TANH, ggml's)."""
    if activation == FFN_GELU_TANH:
        geglu_ggml(hb, hb2, n)
    else:
        swiglu_as(arithmetic, hb, hb2, n)


cdef void rmsnorm_as(int arithmetic, float* out, const float* x, const float* weight, Py_ssize_t n,
                     float eps) noexcept nogil:
    if arithmetic == ARITH_GGML:
        rmsnorm_ggml(out, x, weight, n, eps)
    else:
        rmsnorm(out, x, weight, n, eps)


cdef void swiglu_as(int arithmetic, float* hb, const float* hb2, Py_ssize_t n) noexcept nogil:
    if arithmetic == ARITH_GGML:
        swiglu_ggml(hb, hb2, n)
    else:
        swiglu(hb, hb2, n)


cdef void add_inplace(float* y, const float* x, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = y[i] + x[i]


# ---- memoryview wrappers, for tests and Python callers ----

def exp(const float[::1] x):
    """float32 fast exp of every element (a new array)."""
    out = np.array(x, dtype=np.float32)
    cdef float[::1] o = out
    if o.shape[0]:
        exp_inplace(&o[0], o.shape[0])
    return out


def softmax_(float[::1] x):
    """Softmax of ``x`` in place (max subtracted first)."""
    if x.shape[0]:
        softmax(&x[0], x.shape[0])


ARITHMETIC = {"run.c": ARITH_RUNC, "ggml": ARITH_GGML}


def rmsnorm_(float[::1] out, const float[::1] x, const float[::1] weight, float eps=1e-5, str arithmetic="run.c"):
    if not (out.shape[0] == x.shape[0] == weight.shape[0]):
        raise ValueError("rmsnorm: out, x and weight must have the same length")
    cdef int kind = ARITHMETIC[arithmetic]
    if x.shape[0]:
        rmsnorm_as(kind, &out[0], &x[0], &weight[0], x.shape[0], eps)


def swiglu_(float[::1] hb, const float[::1] hb2, str arithmetic="run.c"):
    if hb.shape[0] != hb2.shape[0]:
        raise ValueError("swiglu: hb and hb2 must have the same length")
    cdef int kind = ARITHMETIC[arithmetic]
    if hb.shape[0]:
        swiglu_as(kind, &hb[0], &hb2[0], hb.shape[0])


def geglu_(float[::1] hb, const float[::1] hb2):
    """hb = gelu(hb) * hb2 in place, as ggml computes it (for tests)."""
    if hb.shape[0] != hb2.shape[0]:
        raise ValueError("geglu_: hb and hb2 differ in length")
    if hb.shape[0]:
        geglu_ggml(&hb[0], &hb2[0], hb.shape[0])


def ggml_exp(const float[::1] x):
    """ggml's AVX2 single-precision exp of every element (a new array), for tests."""
    out = np.array(x, dtype=np.float32)
    cdef float[::1] o = out
    cdef Py_ssize_t i
    for i in range(o.shape[0]):
        o[i] = pyllama_ggml_expf(o[i])
    return out
