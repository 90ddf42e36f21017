# Vector kernels on raw float32 pointers; see elementwise.pyx for what each guarantees.

cdef float fast_expf(float x) noexcept nogil
cdef void exp_inplace(float* x, Py_ssize_t n) noexcept nogil
cdef void rmsnorm(float* out, const float* x, const float* weight, Py_ssize_t n, float eps) noexcept nogil
cdef void softmax(float* x, Py_ssize_t n) noexcept nogil
cdef void swiglu(float* hb, const float* hb2, Py_ssize_t n) noexcept nogil
cdef void add_inplace(float* y, const float* x, Py_ssize_t n) noexcept nogil
