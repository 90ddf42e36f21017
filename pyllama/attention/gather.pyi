from typing_extensions import disjoint_base

from pyllama.attention.base import Attention

@disjoint_base
class GatherAttention(Attention):
    def reset(self) -> None: ...
    def owned_bytes(self) -> int: ...
