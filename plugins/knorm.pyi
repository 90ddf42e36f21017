from pyllama.attention.event import EventAttention
from pyllama.attention.spec import Knob

EVENT_KNOBS: tuple[Knob, ...]

class KNorm(EventAttention): ...
