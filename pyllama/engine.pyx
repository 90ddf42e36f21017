"""The forward pass: one token at one position through every layer, over buffers allocated once.

The engine owns the activations (llama2.c's ``RunState`` names: ``x, xb, xb2, hb, hb2, q, k, v,
logits``) and reads the weights through pointers taken once from the memory-mapped file. It never
stores keys or values: at each layer it hands this position's post-RoPE q, k, v to the attention
plugin (``attend_c``), which owns the whole cache. Nothing in ``forward_c`` or the generation loop
allocates; a native (Cython) plugin runs without the GIL.
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
from pyllama.kernels.matvec cimport matrix_of, matvec, embedding_row
from pyllama.kernels.rope cimport rope_spec_of, rope_row, rope_apply
from pyllama.sampler cimport Sampler

# Positions whose RoPE rows are precomputed; later positions (plugins that run past the context)
# compute their row on the fly with the same function, so the values are identical either way.
DEF ROPE_TABLE_MAX = 1 << 15


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


cdef class Engine:
    """A model's weights bound to one attention plugin, with all activation buffers."""

    def __cinit__(self):
        self.layers = NULL
        self.rope_cos = NULL
        self.rope_sin = NULL
        self.rope_scratch = NULL
        self.capture = NULL
        self.capture_hidden = NULL
        self.skip_logits = False
        self.nonfinite_layer = -1

    def __init__(self, config, weights, Attention attention, int n_threads=1):
        cdef int li, half
        cdef long long p
        if attention is None:
            raise TypeError("Engine needs an attention plugin")
        self.config = config
        self.weights = weights
        self.attention = attention
        self.n_threads = max(1, n_threads)
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
        buffers = {
            "x": self.dim, "xb": widest, "xb2": self.dim, "hb": self.hidden_dim, "hb2": self.hidden_dim,
            "q": self.q_dim, "k": self.kv_dim, "v": self.kv_dim, "att_out": self.q_dim,
            "logits": self.vocab_size, "qs_scales": widest, "qs_sums": widest // 32 + 1,
        }
        self._buffers = {name: np.zeros(n, dtype=np.float32) for name, n in buffers.items()}
        self._buffers["qs_q"] = np.zeros(widest, dtype=np.int8)
        self._buffers["qs_bsums"] = np.zeros(widest // 16 + 1, dtype=np.int16)

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
        self.qscratch.q = <signed char*><size_t>ptr("qs_q")
        self.qscratch.scales = <float*><size_t>ptr("qs_scales")
        self.qscratch.sums = <float*><size_t>ptr("qs_sums")
        self.qscratch.bsums = <short*><size_t>ptr("qs_bsums")
        self.logits_view = self._buffers["logits"].view()
        self.logits_view.flags.writeable = False

        # the plugin: shapes, threads and the engine's buffers first, then its own allocation
        pool = Pool(self.n_threads)
        attention._configure(config, pool, self._buffers["q"], self._buffers["k"], self._buffers["v"],
                             self._buffers["att_out"])
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

    def set_tracer(self, tracer):
        """Call ``tracer(name, values)`` with every intermediate tensor (llama.cpp's names), or None."""
        self.tracer = tracer
        self.tracing = tracer is not None

    def set_capture(self, attention=None, hidden=None, bint logits=True):
        """What each forward also hands out, for the diff harness (off by default; off, it costs a NULL
        test per layer): ``attention`` float32[n_layers, q_dim] receives every layer's attention
        output (the plugin's ``out``); ``hidden`` float32[dim] the final normed hidden state. With
        ``logits=False`` the classifier is skipped: the caller computes the logits from ``hidden``
        (teacher forcing multiplies a block of positions at once, with the same arithmetic)."""
        cdef float[:, ::1] att_view
        cdef float[::1] hid_view
        self.capture = NULL
        self.capture_hidden = NULL
        self.skip_logits = False
        self._capture_bufs = None
        if attention is not None:
            att_view = attention
            if att_view.shape[0] != self.n_layers or att_view.shape[1] != self.q_dim:
                raise ValueError(f"set_capture: attention must be float32 [{self.n_layers}, {self.q_dim}], "
                                 f"got [{att_view.shape[0]}, {att_view.shape[1]}]")
            self.capture = &att_view[0, 0]
        if hidden is not None:
            hid_view = hidden
            if hid_view.shape[0] != self.dim:
                raise ValueError(f"set_capture: hidden must be float32 [{self.dim}], got [{hid_view.shape[0]}]")
            self.capture_hidden = &hid_view[0]
        elif not logits:
            raise ValueError("set_capture: logits=False needs a hidden buffer to hand out instead")
        self.skip_logits = not logits
        self._capture_bufs = (attention, hidden)

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
        if not (all_finite(self.q, self.q_dim) and all_finite(self.k, self.kv_dim)
                and all_finite(self.v, self.kv_dim)):
            self.nonfinite_stage = NONFINITE_QKV
        elif not all_finite(self.att_out, self.q_dim):
            self.nonfinite_stage = NONFINITE_ATTENTION
        elif not all_finite(self.xb2, self.dim):
            self.nonfinite_stage = NONFINITE_WO
        else:
            self.nonfinite_stage = NONFINITE_FFN

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
        """run.c's generation loop. Writes sampled ids into ``out`` and returns
        ``(n_generated, stop_token or -1, seconds_after_first_forward, positions_run)``.

        ``steps`` counts positions including the prompt's; the first prompt token is at position
        0 (the plugin is reset first). Stops early when the next sampled id is one of ``stop_ids``
        (it is not written; ``None`` or empty: never stops early). ``stop_in_prompt``: a stop id
        that comes next in the prompt stops too (run.c's rule for BOS; llama.cpp never stops inside
        the prompt).
        ``on_token(id)`` is called with every next id, forced prompt ids included (what run.c
        prints), when given. With ``on_token=None`` and a native plugin, the loop allocates nothing
        and never takes the GIL. NaN or Inf in a position's residual stream or logits raises
        NonFiniteError naming the position and layer (never sampled).
        """
        cdef Py_ssize_t n_prompt = prompt.shape[0]
        if n_prompt < 1:
            raise ValueError("the prompt needs at least one token (BOS)")
        if steps > self.attention.max_positions:
            raise ValueError(f"steps={steps} is more than the plugin's max_positions={self.attention.max_positions}")
        if out.shape[0] < max(steps - n_prompt + 1, 0):
            raise ValueError("out is too small for the ids that can be generated")
        cdef Py_ssize_t i
        for i in range(n_prompt):
            self._check(prompt[i], 0)
        self.attention.reset()  # a new sequence from position 0 (plugins take positions in order)
        cdef long long pos = 0
        cdef int token = prompt[0]
        cdef int next_token
        cdef Py_ssize_t n_out = 0
        cdef int stop_token = -1
        cdef Py_ssize_t n_stop = 0 if stop_ids is None else stop_ids.shape[0]
        cdef double start = 0.0
        cdef bint fast = self.attention.native and not self.tracing and on_token is None
        while pos < steps:
            if fast:
                with nogil:
                    self.forward_c(token, pos)
            else:
                self.forward_c(token, pos)
            if self.nonfinite_layer >= 0 or not all_finite(self.logits, self.vocab_size):
                raise NonFiniteError.at(pos, self.nonfinite_layer, self.nonfinite_stage, self.n_layers,
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
            if start == 0.0:
                start = now_seconds()
        cdef double elapsed = now_seconds() - start if start != 0.0 else 0.0
        return n_out, stop_token, elapsed, pos
