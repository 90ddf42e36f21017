"""The thread policy's controller on a simulated clock, for tests: each unit's time on one thread and
on the team is given, and the controller of pyllama.kernels.threads decides as it would (the same
functions, only the clock is simulated)."""

from pyllama.kernels.threads cimport (
    DecodeTeam, _block_class, _block_team_start, _decode_finish, _decode_start, _layer_done, _remember, _resume,
    _token_done,
)
from pyllama.kernels.threads import set_decode_policy


def simulate_blocks(int n_threads, seconds_1, seconds_n, str policy="adaptive", size_t key=0,
                    double start=0.0) -> dict:
    """``simulate_decode`` for a new engine's block controller: layer i takes ``seconds_1[i]`` on one
    thread and ``seconds_n[i]`` on the team (full blocks); ``key`` (0: none) is resumed and
    remembered as an engine's model is. The same fields."""
    cdef DecodeTeam t
    if len(seconds_1) != len(seconds_n):
        raise ValueError("simulate_blocks: seconds_1 and seconds_n need one time per layer each")
    previous = set_decode_policy(policy)  # the start reads the policy (as a new engine does)
    _block_team_start(&t, n_threads, start)
    set_decode_policy(previous)
    if key:
        t.key = <const void*>key
        _resume(&t, start)
    out = _run_simulated(&t, seconds_1, seconds_n, start, False)
    _remember(&t, start + out["seconds"])
    return out


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
    _decode_start(&t, n_threads, <const void*>key, start)
    set_decode_policy(previous)
    return _run_simulated(&t, seconds_1, seconds_n, start, True)


def simulate_sized_blocks(int n_threads, blocks, Py_ssize_t full, size_t key=1, double start=0.0) -> list:
    """One engine's blocks of several sizes: ``blocks`` holds (n, seconds_1, seconds_n) per block, n
    positions of at most ``full`` and each layer's seconds on one thread and on the team (as the
    block's own, not scaled). The team each block's layers ran on, a list per block."""
    cdef DecodeTeam t
    cdef double now = start
    _block_team_start(&t, n_threads, start)
    teams = []
    for n, seconds_1, seconds_n in blocks:
        _block_class(&t, <const void*>key, n, full, now)
        ran = []
        for one, team in zip(seconds_1, seconds_n):
            ran.append(t.team)
            seconds = one if t.team == 1 else team
            now += seconds
            _layer_done(&t, seconds, n, full, now)
        teams.append(ran)
    _remember(&t, now)
    return teams
