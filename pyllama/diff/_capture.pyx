"""What a diff reads out of each pass of an engine: an observer of the engine (engine/observer.pyx).

``DiffCapture`` keeps, per position of the rows it is given: every layer's attention output (the
plugin's ``out``) in ``attention`` [rows, n_layers, q_dim], the final normed hidden state in
``hidden`` [rows, dim] (the caller applies the classifier to a whole block at once), and in
``ledger`` [rows] the plugin's ``memory_bytes()`` as it is after each position. Row r is position
``start + r`` (``begin(start)``), whether the engine ran the positions as one pass or one by one.

The ledger: a plugin's ``memory_bytes()`` is the sum of what each layer holds, each layer's part
depending on that layer's state only (the contract, attention/base.pyx). The engine calls the plugin
one position at a time while a ledger is kept and reports after each call; each call's change is
added to its position's row, and the running sum from the bytes held when the pass began is then
each position's ledger: what a run of one position at a time would report after that position.
"""

from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport Attention
from pyllama.engine.observer cimport (
    EngineObserver, STAGE_ATTENTION, STAGE_EMBEDDING, STAGE_RESULT_NORM,
)

from pyllama.errors import PluginError


cdef struct Rows:
    float* att                # [rows, n_layers, q_dim] or NULL
    float* hid                # [rows, dim] or NULL
    long long* mem            # [rows] or NULL
    Py_ssize_t rows, n_layers, q_dim, dim
    long long start           # the position of row 0
    long long held            # memory_bytes() after the plugin's last call
    long long base            # memory_bytes() when the current pass began
    void* capture             # borrowed: the DiffCapture, for what needs the GIL


cdef class DiffCapture(EngineObserver):
    cdef Rows r
    cdef readonly Attention plugin
    cdef readonly str label
    cdef object _buffers

    def __init__(self, Attention plugin, config, attention=None, hidden=None, ledger=None, str label=""):
        """``attention`` float32 [rows, n_layers, q_dim], ``hidden`` float32 [rows, dim], ``ledger``
        int64 [rows]: each optional, every one given with the same number of rows."""
        cdef float[:, :, ::1] att_view
        cdef float[:, ::1] hid_view
        cdef long long[::1] mem_view
        self.plugin = plugin
        self.label = label or type(plugin).__name__
        self.r.n_layers, self.r.q_dim, self.r.dim = config.n_layers, config.q_dim, config.dim
        self.r.att, self.r.hid, self.r.mem = NULL, NULL, NULL
        rows = []
        if attention is not None:
            att_view = attention
            if att_view.shape[1] != self.r.n_layers or att_view.shape[2] != self.r.q_dim:
                raise ValueError(f"DiffCapture: attention must be float32 [rows, {self.r.n_layers}, {self.r.q_dim}], "
                                 f"got {list(attention.shape)}")
            self.r.att = &att_view[0, 0, 0]
            rows.append(att_view.shape[0])
        if hidden is not None:
            hid_view = hidden
            if hid_view.shape[1] != self.r.dim:
                raise ValueError(f"DiffCapture: hidden must be float32 [rows, {self.r.dim}], "
                                 f"got {list(hidden.shape)}")
            self.r.hid = &hid_view[0, 0]
            rows.append(hid_view.shape[0])
        if ledger is not None:
            mem_view = ledger
            self.r.mem = &mem_view[0]
            rows.append(mem_view.shape[0])
        if not rows or len(set(rows)) != 1 or rows[0] < 1:
            raise ValueError(f"DiffCapture: give attention, hidden or ledger with the same rows, got {rows}")
        self.r.rows = rows[0]
        self.r.start = 0
        self.r.capture = <void*>self
        self._buffers = (attention, hidden, ledger)
        self.hooks.owner = &self.r
        self.hooks.stage = capture_stage
        self.hooks.stages = ((1 << STAGE_ATTENTION if self.r.att != NULL else 0)
                             | (1 << STAGE_RESULT_NORM if self.r.hid != NULL or self.r.mem != NULL else 0)
                             | (1 << STAGE_EMBEDDING if self.r.mem != NULL else 0))
        if self.r.mem != NULL:
            self.hooks.attended = capture_attended

    def begin(self, long long start):
        """The next passes run positions start, start + 1, ...: row r of the buffers is position start + r."""
        self.r.start = start

    def read_memory(self):
        """memory_bytes() of the plugin, checked, into ``held``."""
        mem = self.plugin.memory_bytes()
        if isinstance(mem, bool) or not isinstance(mem, (int, np.integer)) or mem < 0:
            raise PluginError(f"attention plugin {self.label}: memory_bytes() must return an int >= 0, got {mem!r}")
        self.r.held = <long long>mem

    def memory_bytes(self) -> int:
        """The plugin's memory_bytes() now (checked), which later ledger rows count from: after a
        compression event, its position's row."""
        self.read_memory()
        return self.r.held


cdef Py_ssize_t row_of(Rows* r, long long pos, Py_ssize_t n) except -1 nogil:
    cdef long long row = pos - r.start
    if row < 0 or row + n > r.rows:
        with gil:
            raise ValueError(f"DiffCapture: positions {pos}..{pos + n - 1} are outside its {r.rows} rows "
                             f"from position {r.start}")
    return <Py_ssize_t>row


cdef int read_memory(Rows* r) except -1 nogil:
    with gil:
        (<DiffCapture>r.capture).read_memory()
    return 0


cdef int capture_stage(void* owner, int stage, int layer, long long pos, Py_ssize_t n, const float* rows,
                       Py_ssize_t width) except -1 nogil:
    cdef Rows* r = <Rows*>owner
    cdef Py_ssize_t i, row = row_of(r, pos, n)
    if stage == STAGE_ATTENTION:
        for i in range(n):
            memcpy(r.att + ((row + i) * r.n_layers + layer) * r.q_dim, rows + i * width, width * sizeof(float))
    elif stage == STAGE_EMBEDDING:  # a pass begins: its rows of the ledger count changes from here
        for i in range(n):
            r.mem[row + i] = 0
        read_memory(r)
        r.base = r.held
    elif stage == STAGE_RESULT_NORM:
        if r.hid != NULL:
            memcpy(r.hid + row * r.dim, rows, n * width * sizeof(float))
        if r.mem != NULL:
            r.mem[row] += r.base
            for i in range(1, n):
                r.mem[row + i] += r.mem[row + i - 1]
    return 0


cdef int capture_attended(void* owner, int layer, long long pos, Py_ssize_t i) except -1 nogil:
    cdef Rows* r = <Rows*>owner
    cdef Py_ssize_t row = row_of(r, pos, 1)
    cdef long long before = r.held
    read_memory(r)
    r.mem[row] += r.held - before
    return 0
