"""The Attention base class: the one seam between the engine and a KV cache.

The engine computes this position's post-RoPE query, key and value for a layer and calls
``attend(layer, pos, q, k, v, out)``; the plugin stores whatever it wants of k and v (it owns the
whole cache) and writes the attention result into ``out``. Shapes, all float32 and contiguous::

    q:   [n_heads * head_dim]      k, v: [n_kv_heads * head_dim]      out: [n_heads * head_dim]

Query head h reads KV head h // (n_heads // n_kv_heads); scores are scaled by 1/sqrt(head_dim).

Two ways to write a plugin, one interface:

* **Cython** (``cdef class MyCache(Attention)``): set ``self.native = True`` in ``__cinit__`` and
  implement ``cdef int attend_c(...) except -1 nogil``. The engine calls it without the GIL and
  without any Python object per layer.
* **Python** (``class MyCache(Attention)``): override ``attend`` and work on numpy arrays. The
  engine calls it with numpy views of its own buffers (no copies); slower, otherwise the same.

Both override ``init(config, pool)`` (allocate all state there), ``reset()`` (a new sequence; no
reallocation) and ``memory_bytes()`` (the ledger: bytes of cache state held right now). Set
``max_positions`` in ``__init__`` or ``init`` to run past the model's context (``UNBOUNDED`` for
memory that does not grow); it defaults to the context (``config.seq_len``).

**Blocks.** When the tokens are known in advance (a prompt, a probe, teacher forcing), the engine
runs a block of positions p .. p + m - 1 at once: for each layer it hands the plugin all m positions
of that layer, in order, before the next layer starts. So a plugin sees (layer 0, p), (layer 0,
p + 1), ..., (layer 0, p + m - 1), (layer 1, p), ... instead of position-major order. Every
built-in keeps each layer's state apart, so it computes the same bits either way (tested). The rules:

* A plugin whose layers depend on one another (layer l at position t reads what layer l' wrote at
  t) sets the class attribute ``per_position_order = True``; the engine then runs its blocks one
  position at a time, in the usual order.
* The optional hook ``attend_block(layer, pos, q, k, v, out)`` (rows: q, out [n, q_dim], k, v
  [n, kv_dim]; ``attend_block_c`` for a Cython plugin) takes a layer's positions pos .. pos + n - 1
  at once. It must give exactly the bits of n ``attend`` calls in order; the default is that loop.
* ``memory_bytes()`` must be the sum of what each layer holds, each layer's part depending on that
  layer's state only. Then the engine reports the ledger per position of a block (the diff's
  memory column: bytes held after position p) by asking ``memory_bytes()`` after each call and
  adding up every layer's change at each position. A plugin that cannot say it per layer declares
  ``per_position_order``.

**Beyond attend.** Four optional parts, each free for a plugin that does not use it:

* *The attention weights.* After the shared routine (``attend_head``, ``attend_head_rows``; head.pyx)
  returns, its ``scores`` scratch holds the query head's softmax weights over the rows it attended,
  in the order they were given: a score-based policy (H2O, TOVA, SnapKV) reads them instead of
  computing them again, and reading them changes no bit.
* *Queries before RoPE.* A class that sets ``wants_pre_rope_query = True`` also gets each position's
  queries before RoPE (Expected Attention needs them): ``pre_rope_query(q)`` in Cython (a pointer to
  the row matching q), ``self.query_before_rope`` in Python (set before each ``attend``, to its row,
  and ``attend_block``, to the block's rows). Others pay nothing: the engine keeps no copy.
* *The compression event.* When a context ends (a prompt, a probe's haystack before its question),
  the driver ends its block after that position and calls ``compress(pos)`` before position pos + 1:
  kvpress's query-agnostic protocol. The default does nothing. A class whose policy acts only there
  sets ``compresses_at_event = True``, so that a run without an event says so rather than quietly
  equalling ``causal``.
* *What is held.* ``held_positions(layer)`` returns, for each KV head, the sorted positions whose rows
  the plugin holds after its last call (an int64 array per KV head), or None when the plugin does not
  say. ``holds`` tells what those positions are: ``"rows"`` (their exact rows), ``"summaries"``
  (positions summarised, not kept: lattice, tiered's cold blocks), ``"everything"`` (every position is
  kept and a selection is made per query: quest, kmeans).

**Models that attend differently per layer.** ``config.layer_windows`` says each layer's own window
(0: global; Gemma 3: 512 on five layers of six) and ``config.layer_rope_bases`` its RoPE base
(``config.rerotate(vec, delta, layer)``). The rule: a plugin may hide rows the model would see, never
show rows the model would not. A class that sets ``model_windows = True`` applies its policy within a
local layer's window itself (``sliding``, ``sink``); for any other, the engine runs the local layers
with the model's own exact window and hands the plugin the global layers only
(``pyllama.attention.layers``), as the shared option ``layers=global`` does for every plugin.

**Where it departs.** ``exact_prefix`` (a class attribute or a property; default 0) is the number
of leading positions 0 .. n - 1 at which the plugin attends every earlier position as ``causal`` does,
the same bits, whatever its knobs decide later (``sliding:N``: N; ``sink:s,w``: s + w; ``kmeans``:
sinks + window + budget). Over them a run's queries, keys and values are ``causal``'s, so a driver
that holds a record of ``causal``'s run may make the plugin's calls for those positions again from
the record and run the model only from position n on (``pyllama.leaderboard.starts``). 0 promises
nothing; a value too large is caught by the tests that compare such a start with the run from 0.

**Forking.** ``snapshot()`` returns the plugin's whole state between calls as an object of its own,
and ``restore(snapshot)`` puts that state back into the same plugin, whatever ran in between: a
driver that needs two continuations of one prefix (a teacher-forced answer and the greedy one) runs
the prefix once. The default says it cannot (None), and the driver runs the prefix again. Every
built-in forks (``GatherAttention`` copies the buffers it owns); the tests check that each
continuation after ``restore`` has the bits of a run from position 0.

A class declares ``description`` (one line) and ``knobs`` (its spec-string arguments, each a
constructor keyword). ``pyllama.attention.registry`` checks all of this when a plugin is registered
or loaded, and names the plugin and the problem when something is missing.
"""

