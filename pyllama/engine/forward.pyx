"""The forward pass: n >= 1 known tokens at positions pos .. pos + n - 1 through every layer.

llama2.c run.c's ``forward()``, for a block of rows (llama.cpp's graph does the same: one forward
for any batch): decode is a pass of one row, a prompt or teacher forcing a pass of up to
``max_block`` rows, each weight read once per pass. Per layer: rmsnorm of every row, the Q/K/V
products (+ qwen2's biases), RoPE per row, the plugin's attention for the rows in order (the only
seam: the plugin owns the cache, the engine never stores keys or values), Wo and the residual, then
rmsnorm, the FFN w2(silu(w1 x) * w3 x) and the residual. Then the final rmsnorm and the classifier.

The products choose their own kernels: ``matvec`` for one row, the tiles of ``matmul`` for more,
and every element of a tile is the single-vector product's, so the logits of a row do not depend on
how many rows share its pass. The plugin takes one row through ``attend_c`` and a pass's rows of a
layer through ``attend_block_c`` (same bits, by the contract: base.pyx). A plugin with
``per_position_order``, and an observer that asks for it (a tracer), get passes of one row each.

What the pass computes is reported to the engine's observer, stage by stage (observer.pxd): the
engine knows nothing of who reads it. Nothing here allocates; with a native plugin it runs without
the GIL. The residual stream is checked for NaN/Inf after every layer (nonfinite.pyx).
"""

from libc.stdint cimport int32_t
from libc.math cimport tanhf
from libc.string cimport memcpy
from cython.parallel cimport prange

from pyllama.attention.base cimport Attention
from pyllama.engine.nonfinite cimport check_rows, first_bad_row
from pyllama.engine.observer cimport (
    Observer, report, STAGE_ATTENTION, STAGE_ATTN_NORM, STAGE_ATTN_OUT, STAGE_ATTN_POST_NORM, STAGE_EMBEDDING,
    STAGE_EMBEDDING_SCALED, STAGE_FFN_ACT, STAGE_FFN_GATE, STAGE_FFN_INP, STAGE_FFN_NORM, STAGE_FFN_OUT,
    STAGE_FFN_POST_NORM, STAGE_FFN_UP, STAGE_K, STAGE_K_NORMED, STAGE_LAYER_OUT, STAGE_LOGITS, STAGE_Q,
    STAGE_Q_NORMED, STAGE_Q_PRE_ROPE, STAGE_RESULT_NORM, STAGE_V,
)
from pyllama.engine.state cimport Config, LayerPtrs, RopeTables, RunState, Transformer
from pyllama.kernels.elementwise cimport add_inplace, ffn_act_as, rmsnorm_as
from pyllama.kernels.matvec cimport Matrix, embedding_row, matmul, matmul_many, matvec
from pyllama.kernels.rope cimport rope_apply, rope_row
from pyllama.kernels.threads cimport block_begin, block_end, block_finish, team_size, token_start


cdef void rope_rows_at(RopeTables* rope, long long pos, const float** cos_row, const float** sin_row) noexcept nogil:
    """The cos and sin rows of ``pos``: precomputed, or computed into the scratch row past the table
    (with the same function, so the values are identical either way)."""
    cdef int half = rope.spec.n_rot // 2
    if pos < rope.rows:
        cos_row[0] = rope.cos + pos * half
        sin_row[0] = rope.sin + pos * half
    else:
        rope_row(&rope.spec, pos, rope.scratch, rope.scratch + half)
        cos_row[0] = rope.scratch
        sin_row[0] = rope.scratch + half


# ---- the row-wise steps -----------------------------------------------------------------------------
# Norms, residual adds and SwiGLU treat each row alone, so any thread may take any row and the bits
# are those of one row at a time. A team takes the rows when they are enough work for team_size
# (counted in multiply-adds: an add 1 per value, a norm 2, SwiGLU's exp and division 8): on one
# thread they were 2.5% of a 2-thread prompt of the 15M shape, with the other thread waiting.
cdef enum:
    ADD_COST = 1
    NORM_COST = 2
    SWIGLU_COST = 8  # GeGLU's table lookup costs less; the same count keeps one rule


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


