# Vector kernels on raw float32 pointers; see elementwise.pyx for what each guarantees.

# Which program's arithmetic the row kernels reproduce: llama2.c's run.c (llama2.c checkpoints) or
# ggml's CPU backend (GGUF files), see ModelConfig.arithmetic.
cdef enum:
    ARITH_RUNC = 0
    ARITH_GGML = 1

# the FFN's gated activation (ModelConfig.ffn_activation)
cdef enum:
    FFN_SILU = 0
    FFN_GELU_TANH = 1

# the code of a config's (or a name's) arithmetic; a config without the attribute is run.c's
cdef int arithmetic_of(config) except -1
cdef int arithmetic_code(name) except -1

cdef float fast_expf(float x) noexcept nogil
cdef void exp_inplace(float* x, Py_ssize_t n) noexcept nogil
cdef void rmsnorm(float* out, const float* x, const float* weight, Py_ssize_t n, float eps) noexcept nogil
cdef void softmax(float* x, Py_ssize_t n) noexcept nogil
cdef void softmax4(float* x, Py_ssize_t stride, Py_ssize_t n0) noexcept nogil
cdef void swiglu(float* hb, const float* hb2, Py_ssize_t n) noexcept nogil
cdef void rmsnorm_ggml(float* out, const float* x, const float* weight, Py_ssize_t n, float eps) noexcept nogil
cdef void swiglu_ggml(float* hb, const float* hb2, Py_ssize_t n) noexcept nogil
cdef void rmsnorm_as(int arithmetic, float* out, const float* x, const float* weight, Py_ssize_t n,
                     float eps) noexcept nogil
cdef void swiglu_as(int arithmetic, float* hb, const float* hb2, Py_ssize_t n) noexcept nogil
cdef void geglu_ggml(float* hb, const float* hb2, Py_ssize_t n) noexcept nogil
cdef void ffn_act_as(int activation, int arithmetic, float* hb, const float* hb2, Py_ssize_t n) noexcept nogil
cdef void add_inplace(float* y, const float* x, Py_ssize_t n) noexcept nogil
