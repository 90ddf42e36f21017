"""How many threads a parallel loop gets: the one place for the thread policy.

**Small work stays serial.** Waking an OpenMP team costs a few microseconds, more than a small
product or an attention step over a few cached rows takes on one thread. So every kernel and plugin
asks ``team_size(n_threads, work)``: one thread below ``serial_below()`` units of work, else the
caller's thread count. ``work`` is counted in float32 multiply-adds, each caller scaling its own
loop to that unit: a float32 matrix of rows x cols is rows * cols, an F16 one half that (its rows
stream twice as fast), an int8 one a quarter, an attention step n_rows * n_heads * head_dim. The
threshold, 2^15 + 1, keeps stories260K's largest product (its 512 x 64 classifier, 2^15) on one
thread: on the idle 2-core machine that one team per token made 2-thread decode 26% slower than 1
thread, while the smallest products of the stories15M shape (288 x 288, 83k) still gain from two.
It is not higher: at 2^16 the attention steps of the stories15M shape between 114 and 227 cached
rows (6 heads x 48 x rows) ran on one thread, and idle 2-thread decode of that shape lost 5% (262
against 277-287 tok/s, six interleaved rounds, benchmarks/README.md).

**Decode under load** (``DecodeTeam``). Which of 1 and n threads is faster depends on the machine's
load, which the program cannot see: idle, two threads decode the 15M shape 1.8x faster; with one
busy loop on the other core, the team waits at every barrier for a worker that the scheduler has
descheduled, and two threads run at 0.5-0.7x of one. So the decode loop times its own tokens and
runs on the team that is faster now. It runs on its settled team, and now and then it probes the
other one; when the other stays at least ``MARGIN`` faster, in the running mean of its timed tokens,
for ``PROBE_TOKENS`` tokens, it settles there. A probe stops at the first token that puts its running
mean behind (a token on a stalled team can cost a hundred tokens' time on one thread under heavy
load), so a losing probe costs one token; and beside a busy loop, where a team's tokens are fast or
stalled at random, a few lucky tokens do not make it win. A probe that loses costs time, so the gap
to the next one doubles each time the settled team wins, and is at least the probe's measured loss
divided by ``PROBE_BUDGET`` (probing costs about half a percent of decode time). The next decode of
the same model (``key``) in the same thread, within ``MEMORY_SECONDS``, starts from the last choice
and resumes its wait for the next probe: the schedule counts decode time, not the clock, so the
budget holds when decodes alternate with other work (a benchmark's rounds, a sweep's cells).
When the settled team becomes ``TRIGGER`` slower than the other team was when last measured (load
arriving), the next probe starts at once. The first token
after a change of team is not timed when tokens are short (a sleeping worker wakes, its cache
refills: tens of microseconds). The choice reaches the kernels through a per-thread cap that
``team_size`` reads, set only between ``token_start`` and ``token_end``.

**Blocks under load.** A block of positions stalls at its barriers as a token does: SmolLM2's pp256
beside one busy loop ran at 216 tok/s on two threads against 357 on one (751 on two when idle). Each
engine keeps a second controller for its blocks (``block_team_start``, ``block_end``), the same policy
on block times, with two differences: it starts on the caller's team and probes one thread only
after ``BLOCK_FIRST_PROBE`` seconds of blocks (a probe costs most of a block on an idle machine, and
short prompts should not pay it), and a block of n < max_block positions is timed as a full one.

**Exactness.** The threshold and the controller only move work between threads, never change it:
every output element is computed by one thread with the same arithmetic (a row's dot product is the
same whoever computes it), so results are bit-identical whatever they choose.

``set_serial_below(0)`` makes every loop parallel, which is how the tests exercise the threaded path
at tiny sizes (the ``parallel_always`` fixture in tests/conftest.py); ``set_decode_policy`` switches
the controller off ("fixed": always the caller's team) or, for tests, makes it alternate the two teams
every token. The environment variable ``PYLLAMA_DECODE_POLICY`` sets the policy at import.
"""