cdef void ffn_act_rows(const Transformer* t, float* hb, const float* hb2, Py_ssize_t n) noexcept nogil:
    cdef int hidden = t.config.hidden_dim, arithmetic = t.config.arithmetic, act = t.config.ffn_activation
    cdef int team = team_size(t.n_threads, <long long>n * hidden * SWIGLU_COST)
    cdef Py_ssize_t i
    if team == 1:
        for i in range(n):
            ffn_act_as(act, arithmetic, hb + i * hidden, hb2 + i * hidden, hidden)
        return
    for i in prange(n, schedule="static", num_threads=team):
        ffn_act_as(act, arithmetic, hb + i * hidden, hb2 + i * hidden, hidden)


cdef void head_norms(const Transformer* t, float* x, const float* weight, Py_ssize_t n_heads) noexcept nogil:
    """RMSNorm of each of n_heads heads of head_dim values in place (QK-norm: llama.cpp's build_norm of
    Qcur/Kcur, the weight shared by the heads)."""
    cdef int hd = t.config.head_dim
    cdef Py_ssize_t h
    for h in range(n_heads):
        rmsnorm_as(t.config.arithmetic, x + h * hd, x + h * hd, weight, hd, t.config.eps)


# ---- one layer --------------------------------------------------------------------------------------
cdef int layer_qkv(Transformer* t, const LayerPtrs* lw, int li, Py_ssize_t n, long long pos) except -1 nogil:
    """rmsnorm, the Q/K/V products (+ biases) and RoPE of every row."""
    cdef RunState* s = &t.state
    cdef const Config* c = &t.config
    cdef const Observer* o = &t.observer
    cdef int q_dim = c.q_dim, kv_dim = c.kv_dim
    cdef Py_ssize_t i
    cdef const float* cos_row
    cdef const float* sin_row
    cdef RopeTables* rope
    cdef float* outs[3]
    cdef const Matrix* mats[3]
    rmsnorm_rows(t, s.xb, s.x, lw.attn_norm, n)
    report(o, STAGE_ATTN_NORM, li, pos, n, s.xb, c.dim)
    outs[0], outs[1], outs[2] = s.q, s.k, s.v
    mats[0], mats[1], mats[2] = &lw.wq, &lw.wk, &lw.wv
    matmul_many(3, outs, mats, s.xb, n, &s.qscratch, t.n_threads)
    for i in range(n):
        if lw.bq != NULL:
            add_inplace(s.q + i * q_dim, lw.bq, q_dim)
        if lw.bk != NULL:
            add_inplace(s.k + i * kv_dim, lw.bk, kv_dim)
        if lw.bv != NULL:
            add_inplace(s.v + i * kv_dim, lw.bv, kv_dim)
    if lw.q_norm != NULL:
        head_norms(t, s.q, lw.q_norm, n * c.n_heads)
        head_norms(t, s.k, lw.k_norm, n * c.n_kv_heads)
        report(o, STAGE_Q_NORMED, li, pos, n, s.q, q_dim)
        report(o, STAGE_K_NORMED, li, pos, n, s.k, kv_dim)
    if s.q_pre != NULL:
        memcpy(s.q_pre, s.q, n * q_dim * sizeof(float))
    report(o, STAGE_Q_PRE_ROPE, li, pos, n, s.q, q_dim)
    rope = &s.ropes[lw.rope]
    for i in range(n):
        rope_rows_at(rope, pos + i, &cos_row, &sin_row)
        rope_apply(&rope.spec, s.q + i * q_dim, c.n_heads, cos_row, sin_row)
        rope_apply(&rope.spec, s.k + i * kv_dim, c.n_kv_heads, cos_row, sin_row)
    report(o, STAGE_Q, li, pos, n, s.q, q_dim)
    report(o, STAGE_K, li, pos, n, s.k, kv_dim)
    report(o, STAGE_V, li, pos, n, s.v, kv_dim)
    return 0


