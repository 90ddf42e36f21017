"""Cython nogil kernels: the matrix products of every weight type (one row each in the table of
``qtypes.h``), rmsnorm, softmax, fast exp, SwiGLU, RoPE.

Every kernel is a ``noexcept nogil`` function on raw pointers (declared in the ``.pxd`` for other
Cython modules to cimport) with a thin memoryview wrapper that checks shapes, for tests and Python.
Parallel kernels split independent outputs across OpenMP threads with a static schedule, so each
output element is computed by one thread with the same arithmetic: results are bit-identical for
any thread count.
"""
