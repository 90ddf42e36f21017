"""The common part of the built-in plugins: each keeps rows in buffers of its own, and at every
step gathers, per query head, pointers to the rows it attends (ascending position order) for the
shared exact routine ``attend_head``.

``GatherAttention`` holds what that needs: the model's shapes, the per-head pointer tables and
scores scratch sized for the most rows one step attends (and the lanes scratch of llama.cpp's
arithmetic, head.pyx), per-layer counters (row 0: the positions
each layer has seen, checked by ``check_in_order``; ``reset()`` zeroes them), and ``own()``, which
keeps a numpy array alive for as long as the plugin and hands back its memory as a raw pointer (in
small pages: see ``pyllama_small_pages``). A
subclass calls ``init_gather(config, rows, counters)`` first in ``init`` and then allocates its own
buffers with ``own``; a built-in checks ``planned_bytes(config)`` against the machine's memory
before either (``gather_bytes`` in ``pyllama.attention.memory`` is this part of the plan). The
inline loops ``take_rows``, ``take_listed`` and ``take_ring`` (gather.pxd) fill one head's tables.
"""

import numpy as np

from pyllama.errors import PositionError

from pyllama.attention.base cimport Attention
from pyllama.attention.head cimport GGML_LANES
from pyllama.kernels.elementwise cimport arithmetic_of

cdef extern from *:
    """
    #include <sys/mman.h>
    #include <unistd.h>
    #include <stdint.h>
    /* Small pages for the pages of [p, p + n) (Linux; elsewhere nothing). A plugin's buffers are sized for
       every position but filled from the front, layer by layer; numpy asks for transparent huge pages on
       large arrays, and then each first touch zeroed 2 MiB and finding free huge pages stalled the kernel:
       every other 512-position Model.logits of SmolLM2 spent 0.25 s more (12%) in the kernel. */
    static void pyllama_small_pages(void* p, size_t n) {
    #if defined(MADV_NOHUGEPAGE)
        const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        const uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
        if (b > a) madvise((void*)a, b - a, MADV_NOHUGEPAGE);
    #else
        (void)p;
        (void)n;
    #endif
    }
    """
    void pyllama_small_pages(void* p, size_t n)


