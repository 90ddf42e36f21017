# The tracer hook: every intermediate tensor under llama.cpp's names, handed to a Python callable
# (trace.pyx). A forward calls these only when Transformer.tracer.on.

from pyllama.engine.state cimport Transformer

cdef int trace_embedding(Transformer* t) except -1 nogil
cdef int trace_qkv(Transformer* t, int li) except -1 nogil
cdef int trace_attention(Transformer* t, int li) except -1 nogil
cdef int trace_ffn_in(Transformer* t, int li) except -1 nogil
cdef int trace_ffn_out(Transformer* t, int li) except -1 nogil
cdef int trace_result(Transformer* t) except -1 nogil
