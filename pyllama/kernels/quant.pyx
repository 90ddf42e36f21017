"""Matrix-vector products over int8 weights (Q8_0, llama2.c's groups) that never expand them to float32.

* ``Q8_0`` — ggml's block format (GGUF type 8): per 32 weights one fp16 scale ``d`` then 32 int8
  ``qs``; weight = d * qs. As llama.cpp does it (``ggml_vec_dot_q8_0_q8_0``): the activation vector
  is quantised once per matvec to Q8_0 blocks in the engine's ``QuantScratch`` (amax / 127 rounded
  to fp16, ``x * 127 / amax`` rounded to nearest-even: what ggml's x86 ``quantize_row_q8_0`` does,
  which is what made the llama.cpp references), then each row is an integer dot product per block
  scaled by both block scales. Inside a block, products are summed exactly in 8 int32 lanes (lane l
  holds the 4 products 4l..4l+3: one ``vpdpbusd``, or ``maddubs`` + ``madd``), each lane is converted
  to float and fused-multiply-added with the block's ``d_w * d_x`` into one accumulator, block after
  block, then reduced as ggml's ``hsum_float_8`` does: the order of ``ggml_vec_dot_q8_0_q8_0`` on AVX2,
  bit for bit (llama.cpp does not repack Q8_0 on x86; its prompt-time sgemm has the same order).
* ``Q8_GROUPS`` — llama2.c version-2 checkpoints (``runq.c``): int8 weights with one float32 scale
  per ``group_size`` values; the activation is quantised the way ``runq.c`` does it (scale = max|x|
  / 127, round half away from zero) and each group is an integer dot scaled by both scales.

F16 rows are ``f16.pyx``'s. The Q8_0 row kernel and the block tiles are C in ``q8_0.h``, with x86
intrinsics (AVX2 + FMA, VNNI when present: then a block tile of 4 rows that takes the activation as
x + 128 and gets the same int32 lanes from one vpdpbusd per row and position) and a plain C path
that computes the same lanes in the same order: written as Cython loops over ``float acc[16]`` with
a conversion call, gcc left them scalar (checked with ``objdump``), and auto-vectorised int8 code
came out as shuffles. Every matvec splits rows across
OpenMP threads with a static schedule; a row is computed by one thread with fixed arithmetic, so
results are bit-identical for any thread count.
"""

from cython.parallel cimport parallel, prange
from libc.math cimport fabsf, roundf, rintf
from libc.stdint cimport uint8_t, uint16_t

import numpy as np

from pyllama.kernels.matvec cimport QTYPE_F32, QTYPE_F16, QTYPE_Q8_0, QTYPE_Q8_GROUPS
from pyllama.kernels.threads cimport team_barrier, team_size

cdef extern from "q8_0.h":
    float half_to_float "pyllama_half_to_float"(uint16_t h) noexcept nogil
    uint16_t float_to_half "pyllama_float_to_half"(float x) noexcept nogil
    float dot_q8_0 "pyllama_dot_q8_0"(const uint8_t* w, const signed char* xq, const float* xs,
                                      Py_ssize_t n_blocks) noexcept nogil
    void q8_0_tile_2x4 "pyllama_q8_0_tile_2x4"(const uint8_t* w, Py_ssize_t row_bytes, const signed char* xq,
                                               const float* xs, const float* xst, Py_ssize_t cols,
                                               Py_ssize_t n_blocks, float* out, Py_ssize_t out_stride) noexcept nogil
    void q8_0_tile_u "pyllama_q8_0_tile_u"(const uint8_t* w, Py_ssize_t row_bytes, const signed char* xu,
                                           const float* xst, Py_ssize_t cols, Py_ssize_t n_blocks, float* out,
                                           Py_ssize_t out_stride, int R) noexcept nogil
    void q8_0_unsign "pyllama_q8_0_unsign"(signed char* q, Py_ssize_t n) noexcept nogil
    bint UNSIGNED_TILE "PYLLAMA_Q8_0_UNSIGNED_TILE"
    int UNIT_ROWS "PYLLAMA_Q8_0_UNIT_ROWS"  # rows per unit of the block product: 4 with the unsigned tile

