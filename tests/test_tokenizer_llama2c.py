"""The llama2.c tokenizer against llama2.c's own run.c: encoding, decoding, and hostile files.

Golden ids below were produced by llama2.c ``run.c``'s ``encode()`` (karpathy/llama2.c at commit
350e04fe, built with ``gcc -O3 -DTESTING``) on the same tokenizer files, unless a comment says
otherwise. The heap-based merge is also checked against a direct port of run.c's quadratic loop.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from pathlib import Path

import pytest

from pyllama.errors import TokenizerError
from pyllama.tokenizer import GgufTokenizer, Llama2cTokenizer, load_tokenizer
from pyllama.tokenizer.llama2c import _scan_hex_byte

MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"


def _model_file(name: str) -> Path:
    path = MODELS / name
    if not path.exists():
        pytest.skip(f"{name} is not in {MODELS} (the shared model folder beside the repository)")
    return path


@pytest.fixture(scope="module")
def tokenizer_512() -> Llama2cTokenizer:
    return Llama2cTokenizer.load(_model_file("tok512.bin"), 512)


@pytest.fixture(scope="module")
def tokenizer_32k() -> Llama2cTokenizer:
    return Llama2cTokenizer.load(_model_file("tokenizer.bin"), 32000)


def _tokenizers(request, name: str) -> Llama2cTokenizer:
    return request.getfixturevalue({"tok512.bin": "tokenizer_512", "tokenizer.bin": "tokenizer_32k"}[name])


def _jsonl(name: str) -> list[dict]:
    path = MODELS / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, pieces: list[bytes], scores: list[float], max_len: int | None = None) -> Path:
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max_len if max_len is not None else max(len(p) for p in pieces)))
        for piece, score in zip(pieces, scores, strict=True):
            f.write(struct.pack("<fi", score, len(piece)) + piece)
    return path


# ---- encoding: the shared references --------------------------------------------------------------
REFERENCE_TOKENIZER = _jsonl("reference-tokenizer.jsonl")


@pytest.mark.parametrize(
    "case", REFERENCE_TOKENIZER or [None], ids=lambda c: f"{c['tokenizer']}:{c['text']!r}" if c else "absent"
)
def test_reference_tokenizer_jsonl(request, case):
    if case is None:
        pytest.skip(f"reference-tokenizer.jsonl is not in {MODELS}")
    tok = _tokenizers(request, case["tokenizer"])
    assert tok.vocab_size == case["vocab_size"]
    assert tok.encode(case["text"], bos=bool(case["bos"]), eos=bool(case["eos"])) == case["ids"]


REFERENCE_STORIES = _jsonl("reference-stories260K.jsonl")


@pytest.mark.parametrize("run", REFERENCE_STORIES or [None], ids=lambda r: r["command"][-40:] if r else "absent")
def test_reference_stories_prompt_and_text(tokenizer_512, run):
    """run.c's prompt ids, and its printed text from the ids it generated."""
    if run is None:
        pytest.skip(f"reference-stories260K.jsonl is not in {MODELS}")
    assert tokenizer_512.encode(run["prompt"]) == run["prompt_ids"]
    assert tokenizer_512.decode(run["prompt_ids"] + run["ids"]) == run["text"]


