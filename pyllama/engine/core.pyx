"""``Engine``: a model's weights bound to one attention plugin, with every buffer allocated once.

The data is kept apart as in llama2.c's run.c (``state.pxd``): ``Config`` (shapes), the weights
(``TransformerWeights``: pointers taken once from the memory-mapped tensors) and ``RunState`` (the
activations, run.c's names ``x, xb, xb2, hb, hb2, q, k, v, att, logits``, each with ``max_block``
rows). This module fills them and offers the Python API; the computation lives beside it:
``forward.pyx`` (the one forward: n >= 1 known tokens, each weight read once per pass; decode is a
pass of one row), ``generate.pyx`` (run.c's token loop), ``observer.pyx`` (what a pass reports of
its stages to whoever observes it: the diff's capture, the tracer) and ``nonfinite.pyx`` (where NaN
or Inf first appeared). The engine never stores keys or values: the plugin (``attend_c``) owns the
whole cache.
"""

from libc.stdint cimport int32_t
from libc.stdlib cimport malloc, calloc, free

import numpy as np

from pyllama.attention.layers import govern_layers
from pyllama.attention.pool import Pool
from pyllama.kernels.aligned import zeros_aligned
from pyllama.errors import PositionError

from pyllama.attention.base cimport Attention
from pyllama.engine.forward cimport forward, forward_block
from pyllama.engine.generate cimport generate
from pyllama.engine.observer cimport EngineObserver
from pyllama.kernels.threads cimport block_team_start
from pyllama.engine.state cimport Config, LayerPtrs, RopeTables, RunState
from pyllama.kernels.elementwise cimport FFN_GELU_TANH, FFN_SILU, arithmetic_of
from pyllama.kernels.matvec cimport matrix_of, quant_scratch
from pyllama.kernels.rope cimport rope_spec_of, rope_row
from pyllama.sampler cimport Sampler

cdef enum:
    # Positions whose RoPE rows are precomputed; later positions (plugins that run past the context)
    # compute their row on the fly with the same function, so the values are identical either way.
    ROPE_TABLE_MAX = 1 << 15
    # Rows per pass: 128 rows of activations keep every weight row's reuse in cache while the buffers
    # stay small (stories110M: 6.2 MB; block_buffer_bytes() says how much exactly); 128 against 64 on
    # an Intel AVX-512 machine, 2 threads, pp512: 42M F32 2,804-2,946 -> 3,136-3,450 tok/s, 110M F32
    # 940-1,006 -> 1,026-1,140, Q8_0 level or better; any block size gives the same bits.
    DEFAULT_BLOCK = 128

# the buffers of max_block rows (block_buffer_bytes counts them with the quantised inputs)
ROW_BUFFERS = ("x", "xb", "xb2", "hb", "hb2", "q", "k", "v", "att", "q_pre")


cdef inline const float* vector_ptr(object array):
    return <const float*><size_t>array.ctypes.data if array is not None else NULL


