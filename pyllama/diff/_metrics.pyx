"""The diff's per-position metrics over a block of rows, in compiled code, with metrics.py's values.

``metrics.py`` is the plain numpy statement of every metric (and what the tests hold this module
to). Over a 32,000-entry vocabulary it makes a dozen passes over [m, vocab] float64 arrays per
block; here each side's row is read twice (its max and top-1, then one exp per entry summed as
np.sum does) and the pair once more for everything else, without any [m, vocab] log-probability
array: a log-probability is rebuilt where it is needed with numpy's own operations,

    log P_j = (float64(x_j) - max) - log(sum_k exp(float64(x_k) - max)),

so every value is what ``metrics.log_softmax`` and its users give: the same IEEE operations in
the same order, the sums with numpy's pairwise summation tree, the products kept apart from the
sums (no fused multiply-add), and exp and log through numpy's own float64 loops, taken from the
ufuncs at import (``row_metrics.h``): on AVX-512 numpy's vector exp, elsewhere the C library's,
whichever numpy itself runs. ``NUMPY_LOOPS`` says they were found and give np.exp's and np.log's
bits on a test vector; otherwise the C library's exp and log stand in (within an ulp of numpy's).

Rows are independent: they are split over threads with a static schedule, and each row is
computed by one thread, so the results do not depend on the thread count.
"""

from cython.parallel cimport prange
from libc.math cimport INFINITY, NAN

import numpy as np

cimport numpy as cnp

from pyllama.kernels.threads cimport team_size

cnp.import_array()
cnp.import_ufunc()

cdef extern from "row_metrics.h":
    ctypedef void (*pyllama_unary_loop)(char** args, const cnp.npy_intp* n, const cnp.npy_intp* steps,
                                        void* data) noexcept nogil
    ctypedef struct ufunc_loop "pyllama_ufunc_loop":
        pyllama_unary_loop loop
        void* data
    ctypedef struct softmax_row "pyllama_softmax_row":
        double shift
        double log_total
        double total
    void ufunc_apply "pyllama_ufunc_apply"(const ufunc_loop* f, const double* x, double* y,
                                           Py_ssize_t n) noexcept nogil
    double exp_sum "pyllama_exp_sum"(const ufunc_loop* exp_f, const float* x, double shift, double* e,
                                     Py_ssize_t n) noexcept nogil
    double kl_sum "pyllama_kl_sum"(const float* xa, const float* xb, const double* ea, const softmax_row* a,
                                   const softmax_row* b, Py_ssize_t n) noexcept nogil
    Py_ssize_t row_top1 "pyllama_row_top1"(const float* x, Py_ssize_t n, int* finite) noexcept nogil
    double max_abs_one "pyllama_max_abs"(const float* xa, const float* xb, Py_ssize_t n) noexcept nogil
    Py_ssize_t count_above "pyllama_count_above"(const float* x, Py_ssize_t n, float lt, Py_ssize_t t) noexcept nogil

cdef extern from *:
    """
    #include <math.h>
    static void pyllama_libm_exp(char** args, const ptrdiff_t* n, const ptrdiff_t* steps, void* data) {
        (void)steps; (void)data;
        for (ptrdiff_t i = 0; i < *n; i++) ((double*)args[1])[i] = exp(((const double*)args[0])[i]);
    }
    static void pyllama_libm_log(char** args, const ptrdiff_t* n, const ptrdiff_t* steps, void* data) {
        (void)steps; (void)data;
        for (ptrdiff_t i = 0; i < *n; i++) ((double*)args[1])[i] = log(((const double*)args[0])[i]);
    }
    """
    void libm_exp "pyllama_libm_exp"(char** args, const cnp.npy_intp* n, const cnp.npy_intp* steps,
                                     void* data) noexcept nogil
    void libm_log "pyllama_libm_log"(char** args, const cnp.npy_intp* n, const cnp.npy_intp* steps,
                                     void* data) noexcept nogil


cdef ufunc_loop EXP, LOG


cdef bint take_float64_loop(cnp.ufunc f, ufunc_loop* out, const double[::1] probe):
    """The ufunc's first float64 -> float64 loop into ``out``, if it gives f(probe)'s bits."""
    cdef int i
    cdef double[::1] got = np.empty(probe.shape[0])
    for i in range(f.ntypes):
        if f.types[2 * i] == cnp.NPY_DOUBLE and f.types[2 * i + 1] == cnp.NPY_DOUBLE:
            out.loop = <pyllama_unary_loop><void*>f.functions[i]
            out.data = f.data[i]
            ufunc_apply(out, &probe[0], &got[0], probe.shape[0])
            with np.errstate(all="ignore"):
                return np.array_equal(np.asarray(got).view(np.int64), f(np.asarray(probe)).view(np.int64))
    return False