# ---- encoding: more run.c goldens -----------------------------------------------------------------
RUN_C_GOLDEN = [
    # (tokenizer, text, bos, eos, ids from run.c encode())
    ("tok512.bin", "Tiny Tom saw a big dog.\nIt ran to him!", True, False,
     [1, 274, 271, 422, 274, 287, 394, 261, 370, 400, 428, 426, 13, 442, 413, 352, 303, 267, 270, 288, 443]),
    ("tok512.bin", "naïve café — 日本語 🦙", True, True,
     [1, 297, 412, 198, 178, 360, 280, 412, 431, 485, 410, 481, 410, 233, 154, 168, 233, 159, 175, 235, 173, 161,
      410, 243, 162, 169, 156, 2]),
    # stray continuation bytes: run.c groups at most 4 bytes per lookup, then falls back to bytes
    ("tok512.bin", b"stray \x80\x80\x80\x80\x80 bytes \xc3", True, False,
     [1, 349, 420, 283, 35, 131, 131, 131, 131, 131, 268, 422, 413, 406, 410, 198]),
    ("tok512.bin", "  two leading spaces", False, False,
     [410, 410, 259, 424, 414, 278, 411, 380, 299, 262, 427, 412, 331, 419]),
    ("tokenizer.bin", "naïve café — 日本語 🦙", True, False,
     [1, 1055, 30085, 345, 274, 28059, 813, 29871, 30325, 30346, 30968, 29871, 243, 162, 169, 156]),
    ("tokenizer.bin", "👨\u200d👩\u200d👧\u200d👦 family 🇫🇷", True, True,
     [1, 29871, 243, 162, 148, 171, 30722, 243, 162, 148, 172, 30722, 243, 162, 148, 170, 30722, 243, 162, 148, 169,
      3942, 29871, 243, 162, 138, 174, 243, 162, 138, 186, 2]),
    ("tokenizer.bin", b"\xf0\x9f\x98\x80\x80\x80 overlong \xc0\xaf \xff", True, False,
     [1, 29871, 243, 162, 155, 131, 131, 131, 975, 5426, 29871, 195, 178, 29871, 258]),
    ("tokenizer.bin", "Привет, мир! مرحبا नमस्ते", False, False,
     [7203, 7616, 29892, 4157, 29927, 29991, 29871, 30159, 30156, 30240, 30177, 30112, 29871, 30424, 30485, 30489,
      30296, 30475, 30569]),
    ("tokenizer.bin", "tabs\tand\nnew\r\nlines  ", True, False, [1, 18859, 12, 392, 13, 1482, 30004, 13, 9012, 259]),
    # llama2.c's own test.c case (from Meta's Llama 2 example)
    ("tokenizer.bin", "I believe the meaning of life is", True, False, [1, 306, 4658, 278, 6593, 310, 2834, 338]),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,text,bos,eos,ids", RUN_C_GOLDEN, ids=lambda v: repr(v)[:30] if isinstance(v, str | bytes) else None
)
def test_run_c_golden(request, name, text, bos, eos, ids):
    assert _tokenizers(request, name).encode(text, bos=bos, eos=eos) == ids


_SENTENCES = [
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the park with her friends.",
    "One day, she saw a big, red ball under a tree!",
    '"Can I play with it?" she asked her mom.',
    'Her mom smiled and said, "Yes, but be careful."',
    "The café on the corner sold crème brûlée for 3.50 €.",
    "日本語の文章も少し入っています。",
    "Emoji appear too: 🦙 🚀 👍🏽.",
    "Numbers like 1234567890 and 3.14159 are split into digits.",
    "\tTabs,\nnewlines\nand  double  spaces stay.",
    "Привет, как дела?",
    "The end.",
]
LONG_TEXT = " ".join(_SENTENCES[(i * 7) % len(_SENTENCES)] for i in range(400))  # 15,678 characters


@pytest.mark.parametrize(
    "name,count,sha256",
    [
        # run.c encode(LONG_TEXT, bos=1, eos=0): number of ids and sha256 of the ids joined by spaces
        ("tok512.bin", 10693, "162f9a3d9c849de8035649e6c434a8df2c236ded5e8062431d3cb210f237ba91"),
        ("tokenizer.bin", 6077, "cc4685da918b1356b1f249a2b875ed5642848d4d1805ddc67542cf0e55434b40"),
    ],
)
def test_long_text_matches_run_c(request, name, count, sha256):
    ids = _tokenizers(request, name).encode(LONG_TEXT)
    assert len(ids) == count
    assert hashlib.sha256(" ".join(map(str, ids)).encode()).hexdigest() == sha256


