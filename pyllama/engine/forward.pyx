"""The forward pass of one token at one position: llama2.c run.c's ``forward()``, with the
attention plugin as the only seam.

Per layer: rmsnorm, q, k, v = Wq·x, Wk·x, Wv·x (+ qwen2's biases), RoPE at ``pos``, then
``attention.attend_c(layer, pos, q, k, v, out)`` (the plugin owns the cache; the engine never
stores keys or values), x += Wo·out, rmsnorm, x += W2·(silu(W1·x) * W3·x). Then the final rmsnorm
and the classifier into ``state.logits``. Nothing here allocates; with a native plugin it runs
without the GIL. The residual stream is checked for NaN/Inf after every layer (nonfinite.pyx);
the tracer (trace.pyx) and the diff's capture (capture.pyx) are one call each where they apply.
"""

from pyllama.attention.base cimport Attention
from pyllama.engine.capture cimport capture_attention, capture_hidden
from pyllama.engine.nonfinite cimport locate_nonfinite
from pyllama.engine.state cimport (
    Config, LayerPtrs, RopeTables, RunState, Transformer, TransformerWeights, NONFINITE_EMBEDDING,
)
from pyllama.engine.trace cimport (
    trace_attention, trace_embedding, trace_ffn_in, trace_ffn_out, trace_qkv, trace_result,
)
from pyllama.kernels.elementwise cimport add_inplace, rmsnorm_as, swiglu_as
from pyllama.kernels.finite cimport all_finite
from pyllama.kernels.matvec cimport Matrix, embedding_row, matmul_many, matvec
from pyllama.kernels.rope cimport rope_apply, rope_row


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


cdef int forward(Transformer* t, Attention attention, int token, long long pos) except -1 nogil:
    cdef const Config* c = &t.config
    cdef const TransformerWeights* w = &t.weights
    cdef RunState* s = &t.state
    cdef int li, nt = t.n_threads
    cdef const float* cos_row
    cdef const float* sin_row
    cdef const LayerPtrs* lw
    cdef float* x = s.x
    # Q, K and V (and the FFN's gate and up) in one parallel loop each where their types allow (matmul_many)
    cdef float* outs[3]
    cdef const Matrix* mats[3]
    rope_rows_at(&s.rope, pos, &cos_row, &sin_row)

    embedding_row(x, &w.tok_emb, token)
    s.nonfinite_layer = -1
    s.nonfinite_position = pos
    if not all_finite(x, c.dim):
        s.nonfinite_layer = 0
        s.nonfinite_stage = NONFINITE_EMBEDDING
    if t.tracer.on:
        trace_embedding(t)
    for li in range(c.n_layers):
        lw = &w.layers[li]
        # attention block
        rmsnorm_as(c.arithmetic, s.xb, x, lw.attn_norm, c.dim, c.eps)
        outs[0], outs[1], outs[2] = s.q, s.k, s.v
        mats[0], mats[1], mats[2] = &lw.wq, &lw.wk, &lw.wv
        matmul_many(3, outs, mats, s.xb, 1, &s.qscratch, nt)
        if lw.bq != NULL:
            add_inplace(s.q, lw.bq, c.q_dim)
        if lw.bk != NULL:
            add_inplace(s.k, lw.bk, c.kv_dim)
        if lw.bv != NULL:
            add_inplace(s.v, lw.bv, c.kv_dim)
        rope_apply(&s.rope.spec, s.q, c.n_heads, cos_row, sin_row)
        rope_apply(&s.rope.spec, s.k, c.n_kv_heads, cos_row, sin_row)
        if t.tracer.on:
            trace_qkv(t, li)
        attention.attend_c(li, pos, s.q, s.k, s.v, s.att_out)
        capture_attention(&t.capture, c, li, s.att_out)
        matvec(s.xb2, &lw.wo, s.att_out, &s.qscratch, nt)
        add_inplace(x, s.xb2, c.dim)
        if t.tracer.on:
            trace_attention(t, li)
        # feed-forward block: w2(silu(w1 x) * w3 x)
        rmsnorm_as(c.arithmetic, s.xb, x, lw.ffn_norm, c.dim, c.eps)
        outs[0], outs[1] = s.hb, s.hb2
        mats[0], mats[1] = &lw.w1, &lw.w3
        matmul_many(2, outs, mats, s.xb, 1, &s.qscratch, nt)
        if t.tracer.on:
            trace_ffn_in(t, li)
        swiglu_as(c.arithmetic, s.hb, s.hb2, c.hidden_dim)
        matvec(s.xb, &lw.w2, s.hb, &s.qscratch, nt)
        add_inplace(x, s.xb, c.dim)
        if s.nonfinite_layer < 0 and not all_finite(x, c.dim):
            locate_nonfinite(s, c, li)
        if t.tracer.on:
            trace_ffn_out(t, li)
    rmsnorm_as(c.arithmetic, x, x, w.final_norm, c.dim, c.eps)
    capture_hidden(&t.capture, x, c.dim)
    if not t.capture.skip_logits:
        matvec(s.logits, &w.cls, x, &s.qscratch, nt)
    if t.tracer.on:
        trace_result(t)
    return 0
