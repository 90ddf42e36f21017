"""Capture and the per-position ledger: what a forward also hands out, for the diff harness.

Off by default; off, each costs a NULL test per layer. ``attention`` [rows, n_layers, q_dim]
receives every layer's attention output (the plugin's ``out``), ``hidden`` [rows, dim] the final
normed hidden state (a block's i-th position in row i; one position writes row 0); with
``skip_logits`` the classifier is skipped and the caller computes the logits from ``hidden``.
The ledger [max_block] receives the plugin's ``memory_bytes()`` as it is after each position of a
block (what a per-position run would report after that position).
"""

from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport Attention
from pyllama.engine.state cimport Capture, Config


cdef int bind_capture(Capture* cap, const Config* c, object attention, object hidden, bint logits) except -1:
    """Point ``cap`` at the caller's buffers (checked shapes); the caller keeps them alive."""
    cdef float[:, :, ::1] att_view
    cdef float[:, ::1] hid_view
    cap.attention = NULL
    cap.hidden = NULL
    cap.rows = 0
    cap.skip_logits = False
    rows = []
    if attention is not None:
        att = attention if attention.ndim == 3 else attention[None]
        att_view = att
        if att_view.shape[1] != c.n_layers or att_view.shape[2] != c.q_dim or att_view.shape[0] < 1:
            raise ValueError(f"set_capture: attention must be float32 [{c.n_layers}, {c.q_dim}] or "
                             f"[rows, {c.n_layers}, {c.q_dim}], got {list(attention.shape)}")
        cap.attention = &att_view[0, 0, 0]
        rows.append(att_view.shape[0])
    if hidden is not None:
        hid = hidden if hidden.ndim == 2 else hidden[None]
        hid_view = hid
        if hid_view.shape[1] != c.dim or hid_view.shape[0] < 1:
            raise ValueError(f"set_capture: hidden must be float32 [{c.dim}] or [rows, {c.dim}], "
                             f"got {list(hidden.shape)}")
        cap.hidden = &hid_view[0, 0]
        rows.append(hid_view.shape[0])
    elif not logits:
        raise ValueError("set_capture: logits=False needs a hidden buffer to hand out instead")
    cap.rows = min(rows) if rows else 0
    cap.skip_logits = not logits
    return 0


cdef int bind_ledger(Capture* cap, const Config* c, object ledger) except -1:
    cdef long long[::1] view
    cap.ledger = NULL
    if ledger is None:
        return 0
    view = ledger
    if view.shape[0] < c.max_block:
        raise ValueError(f"set_ledger: the ledger needs {c.max_block} int64 rows, got {view.shape[0]}")
    cap.ledger = &view[0]
    return 0


cdef void capture_attention(Capture* cap, const Config* c, int li, const float* att_out) noexcept nogil:
    if cap.attention != NULL:
        memcpy(cap.attention + li * c.q_dim, att_out, c.q_dim * sizeof(float))


cdef void capture_block_attention(Capture* cap, const Config* c, int li, const float* batt,
                                  Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if cap.attention != NULL:
        for i in range(n):
            memcpy(cap.attention + (i * c.n_layers + li) * c.q_dim, batt + i * c.q_dim, c.q_dim * sizeof(float))


cdef void capture_hidden(Capture* cap, const float* x, Py_ssize_t n_values) noexcept nogil:
    if cap.hidden != NULL:
        memcpy(cap.hidden, x, n_values * sizeof(float))


cdef int ledger_step(Capture* cap, Attention attention, Py_ssize_t i, long long* last) except -1:
    """ledger[i] += the change of memory_bytes() since ``last`` (then ``last`` = now); i < 0: only read."""
    mem = attention.memory_bytes()
    if isinstance(mem, bool) or not isinstance(mem, (int, np.integer)) or mem < 0:
        raise TypeError(f"memory_bytes() must return an int >= 0, got {mem!r}")
    if i >= 0:
        cap.ledger[i] += <long long>mem - last[0]
    last[0] = <long long>mem
    return 0


cdef void ledger_running_sums(Capture* cap, long long base, Py_ssize_t n) noexcept nogil:
    # the ledger after each position of the block: each row held its position's change
    cdef Py_ssize_t i
    if cap.ledger != NULL:
        cap.ledger[0] += base
        for i in range(1, n):
            cap.ledger[i] += cap.ledger[i - 1]
