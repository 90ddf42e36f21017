"""``pyllama convert`` never loses data: it refuses to write over its input (however the output is
named), replaces an existing file only with ``--force``, and writes through a temporary file in the
output's folder that is renamed into place, so a failed conversion leaves no file behind."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.convert import convert_llama2c
from pyllama.errors import InputError


@pytest.fixture
def source(tmp_path):
    """A copy of stories260K.bin (we check that it survives) and its tokenizer beside it."""
    src = tmp_path / "model.bin"
    src.write_bytes(shared_file("stories260K.bin").read_bytes())
    (tmp_path / "tokenizer.bin").write_bytes(shared_file("tok512.bin").read_bytes())
    return src


def _one_line_failure(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _same_bytes(path, reference) -> bool:
    return path.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("how", ["same path", "symlink", "hardlink", "other spelling"])
def test_refuses_to_write_over_its_input(source, how):
    original = shared_file("stories260K.bin")
    if how == "same path":
        dst = source
    elif how == "symlink":
        dst = source.with_name("alias.gguf")
        dst.symlink_to(source)
    elif how == "hardlink":
        dst = source.with_name("hard.gguf")
        os.link(source, dst)
    else:
        dst = source.parent / "." / source.name
    for force in ([], ["--force"]):  # --force replaces other files, never the input
        line = _one_line_failure(["convert", str(source), str(dst), *force])
        assert "is the input" in line, line
        assert _same_bytes(source, original)
    with pytest.raises(InputError, match="is the input"):
        convert_llama2c(source, dst, force=True)
    assert _same_bytes(source, original)


@pytest.mark.parametrize("named", [True, False])
def test_refuses_to_write_over_its_tokenizer(source, named):
    # the tokenizer is an input too: -z t.bin with output t.bin (or the tokenizer.bin found beside
    # the checkpoint) would replace it with the GGUF, --force or not
    tok = source.with_name("tokenizer.bin")
    for force in ([], ["--force"]):
        line = _one_line_failure(["convert", str(source), str(tok), *(["-z", str(tok)] if named else []), *force])
        assert "is the tokenizer" in line, line
        assert _same_bytes(tok, shared_file("tok512.bin"))
    with pytest.raises(InputError, match="is the tokenizer"):
        convert_llama2c(source, tok, tokenizer=tok if named else None, force=True)
    assert _same_bytes(tok, shared_file("tok512.bin"))


def test_an_existing_output_needs_force(source, tmp_path):
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"keep me")
    line = _one_line_failure(["convert", str(source), str(dst)])
    assert "exists" in line and "--force" in line
    assert dst.read_bytes() == b"keep me"
    with pytest.raises(InputError, match="force"):
        convert_llama2c(source, dst)
    result = CliRunner().invoke(main, ["convert", str(source), str(dst), "--force"])
    assert result.exit_code == 0, result.output
    assert dst.read_bytes()[:4] == b"GGUF"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(source, tmp_path, monkeypatch):
    import gguf

    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"keep me")

    def broken(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", broken)
    with pytest.raises(OSError, match="No space"):
        convert_llama2c(source, dst, force=True)
    assert dst.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin", "out.gguf", "tokenizer.bin"]


def test_the_output_is_written_in_its_own_folder_and_renamed(source, tmp_path, monkeypatch):
    """The temporary file lives beside the output (a rename across file systems is not atomic)."""
    import gguf

    seen = []
    real_init = gguf.GGUFWriter.__init__

    def spy(self, path, *args, **kwargs):
        seen.append(os.fspath(path))
        real_init(self, path, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "__init__", spy)
    out = tmp_path / "sub" / "out.gguf"
    out.parent.mkdir()
    convert_llama2c(source, out)
    assert len(seen) == 1 and os.path.dirname(seen[0]) == str(out.parent) and seen[0] != str(out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.gguf"]