def _run_c_merge_reference(tok: Llama2cTokenizer, text: bytes, bos: bool) -> list[int]:
    """run.c's encode() transcribed literally (quadratic merge loop), to check the heap version."""
    pieces = [p.split(b"\0")[0] for p in tok.pieces]
    lookup = {}
    for i, p in enumerate(pieces):
        lookup.setdefault(p, i)
    text = text.split(b"\0")[0]
    tokens = [1] if bos else []
    if text:
        tokens.append(lookup[b" "])
    buf = b""
    for k, c in enumerate(text):
        if c & 0xC0 != 0x80:
            buf = b""
        buf += bytes([c])
        nxt = text[k + 1] if k + 1 < len(text) else 0
        if nxt & 0xC0 == 0x80 and len(buf) < 4:
            continue
        if buf in lookup:
            tokens.append(lookup[buf])
        else:
            tokens.extend(b + 3 for b in buf)
        buf = b""
    scores = tok.scores
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for i in range(len(tokens) - 1):
            merged = lookup.get(pieces[tokens[i]] + pieces[tokens[i + 1]])
            if merged is not None and scores[merged] > best_score:
                best_score, best_id, best_idx = scores[merged], merged, i
        if best_idx == -1:
            return tokens
        tokens[best_idx : best_idx + 2] = [best_id]


def test_heap_merge_equals_run_c_loop(tokenizer_512, tokenizer_32k):
    rng = random.Random(1234)
    alphabet = list("abcdefghijklmnopqrstuvwxyz      ABCXYZ0123456789.,!?'\n") + list("éüß日本🦙—")
    for tok in (tokenizer_512, tokenizer_32k):
        for _ in range(200):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))).encode()
            if rng.random() < 0.2:
                text += bytes(rng.randint(0x80, 0xFF) for _ in range(rng.randint(1, 6)))
            bos = rng.random() < 0.5
            assert tok.encode(text, bos=bos) == _run_c_merge_reference(tok, text, bos), text


def test_pair_memory_bound_keeps_the_merges(tokenizer_32k, monkeypatch):
    """The merge remembers which pairs merge; when that memory fills it starts again, and the ids
    stay run.c's (the reference loop above) however small the memory is."""
    from pyllama.tokenizer import llama2c

    text = LONG_TEXT[:3000].encode()
    want = _run_c_merge_reference(tokenizer_32k, text, True)
    monkeypatch.setattr(llama2c, "PAIR_MEMORY", 8)
    fresh = Llama2cTokenizer(tokenizer_32k.pieces, tokenizer_32k.scores, tokenizer_32k.max_token_length)
    assert fresh.encode(text) == want
    assert len(fresh._pairs) <= 8


# ---- encoding: vocabularies with ties, duplicates and NUL bytes (run.c goldens) -------------------
THREE_TEXTS = ["Once upon a time, there was a little girl.", "the theme of the story", "café au lait 🦙"]


def _variant(tmp_path: Path, tokenizer_512: Llama2cTokenizer, kind: str) -> Llama2cTokenizer:
    pieces, scores = tokenizer_512.pieces, tokenizer_512.scores
    if kind == "ties":  # every merge scores 0.0: only "leftmost first" decides
        scores = [0.0 if i >= 259 else s for i, s in enumerate(scores)]
    elif kind == "dups":  # duplicate strings: run.c's bsearch picks one of them
        pieces[350], scores[350] = pieces[420], scores[420] + 3
        pieces += [pieces[300], pieces[261], b" "]
        scores += [5.0, -1.0, 0.0]
    elif kind == "nul":  # " \0zz" is " " to C: a second " " piece
        pieces[300] = pieces[300][:1] + b"\0zz"
    return Llama2cTokenizer.load(_write(tmp_path / f"{kind}.bin", pieces, scores))


