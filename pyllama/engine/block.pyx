"""The block forward: m known tokens at positions pos .. pos + m - 1 (m <= max_block).

Per layer: rmsnorm of every row, the Q/K/V products on the block (``matmul``: every element is
``matvec``'s), RoPE per row, the plugin's attention for the m positions in order
(``attend_block_c``), then Wo, the residual and the FFN on the block. Every value is computed with
exactly the arithmetic of ``forward`` (forward.pyx), so the logits are bit-identical to m
single-position forwards; only the order in which the plugin sees (layer, position) pairs changes,
which the attention contract allows (base.pyx). A plugin with ``per_position_order = True``, and a
traced engine, get m single-position forwards instead.
"""

from cython.parallel cimport prange
from libc.stdint cimport int32_t
from libc.string cimport memcpy

from pyllama.attention.base cimport Attention
from pyllama.engine.capture cimport capture_block_attention, capture_hidden, ledger_running_sums, ledger_step
from pyllama.engine.forward cimport forward, rope_rows_at
from pyllama.engine.nonfinite cimport check_block_rows, first_bad_row
from pyllama.engine.state cimport Config, LayerPtrs, RunState, Transformer
from pyllama.kernels.threads cimport block_end, token_start
from pyllama.kernels.elementwise cimport add_inplace, rmsnorm_as, swiglu_as
from pyllama.kernels.matvec cimport Matrix, embedding_row, matmul, matmul_many, matvec
from pyllama.kernels.rope cimport rope_apply
from pyllama.kernels.threads cimport team_size


# ---- the block's row-wise steps ---------------------------------------------------------------------
# Norms, residual adds and SwiGLU treat each row alone, so any thread may take any row and the bits
# are those of one row at a time. A team takes the rows when they are enough work for team_size
# (counted in multiply-adds: an add 1 per value, a norm 2, SwiGLU's exp and division 8): on one
# thread they were 2.5% of a 2-thread prompt of the 15M shape, with the other thread waiting.
cdef enum:
    ADD_COST = 1
    NORM_COST = 2
    SWIGLU_COST = 8


cdef void rmsnorm_rows(const Transformer* t, float* out, const float* x, const float* weight,
                       Py_ssize_t n) noexcept nogil:
    cdef int dim = t.config.dim, arithmetic = t.config.arithmetic
    cdef float eps = t.config.eps
    cdef int team = team_size(t.n_threads, <long long>n * dim * NORM_COST)
    cdef Py_ssize_t i
    if team == 1:
        for i in range(n):
            rmsnorm_as(arithmetic, out + i * dim, x + i * dim, weight, dim, eps)
        return
    for i in prange(n, schedule="static", num_threads=team):
        rmsnorm_as(arithmetic, out + i * dim, x + i * dim, weight, dim, eps)


cdef void add_rows(const Transformer* t, float* y, const float* x, Py_ssize_t n) noexcept nogil:
    cdef int dim = t.config.dim
    cdef int team = team_size(t.n_threads, <long long>n * dim * ADD_COST)
    cdef Py_ssize_t i
    if team == 1:
        for i in range(n):
            add_inplace(y + i * dim, x + i * dim, dim)
        return
    for i in prange(n, schedule="static", num_threads=team):
        add_inplace(y + i * dim, x + i * dim, dim)


cdef void swiglu_rows(const Transformer* t, float* hb, const float* hb2, Py_ssize_t n) noexcept nogil:
    cdef int hidden = t.config.hidden_dim, arithmetic = t.config.arithmetic
    cdef int team = team_size(t.n_threads, <long long>n * hidden * SWIGLU_COST)
    cdef Py_ssize_t i
    if team == 1:
        for i in range(n):
            swiglu_as(arithmetic, hb + i * hidden, hb2 + i * hidden, hidden)
        return
    for i in prange(n, schedule="static", num_threads=team):
        swiglu_as(arithmetic, hb + i * hidden, hb2 + i * hidden, hidden)


cdef int attend_block(Transformer* t, Attention attention, int layer, Py_ssize_t n, long long pos) except -1 nogil:
    """The plugin's attention for positions pos .. pos + n - 1 of one layer, in order. With a
    ledger, one position at a time, recording how each call changes memory_bytes(): a plugin's
    ledger is the sum of what each layer holds, so ledger[i] accumulates every layer's change at
    position pos + i, and the running sum from the block's start is the per-position ledger."""
    cdef RunState* s = &t.state
    cdef int q_dim = t.config.q_dim, kv_dim = t.config.kv_dim
    cdef Py_ssize_t i
    cdef long long last
    if t.capture.ledger == NULL:
        attention.attend_block_c(layer, pos, n, s.bq, s.bk, s.bv, s.batt)
        return 0
    with gil:
        ledger_step(&t.capture, attention, -1, &last)
    for i in range(n):
        attention.attend_block_c(layer, pos + i, 1, s.bq + i * q_dim, s.bk + i * kv_dim, s.bv + i * kv_dim,
                                 s.batt + i * q_dim)
        with gil:
            ledger_step(&t.capture, attention, i, &last)
    return 0


cdef int per_position_block(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                            float* logits) except -1 nogil:
    """forward_block as n single-position forwards (per_position_order plugins, tracing)."""
    cdef RunState* s = &t.state
    cdef const Config* c = &t.config
    cdef Py_ssize_t i
    cdef long long last
    cdef float* att = t.capture.attention
    cdef float* hid = t.capture.hidden
    try:
        for i in range(n):
            if att != NULL:
                t.capture.attention = att + i * c.n_layers * c.q_dim
            if hid != NULL:
                t.capture.hidden = hid + i * c.dim
            forward(t, attention, tokens[i], pos + i)
            s.block_bad[i] = s.nonfinite_layer
            s.block_stage[i] = s.nonfinite_stage
            if logits != NULL and not t.capture.skip_logits:
                memcpy(logits + i * c.vocab_size, s.logits, c.vocab_size * sizeof(float))
            if t.capture.ledger != NULL:
                with gil:
                    t.capture.ledger[i] = 0
                    last = 0
                    ledger_step(&t.capture, attention, i, &last)
    finally:
        t.capture.attention = att
        t.capture.hidden = hid
    first_bad_row(s, n, pos)
    return 0