cdef class GatherAttention(Attention):
    """Base class of the native built-in plugins (see the module docstring)."""

    def __cinit__(self, *args, **kwargs):
        self.native = True
        self._owned = []
        self._counts = None
        self.length = NULL

    cdef int init_gather(self, config, long long rows, int counters=0, long long score_rows=0) except -1:
        """score_rows: floats of the scores scratch per head, at least rows (0: rows); a plugin that
        attends a block's queries together (causal) asks for one row of scores per query."""
        self._owned = []
        self.n_layers = config.n_layers
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.kv_dim = config.kv_dim
        self.kv_mul = config.kv_mul
        self.rows = rows
        self.score_rows = max(rows, score_rows)
        self.scores = <float*>self.own(np.zeros((config.n_heads, self.score_rows), dtype=np.float32))
        self.lanes = <float*>self.own(np.zeros((config.n_heads, GGML_LANES * config.head_dim), dtype=np.float32))
        self.arithmetic = arithmetic_of(config)
        self.kptr = <const float**>self.own(np.zeros((config.n_heads, rows), dtype=np.uintp))
        self.vptr = <const float**>self.own(np.zeros((config.n_heads, rows), dtype=np.uintp))
        self._counts = None
        self.length = NULL
        if counters > 0:
            self._counts = np.zeros((counters, config.n_layers), dtype=np.int64)
            self.length = <long long*>self.own(self._counts)
        return 0

    def held_positions(self, int layer):
        """Every position the layer has seen, for each KV head: what a plugin that keeps every
        position (dense, or summarised: see its ``holds``) holds. Sinks + window memories override it."""
        t = int(self._counts[0][layer]) if self._counts is not None else 0
        return [np.arange(t, dtype=np.int64) for _ in range(self.n_kv_heads)]

    cdef int keep(self, int layer, long long pos, const float* k, const float* v) except -1 nogil:
        with gil:
            raise NotImplementedError(f"{type(self).name}: keeps no rows of its own layout")

    def recorded_rows(self, int layer, keys, values):
        """What every ``start_from`` checks first: the plugin initialised, ``layer`` in range and fresh
        (after ``reset``), ``keys`` and ``values`` [T, kv_dim]. Returns them as contiguous float32."""
        cfg = self.config
        name = type(self).name
        if cfg is None or self._counts is None:
            raise RuntimeError(f"{name}: start_from() before init()")
        keys = np.ascontiguousarray(keys, dtype=np.float32)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if keys.ndim != 2 or keys.shape[1] != cfg.kv_dim or values.shape != keys.shape:
            raise ValueError(f"{name}: start_from: keys and values [T, {cfg.kv_dim}]")
        if not 0 <= layer < self.n_layers:
            raise PositionError(f"{name}: start_from: layer {layer} outside 0 .. {self.n_layers - 1}")
        if self.length[layer] != 0:
            raise PositionError(f"{name}: start_from: layer {layer} has attended {self.length[layer]} positions "
                                "already (reset() first)")
        return keys, values

    def keep_recorded(self, int layer, keys, values, bint past_prefix=False):
        """``start_from`` for a plugin that departs from ``causal`` after its ``exact_prefix``: positions
        0 .. T - 1 of a fresh ``layer`` kept from a recorded causal run (``keys``, ``values`` float32
        [T, kv_dim]), T at most that prefix, over which the plugin attends as causal does, so that
        causal's rows are its own. ``past_prefix``: any T, for a caller that knows causal's rows are the
        plugin's own at every position and that attending keeps only them (the model's window on a
        local layer: ``LayerSplit.start_local``). Returns T."""
        keys, values = self.recorded_rows(layer, keys, values)
        if keys.shape[0] > self.exact_prefix and not past_prefix:
            raise PositionError(f"{type(self).name}: start_from: {keys.shape[0]:,} positions, but it attends only "
                                f"its first {self.exact_prefix:,} as causal does (exact_prefix)")
        cdef const float[:, ::1] kv = keys
        cdef const float[:, ::1] vv = values
        cdef Py_ssize_t t
        with nogil:
            for t in range(kv.shape[0]):
                self.keep(layer, t, &kv[t, 0], &vv[t, 0])
        return kv.shape[0]

    def reset(self):
        """A new sequence: every per-layer counter back to 0 (no reallocation)."""
        if self._counts is not None:
            self._counts[...] = 0

    cdef int check_in_order(self, int layer, long long pos, long long expected) except -1 nogil:
        """Plugins whose state follows the sequence take positions in order, within max_positions."""
        if pos != expected or pos >= self.max_positions:
            with gil:
                name = type(self).name
                if pos >= self.max_positions:
                    raise PositionError(f"{name}: position {pos} is outside its cache of {self.max_positions} "
                                        f"(raise {name}:positions=N)")
                raise PositionError(f"{name}: layer {layer} expected position {expected}, got {pos} "
                                    "(positions are fed in order from 0; reset() starts a new sequence)")
        return 0

    def snapshot(self):
        """Copies of every buffer ``own`` keeps (the scratch too: one rule, no list to keep in step)
        and the subclass's ``scalar_state()``: a built-in's whole state between calls."""
        return [a.copy() for a in self._owned], self.scalar_state()

    def restore(self, state):
        arrays, scalars = state
        if len(arrays) != len(self._owned) or any(a.shape != b.shape for a, b in zip(arrays, self._owned)):
            raise ValueError(f"{type(self).name}: this snapshot was taken of another plugin's buffers")
        for mine, saved in zip(self._owned, arrays):
            np.copyto(mine, saved)  # in place: pointers into the buffers stay valid
        self.set_scalar_state(scalars)

    def scalar_state(self):
        """What a subclass keeps between calls outside its buffers (``snapshot``): nothing here."""
        return ()

    def set_scalar_state(self, state):
        pass

    def owned_bytes(self):
        """Bytes of every buffer allocated in ``init`` (the row tables and the plugin's own): what
        ``planned_bytes(config)`` predicts before allocating, so that knob values too large for the
        machine are refused first (pyllama.attention.memory)."""
        return sum(int(a.nbytes) for a in self._owned)

    def owned_spans(self):
        """(address, bytes) of each buffer ``own`` keeps: where tests read the kernel's account of its pages."""
        return [(int(a.ctypes.data), int(a.nbytes)) for a in self._owned]

    cdef void* own(self, array) except NULL:
        """Keep ``array`` (C-contiguous) for the plugin's lifetime; its data pointer."""
        if not array.flags.c_contiguous:
            raise ValueError("GatherAttention.own: the array must be C-contiguous")
        if array.size == 0:
            raise ValueError("GatherAttention.own: an empty buffer has no valid pointer (use at least one element)")
        self._owned.append(array)
        pyllama_small_pages(<void*><size_t>array.ctypes.data, array.nbytes)
        return <void*><size_t>array.ctypes.data
