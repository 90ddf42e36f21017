"""The shared exact routine: attention of one query head over ``n`` cached rows.

Every built-in plugin gathers the rows it keeps (exact keys, dequantised keys, bucket summaries)
as pointers in ascending position order and calls ``attend_head``. Because the arithmetic is one
piece of code in one order, two plugins that keep the same rows give bit-identical outputs: that
is what makes "max |Δlogit| = 0" a meaningful test of a degenerate setting.

    score_t = (q · k_t) / sqrt(head_dim) [+ bias_t]     (bias: e.g. log(count) of a summary row)
    a = softmax(score)                                   (max subtracted, fast exp, serial sum)
    out = Σ_t a_t v_t                                    (t ascending)

``attend_head_rows`` is the same routine for several queries of one head over contiguous rows (a
dense cache, in a block of positions): query j attends rows 0 .. n + j - 1. It scores tiles of keys
shared by the queries, transposed so that a vector holds one lane of many rows, and sums the values
for four queries at a time with their outputs in registers, and performs, for each query, exactly
the operations of ``attend_head`` in the same order (the same dot product lanes and reduction,
division, softmax and ascending sum per output element): the same bits, as the block tests and
test_ggml_attention check against one position at a time. ``attend_group_rows`` takes the query
heads of one position that share a KV head the same way, every head over the same rows, so that a
step reads the KV head's rows once.

GGUF models (``ModelConfig.arithmetic == "ggml"``) attend in llama.cpp's arithmetic instead, so that
pyllama's attention output carries the bits of llama.cpp's CPU backend (f32 K/V cache, no flash
attention, an AVX2 build): it is where the two engines' roundings met last, and a one-ulp difference
there can flip an int8 rounding when the output projection quantises the row. Per query head:

    score_t = ggml_vec_dot_f32(k_t, q) * (1 / sqrt(head_dim)) [+ bias_t]
    a = ggml's soft_max (ggml_math.h: ggml's exp in groups of 8, a double sum, times 1 / sum)
    out_i = ggml_vec_dot_f32 over the rows of (v_t,i)_t and a: 32 lanes, lane t mod 32 a fused chain
            over its rows in order, reduced in ggml's order at the end

(llama.cpp multiplies the transposed value cache by the weights; pyllama keeps values by row, builds
the 32 lanes of every output element one lane at a time in registers, ``ggml_attend.h``, and keeps
them in ``lanes``, [32, head_dim] floats per head, for the reduction. A block's queries take their
weighted sums four at a time, ``ggml_attend_group.h``: the same chains, one read of a value row for
the four.)
"""

from libc.math cimport sqrtf
from libc.string cimport memmove

from pyllama.kernels.elementwise cimport ARITH_GGML, arithmetic_code, arithmetic_of, softmax, softmax4
from pyllama.kernels.matvec cimport dot_f32

import numpy as np

# rows per tile of attend_head_rows: 64 keys or values of a 64-wide head are 16 KiB, in L1 with the
# queries' running outputs
cdef enum:
    ROW_TILE = 64

# ggml's arithmetic, inlined here from the kernels' header (a path relative to this module's C file)
cdef extern from "../kernels/ggml_math.h":
    void pyllama_ggml_softmax(float* x, long n) nogil

cdef extern from "ggml_attend.h":
    void pyllama_ggml_weighted_rows(float* out, const float* w, const float* const* vp, const float* base,
                                    Py_ssize_t stride, long n, int hd, float* lanes) nogil
    void pyllama_ggml_scores(float* scores, const float* q, const float* const* kp, const float* base,
                             Py_ssize_t stride, long n, int hd, float scale) nogil
    void pyllama_ggml_scores_group(float* scores, Py_ssize_t score_stride, const float* q, Py_ssize_t q_stride,
                                   long m, const float* base, Py_ssize_t stride, long n, long grow, int hd,
                                   float scale) nogil

cdef extern from "scores_tile.h":
    bint PYLLAMA_BLOCK_VECTORS
    void pyllama_scores_block(float* scores, Py_ssize_t score_stride, const float* q, Py_ssize_t q_stride,
                              const float* keys, Py_ssize_t stride, long n, long m, int hd, float scale, float* kt,
                              int ggml, long grow) nogil

