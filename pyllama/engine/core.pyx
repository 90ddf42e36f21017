"""``Engine``: a model's weights bound to one attention plugin, with every buffer allocated once.

The data is kept apart as in llama2.c's run.c (``state.pxd``): ``Config`` (shapes), the weights
(``TransformerWeights``: pointers taken once from the memory-mapped tensors) and ``RunState`` (the
activations, run.c's names ``x, xb, xb2, hb, hb2, q, k, v, logits``, and the block forward's
buffers). This module fills them and offers the Python API; the computation lives beside it:
``forward.pyx`` (one position), ``block.pyx`` (a block of known positions, each weight read once
per block, bit-identical to one forward per position), ``generate.pyx`` (run.c's token loop),
``capture.pyx`` (what the diff harness reads out), ``trace.pyx`` (llama.cpp-named tensors) and
``nonfinite.pyx`` (where NaN or Inf first appeared). The engine never stores keys or values: the
plugin (``attend_c``) owns the whole cache.
"""

from libc.stdint cimport int32_t
from libc.stdlib cimport malloc, calloc, free
from cpython.ref cimport PyObject

import numpy as np

from pyllama.attention.pool import Pool
from pyllama.kernels.aligned import zeros_aligned
from pyllama.errors import PositionError

from pyllama.attention.base cimport Attention
from pyllama.engine.block cimport forward_block
from pyllama.kernels.threads cimport block_team_start
from pyllama.engine.capture cimport bind_capture, bind_ledger
from pyllama.engine.forward cimport forward
from pyllama.engine.generate cimport generate
from pyllama.engine.state cimport Config, LayerPtrs, RopeTables, RunState
from pyllama.kernels.elementwise cimport arithmetic_of
from pyllama.kernels.matvec cimport matrix_of, quant_scratch
from pyllama.kernels.rope cimport rope_spec_of, rope_row
from pyllama.sampler cimport Sampler

# Positions whose RoPE rows are precomputed; later positions (plugins that run past the context)
# compute their row on the fly with the same function, so the values are identical either way.
DEF ROPE_TABLE_MAX = 1 << 15
# Positions per block pass: 128 rows of activations keep every weight row's reuse in cache while the
# block buffers stay small (stories110M: 6.2 MB; block_buffer_bytes() says how much exactly). 128
# against 64 on an Intel AVX-512 machine, 2 threads, pp512: 42M F32 2,804-2,946 -> 3,136-3,450 tok/s,
# 110M F32 940-1,006 -> 1,026-1,140, Q8_0 level or better; any block size gives the same bits.
DEF DEFAULT_BLOCK = 128
BLOCK_BUFFERS = ("bx", "bxb", "bxb2", "bhb", "bhb2", "bq", "bk", "bv", "batt")


cdef inline const float* vector_ptr(object array):
    return <const float*><size_t>array.ctypes.data if array is not None else NULL