cdef int layer_attention(Transformer* t, Attention attention, int li, Py_ssize_t n, long long pos) except -1 nogil:
    """The plugin's attention for the rows of layer li, in order: one call for the pass, or one per
    row when the observer reports after each position (the diff's per-position ledger)."""
    cdef RunState* s = &t.state
    cdef const Observer* o = &t.observer
    cdef int q_dim = t.config.q_dim, kv_dim = t.config.kv_dim
    cdef Py_ssize_t i
    if o.attended != NULL:
        for i in range(n):
            attention.attend_c(li, pos + i, s.q + i * q_dim, s.k + i * kv_dim, s.v + i * kv_dim, s.att + i * q_dim)
            o.attended(o.owner, li, pos + i, i)
    elif n == 1:
        attention.attend_c(li, pos, s.q, s.k, s.v, s.att)
    else:
        attention.attend_block_c(li, pos, n, s.q, s.k, s.v, s.att)
    report(o, STAGE_ATTENTION, li, pos, n, s.att, q_dim)
    return 0


cdef int layer_out(Transformer* t, const LayerPtrs* lw, int li, Py_ssize_t n, long long pos) except -1 nogil:
    """Wo and the residual, then the feed-forward block w2(silu(w1 x) * w3 x) and its residual."""
    cdef RunState* s = &t.state
    cdef const Config* c = &t.config
    cdef const Observer* o = &t.observer
    cdef float* outs[2]
    cdef const Matrix* mats[2]
    matmul(s.xb2, &lw.wo, s.att, n, &s.qscratch, t.n_threads)
    report(o, STAGE_ATTN_OUT, li, pos, n, s.xb2, c.dim)
    if lw.post_attn_norm != NULL:
        rmsnorm_rows(t, s.xb2, s.xb2, lw.post_attn_norm, n)
        report(o, STAGE_ATTN_POST_NORM, li, pos, n, s.xb2, c.dim)
    add_rows(t, s.x, s.xb2, n)
    report(o, STAGE_FFN_INP, li, pos, n, s.x, c.dim)
    rmsnorm_rows(t, s.xb, s.x, lw.ffn_norm, n)
    report(o, STAGE_FFN_NORM, li, pos, n, s.xb, c.dim)
    outs[0], outs[1] = s.hb, s.hb2
    mats[0], mats[1] = &lw.w1, &lw.w3
    matmul_many(2, outs, mats, s.xb, n, &s.qscratch, t.n_threads)
    report(o, STAGE_FFN_GATE, li, pos, n, s.hb, c.hidden_dim)
    report(o, STAGE_FFN_UP, li, pos, n, s.hb2, c.hidden_dim)
    ffn_act_rows(t, s.hb, s.hb2, n)
    report(o, STAGE_FFN_ACT, li, pos, n, s.hb, c.hidden_dim)
    matmul(s.xb, &lw.w2, s.hb, n, &s.qscratch, t.n_threads)
    report(o, STAGE_FFN_OUT, li, pos, n, s.xb, c.dim)
    if lw.post_ffn_norm != NULL:
        rmsnorm_rows(t, s.xb, s.xb, lw.post_ffn_norm, n)
        report(o, STAGE_FFN_POST_NORM, li, pos, n, s.xb, c.dim)
    add_rows(t, s.x, s.xb, n)
    report(o, STAGE_LAYER_OUT, li, pos, n, s.x, c.dim)
    return 0