def _take_numpy_loops() -> bool:
    rng = np.random.default_rng(0)
    specials = [0.0, -0.0, 1e-310, -745.2, -708.5, 709.7, np.inf, -np.inf, np.nan]
    exps = np.concatenate([rng.uniform(-750, 5, 4093), rng.uniform(-1, 1, 1000), specials])
    logs = np.concatenate([np.exp(rng.uniform(-700, 700, 4093)), rng.uniform(0, 2, 1000), np.abs(specials)])
    found = take_float64_loop(np.exp, &EXP, exps) and take_float64_loop(np.log, &LOG, logs)
    if not found:
        EXP.loop, EXP.data, LOG.loop, LOG.data = libm_exp, NULL, libm_log, NULL
    return found


NUMPY_LOOPS: bool = _take_numpy_loops()


cdef void softmax_one(const float* x, Py_ssize_t vocab, double* e, softmax_row* row, unsigned char* finite,
                      int* top1) noexcept nogil:
    """One row: finite?, top-1 (argmax, first of equals), and the log-softmax's constants (its max
    and the log of its exp sum; ``e``: each exp, when not NULL). A row with NaN or Inf stops at that."""
    cdef int ok
    cdef Py_ssize_t at = row_top1(x, vocab, &ok)
    finite[0] = ok
    top1[0] = at if ok else -1
    if not ok:
        return
    row.shift = x[at]
    row.total = exp_sum(&EXP, x, row.shift, e, vocab)
    ufunc_apply(&LOG, &row.total, &row.log_total, 1)


cdef void teacher_one(const float* x, Py_ssize_t vocab, const softmax_row* row, bint finite, int t, double* logp,
                      long long* rank) noexcept nogil:
    """metrics.teacher_logprob and retrieval_scores.teacher_rank of one row, teacher token ``t``."""
    if t < 0:
        logp[0] = NAN
        rank[0] = 0 if finite else vocab
        return
    if not finite:
        logp[0] = -INFINITY
        rank[0] = vocab
        return
    logp[0] = ((<double>x[t]) - row.shift) - row.log_total
    rank[0] = count_above(x, vocab, x[t], t) + 1


cdef class RowSoftmax:
    """Up to ``rows`` rows' log-softmax as per-row constants (buffers made once, reused by every
    block): log P_j = (float64(x_j) - shift) - log_total; ``exps`` keeps exp(x_j - shift) when asked
    (the side whose probabilities KL weighs with)."""

    cdef softmax_row[::1] stats
    cdef public object finite, top1, exps
    cdef unsigned char[::1] finite_v
    cdef int[::1] top1_v
    cdef double[:, ::1] exps_v
    cdef bint keep_exps
    cdef Py_ssize_t vocab

    def __init__(self, Py_ssize_t rows, Py_ssize_t vocab, bint keep_exps=False):
        self.vocab = vocab
        self.keep_exps = keep_exps
        self.stats = np.zeros(rows, dtype=[("shift", "f8"), ("log_total", "f8"), ("total", "f8")])
        self.finite = np.zeros(rows, dtype=np.bool_)
        self.finite_v = self.finite.view(np.uint8)
        self.top1 = np.zeros(rows, dtype=np.int32)
        self.top1_v = self.top1
        self.exps = np.zeros((rows if keep_exps else 1, vocab))
        self.exps_v = self.exps

    def compute(self, const float[:, ::1] logits, int n_threads=1):
        """The constants of every row of ``logits`` [m, vocab] (m <= rows)."""
        cdef Py_ssize_t i, m = logits.shape[0], vocab = self.vocab
        if logits.shape[1] != vocab or m > self.stats.shape[0]:
            raise ValueError(f"RowSoftmax of {self.stats.shape[0]} x {vocab}: logits are {m} x {logits.shape[1]}")
        if m == 0 or vocab == 0:
            return
        cdef double* e0 = &self.exps_v[0, 0] if self.keep_exps else NULL
        if team_size(n_threads, m * vocab * 16) == 1:
            with nogil:  # the other side's thread runs meanwhile
                for i in range(m):
                    softmax_one(&logits[i, 0], vocab, e0 + i * vocab if e0 != NULL else NULL, &self.stats[i],
                                &self.finite_v[i], &self.top1_v[i])
            return
        for i in prange(m, nogil=True, schedule="static", num_threads=n_threads):
            softmax_one(&logits[i, 0], vocab, e0 + i * vocab if e0 != NULL else NULL, &self.stats[i],
                        &self.finite_v[i], &self.top1_v[i])

    def teacher(self, const float[:, ::1] logits, const int[::1] next_tokens, double[::1] logp,
                long long[::1] rank):
        """metrics.teacher_logprob and teacher_rank of the rows ``compute`` saw, into ``logp``, ``rank``."""
        cdef Py_ssize_t i, m = logits.shape[0], vocab = self.vocab
        _check_rows(m, vocab, logits, next_tokens, logp, rank)
        for i in range(m):
            teacher_one(&logits[i, 0], vocab, &self.stats[i], self.finite_v[i], next_tokens[i], &logp[i], &rank[i])