import os

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef enum:
    DEFAULT_SERIAL_BELOW = (1 << 15) + 1
    POLICY_FIXED = 0      # every decode token on the caller's team (the behaviour before the controller)
    POLICY_ADAPTIVE = 1   # the controller above
    POLICY_ALTERNATE = 2  # one thread and n threads in turn, every token: for the tests of exactness
    SETTLED_TOKENS = 2    # timed tokens on the settled team before it can be compared
    PROBE_TOKENS = 8      # timed tokens a probe must win, each keeping its running mean ahead, to be chosen
    MEMORY_SLOTS = 4      # keys remembered per thread

cdef const double MEAN_WEIGHT = 0.125      # weight of a new token in the settled team's running mean
cdef const double MARGIN = 0.03            # the other team must be this much faster per token to be chosen
cdef const double TRIGGER = 0.1            # the settled team this much slower than the other one last was: probe now
cdef const double MIN_GAP = 0.05           # seconds from a change of team to the next probe
cdef const double MAX_GAP = 1.0            # the doubling stops here (the budget rule may ask for more)
cdef const double PROBE_BUDGET = 0.005     # a probe's expected loss, over the gap before it, is at most this
cdef const double UNTIMED_BELOW = 2e-3     # tokens shorter than this: the first one after a change of team is not timed
cdef const double WARM_UP = 1e-4           # what that untimed first token may cost on top (a wake-up, a cache refill)
cdef const double BLOCK_FIRST_PROBE = 1.0  # seconds of blocks on the team before the first probe of one thread
cdef const double MEMORY_SECONDS = 120.0   # a decode starts from the state of the last one of the same key this recent

cdef extern from *:
    """
    /* Per calling thread (thread-locals, so two engines generating in two Python threads each keep
       their own): the decode controller's team cap (0 = none), and the last choice per key. */
    static __thread int pyllama_team_cap = 0;
    typedef struct { const void* key; int n_threads; int settled;
                     double other_mean, gap, probe_in, used; } pyllama_team_memory;
    static __thread pyllama_team_memory pyllama_memory[4];  /* MEMORY_SLOTS */
    """
    int team_cap "pyllama_team_cap"
    ctypedef struct TeamMemory "pyllama_team_memory":
        const void* key
        int n_threads
        int settled
        double other_mean
        double gap
        double probe_in
        double used
    TeamMemory team_memory "pyllama_memory"[4]

_POLICIES = {"fixed": POLICY_FIXED, "adaptive": POLICY_ADAPTIVE, "alternate": POLICY_ALTERNATE}
_POLICY_NAMES = {v: k for k, v in _POLICIES.items()}

cdef long long _serial_below = DEFAULT_SERIAL_BELOW
cdef int _policy = _POLICIES.get(os.environ.get("PYLLAMA_DECODE_POLICY", "adaptive"), POLICY_ADAPTIVE)
cdef DecodeTeam _last  # the last decode that finished in this process, for decode_stats()


cdef int team_size(int n_threads, long long work) noexcept nogil:
    if work < _serial_below or n_threads < 1:
        return 1
    if team_cap > 0 and n_threads > team_cap:
        return team_cap
    return n_threads


def serial_below() -> int:
    """The current threshold: loops with less work than this run on the calling thread."""
    return _serial_below


def set_serial_below(long long work=DEFAULT_SERIAL_BELOW) -> int:
    """Set the threshold (0: every loop parallel; no argument: the default). Returns the previous value."""
    global _serial_below
    if work < 0:
        raise ValueError(f"set_serial_below: work must be >= 0, got {work}")
    previous = _serial_below
    _serial_below = work
    return previous


def decode_policy() -> str:
    """The decode controller's policy: "adaptive" (the default), "fixed" or "alternate"."""
    return _POLICY_NAMES[_policy]