DEF QK8_0 = 32          # values per Q8_0 block
DEF Q8_0_BYTES = 34     # fp16 scale + 32 int8
# Small matrices are multiplied on the calling thread (threads.pyx counts work in float32
# multiply-adds): int8 rows stream 4x faster than float32, so their work is the weight count / 4.
# (A row is one dot product whoever computes it.)
DEF Q8_WORK_DIV = 4


# ---- Q8_0 --------------------------------------------------------------------------------------

cdef void quantize_q8_0(signed char* q, float* scales, const float* x, Py_ssize_t n) noexcept nogil:
    """x[n] (n a multiple of 32) -> int8 q[n] and one scale per block (the fp16 scale as float32)."""
    cdef Py_ssize_t b, k
    cdef float amax, inv
    cdef const float* xb
    for b in range(n // QK8_0):
        xb = x + b * QK8_0
        amax = 0.0
        for k in range(QK8_0):
            amax = amax if amax >= fabsf(xb[k]) else fabsf(xb[k])
        # ggml stores d = amax / 127 as fp16; the dot product reads it back as float32
        scales[b] = half_to_float(float_to_half(amax / <float>127.0))
        inv = <float>127.0 / amax if amax != 0 else 0.0
        for k in range(QK8_0):
            # |x * inv| <= 127 (up to rounding of inv), so the int8 conversion never overflows
            q[b * QK8_0 + k] = <signed char><int>rintf(xb[k] * inv)


cdef void matvec_q8_0(float* out, const Matrix* m, const float* x, QuantScratch* scratch, int n_threads) noexcept nogil:
    """out[i] = dot_q8_0(W[i], x quantised): matvec_q8_0_many's group of one."""
    matvec_q8_0_many(1, &out, &m, x, scratch, n_threads)


cdef void matvec_q8_0_many(int count, float** outs, const Matrix** ms, const float* x, QuantScratch* scratch,
                           int n_threads) noexcept nogil:
    """matvec_q8_0 of count <= MAX_MANY matrices of x's columns: x quantised once, the rows of all of
    them in one parallel loop (a decode step's Q, K and V, or gate and up: one barrier instead of
    count); every row is matvec_q8_0's dot."""
    cdef Py_ssize_t first[MAX_MANY + 1]
    cdef Py_ssize_t t, n_rows = number_units(first, ms, count, 1)
    cdef long long work = 0
    cdef int k
    for k in range(count):
        work += ms[k].rows * ms[k].cols // Q8_WORK_DIV
    quantize_q8_0(scratch.q, scratch.scales, x, ms[0].cols)
    if team_size(n_threads, work) == 1:
        for t in range(n_rows):
            q8_0_row_of(outs, ms, first, count, t, scratch)
        return
    for t in prange(n_rows, schedule="static", num_threads=n_threads):
        q8_0_row_of(outs, ms, first, count, t, scratch)


cdef inline void q8_0_row_of(float** outs, const Matrix** ms, const Py_ssize_t* first, int count, Py_ssize_t t,
                             const QuantScratch* scratch) noexcept nogil:
    """Row t of the matrices taken one after another."""
    cdef int k = matrix_of_unit(first, count, t)
    cdef Py_ssize_t n_blocks = ms[k].cols // QK8_0, i = t - first[k]
    outs[k][i] = dot_q8_0(<const uint8_t*>ms[k].data + i * n_blocks * Q8_0_BYTES, scratch.q, scratch.scales,
                          n_blocks)


cdef inline void q8_0_row_unit(float* out, const uint8_t* w, Py_ssize_t row_bytes, Py_ssize_t i, Py_ssize_t rows,
                               const QuantScratch* scratch, Py_ssize_t cols, Py_ssize_t n_blocks,
                               Py_ssize_t n_pos) noexcept nogil:
    """Rows i .. i + UNIT_ROWS - 1 (fewer at the end) for every position: tiles over the whole tiles of 4
    positions, then the remaining positions one dot at a time; every element is dot_q8_0's computation.
    The VNNI tile takes any 1-4 rows (its positions were stored unsigned, so it must); the 2 x 4 tile
    takes a pair, and a lone last row goes one dot at a time."""
    cdef Py_ssize_t p = 0, r, n_rows = min(UNIT_ROWS, rows - i)
    cdef const uint8_t* wi = w + i * row_bytes
    # the tile's scales side by side (matmul_q8_0 writes them after the n_pos rows of scales)
    cdef const float* side_by_side = scratch.scales + n_pos * n_blocks
    if UNSIGNED_TILE or n_rows == 2:
        while p + 4 <= n_pos:
            if UNSIGNED_TILE:
                q8_0_tile_u(wi, row_bytes, scratch.q + p * cols, side_by_side + p * n_blocks, cols, n_blocks,
                            out + p * rows + i, rows, <int>n_rows)
            else:
                q8_0_tile_2x4(wi, row_bytes, scratch.q + p * cols, scratch.scales + p * n_blocks,
                              side_by_side + p * n_blocks, cols, n_blocks, out + p * rows + i, rows)
            p += 4
    while p < n_pos:
        for r in range(i, i + n_rows):
            out[p * rows + r] = dot_q8_0(w + r * row_bytes, scratch.q + p * cols, scratch.scales + p * n_blocks,
                                         n_blocks)
        p += 1


cdef inline void quantize_position_q8_0(const float* x, Py_ssize_t p, Py_ssize_t n_pos, Py_ssize_t cols,
                                        QuantScratch* scratch) noexcept nogil:
    """Position p quantised as matvec_q8_0 does it (into row p of the scratch) and, in a whole tile of
    4 positions, its scales also side by side with the tile's others after all the rows (the tile
    reads 4 per block) and, for the VNNI tile, its int8 values stored as x + 128. Positions are
    independent: any thread may take any of them."""
    cdef Py_ssize_t n_blocks = cols // QK8_0
    cdef Py_ssize_t b
    cdef float* side_by_side = scratch.scales + n_pos * n_blocks  # room: the scratch holds cols * n_pos
    quantize_q8_0(scratch.q + p * cols, scratch.scales + p * n_blocks, x + p * cols, cols)
    if p < n_pos - n_pos % 4:
        for b in range(n_blocks):
            side_by_side[(p - p % 4) * n_blocks + 4 * b + p % 4] = scratch.scales[p * n_blocks + b]
        if UNSIGNED_TILE:
            q8_0_unsign(scratch.q + p * cols, cols)  # only the tile reads a whole tile's positions


cdef void matmul_q8_0(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                      int n_threads) noexcept nogil:
    """out[p, i] = matvec_q8_0's out[i] for x[p]: every position quantised as matvec does it
    (quantize_position_q8_0), then rows are taken in pairs, each pair read once for every position (in
    tiles of 4 positions, q8_0_tile_2x4); a pair is computed by one thread."""
    matmul_q8_0_many(1, &out, &m, x, n_pos, scratch, n_threads)


cdef void matmul_q8_0_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                           QuantScratch* scratch, int n_threads) noexcept nogil:
    """matmul_q8_0 for count <= MAX_MANY matrices of the same columns over the same x (Q, K and V; the
    FFN's gate and up): x quantised once, and the row pairs of all of them in one parallel loop, one
    barrier instead of count. Each unit is q8_0_row_unit's, so every element keeps its bits."""
    cdef Py_ssize_t cols = ms[0].cols
    cdef Py_ssize_t n_blocks = cols // QK8_0
    cdef Py_ssize_t first[MAX_MANY + 1]
    cdef Py_ssize_t t, n_units = number_units(first, ms, count, UNIT_ROWS)
    cdef long long work = 0
    cdef int k
    cdef Py_ssize_t p
    for k in range(count):
        work += ms[k].rows * cols * n_pos // Q8_WORK_DIV
    if team_size(n_threads, work) == 1:
        for p in range(n_pos):
            quantize_position_q8_0(x, p, n_pos, cols, scratch)
        for t in range(n_units):
            q8_0_unit_of(outs, ms, first, count, t, scratch, cols, n_blocks, n_pos)
        return
    # one team for both loops: the positions are quantised by the team (a prompt block's quantisation
    # on one thread had the other waiting, 2% of a 15M prompt at 2 threads), then, once all are,
    # every pair reads every position
    with parallel(num_threads=n_threads):
        for p in prange(n_pos, schedule="static"):
            quantize_position_q8_0(x, p, n_pos, cols, scratch)
        team_barrier()
        for t in prange(n_units, schedule="static"):
            q8_0_unit_of(outs, ms, first, count, t, scratch, cols, n_blocks, n_pos)