# max_positions of a plugin whose memory does not grow with the sequence (sliding, sink, ...):
# the engine computes RoPE rows past its table on the fly, so any position works.
UNBOUNDED = 1 << 62


cdef class Attention:
    """Base class of every attention plugin. See the module docstring for the contract."""

    name = "attention"  # the registry name; subclasses override
    description = ""  # one line for `pyllama plugins`
    knobs = ()  # the spec-string arguments: a tuple of pyllama.attention.spec.Knob (constructor keywords)
    per_position_order = False  # True: the layers depend on each other, so blocks run position by position
    wants_pre_rope_query = False  # True: the engine keeps each position's queries before RoPE for it
    compresses_at_event = False  # True: the policy acts at compression events (compress), causal without one
    holds = "rows"  # what held_positions lists: "rows", "summaries" or "everything" (see the module docstring)
    model_windows = False  # True: applies its policy within a sliding-window layer's window itself (layers.pyx)
    exact_prefix = 0  # the leading positions it attends as causal does, bit for bit (see "Where it departs")

    def __cinit__(self, *args, **kwargs):
        self.max_positions = 0
        self.n_threads = 1
        self.native = False
        self._bound_block = None
        self._block_q = NULL
        self._block_rows = 0
        self._pre_rope_rows = None
        self._pre_rope_q = NULL
        self.query_before_rope = None
        self.layer_policy = "all"

    def init(self, config, pool):
        """Allocate all state for ``config`` (a ModelConfig); ``pool.n_threads`` threads may be used."""

    def reset(self):
        """Forget the sequence: the next call is position 0. Must not reallocate."""

    def memory_bytes(self):
        """Bytes of cache state held right now (the ledger)."""
        raise NotImplementedError(f"{type(self).__name__} must implement memory_bytes()")

    def compress(self, long long pos):
        """The context ended after position ``pos``: compress now (before pos + 1). Default: nothing."""

    def held_positions(self, int layer):
        """For each KV head of ``layer``, the sorted positions held (int64 arrays), or None: not said."""
        return None

    def snapshot(self):
        """The whole state between calls, for ``restore`` (see Forking), or None: this plugin cannot fork."""
        return None

    def restore(self, state):
        """Put back the state ``snapshot()`` returned: the next call continues from there."""
        raise NotImplementedError(f"{type(self).__name__} does not fork: its snapshot() is None")

    def attend(self, int layer, long long pos, q, k, v, out):
        """Attention of one position in one layer (numpy float32 arrays; see the module docstring).

        A Cython plugin gets this for free (it calls ``attend_c``); a Python plugin overrides it.
        """
        if not self.native:
            raise NotImplementedError(
                f"{type(self).__name__} must override attend() (or be a native Cython plugin)"
            )
        cdef float[::1] qv = q
        cdef float[::1] kv = k
        cdef float[::1] vv = v
        cdef float[::1] ov = out
        cfg = self.config
        if cfg is None:
            raise RuntimeError(f"{type(self).__name__}: attend() before init()")
        if (qv.shape[0] != cfg.q_dim or ov.shape[0] != cfg.q_dim
                or kv.shape[0] != cfg.kv_dim or vv.shape[0] != cfg.kv_dim):
            raise ValueError(
                f"attend: expected q/out of {cfg.q_dim} and k/v of {cfg.kv_dim} floats, got "
                f"{qv.shape[0]}, {kv.shape[0]}, {vv.shape[0]}, {ov.shape[0]}"
            )
        self.attend_c(layer, pos, &qv[0], &kv[0], &vv[0], &ov[0])

    def attend_block(self, int layer, long long pos, q, k, v, out):
        """Attention of positions pos .. pos + n - 1 of one layer (numpy rows: q, out [n, q_dim],
        k, v [n, kv_dim]); must equal n ``attend`` calls in order, bit for bit, which is the default."""
        cdef float[:, ::1] qv, kv, vv, ov
        cdef Py_ssize_t i
        if not self.native:
            rows = self.query_before_rope  # the block's rows [n, q_dim]: each attend gets its own
            try:
                for i in range(q.shape[0]):
                    if rows is not None:
                        self.query_before_rope = rows[i]
                    self.attend(layer, pos + i, q[i], k[i], v[i], out[i])
            finally:
                self.query_before_rope = rows
            return
        qv, kv, vv, ov = q, k, v, out
        cfg = self.config
        if cfg is None:
            raise RuntimeError(f"{type(self).__name__}: attend_block() before init()")
        n = qv.shape[0]
        if (qv.shape[1] != cfg.q_dim or ov.shape[1] != cfg.q_dim or kv.shape[1] != cfg.kv_dim
                or vv.shape[1] != cfg.kv_dim or not (kv.shape[0] == vv.shape[0] == ov.shape[0] == n)):
            raise ValueError(f"attend_block: expected n rows of q/out {cfg.q_dim} and k/v {cfg.kv_dim} floats")
        if n:
            self.attend_block_c(layer, pos, n, &qv[0, 0], &kv[0, 0], &vv[0, 0], &ov[0, 0])

    def _configure(self, config, pool, rows=None, pre_rope=None):
        """Called by the engine before ``init``: fills in what every plugin has.

        ``rows`` are the engine's row buffers (q, k, v, out) [max_block, width], handed to a Python
        ``attend`` / ``attend_block`` as numpy views; ``pre_rope`` its queries before RoPE
        [max_block, q_dim] for a plugin that declares ``wants_pre_rope_query``. Without them (a
        plugin driven directly, e.g. wrapped inside another plugin or in a test), ``attend`` is
        called with the caller's arrays only.
        """
        cdef float[:, ::1] bq
        self.config = config
        self.n_threads = pool.n_threads
        self._q_dim = config.q_dim
        self._kv_dim = config.kv_dim
        if self.max_positions <= 0:
            self.max_positions = config.seq_len
        self._bound_block = None
        self._block_q = NULL
        self._block_rows = 0
        self._pre_rope_rows = None
        self._pre_rope_q = NULL
        if rows is not None:
            self._bound_block = tuple(rows)
            bq = rows[0]
            self._block_q = &bq[0, 0]
            self._block_rows = bq.shape[0]
        if pre_rope is not None:
            self._pre_rope_rows = pre_rope
            bq = pre_rope
            self._pre_rope_q = &bq[0, 0]

    cdef Py_ssize_t bound_row(self, const float* q, Py_ssize_t n) except -2 nogil:
        # the row of the engine's buffers that q points at (n rows from there), for the Python path
        cdef Py_ssize_t r = (q - self._block_q) // self._q_dim if self._block_q != NULL else -1
        if r < 0 or r + n > self._block_rows or q != self._block_q + r * self._q_dim:
            with gil:
                raise RuntimeError(f"{type(self).__name__}: the Python path only runs on the engine's buffers")
        return r

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        # The Python path: the engine's row of q, k, v and out handed to attend() as numpy views.
        cdef Py_ssize_t r = self.bound_row(q, 1)
        with gil:
            bq, bk, bv, bo = self._bound_block
            if self._pre_rope_rows is not None:
                self.query_before_rope = self._pre_rope_rows[r]
            self.attend(layer, pos, bq[r], bk[r], bv[r], bo[r])
        return 0

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        # Native: n attend_c calls. The Python path: rows r .. r + n - 1 of the engine's buffers
        # (q points at row r) handed to attend_block() as numpy views.
        cdef Py_ssize_t i, r
        if self.native:
            for i in range(n):
                self.attend_c(layer, pos + i, q + i * self._q_dim, k + i * self._kv_dim, v + i * self._kv_dim,
                              out + i * self._q_dim)
            return 0
        r = self.bound_row(q, n)
        with gil:
            bq, bk, bv, bo = self._bound_block
            if self._pre_rope_rows is not None:
                self.query_before_rope = self._pre_rope_rows[r:r + n]
            self.attend_block(layer, pos, bq[r:r + n], bk[r:r + n], bv[r:r + n], bo[r:r + n])
        return 0
