"""Attention plugins: the base class (the contract), the shared exact routine, knobs and the registry.

from pyllama.attention import Attention, Knob, Pool, attend_rows, register
"""

from pyllama.attention.base import UNBOUNDED, Attention
from pyllama.attention.head import attend_one_head, attend_rows
from pyllama.attention.pool import Pool
from pyllama.attention.registry import create_plugin, plugin_infos, register
from pyllama.attention.spec import REQUIRED, Knob

__all__ = [
    "Attention",
    "Knob",
    "Pool",
    "REQUIRED",
    "UNBOUNDED",
    "attend_one_head",
    "attend_rows",
    "create_plugin",
    "plugin_infos",
    "register",
]
