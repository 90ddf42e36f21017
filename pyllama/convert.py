"""llama2.c checkpoint + tokenizer -> GGUF (``llama``), F32, F16 or Q8_0, written with gguf-py's ``GGUFWriter``.

Follows llama.cpp's own llama2.c converter (``llama-convert-llama2c-to-ggml``) so that llama.cpp
loads the result and tokenises like run.c:

* metadata: ``general.architecture = llama``, ``llama.{context_length, embedding_length,
  feed_forward_length, block_count, rope.dimension_count}``, ``llama.attention.{head_count,
  head_count_kv, layer_norm_rms_epsilon = 1e-5}``; no ``rope.freq_base`` (readers default to
  10000, run.c's value). Two deliberate differences: ``context_length`` is the checkpoint's
  ``seq_len`` (the converter writes its own default, 128), and the separator/padding ids, which the
  converter sets to -1 and llama.cpp then warns about, are left out.
* vocabulary (``tokenizer.ggml.model = llama``): id 0 ``<unk>`` (type UNKNOWN), 1 ``<s>`` and
  2 ``</s>`` (CONTROL; llama2.c stores them as "\\n<s>\\n" and "\\n</s>\\n"), empty pieces CONTROL,
  ``<0xHH>`` pieces BYTE, the rest NORMAL; spaces become SentencePiece's ``▁``; scores as stored;
  BOS 1, EOS 2, UNK 0.
* tensors in the converter's order and names, ``ne = [cols, rows]``; ``output.weight`` is written
  even when the checkpoint shares its classifier (a copy of the embedding, as the converter does).
* no Q/K permutation: run.c rotates pairs (2i, 2i+1), which is what GGUF ``llama`` means, so wq and
  wk are copied as they are (the converter does the same; only llama.cpp's Hugging Face converter
  permutes, because HF checkpoints rotate halves).
* ``--type f16``: every matrix F16 (as ``llama-quantize ... F16``); ``--type q8_0``: every matrix
  whose rows are a multiple of 32 values Q8_0 (``gguf.quants.quantize``, bit-exact with ggml's
  reference quantiser), the others stay F32 (llama-quantize has no fallback and refuses such models);
  norms stay F32.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES
from gguf.quants import quantize

from pyllama.checkpoint.llama2c import load_llama2c
from pyllama.errors import CheckpointError, InputError
from pyllama.outputs import check_outputs
from pyllama.tokenizer.llama2c import Llama2cTokenizer

DEFAULT_ALIGNMENT = 32  # GGUF's default (no general.alignment key): what llama.cpp's converters write
ALIGNMENTS = (32, 64)
OUT_TYPES = {
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}
QK8_0 = 32
GGML_QUANT_VERSION = 2
_BYTE_PIECE = re.compile(rb"^<0x[0-9A-Fa-f]{1,2}")  # the converter's sscanf("<0x%02hhX>")


def _name(kind: MODEL_TENSOR, layer: int | None = None) -> str:
    base = TENSOR_NAMES[kind]
    return f"{base.format(bid=layer) if layer is not None else base}.weight"


def vocabulary(pieces: list[bytes]) -> tuple[list[bytes], list[int]]:
    """llama2.c pieces -> GGUF token texts and types, by the llama2.c converter's rules."""
    tokens, types = [], []
    for i, piece in enumerate(pieces):
        if i == 0:
            piece, ttype = b"<unk>", TokenType.UNKNOWN
        elif i == 1:
            piece, ttype = b"<s>", TokenType.CONTROL
        elif i == 2:
            piece, ttype = b"</s>", TokenType.CONTROL
        elif not piece:
            ttype = TokenType.CONTROL
        elif _BYTE_PIECE.match(piece):
            ttype = TokenType.BYTE
        else:
            ttype = TokenType.NORMAL
        tokens.append(piece.replace(b" ", "\u2581".encode()))
        types.append(int(ttype))
    return tokens, types


def _stored(matrix: np.ndarray, out_type: GGMLQuantizationType) -> tuple[np.ndarray, GGMLQuantizationType]:
    """The bytes a float32 (rows, cols) matrix is written as, and the type it ends up with."""
    if out_type == GGMLQuantizationType.Q8_0 and matrix.shape[1] % QK8_0:
        return matrix, GGMLQuantizationType.F32  # rows that are not whole Q8_0 blocks stay F32
    return quantize(matrix, out_type), out_type


