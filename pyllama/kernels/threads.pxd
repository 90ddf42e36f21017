# Every thread decision of the kernels and plugins goes through team_size (see threads.pyx).

cdef int team_size(int n_threads, long long work) noexcept nogil

# Inside a `with parallel()` block, between two prange loops: Cython ends each loop with `omp for
# nowait`, so a loop that reads what the one before it wrote must wait here for the whole team.
cdef extern from *:
    """
    static inline void pyllama_team_barrier(void) {
    #ifdef _OPENMP
        _Pragma("omp barrier")
    #endif
    }
    """
    void team_barrier "pyllama_team_barrier"() noexcept nogil


# The decode-loop controller (threads.pyx "Decode under load"): one per generation, on the caller's
# stack; the engine calls decode_start once, token_start / token_end around each decode forward and
# decode_finish at the end. It only picks the team size, so it never changes a bit.
cdef struct DecodeTeam:
    const void* key        # what runs (decode_start, block_begin)
    int unit               # UNIT_TOKEN or UNIT_LAYER: what is timed
    int n_threads          # the caller's team; the other choice is one thread
    int mode               # POLICY_FIXED / POLICY_ADAPTIVE / POLICY_ALTERNATE when decode started
    int settled            # the team decode runs on between probes
    int team               # the team of the token being run
    bint probing           # the token runs on the other team, to time it
    bint untimed           # the next token is not timed (the first after a change of team)
    int probe_n            # tokens timed in the current probe
    int probe_tokens       # tokens run in the current probe, its warm-up included
    int since_decision     # tokens timed on the settled team since the last decision
    double probe_sum       # seconds of the current probe's timed tokens
    double probe_cost      # seconds of all the current probe's tokens
    double settled_mean    # running mean of the settled team's seconds per token
    double other_mean      # the other team's seconds per token when last measured
    double started         # monotonic seconds at token_start
    double next_probe      # monotonic seconds at which the next probe may start
    double gap             # seconds between probes (doubles while the settled team keeps winning)
    long long tokens_1     # decode tokens run on one thread
    long long tokens_n     # decode tokens run on n_threads
    long long probes
    long long switches     # changes of the settled team

# key: what the decode runs (the engine passes its classifier's weights): a decode of the same key soon
# after starts from the team the last one settled on, without probing afresh
cdef void decode_start(DecodeTeam* t, int n_threads, const void* key) noexcept nogil
cdef void token_start(DecodeTeam* t) noexcept nogil
cdef void token_end(DecodeTeam* t) noexcept nogil
cdef void decode_finish(DecodeTeam* t) noexcept nogil

# The same controller for the layers of blocks (prompts, Model.logits, a diff's forward passes), one per
# engine: it starts on the caller's team, probes once two layers are timed, and keeps a state per size
# class of blocks (threads.pyx). block_begin(key, work, n, full) before a block (a new size class
# resumes from what this thread remembers of key at that size), token_start before
# each layer, block_end after it (its team holds until the next layer: the classifier runs on it),
# block_finish after the block.
cdef void block_team_start(DecodeTeam* t, int n_threads) noexcept nogil
cdef bint block_begin(DecodeTeam* t, const void* key, long long work, Py_ssize_t n, Py_ssize_t full) noexcept nogil
cdef void block_end(DecodeTeam* t, Py_ssize_t n, Py_ssize_t full) noexcept nogil
cdef void block_finish(DecodeTeam* t) noexcept nogil

# The controller's steps on a given clock (thread_simulation.pyx drives them on a simulated one)
cdef void _decode_start(DecodeTeam* t, int n_threads, const void* key, double now) noexcept nogil
cdef void _block_team_start(DecodeTeam* t, int n_threads, double now) noexcept nogil
cdef void _resume(DecodeTeam* t, double now) noexcept nogil
cdef void _token_done(DecodeTeam* t, double seconds, double now) noexcept nogil
cdef void _block_class(DecodeTeam* t, const void* key, Py_ssize_t n, Py_ssize_t full, double now) noexcept nogil
cdef void _layer_done(DecodeTeam* t, double seconds, Py_ssize_t n, Py_ssize_t full, double now) noexcept nogil
cdef void _remember(const DecodeTeam* t, double now) noexcept nogil
cdef void _decode_finish(DecodeTeam* t, double now) noexcept nogil
