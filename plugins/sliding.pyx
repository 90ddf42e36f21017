"""``sliding:N``: exact attention over the last N positions (the current one included).

The cache is a ring buffer of N rows per layer: float32 ``[n_layers, window, kv_dim]`` keys and
values, allocated once in ``init``; position t lives in row ``t % window``. That is the layout of
``pyllama.attention.window`` without sinks. Memory stops growing after N positions, so the plugin
runs at any length (``max_positions`` is unbounded; the engine computes RoPE rows past the trained
context on the fly).

Rows are gathered in ascending position order and attended by the shared routine, so with
N >= the sequence length this is ``causal`` bit for bit, and ``sink:0,N`` is ``sliding:N``. A block of
positions that the window holds whole (no row overwritten yet, none hidden by the model's window) is
attended as ``causal`` attends one (``attend_held_block``: each head's queries together over the
ring's first rows, which are positions 0 ..); past that, 16 positions at a time whose windows
each start a row further on (``attend_window_block``: the keys scored once for the 16, each query's
softmax and sum as one position's), with the bits of one position at a time. On a
model's sliding-window layer (Gemma 3's local layers) it keeps the last min(N, the model's window)
positions: it applies its own window within the model's.
"""

from pyllama.attention.gather cimport BLOCK_QUERIES
from pyllama.attention.window cimport WindowAttention

from pyllama.attention.base import UNBOUNDED
from pyllama.attention.memory import require_memory
from pyllama.attention.spec import Knob, check_knobs


cdef class Sliding(WindowAttention):
    name = "sliding"
    description = "the last N positions (ring buffer): memory stays flat however long the sequence"
    model_windows = True  # applies its window within a local layer's (WindowAttention.visible_span)
    knobs = (
        Knob("window", int, 256, "positions kept, the current one included", min=1),
    )

    def __init__(self, window: int = 256):
        check_knobs(self, window=window)
        self.sinks = 0
        self.window = window
        self.max_positions = UNBOUNDED

    @property
    def exact_prefix(self):
        """Positions 0 .. window - 1 see every earlier position (on a local layer, the model's window
        or less of them, as causal does); position window is the first to miss one."""
        return int(self.window)

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        W = int(self.window)
        return self.window_bytes(config, W, 1, 0, BLOCK_QUERIES * (W + BLOCK_QUERIES), blocks=True)

    def init(self, config, pool):
        require_memory("sliding", f"window={int(self.window):,}", self.planned_bytes(config))
        self.init_window(config, self.window, 1, 0, BLOCK_QUERIES * (self.window + BLOCK_QUERIES))
        self.init_window_blocks()

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.keep(layer, pos, k, v)
        cdef long long first, n_sink, start, n
        self.visible_span(layer, pos, &first, &n_sink, &start, &n)  # ascending positions start .. pos
        return self.attend_kept(layer, q, NULL, 0, 0, start, n, out)

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        return self.attend_held_block(layer, pos, n, q, k, v, out)
