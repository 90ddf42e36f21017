"""How many threads a parallel loop gets: the one place for the serial-below-a-threshold rule.

Waking an OpenMP team costs a few microseconds, more than a small product or an attention step over
a few cached rows takes on one thread, and on a loaded machine a team that spins while the other
core is busy costs far more. So every kernel and plugin asks ``team_size(n_threads, work)``: one
thread below ``serial_below()`` units of work, else the caller's thread count.

``work`` is counted in float32 multiply-adds, each caller scaling its own loop to that unit: a
float32 matrix of rows x cols is rows * cols, an F16 one half that (its rows stream twice as fast),
an int8 one a quarter, an attention step n_rows * n_heads * head_dim. The threshold only moves the
work between threads, never changes it: every output element is computed by one thread with the
same arithmetic, so results are bit-identical whatever it is set to.

``set_serial_below(0)`` makes every loop parallel, which is how the tests exercise the threaded path
at tiny sizes (the ``parallel_always`` fixture in tests/conftest.py).
"""

DEF DEFAULT_SERIAL_BELOW = 1 << 15  # the float32 matvec threshold the kernels have used from the start

cdef long long _serial_below = DEFAULT_SERIAL_BELOW


cdef int team_size(int n_threads, long long work) noexcept nogil:
    return 1 if work < _serial_below or n_threads < 1 else n_threads


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
