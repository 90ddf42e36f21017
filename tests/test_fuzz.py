"""Fuzzing the loaders and the tokenizer files: no input ends in anything but a PyllamaError.

Inputs are real small files with a few mutations (bytes and integers written where the headers
are, truncations, insertions, deletions) and structured random files (llama2.c headers, GGUF
key/value tables and tensor lists, llama2.c tokenizer records) built with hypothesis. Each input runs
in a child process (``fuzz_worker.py``) with a timeout, so a crash (a signal) or a hang is caught and
counted like an exception other than PyllamaError: all three are failures.

The default run tries ``FUZZ_EXAMPLES`` inputs per target (a few hundred in total, well under two
minutes). The long run (marker ``fuzz_long``, skipped by default) tries ``PYLLAMA_FUZZ_EXAMPLES``
per target, 1,200 unless set (10,800 inputs over the nine targets), and prints the counts::

    pytest -m fuzz_long tests/test_fuzz.py -s
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import shared_file

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

WORKER = Path(__file__).with_name("fuzz_worker.py")
TIMEOUT = 5.0  # seconds per input: every real input here loads in milliseconds
STARTUP = 60.0  # seconds for a new worker to import pyllama (a loaded machine)
FUZZ_EXAMPLES = int(os.environ.get("PYLLAMA_FUZZ_CI_EXAMPLES", "50"))
LONG_EXAMPLES = int(os.environ.get("PYLLAMA_FUZZ_EXAMPLES", "1200"))

INTERESTING = [0, 1, 2, 3, 7, 8, 31, 32, 64, 255, 256, 512, 4096, 65535, 65536, 2**24, 2**31 - 1, 2**31, 2**32 - 1]
INTERESTING += [2**32, 2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
INTERESTING_SIGNED = sorted({*(v for v in INTERESTING if v < 2**31), -1, -2, -(2**31)})


# ---- the child process ---------------------------------------------------------------------------------
class Worker:
    """One child running fuzz_worker.py; restarted after a crash or a hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        answer = self._ask("ping -", STARTUP)
        if answer["outcome"] != "ok":
            raise RuntimeError(f"the fuzz worker did not start: {answer}")

    def _ask(self, line: str, timeout: float) -> dict:
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self._crashed()
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return {"outcome": "hang"}
        reply = proc.stdout.readline()
        if not reply:
            return self._crashed()
        return json.loads(reply)

    def _crashed(self) -> dict:
        assert self.proc is not None
        code = self.proc.wait(timeout=10)
        self.proc = None
        return {"outcome": "crash", "returncode": code}

    def run(self, target: str, path: Path) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return self._ask(f"{target} {path}", TIMEOUT)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.stop()


# ---- inputs: mutations of real files ------------------------------------------------------------------------
def _gguf_header_bytes(path: Path) -> int:
    """Where a GGUF file's tensor data starts: everything before it is header."""
    import gguf

    return int(gguf.GGUFReader(path).data_offset)


