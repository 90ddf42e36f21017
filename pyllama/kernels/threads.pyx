"""How many threads a parallel loop gets: the one place for the thread policy.

**The policy in a paragraph.** Small work stays on the calling thread; other work runs on the faster of
two teams, one thread or the caller's n, and the program finds which by timing its own units of work: a
decode token, or one layer of a block of positions. It runs on its settled team and now and then probes
the other; a probe stops at the first unit that puts it behind (a stalled unit can cost a hundred) and
wins after ``PROBE_TOKENS`` units ahead by a margin (3% for tokens, 20% for layers); each lost probe
doubles the gap to the next, which is at least the probe's loss over ``PROBE_BUDGET``. What a model
settled on is remembered per calling thread, so the next call of the same model (a new engine for each
``Model.logits``, a benchmark's rounds, a sweep's cells) starts there instead of on a guess. Exactness
never depends on it: every output element is computed by one thread with the same arithmetic, whoever
computes it, so results are bit-identical whatever the team.

**Why small work stays serial.** Waking an OpenMP team costs a few microseconds, more than a small
product or an attention step over a few cached rows takes on one thread. So every kernel and plugin
asks ``team_size(n_threads, work)``: one thread below ``serial_below()`` float32 multiply-adds (an F16
row counts half, an int8 one a quarter), else the caller's count or the controller's cap. 2^15 + 1
keeps stories260K's 512 x 64 classifier serial (a team per token made its decode 26% slower), while
the stories15M shape's 288 x 288 products gain from two; at 2^16 its decode lost 5%.

**Details** (why a choice of teams and not a better split: docs/speed.md "Threads"). The first unit
after a change of team is not timed when units are short (a sleeping worker wakes, its cache refills).
Blocks of three size classes (``block_begin``) keep states of their own, a block timed as the largest
of its class. A decode starts on one thread when nothing is remembered (a token on one thread costs at
most (n - 1) / n of a token more on an idle machine, a stalled team's token many); blocks start on the
team and probe once two layers are timed (idle, the probe costs about one layer, once per process).
When the settled team becomes ``TRIGGER`` slower than the other was when last measured (load
arriving), the next probe starts at once. The probe schedule counts time spent in units, not the
clock, so its budget holds when calls alternate with other work; what is remembered expires after
``MEMORY_SECONDS``. A block of less than ``SMALL_BLOCK_LOOPS`` times the serial threshold (2^22
multiply-adds; stories260K's 5 positions are 1.3M) runs on one thread: waking a worker asleep since
the last call costs more than its few loops save (0.45 ms against 0.52). The choice reaches the
kernels through a per-thread cap that ``team_size`` reads, set only while a unit runs.

``set_serial_below(0)`` makes every loop parallel (the tests' ``parallel_always`` fixture);
``set_decode_policy`` (or ``PYLLAMA_DECODE_POLICY`` at import) switches the controller off ("fixed":
the caller's team) or, for tests, makes it alternate the two teams every unit.
"""

import os

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef enum:
    DEFAULT_SERIAL_BELOW = (1 << 15) + 1
    SMALL_BLOCK_LOOPS = 128  # a block of less work than this many serial loops runs on one thread (Details)
    POLICY_FIXED = 0      # every unit on the caller's team
    POLICY_ADAPTIVE = 1   # the controller above
    POLICY_ALTERNATE = 2  # one thread and n threads in turn, every token: for the tests of exactness
    SETTLED_TOKENS = 2    # timed tokens on the settled team before it can be compared
    PROBE_TOKENS = 8      # timed tokens a probe must win, each keeping its running mean ahead, to be chosen
    MEMORY_SLOTS = 16     # (key, unit) pairs remembered per thread
    UNIT_TOKEN = 0        # what a controller times: decode tokens
    UNIT_LAYER = 1        # or layers of blocks of more than max_block / 4 positions; + 1, + 2: of smaller
    SIZE_CLASSES = 3      # blocks (see block_begin)

