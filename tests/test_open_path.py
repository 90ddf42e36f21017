"""One open path: a model file is opened once, sniffed once and parsed once, and its tokenizer is
built from the records of that parse without opening anything (pyllama/load.py, docs/architecture.md).

Counted with monkeypatching: every ``open()`` of the file (the sniff's; numpy's memmap opens
through it too, unless it is handed the open file), every memory map of it, every sniff and every
parse. Then ``pyllama generate`` runs from the command line, so the whole way in is covered.
"""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

import pyllama.checkpoint as checkpoint
import pyllama.checkpoint.gguf as gguf_loader
import pyllama.checkpoint.llama2c as llama2c_loader
from pyllama.cli import main


class FileAccess:
    """Counts what happens to one file: opens, memory maps, sniffs and parses."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
        self.target = os.path.realpath(path)
        self.opens = self.maps = self.sniffs = self.parses = 0
        real_open, real_memmap = builtins.open, np.memmap
        access = self

        def counting_open(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == access.target:
                access.opens += 1
            return real_open(file, *args, **kwargs)

        class CountingMemmap(real_memmap):
            def __new__(cls, filename, *args, **kwargs):
                name = getattr(filename, "name", filename)
                if isinstance(name, (str, os.PathLike)) and os.path.realpath(name) == access.target:
                    access.maps += 1
                return super().__new__(cls, filename, *args, **kwargs)

        real_sniff, real_parse = checkpoint.sniff_checkpoint, checkpoint.parse_checkpoint

        def sniff(file):
            access.sniffs += 1
            return real_sniff(file)

        def parse(*args, **kwargs):
            access.parses += 1
            return real_parse(*args, **kwargs)

        monkeypatch.setattr(builtins, "open", counting_open)
        monkeypatch.setattr(np, "memmap", CountingMemmap)
        monkeypatch.setattr(checkpoint, "sniff_checkpoint", sniff)
        monkeypatch.setattr(checkpoint, "parse_checkpoint", parse)

    def once(self) -> tuple[int, int, int, int]:
        return self.opens, self.maps, self.sniffs, self.parses


def test_generate_opens_sniffs_and_parses_a_gguf_once(monkeypatch):
    path = shared_file("stories260K-f32.gguf")
    access = FileAccess(monkeypatch, path)
    result = CliRunner().invoke(main, ["generate", "-c", str(path), "-i", "Once upon a time", "-t", "0", "-n", "12"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Once upon a time, there was a little girl")
    assert access.once() == (1, 1, 1, 1)  # the vocabulary came from the same parse: nothing else read the file


def test_model_load_of_a_llama2c_checkpoint_opens_it_once(monkeypatch, stories260k, tok512):
    from pyllama.model import Model

    access = FileAccess(monkeypatch, stories260k)
    tokenizer = FileAccess(monkeypatch, tok512)  # a second counter, for the tokenizer file
    model = Model.load(stories260k, tokenizer=tok512)
    assert (access.opens, access.maps) == (1, 1)
    assert tokenizer.opens == 1 and tokenizer.maps == 0  # read whole, once
    assert model.tokenize("Once upon a time") == [1, 403, 407, 261, 378]


def test_the_gguf_tokenizer_is_built_from_records_without_opening_a_file(monkeypatch):
    from pyllama.checkpoint import read_checkpoint
    from pyllama.tokenizer import tokenizer_from_records

    path = shared_file("stories260K-f32.gguf")
    parsed = read_checkpoint(path)

    def refuse(*args, **kwargs):
        raise AssertionError(f"a file was opened while building the tokenizer: {args[:1]}")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(np, "memmap", refuse)
    monkeypatch.setattr(os, "open", refuse)
    tok = tokenizer_from_records(parsed.records, str(path), parsed.config.vocab_size)
    assert tok.encode("Once upon a time") == [1, 403, 407, 261, 378]


def test_loaders_and_tokenizer_do_no_hub_lookups():
    """Only pyllama.load resolves downloaded names; the parsers and the tokenizer take paths."""
    import pyllama.tokenizer as tokenizer_package
    import pyllama.tokenizer.files as tokenizer_files

    for module in (checkpoint, gguf_loader, llama2c_loader, tokenizer_package, tokenizer_files):
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert "pyllama.hub" not in source and "hub." not in source, module.__name__


def test_model_and_the_diff_harness_do_not_import_each_other():
    repo = Path(__file__).resolve().parents[1] / "pyllama"
    assert "pyllama.model" not in (repo / "diff" / "harness.py").read_text(encoding="utf-8")
    assert "pyllama.diff.harness" not in (repo / "model.py").read_text(encoding="utf-8")