def _check_rows(Py_ssize_t m, Py_ssize_t vocab, logits, next_tokens, *outs):
    if logits.shape[1] != vocab or next_tokens.shape[0] != m or any(o.shape[0] != m for o in outs):
        raise ValueError(f"{m} rows of {vocab}: logits {logits.shape[0]} x {logits.shape[1]}, "
                         f"next tokens {next_tokens.shape[0]}, outputs {[o.shape[0] for o in outs]}")


cdef void compare_one(const float* xa, const float* xb, const double* ea, const softmax_row* sa,
                      const softmax_row* sb, bint fa, bint fb, int t, Py_ssize_t vocab, double* max_abs, double* kl,
                      double* logp_a, double* logp_b, long long* rank_a, long long* rank_b) noexcept nogil:
    cdef double s
    teacher_one(xa, vocab, sa, fa, t, logp_a, rank_a)
    teacher_one(xb, vocab, sb, fb, t, logp_b, rank_b)
    if not (fa and fb):  # a NaN or Inf on either side is a difference, never agreement
        max_abs[0] = INFINITY
        kl[0] = INFINITY
        return
    max_abs[0] = max_abs_one(xa, xb, vocab)
    s = kl_sum(xa, xb, ea, sa, sb, vocab)
    kl[0] = s if s >= 0.0 else 0.0  # np.maximum(s, 0.0): KL is non-negative, rounding is not


def compare(RowSoftmax a, RowSoftmax b, const float[:, ::1] la, const float[:, ::1] lb, const int[::1] next_tokens,
            double[::1] max_abs, double[::1] kl, double[::1] logp_a, double[::1] logp_b, long long[::1] rank_a,
            long long[::1] rank_b, int n_threads=1):
    """The pair metrics of the rows both sides' ``compute`` saw (``a`` must keep its exps):
    max |Δlogit|, KL(P_a ‖ P_b), and each side's teacher log-probability and rank."""
    cdef Py_ssize_t i, m = la.shape[0], vocab = a.vocab
    if not a.keep_exps or b.vocab != vocab or lb.shape[0] != m:
        raise ValueError("compare: side A keeps its exps, both sides have one vocabulary and as many rows")
    _check_rows(m, vocab, la, next_tokens, max_abs, kl, logp_a, logp_b, rank_a, rank_b)
    _check_rows(m, vocab, lb, next_tokens)
    if m == 0:
        return
    if team_size(n_threads, m * vocab * 8) == 1:
        for i in range(m):
            compare_one(&la[i, 0], &lb[i, 0], &a.exps_v[i, 0], &a.stats[i], &b.stats[i], a.finite_v[i],
                        b.finite_v[i], next_tokens[i], vocab, &max_abs[i], &kl[i], &logp_a[i], &logp_b[i],
                        &rank_a[i], &rank_b[i])
        return
    for i in prange(m, nogil=True, schedule="static", num_threads=n_threads):
        compare_one(&la[i, 0], &lb[i, 0], &a.exps_v[i, 0], &a.stats[i], &b.stats[i], a.finite_v[i],
                    b.finite_v[i], next_tokens[i], vocab, &max_abs[i], &kl[i], &logp_a[i], &logp_b[i],
                    &rank_a[i], &rank_b[i])
