"""The diff's per-position metrics over a block of rows, in compiled code, with metrics.py's values.

``metrics.py`` is the plain numpy statement of every metric (and what the tests hold this module
to). Over a 32,000-entry vocabulary it makes a dozen passes over [m, vocab] float64 arrays per
block; here each side's row is read twice (its max and top-1, then one exp per entry summed as
np.sum does) and the pair once more for everything else, without any [m, vocab] log-probability
array: a log-probability is rebuilt where it is needed with numpy's own operations,

    log P_j = (float64(x_j) - max) - log(sum_k exp(float64(x_k) - max)),

so every value is what ``metrics.log_softmax`` and its users give: the same IEEE operations in
the same order, the sums with numpy's pairwise summation tree (``pairwise`` below), the products
kept apart from the sums (no fused multiply-add), exp and log from the C library, which numpy
calls too where it has no vector float64 exp of its own (AVX2 and older; the tests check it when
that holds).

Rows are independent: they are split over threads with a static schedule, and each row is
computed by one thread, so the results do not depend on the thread count.
"""

from cython.parallel cimport prange
from libc.math cimport fabs, isfinite, log, INFINITY, NAN

import numpy as np

from pyllama.kernels.threads cimport team_size

cdef extern from *:
    """
    #include <math.h>

    /* numpy's pairwise summation (DOUBLE_pairwise_sum, numpy/_core/src/umath/loops_utils.h.src),
       which np.sum runs along a contiguous axis: below 8 terms in order, up to 128 in 8 interleaved
       partial sums, above that the two halves (split at a multiple of 8) summed apart. TERM(i) is
       the i-th term; the macro is the body of a function over n terms that recurses as RECURSE. */
    #define PYLLAMA_PAIRWISE_BODY(TERM, RECURSE)                                                   \\
        if (n < 8) {                                                                               \\
            double res = 0.;                                                                       \\
            for (Py_ssize_t i = 0; i < n; i++) res += TERM(i);                                     \\
            return res;                                                                            \\
        }                                                                                          \\
        if (n <= 128) {                                                                            \\
            double r[8];                                                                           \\
            Py_ssize_t i;                                                                          \\
            for (int k = 0; k < 8; k++) r[k] = TERM(k);                                            \\
            for (i = 8; i < n - n % 8; i += 8)                                                     \\
                for (int k = 0; k < 8; k++) r[k] += TERM(i + k);                                   \\
            double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));        \\
            for (; i < n; i++) res += TERM(i);                                                     \\
            return res;                                                                            \\
        }                                                                                          \\
        Py_ssize_t n2 = n / 2;                                                                     \\
        n2 -= n2 % 8;                                                                              \\
        return RECURSE(0, n2) + RECURSE(n2, n - n2);

    /* a value the compiler must round on its own: a product never fuses with the sum it enters */
    #define PYLLAMA_ROUNDED(v) __asm__("" : "+x"(v))

    /* exp(float64(x_i) - shift), stored in e[i] when e is not NULL: np.exp(x - max) summed by np.sum */
    static inline double pyllama_exp_term(const float* x, double shift, double* e, Py_ssize_t i) {
        const double v = exp((double)x[i] - shift);
        if (e != NULL) e[i] = v;
        return v;
    }
    #define PYLLAMA_EXP_TERM(i) pyllama_exp_term(x, shift, e, (i))
    #define PYLLAMA_EXP_RECURSE(o, len) pyllama_exp_sum(x + (o), shift, e == NULL ? NULL : e + (o), (len))
    static double pyllama_exp_sum(const float* x, double shift, double* e, Py_ssize_t n) {
        PYLLAMA_PAIRWISE_BODY(PYLLAMA_EXP_TERM, PYLLAMA_EXP_RECURSE)
    }

    /* KL's term (log P_a - log P_b) * P_a with P_a = e_a / total_a: metrics.kl_divergence on
       metrics.log_softmax's arrays, element by element */
    typedef struct { double shift, log_total, total; } pyllama_softmax_row;
    static inline double pyllama_kl_term(const float* xa, const float* xb, const double* ea,
                                         const pyllama_softmax_row* a, const pyllama_softmax_row* b,
                                         Py_ssize_t i) {
        const double lpa = ((double)xa[i] - a->shift) - a->log_total;
        const double lpb = ((double)xb[i] - b->shift) - b->log_total;
        double term = (lpa - lpb) * (ea[i] / a->total);
        PYLLAMA_ROUNDED(term);
        return term;
    }
    #define PYLLAMA_KL_TERM(i) pyllama_kl_term(xa, xb, ea, a, b, (i))
    #define PYLLAMA_KL_RECURSE(o, len) pyllama_kl_sum(xa + (o), xb + (o), ea + (o), a, b, (len))
    static double pyllama_kl_sum(const float* xa, const float* xb, const double* ea,
                                 const pyllama_softmax_row* a, const pyllama_softmax_row* b, Py_ssize_t n) {
        PYLLAMA_PAIRWISE_BODY(PYLLAMA_KL_TERM, PYLLAMA_KL_RECURSE)
    }
    """
    ctypedef struct softmax_row "pyllama_softmax_row":
        double shift
        double log_total
        double total
    double exp_sum "pyllama_exp_sum"(const float* x, double shift, double* e, Py_ssize_t n) noexcept nogil
    double kl_sum "pyllama_kl_sum"(const float* xa, const float* xb, const double* ea, const softmax_row* a,
                                   const softmax_row* b, Py_ssize_t n) noexcept nogil


cdef void softmax_one(const float* x, Py_ssize_t vocab, double* e, softmax_row* row, unsigned char* finite,
                      int* top1) noexcept nogil:
    """One row: finite?, top-1 (argmax, first of equals), and the log-softmax's constants (its max
    and the log of its exp sum; ``e``: each exp, when not NULL). A row with NaN or Inf stops at that."""
    cdef Py_ssize_t j, at = 0
    cdef float best = x[0]
    cdef bint ok = True
    for j in range(vocab):
        ok = ok & isfinite(x[j])
        if x[j] > best:
            best = x[j]
            at = j
    finite[0] = ok
    top1[0] = at if ok else -1
    if not ok:
        return
    row.shift = best
    row.total = exp_sum(x, row.shift, e, vocab)
    row.log_total = log(row.total)


cdef void teacher_one(const float* x, Py_ssize_t vocab, const softmax_row* row, bint finite, int t, double* logp,
                      long long* rank) noexcept nogil:
    """metrics.teacher_logprob and retrieval_scores.teacher_rank of one row, teacher token ``t``."""
    cdef Py_ssize_t j, above = 0
    cdef float lt
    if t < 0:
        logp[0] = NAN
        rank[0] = 0 if finite else vocab
        return
    if not finite:
        logp[0] = -INFINITY
        rank[0] = vocab
        return
    logp[0] = ((<double>x[t]) - row.shift) - row.log_total
    lt = x[t]
    for j in range(vocab):
        above = above + (x[j] > lt)
    for j in range(t):
        above = above + (x[j] == lt)
    rank[0] = above + 1


cdef double max_abs_one(const float* xa, const float* xb, Py_ssize_t vocab) noexcept nogil:
    """metrics.max_abs_diff of one pair of finite rows: the first largest float32 |a - b|, in float64."""
    cdef Py_ssize_t j, at = 0
    cdef float d, best = -1.0
    for j in range(vocab):
        d = fabs(xa[j] - xb[j])
        if d > best:
            best = d
            at = j
    return fabs(<double>xa[at] - <double>xb[at])


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