@pytest.mark.parametrize(
    "kind,expected",
    [
        ("ties", [
            [1, 403, 407, 261, 378, 432, 383, 286, 261, 397, 413, 413, 305, 298, 315, 421, 426],
            [1, 265, 265, 423, 411, 373, 265, 349, 304, 422],
            [1, 280, 412, 431, 485, 261, 425, 278, 412, 275, 410, 243, 162, 169, 156],
        ]),
        ("dups", [
            [1, 403, 318, 427, 289, 513, 378, 432, 383, 286, 513, 376, 298, 315, 421, 426],
            [1, 265, 265, 423, 411, 373, 265, 349, 304, 422],
            [1, 280, 412, 431, 485, 513, 425, 278, 412, 275, 410, 243, 162, 169, 156],
        ]),
        ("nul", [
            [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 426],
            [1, 265, 265, 423, 411, 373, 265, 349, 304, 422],
            [1, 280, 412, 431, 485, 261, 425, 278, 412, 275, 300, 243, 162, 169, 156],
        ]),
    ],
)  # fmt: skip
def test_odd_vocabularies_match_run_c(tmp_path, tokenizer_512, kind, expected):
    tok = _variant(tmp_path, tokenizer_512, kind)
    assert [tok.encode(t) for t in THREE_TEXTS] == expected


def test_text_ends_at_nul_like_a_c_string(tokenizer_32k):
    assert tokenizer_32k.encode("abc\0def") == tokenizer_32k.encode("abc")
    assert tokenizer_32k.encode("\0def") == [1]


def test_encode_is_fast_enough(tokenizer_32k):
    import time

    start = time.perf_counter()
    ids = tokenizer_32k.encode(LONG_TEXT * 2)
    assert len(ids) > 10_000
    assert time.perf_counter() - start < 10  # seconds; typically well under one


# ---- decoding -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "piece,byte",
    # sscanf(piece, "<0x%02hhX>", &b) as glibc 2.36 evaluates it (checked against the C library)
    [
        (b"<0x41>", 0x41), (b"<0x0A>", 0x0A), (b"<0xff>", 0xFF), (b"<0x4>", 4), (b"<0x4G>", 4), (b"<0x41", 0x41),
        (b"<0x+4>", 4), (b"<0x-1>", 0xFF), (b"<0x 41>", 0x41), (b"<0x0x41>", 0), (b"<0x>", None), (b"<0xg>", None),
        (b"<0x", None), (b"<0X41>", None), (b" <0x41>", None), (b"<0x\t", None),
    ],
)  # fmt: skip
def test_byte_piece_parsing_matches_sscanf(piece, byte):
    assert _scan_hex_byte(piece) == byte


def test_piece_bytes(tokenizer_512):
    assert tokenizer_512.piece_bytes(3 + 0x41) == b"A"  # <0x41>
    assert tokenizer_512.piece_bytes(3 + 0x00) == b""  # byte 0 is an empty C string
    assert tokenizer_512.piece_bytes(1) == b"\n<s>\n"
    assert tokenizer_512.piece_bytes(410) == b" "


def test_after_bos_the_leading_space_goes(tokenizer_512):
    ids = tokenizer_512.encode("Once upon a time")
    assert tokenizer_512.piece_after(1, ids[1]) == b"Once"
    assert tokenizer_512.piece_after(None, ids[1]) == b" Once"
    assert tokenizer_512.decode(ids) == "Once upon a time"
    assert tokenizer_512.decode([0] + ids[1:]) == " Once upon a time"  # no BOS before it: the space stays
    # a whole sequence as generate prints it: a leading BOS is not printed, any other first token is
    assert tokenizer_512.decode_sequence(ids) == "Once upon a time"
    assert tokenizer_512.decode_sequence(ids[1:]) == " Once upon a time"