cdef const double MEAN_WEIGHT = 0.125      # weight of a new token in the settled team's running mean
cdef const double MARGIN = 0.03            # the other team must be this much faster per token to be chosen
cdef const double LAYER_MARGIN = 0.2       # per layer of a block (see _probe_step)
cdef const double TRIGGER = 0.1            # the settled team this much slower than the other one last was: probe now
cdef const double MIN_GAP = 0.05           # seconds from a change of team to the next probe
cdef const double MIN_LAYER_GAP = 0.005    # the same for layers: a short call's blocks are a few ms
cdef const double MAX_GAP = 1.0            # the doubling stops here (the budget rule may ask for more)
cdef const double MAX_BUDGET_GAP = 5.0     # ... up to this: when load leaves, the team is found again soon
# a team wins a probe only after this long ahead: beside a busy core its worker runs in slices of a few ms
cdef const double TEAM_PROBE_SECONDS = 0.05
cdef const double PROBE_BUDGET = 0.005     # a probe's expected loss, over the gap before it, is at most this
cdef const double UNTIMED_BELOW = 2e-3     # tokens shorter than this: the first one after a change of team is not timed
cdef const double WARM_UP = 1e-4           # what that untimed first token may cost on top (a wake-up, a cache refill)
cdef const double MEMORY_SECONDS = 120.0   # a decode starts from the state of the last one of the same key this recent

cdef extern from *:
    """
    /* Per calling thread (thread-locals, so two engines generating in two Python threads each keep
       their own): the decode controller's team cap (0 = none), and the last choice per key. */
    static __thread int pyllama_team_cap = 0;
    typedef struct { const void* key; int unit; int n_threads; int settled;
                     double settled_mean, other_mean, gap, probe_in, used;
                     int probing, untimed, probe_n, probe_tokens; double probe_sum, probe_cost; } pyllama_team_memory;
    static __thread pyllama_team_memory pyllama_memory[16];  /* MEMORY_SLOTS */
    """
    int team_cap "pyllama_team_cap"
    ctypedef struct TeamMemory "pyllama_team_memory":
        const void* key
        int unit, n_threads, settled
        double settled_mean, other_mean, gap, probe_in, used
        int probing, untimed, probe_n, probe_tokens  # a probe of layers in progress (see _resume)
        double probe_sum, probe_cost
    TeamMemory team_memory "pyllama_memory"[16]

_POLICIES = {"fixed": POLICY_FIXED, "adaptive": POLICY_ADAPTIVE, "alternate": POLICY_ALTERNATE}
_POLICY_NAMES = {v: k for k, v in _POLICIES.items()}

cdef long long _serial_below = DEFAULT_SERIAL_BELOW
cdef int _policy = _POLICIES.get(os.environ.get("PYLLAMA_DECODE_POLICY", "adaptive"), POLICY_ADAPTIVE)
cdef DecodeTeam _last  # the last decode that finished in this process, for decode_stats()
cdef DecodeTeam _last_blocks  # the block controller after the last block in this process, for block_stats()


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
    previous, _serial_below = _serial_below, work
    return previous


def decode_policy() -> str:
    """The decode controller's policy: "adaptive" (the default), "fixed" or "alternate"."""
    return _POLICY_NAMES[_policy]


def set_decode_policy(str policy="adaptive") -> str:
    """Set the policy of controllers started from now on ("adaptive", "fixed" or "alternate", see
    above); returns the previous one."""
    global _policy
    if policy not in _POLICIES:
        raise ValueError(f"set_decode_policy: policy must be one of {', '.join(_POLICIES)}, got {policy!r}")
    previous, _policy = _POLICY_NAMES[_policy], _POLICIES[policy]
    return previous


def forget_teams() -> None:
    """Forget what this thread remembers of every model: for tests (a model at an earlier's address)."""
    for i in range(MEMORY_SLOTS):
        team_memory[i].key = NULL


def decode_stats() -> dict:
    """What the controller did in the last decode that finished in this process."""
    return _stats(&_last)


def block_stats() -> dict:
    """What the block controller of the engine that ran the last block did over its life: decode_stats'
    fields, its units being layers."""
    return _stats(&_last_blocks)


cdef dict _stats(const DecodeTeam* t):
    return {"policy": _POLICY_NAMES[t.mode], "threads": t.n_threads, "settled": t.settled, "tokens_1": t.tokens_1,
            "tokens_n": t.tokens_n, "probes": t.probes, "switches": t.switches}


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef void decode_start(DecodeTeam* t, int n_threads, const void* key) noexcept nogil:
    _decode_start(t, n_threads, key, _now())


cdef void _decode_start(DecodeTeam* t, int n_threads, const void* key, double now) noexcept nogil:
    """Start a decode for ``n_threads`` (the caller's count): where the last decode of ``key`` in this
    thread settled, if recent (``_resume``), else on one thread (see "Details" above)."""
    t.key = key
    t.n_threads = n_threads if n_threads > 1 else 1
    t.mode = _policy
    t.settled = 1 if t.mode == POLICY_ADAPTIVE else t.n_threads
    t.probing = t.untimed = False  # (untimed: the prompt's blocks ran on the team just before: it is warm)
    t.probe_n = t.probe_tokens = t.since_decision = 0
    t.probe_sum = t.probe_cost = t.settled_mean = t.other_mean = t.started = t.next_probe = 0.0
    t.gap, t.unit = MIN_GAP, UNIT_TOKEN
    t.tokens_1 = t.tokens_n = t.probes = t.switches = 0
    _resume(t, now)


