"""The forward pass: one token at one position through every layer, or a block of known tokens
(a prompt, teacher forcing) with each weight read once per block, over buffers allocated once.

The engine owns the activations (llama2.c's ``RunState`` names: ``x, xb, xb2, hb, hb2, q, k, v,
logits``) and reads the weights through pointers taken once from the memory-mapped file. It never
stores keys or values: at each layer it hands this position's post-RoPE q, k, v to the attention
plugin (``attend_c``), which owns the whole cache. Nothing in ``forward_c`` or the generation loop
allocates; a native (Cython) plugin runs without the GIL.

``forward_block_c`` runs m known tokens at positions pos .. pos + m - 1: per layer, rmsnorm of every
row, the Q/K/V products on the block (``matmul``: every element is ``matvec``'s), RoPE per row, the
plugin's attention for the m positions in order (``attend_block_c``), then Wo, the residual and the
FFN on the block. Every value is computed with exactly the arithmetic of ``forward_c``, so the
logits are bit-identical to m single-position forwards; only the order in which the plugin sees
(layer, position) pairs changes, which the attention contract allows (base.pyx). A plugin with
``per_position_order = True`` gets m single-position forwards instead.
"""

from libc.stdint cimport int32_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

import numpy as np

from pyllama.errors import NonFiniteError

from pyllama.attention.base cimport Attention
from pyllama.kernels.elementwise cimport rmsnorm, swiglu, add_inplace
from pyllama.kernels.finite cimport all_finite
from pyllama.kernels.matvec cimport matrix_of, matvec, matmul, embedding_row, quant_scratch
from pyllama.kernels.rope cimport rope_spec_of, rope_row, rope_apply
from pyllama.kernels.threads cimport DecodeTeam, decode_start, token_start, token_end, decode_finish
from pyllama.sampler cimport Sampler

# Positions whose RoPE rows are precomputed; later positions (plugins that run past the context)
# compute their row on the fly with the same function, so the values are identical either way.
DEF ROPE_TABLE_MAX = 1 << 15
# Positions per block pass: 64 rows of activations keep every weight row's reuse in cache while the
# block buffers stay small (stories110M: 2.9 MB; block_buffer_bytes() says how much exactly).
DEF DEFAULT_BLOCK = 64


class Pool:
    """What a plugin may use besides its own memory: the thread count."""

    def __init__(self, n_threads: int = 1) -> None:
        self.n_threads = max(1, int(n_threads))

    def __repr__(self) -> str:
        return f"Pool(n_threads={self.n_threads})"


cdef double now_seconds() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef int nonfinite_stage_of(const float* q, const float* k, const float* v, const float* att,
                            const float* wo_out, int q_dim, int kv_dim, int dim) noexcept nogil:
    """Which of a layer's outputs went bad first (NONFINITE_*), given that its residual stream did."""
    if not (all_finite(q, q_dim) and all_finite(k, kv_dim) and all_finite(v, kv_dim)):
        return NONFINITE_QKV
    if not all_finite(att, q_dim):
        return NONFINITE_ATTENTION
    if not all_finite(wo_out, dim):
        return NONFINITE_WO
    return NONFINITE_FFN


cdef int decode_forward(Engine engine, DecodeTeam* team, int token, long long pos, bint fast) except -1:
    # one decode step on the team the controller picked; the cap is lifted even if forward_c raises
    token_start(team)
    try:
        if fast:
            with nogil:
                engine.forward_c(token, pos)
        else:
            engine.forward_c(token, pos)
    finally:
        token_end(team)
    return 0