# ---- the pass ---------------------------------------------------------------------------------------
cdef int forward_rows(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                      float* logits, bint classify) except -1 nogil:
    """tokens[0 .. n-1] at positions pos .. pos + n - 1 (1 <= n <= max_block). logits NULL: the last
    row's logits go to state.logits; else logits[n, vocab] gets every row's. classify False skips the
    classifier (a long prompt's passes before its last, whose logits nobody reads: the classifier is
    the largest matrix of small models, 4% of a 512-token prompt of the stories42M shape)."""
    cdef RunState* s = &t.state
    cdef const Config* c = &t.config
    cdef const Observer* o = &t.observer
    cdef int li, dim = c.dim, bad0 = -1, stage0 = 0
    cdef Py_ssize_t i
    if n > 1 and (t.per_position or o.per_position):
        for i in range(n):
            forward_rows(t, attention, tokens + i, 1, pos + i, logits + i * c.vocab_size if logits != NULL else NULL,
                         classify and (logits != NULL or i == n - 1))
            if i == 0:  # each pass of one row writes row 0
                bad0, stage0 = s.row_bad[0], s.row_stage[0]
            else:
                s.row_bad[i], s.row_stage[i] = s.row_bad[0], s.row_stage[0]
        s.row_bad[0], s.row_stage[0] = bad0, stage0
        first_bad_row(s, n, pos)
        return 0
    for i in range(n):
        embedding_row(s.x + i * dim, &t.weights.tok_emb, tokens[i])
        s.row_bad[i] = -1
    report(o, STAGE_EMBEDDING, -1, pos, n, s.x, dim)
    if c.embedding_scale != 1.0:
        scale_values(s.x, c.embedding_scale, n * dim)
        report(o, STAGE_EMBEDDING_SCALED, -1, pos, n, s.x, dim)
    check_rows(s, c, -1, n)
    for li in range(c.n_layers):
        if t.layer_units:  # a block: each layer is a unit of the thread policy (threads.pyx)
            token_start(&t.blocks)
        layer_qkv(t, &t.weights.layers[li], li, n, pos)
        layer_attention(t, attention, li, n, pos)
        layer_out(t, &t.weights.layers[li], li, n, pos)
        if t.layer_units:
            block_end(&t.blocks, n, c.max_block)
        check_rows(s, c, li, n)
    rmsnorm_rows(t, s.x, s.x, t.weights.final_norm, n)
    report(o, STAGE_RESULT_NORM, -1, pos, n, s.x, dim)
    first_bad_row(s, n, pos)
    if not classify:
        return 0
    if logits != NULL:
        matmul(logits, &t.weights.cls, s.x, n, &s.qscratch, t.n_threads)
        softcap(logits, c.logit_softcap, n * c.vocab_size)
        report(o, STAGE_LOGITS, -1, pos, n, logits, c.vocab_size)
    else:
        matvec(s.logits, &t.weights.cls, s.x + (n - 1) * dim, &s.qscratch, t.n_threads)
        softcap(s.logits, c.logit_softcap, c.vocab_size)
        report(o, STAGE_LOGITS, -1, pos + n - 1, 1, s.logits, c.vocab_size)
    return 0


cdef void scale_values(float* x, float scale, Py_ssize_t n) noexcept nogil:
    # ggml_scale: each value times the scale, rounded once
    cdef Py_ssize_t i
    for i in range(n):
        x[i] = x[i] * scale


cdef void softcap(float* logits, float cap, Py_ssize_t n) noexcept nogil:
    # llama.cpp's final-logit soft-capping: scale by 1/cap, tanh, scale by cap (three rounded steps)
    cdef Py_ssize_t i
    cdef float inv
    if cap <= 0.0:
        return
    inv = 1.0 / cap
    for i in range(n):
        logits[i] = tanhf(logits[i] * inv) * cap


cdef int forward(Transformer* t, Attention attention, int token, long long pos) except -1 nogil:
    """One token at one position (decode): a pass of one row, its logits in state.logits."""
    cdef int32_t tok = token
    return forward_rows(t, attention, &tok, 1, pos, NULL, True)


cdef int forward_block(Transformer* t, Attention attention, const int32_t* tokens, Py_ssize_t n, long long pos,
                       float* logits, bint classify=True) except -1 nogil:
    """forward_rows of n <= max_block known tokens, each layer on the team that t.blocks picks (one
    thread or n_threads: the same bits either way); the cap is lifted even if the pass raises."""
    cdef const Config* c = &t.config
    t.layer_units = block_begin(&t.blocks, t.weights.cls.data, n * c.position_work, n, c.max_block)
    try:
        return forward_rows(t, attention, tokens, n, pos, logits, classify)
    finally:
        t.layer_units = False
        block_finish(&t.blocks)
