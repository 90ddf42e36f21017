from pyllama.attention.base cimport Attention
from pyllama.engine.state cimport Transformer

cdef class Engine:
    cdef Transformer t                  # config, weights, run state, capture and tracer (state.pxd)
    cdef readonly object config
    cdef readonly object weights
    cdef readonly Attention attention
    cdef readonly int max_block         # most positions one block pass takes
    cdef readonly bint per_position     # the plugin's per_position_order: blocks run position by position
    cdef object _buffers                # numpy owns every buffer the structures point into
    cdef object _capture_bufs
    cdef object _ledger_buf
    cdef object _tracer
    cdef readonly object logits_view

    cdef int _fill_config(self, object config) except -1
    cdef int _bind_weights(self, object weights) except -1
    cdef int _allocate_state(self) except -1
    cdef int _rope_tables(self, object config, long long max_positions) except -1
