"""Models that attend differently per layer: which layers a plugin governs.

Gemma 3 interleaves sliding-window layers (each position attends the last 512 positions, itself
included) with global ones. The rule of the contract: a plugin may hide rows the model would see,
never show rows the model would not. A plugin whose class sets ``model_windows = True`` (``sliding``,
``sink``) applies its policy within a local layer's window itself and gets every layer. Any other, or
any plugin given the shared option ``layers=global``, gets the global layers only: ``LayerSplit`` runs
the local layers with the model's own exact window, a ring of ``window`` rows per local layer
attended by the shared routine (``sliding:window``, which holds only those rows, as llama.cpp's
sliding-window cache attends them), and hands every call on a global layer to the plugin unchanged.
So ``causal`` attends exactly what the model attends, and a plugin in its degenerate setting is
``causal`` bit for bit on such a model, whichever layers it governs.

``govern_layers(plugin, config)`` is what the engine calls: the plugin itself on a model without
local layers, or when it handles them, else a ``LayerSplit`` around it.
"""

from pyllama.attention.base cimport Attention

import numpy as np

from pyllama.errors import PluginError
from pyllama.plugins.sliding import Sliding

LAYER_POLICIES = ("all", "global")


def govern_layers(Attention plugin, config):
    """The attention an engine runs for ``plugin`` on the model of ``config`` (see the module docstring)."""
    if isinstance(plugin, LayerSplit):
        return plugin
    if plugin.layer_policy not in LAYER_POLICIES:
        raise PluginError(f"layers={plugin.layer_policy!r}: expected one of {', '.join(LAYER_POLICIES)}")
    windows = tuple(getattr(config, "layer_windows", ()))
    if not any(windows):
        return plugin
    if plugin.layer_policy == "all" and getattr(type(plugin), "model_windows", False):
        return plugin
    return LayerSplit(plugin, windows)


cdef class LayerSplit(Attention):
    """The model's own window on its local layers, ``inner`` on the global ones."""

    name = "layers"
    description = "the model's own sliding window on its local layers, a plugin on the global ones"

    cdef readonly Attention inner
    cdef readonly Attention local    # the model's window: sliding:window on the local layers
    cdef bint* is_local              # [n_layers]
    cdef object _local_flags

    def __init__(self, Attention inner, windows):
        sizes = sorted({w for w in windows if w > 0})
        if len(sizes) != 1:
            raise PluginError(f"the model's local layers have windows {sizes}: one size is supported")
        self.inner = inner
        self.local = Sliding(sizes[0])
        self._local_flags = np.array([w > 0 for w in windows], dtype=np.intc)
        self.is_local = <bint*><size_t>self._local_flags.ctypes.data
        self.native = inner.native
        self.layer_policy = inner.layer_policy
        self.max_positions = inner.max_positions

    # what the engine reads of a plugin's class is the inner plugin's
    @property
    def per_position_order(self):
        return type(self.inner).per_position_order

    @property
    def wants_pre_rope_query(self):
        return type(self.inner).wants_pre_rope_query

    @property
    def compresses_at_event(self):
        return type(self.inner).compresses_at_event

    @property
    def holds(self):
        return type(self.inner).holds

    @property
    def exact_prefix(self):
        return self.inner.exact_prefix  # the local layers run the model's own window: causal's

    def _configure(self, config, pool, rows=None, pre_rope=None):
        Attention._configure(self, config, pool, rows, pre_rope)
        self.inner._configure(config, pool, rows, pre_rope)
        self.local._configure(config, pool, rows, pre_rope)
        self.max_positions = self.inner.max_positions

    def init(self, config, pool):
        self.inner.init(config, pool)
        self.local.init(config, pool)
        self.max_positions = self.inner.max_positions

    def reset(self):
        self.inner.reset()
        self.local.reset()

    def snapshot(self):
        inner = self.inner.snapshot()
        return None if inner is None else (inner, self.local.snapshot())

    def restore(self, state):
        self.inner.restore(state[0])
        self.local.restore(state[1])

    def memory_bytes(self):
        return int(self.inner.memory_bytes()) + int(self.local.memory_bytes())

    def compress(self, long long pos):
        self.inner.compress(pos)

    @property
    def local_layers(self):
        """The layers the model's own window attends, in order."""
        return tuple(int(i) for i in np.flatnonzero(self._local_flags))

    def start_local(self, int layer, keys, values):
        """The model's window on local ``layer`` after positions 0 .. T - 1 of a recorded causal run
        (``keys``, ``values`` [T, kv_dim]), for a branch that starts from the record: causal attends a
        local layer through this same window, so the record's rows are the window's own inputs at every
        position, and attending keeps the rows and reads them (``Sliding.attend_c``): keeping them is
        the state attending leaves, without the attention."""
        if not self._local_flags[layer]:
            raise ValueError(f"layers: start_local: layer {layer} is a global layer")
        return self.local.keep_recorded(layer, keys, values, past_prefix=True)

    def held_positions(self, int layer):
        return self.local.held_positions(layer) if self._local_flags[layer] else self.inner.held_positions(layer)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        if self.is_local[layer]:
            return self.local.attend_c(layer, pos, q, k, v, out)
        return self.inner.attend_c(layer, pos, q, k, v, out)

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        if self.is_local[layer]:
            return self.local.attend_block_c(layer, pos, n, q, k, v, out)
        return self.inner.attend_block_c(layer, pos, n, q, k, v, out)