def set_decode_policy(str policy="adaptive") -> str:
    """Set the policy of decodes that start from now on; returns the previous one.

    "adaptive": time tokens and run on the faster of 1 and n threads; "fixed": always the caller's
    thread count; "alternate": 1 and n threads in turn, every token (tests)."""
    global _policy
    if policy not in _POLICIES:
        raise ValueError(f"set_decode_policy: policy must be one of {', '.join(_POLICIES)}, got {policy!r}")
    previous = _POLICY_NAMES[_policy]
    _policy = _POLICIES[policy]
    return previous


def decode_stats() -> dict:
    """What the controller did in the last decode that finished in this process."""
    return {
        "policy": _POLICY_NAMES[_last.mode],
        "threads": _last.n_threads,
        "settled": _last.settled,
        "tokens_1": _last.tokens_1,
        "tokens_n": _last.tokens_n,
        "probes": _last.probes,
        "switches": _last.switches,
    }


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef void decode_start(DecodeTeam* t, int n_threads, const void* key) noexcept nogil:
    _decode_start(t, n_threads, key, _now())


cdef void _decode_start(DecodeTeam* t, int n_threads, const void* key, double now) noexcept nogil:
    """Start a decode for ``n_threads`` (the caller's count). The adaptive policy starts where the last
    decode of ``key`` in this thread settled, if it ended less than MEMORY_SECONDS ago; else on one
    thread, probing the team as soon as SETTLED_TOKENS tokens are timed: a token on one thread costs
    at most (n - 1) / n of a token more than on the team when the machine is idle, while a token on
    a team whose worker is descheduled can cost many tokens' time."""
    cdef TeamMemory* m
    t.key = key
    t.n_threads = n_threads if n_threads > 1 else 1
    t.mode = _policy
    t.settled = 1 if t.mode == POLICY_ADAPTIVE else t.n_threads
    t.probing = False
    t.untimed = False  # the prompt's blocks ran on the team just before: it is warm
    t.probe_n = 0
    t.probe_tokens = 0
    t.since_decision = 0
    t.probe_sum = 0.0
    t.probe_cost = 0.0
    t.settled_mean = 0.0
    t.other_mean = 0.0
    t.started = 0.0
    t.next_probe = 0.0
    t.gap = MIN_GAP
    t.tokens_1 = 0
    t.tokens_n = 0
    t.probes = 0
    t.switches = 0
    m = _remembered(key, t.n_threads)
    if t.mode == POLICY_ADAPTIVE and m != NULL and now - m.used < MEMORY_SECONDS:
        # the probe schedule counts decode time only: the wait for the next probe resumes where it was
        t.settled = m.settled
        t.other_mean = m.other_mean
        t.gap = m.gap
        t.next_probe = now + m.probe_in
    t.team = t.settled


cdef TeamMemory* _remembered(const void* key, int n_threads) noexcept nogil:
    cdef int i
    if key == NULL:
        return NULL
    for i in range(MEMORY_SLOTS):
        if team_memory[i].key == key and team_memory[i].n_threads == n_threads:
            return &team_memory[i]
    return NULL


cdef void token_start(DecodeTeam* t) noexcept nogil:
    global team_cap
    team_cap = t.team if t.team < t.n_threads else 0
    t.started = _now()


cdef void token_end(DecodeTeam* t) noexcept nogil:
    global team_cap
    cdef double now = _now()
    team_cap = 0
    _token_done(t, now - t.started, now)


cdef void _token_done(DecodeTeam* t, double seconds, double now) noexcept nogil:
    # the policy proper, on a token of ``seconds`` that ended at ``now`` (simulate_decode drives it too)
    if t.team == 1:
        t.tokens_1 += 1
    else:
        t.tokens_n += 1
    if t.n_threads < 2 or t.mode == POLICY_FIXED:
        return
    if t.mode == POLICY_ALTERNATE:
        t.team = t.n_threads if t.team == 1 else 1
        t.switches += 1
        return
    if t.probing:
        _probe_step(t, seconds, now)
    elif t.untimed:
        t.untimed = False
    else:
        _settled_step(t, seconds, now)


