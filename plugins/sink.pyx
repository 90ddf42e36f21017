"""``sink:s,w[,shift]``: the first s positions (attention sinks) plus the last w (StreamingLLM).

Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (2023): keeping the first
few tokens, on which softmax attention dumps its surplus weight, next to a recent window lets a
model run far past its trained context with a fixed cache. That layout, sink rows and a ring
buffer of w rows allocated once in ``init``, is ``pyllama.attention.window``'s; this plugin adds no
state of its own. Memory is flat once s + w positions are held.

Positions. Without ``shift`` every key keeps the position it was rotated with (its place in the
text). With ``shift`` positions are assigned inside the cache, as the paper does: the cached keys
sit at 0 .. n-1 and the query at n-1. RoPE scores depend only on the distance between query and
key, and the window is contiguous, so that is the same as leaving the window's keys and the query
where they are and moving the s sink keys forward by the number of evicted positions
(``delta = first_window_position - s``): each step re-rotates a copy of the s sink keys by
``delta`` (``WindowAttention.moved``), O(s) work instead of re-rotating the whole window.

Rows are gathered in ascending position order (sinks, then window) and attended by the shared
routine; a block of positions that the sinks and the window hold whole (before the first eviction)
is attended as ``causal`` attends one (``attend_held_block``: a layer's sink rows and ring are one
buffer); past it, without ``shift``, 16 positions at a time over the same sinks and windows a row
apart (``attend_window_block``). With s + w >= the sequence length this is ``causal`` bit for bit
(nothing is evicted, so ``shift`` changes nothing either), and ``sink:0,w`` is ``sliding:w``. On a
model's sliding-window layer it keeps the sinks and window rows within the model's window (the sinks
leave it once the sequence is longer than the window); ``shift`` there needs ``layers=global``.
"""

from pyllama.attention.gather cimport BLOCK_QUERIES
from pyllama.attention.window cimport WindowAttention

from pyllama.attention.base import UNBOUNDED
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import Knob, check_knobs
from pyllama.errors import PluginError
from pyllama.attention.window import sink_window_knobs


cdef class Sink(WindowAttention):
    name = "sink"
    description = "first s positions (attention sinks) + last w (StreamingLLM); shift re-assigns positions"
    model_windows = True  # sinks and window within a local layer's window (WindowAttention.visible_span)
    knobs = (
        *sink_window_knobs(4, 252),
        Knob("shift", bool, False, "assign positions inside the cache (StreamingLLM); off: original positions"),
    )

    cdef readonly bint shift

    def __init__(self, sinks: int = 4, window: int = 252, shift: bool = False):
        check_knobs(self, sinks=sinks, window=window, shift=shift)
        self.sinks = sinks
        self.window = window
        self.shift = shift
        self.max_positions = UNBOUNDED

    @property
    def exact_prefix(self):
        """Nothing is evicted before position sinks + window (so ``shift`` moves nothing either)."""
        return int(self.sinks + self.window)

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        rows = int(self.sinks) + int(self.window)
        return self.window_bytes(config, rows, 1, int(self.sinks) if self.shift else 0,
                                 BLOCK_QUERIES * (rows + BLOCK_QUERIES), blocks=not self.shift)

    def init(self, config, pool):
        if self.shift and any(getattr(config, "layer_windows", ())) and self.layer_policy == "all":
            raise PluginError(
                "sink: shift re-assigns positions, which the model's sliding-window layers do not allow: "
                "add layers=global (the model's own window then runs those layers)"
            )
        require_memory("sink", f"sinks={int(self.sinks):,}, window={int(self.window):,}", self.planned_bytes(config))
        rows = self.sinks + self.window
        self.init_window(config, rows, 1, self.sinks if self.shift else 0, BLOCK_QUERIES * (rows + BLOCK_QUERIES))
        if not self.shift:  # with shift each query's sink keys move by its own delta: one position at a time
            self.init_window_blocks()

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.keep(layer, pos, k, v)
        cdef long long first, n_sink, ring_start, n_ring
        self.visible_span(layer, pos, &first, &n_sink, &ring_start, &n_ring)
        cdef const float* sink_keys = self.sink_k + self.layer_at(layer)
        cdef long long delta = ring_start - self.sinks if self.shift else 0
        if delta > 0 and n_sink > 0:  # StreamingLLM positions: sink keys move forward by the evicted count
            sink_keys = self.moved(sink_keys, n_sink, delta, 0)
        return self.attend_kept(layer, q, sink_keys, first, n_sink, ring_start, n_ring, out)

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        # before the first eviction the shift moves nothing (no position has left), so the held block is exact
        return self.attend_held_block(layer, pos, n, q, k, v, out)
