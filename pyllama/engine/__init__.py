"""The engine, in llama2.c run.c's shape: a model's weights bound to one attention plugin.

``core``: ``Engine``, the Python-facing object that owns the structures and the buffers.
``Pool`` belongs to the attention contract (``pyllama.attention.pool``) and is re-exported here,
where it has always been imported from.
"""

from pyllama.attention.pool import Pool
from pyllama.engine.core import Engine

__all__ = ["Engine", "Pool"]
