"""Pool: what a plugin may use besides its own memory, handed to ``Attention.init(config, pool)``.

Part of the attention contract (``base.pyx``): today only the thread count the engine was given,
which a plugin may use for its own parallel loops (results must not depend on it).
"""

from __future__ import annotations


class Pool:
    """What a plugin may use besides its own memory: the thread count."""

    def __init__(self, n_threads: int = 1) -> None:
        self.n_threads = max(1, int(n_threads))

    def __repr__(self) -> str:
        return f"Pool(n_threads={self.n_threads})"
