"""``adakv``: budgets shared across a layer's KV heads by one ranking of any scorer's scores.

Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM
Inference" (2024, arXiv:2407.11550). kvpress: ``AdaKVPress`` (its ``alpha_safeguard``);
KVCache-Factory: ``adakv`` (``AdaKVCluster``).

Rule. A wrapper over a method that compresses at the event, its ``scorer`` (``snapkv``, the
paper's, by default; ``knorm``, ``keydiff``, ``expected``, ``random``), which attends and scores as
it does alone. At a compression the layer keeps the sum over its KV heads of their targets (``ratio``
of each head's rows removed, or ``capacity`` kept per head). Each KV head first keeps its protected
rows and its best rows up to ``floor(alpha x target)``, protected rows counted (as kvpress's window
counts in its safeguard); every other (head, row) competes in one ranking across the layer's KV heads,
the lowest scores evicted (equal scores: the older position first, then the lower head). KV heads end
with different numbers of rows and the ledger counts each. The scorer's own knobs apply: ``window`` and
``sinks`` default to the scorer's (-1), ``kernel``/``pool`` are SnapKV's, ``future``/``epsilon``/
``covariance`` Expected Attention's, ``seed`` random's; a knob the scorer does not take is refused.

State: the scorer's (the row store's rows, SnapKV's observation queries, Expected Attention's
statistics).
"""

import importlib

from pyllama.attention.base cimport Attention
from pyllama.attention.event cimport EventAttention

from pyllama.attention.budget import CAPACITY, EVERY, RATIO
from pyllama.attention.dense import POSITIONS
from pyllama.attention.observed import OBSERVED_KNOBS
from pyllama.attention.spec import Knob, check_knobs
from pyllama.errors import PluginError

# scorer -> (its class, its own knobs besides ratio, capacity, window, sinks, every, positions)
SCORERS = {
    "snapkv": ("pyllama.plugins.snapkv:SnapKV", ("kernel", "pool")),
    "knorm": ("pyllama.plugins.knorm:KNorm", ()),
    "keydiff": ("pyllama.plugins.keydiff:KeyDiff", ()),
    "expected": ("pyllama.plugins.expected:Expected", ("future", "epsilon", "covariance")),
    "random": ("pyllama.plugins.random:RandomEviction", ("seed",)),
}
OWN_KNOBS = ("kernel", "pool", "future", "epsilon", "covariance", "seed")


cdef class AdaKV(Attention):
    name = "adakv"
    description = "AdaKV: any event scorer's scores, budgets shared across a layer's KV heads (rows per head differ)"
    knobs = (
        Knob("scorer", tuple(SCORERS), "snapkv", "the method whose scores rank the rows"),
        Knob("alpha", float, 0.2, "share of each head's target it keeps whatever the others score", min=0.0, max=1.0),
        RATIO,
        CAPACITY,
        Knob("window", int, -1, "most recent positions never evicted (-1: the scorer's default)", min=-1),
        Knob("sinks", int, -1, "first positions never evicted (-1: the scorer's default)", min=-1),
        EVERY,
        *OBSERVED_KNOBS,
        Knob("future", int, 512, "expected: future positions of the mean rotation", min=1),
        Knob("epsilon", float, 0.0, "expected: added to the expected attention", min=0.0),
        Knob("covariance", bool, True, "expected: include the queries' covariance"),
        Knob("seed", int, 0, "random: seed of the draws", min=0, max=2**63 - 1),
        POSITIONS,
    )
    compresses_at_event = True

    cdef readonly EventAttention inner
    cdef readonly str scorer
    cdef readonly double alpha

    def __cinit__(self, *args, **kwargs):
        self.native = True

    def __init__(self, scorer: str = "snapkv", alpha: float = 0.2, ratio: float = 0.5, capacity: int = 0,
                 window: int = -1, sinks: int = -1, every: int = 0, kernel: int = 5, pool: str = "avg",
                 future: int = 512, epsilon: float = 0.0, covariance: bool = True, seed: int = 0,
                 positions: int = 0):
        given = dict(kernel=kernel, pool=pool, future=future, epsilon=epsilon, covariance=covariance, seed=seed)
        check_knobs(self, scorer=scorer, alpha=alpha, ratio=ratio, capacity=capacity, window=window, sinks=sinks,
                    every=every, positions=positions, **given)
        target, own = SCORERS[scorer]
        defaults = {k.name: k.default for k in self.knobs}
        for name in OWN_KNOBS:
            if name not in own and given[name] != defaults[name]:
                raise PluginError(f"adakv: {name}={given[name]} is not a knob of scorer={scorer} (its own: "
                                  f"{', '.join(own) or 'none'})")
        values = dict(ratio=ratio, capacity=capacity, every=every, positions=positions)
        values.update({name: given[name] for name in own})
        if window >= 0:
            values["window"] = window
        if sinks >= 0:
            values["sinks"] = sinks
        module, _, cls = target.partition(":")
        try:
            self.inner = getattr(importlib.import_module(module), cls)(**values)
        except PluginError as exc:  # the scorer's refusal, said of adakv
            raise PluginError(f"adakv:scorer={scorer}: {str(exc).removeprefix(scorer + ': ')}") from None
        self.inner.alpha = alpha
        self.scorer, self.alpha = scorer, alpha
        self.max_positions = self.inner.max_positions

    @property
    def wants_pre_rope_query(self):
        return self.inner.wants_pre_rope_query

    def _configure(self, config, pool, rows=None, pre_rope=None):
        Attention._configure(self, config, pool, rows, pre_rope)
        self.inner._configure(config, pool, rows, pre_rope)
        self.max_positions = self.inner.max_positions

    def planned_bytes(self, config):
        return self.inner.planned_bytes(config)

    def init(self, config, pool):
        self.inner.init(config, pool)

    def reset(self):
        self.inner.reset()

    def snapshot(self):
        return self.inner.snapshot()

    def restore(self, state):
        self.inner.restore(state)

    def memory_bytes(self):
        return self.inner.memory_bytes()

    def compress(self, long long pos):
        self.inner.compress(pos)

    def held_positions(self, int layer):
        return self.inner.held_positions(layer)

    def rows_held_per_head(self, int layer):
        return self.inner.rows_held_per_head(layer)

    def start_from(self, int layer, keys, values, queries=None, queries_pre_rope=None):
        self.inner.start_from(layer, keys, values, queries, queries_pre_rope)

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        return self.inner.attend_c(layer, pos, q, k, v, out)

    cdef int attend_block_c(self, int layer, long long pos, Py_ssize_t n, float* q, float* k, float* v,
                            float* out) except -1 nogil:
        return self.inner.attend_block_c(layer, pos, n, q, k, v, out)
