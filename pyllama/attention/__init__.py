"""Attention plugins: the base class (the contract), the shared exact routine, knobs and the registry.

The built-ins share their bookkeeping through Cython bases here: ``gather`` (row tables, counters,
the gathering loops), ``window`` (sinks + window layout, the StreamingLLM shift), ``dense`` (a cache
of every position), ``quant`` (KIVI quantisation) and ``cluster`` (seeded k-means); the standard
KV-cache methods (docs/methods.md) ``rows`` (rows per KV head), ``step`` (eviction every step),
``event`` (compression at the event) and ``observed`` (SnapKV's score), with ``budget`` (the knobs
they share); ``contract``
checks a plugin class, ``files`` loads one from a local file, ``registry`` finds them by name.

from pyllama.attention import Attention, Knob, Pool, attend_rows, register
"""

from pyllama.attention.base import UNBOUNDED, Attention
from pyllama.attention.head import attend_one_head, attend_rows
from pyllama.attention.pool import Pool
from pyllama.attention.registry import create_plugin, plugin_infos, register, resolve_spec
from pyllama.attention.spec import REQUIRED, Knob, PluginSpec

__all__ = [
    "Attention",
    "Knob",
    "PluginSpec",
    "Pool",
    "REQUIRED",
    "UNBOUNDED",
    "attend_one_head",
    "attend_rows",
    "create_plugin",
    "plugin_infos",
    "register",
    "resolve_spec",
]