cdef void _settled_step(DecodeTeam* t, double seconds, double now) noexcept nogil:
    if t.since_decision == 0 and t.settled_mean == 0.0:
        t.settled_mean = seconds
    else:
        t.settled_mean = t.settled_mean + (seconds - t.settled_mean) * MEAN_WEIGHT
    t.since_decision += 1
    if t.since_decision < SETTLED_TOKENS:
        return
    if now >= t.next_probe or (t.other_mean > 0.0 and t.settled_mean > (1.0 + TRIGGER) * t.other_mean):
        t.probing = True
        t.team = 1 if t.settled > 1 else t.n_threads
        t.probe_n = 0
        t.probe_tokens = 0
        t.probe_sum = 0.0
        t.probe_cost = 0.0
        t.untimed = t.settled_mean < UNTIMED_BELOW
        t.probes += 1


cdef void _probe_step(DecodeTeam* t, double seconds, double now) noexcept nogil:
    # the probe stays only while the running mean of its timed tokens is MARGIN ahead of the settled
    # team, and wins after PROBE_TOKENS of them: a losing probe costs one token (a stalled team's
    # token can cost many), and a team whose tokens are fast or stalled at random wins only when
    # PROBE_TOKENS in a row say so, not on two lucky ones
    cdef double ahead = t.settled_mean * (1.0 - MARGIN)
    t.probe_cost += seconds
    t.probe_tokens += 1
    if t.untimed:  # the warm-up token: a wake-up and a cache refill are allowed for
        t.untimed = False
        if seconds - WARM_UP > ahead:
            _probe_end(t, now, False)
        return
    t.probe_sum += seconds
    t.probe_n += 1
    if t.probe_sum >= t.probe_n * ahead:
        _probe_end(t, now, False)
    elif t.probe_n == PROBE_TOKENS:
        _probe_end(t, now, True)


cdef void _probe_end(DecodeTeam* t, double now, bint won) noexcept nogil:
    cdef double loss
    # a probe of the old team will lose at its first token (and its warm-up, for short tokens)
    cdef int per_probe = 1 + (1 if t.settled_mean < UNTIMED_BELOW else 0)
    t.probing = False
    if won:
        # the probed team is faster now: settle there (it is warm, the next token is timed). The next
        # probe, of the old team, will lose about this:
        loss = (t.settled_mean - t.probe_sum / t.probe_n) * per_probe
        t.settled = t.team
        t.other_mean = t.settled_mean
        t.settled_mean = t.probe_sum / t.probe_n
        t.gap = MIN_GAP
        t.switches += 1
    else:
        # the settled team wins: back to it, probing later; this probe lost this much
        loss = t.probe_cost - t.settled_mean * t.probe_tokens
        t.other_mean = t.probe_cost / t.probe_tokens
        t.gap = min(2.0 * t.gap, MAX_GAP)
        t.team = t.settled
        t.untimed = t.settled_mean < UNTIMED_BELOW
    if t.gap < loss / PROBE_BUDGET:
        t.gap = loss / PROBE_BUDGET
    t.since_decision = 0
    t.next_probe = now + t.gap


cdef void decode_finish(DecodeTeam* t) noexcept nogil:
    _decode_finish(t, _now())


cdef void _decode_finish(DecodeTeam* t, double now) noexcept nogil:
    """The decode is over: no cap is left behind; the choice is remembered for the next decode of the
    same key (in the slot of that key, else the least recently used one); decode_stats() reports it."""
    global team_cap, _last
    cdef TeamMemory* m
    cdef int i
    team_cap = 0
    _last = t[0]
    if t.mode != POLICY_ADAPTIVE or t.key == NULL or t.n_threads < 2:
        return
    m = _remembered(t.key, t.n_threads)
    if m == NULL:
        m = &team_memory[0]
        for i in range(1, MEMORY_SLOTS):
            if team_memory[i].used < m.used:
                m = &team_memory[i]
    m.key = t.key
    m.n_threads = t.n_threads
    m.settled = t.settled
    m.other_mean = t.other_mean
    m.gap = t.gap
    m.probe_in = max(t.next_probe - now, 0.0)
    m.used = now


