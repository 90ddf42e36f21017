# Non-finite detection: where NaN or Inf first entered a row's residual stream (nonfinite.pyx).

from pyllama.engine.state cimport Config, RunState

cdef int nonfinite_stage_of(const float* q, const float* k, const float* v, const float* att,
                            const float* wo_out, int q_dim, int kv_dim, int dim) noexcept nogil
cdef void check_rows(RunState* s, const Config* c, int li, Py_ssize_t n) noexcept nogil
cdef void first_bad_row(RunState* s, Py_ssize_t n, long long pos) noexcept nogil