cdef void block_qkv(Transformer* t, const LayerPtrs* lw, Py_ssize_t n, long long pos) noexcept nogil:
    """rmsnorm, Q/K/V products (+ biases) and RoPE of every row of the block."""
    cdef RunState* s = &t.state
    cdef const Config* c = &t.config
    cdef int q_dim = c.q_dim, kv_dim = c.kv_dim
    cdef Py_ssize_t i
    cdef const float* cos_row
    cdef const float* sin_row
    rmsnorm_rows(t, s.bxb, s.bx, lw.attn_norm, n)
    cdef float* outs[3]
    cdef const Matrix* mats[3]
    outs[0], outs[1], outs[2] = s.bq, s.bk, s.bv
    mats[0], mats[1], mats[2] = &lw.wq, &lw.wk, &lw.wv
    matmul_many(3, outs, mats, s.bxb, n, &s.qscratch, t.n_threads)
    for i in range(n):
        if lw.bq != NULL:
            add_inplace(s.bq + i * q_dim, lw.bq, q_dim)
        if lw.bk != NULL:
            add_inplace(s.bk + i * kv_dim, lw.bk, kv_dim)
        if lw.bv != NULL:
            add_inplace(s.bv + i * kv_dim, lw.bv, kv_dim)
        rope_rows_at(&s.rope, pos + i, &cos_row, &sin_row)
        rope_apply(&s.rope.spec, s.bq + i * q_dim, c.n_heads, cos_row, sin_row)
        rope_apply(&s.rope.spec, s.bk + i * kv_dim, c.n_kv_heads, cos_row, sin_row)


cdef void block_ffn(Transformer* t, const LayerPtrs* lw, Py_ssize_t n) noexcept nogil:
    """Wo and the residual, then the feed-forward block w2(silu(w1 x) * w3 x) on every row."""
    cdef RunState* s = &t.state
    cdef float* x = s.bx
    matmul(s.bxb2, &lw.wo, s.batt, n, &s.qscratch, t.n_threads)
    add_rows(t, x, s.bxb2, n)
    rmsnorm_rows(t, s.bxb, x, lw.ffn_norm, n)
    cdef float* outs[2]
    cdef const Matrix* mats[2]
    outs[0], outs[1] = s.bhb, s.bhb2
    mats[0], mats[1] = &lw.w1, &lw.w3
    matmul_many(2, outs, mats, s.bxb, n, &s.qscratch, t.n_threads)
    swiglu_rows(t, s.bhb, s.bhb2, n)
    matmul(s.bxb, &lw.w2, s.bhb, n, &s.qscratch, t.n_threads)
    add_rows(t, x, s.bxb, n)


cdef int forward_block(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                       float* logits, bint classify=True) except -1 nogil:
    """Tokens tokens[0 .. n-1] at positions pos .. pos + n - 1 (n <= max_block): logits NULL puts the
    last position's logits in state.logits; else logits[n, vocab] gets every position's. classify
    False skips the classifier: a long prompt's blocks before its last, whose logits nobody reads
    (the classifier is the largest matrix of small models: read once per block, it cost 4% of a
    512-token prompt of the stories42M shape). It runs on the team that t.blocks picks (one thread
    or n_threads: the same bits either way); the cap is lifted even if the block raises."""
    token_start(&t.blocks)
    try:
        return block_pass(t, attention, tokens, n, pos, logits, classify)
    finally:
        block_end(&t.blocks, n, t.config.max_block)


cdef int block_pass(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                    float* logits, bint classify) except -1 nogil:
    """forward_block's work, on whatever team team_size gives."""
    cdef RunState* s = &t.state
    cdef const Config* c = &t.config
    cdef int li, dim = c.dim
    cdef Py_ssize_t i
    cdef long long base = 0
    cdef float* x = s.bx
    if t.per_position or t.tracer.on:
        return per_position_block(t, attention, tokens, n, pos, logits)
    if t.capture.ledger != NULL:
        for i in range(n):
            t.capture.ledger[i] = 0
        with gil:
            ledger_step(&t.capture, attention, -1, &base)
    for i in range(n):
        embedding_row(x + i * dim, &t.weights.tok_emb, tokens[i])
        s.block_bad[i] = -1
    check_block_rows(s, c, -1, n)
    for li in range(c.n_layers):
        block_qkv(t, &t.weights.layers[li], n, pos)
        attend_block(t, attention, li, n, pos)
        capture_block_attention(&t.capture, c, li, s.batt, n)
        block_ffn(t, &t.weights.layers[li], n)
        check_block_rows(s, c, li, n)
    rmsnorm_rows(t, x, x, t.weights.final_norm, n)
    capture_hidden(&t.capture, x, n * dim)
    first_bad_row(s, n, pos)
    ledger_running_sums(&t.capture, base, n)
    if t.capture.skip_logits or not classify:
        return 0
    if logits != NULL:
        matmul(logits, &t.weights.cls, x, n, &s.qscratch, t.n_threads)
    else:
        matvec(s.logits, &t.weights.cls, x + (n - 1) * dim, &s.qscratch, t.n_threads)
    return 0