cdef extern from "runc_attend_group.h":
    void pyllama_runc_weighted_group(float* out, Py_ssize_t out_stride, const float* w, Py_ssize_t w_stride,
                                     const float* base, Py_ssize_t stride, long n0, int g, int hd,
                                     long grow) nogil

cdef extern from "ggml_attend_group.h":
    int PYLLAMA_GROUP_QUERIES
    void pyllama_ggml_weighted_group(float* out, Py_ssize_t out_stride, const float* w, Py_ssize_t w_stride,
                                     const float* base, Py_ssize_t stride, long n0, int g, int hd,
                                     long grow) nogil


# The arithmetic of both routines, once: a row's score, and a value row added to an output with its
# weight. attend_head and attend_head_rows differ only in which rows they visit and in what order
# of tiles, never in these operations, so their outputs are the same bits.
cdef inline float row_score(const float* q, const float* key, int head_dim, float scale) noexcept nogil:
    return dot_f32(q, key, head_dim) / scale


cdef inline void add_weighted(float* out, float a, const float* vrow, int head_dim) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(head_dim):
        out[i] = out[i] + a * vrow[i]


cdef inline float ggml_kq_scale(int head_dim) noexcept nogil:
    # llama.cpp's kq_scale, 1 / sqrt(head_dim), which multiplies each score
    return 1.0 / sqrtf(<float>head_dim)


cdef void attend_ggml(const float* q, const float** keys, const float** values, const float* bias, long long n,
                      int head_dim, float* scores, float* lanes, float* out) noexcept nogil:
    """llama.cpp's arithmetic over the n rows of the tables; bias: NULL or one per row."""
    cdef long long t
    pyllama_ggml_scores(scores, q, keys, NULL, 0, n, head_dim, ggml_kq_scale(head_dim))
    if bias != NULL:
        for t in range(n):
            scores[t] = scores[t] + bias[t]
    weigh_scored(scores, values, n, head_dim, out, ARITH_GGML, lanes)


cdef void weigh_scored(float* scores, const float** values, long long n, int head_dim, float* out, int arithmetic,
                       float* lanes) noexcept nogil:
    """The rest of attend_head once its n scores are in: their softmax, then the weighted sum of the
    value rows values[0 .. n - 1] (one piece of code, so attend_head_window has attend_head's bits)."""
    cdef long long t
    cdef Py_ssize_t i
    if arithmetic == ARITH_GGML:
        pyllama_ggml_softmax(scores, n)
        pyllama_ggml_weighted_rows(out, scores, values, NULL, 0, n, head_dim, lanes)
        return
    softmax(scores, n)
    for i in range(head_dim):
        out[i] = 0.0
    for t in range(n):
        add_weighted(out, scores[t], values[t], head_dim)


cdef void attend_head(const float* q, const float** keys, const float** values, const float* bias,
                      Py_ssize_t n, int head_dim, float* scores, float* out, int arithmetic,
                      float* lanes) noexcept nogil:
    cdef Py_ssize_t t
    if arithmetic == ARITH_GGML:
        attend_ggml(q, keys, values, bias, n, head_dim, scores, lanes, out)
        return
    cdef float scale = sqrtf(<float>head_dim)
    for t in range(n):
        scores[t] = row_score(q, keys[t], head_dim, scale)
    if bias != NULL:
        for t in range(n):
            scores[t] = scores[t] + bias[t]
    weigh_scored(scores, values, n, head_dim, out, arithmetic, lanes)


cdef inline bint tiles_score(Py_ssize_t m, int head_dim, bint ggml) noexcept nogil:
    # the transposed tiles pay for themselves from about four queries on: fewer (a diff's live side with
    # a ledger attends one position at a time) are scored row by row
    return m >= PYLLAMA_GROUP_QUERIES and (ggml or (PYLLAMA_BLOCK_VECTORS and head_dim % 16 == 0))