def test_control_bytes_are_dropped_like_safe_printf(tokenizer_512):
    stream = tokenizer_512.decoder(1)
    assert stream.feed(3 + 0x01) == ""
    assert stream.feed(3 + 0x7F) == ""
    assert stream.feed(3 + 0x0A) == "\n"  # whitespace is printed
    assert stream.feed(3 + 0x09) == "\t"
    assert stream.feed(3 + 0x41) == "A"


@pytest.mark.parametrize("text", ["café", "🦙", "日本", "naïve 👍🏽"])
def test_stream_never_splits_a_utf8_character(tokenizer_512, text):
    """Feed a character's byte tokens one at a time: nothing comes out until it is complete."""
    stream = tokenizer_512.decoder(1)
    out = []
    for ch in text:
        data = ch.encode()
        pieces = [stream.feed(3 + b) for b in data]
        assert pieces[:-1] == [""] * (len(data) - 1)
        assert pieces[-1] == ch
        out.append(pieces[-1])
    assert stream.flush() == ""
    assert "".join(out) == text


def test_stream_invalid_and_incomplete_utf8(tokenizer_512):
    stream = tokenizer_512.decoder(1)
    assert stream.feed(3 + 0xC3) == ""
    assert stream.feed(3 + ord("a")) == "\ufffda"  # a lead byte without its continuation
    assert stream.feed(3 + 0xF0) == ""
    assert stream.feed(3 + 0x9F) == ""
    assert stream.flush() == "\ufffd"  # the sequence never completed


@pytest.mark.parametrize(
    "text",
    [
        "Once upon a time, there was a little girl named Lily.",
        " leading space",
        "  two leading spaces and trailing  ",
        "line one\nline two\n\n\ttabbed",
        "café crème brûlée — naïve",
        "日本語のテキスト 🦙🚀👍🏽 👨\u200d👩\u200d👧",
        "Привет, мир! مرحبا नमस्ते",
        "",
    ],
)
def test_round_trip(tokenizer_512, tokenizer_32k, text):
    for tok in (tokenizer_512, tokenizer_32k):
        assert tok.decode(tok.encode(text)) == text


def test_round_trip_long_text(tokenizer_512, tokenizer_32k):
    for tok in (tokenizer_512, tokenizer_32k):
        assert tok.decode(tok.encode(LONG_TEXT)) == LONG_TEXT


def test_out_of_range_token(tokenizer_512):
    with pytest.raises(TokenizerError, match="token id 512 is outside the vocabulary"):
        tokenizer_512.piece_after(1, 512)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer_512.decoder(1).feed(-1)


def test_properties(tokenizer_512):
    assert (tokenizer_512.vocab_size, tokenizer_512.bos_id, tokenizer_512.eos_id) == (512, 1, 2)
    assert tokenizer_512.pieces[:3] == [b"<unk>", b"\n<s>\n", b"\n</s>\n"]
    assert len(tokenizer_512.scores) == 512 and tokenizer_512.max_token_length == 7


# ---- loading and hostile files --------------------------------------------------------------------
def test_load_without_vocab_size_reads_to_the_end():
    assert Llama2cTokenizer.load(_model_file("tok512.bin")).vocab_size == 512


def test_load_tokenizer_dispatch():
    assert isinstance(load_tokenizer(_model_file("tok512.bin"), 512), Llama2cTokenizer)
    assert isinstance(load_tokenizer(_model_file("stories260K-f32.gguf"), 512), GgufTokenizer)


def test_wrong_vocab_size_fewer():
    path = _model_file("tok512.bin")
    with pytest.raises(TokenizerError) as e:
        Llama2cTokenizer.load(path, 32000)
    msg = str(e.value)
    assert "holds 512 tokens but the model has a vocabulary of 32000" in msg and "tok512.bin" in msg
    assert "-z" in msg


def test_wrong_vocab_size_more():
    with pytest.raises(TokenizerError, match="holds 32000 tokens but the model has a vocabulary of 512"):
        load_tokenizer(_model_file("tokenizer.bin"), 512)


