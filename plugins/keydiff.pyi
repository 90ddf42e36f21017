from pyllama.attention.event import EventAttention
from pyllama.attention.spec import Knob
from pyllama.config import ModelConfig

EVENT_KNOBS: tuple[Knob, ...]

class KeyDiff(EventAttention):
    def scratch_per_head(self, config: ModelConfig) -> int: ...