cdef void block_team_start(DecodeTeam* t, int n_threads) noexcept nogil:
    _block_team_start(t, n_threads, _now())


cdef void _block_team_start(DecodeTeam* t, int n_threads, double now) noexcept nogil:
    """A controller for runs of blocks. Unlike a decode it starts on the caller's team: a machine is
    idle more often than not, and there a block runs about n times faster on the team, so a probe of
    one thread costs most of a block; the first probe waits BLOCK_FIRST_PROBE seconds, so a prompt
    shorter than that never probes on an idle machine. Nothing is remembered by key: the team lives
    as long as its engine."""
    _decode_start(t, n_threads, NULL, now)
    if t.mode == POLICY_ADAPTIVE:
        t.settled = t.n_threads
        t.team = t.n_threads
        t.next_probe = now + BLOCK_FIRST_PROBE


cdef void block_end(DecodeTeam* t, Py_ssize_t n, Py_ssize_t full) noexcept nogil:
    global team_cap
    cdef double now = _now()
    team_cap = 0
    # a short block (a sequence's last) is timed as a full one would be: the means compare blocks
    _token_done(t, (now - t.started) * full / n if 0 < n < full else now - t.started, now)


def simulate_blocks(int n_threads, seconds_1, seconds_n, str policy="adaptive") -> dict:
    """``simulate_decode`` for the block controller: block i takes ``seconds_1[i]`` on one thread and
    ``seconds_n[i]`` on the team (full blocks); the same fields."""
    cdef DecodeTeam t
    if len(seconds_1) != len(seconds_n):
        raise ValueError("simulate_blocks: seconds_1 and seconds_n need one time per block each")
    previous = set_decode_policy(policy)
    try:
        _block_team_start(&t, n_threads, 0.0)
    finally:
        set_decode_policy(previous)
    return _run_simulated(&t, seconds_1, seconds_n, 0.0, False)


cdef dict _run_simulated(DecodeTeam* t, seconds_1, seconds_n, double start, bint finish):
    """Drive a started controller from ``start``: unit i takes seconds_1[i] on one thread, seconds_n[i]
    on the team; ``finish``: end it as a decode ends. Its stats and the simulated seconds."""
    cdef double seconds, now = start
    cdef Py_ssize_t i
    for i in range(len(seconds_1)):
        seconds = seconds_1[i] if t.team == 1 else seconds_n[i]
        now += seconds
        _token_done(t, seconds, now)
    if finish:
        _decode_finish(t, now)
    return {"settled": t.settled, "tokens_1": t.tokens_1, "tokens_n": t.tokens_n, "probes": t.probes,
            "switches": t.switches, "seconds": now - start}


def team_for(int n_threads, long long work) -> int:
    """``team_size`` as the calling thread sees it now (the threshold and the decode cap): for tests."""
    return team_size(n_threads, work)


def simulate_decode(int n_threads, seconds_1, seconds_n, str policy="adaptive", size_t key=0,
                    double start=0.0) -> dict:
    """Run the controller on a simulated clock from ``start``: token i takes ``seconds_1[i]`` on one
    thread and ``seconds_n[i]`` on the team. ``key`` (0: none) is remembered as a decode's is.
    Returns ``decode_stats()``'s fields and ``seconds``, the total time, so a test can compare it
    with always-1, always-n and the best per token."""
    cdef DecodeTeam t
    if len(seconds_1) != len(seconds_n):
        raise ValueError("simulate_decode: seconds_1 and seconds_n need one time per token each")
    previous = set_decode_policy(policy)
    try:
        _decode_start(&t, n_threads, <const void*>key, start)
    finally:
        set_decode_policy(previous)
    return _run_simulated(&t, seconds_1, seconds_n, start, True)
