"""The tracer hook of one-position forwards: each function hands a stage's tensors, copied, to the
callable ``tracer(name, values)`` (``Engine.set_tracer``), under llama.cpp's names (``Qcur-0`` ...;
``pyllama.trace`` compares them with llama-eval-callback logs). Tracing takes the GIL and copies,
so a traced engine runs blocks position by position and never on the fast path.
"""

import numpy as np

from pyllama.engine.state cimport Transformer, Tracer


cdef int emit(const Tracer* tr, str name, int layer, const float* data, Py_ssize_t n) except -1:
    arr = np.asarray(<const float[:n]>data).copy()
    (<object>tr.callback)(name if layer < 0 else f"{name}-{layer}", arr)
    return 0


cdef int trace_embedding(Transformer* t) except -1 nogil:
    with gil:
        emit(&t.tracer, "inp_embd", -1, t.state.x, t.config.dim)
    return 0


cdef int trace_qkv(Transformer* t, int li) except -1 nogil:
    with gil:
        emit(&t.tracer, "attn_norm", li, t.state.xb, t.config.dim)
        emit(&t.tracer, "Qcur", li, t.state.q, t.config.q_dim)
        emit(&t.tracer, "Kcur", li, t.state.k, t.config.kv_dim)
        emit(&t.tracer, "Vcur", li, t.state.v, t.config.kv_dim)
    return 0


cdef int trace_attention(Transformer* t, int li) except -1 nogil:
    with gil:
        emit(&t.tracer, "kqv_merged_cont", li, t.state.att_out, t.config.q_dim)
        emit(&t.tracer, "kqv_out", li, t.state.xb2, t.config.dim)
        emit(&t.tracer, "ffn_inp", li, t.state.x, t.config.dim)
    return 0


cdef int trace_ffn_in(Transformer* t, int li) except -1 nogil:
    with gil:
        emit(&t.tracer, "ffn_norm", li, t.state.xb, t.config.dim)
        emit(&t.tracer, "ffn_gate", li, t.state.hb, t.config.hidden_dim)
        emit(&t.tracer, "ffn_up", li, t.state.hb2, t.config.hidden_dim)
    return 0


cdef int trace_ffn_out(Transformer* t, int li) except -1 nogil:
    with gil:
        emit(&t.tracer, "ffn_gate_par", li, t.state.hb, t.config.hidden_dim)
        emit(&t.tracer, "ffn_out", li, t.state.xb, t.config.dim)
        emit(&t.tracer, "l_out", li, t.state.x, t.config.dim)
    return 0


cdef int trace_result(Transformer* t) except -1 nogil:
    with gil:
        emit(&t.tracer, "result_norm", -1, t.state.x, t.config.dim)
        emit(&t.tracer, "result_output", -1, t.state.logits, t.config.vocab_size)
    return 0
