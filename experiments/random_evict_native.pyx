# cython: language_level=3
"""RandomEvictNative: ``random_evict.py`` written in Cython, the template for a fast plugin.

The policy is the Python example's (keep at most ``budget`` positions per layer; once full, a new
position takes the slot of a random cached one), with its own seeded xorshift generator, so the
evictions differ from the numpy version's. Everything else is what a native plugin does:

* subclass ``GatherAttention``: ``init_gather(config, rows)`` gives the model's shapes and the
  per-head row tables, ``own(array)`` keeps a buffer alive and returns its pointer;
* implement ``attend_c`` without the GIL: store this position's key and value, gather the kept
  rows per query head in ascending position order, and call ``attend_gathered`` (the shared exact
  routine), in parallel over heads.

No build step: name the file in a spec and pyllama compiles it on first use (cached afterwards):

    pyllama diff causal experiments/random_evict_native.pyx:RandomEvictNative:budget=64 \\
        -c stories260K.bin -z tok512.bin

With ``budget`` at least the sequence length nothing is evicted and it equals ``causal`` bit for bit.
"""

from cython.parallel cimport prange
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention

from pyllama.attention import UNBOUNDED, Knob


cdef inline uint64_t splitmix64(uint64_t x) noexcept nogil:
    # turns (seed, layer) into a well-mixed nonzero xorshift state
    x = x + <uint64_t>0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EB
    return (x ^ (x >> 31)) | 1


cdef class RandomEvictNative(GatherAttention):
    name = "random_evict_native"
    description = "keep `budget` positions per layer; when full, evict a random one (seeded; Cython)"
    knobs = (
        Knob("budget", int, 64, "positions kept per layer, the current one included", min=1),
        Knob("seed", int, 0, "seed of the evictions (each layer draws from its own stream)", min=0),
    )

    cdef float* keys        # [n_layers, budget, kv_dim]: slot s of each layer
    cdef float* values
    cdef long long* order   # [n_layers, budget]: slots in use, oldest position first
    cdef long long* count   # [n_layers]: slots in use
    cdef uint64_t* state    # [n_layers]: xorshift64 state
    cdef readonly long long budget, seed

    def __init__(self, budget: int = 64, seed: int = 0):
        if budget < 1 or seed < 0:
            raise ValueError(f"random_evict_native: need budget >= 1 and seed >= 0, got {budget}, {seed}")
        self.budget = budget
        self.seed = seed
        self.max_positions = UNBOUNDED  # memory is bounded, so any length works

    def init(self, config, pool):
        cdef long long B = self.budget
        self.init_gather(config, B)  # at most `budget` rows per head per step
        self.keys = <float*>self.own(np.zeros((config.n_layers, B, config.kv_dim), dtype=np.float32))
        self.values = <float*>self.own(np.zeros((config.n_layers, B, config.kv_dim), dtype=np.float32))
        self.order = <long long*>self.own(np.zeros((config.n_layers, B), dtype=np.int64))
        self.count = <long long*>self.own(np.zeros(config.n_layers, dtype=np.int64))
        self.state = <uint64_t*>self.own(np.zeros(config.n_layers, dtype=np.uint64))
        self.reset()

    def reset(self):
        cdef int layer
        for layer in range(self.n_layers):
            self.count[layer] = 0
            self.state[layer] = splitmix64(<uint64_t>self.seed * 1000003 + <uint64_t>layer)

    def memory_bytes(self):
        cdef long long held = 0
        cdef int layer
        for layer in range(self.n_layers):
            held += self.count[layer]
        return int(2 * held * self.kv_dim * 4)

    cdef long long victim(self, int layer) noexcept nogil:
        cdef uint64_t x = self.state[layer]
        x ^= x << 13
        x ^= x >> 7
        x ^= x << 17
        self.state[layer] = x
        return <long long>(x % <uint64_t>self.budget)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        cdef long long B = self.budget
        cdef long long* order = self.order + layer * B
        cdef long long n = self.count[layer]
        cdef long long slot, i, j
        if n < B:
            slot = n
            self.count[layer] = n + 1
        else:
            slot = self.victim(layer)
            j = 0
            for i in range(B):  # drop the victim from the age order
                if order[i] != slot:
                    order[j] = order[i]
                    j = j + 1
            n = B - 1
        order[n] = slot  # the newest position comes last
        cdef Py_ssize_t row = (layer * B + slot) * self.kv_dim
        memcpy(self.keys + row, k, self.kv_dim * sizeof(float))
        memcpy(self.values + row, v, self.kv_dim * sizeof(float))

        cdef long long used = self.count[layer]
        cdef int h
        cdef Py_ssize_t off
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, used * self.n_heads * self.head_dim)):
            off = (h // self.kv_mul) * self.head_dim
            for i in range(used):  # ascending positions
                self.kptr[h * B + i] = self.keys + (layer * B + order[i]) * self.kv_dim + off
                self.vptr[h * B + i] = self.values + (layer * B + order[i]) * self.kv_dim + off
            self.attend_gathered(h, q, NULL, used, out)
        return 0
