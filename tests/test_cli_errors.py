"""Bad input gets one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main


def _fails(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def model_args():
    return ["-z", str(shared_file("tok512.bin"))]


def test_truncated_checkpoint(tmp_path, model_args):
    cut = tmp_path / "cut.bin"
    cut.write_bytes(shared_file("stories260K.bin").read_bytes()[:4096])
    line = _fails(["generate", "-c", str(cut), *model_args, "-i", "hi"])
    assert line.startswith("error: cut.bin: header implies 1,056,540 bytes, file has 4,096: truncated")


def test_wrong_size(tmp_path, model_args):
    long = tmp_path / "long.bin"
    long.write_bytes(shared_file("stories260K.bin").read_bytes() + b"\0\0\0\0")
    assert "too many" in _fails(["generate", "-c", str(long), *model_args])


def test_garbage_header(tmp_path, model_args):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 64)
    assert "not a llama2.c checkpoint" in _fails(["generate", "-c", str(junk), *model_args])


@pytest.mark.parametrize("content", [b"", b"hello, this is text", b"GG"])
def test_a_gguf_name_on_another_file_says_so(tmp_path, content):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(content)
    line = _fails(["info", str(fake)])
    assert "named .gguf but not a GGUF file" in line, line


def test_missing_file(tmp_path, model_args):
    assert "no such file" in _fails(["info", str(tmp_path / "nope.bin")])


def test_tokenizer_that_does_not_match_the_model():
    line = _fails(["generate", "-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tokenizer.bin"))])
    assert "32000" in line and "512" in line


@pytest.mark.parametrize("beside", ["tokenizer.bin", "garbage", None])
def test_without_z_the_line_says_what_is_beside_the_checkpoint(tmp_path, beside):
    model = tmp_path / "model.bin"
    model.write_bytes(shared_file("stories260K.bin").read_bytes())
    if beside == "tokenizer.bin":  # there, but a 32000-token vocabulary for a 512-token model
        (tmp_path / "tokenizer.bin").write_bytes(shared_file("tokenizer.bin").read_bytes())
    elif beside == "garbage":
        (tmp_path / "tokenizer.bin").write_bytes(b"\x07" * 10)
    line = _fails(["generate", "-c", str(model), "-n", "4"])
    if beside is None:
        assert "no tokenizer found beside it" in line
    else:
        assert "found tokenizer.bin beside it, but it does not fit" in line
        assert "no tokenizer found" not in line
    if beside == "tokenizer.bin":
        assert "32000" in line and "512" in line
    assert line.count("-z") == 1, line  # the advice once


def test_prompt_longer_than_the_context(model_args):
    prompt = " ".join(["Lily"] * 600)
    line = _fails(["generate", "-c", str(shared_file("stories260K.bin")), *model_args, "-i", prompt])
    assert "the prompt is" in line and "holds 512 positions" in line


def test_unknown_attention_plugin(model_args):
    line = _fails(["generate", "-c", str(shared_file("stories260K.bin")), *model_args, "--attention", "nope"])
    assert "nope" in line and "causal" in line


def test_real_entry_point_exits_nonzero_with_one_line(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x01" * 100)
    proc = subprocess.run([sys.executable, "-m", "pyllama", "info", str(junk)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")


def test_debug_flag_shows_the_traceback(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x01" * 100)
    result = CliRunner().invoke(main, ["--debug", "info", str(junk)])
    assert result.exit_code != 0 and "Traceback" in result.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (["diff", "causal", "kmeans", "--probe", "standard"], "Missing option '-c'"),
        (["generate", "-c", "x.bin", "--bogus"], "No such option '--bogus'"),
        (["generate", "-c", "x.bin", "-n", "abc"], "'abc' is not a valid integer"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_usage_errors_are_one_line_pointing_at_help(args, says):
    line = _fails(args)
    assert line.startswith("error: ") and says in line and "--help" in line