cdef class Engine:
    """A model's weights bound to one attention plugin, with all activation buffers."""

    def __cinit__(self):
        self.t.weights.layers = NULL
        self.t.state.ropes = NULL
        self.t.state.n_ropes = 0
        self.t.state.q_pre = NULL
        self.t.observer.stage = NULL
        self.t.observer.attended = NULL
        self.t.observer.per_position = False
        self.t.state.nonfinite_layer = -1
        self.t.state.nonfinite_stage = 0
        self.t.state.nonfinite_position = 0

    def __init__(self, config, weights, Attention attention, int n_threads=1, int max_block=DEFAULT_BLOCK):
        if attention is None:
            raise TypeError("Engine needs an attention plugin")
        attention = govern_layers(attention, config)  # a model's sliding-window layers (attention/layers.pyx)
        self.config = config
        self.weights = weights
        self.attention = attention
        self.max_block = max(1, max_block)
        self.per_position = bool(getattr(attention, "per_position_order", False))
        self.t.n_threads = max(1, n_threads)
        block_team_start(&self.t.blocks, self.t.n_threads)  # the block controller (threads.pyx), per engine
        self.t.per_position = self.per_position
        self.t.layer_units = False
        self.observer = None
        self._fill_config(config)
        self._bind_weights(weights)
        self._allocate_state(bool(getattr(attention, "wants_pre_rope_query", False)))
        # the plugin: shapes, threads and the engine's buffers first, then its own allocation
        pool = Pool(self.t.n_threads)
        rows = tuple(self._buffers[n] for n in ("q", "k", "v", "att"))
        attention._configure(config, pool, rows, self._buffers.get("q_pre"))
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
        self.t.config.position_work = config.position_work
        self.t.config.ffn_activation = FFN_GELU_TANH if config.ffn_activation == "gelu_tanh" else FFN_SILU
        self.t.config.embedding_scale = config.embedding_scale
        self.t.config.logit_softcap = config.logit_softcap
        return 0

    cdef int _bind_weights(self, object weights) except -1:
        cdef int li
        cdef LayerPtrs* lp
        self.t.weights.tok_emb = matrix_of(weights.token_embedding, False)  # rows are looked up, never multiplied
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
            lp.q_norm = vector_ptr(lw.q_norm)
            lp.k_norm = vector_ptr(lw.k_norm)
            lp.post_attn_norm = vector_ptr(lw.post_attention_norm)
            lp.post_ffn_norm = vector_ptr(lw.post_ffn_norm)
            lp.wq = matrix_of(lw.wq)
            lp.wk = matrix_of(lw.wk)
            lp.wv = matrix_of(lw.wv)
            lp.wo = matrix_of(lw.wo)
            lp.w1 = matrix_of(lw.w1)
            lp.w2 = matrix_of(lw.w2)
            lp.w3 = matrix_of(lw.w3)
        return 0

    cdef int _allocate_state(self, bint pre_rope) except -1:
        """The activations, max_block rows each, allocated once (numpy owns the memory; RunState keeps
        raw pointers). ``pre_rope``: also a copy of the queries before RoPE, for a plugin that asks."""
        cdef RunState* s = &self.t.state
        cdef Config c = self.t.config
        B = self.max_block
        widths = {
            "x": c.dim, "xb": c.dim, "xb2": c.dim, "hb": c.hidden_dim, "hb2": c.hidden_dim,
            "q": c.q_dim, "k": c.kv_dim, "v": c.kv_dim, "att": c.q_dim,
        }
        if pre_rope:
            widths["q_pre"] = c.q_dim
        buffers = {name: zeros_aligned((B, n)) for name, n in widths.items()}
        buffers["logits"] = zeros_aligned(c.vocab_size)
        # the activation quantisation of the integer kernels: B vectors of the widest input
        buffers["qscratch"] = quant_scratch(&s.qscratch, max(c.dim, c.hidden_dim, c.q_dim), B)
        # per row: the first layer whose residual stream held NaN/Inf (-1: none) and what went bad
        buffers["row_bad"] = np.full(B, -1, dtype=np.int32)
        buffers["row_stage"] = np.zeros(B, dtype=np.int32)
        self._buffers = buffers

        def ptr(name):
            return <size_t>buffers[name].ctypes.data if name in buffers else 0

        s.x, s.xb, s.xb2 = <float*><size_t>ptr("x"), <float*><size_t>ptr("xb"), <float*><size_t>ptr("xb2")
        s.hb, s.hb2 = <float*><size_t>ptr("hb"), <float*><size_t>ptr("hb2")
        s.q, s.k, s.v = <float*><size_t>ptr("q"), <float*><size_t>ptr("k"), <float*><size_t>ptr("v")
        s.att, s.q_pre = <float*><size_t>ptr("att"), <float*><size_t>ptr("q_pre")
        s.logits = <float*><size_t>ptr("logits")
        s.row_bad = <int*><size_t>ptr("row_bad")
        s.row_stage = <int*><size_t>ptr("row_stage")
        self.logits_view = buffers["logits"].view()
        self.logits_view.flags.writeable = False
        return 0

    cdef int _rope_tables(self, object config, long long max_positions) except -1:
        """One table of cos and sin rows per distinct RoPE base of the layers (Gemma 3: two), and
        each layer's index into them."""
        cdef long long p
        cdef int half, r, li
        cdef RopeTables* rope
        bases = list(dict.fromkeys(config.layer_rope_bases))
        self.t.state.ropes = <RopeTables*>calloc(len(bases), sizeof(RopeTables))
        if self.t.state.ropes == NULL:
            raise MemoryError()
        self.t.state.n_ropes = len(bases)
        for li in range(config.n_layers):
            self.t.weights.layers[li].rope = bases.index(config.layer_rope_bases[li])
        for r in range(len(bases)):
            rope = &self.t.state.ropes[r]
            rope.spec = rope_spec_of(config, bases[r])
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
        cdef int r
        free(self.t.weights.layers)
        if self.t.state.ropes != NULL:
            for r in range(self.t.state.n_ropes):
                free(self.t.state.ropes[r].cos)
                free(self.t.state.ropes[r].sin)
                free(self.t.state.ropes[r].scratch)
            free(self.t.state.ropes)

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
        view = self._buffers["row_bad"].view()
        view.flags.writeable = False
        return view

    def block_buffer_bytes(self) -> int:
        """Bytes of the forward's buffers (activations and quantised inputs for max_block rows)."""
        return int(sum(self._buffers[n].nbytes for n in ROW_BUFFERS if n in self._buffers)
                   + sum(a.nbytes for a in self._buffers["qscratch"]))

    def activation_addresses(self) -> dict:
        """The address of each float32 activation buffer by name (the tests check their alignment)."""
        return {name: int(buf.ctypes.data) for name, buf in self._buffers.items()
                if getattr(buf, "dtype", None) == np.float32}

    # ---- observing --------------------------------------------------------------------------------
    def set_observer(self, EngineObserver observer=None):
        """Report every pass's stages to ``observer`` (observer.pyx: the diff's capture and ledger, a
        tracer), or to nobody (None, the default: a pass then pays one NULL test per stage)."""
        self.observer = observer
        if observer is None:
            self.t.observer.stage = NULL
            self.t.observer.attended = NULL
            self.t.observer.per_position = False
        else:
            self.t.observer = observer.hooks

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
        """Logits for ``token`` at ``pos``: a read-only view of the engine's buffer, overwritten by the
        next call. A pass of one row, as decode runs it."""
        self._check(token, pos)
        if self.attention.native:
            with nogil:
                forward(&self.t, self.attention, token, pos)
        else:
            forward(&self.t, self.attention, token, pos)
        return self.logits_view

    def forward_block(self, const int32_t[::1] tokens, long long pos, float[:, ::1] logits=None,
                      bint classify=True):
        """Run ``tokens`` at positions pos, pos + 1, ... (any number, in passes of max_block rows).

        ``logits`` float32[len(tokens), vocab]: receives every position's logits. Without it, the
        last position's logits are in the read-only view this returns (as ``forward``). Bit-identical
        to one ``forward`` per token. ``classify=False`` skips the classifier (the caller reads the
        final hidden state from an observer and applies it itself)."""
        cdef Py_ssize_t n = tokens.shape[0]
        cdef Py_ssize_t i, c, m
        cdef float* out
        cdef bint last_only
        if n < 1:
            raise ValueError("forward_block needs at least one token")
        if logits is not None and (logits.shape[0] < n or logits.shape[1] != self.t.config.vocab_size):
            raise ValueError(f"forward_block: logits must be float32 [{n}, {self.t.config.vocab_size}], "
                             f"got [{logits.shape[0]}, {logits.shape[1]}]")
        for i in range(n):
            self._check(tokens[i], pos + i)
        cdef bint fast = self.attention.native
        for c in range(0, n, self.max_block):
            m = min(self.max_block, n - c)
            out = NULL if logits is None else &logits[c, 0]
            last_only = classify and (out != NULL or c + m == n)  # without logits, only the last pass's are read
            if fast:
                with nogil:
                    forward_block(&self.t, self.attention, &tokens[c], m, pos + c, out, last_only)
            else:
                forward_block(&self.t, self.attention, &tokens[c], m, pos + c, out, last_only)
        return self.logits_view

    def compress(self, long long pos):
        """The context ended after position ``pos``: the plugin's compression event, before pos + 1
        (a driver that runs blocks ends its block at pos first)."""
        self.attention.compress(pos)

    def generate_into(self, const int32_t[::1] prompt, long long steps, Sampler sampler, int32_t[::1] out,
                      on_token=None, const int32_t[::1] stop_ids=None, bint stop_in_prompt=False,
                      long long compress_at=-1):
        """run.c's generation loop, with the prompt run in blocks. Writes sampled ids into ``out`` and
        returns ``(n_generated, stop_token or -1, decode_seconds, positions_run, prompt_seconds)``.

        ``steps`` counts positions including the prompt's; the first prompt token is at position
        0 (the plugin is reset first). The prompt's positions run first as blocks (the same logits
        as one forward each), timed as ``prompt_seconds``; ``decode_seconds`` runs from there to
        the end (for a one-token prompt: from the end of the first forward pass, as run.c times
        it). Stops early when the next sampled id is one of ``stop_ids`` (it is not written;
        ``None`` or empty: never stops early). ``stop_in_prompt``: a stop id that comes next in the
        prompt stops too (run.c's rule for BOS; llama.cpp never stops inside the prompt).
        ``compress_at``: the plugin's compression event (``compress``) comes after that position, its
        pass ending there; -1: none. ``on_token(id)`` is called with every next id, forced prompt
        ids included (what run.c prints; those once the prompt has run), when given. With ``on_token=None`` and a native
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
        return generate(&self.t, self.attention, prompt, steps, sampler, out, on_token, stop_ids, stop_in_prompt,
                        compress_at)