cdef void _resume(DecodeTeam* t, double now) noexcept nogil:
    """Start from what this thread remembers of t's key and unit, if it is recent enough: its settled
    team, and the wait for the next probe resumes where it was (the schedule counts time in units)."""
    cdef TeamMemory* m = _remembered(t)
    if t.mode == POLICY_ADAPTIVE and m != NULL and now - m.used < MEMORY_SECONDS:
        t.settled, t.settled_mean = m.settled, m.settled_mean  # the load seen by the last call goes on counting
        t.other_mean, t.gap, t.next_probe = m.other_mean, m.gap, now + m.probe_in
        if t.unit != UNIT_TOKEN and m.probing and m.settled > 1:
            # a probe of one thread goes on: a short call (stories260K's 64 positions: 5 layers) holds
            # fewer layers than a probe needs. Not one of the team: beside a busy core a woken worker runs
            # fast for a while, and a probe made of every call's first layers won (42M's 64: 1.9x)
            t.probing, t.untimed = True, m.untimed
            t.probe_n, t.probe_tokens = m.probe_n, m.probe_tokens
            t.probe_sum, t.probe_cost = m.probe_sum, m.probe_cost
            t.team = 1
            return
    t.team = t.settled


cdef TeamMemory* _remembered(const DecodeTeam* t) noexcept nogil:
    cdef int i
    if t.key == NULL:
        return NULL
    for i in range(MEMORY_SLOTS):
        m = &team_memory[i]
        if m.key == t.key and m.unit == t.unit and m.n_threads == t.n_threads:
            return m
    return NULL


cdef void _remember(const DecodeTeam* t, double now) noexcept nogil:
    """Keep t's choice for the next controller of its key and unit in this thread (in its slot, else
    the least recently used one)."""
    cdef TeamMemory* m
    cdef int i
    if t.mode != POLICY_ADAPTIVE or t.key == NULL or t.n_threads < 2:
        return
    m = _remembered(t)
    if m == NULL:
        m = &team_memory[0]
        for i in range(1, MEMORY_SLOTS):
            if team_memory[i].used < m.used:
                m = &team_memory[i]
    m.key, m.unit, m.n_threads, m.settled = t.key, t.unit, t.n_threads, t.settled
    m.settled_mean, m.other_mean, m.gap = t.settled_mean, t.other_mean, t.gap
    m.probe_in, m.used = max(t.next_probe - now, 0.0), now
    m.probing, m.untimed, m.probe_n, m.probe_tokens = t.probing, t.untimed, t.probe_n, t.probe_tokens
    m.probe_sum, m.probe_cost = t.probe_sum, t.probe_cost


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
        t.probe_n = t.probe_tokens = 0
        t.probe_sum = t.probe_cost = 0.0
        t.untimed = _warms_up(t)
        t.probes += 1


cdef inline bint _warms_up(const DecodeTeam* t) noexcept nogil:
    # the first unit on a team after a change is not timed (a sleeping worker wakes, its cache refills):
    # for short tokens, and for layers always (a short block's layer is scaled up; a block has many)
    return t.unit != UNIT_TOKEN or t.settled_mean < UNTIMED_BELOW


cdef void _probe_step(DecodeTeam* t, double seconds, double now) noexcept nogil:
    # the probe stays while its running mean is MARGIN ahead and wins after PROBE_TOKENS such units: a
    # losing probe costs one unit (a stalled team's can cost many), and units fast or stalled at random
    # win only when PROBE_TOKENS in a row say so. Layers take 20%: where blocks are parallel at all the
    # teams differ by 1.5x or more, while a burst of other work could let 3% move a short call
    cdef double ahead = t.settled_mean * (1.0 - (MARGIN if t.unit == UNIT_TOKEN else LAYER_MARGIN))
    t.probe_cost += seconds
    t.probe_tokens += 1
    if t.untimed:  # the warm-up token: a wake-up and a cache refill are allowed for
        t.untimed = False
        if t.unit == UNIT_TOKEN and seconds - WARM_UP > ahead:
            _probe_end(t, now, False)
        return
    t.probe_sum += seconds
    t.probe_n += 1
    if t.probe_sum >= t.probe_n * ahead:
        _probe_end(t, now, False)
    elif t.probe_n >= PROBE_TOKENS and (t.team == 1 or t.probe_sum >= TEAM_PROBE_SECONDS):
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
        t.gap = MIN_GAP if t.unit == UNIT_TOKEN else MIN_LAYER_GAP
        t.switches += 1
    else:
        # the settled team wins: back to it, probing later; this probe lost this much
        loss = t.probe_cost - t.settled_mean * t.probe_tokens
        t.other_mean = t.probe_cost / t.probe_tokens
        t.gap = min(2.0 * t.gap, MAX_GAP)
        t.team = t.settled
        t.untimed = _warms_up(t)
    if t.gap < loss / PROBE_BUDGET:
        t.gap = min(loss / PROBE_BUDGET, MAX_BUDGET_GAP)
    t.since_decision = 0
    t.next_probe = now + t.gap