cdef void attend_head_window(const float* q, Py_ssize_t q_stride, const float* keys, const float* values,
                             Py_ssize_t stride, long long fixed, long long window, Py_ssize_t m, int head_dim,
                             float* scores, Py_ssize_t score_stride, float* out, Py_ssize_t out_stride,
                             int arithmetic, float* lanes, const float** kp, const float** vp) noexcept nogil:
    """Queries j < m (q + j * q_stride) over rows 0 .. fixed - 1 and then fixed + j .. fixed + j + window - 1
    of keys/values + t * stride (sinks, then a window one row further on for each query: a sliding
    window's block past its first eviction); out j at out + j * out_stride. From four queries on the keys
    are scored once for the block as attend_head_rows scores them (query j: every row up to its window's
    end; scores: [m, score_stride >= fixed + window + m - 1]), each query's window scores move down to
    follow its sinks, and it takes attend_head's softmax and weighted sum (``weigh_scored``); fewer
    queries are each attend_head. kp, vp: [fixed + window] scratch for a query's rows. attend_head's
    bits for each query."""
    cdef long long n = fixed + window, t, row
    cdef Py_ssize_t j
    cdef float* sc
    cdef bint ggml = arithmetic == ARITH_GGML
    cdef bint shared = tiles_score(m, head_dim, ggml)
    if shared:
        pyllama_scores_block(scores, score_stride, q, q_stride, keys, stride, n, m, head_dim,
                             ggml_kq_scale(head_dim) if ggml else sqrtf(<float>head_dim), lanes, ggml, 1)
    for j in range(m):
        sc = scores + j * score_stride
        for t in range(n):
            row = t if t < fixed else t + j
            kp[t] = keys + row * stride
            vp[t] = values + row * stride
        if shared:
            if j > 0:
                memmove(sc + fixed, sc + fixed + j, window * sizeof(float))
            weigh_scored(sc, vp, n, head_dim, out + j * out_stride, arithmetic, lanes)
        else:
            attend_head(q + j * q_stride, kp, vp, NULL, n, head_dim, sc, out + j * out_stride, arithmetic, lanes)


cdef void attend_head_rows(const float* q, Py_ssize_t q_stride, const float* keys, const float* values,
                           Py_ssize_t stride, long long n, Py_ssize_t m, int head_dim, float* scores,
                           Py_ssize_t score_stride, float* out, Py_ssize_t out_stride, int arithmetic,
                           float* lanes) noexcept nogil:
    """Queries j < m (q + j * q_stride) over rows 0 .. n + j - 1 (keys/values + t * stride): a block's
    consecutive positions of one head; out j at out + j * out_stride; scores: [m, score_stride >= n +
    m - 1] scratch; lanes: [32, head_dim] scratch (``attend_query_rows``)."""
    attend_query_rows(q, q_stride, keys, values, stride, n, m, 1, head_dim, scores, score_stride, out, out_stride,
                      arithmetic, lanes)


cdef void attend_group_rows(const float* q, const float* keys, const float* values, Py_ssize_t stride,
                            long long n, int g, int head_dim, float* scores, Py_ssize_t score_stride, float* out,
                            int arithmetic, float* lanes) noexcept nogil:
    """Query heads j < g of one position (q + j * head_dim, out + j * head_dim: the heads that share a KV
    head) over the same rows 0 .. n - 1 of that KV head (keys/values + t * stride); head j's softmax
    weights are left at scores + j * score_stride (>= n floats); lanes: [32, head_dim] scratch. A
    step then reads a KV head's rows once for its heads, not once per head (``attend_query_rows``)."""
    attend_query_rows(q, head_dim, keys, values, stride, n, g, 0, head_dim, scores, score_stride, out, head_dim,
                      arithmetic, lanes)


