"""pyllama: a fast, exact Llama inference engine for experimenting with attention.

from pyllama import Model
m = Model.load("stories260K.bin", tokenizer="tok512.bin")
m.generate("Once upon a time", steps=256, temperature=0.0)
"""

from pyllama.attention.base import Attention
from pyllama.config import ModelConfig
from pyllama.errors import CheckpointError, InputError, PluginError, PositionError, PyllamaError, TokenizerError
from pyllama.model import Generation, Model
from pyllama.version import __version__

__all__ = [
    "Attention",
    "CheckpointError",
    "Generation",
    "InputError",
    "Model",
    "ModelConfig",
    "PluginError",
    "PositionError",
    "PyllamaError",
    "TokenizerError",
    "__version__",
]