@st.composite
def mutations(draw, data: bytes, header: int) -> bytes:
    """``data`` with one to eight edits, most of them inside its first ``header`` bytes."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        if not buf:
            break
        limit = min(header, len(buf)) if draw(st.integers(0, 9)) else len(buf)
        at = draw(st.integers(0, max(limit - 1, 0)))
        op = draw(st.sampled_from(["byte", "u32", "u64", "i32", "truncate", "insert", "delete"]))
        if op == "byte":
            buf[at] = draw(st.integers(0, 255))
        elif op in ("u32", "u64", "i32"):
            fmt, pool = {"u32": ("<I", INTERESTING), "u64": ("<Q", INTERESTING), "i32": ("<i", INTERESTING_SIGNED)}[op]
            value = draw(st.sampled_from(pool)) % (2 ** (8 * struct.calcsize(fmt))) if fmt != "<i" else None
            packed = struct.pack(fmt, value if value is not None else draw(st.sampled_from(INTERESTING_SIGNED)))
            at -= at % 4
            buf[at : at + len(packed)] = packed
        elif op == "truncate":
            del buf[draw(st.integers(0, len(buf) - 1)) :]
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del buf[at : at + draw(st.integers(1, 64))]
    return bytes(buf)


# ---- inputs: structured random files ---------------------------------------------------------------------------
@st.composite
def llama2c_headers(draw) -> bytes:
    """Seven int32 header fields (any values) and a payload of some size."""
    fields = [draw(st.sampled_from(INTERESTING_SIGNED) | st.integers(-(2**31), 2**31 - 1)) for _ in range(7)]
    size = draw(st.sampled_from([0, 1, 4, 100, 4096, 65536]) | st.integers(0, 200_000))
    return struct.pack("<7i", *fields) + draw(st.binary(min_size=min(size, 64), max_size=min(size, 64))) * (
        size // 64 if size >= 64 else 1
    )


def _gguf_string(text: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text


GGUF_KEYS = [
    b"general.architecture",
    b"general.alignment",
    b"llama.context_length",
    b"llama.embedding_length",
    b"llama.feed_forward_length",
    b"llama.block_count",
    b"llama.attention.head_count",
    b"llama.attention.head_count_kv",
    b"llama.rope.dimension_count",
    b"llama.attention.layer_norm_rms_epsilon",
    b"tokenizer.ggml.model",
    b"tokenizer.ggml.pre",
    b"tokenizer.ggml.tokens",
    b"tokenizer.ggml.scores",
    b"tokenizer.ggml.token_type",
    b"tokenizer.ggml.merges",
    b"tokenizer.ggml.bos_token_id",
    b"tokenizer.ggml.eos_token_id",
    b"tokenizer.ggml.add_bos_token",
]
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@st.composite
def gguf_value(draw, vtype: int, depth: int = 0) -> bytes:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        if fmt in ("<f", "<d"):
            return struct.pack(fmt, draw(st.floats(allow_nan=True, allow_infinity=True, width=32)))
        if fmt == "<?":
            return struct.pack("<B", draw(st.integers(0, 255)))
        bits = 8 * struct.calcsize(fmt)
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt.islower() or fmt == "<b" else (0, 2**bits - 1)
        pool = [v for v in INTERESTING + INTERESTING_SIGNED if low <= v <= high]
        return struct.pack(fmt, draw(st.sampled_from(pool) | st.integers(low, high)))
    if vtype == 8:  # string
        text = draw(st.sampled_from([b"llama", b"gpt2", b"qwen2", b"", b"\xff\xfe"]) | st.binary(max_size=24))
        length = draw(st.sampled_from([None, None, None, 2**63, 2**64 - 1, 1 << 40]))
        return _gguf_string(text, length)
    if vtype == 9 and depth == 0:  # array
        item = draw(st.sampled_from([8, 8, 4, 5, 6, 9, 0, 13]))
        n = draw(st.integers(0, 40))
        declared = draw(st.sampled_from([n, n, n, 2**62, 2**64 - 1, n + 1]))
        items = b"".join(draw(gguf_value(item, depth + 1)) for _ in range(n))
        return struct.pack("<IQ", item, declared) + items
    return draw(st.binary(max_size=16))  # an unknown type: whatever follows


@st.composite
def gguf_files(draw, tokenizer_keys: bool = False) -> bytes:
    """A GGUF header with random key/value pairs and tensor infos, then some data."""
    version = draw(st.sampled_from([3, 3, 3, 2, 1, 0, 4, 2**32 - 1]))
    kvs = []
    for _ in range(draw(st.integers(0, 12))):
        pool = GGUF_KEYS[10:] if tokenizer_keys else GGUF_KEYS
        key = draw(st.sampled_from(pool) | st.binary(max_size=12))
        vtype = draw(st.sampled_from([4, 5, 6, 8, 9, 10, 11, 12, 0, 7, 13, 2**31]))
        kvs.append(_gguf_string(key) + struct.pack("<I", vtype % 2**32) + draw(gguf_value(vtype)))
    tensors = []
    for i in range(draw(st.integers(0, 4))):
        n_dims = draw(st.sampled_from([1, 2, 0, 4, 5, 2**32 - 1]))
        dims = [draw(st.sampled_from(INTERESTING)) for _ in range(min(n_dims, 5))]
        ttype = draw(st.sampled_from([0, 1, 8, 2, 14, 30, 2**31]))
        offset = draw(st.sampled_from([0, 32, 64, 2**40, 2**64 - 1]))
        name = draw(st.sampled_from([b"token_embd.weight", b"output_norm.weight", f"t{i}".encode()]))
        info = _gguf_string(name) + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in dims)
        tensors.append(info + struct.pack("<IQ", ttype, offset))
    n_kv = draw(st.sampled_from([len(kvs)] * 4 + [len(kvs) + 1, 2**63, 2**64 - 1]))
    n_tensors = draw(st.sampled_from([len(tensors)] * 4 + [len(tensors) + 1, 2**40, 2**64 - 1]))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs) + b"".join(tensors)
    head += b"\0" * (-len(head) % 32)
    return head + draw(st.binary(max_size=512))


@st.composite
def tokenizer_bins(draw) -> bytes:
    """A llama2.c tokenizer: int32 max length, then records of float32 score, int32 length, bytes.
    Half of them are well formed (every length right), so that encoding and decoding run too."""
    consistent = draw(st.booleans())
    byte_tokens = [f"<0x{i:02X}>".encode() for i in range(256)]  # run.c's byte fallback: encoding needs them
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n", *byte_tokens, b" "] if consistent else []
    pieces += [
        draw(st.sampled_from([b"<0x41>", b"<0x0A>", b" a", b"a", b"", b" ", b"\xc3", b"\xa9"]) | st.binary(max_size=12))
        for _ in range(draw(st.integers(0, 40)))
    ]
    longest = max((len(p) for p in pieces), default=0)
    max_len = longest if consistent else draw(st.sampled_from(INTERESTING_SIGNED))
    out = struct.pack("<i", max_len)
    for piece in pieces:
        wrong = [-1, 2**31 - 1, len(piece) + 1, 0]
        length = len(piece) if consistent else draw(st.sampled_from([len(piece)] * 6 + wrong))
        score = draw(st.floats(width=32, allow_nan=not consistent, allow_infinity=not consistent))
        out += struct.pack("<fi", score, length) + piece
    return out + (b"" if consistent else draw(st.binary(max_size=8)))


# ---- the runs ---------------------------------------------------------------------------------------------------
def _targets() -> dict[str, tuple[str, st.SearchStrategy]]:
    bin_data = shared_file("stories260K.bin").read_bytes()
    tok_data = shared_file("tok512.bin").read_bytes()
    gguf_path = shared_file("stories260K-q8_0.gguf")
    gguf_data = gguf_path.read_bytes()
    gguf_head = _gguf_header_bytes(gguf_path)
    f32_path = shared_file("stories260K-f32.gguf")
    return {
        "llama2c-mutated": ("checkpoint", mutations(bin_data, 28)),
        "gguf-mutated": ("checkpoint", mutations(gguf_data, gguf_head)),
        "f32-gguf-mutated": ("checkpoint", mutations(f32_path.read_bytes(), _gguf_header_bytes(f32_path))),
        "tok512-mutated": ("tokenizer", mutations(tok_data, len(tok_data))),
        "gguf-vocab-mutated": ("tokenizer", mutations(gguf_data, gguf_head)),
        "llama2c-structured": ("checkpoint", llama2c_headers()),
        "gguf-structured": ("checkpoint", gguf_files()),
        "gguf-vocab-structured": ("tokenizer", gguf_files(tokenizer_keys=True)),
        "tokenizer-bin-structured": ("tokenizer", tokenizer_bins()),
    }


def fuzz(worker: Worker, name: str, examples: int, folder: Path) -> tuple[Counter, list[str]]:
    """Run ``examples`` inputs of target ``name``; the outcome counts and a description of each failure."""
    target, strategy = _targets()[name]
    counts: Counter = Counter()
    failures: list[str] = []
    path = folder / f"{name}.input"

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(data: bytes) -> None:
        path.write_bytes(data)
        answer = worker.run(target, path)
        counts[answer["outcome"]] += 1
        if answer["outcome"] not in ("ok", "pyllama"):
            kept = folder / f"{name}-failure-{len(failures)}.input"
            kept.write_bytes(data)
            detail = answer.get("error") or f"return code {answer.get('returncode')}"
            failures.append(f"{answer['outcome']} on {kept}: {detail}\n{answer.get('traceback', '')}")

    one()
    return counts, failures


TARGET_NAMES = [
    "llama2c-mutated",
    "gguf-mutated",
    "f32-gguf-mutated",
    "tok512-mutated",
    "gguf-vocab-mutated",
    "llama2c-structured",
    "gguf-structured",
    "gguf-vocab-structured",
    "tokenizer-bin-structured",
]


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_fuzz(worker, tmp_path, name):
    counts, failures = fuzz(worker, name, FUZZ_EXAMPLES, tmp_path)
    assert sum(counts.values()) >= FUZZ_EXAMPLES // 2, counts  # hypothesis may stop early on a small space
    assert not failures, f"{len(failures)} failures ({dict(counts)}); first:\n{failures[0]}"


@pytest.mark.fuzz_long
def test_fuzz_long(worker, tmp_path):
    total: Counter = Counter()
    failures: list[str] = []
    for name in TARGET_NAMES:
        counts, found = fuzz(worker, name, LONG_EXAMPLES, tmp_path)
        total += counts
        failures += found
        print(f"{name}: {dict(counts)}")
    tried = sum(total.values())
    print(
        f"fuzz: {tried} inputs, {total['exception']} non-PyllamaError exceptions, "
        f"{total['crash']} crashes, {total['hang']} hangs ({total['pyllama']} PyllamaError, {total['ok']} loaded)"
    )
    assert not failures, f"{len(failures)} failures; first:\n{failures[0]}"


def test_the_worker_reports_each_outcome(worker, tmp_path):
    """The harness can tell every outcome apart: loaded, PyllamaError, crash, hang."""
    assert worker.run("tokenizer", shared_file("tok512.bin")) == {"outcome": "ok"}
    bad = tmp_path / "empty.bin"
    bad.write_bytes(b"")
    assert worker.run("checkpoint", bad)["outcome"] == "pyllama"
    crash = worker.run("selftest-crash", bad)
    assert crash["outcome"] == "crash" and crash["returncode"] != 0
    assert worker.run("selftest-hang", bad) == {"outcome": "hang"}
    assert worker.run("checkpoint", shared_file("stories260K.bin")) == {"outcome": "ok"}  # a new worker


# ---- what the fuzzer found, kept as plain regression tests -------------------------------------------------------
FOUND = {
    # a GGUF whose metadata array claims 2^62 bytes: the tokenizer's reader (gguf-py's own) looped for ever
    "huge-metadata-array": (
        "tokenizer",
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _gguf_string(b"x") + struct.pack("<IIQ", 9, 0, 2**62) + b"\0" * 64,
    ),
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_inputs_found_by_fuzzing(worker, tmp_path, name):
    target, data = FOUND[name]
    path = tmp_path / f"{name}.input"
    path.write_bytes(data)
    assert worker.run(target, path)["outcome"] == "pyllama"