def convert_llama2c(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    out_type: str = "f32",
    tokenizer: str | os.PathLike | None = None,
    name: str | None = None,
    force: bool = False,
    alignment: int = DEFAULT_ALIGNMENT,
) -> dict:
    """Write ``src`` (a llama2.c checkpoint, any version) with its tokenizer as a GGUF file ``dst``.

    ``tokenizer`` defaults to ``tokenizer.bin`` beside the checkpoint. An existing ``dst`` is
    replaced only with ``force``, and never when it is ``src`` itself (or a link to it). The file is
    written under a temporary name in ``dst``'s folder and renamed into place when complete, so a
    failure leaves whatever was there before. Returns a summary: the tensor types written and the
    byte size. ``alignment``: where tensors start (``ALIGNMENTS``): 32, GGUF's default and what
    llama.cpp's converters write; 64 puts every tensor on a cache line, which pyllama's float32
    kernels read faster, and is written as ``general.alignment`` (llama.cpp reads such files, but its
    ``llama-quantize`` pads its output at 32 whatever the input says: quantise from a default file).
    """
    src, dst = Path(src), Path(dst)
    if out_type not in OUT_TYPES:
        raise InputError(f"--type {out_type!r}: choose one of {', '.join(OUT_TYPES)}")
    if alignment not in ALIGNMENTS:
        raise InputError(f"--alignment {alignment!r}: choose one of {', '.join(map(str, ALIGNMENTS))}")
    tokenizer = src.with_name("tokenizer.bin") if tokenizer is None else Path(tokenizer)
    _check_destination(src, dst, force, tokenizer)
    with open(src, "rb") as f:
        if f.read(4) == b"GGUF":
            raise CheckpointError(f"{src.name}: is already a GGUF file; convert reads llama2.c checkpoints")
    cfg, weights = load_llama2c(src)
    if not tokenizer.exists():
        raise InputError(f"{src.name}: no tokenizer.bin beside it: pass the model's tokenizer with -z")
    tok = Llama2cTokenizer.load(tokenizer, vocab_size=cfg.vocab_size)
    qtype, file_type = OUT_TYPES[out_type]
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; the GGUF gets the usual mode of a new file
    try:
        written = _write_gguf(tmp, cfg, weights, tok, qtype, file_type, name or src.stem, alignment)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"file": str(dst), "type": out_type, "bytes": dst.stat().st_size, "tensor_types": written}


def _check_destination(src: Path, dst: Path, force: bool, tokenizer: Path) -> None:
    """Refuse to overwrite an input, the checkpoint or its tokenizer (also through a symlink or hard
    link: ``pyllama.outputs``), or, without ``force``, any file."""
    check_outputs({"the input": src, "the tokenizer": tokenizer}, {"the GGUF": dst})
    if not dst.exists() and not dst.is_symlink():
        if not dst.parent.is_dir():
            raise InputError(f"{dst}: the folder {dst.parent} does not exist")
        return
    if not force:
        raise InputError(f"{dst}: exists already; pass --force (force=True) to replace it")


def _write_gguf(
    tmp: Path, cfg, weights, tok, qtype, file_type, model_name: str, alignment: int = DEFAULT_ALIGNMENT
) -> dict[str, int]:
    """Write the GGUF file ``tmp``; the count of tensors written per stored type."""
    tokens, token_types = vocabulary(tok.pieces)
    writer = GGUFWriter(tmp, "llama")
    arch = "llama"
    if alignment != DEFAULT_ALIGNMENT:
        # every tensor on a 64-byte boundary: the float32 kernels load 64 bytes at a time, and from
        # rows 32 bytes off a cache line each load spans two (110M F32 pp512 at 2 threads: 911-916
        # tok/s with every matrix 32 bytes off, 965-1,013 aligned)
        writer.add_custom_alignment(alignment)
    writer.add_name(model_name)
    writer.add_file_type(int(file_type))
    if qtype != GGMLQuantizationType.F32:
        writer.add_quantization_version(GGML_QUANT_VERSION)  # as llama-quantize writes it
    writer.add_context_length(cfg.seq_len)
    writer.add_embedding_length(cfg.dim)
    writer.add_feed_forward_length(cfg.hidden_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_block_count(cfg.n_layers)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(arch)
    writer.add_token_list(tokens)
    writer.add_token_scores(tok.scores)  # float32 values as Python floats: written back exactly
    writer.add_token_types(token_types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    written: dict[str, int] = {}

    def add(tname: str, array: np.ndarray, matrix: bool = True) -> None:
        array = np.ascontiguousarray(array, dtype=np.float32)
        data, stored = _stored(array, qtype) if matrix else (array, GGMLQuantizationType.F32)
        if stored == GGMLQuantizationType.F32:
            writer.add_tensor(tname, data)
        else:
            writer.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=stored)
        written[stored.name] = written.get(stored.name, 0) + 1

    emb = weights.token_embedding.dequantize()
    add(_name(MODEL_TENSOR.TOKEN_EMBD), emb)
    add(_name(MODEL_TENSOR.OUTPUT_NORM), weights.final_norm, matrix=False)
    add(
        _name(MODEL_TENSOR.OUTPUT),
        emb if weights.classifier is weights.token_embedding else weights.classifier.dequantize(),
    )
    for i, lw in enumerate(weights.layers):
        add(_name(MODEL_TENSOR.ATTN_Q, i), lw.wq.dequantize())
        add(_name(MODEL_TENSOR.ATTN_K, i), lw.wk.dequantize())
        add(_name(MODEL_TENSOR.ATTN_V, i), lw.wv.dequantize())
        add(_name(MODEL_TENSOR.ATTN_OUT, i), lw.wo.dequantize())
        add(_name(MODEL_TENSOR.ATTN_NORM, i), lw.attn_norm, matrix=False)
        add(_name(MODEL_TENSOR.FFN_GATE, i), lw.w1.dequantize())
        add(_name(MODEL_TENSOR.FFN_DOWN, i), lw.w2.dequantize())
        add(_name(MODEL_TENSOR.FFN_UP, i), lw.w3.dequantize())
        add(_name(MODEL_TENSOR.FFN_NORM, i), lw.ffn_norm, matrix=False)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return written