cdef class Engine:
    """A model's weights bound to one attention plugin, with all activation buffers."""

    def __cinit__(self):
        self.layers = NULL
        self.rope_cos = NULL
        self.rope_sin = NULL
        self.rope_scratch = NULL
        self.capture = NULL
        self.capture_hidden = NULL
        self.capture_rows = 0
        self.skip_logits = False
        self.nonfinite_layer = -1
        self.ledger = NULL

    def __init__(self, config, weights, Attention attention, int n_threads=1, int max_block=DEFAULT_BLOCK):
        cdef int li, half
        cdef long long p
        if attention is None:
            raise TypeError("Engine needs an attention plugin")
        self.config = config
        self.weights = weights
        self.attention = attention
        self.n_threads = max(1, n_threads)
        self.max_block = max(1, max_block)
        self.per_position = bool(getattr(attention, "per_position_order", False))
        self.dim = config.dim
        self.hidden_dim = config.hidden_dim
        self.n_layers = config.n_layers
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.q_dim = config.q_dim
        self.kv_dim = config.kv_dim
        self.vocab_size = config.vocab_size
        self.eps = config.norm_eps
        self.tracer = None
        self.tracing = False

        self.tok_emb = matrix_of(weights.token_embedding)
        self.cls = matrix_of(weights.classifier)
        self.final_norm = <const float*><size_t>weights.final_norm.ctypes.data
        self.layers = <LayerPtrs*>calloc(self.n_layers, sizeof(LayerPtrs))
        if self.layers == NULL:
            raise MemoryError()
        for li, lw in enumerate(weights.layers):
            self.layers[li].attn_norm = <const float*><size_t>lw.attn_norm.ctypes.data
            self.layers[li].ffn_norm = <const float*><size_t>lw.ffn_norm.ctypes.data
            self.layers[li].bq = <const float*><size_t>lw.bq.ctypes.data if lw.bq is not None else NULL
            self.layers[li].bk = <const float*><size_t>lw.bk.ctypes.data if lw.bk is not None else NULL
            self.layers[li].bv = <const float*><size_t>lw.bv.ctypes.data if lw.bv is not None else NULL
            self.layers[li].wq = matrix_of(lw.wq)
            self.layers[li].wk = matrix_of(lw.wk)
            self.layers[li].wv = matrix_of(lw.wv)
            self.layers[li].wo = matrix_of(lw.wo)
            self.layers[li].w1 = matrix_of(lw.w1)
            self.layers[li].w2 = matrix_of(lw.w2)
            self.layers[li].w3 = matrix_of(lw.w3)

        # activations, allocated once (numpy owns the memory; the engine keeps raw pointers)
        widest = max(self.dim, self.hidden_dim, self.q_dim)
        B = self.max_block
        buffers = {
            "x": self.dim, "xb": widest, "xb2": self.dim, "hb": self.hidden_dim, "hb2": self.hidden_dim,
            "q": self.q_dim, "k": self.kv_dim, "v": self.kv_dim, "att_out": self.q_dim,
            "logits": self.vocab_size,
        }
        self._buffers = {name: np.zeros(n, dtype=np.float32) for name, n in buffers.items()}
        block = {
            "bx": self.dim, "bxb": self.dim, "bxb2": self.dim, "bhb": self.hidden_dim, "bhb2": self.hidden_dim,
            "bq": self.q_dim, "bk": self.kv_dim, "bv": self.kv_dim, "batt": self.q_dim,
        }
        self._buffers.update({name: np.zeros((B, n), dtype=np.float32) for name, n in block.items()})
        # the activation quantisation of the integer kernels: B vectors of the widest input
        self._buffers["qscratch"] = quant_scratch(&self.qscratch, widest, B)
        # per block row: the first layer whose residual stream held NaN/Inf (-1: none) and what went bad
        self._buffers["block_bad"] = np.full(B, -1, dtype=np.int32)
        self._buffers["block_stage"] = np.zeros(B, dtype=np.int32)

        def ptr(name):
            return <size_t>self._buffers[name].ctypes.data

        self.x = <float*><size_t>ptr("x")
        self.xb = <float*><size_t>ptr("xb")
        self.xb2 = <float*><size_t>ptr("xb2")
        self.hb = <float*><size_t>ptr("hb")
        self.hb2 = <float*><size_t>ptr("hb2")
        self.q = <float*><size_t>ptr("q")
        self.k = <float*><size_t>ptr("k")
        self.v = <float*><size_t>ptr("v")
        self.att_out = <float*><size_t>ptr("att_out")
        self.logits = <float*><size_t>ptr("logits")
        self.bx = <float*><size_t>ptr("bx")
        self.bxb = <float*><size_t>ptr("bxb")
        self.bxb2 = <float*><size_t>ptr("bxb2")
        self.bhb = <float*><size_t>ptr("bhb")
        self.bhb2 = <float*><size_t>ptr("bhb2")
        self.bq = <float*><size_t>ptr("bq")
        self.bk = <float*><size_t>ptr("bk")
        self.bv = <float*><size_t>ptr("bv")
        self.batt = <float*><size_t>ptr("batt")
        self.block_bad = <int*><size_t>ptr("block_bad")
        self.block_stage = <int*><size_t>ptr("block_stage")
        self.logits_view = self._buffers["logits"].view()
        self.logits_view.flags.writeable = False

        # the plugin: shapes, threads and the engine's buffers first, then its own allocation
        pool = Pool(self.n_threads)
        attention._configure(config, pool, self._buffers["q"], self._buffers["k"], self._buffers["v"],
                             self._buffers["att_out"],
                             block=tuple(self._buffers[name] for name in ("bq", "bk", "bv", "batt")))
        attention.init(config, pool)

        self.rope = rope_spec_of(config)
        half = max(self.rope.n_rot // 2, 1)
        self.rope_rows = min(max(attention.max_positions, config.seq_len), ROPE_TABLE_MAX)
        self.rope_cos = <float*>malloc(self.rope_rows * half * sizeof(float))
        self.rope_sin = <float*>malloc(self.rope_rows * half * sizeof(float))
        self.rope_scratch = <float*>malloc(2 * half * sizeof(float))
        if self.rope_cos == NULL or self.rope_sin == NULL or self.rope_scratch == NULL:
            raise MemoryError()
        for p in range(self.rope_rows):
            rope_row(&self.rope, p, self.rope_cos + p * half, self.rope_sin + p * half)

    def __dealloc__(self):
        free(self.layers)
        free(self.rope_cos)
        free(self.rope_sin)
        free(self.rope_scratch)

    @property
    def max_positions(self) -> int:
        return int(self.attention.max_positions)

    @property
    def block_nonfinite_layers(self):
        """int32[max_block], read-only: after ``forward_block``, row i's first layer whose residual
        stream held NaN or Inf (-1: none; the logits are checked by the caller)."""
        view = self._buffers["block_bad"].view()
        view.flags.writeable = False
        return view

    def block_buffer_bytes(self) -> int:
        """Bytes of the block forward's buffers (activations and quantised inputs for max_block rows)."""
        names = ("bx", "bxb", "bxb2", "bhb", "bhb2", "bq", "bk", "bv", "batt")
        return int(sum(self._buffers[n].nbytes for n in names) + sum(a.nbytes for a in self._buffers["qscratch"]))

    def set_tracer(self, tracer):
        """Call ``tracer(name, values)`` with every intermediate tensor (llama.cpp's names), or None."""
        self.tracer = tracer
        self.tracing = tracer is not None

    def set_capture(self, attention=None, hidden=None, bint logits=True):
        """What each forward also hands out, for the diff harness (off by default; off, it costs a NULL
        test per layer): ``attention`` float32[n_layers, q_dim] receives every layer's attention
        output (the plugin's ``out``); ``hidden`` float32[dim] the final normed hidden state. With
        ``logits=False`` the classifier is skipped: the caller computes the logits from ``hidden``
        (teacher forcing multiplies a block of positions at once, with the same arithmetic).

        For ``forward_block`` give one row per position: attention [rows, n_layers, q_dim] and hidden
        [rows, dim] (the block's i-th position in row i; ``forward`` writes row 0)."""
        cdef float[:, :, ::1] att_view
        cdef float[:, ::1] hid_view
        self.capture = NULL
        self.capture_hidden = NULL
        self.capture_rows = 0
        self.skip_logits = False
        self._capture_bufs = None
        rows = []
        if attention is not None:
            att = attention if attention.ndim == 3 else attention[None]
            att_view = att
            if att_view.shape[1] != self.n_layers or att_view.shape[2] != self.q_dim or att_view.shape[0] < 1:
                raise ValueError(f"set_capture: attention must be float32 [{self.n_layers}, {self.q_dim}] or "
                                 f"[rows, {self.n_layers}, {self.q_dim}], got {list(attention.shape)}")
            self.capture = &att_view[0, 0, 0]
            rows.append(att_view.shape[0])
        if hidden is not None:
            hid = hidden if hidden.ndim == 2 else hidden[None]
            hid_view = hid
            if hid_view.shape[1] != self.dim or hid_view.shape[0] < 1:
                raise ValueError(f"set_capture: hidden must be float32 [{self.dim}] or [rows, {self.dim}], "
                                 f"got {list(hidden.shape)}")
            self.capture_hidden = &hid_view[0, 0]
            rows.append(hid_view.shape[0])
        elif not logits:
            raise ValueError("set_capture: logits=False needs a hidden buffer to hand out instead")
        self.capture_rows = min(rows) if rows else 0
        self.skip_logits = not logits
        self._capture_bufs = (attention, hidden)

    def set_ledger(self, ledger=None):
        """With ``ledger`` int64[max_block] given, ``forward_block`` writes into ledger[i] the plugin's
        ``memory_bytes()`` as it is after position pos + i (what a per-position run would report
        after that position), for the diff's memory column. None: off (the default)."""
        cdef long long[::1] view
        self.ledger = NULL
        self._ledger_buf = None
        if ledger is None:
            return
        view = ledger
        if view.shape[0] < self.max_block:
            raise ValueError(f"set_ledger: the ledger needs {self.max_block} int64 rows, got {view.shape[0]}")
        self.ledger = &view[0]
        self._ledger_buf = ledger

    cdef int _trace(self, str name, int layer, const float* data, Py_ssize_t n) except -1:
        arr = np.asarray(<const float[:n]>data).copy()
        self.tracer(name if layer < 0 else f"{name}-{layer}", arr)
        return 0

    cdef int forward_c(self, int token, long long pos) except -1 nogil:
        cdef int li
        cdef int half = self.rope.n_rot // 2
        cdef const float* cos_row
        cdef const float* sin_row
        cdef LayerPtrs* lw
        cdef float* x = self.x
        if pos < self.rope_rows:
            cos_row = self.rope_cos + pos * half
            sin_row = self.rope_sin + pos * half
        else:
            rope_row(&self.rope, pos, self.rope_scratch, self.rope_scratch + half)
            cos_row = self.rope_scratch
            sin_row = self.rope_scratch + half

        embedding_row(x, &self.tok_emb, token)
        self.nonfinite_layer = -1
        self.nonfinite_position = pos
        if not all_finite(x, self.dim):
            self.nonfinite_layer = 0
            self.nonfinite_stage = NONFINITE_EMBEDDING
        if self.tracing:
            with gil:
                self._trace("inp_embd", -1, x, self.dim)
        for li in range(self.n_layers):
            lw = &self.layers[li]
            # attention block
            rmsnorm(self.xb, x, lw.attn_norm, self.dim, self.eps)
            matvec(self.q, &lw.wq, self.xb, &self.qscratch, self.n_threads)
            matvec(self.k, &lw.wk, self.xb, &self.qscratch, self.n_threads)
            matvec(self.v, &lw.wv, self.xb, &self.qscratch, self.n_threads)
            if lw.bq != NULL:
                add_inplace(self.q, lw.bq, self.q_dim)
            if lw.bk != NULL:
                add_inplace(self.k, lw.bk, self.kv_dim)
            if lw.bv != NULL:
                add_inplace(self.v, lw.bv, self.kv_dim)
            rope_apply(&self.rope, self.q, self.n_heads, cos_row, sin_row)
            rope_apply(&self.rope, self.k, self.n_kv_heads, cos_row, sin_row)
            if self.tracing:
                with gil:
                    self._trace("attn_norm", li, self.xb, self.dim)
                    self._trace("Qcur", li, self.q, self.q_dim)
                    self._trace("Kcur", li, self.k, self.kv_dim)
                    self._trace("Vcur", li, self.v, self.kv_dim)
            self.attention.attend_c(li, pos, self.q, self.k, self.v, self.att_out)
            if self.capture != NULL:
                memcpy(self.capture + li * self.q_dim, self.att_out, self.q_dim * sizeof(float))
            matvec(self.xb2, &lw.wo, self.att_out, &self.qscratch, self.n_threads)
            add_inplace(x, self.xb2, self.dim)
            if self.tracing:
                with gil:
                    self._trace("kqv_merged_cont", li, self.att_out, self.q_dim)
                    self._trace("kqv_out", li, self.xb2, self.dim)
                    self._trace("ffn_inp", li, x, self.dim)
            # feed-forward block: w2(silu(w1 x) * w3 x)
            rmsnorm(self.xb, x, lw.ffn_norm, self.dim, self.eps)
            matvec(self.hb, &lw.w1, self.xb, &self.qscratch, self.n_threads)
            matvec(self.hb2, &lw.w3, self.xb, &self.qscratch, self.n_threads)
            if self.tracing:
                with gil:
                    self._trace("ffn_norm", li, self.xb, self.dim)
                    self._trace("ffn_gate", li, self.hb, self.hidden_dim)
                    self._trace("ffn_up", li, self.hb2, self.hidden_dim)
            swiglu(self.hb, self.hb2, self.hidden_dim)
            matvec(self.xb, &lw.w2, self.hb, &self.qscratch, self.n_threads)
            add_inplace(x, self.xb, self.dim)
            if self.nonfinite_layer < 0 and not all_finite(x, self.dim):
                self._locate_nonfinite(li)
            if self.tracing:
                with gil:
                    self._trace("ffn_gate_par", li, self.hb, self.hidden_dim)
                    self._trace("ffn_out", li, self.xb, self.dim)
                    self._trace("l_out", li, x, self.dim)
        rmsnorm(x, x, self.final_norm, self.dim, self.eps)
        if self.capture_hidden != NULL:
            memcpy(self.capture_hidden, x, self.dim * sizeof(float))
        if not self.skip_logits:
            matvec(self.logits, &self.cls, x, &self.qscratch, self.n_threads)
        if self.tracing:
            with gil:
                self._trace("result_norm", -1, x, self.dim)
                self._trace("result_output", -1, self.logits, self.vocab_size)
        return 0

    cdef void _locate_nonfinite(self, int li) noexcept nogil:
        # layer li's buffers still hold its q, k, v and attention output: which one went bad first
        self.nonfinite_layer = li
        self.nonfinite_stage = nonfinite_stage_of(self.q, self.k, self.v, self.att_out, self.xb2, self.q_dim,
                                                  self.kv_dim, self.dim)

    cdef void _check_block_rows(self, int li, Py_ssize_t n) noexcept nogil:
        # after layer li (-1: the embedding) of a block: the rows whose residual stream just went bad
        cdef Py_ssize_t i
        for i in range(n):
            if self.block_bad[i] >= 0 or all_finite(self.bx + i * self.dim, self.dim):
                continue
            if li < 0:
                self.block_bad[i] = 0
                self.block_stage[i] = NONFINITE_EMBEDDING
            else:
                self.block_bad[i] = li
                self.block_stage[i] = nonfinite_stage_of(
                    self.bq + i * self.q_dim, self.bk + i * self.kv_dim, self.bv + i * self.kv_dim,
                    self.batt + i * self.q_dim, self.bxb2 + i * self.dim, self.q_dim, self.kv_dim, self.dim)

    cdef void _first_bad_row(self, Py_ssize_t n, long long pos) noexcept nogil:
        # the engine's nonfinite_* from a block's rows: the earliest position that went bad
        cdef Py_ssize_t i
        self.nonfinite_layer = -1
        for i in range(n):
            if self.block_bad[i] >= 0:
                self.nonfinite_layer = self.block_bad[i]
                self.nonfinite_stage = self.block_stage[i]
                self.nonfinite_position = pos + i
                return
    cdef int _ledger_step(self, Py_ssize_t i, long long* last) except -1:
        """ledger[i] += the change of memory_bytes() since ``last`` (then ``last`` = now); i < 0: only read."""
        mem = self.attention.memory_bytes()
        if isinstance(mem, bool) or not isinstance(mem, (int, np.integer)) or mem < 0:
            raise TypeError(f"memory_bytes() must return an int >= 0, got {mem!r}")
        if i >= 0:
            self.ledger[i] += <long long>mem - last[0]
        last[0] = <long long>mem
        return 0

    cdef int _attend_block(self, int layer, Py_ssize_t n, long long pos) except -1 nogil:
        """The plugin's attention for positions pos .. pos + n - 1 of one layer, in order. With a
        ledger, one position at a time, recording how each call changes memory_bytes(): a plugin's
        ledger is the sum of what each layer holds, so ledger[i] accumulates every layer's change at
        position pos + i, and the running sum from the block's start is the per-position ledger."""
        cdef Py_ssize_t i
        cdef long long last
        if self.ledger == NULL:
            self.attention.attend_block_c(layer, pos, n, self.bq, self.bk, self.bv, self.batt)
            return 0
        with gil:
            self._ledger_step(-1, &last)
        for i in range(n):
            self.attention.attend_block_c(layer, pos + i, 1, self.bq + i * self.q_dim, self.bk + i * self.kv_dim,
                                          self.bv + i * self.kv_dim, self.batt + i * self.q_dim)
            with gil:
                self._ledger_step(i, &last)
        return 0

    cdef int _per_position_block(self, const int32_t* tokens, Py_ssize_t n, long long pos,
                                 float* logits) except -1 nogil:
        """forward_block_c as n single-position forwards (per_position_order plugins, tracing)."""
        cdef Py_ssize_t i
        cdef long long last
        cdef float* att = self.capture
        cdef float* hid = self.capture_hidden
        try:
            for i in range(n):
                if att != NULL:
                    self.capture = att + i * self.n_layers * self.q_dim
                if hid != NULL:
                    self.capture_hidden = hid + i * self.dim
                self.forward_c(tokens[i], pos + i)
                self.block_bad[i] = self.nonfinite_layer
                self.block_stage[i] = self.nonfinite_stage
                if logits != NULL and not self.skip_logits:
                    memcpy(logits + i * self.vocab_size, self.logits, self.vocab_size * sizeof(float))
                if self.ledger != NULL:
                    with gil:
                        self.ledger[i] = 0
                        last = 0
                        self._ledger_step(i, &last)
        finally:
            self.capture = att
            self.capture_hidden = hid
        self._first_bad_row(n, pos)
        return 0

    cdef int forward_block_c(self, const int32_t* tokens, Py_ssize_t n, long long pos, float* logits) except -1 nogil:
        """Tokens tokens[0 .. n-1] at positions pos .. pos + n - 1 (n <= max_block): logits NULL puts the
        last position's logits in the engine's buffer; else logits[n, vocab] gets every position's."""
        cdef int li
        cdef Py_ssize_t i
        cdef int half = self.rope.n_rot // 2
        cdef int dim = self.dim, hidden = self.hidden_dim, q_dim = self.q_dim, kv_dim = self.kv_dim
        cdef long long p, base
        cdef const float* cos_row
        cdef const float* sin_row
        cdef LayerPtrs* lw
        cdef float* x = self.bx
        if self.per_position or self.tracing:
            return self._per_position_block(tokens, n, pos, logits)
        if self.ledger != NULL:
            for i in range(n):
                self.ledger[i] = 0
            with gil:
                self._ledger_step(-1, &base)
        for i in range(n):
            embedding_row(x + i * dim, &self.tok_emb, tokens[i])
            self.block_bad[i] = -1
        self._check_block_rows(-1, n)
        for li in range(self.n_layers):
            lw = &self.layers[li]
            # attention block
            for i in range(n):
                rmsnorm(self.bxb + i * dim, x + i * dim, lw.attn_norm, dim, self.eps)
            matmul(self.bq, &lw.wq, self.bxb, n, &self.qscratch, self.n_threads)
            matmul(self.bk, &lw.wk, self.bxb, n, &self.qscratch, self.n_threads)
            matmul(self.bv, &lw.wv, self.bxb, n, &self.qscratch, self.n_threads)
            for i in range(n):
                if lw.bq != NULL:
                    add_inplace(self.bq + i * q_dim, lw.bq, q_dim)
                if lw.bk != NULL:
                    add_inplace(self.bk + i * kv_dim, lw.bk, kv_dim)
                if lw.bv != NULL:
                    add_inplace(self.bv + i * kv_dim, lw.bv, kv_dim)
                p = pos + i
                if p < self.rope_rows:
                    cos_row = self.rope_cos + p * half
                    sin_row = self.rope_sin + p * half
                else:
                    rope_row(&self.rope, p, self.rope_scratch, self.rope_scratch + half)
                    cos_row = self.rope_scratch
                    sin_row = self.rope_scratch + half
                rope_apply(&self.rope, self.bq + i * q_dim, self.n_heads, cos_row, sin_row)
                rope_apply(&self.rope, self.bk + i * kv_dim, self.n_kv_heads, cos_row, sin_row)
            self._attend_block(li, n, pos)
            if self.capture != NULL:
                for i in range(n):
                    memcpy(self.capture + (i * self.n_layers + li) * q_dim, self.batt + i * q_dim,
                           q_dim * sizeof(float))
            matmul(self.bxb2, &lw.wo, self.batt, n, &self.qscratch, self.n_threads)
            for i in range(n):
                add_inplace(x + i * dim, self.bxb2 + i * dim, dim)
            # feed-forward block: w2(silu(w1 x) * w3 x)
            for i in range(n):
                rmsnorm(self.bxb + i * dim, x + i * dim, lw.ffn_norm, dim, self.eps)
            matmul(self.bhb, &lw.w1, self.bxb, n, &self.qscratch, self.n_threads)
            matmul(self.bhb2, &lw.w3, self.bxb, n, &self.qscratch, self.n_threads)
            for i in range(n):
                swiglu(self.bhb + i * hidden, self.bhb2 + i * hidden, hidden)
            matmul(self.bxb, &lw.w2, self.bhb, n, &self.qscratch, self.n_threads)
            for i in range(n):
                add_inplace(x + i * dim, self.bxb + i * dim, dim)
            self._check_block_rows(li, n)
        for i in range(n):
            rmsnorm(x + i * dim, x + i * dim, self.final_norm, dim, self.eps)
        if self.capture_hidden != NULL:
            memcpy(self.capture_hidden, x, n * dim * sizeof(float))
        self._first_bad_row(n, pos)
        if self.ledger != NULL:
            # running sums: the ledger after each position of the block
            self.ledger[0] += base
            for i in range(1, n):
                self.ledger[i] += self.ledger[i - 1]
        if self.skip_logits:
            return 0
        if logits != NULL:
            matmul(logits, &self.cls, x, n, &self.qscratch, self.n_threads)
        else:
            matvec(self.logits, &self.cls, x + (n - 1) * dim, &self.qscratch, self.n_threads)
        return 0

    def forward_block(self, const int32_t[::1] tokens, long long pos, float[:, ::1] logits=None):
        """Run ``tokens`` at positions pos, pos + 1, ... (any number, in passes of max_block).

        ``logits`` float32[len(tokens), vocab]: receives every position's logits. Without it, the
        last position's logits are in the read-only view this returns (as ``forward``). Bit-identical
        to one ``forward`` per token. Capture buffers (``set_capture``) and a ledger (``set_ledger``)
        need len(tokens) <= max_block and as many rows."""
        cdef Py_ssize_t n = tokens.shape[0]
        cdef Py_ssize_t i, c, m
        cdef float* out
        if n < 1:
            raise ValueError("forward_block needs at least one token")
        if logits is not None and (logits.shape[0] < n or logits.shape[1] != self.vocab_size):
            raise ValueError(f"forward_block: logits must be float32 [{n}, {self.vocab_size}], "
                             f"got [{logits.shape[0]}, {logits.shape[1]}]")
        if (self.capture != NULL or self.capture_hidden != NULL or self.ledger != NULL) and (
                n > self.max_block or (n > self.capture_rows and self.capture_rows > 0)):
            raise ValueError(f"forward_block: {n} positions, but the capture buffers and ledger hold "
                             f"{min(self.max_block, self.capture_rows or self.max_block)}")
        for i in range(n):
            self._check(tokens[i], pos + i)
        cdef bint fast = self.attention.native and not self.tracing
        for c in range(0, n, self.max_block):
            m = min(self.max_block, n - c)
            out = NULL if logits is None else &logits[c, 0]
            if fast:
                with nogil:
                    self.forward_block_c(&tokens[c], m, pos + c, out)
            else:
                self.forward_block_c(&tokens[c], m, pos + c, out)
        return self.logits_view

    def _check(self, int token, long long pos):
        if not 0 <= token < self.vocab_size:
            raise IndexError(f"token id {token} is outside the vocabulary of {self.vocab_size}")
        if not 0 <= pos < self.attention.max_positions:
            raise IndexError(
                f"position {pos} is outside what the attention plugin holds ({self.attention.max_positions})"
            )

    def reset(self):
        """Start a new sequence (the plugin forgets its cache)."""
        self.attention.reset()

    def forward(self, int token, long long pos):
        """Logits for ``token`` at ``pos``: a read-only view of the engine's buffer, overwritten by the next call."""
        self._check(token, pos)
        if self.attention.native and not self.tracing:
            with nogil:
                self.forward_c(token, pos)
        else:
            self.forward_c(token, pos)
        return self.logits_view

    def generate_into(self, const int32_t[::1] prompt, long long steps, Sampler sampler, int32_t[::1] out,
                      on_token=None, const int32_t[::1] stop_ids=None, bint stop_in_prompt=False):
        """run.c's generation loop, with the prompt run in blocks. Writes sampled ids into ``out`` and
        returns ``(n_generated, stop_token or -1, decode_seconds, positions_run, prompt_seconds)``.

        ``steps`` counts positions including the prompt's; the first prompt token is at position
        0 (the plugin is reset first). The prompt's positions run first as blocks (``forward_block_c``:
        the same logits as one forward each), timed as ``prompt_seconds``; ``decode_seconds`` runs
        from there to the end (for a one-token prompt: from the end of the first forward pass, as
        run.c times it). Stops early when the next sampled id is one of ``stop_ids`` (it is not
        written; ``None`` or empty: never stops early). ``stop_in_prompt``: a stop id that comes next
        in the prompt stops too (run.c's rule for BOS; llama.cpp never stops inside the prompt).
        ``on_token(id)`` is called with every next id, forced prompt ids included (what run.c prints;
        those once the prompt has run), when given. With ``on_token=None`` and a native plugin, the
        loop allocates nothing and never takes the GIL. NaN or Inf in a position's residual stream or
        logits raises NonFiniteError naming the position and layer (never sampled).
        """
        cdef Py_ssize_t n_prompt = prompt.shape[0]
        if n_prompt < 1:
            raise ValueError("the prompt needs at least one token (BOS)")
        if steps > self.attention.max_positions:
            raise ValueError(f"steps={steps} is more than the plugin's max_positions={self.attention.max_positions}")
        if out.shape[0] < max(steps - n_prompt + 1, 0):
            raise ValueError("out is too small for the ids that can be generated")
        cdef Py_ssize_t i, j
        for i in range(n_prompt):
            self._check(prompt[i], 0)
        self.attention.reset()  # a new sequence from position 0 (plugins take positions in order)
        cdef Py_ssize_t n_stop = 0 if stop_ids is None else stop_ids.shape[0]
        # the positions whose tokens are known: the prompt, up to steps and a stop id inside it
        cdef Py_ssize_t n_pre = min(n_prompt, steps) if steps > 0 else 0
        i = 1
        while stop_in_prompt and i < n_pre:
            for j in range(n_stop):
                if prompt[i] == stop_ids[j]:
                    n_pre = i  # positions 0 .. i - 1 run, then the loop stops on prompt[i]
            i += 1
        cdef long long pos = 0
        cdef int token = prompt[0]
        cdef int next_token
        cdef Py_ssize_t n_out = 0
        cdef int stop_token = -1
        cdef Py_ssize_t c
        cdef bint fast = self.attention.native and not self.tracing and on_token is None
        cdef double start = now_seconds()
        for c in range(0, n_pre, self.max_block):
            if fast:
                with nogil:
                    self.forward_block_c(&prompt[c], min(self.max_block, n_pre - c), c, NULL)
            else:
                self.forward_block_c(&prompt[c], min(self.max_block, n_pre - c), c, NULL)
        cdef double prompt_seconds = now_seconds() - start
        cdef DecodeTeam team  # picks 1 or n threads per token from their timings (kernels/threads.pyx)
        decode_start(&team, self.n_threads, self.cls.data)
        start = now_seconds()
        while pos < steps:
            if pos >= n_pre:
                decode_forward(self, &team, token, pos, fast)
            if pos >= n_pre - 1 and (self.nonfinite_layer >= 0 or not all_finite(self.logits, self.vocab_size)):
                raise NonFiniteError.at(self.nonfinite_position if self.nonfinite_layer >= 0 else pos,
                                        self.nonfinite_layer, self.nonfinite_stage, self.n_layers,
                                        type(self.attention).name)
            if pos < n_prompt - 1:
                next_token = prompt[pos + 1]
            else:
                next_token = sampler.sample_c(self.logits)
            pos += 1
            if pos >= n_prompt or stop_in_prompt:
                for i in range(n_stop):
                    if next_token == stop_ids[i]:
                        stop_token = next_token
            if stop_token >= 0:
                break
            if pos >= n_prompt:
                out[n_out] = next_token
                n_out += 1
            if on_token is not None:
                on_token(next_token)
            token = next_token
        cdef double elapsed = now_seconds() - start
        decode_finish(&team)
        return n_out, stop_token, elapsed, pos, prompt_seconds
