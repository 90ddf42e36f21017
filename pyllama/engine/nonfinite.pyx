"""Non-finite detection: after each layer a forward checks its residual stream (``all_finite``, an
OR over integer tests: cheap enough for every token); on the first bad layer these functions find
which of that layer's outputs went bad first, so the error can name the layer and the stage.

A pass writes ``row_bad``/``row_stage`` per row and then reports its earliest bad row in
``nonfinite_*``.
"""

from pyllama.engine.state cimport (
    Config, RunState, NONFINITE_EMBEDDING, NONFINITE_QKV, NONFINITE_ATTENTION, NONFINITE_WO, NONFINITE_FFN,
)
from pyllama.kernels.finite cimport all_finite


cdef int nonfinite_stage_of(const float* q, const float* k, const float* v, const float* att,
                            const float* wo_out, int q_dim, int kv_dim, int dim) noexcept nogil:
    """Which of a layer's outputs went bad first (NONFINITE_*), given that its residual stream did."""
    if not (all_finite(q, q_dim) and all_finite(k, kv_dim) and all_finite(v, kv_dim)):
        return NONFINITE_QKV
    if not all_finite(att, q_dim):
        return NONFINITE_ATTENTION
    if not all_finite(wo_out, dim):
        return NONFINITE_WO
    return NONFINITE_FFN


cdef void check_rows(RunState* s, const Config* c, int li, Py_ssize_t n) noexcept nogil:
    # after layer li (-1: the embedding) of a pass: the rows whose residual stream just went bad
    cdef Py_ssize_t i
    for i in range(n):
        if s.row_bad[i] >= 0 or all_finite(s.x + i * c.dim, c.dim):
            continue
        if li < 0:
            s.row_bad[i] = 0
            s.row_stage[i] = NONFINITE_EMBEDDING
        else:
            s.row_bad[i] = li
            s.row_stage[i] = nonfinite_stage_of(
                s.q + i * c.q_dim, s.k + i * c.kv_dim, s.v + i * c.kv_dim,
                s.att + i * c.q_dim, s.xb2 + i * c.dim, c.q_dim, c.kv_dim, c.dim)


cdef void first_bad_row(RunState* s, Py_ssize_t n, long long pos) noexcept nogil:
    # the engine's nonfinite_* from a pass's rows: the earliest position that went bad
    cdef Py_ssize_t i
    s.nonfinite_layer = -1
    for i in range(n):
        if s.row_bad[i] >= 0:
            s.nonfinite_layer = s.row_bad[i]
            s.nonfinite_stage = s.row_stage[i]
            s.nonfinite_position = pos + i
            return
