"""RandomEvict: a KV cache in plain Python and numpy that keeps at most ``budget`` positions per layer
and, once full, evicts one cached position chosen at random (seeded).

It is the worked example of "Write your own attention" (docs/write_your_own.md): a baseline any
smarter eviction policy should beat. Run it without installing anything:

    pyllama generate -c stories260K.bin -z tok512.bin --attention experiments/random_evict.py:RandomEvict:budget=64
    pyllama diff causal experiments/random_evict.py:RandomEvict:budget=64 -c stories260K.bin -z tok512.bin

With a budget at least as long as the sequence nothing is evicted and it reproduces ``causal`` bit
for bit, because the arithmetic is the shared routine (``attend_rows``); only the choice of rows is
Python.
"""

from __future__ import annotations

import numpy as np

from pyllama.attention import UNBOUNDED, Attention, Knob, attend_rows


class RandomEvict(Attention):
    name = "random_evict"
    description = "keep `budget` positions per layer; when full, evict a random one (seeded)"
    knobs = (
        Knob("budget", int, 64, "positions kept per layer, the current one included", min=1),
        Knob("seed", int, 0, "seed of the evictions (each layer draws from its own stream)", min=0),
    )

    def __init__(self, budget: int = 64, seed: int = 0) -> None:
        self.budget = budget
        self.seed = seed
        self.max_positions = UNBOUNDED  # memory is bounded, so any length works

    def init(self, config, pool) -> None:
        # all state, allocated once: `budget` slots per layer
        n_layers, kv_dim = config.n_layers, config.kv_dim
        self.keys = np.zeros((n_layers, self.budget, kv_dim), dtype=np.float32)  # [layer, slot, kv_dim]
        self.values = np.zeros((n_layers, self.budget, kv_dim), dtype=np.float32)
        self.slot_pos = np.zeros((n_layers, self.budget), dtype=np.int64)  # position cached in each slot
        self.count = np.zeros(n_layers, dtype=np.int64)  # slots in use
        self.reset()

    def reset(self) -> None:
        self.count[:] = 0
        # a fresh stream per layer, so a sequence replays exactly after reset()
        self.rng = [np.random.default_rng([self.seed, layer]) for layer in range(len(self.count))]

    def memory_bytes(self) -> int:
        return int(2 * self.count.sum() * self.keys.shape[2] * 4)

    def attend(self, layer, pos, q, k, v, out) -> None:
        n = int(self.count[layer])
        if n < self.budget:
            slot = n
            self.count[layer] = n + 1
        else:
            slot = int(self.rng[layer].integers(self.budget))  # the victim
        self.keys[layer, slot] = k
        self.values[layer, slot] = v
        self.slot_pos[layer, slot] = pos
        used = int(self.count[layer])
        order = np.argsort(self.slot_pos[layer, :used], kind="stable")  # ascending positions
        attend_rows(self.config, q, self.keys[layer], self.values[layer], out, rows=order)
