from pyllama.attention.base cimport Attention
from pyllama.engine.observer cimport EngineObserver
from pyllama.engine.state cimport Transformer

cdef class Engine:
    cdef Transformer t                  # config, weights, run state and observer (state.pxd)
    cdef readonly object config
    cdef readonly object weights
    cdef readonly Attention attention
    cdef readonly int max_block         # most positions one pass takes
    cdef readonly bint per_position     # the plugin's per_position_order: passes of one row each
    cdef readonly EngineObserver observer  # what passes report their stages to, or None
    cdef object _buffers                # numpy owns every buffer the structures point into
    cdef readonly object logits_view

    cdef int _fill_config(self, object config) except -1
    cdef int _bind_weights(self, object weights) except -1
    cdef int _allocate_state(self, bint pre_rope) except -1
    cdef int _rope_tables(self, object config, long long max_positions) except -1
