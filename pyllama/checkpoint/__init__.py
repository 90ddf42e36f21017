"""Checkpoint loaders: a model file in, ``(ModelConfig, Weights)`` out, memory-mapped."""

from __future__ import annotations

import os
from pathlib import Path

from pyllama.checkpoint.weights import LayerWeights, QType, Tensor, Weights
from pyllama.config import ModelConfig
from pyllama.errors import CheckpointError
from pyllama.hub import resolve

__all__ = ["load_checkpoint", "LayerWeights", "QType", "Tensor", "Weights"]


def load_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, Weights]:
    """Load a llama2.c ``.bin`` (version 0/1/2) or a GGUF file, chosen by the file's first bytes.

    ``path`` may also be the name of a downloaded known model (``stories15M``; see ``pyllama.hub``).
    """
    path = Path(resolve(path))
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a model file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        from pyllama.checkpoint.gguf import load_gguf

        return load_gguf(path)
    from pyllama.checkpoint.llama2c import load_llama2c

    return load_llama2c(path)