def test_empty_file(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(TokenizerError, match=r"empty\.bin: empty file"):
        load_tokenizer(tmp_path / "empty.bin")


def test_truncated_file(tmp_path):
    data = _model_file("tok512.bin").read_bytes()
    for cut in (2, 6, len(data) // 2, len(data) - 1):
        path = tmp_path / f"cut{cut}.bin"
        path.write_bytes(data[:cut])
        with pytest.raises(TokenizerError) as e:
            Llama2cTokenizer.load(path, 512)
        msg = str(e.value)
        assert path.name in msg and "\n" not in msg
        assert "truncated" in msg or "too short" in msg


def test_truncated_file_without_vocab_size_names_the_token(tmp_path):
    data = _model_file("tok512.bin").read_bytes()
    path = tmp_path / "cut.bin"
    path.write_bytes(data[:-3])
    with pytest.raises(TokenizerError, match=r"truncated: token 511 at byte \d+ needs \d+ bytes, the file ends after"):
        Llama2cTokenizer.load(path)


def test_garbage_file(tmp_path):
    path = tmp_path / "garbage.bin"
    path.write_bytes(random.Random(0).randbytes(5000))
    with pytest.raises(TokenizerError, match="garbage.bin: .*not a llama2.c tokenizer"):
        load_tokenizer(path)


def test_checkpoint_passed_as_tokenizer():
    """A model checkpoint is no tokenizer: its header is not a plausible token length."""
    with pytest.raises(TokenizerError, match="stories260K.bin"):
        Llama2cTokenizer.load(_model_file("stories260K.bin"), 512)


def test_negative_and_oversized_lengths(tmp_path):
    path = tmp_path / "neg.bin"
    path.write_bytes(struct.pack("<ifi", 5, 0.0, -3) + b"abc")
    with pytest.raises(TokenizerError, match="token 0 at byte 4 claims -3 bytes"):
        Llama2cTokenizer.load(path)
    path.write_bytes(struct.pack("<ifi", 2, 0.0, 3) + b"abc")
    with pytest.raises(TokenizerError, match="claims 3 bytes but the header says tokens are at most 2"):
        Llama2cTokenizer.load(path)
    path.write_bytes(struct.pack("<i", -1))
    with pytest.raises(TokenizerError, match="longest token is -1 bytes"):
        Llama2cTokenizer.load(path)


def test_header_only(tmp_path):
    path = tmp_path / "header.bin"
    path.write_bytes(struct.pack("<i", 7))
    with pytest.raises(TokenizerError, match="no tokens"):
        Llama2cTokenizer.load(path)


def test_gguf_given_to_the_llama2c_loader():
    with pytest.raises(TokenizerError, match="is a GGUF file, not a llama2.c tokenizer"):
        Llama2cTokenizer.load(_model_file("stories260K-f32.gguf"))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TokenizerError, match="nope.bin: no such file"):
        load_tokenizer(tmp_path / "nope.bin")
    with pytest.raises(TokenizerError, match="is a directory"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="no such file"):
        Llama2cTokenizer.load(tmp_path / "nope.bin")


def test_small_vocabulary_errors(tmp_path):
    """A vocabulary without the pieces run.c's encoder relies on gets a clear error, not a crash."""
    tok = Llama2cTokenizer.load(_write(tmp_path / "tiny.bin", [b"<unk>", b"<s>", b"</s>", b"a"], [0.0] * 4))
    assert tok.encode("") == [1]
    with pytest.raises(TokenizerError, match="no ' ' piece"):
        tok.encode("a")
    tok = Llama2cTokenizer.load(_write(tmp_path / "tiny2.bin", [b"<unk>", b"<s>", b"</s>", b" "], [0.0] * 4))
    with pytest.raises(TokenizerError, match="byte fallback for 0x61 needs token 100"):
        tok.encode("a")
