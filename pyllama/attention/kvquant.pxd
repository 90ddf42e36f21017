# llama.cpp's KV-cache types: one row quantised as its reference quantiser writes it, and read back
# (kvquant.h; kvquant.pyx).

from libc.stdint cimport uint8_t

# n values (whole blocks of the type) of x into the type's bytes y, and back
cdef void quantize_row_c(int type_code, const float* x, uint8_t* y, Py_ssize_t n) noexcept nogil
cdef void dequantize_row_c(int type_code, const uint8_t* y, float* x, Py_ssize_t n) noexcept nogil
# n_rows rows of n values: row r's bytes at y + r * y_stride, its values to x + r * x_stride
cdef void dequantize_rows_c(int type_code, const uint8_t* y, Py_ssize_t y_stride, float* x, Py_ssize_t x_stride,
                            Py_ssize_t n_rows, Py_ssize_t n) noexcept nogil