cdef class Engine:
    """A model's weights bound to one attention plugin, with all activation buffers."""

    def __cinit__(self):
        self.t.weights.layers = NULL
        self.t.state.rope.cos = NULL
        self.t.state.rope.sin = NULL
        self.t.state.rope.scratch = NULL
        self.t.capture.attention = NULL
        self.t.capture.hidden = NULL
        self.t.capture.rows = 0
        self.t.capture.skip_logits = False
        self.t.capture.ledger = NULL
        self.t.tracer.on = False
        self.t.tracer.callback = NULL
        self.t.state.nonfinite_layer = -1
        self.t.state.nonfinite_stage = 0
        self.t.state.nonfinite_position = 0

    def __init__(self, config, weights, Attention attention, int n_threads=1, int max_block=DEFAULT_BLOCK):
        if attention is None:
            raise TypeError("Engine needs an attention plugin")
        self.config = config
        self.weights = weights
        self.attention = attention
        self.max_block = max(1, max_block)
        self.per_position = bool(getattr(attention, "per_position_order", False))
        self.t.n_threads = max(1, n_threads)
        block_team_start(&self.t.blocks, self.t.n_threads)  # the block controller (threads.pyx), per engine
        self.t.per_position = self.per_position
        self._tracer = None
        self._fill_config(config)
        self._bind_weights(weights)
        self._allocate_state()
        # the plugin: shapes, threads and the engine's buffers first, then its own allocation
        pool = Pool(self.t.n_threads)
        block = tuple(self._buffers[n] for n in ("bq", "bk", "bv", "batt"))
        attention._configure(config, pool, self._buffers["q"], self._buffers["k"], self._buffers["v"],
                             self._buffers["att_out"], block=block)
        attention.init(config, pool)
        self._rope_tables(config, attention.max_positions)

    cdef int _fill_config(self, object config) except -1:
        self.t.config.dim = config.dim
        self.t.config.hidden_dim = config.hidden_dim
        self.t.config.n_layers = config.n_layers
        self.t.config.n_heads = config.n_heads
        self.t.config.n_kv_heads = config.n_kv_heads
        self.t.config.head_dim = config.head_dim
        self.t.config.q_dim = config.q_dim
        self.t.config.kv_dim = config.kv_dim
        self.t.config.vocab_size = config.vocab_size
        self.t.config.eps = config.norm_eps
        self.t.config.arithmetic = arithmetic_of(config)
        self.t.config.max_block = self.max_block
        return 0

    cdef int _bind_weights(self, object weights) except -1:
        cdef int li
        cdef LayerPtrs* lp
        self.t.weights.tok_emb = matrix_of(weights.token_embedding)
        self.t.weights.cls = matrix_of(weights.classifier)
        self.t.weights.final_norm = vector_ptr(weights.final_norm)
        self.t.weights.layers = <LayerPtrs*>calloc(self.t.config.n_layers, sizeof(LayerPtrs))
        if self.t.weights.layers == NULL:
            raise MemoryError()
        for li, lw in enumerate(weights.layers):
            lp = &self.t.weights.layers[li]
            lp.attn_norm = vector_ptr(lw.attn_norm)
            lp.ffn_norm = vector_ptr(lw.ffn_norm)
            lp.bq = vector_ptr(lw.bq)
            lp.bk = vector_ptr(lw.bk)
            lp.bv = vector_ptr(lw.bv)
            lp.wq = matrix_of(lw.wq)
            lp.wk = matrix_of(lw.wk)
            lp.wv = matrix_of(lw.wv)
            lp.wo = matrix_of(lw.wo)
            lp.w1 = matrix_of(lw.w1)
            lp.w2 = matrix_of(lw.w2)
            lp.w3 = matrix_of(lw.w3)
        return 0

    cdef int _allocate_state(self) except -1:
        """The activations, allocated once (numpy owns the memory; RunState keeps raw pointers)."""
        cdef RunState* s = &self.t.state
        cdef Config c = self.t.config
        widest = max(c.dim, c.hidden_dim, c.q_dim)
        B = self.max_block
        one = {
            "x": c.dim, "xb": widest, "xb2": c.dim, "hb": c.hidden_dim, "hb2": c.hidden_dim,
            "q": c.q_dim, "k": c.kv_dim, "v": c.kv_dim, "att_out": c.q_dim, "logits": c.vocab_size,
        }
        block = {
            "bx": c.dim, "bxb": c.dim, "bxb2": c.dim, "bhb": c.hidden_dim, "bhb2": c.hidden_dim,
            "bq": c.q_dim, "bk": c.kv_dim, "bv": c.kv_dim, "batt": c.q_dim,
        }
        buffers = {name: zeros_aligned(n) for name, n in one.items()}
        buffers.update({name: zeros_aligned((B, n)) for name, n in block.items()})
        # the activation quantisation of the integer kernels: B vectors of the widest input
        buffers["qscratch"] = quant_scratch(&s.qscratch, widest, B)
        # per block row: the first layer whose residual stream held NaN/Inf (-1: none) and what went bad
        buffers["block_bad"] = np.full(B, -1, dtype=np.int32)
        buffers["block_stage"] = np.zeros(B, dtype=np.int32)
        self._buffers = buffers

        def ptr(name):
            return <size_t>buffers[name].ctypes.data

        s.x, s.xb, s.xb2 = <float*><size_t>ptr("x"), <float*><size_t>ptr("xb"), <float*><size_t>ptr("xb2")
        s.hb, s.hb2 = <float*><size_t>ptr("hb"), <float*><size_t>ptr("hb2")
        s.q, s.k, s.v = <float*><size_t>ptr("q"), <float*><size_t>ptr("k"), <float*><size_t>ptr("v")
        s.att_out, s.logits = <float*><size_t>ptr("att_out"), <float*><size_t>ptr("logits")
        s.bx, s.bxb, s.bxb2 = <float*><size_t>ptr("bx"), <float*><size_t>ptr("bxb"), <float*><size_t>ptr("bxb2")
        s.bhb, s.bhb2 = <float*><size_t>ptr("bhb"), <float*><size_t>ptr("bhb2")
        s.bq, s.bk, s.bv = <float*><size_t>ptr("bq"), <float*><size_t>ptr("bk"), <float*><size_t>ptr("bv")
        s.batt = <float*><size_t>ptr("batt")
        s.block_bad = <int*><size_t>ptr("block_bad")
        s.block_stage = <int*><size_t>ptr("block_stage")
        self.logits_view = buffers["logits"].view()
        self.logits_view.flags.writeable = False
        return 0

    cdef int _rope_tables(self, object config, long long max_positions) except -1:
        cdef long long p
        cdef int half
        cdef RopeTables* rope = &self.t.state.rope
        rope.spec = rope_spec_of(config)
        half = max(rope.spec.n_rot // 2, 1)
        rope.rows = min(max(max_positions, config.seq_len), ROPE_TABLE_MAX)
        rope.cos = <float*>malloc(rope.rows * half * sizeof(float))
        rope.sin = <float*>malloc(rope.rows * half * sizeof(float))
        rope.scratch = <float*>malloc(2 * half * sizeof(float))
        if rope.cos == NULL or rope.sin == NULL or rope.scratch == NULL:
            raise MemoryError()
        for p in range(rope.rows):
            rope_row(&rope.spec, p, rope.cos + p * half, rope.sin + p * half)
        return 0

    def __dealloc__(self):
        free(self.t.weights.layers)
        free(self.t.state.rope.cos)
        free(self.t.state.rope.sin)
        free(self.t.state.rope.scratch)

    # ---- what a forward left behind --------------------------------------------------------------
    @property
    def n_threads(self) -> int:
        return self.t.n_threads

    @property
    def max_positions(self) -> int:
        return int(self.attention.max_positions)

    @property
    def nonfinite_layer(self) -> int:
        """-1, or the first layer whose output held NaN/Inf in the last forward."""
        return self.t.state.nonfinite_layer

    @property
    def nonfinite_stage(self) -> int:
        """NONFINITE_* (state.pxd): what of that layer went bad first."""
        return self.t.state.nonfinite_stage

    @property
    def nonfinite_position(self) -> int:
        """The position of nonfinite_layer (a block: its earliest bad row)."""
        return self.t.state.nonfinite_position

    @property
    def block_nonfinite_layers(self):
        """int32[max_block], read-only: after ``forward_block``, row i's first layer whose residual
        stream held NaN or Inf (-1: none; the logits are checked by the caller)."""
        view = self._buffers["block_bad"].view()
        view.flags.writeable = False
        return view

    def block_buffer_bytes(self) -> int:
        """Bytes of the block forward's buffers (activations and quantised inputs for max_block rows)."""
        return int(sum(self._buffers[n].nbytes for n in BLOCK_BUFFERS)
                   + sum(a.nbytes for a in self._buffers["qscratch"]))

    def activation_addresses(self) -> dict:
        """The address of each float32 activation buffer by name (the tests check their alignment)."""
        return {name: int(buf.ctypes.data) for name, buf in self._buffers.items()
                if getattr(buf, "dtype", None) == np.float32}

    # ---- tracing, capture, ledger ----------------------------------------------------------------
    @property
    def tracer(self):
        return self._tracer

    @tracer.setter
    def tracer(self, tracer):
        self.set_tracer(tracer)

    def set_tracer(self, tracer):
        """Call ``tracer(name, values)`` with every intermediate tensor (llama.cpp's names), or None."""
        self._tracer = tracer
        self.t.tracer.on = tracer is not None
        self.t.tracer.callback = <void*><PyObject*>tracer if tracer is not None else NULL

    def set_capture(self, attention=None, hidden=None, bint logits=True):
        """What each forward also hands out, for the diff harness (off by default; off, it costs a NULL
        test per layer): ``attention`` float32[n_layers, q_dim] receives every layer's attention
        output (the plugin's ``out``); ``hidden`` float32[dim] the final normed hidden state. With
        ``logits=False`` the classifier is skipped: the caller computes the logits from ``hidden``
        (teacher forcing multiplies a block of positions at once, with the same arithmetic).

        For ``forward_block`` give one row per position: attention [rows, n_layers, q_dim] and hidden
        [rows, dim] (the block's i-th position in row i; ``forward`` writes row 0)."""
        self._capture_bufs = None
        bind_capture(&self.t.capture, &self.t.config, attention, hidden, logits)
        self._capture_bufs = (attention, hidden)

    def set_ledger(self, ledger=None):
        """With ``ledger`` int64[max_block] given, ``forward_block`` writes into ledger[i] the plugin's
        ``memory_bytes()`` as it is after position pos + i (what a per-position run would report
        after that position), for the diff's memory column. None: off (the default)."""
        self._ledger_buf = None
        bind_ledger(&self.t.capture, &self.t.config, ledger)
        self._ledger_buf = ledger

    # ---- running ---------------------------------------------------------------------------------
    def _check(self, int token, long long pos):
        if not 0 <= token < self.t.config.vocab_size:
            raise PositionError(f"token id {token} is outside the vocabulary of {self.t.config.vocab_size}")
        if not 0 <= pos < self.attention.max_positions:
            raise PositionError(
                f"position {pos} is outside what the attention plugin holds ({self.attention.max_positions})"
            )

    def reset(self):
        """Start a new sequence (the plugin forgets its cache)."""
        self.attention.reset()

    def forward(self, int token, long long pos):
        """Logits for ``token`` at ``pos``: a read-only view of the engine's buffer, overwritten by the next call."""
        self._check(token, pos)
        if self.attention.native and not self.t.tracer.on:
            with nogil:
                forward(&self.t, self.attention, token, pos)
        else:
            forward(&self.t, self.attention, token, pos)
        return self.logits_view

    def forward_block(self, const int32_t[::1] tokens, long long pos, float[:, ::1] logits=None):
        """Run ``tokens`` at positions pos, pos + 1, ... (any number, in passes of max_block).

        ``logits`` float32[len(tokens), vocab]: receives every position's logits. Without it, the
        last position's logits are in the read-only view this returns (as ``forward``). Bit-identical
        to one ``forward`` per token. Capture buffers (``set_capture``) and a ledger (``set_ledger``)
        need len(tokens) <= max_block and as many rows."""
        cdef Py_ssize_t n = tokens.shape[0]
        cdef Py_ssize_t i, c, m
        cdef float* out
        cdef bint classify
        cdef Py_ssize_t rows = self.t.capture.rows
        if n < 1:
            raise ValueError("forward_block needs at least one token")
        if logits is not None and (logits.shape[0] < n or logits.shape[1] != self.t.config.vocab_size):
            raise ValueError(f"forward_block: logits must be float32 [{n}, {self.t.config.vocab_size}], "
                             f"got [{logits.shape[0]}, {logits.shape[1]}]")
        capturing = self.t.capture.attention != NULL or self.t.capture.hidden != NULL or self.t.capture.ledger != NULL
        if capturing and (n > self.max_block or (n > rows and rows > 0)):
            raise ValueError(f"forward_block: {n} positions, but the capture buffers and ledger hold "
                             f"{min(self.max_block, rows or self.max_block)}")
        for i in range(n):
            self._check(tokens[i], pos + i)
        cdef bint fast = self.attention.native and not self.t.tracer.on
        for c in range(0, n, self.max_block):
            m = min(self.max_block, n - c)
            out = NULL if logits is None else &logits[c, 0]
            classify = out != NULL or c + m == n  # without logits, only the last block's are read
            if fast:
                with nogil:
                    forward_block(&self.t, self.attention, &tokens[c], m, pos + c, out, classify)
            else:
                forward_block(&self.t, self.attention, &tokens[c], m, pos + c, out, classify)
        return self.logits_view

    def generate_into(self, const int32_t[::1] prompt, long long steps, Sampler sampler, int32_t[::1] out,
                      on_token=None, const int32_t[::1] stop_ids=None, bint stop_in_prompt=False):
        """run.c's generation loop, with the prompt run in blocks. Writes sampled ids into ``out`` and
        returns ``(n_generated, stop_token or -1, decode_seconds, positions_run, prompt_seconds)``.

        ``steps`` counts positions including the prompt's; the first prompt token is at position
        0 (the plugin is reset first). The prompt's positions run first as blocks (the same logits
        as one forward each), timed as ``prompt_seconds``; ``decode_seconds`` runs from there to
        the end (for a one-token prompt: from the end of the first forward pass, as run.c times
        it). Stops early when the next sampled id is one of ``stop_ids`` (it is not written;
        ``None`` or empty: never stops early). ``stop_in_prompt``: a stop id that comes next in the
        prompt stops too (run.c's rule for BOS; llama.cpp never stops inside the prompt).
        ``on_token(id)`` is called with every next id, forced prompt ids included (what run.c
        prints; those once the prompt has run), when given. With ``on_token=None`` and a native
        plugin, the loop allocates nothing and never takes the GIL. NaN or Inf in a position's
        residual stream or logits raises NonFiniteError naming the position and layer (never sampled).
        """
        cdef Py_ssize_t i, n_prompt = prompt.shape[0]
        if n_prompt < 1:
            raise ValueError("the prompt needs at least one token (BOS)")
        if steps > self.attention.max_positions:
            raise ValueError(f"steps={steps} is more than the plugin's max_positions={self.attention.max_positions}")
        if out.shape[0] < max(steps - n_prompt + 1, 0):
            raise ValueError("out is too small for the ids that can be generated")
        for i in range(n_prompt):
            self._check(prompt[i], 0)
        return generate(&self.t, self.attention, prompt, steps, sampler, out, on_token, stop_ids, stop_in_prompt)
