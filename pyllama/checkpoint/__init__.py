"""Checkpoint parsers: a model file in, ``(ModelConfig, Weights)`` out, memory-mapped.

``read_checkpoint`` opens a file once: its first bytes say which parser it needs (the sniff), and
that parser maps the same open file and parses it once, keeping what it parsed (a GGUF's key/value
records, which hold its vocabulary). Paths only: resolving downloaded names is ``pyllama.load``'s job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pyllama.checkpoint.gguf import parse_gguf
from pyllama.checkpoint.llama2c import load_llama2c
from pyllama.checkpoint.weights import LayerWeights, QType, Tensor, Weights
from pyllama.config import ModelConfig
from pyllama.errors import CheckpointError

__all__ = [
    "GGUF",
    "LLAMA2C",
    "LayerWeights",
    "ParsedCheckpoint",
    "QType",
    "Tensor",
    "Weights",
    "load_checkpoint",
    "parse_checkpoint",
    "read_checkpoint",
    "sniff_checkpoint",
]

GGUF = "gguf"
LLAMA2C = "llama2c"  # no magic number of its own (version 0 starts with its header)


@dataclass
class ParsedCheckpoint:
    """One parse of a model file: its config, its weight views and, for a GGUF, its key/value records."""

    config: ModelConfig
    weights: Weights
    records: Mapping | None = None  # GGUF metadata (key -> MetaValue), the vocabulary included; None for llama2.c


def read_checkpoint(path: str | os.PathLike) -> ParsedCheckpoint:
    """Open ``path`` once, sniff it (its first four bytes: GGUF, else llama2.c) and parse it once."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a model file")
    with open(path, "rb") as file:
        kind = sniff_checkpoint(file)
        if kind != GGUF and path.suffix.lower() == ".gguf":
            file.seek(0)
            head = file.read(4)
            what = "an empty file" if not head else f"its first bytes are {head!r}, not b'GGUF'"
            raise CheckpointError(f"{path}: named .gguf but not a GGUF file ({what}): a truncated or foreign download?")
        return parse_checkpoint(path, kind, file)


def sniff_checkpoint(file: BinaryIO) -> str:
    """``GGUF`` or ``LLAMA2C``, from an open file's first four bytes."""
    file.seek(0)
    return GGUF if file.read(4) == b"GGUF" else LLAMA2C


def parse_checkpoint(path: Path, kind: str, file: BinaryIO | None = None) -> ParsedCheckpoint:
    """Parse ``path`` as ``kind`` (``sniff_checkpoint``'s answer): header, metadata and tensors, once.
    ``file``: ``path`` already open, which the parser maps instead of opening the file again."""
    if kind == GGUF:
        return ParsedCheckpoint(*parse_gguf(path, file))
    return ParsedCheckpoint(*load_llama2c(path, file))


def load_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, Weights]:
    """Load a llama2.c ``.bin`` (version 0/1/2) or a GGUF file, chosen by the file's first bytes."""
    parsed = read_checkpoint(path)
    return parsed.config, parsed.weights