cdef inline void q8_0_unit_of(float** outs, const Matrix** ms, const Py_ssize_t* first, int count, Py_ssize_t t,
                              const QuantScratch* scratch, Py_ssize_t cols, Py_ssize_t n_blocks,
                              Py_ssize_t n_pos) noexcept nogil:
    """Unit t (UNIT_ROWS rows) of the matrices taken one after another."""
    cdef int k = matrix_of_unit(first, count, t)
    q8_0_row_unit(outs[k], <const uint8_t*>ms[k].data, n_blocks * Q8_0_BYTES, UNIT_ROWS * (t - first[k]), ms[k].rows,
                  scratch, cols, n_blocks, n_pos)


# ---- Q8_GROUPS (llama2.c version 2) ------------------------------------------------------------

cdef void quantize_groups(signed char* q, float* scales, const float* x, Py_ssize_t n, int gs) noexcept nogil:
    cdef Py_ssize_t g, i
    cdef float wmax, scale
    for g in range(n // gs):
        wmax = 0.0
        for i in range(gs):
            if fabsf(x[g * gs + i]) > wmax:
                wmax = fabsf(x[g * gs + i])
        scale = wmax / 127.0
        scales[g] = scale
        for i in range(gs):
            # run.c divides by the scale (0/0 when a group is all zero gives NaN -> int8 0 there too)
            q[g * gs + i] = <signed char>roundf(x[g * gs + i] / scale) if scale != 0 else 0


cdef inline float dot_q8_groups(const signed char* wq, const float* ws, const signed char* xq,
                                const float* xs, Py_ssize_t n, int gs) noexcept nogil:
    cdef float val = 0.0
    cdef int ival
    cdef Py_ssize_t g, j, k
    for g in range(n // gs):
        j = g * gs
        ival = 0
        for k in range(gs):
            ival = ival + (<int>xq[j + k]) * (<int>wq[j + k])
        val = val + (<float>ival) * ws[g] * xs[g]
    return val


cdef void matvec_q8_groups(float* out, const Matrix* m, const float* x, QuantScratch* scratch,
                           int n_threads) noexcept nogil:
    cdef int gs = m.group_size
    cdef Py_ssize_t cols = m.cols
    quantize_groups(scratch.q, scratch.scales, x, cols, gs)
    cdef const signed char* w = <const signed char*>m.data
    cdef Py_ssize_t i
    if team_size(n_threads, m.rows * cols // Q8_WORK_DIV) == 1:
        for i in range(m.rows):
            out[i] = dot_q8_groups(w + i * cols, m.scales + i * (cols // gs), scratch.q, scratch.scales, cols, gs)
        return
    for i in prange(m.rows, schedule="static", num_threads=n_threads):
        out[i] = dot_q8_groups(w + i * cols, m.scales + i * (cols // gs), scratch.q, scratch.scales, cols, gs)


cdef void matmul_q8_groups(float* out, const Matrix* m, const float* x, Py_ssize_t n_pos, QuantScratch* scratch,
                           int n_threads) noexcept nogil:
    """out[p, i] = matvec_q8_groups's out[i] for x[p] (each position quantised into row p of the scratch)."""
    cdef int gs = m.group_size
    cdef Py_ssize_t rows = m.rows, cols = m.cols, n_groups = m.cols // m.group_size
    cdef const signed char* w = <const signed char*>m.data
    cdef Py_ssize_t i, p
    for p in range(n_pos):
        quantize_groups(scratch.q + p * cols, scratch.scales + p * n_groups, x + p * cols, cols, gs)
    if team_size(n_threads, rows * cols * n_pos // Q8_WORK_DIV) == 1:
        for i in range(rows):
            for p in range(n_pos):
                out[p * rows + i] = dot_q8_groups(w + i * cols, m.scales + i * n_groups, scratch.q + p * cols,
                                                  scratch.scales + p * n_groups, cols, gs)
        return
    for i in prange(rows, schedule="static", num_threads=n_threads):
        for p in range(n_pos):
            out[p * rows + i] = dot_q8_groups(w + i * cols, m.scales + i * n_groups, scratch.q + p * cols,
                                              scratch.scales + p * n_groups, cols, gs)


# ---- rows as float32 (the token embedding lookup) ----------------------------------------------

cdef void dequantize_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    cdef Py_ssize_t j, b, k
    cdef const signed char* q
    cdef const float* s
    cdef const uint16_t* h
    cdef const uint8_t* blk
    cdef float d
    if m.qtype == QTYPE_Q8_GROUPS:
        q = (<const signed char*>m.data) + row * m.cols
        s = m.scales + row * (m.cols // m.group_size)
        for j in range(m.cols):
            out[j] = q[j] * s[j // m.group_size]
    elif m.qtype == QTYPE_F16:
        h = (<const uint16_t*>m.data) + row * m.cols
        for j in range(m.cols):
            out[j] = half_to_float(h[j])
    elif m.qtype == QTYPE_Q8_0:
        blk = (<const uint8_t*>m.data) + row * (m.cols // QK8_0) * Q8_0_BYTES
        for b in range(m.cols // QK8_0):
            d = half_to_float((<const uint16_t*>blk)[0])
            q = <const signed char*>(blk + 2)
            for k in range(QK8_0):
                out[b * QK8_0 + k] = d * q[k]
            blk = blk + Q8_0_BYTES


# ---- thin wrappers for tests -------------------------------------------------------------------

def quantize_q8_0_np(const float[::1] x):
    """The activation quantisation of ``matvec_q8_0``: (int8[n], float32 scales[n // 32])."""
    if x.shape[0] % QK8_0:
        raise ValueError(f"quantize_q8_0: {x.shape[0]} values is not a multiple of {QK8_0}")
    q = np.zeros(x.shape[0], dtype=np.int8)
    s = np.zeros(x.shape[0] // QK8_0, dtype=np.float32)
    cdef signed char[::1] qv = q
    cdef float[::1] sv = s
    if x.shape[0]:
        with nogil:
            quantize_q8_0(&qv[0], &sv[0], &x[0], x.shape[0])
    return q, s


def dequantize_tensor_row(tensor, Py_ssize_t row):
    """Row ``row`` of a weight ``Tensor`` of any stored type as float32, through the engine's kernel."""
    if not 0 <= row < tensor.rows:
        raise IndexError(f"row {row} is outside a tensor of {tensor.rows} rows")
    # the Matrix is built here rather than with matvec.matrix_of: matvec cimports this module
    cdef Matrix m
    m.qtype = int(tensor.qtype)
    m.data = <const void*><size_t>tensor.data.ctypes.data
    m.scales = <const float*><size_t>tensor.scales.ctypes.data if tensor.scales is not None else NULL
    m.group_size = tensor.group_size
    m.rows = tensor.rows
    m.cols = tensor.cols
    out = np.zeros(tensor.cols, dtype=np.float32)
    cdef float[::1] o = out
    if m.qtype == QTYPE_F32:
        o[:] = np.asarray(tensor.data).reshape(tensor.rows, tensor.cols)[row]
    elif tensor.cols:
        with nogil:
            dequantize_row(&o[0], &m, row)
    return out


def half_to_float_np(const uint16_t[::1] h):
    """float32 values of IEEE half bit patterns, through the kernels' conversion."""
    out = np.zeros(h.shape[0], dtype=np.float32)
    cdef float[::1] o = out
    cdef Py_ssize_t i
    for i in range(h.shape[0]):
        o[i] = half_to_float(h[i])
    return out


def float_to_half_np(const float[::1] x):
    """IEEE half bit patterns (round to nearest-even) of float32 values, through the kernels' conversion."""
    out = np.zeros(x.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] o = out
    cdef Py_ssize_t i
    for i in range(x.shape[0]):
        o[i] = float_to_half(x[i])
    return out