cdef void attend_query_rows(const float* q, Py_ssize_t q_stride, const float* keys, const float* values,
                            Py_ssize_t stride, long long n, Py_ssize_t m, long grow, int head_dim, float* scores,
                            Py_ssize_t score_stride, float* out, Py_ssize_t out_stride, int arithmetic,
                            float* lanes) noexcept nogil:
    """Queries j < m over rows 0 .. n + j * grow - 1 (grow 1: consecutive positions of one head; grow
    0: heads of one position over the same rows). Where the build has vectors (AVX2 or AVX-512) and
    there are four queries or more, the scores come from tiles of 32 keys transposed into lanes
    (scores_tile.h; pyllama's order for head sizes that are multiples of 16; a tile's transpose costs
    about what three queries' scores row by row cost), fewer are scored 64 rows at a time for every
    query; then each query's softmax (pyllama's four consecutive ones at a time, softmax4), then the
    weighted sums of groups of four queries in registers (ggml_attend_group.h, runc_attend_group.h).
    The portable build adds each value row through memory. Every route gives each query the
    operations of attend_head, in its order."""
    cdef long long t, c, t0, t1, end, total = n + (m - 1) * grow
    cdef Py_ssize_t j, i
    cdef float* sc
    cdef float* o
    cdef bint ggml = arithmetic == ARITH_GGML
    # run.c divides a score by sqrt(head_dim), llama.cpp multiplies it by 1 / sqrt(head_dim)
    cdef float scale = ggml_kq_scale(head_dim) if ggml else sqrtf(<float>head_dim)
    if tiles_score(m, head_dim, ggml):
        pyllama_scores_block(scores, score_stride, q, q_stride, keys, stride, n, m, head_dim, scale, lanes, ggml,
                             grow)
    elif ggml:
        pyllama_ggml_scores_group(scores, score_stride, q, q_stride, m, keys, stride, n, grow, head_dim, scale)
    else:
        # pyllama's order a tile of rows at a time for all queries, a tile of keys read once for them (a
        # score is its row's and its query's alone, whatever rows are computed beside it)
        for c in range((total + ROW_TILE - 1) // ROW_TILE):
            t0 = c * ROW_TILE
            t1 = min(t0 + ROW_TILE, total)
            for j in range(m):
                sc = scores + j * score_stride
                for t in range(t0, min(t1, n + j * grow)):
                    sc[t] = row_score(q + j * q_stride, keys + t * stride, head_dim, scale)
    if ggml:
        # attend_ggml's softmax per query, then its weighted sums a group of queries at a time (the same
        # chains, one read of each value row for the group)
        for j in range(m):
            pyllama_ggml_softmax(scores + j * score_stride, n + j * grow)
        for c in range((m + PYLLAMA_GROUP_QUERIES - 1) // PYLLAMA_GROUP_QUERIES):
            j = c * PYLLAMA_GROUP_QUERIES
            pyllama_ggml_weighted_group(out + j * out_stride, out_stride, scores + j * score_stride, score_stride,
                                        values, stride, n + j * grow, min(<Py_ssize_t>PYLLAMA_GROUP_QUERIES, m - j),
                                        head_dim, grow)
        return
    if PYLLAMA_BLOCK_VECTORS:
        # a group of queries at a time: the softmax of four consecutive ones side by side, then the
        # weighted sums in registers
        for c in range((m + PYLLAMA_GROUP_QUERIES - 1) // PYLLAMA_GROUP_QUERIES):
            j = c * PYLLAMA_GROUP_QUERIES
            if m - j >= 4 and grow:
                softmax4(scores + j * score_stride, score_stride, n + j)
            else:
                for i in range(j, min(j + PYLLAMA_GROUP_QUERIES, m)):
                    softmax(scores + i * score_stride, n + i * grow)
            pyllama_runc_weighted_group(out + j * out_stride, out_stride, scores + j * score_stride, score_stride,
                                        values, stride, n + j * grow, min(<Py_ssize_t>PYLLAMA_GROUP_QUERIES, m - j),
                                        head_dim, grow)
        return
    for j in range(m):
        softmax(scores + j * score_stride, n + j * grow)
        o = out + j * out_stride
        for i in range(head_dim):
            o[i] = 0.0
    for c in range((total + ROW_TILE - 1) // ROW_TILE):
        t0 = c * ROW_TILE
        t1 = min(t0 + ROW_TILE, total)
        for j in range(m):
            sc = scores + j * score_stride
            o = out + j * out_stride
            end = min(t1, n + j * grow)
            for t in range(t0, end):
                add_weighted(o, sc[t], values + t * stride, head_dim)


def attend_one_head(const float[::1] q, const float[:, ::1] keys, const float[:, ::1] values, bias=None,
                    arithmetic="run.c"):
    """The shared routine on numpy arrays (for tests): q [head_dim], keys/values [n, head_dim];
    arithmetic: "run.c" (pyllama's own order) or "ggml" (llama.cpp's)."""
    cdef Py_ssize_t n = keys.shape[0]
    cdef int hd = q.shape[0]
    if keys.shape[1] != hd or values.shape[1] != hd or values.shape[0] != n or n == 0:
        raise ValueError("attend_one_head: keys and values must be [n >= 1, head_dim]")
    kp = np.array([<size_t>&keys[t, 0] for t in range(n)], dtype=np.uintp)
    vp = np.array([<size_t>&values[t, 0] for t in range(n)], dtype=np.uintp)
    cdef size_t[::1] kpv = kp
    cdef size_t[::1] vpv = vp
    cdef const float[::1] bv
    cdef const float* bptr = NULL
    if bias is not None:
        bv = np.ascontiguousarray(bias, dtype=np.float32)
        if bv.shape[0] != n:
            raise ValueError("attend_one_head: bias must have one value per row")
        bptr = &bv[0]
    scores = np.zeros(n, dtype=np.float32)
    out = np.zeros(hd, dtype=np.float32)
    lanes = np.zeros(GGML_LANES * hd, dtype=np.float32)
    cdef float[::1] sv = scores
    cdef float[::1] ov = out
    cdef float[::1] lv = lanes
    cdef int arith = arithmetic_code(arithmetic)
    attend_head(&q[0], <const float**>&kpv[0], <const float**>&vpv[0], bptr, n, hd, &sv[0], &ov[0], arith,
                &lv[0])
    return out


def attend_rows(config, const float[::1] q, const float[:, ::1] keys, const float[:, ::1] values,
                float[::1] out, rows=None, bias=None):
    """Every query head of one position over cached rows, with the shared routine (for Python plugins).

    ``q``, ``out``: float32[n_heads * head_dim]; ``keys``, ``values``: float32[m, kv_dim] (e.g. one
    layer of a plugin's cache); ``rows``: indices into them, in the order to attend (ascending
    position; default: all m rows in order); ``bias``: float32 per attended row, added to the scores.
    A Python plugin that chooses the same rows as ``causal`` gets bit-identical output through this.
    """
    cdef int n_heads = config.n_heads
    cdef int hd = config.head_dim
    cdef int kv_mul = config.kv_mul
    if q.shape[0] != n_heads * hd or out.shape[0] != n_heads * hd:
        raise ValueError(f"attend_rows: q and out must have {n_heads * hd} values, got {q.shape[0]} and {out.shape[0]}")
    if keys.shape[1] != config.kv_dim or values.shape[1] != config.kv_dim or values.shape[0] != keys.shape[0]:
        raise ValueError(f"attend_rows: keys and values must be [m, {config.kv_dim}] alike, got "
                         f"{keys.shape[0]}x{keys.shape[1]} and {values.shape[0]}x{values.shape[1]}")
    cdef Py_ssize_t m = keys.shape[0]
    idx = np.arange(m, dtype=np.int64) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    cdef const long long[::1] iv = idx
    cdef Py_ssize_t n = iv.shape[0]
    cdef Py_ssize_t t
    if n == 0:
        raise ValueError("attend_rows: no rows to attend (the current position must be among them)")
    for t in range(n):
        if iv[t] < 0 or iv[t] >= m:
            raise IndexError(f"attend_rows: row {iv[t]} is outside the {m} rows given")
    cdef const float[::1] bv
    cdef const float* bptr = NULL
    if bias is not None:
        bv = np.ascontiguousarray(bias, dtype=np.float32)
        if bv.shape[0] != n:
            raise ValueError(f"attend_rows: bias must have one value per attended row ({n}), got {bv.shape[0]}")
        bptr = &bv[0]
    kp = np.empty(n, dtype=np.uintp)
    vp = np.empty(n, dtype=np.uintp)
    scores = np.empty(n, dtype=np.float32)
    lanes = np.empty(GGML_LANES * hd, dtype=np.float32)
    cdef float[::1] lv = lanes
    cdef int arith = arithmetic_of(config)
    cdef size_t[::1] kpv = kp
    cdef size_t[::1] vpv = vp
    cdef float[::1] sv = scores
    cdef int h
    with nogil:
        for h in range(n_heads):
            for t in range(n):
                kpv[t] = <size_t>&keys[iv[t], (h // kv_mul) * hd]
                vpv[t] = <size_t>&values[iv[t], (h // kv_mul) * hd]
            attend_head(&q[0] + h * hd, <const float**>&kpv[0], <const float**>&vpv[0], bptr, n, hd,
                        &sv[0], &out[0] + h * hd, arith, &lv[0])
