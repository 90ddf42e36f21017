"""Observers: what a forward pass reports of its stages, to whoever asks.

The engine knows nothing of the tools that read its intermediate values. It reports each stage of a
pass (``observer.pxd``: the embedding, each layer's normed input, queries, keys, values, attention
output, FFN values, the final hidden state and the logits) to one observer through a C function
pointer, and, when the observer asks, calls the plugin one position at a time and reports after
each (``attended``: the diff's per-position ledger). Without an observer a pass pays one NULL test
per stage. Observers written in Cython (the diff's capture, ``pyllama/diff/_capture.pyx``) fill the
hooks with their own nogil functions; ``StageCallback`` hands each stage to a Python callable (the
tracer), which takes the GIL and copies.
"""

import numpy as np

STAGE_NAMES = (
    "embedding", "attn_norm", "q", "k", "v", "attention", "attn_out", "ffn_inp", "ffn_norm", "ffn_gate",
    "ffn_up", "ffn_act", "ffn_out", "layer_out", "result_norm", "logits", "q_pre_rope", "embedding_scaled",
    "q_normed", "k_normed", "attn_post_norm", "ffn_post_norm",
)
assert len(STAGE_NAMES) == STAGE_COUNT


cdef class EngineObserver:
    """Base class: observes nothing until a subclass fills its hooks."""

    def __cinit__(self, *args, **kwargs):
        self.hooks.owner = <void*>self
        self.hooks.stage = NULL
        self.hooks.attended = NULL
        self.hooks.stages = 0
        self.hooks.per_position = False


cdef int call_stage(void* owner, int stage, int layer, long long pos, Py_ssize_t n, const float* rows,
                    Py_ssize_t width) except -1 nogil:
    with gil:
        values = np.asarray(<const float[:n * width]>rows).reshape(n, width).copy()
        (<StageCallback>owner).callback(STAGE_NAMES[stage], layer, pos, values)
    return 0


cdef class StageCallback(EngineObserver):
    """Calls ``callback(stage, layer, pos, rows)`` for every stage of every pass: ``stage`` one of
    STAGE_NAMES, ``layer`` -1 outside the layers, ``rows`` a float32 copy [n, width] whose row i is
    position pos + i. ``per_position``: passes of one position each (the engine then runs a block
    as single positions, as llama.cpp's eval callback sees one token's tensors at a time)."""

    cdef readonly object callback

    def __init__(self, callback, stages=STAGE_NAMES, bint per_position=False):
        unknown = [s for s in stages if s not in STAGE_NAMES]
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r}; stages: {', '.join(STAGE_NAMES)}")
        self.callback = callback
        self.hooks.stage = call_stage
        self.hooks.stages = sum(1 << STAGE_NAMES.index(s) for s in set(stages))
        self.hooks.per_position = per_position