cdef void decode_finish(DecodeTeam* t) noexcept nogil:
    _decode_finish(t, _now())


cdef void _decode_finish(DecodeTeam* t, double now) noexcept nogil:
    """The decode is over: no cap is left behind; the choice is remembered for the next decode of the
    same key; decode_stats() reports it."""
    global team_cap, _last
    team_cap = 0
    _last = t[0]
    _remember(t, now)


cdef void block_team_start(DecodeTeam* t, int n_threads) noexcept nogil:
    _block_team_start(t, n_threads, _now())


cdef void _block_team_start(DecodeTeam* t, int n_threads, double now) noexcept nogil:
    """A controller of the layers of blocks, for one engine. Unlike a decode it starts on the caller's
    team: a machine is idle more often than not, and there a layer runs about n times faster on the
    team. Its key is set by the first block_begin (in the thread that runs the blocks)."""
    _decode_start(t, n_threads, NULL, now)
    _layers_start(t, UNIT_LAYER)


cdef void _layers_start(DecodeTeam* t, int unit) noexcept nogil:
    t.unit, t.gap, t.since_decision = unit, MIN_LAYER_GAP, 0
    t.probing = t.untimed = False
    t.settled_mean = t.other_mean = t.next_probe = 0.0
    t.settled = t.team = t.n_threads if t.mode == POLICY_ADAPTIVE else t.settled


cdef bint block_begin(DecodeTeam* t, const void* key, long long work, Py_ssize_t n, Py_ssize_t full) noexcept nogil:
    """Before a block of n positions (of at most ``full``) and ``work`` multiply-adds: its team, and
    whether its layers are timed units."""
    global team_cap
    if work < SMALL_BLOCK_LOOPS * _serial_below and t.n_threads > 1:
        team_cap = 1  # it would end before a worker asleep since the last call woke
        return False
    _block_class(t, key, n, full, _now())
    if t.team > 1:  # its first layer wakes a worker that may have slept since the last block
        t.untimed = True
    team_cap = t.team if t.team < t.n_threads else 0
    return True


cdef void _block_class(DecodeTeam* t, const void* key, Py_ssize_t n, Py_ssize_t full, double now) noexcept nogil:
    # Blocks of more than full / 4, more than full / 16 and fewer positions are three units with states
    # of their own: a layer's time is not proportional to its positions (a 5-position layer timed as a
    # 128-position one counted its fixed costs 25 times over, and a probe of one thread there won)
    cdef int unit = UNIT_LAYER
    while unit < UNIT_LAYER + SIZE_CLASSES - 1 and 4 * n <= full >> 2 * (unit - UNIT_LAYER):
        unit += 1
    if t.key != key or t.unit != unit:  # from what this thread remembers of the model at this size
        if t.key == key:
            _remember(t, now)  # the other size's state, for when it comes back
        t.key = key
        _layers_start(t, unit)
        _resume(t, now)


cdef void block_end(DecodeTeam* t, Py_ssize_t n, Py_ssize_t full) noexcept nogil:
    global team_cap
    cdef double now = _now()
    _layer_done(t, now - t.started, n, full, now)
    team_cap = t.team if t.team < t.n_threads else 0  # what runs until the next layer: the next's team


cdef void _layer_done(DecodeTeam* t, double seconds, Py_ssize_t n, Py_ssize_t full, double now) noexcept nogil:
    full = full >> 2 * (t.unit - UNIT_LAYER)  # a layer of a smaller block is timed as its class's largest
    _token_done(t, seconds * full / n if 0 < n < full else seconds, now)


cdef void block_finish(DecodeTeam* t) noexcept nogil:
    global team_cap, _last_blocks
    team_cap = 0
    _last_blocks = t[0]
    _remember(t, _now())


def team_for(int n_threads, long long work) -> int:
    """``team_size`` as the calling thread sees it now (the threshold and the decode cap): for tests."""
    return team_size(n_threads, work)
