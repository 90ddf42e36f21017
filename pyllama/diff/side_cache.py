"""Recorded diff sides: one plugin's per-position outputs over one probe on one model file, kept on
disk and replayed by later diffs.

A study compares many plugins against one reference (``causal``), and every one of those diffs
would run the reference again. Everything a diff takes from a side (the float32 logits, each
layer's attention output, the per-position ledger, where NaN/Inf first appeared) depends only on
the model file, the engine's arithmetic, the plugin spec and the probe's tokens. It does not
depend on the thread count or the block size: the engine gives the same bits for all of them (the
block and thread tests check it). So side A, the reference of a diff, is recorded the first time
and replayed afterwards: the report is the same bit for bit (the tests compare every column), and
the diff runs one forward per position instead of two.

A record is keyed on:
- the model file's real path, size and modification time (weights changed in memory after loading
  are not seen: pass ``cache=False`` for those);
- the engine: pyllama's version and the size and modification time of every compiled module, so
  a rebuilt kernel never replays an old record;
- the plugin: built-in plugins only, by canonical spec (a plugin from a file or an entry point can
  change without its spec changing);
- the probe: a hash of every sequence's token ids.

Layout: ``<folder>/<key>/`` holds ``logits.npy``, ``att.npy``, ``mem.npy``, ``bad.npy`` and
``meta.json``, written in a temporary folder and renamed, so a record is whole or absent. Past the
size limit the least recently used records are removed; a record over half the limit is not kept.
The folder is ``$PYLLAMA_DIFF_CACHE``, else ``<download cache>/diff-sides`` (``$PYLLAMA_CACHE``,
default ``~/.cache/pyllama``); ``PYLLAMA_DIFF_CACHE=off`` turns recording and replay off by
default. The limit is ``$PYLLAMA_DIFF_CACHE_GIB`` (default 8).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.spec import PluginSpec
from pyllama.errors import InputError
from pyllama.hub import cache_dir
from pyllama.version import __version__

FORMAT = 1
CACHE_ENV = "PYLLAMA_DIFF_CACHE"
LIMIT_ENV = "PYLLAMA_DIFF_CACHE_GIB"
DEFAULT_GIB = 8.0
ARRAYS = ("logits", "att", "mem", "bad")
STALE_SECONDS = 86400  # a record still being written after a day was abandoned


def _limit_gib() -> float:
    text = os.environ.get(LIMIT_ENV) or str(DEFAULT_GIB)
    try:
        gib = float(text)
    except ValueError:
        gib = -1.0
    if not gib >= 0:
        raise InputError(f"{LIMIT_ENV}={text}: not a size in GiB; set a number >= 0 (0 keeps no records) or unset it")
    return gib


@lru_cache(maxsize=1)
def engine_fingerprint() -> str:
    """pyllama's version and the size and mtime of every compiled module (a rebuild changes it)."""
    root = Path(__file__).resolve().parents[1]  # the pyllama package
    parts = [__version__]
    for path in sorted(root.rglob("*.so")) + sorted(root.rglob("*.pyd")):
        st = path.stat()
        parts.append(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def model_fingerprint(path: str | os.PathLike) -> str | None:
    """The model file's real path, size and mtime; None when there is no such file."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, TypeError, ValueError):
        return None
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def recorded_spec(side: PluginSpec | Attention) -> str | None:
    """The spec a side's record is keyed on: a built-in plugin's canonical spec (the one its
    report shows); None for an instance, a file, an entry point or a registered class."""
    return side.canonical if isinstance(side, PluginSpec) and side.builtin else None


def probe_fingerprint(segments: Sequence[np.ndarray], events: Sequence[int] = ()) -> str:
    """The tokens of every sequence, and where each one's compression event falls (a record holds
    the rows its plugin gave with those events)."""
    h = hashlib.sha256()
    for tokens in segments:
        ids = np.ascontiguousarray(tokens, dtype=np.int32)
        h.update(len(ids).to_bytes(8, "little"))
        h.update(ids.tobytes())
    if any(e >= 0 for e in events):
        h.update(np.asarray(events, dtype=np.int64).tobytes())
    return h.hexdigest()


@dataclass
class SideRecord:
    """One recorded side: rows ``offsets[s] + i`` hold position i of sequence s (i < held[s])."""

    logits: np.ndarray  # float32 [rows, vocab]
    att: np.ndarray  # float32 [rows, n_layers, q_dim]
    mem: np.ndarray  # int64 [rows]: memory_bytes() after each position
    bad: np.ndarray  # int32 [rows]: the engine's first non-finite layer, -1 none
    max_positions: int
    held: list[int]

    @property
    def offsets(self) -> list[int]:
        return first_rows(self.held)


def record_layout(rows: int, vocab: int, att_shape: tuple[int, int]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array of a record of ``rows`` rows: its shape and dtype (what is written, checked and sized)."""
    return {
        "logits": ((rows, vocab), np.dtype(np.float32)),
        "att": ((rows, *att_shape), np.dtype(np.float32)),
        "mem": ((rows,), np.dtype(np.int64)),
        "bad": ((rows,), np.dtype(np.int32)),
    }


def first_rows(held: list[int]) -> list[int]:
    """Each sequence's first row in a record holding ``held[s]`` rows of sequence s."""
    return [int(x) for x in np.cumsum([0, *held[:-1]])] if held else []


class RecordWriter:
    """A record being written: the rows come in order (sequence after sequence, block after block),
    so each array is one .npy file written front to back (an order of magnitude cheaper than filling
    a fresh memory map, whose every page is first zeroed by a fault)."""

    def __init__(self, folder: Path, held: list[int], max_positions: int, vocab: int, att_shape: tuple[int, int]):
        self.folder, self.held, self.max_positions = folder, held, max_positions
        self.rows = sum(held)
        self.offsets = first_rows(held)
        self.next_row = 0
        self.in_order = True
        self.layout = record_layout(self.rows, vocab, att_shape)
        self.files = {}
        for name, (shape, dtype) in self.layout.items():
            f = open(folder / f"{name}.npy", "wb")  # noqa: SIM115 (closed by close() or discard())
            header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            np.lib.format.write_array_header_1_0(f, header)
            self.files[name] = f

    def append(self, row: int, **arrays: np.ndarray) -> None:
        """Rows ``row ..`` of every array; a row out of order spoils the record (it is then not kept)."""
        if row != self.next_row:
            self.in_order = False
        if not self.in_order:
            return
        for name, (_, dtype) in self.layout.items():
            self.files[name].write(np.ascontiguousarray(arrays[name], dtype=dtype).data)
        self.next_row = row + arrays["mem"].shape[0]

    def close(self) -> bool:
        """Close the files; whether every row was written in order."""
        for f in self.files.values():
            f.close()
        return self.in_order and self.next_row == self.rows


class SideCache:
    """The folder of recorded sides, at most ``max_bytes`` in all."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int | None = None) -> None:
        self.folder = Path(folder).expanduser()
        if max_bytes is None:
            max_bytes = int(_limit_gib() * 2**30)
        self.max_bytes = int(max_bytes)

    @classmethod
    def from_option(cls, option: bool | str | os.PathLike | SideCache | None) -> SideCache | None:
        """None: ``$PYLLAMA_DIFF_CACHE``'s folder, else the default one, or none when it says
        ``off``; True: the same, but a folder even then; False: none; a path: that folder."""
        if isinstance(option, SideCache):
            return option
        if option is False:
            return None
        if option is None or option is True:
            env = os.environ.get(CACHE_ENV, "")
            off = env.lower() in ("off", "0", "no", "false")
            if off and option is None:
                return None
            if env and not off:
                return cls(env)
            return cls(cache_dir() / "diff-sides")
        return cls(option)

    @staticmethod
    def key(model: str, spec: str, config_text: str, probe: str) -> str:
        text = json.dumps([FORMAT, engine_fingerprint(), model, spec, config_text, probe])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def open(self, key: str, rows_of, vocab: int, att_shape: tuple[int, int]) -> SideRecord | None:
        """The record under ``key`` (its arrays memory-mapped), or None; a damaged one is removed.
        ``rows_of(max_positions)``: the rows per sequence that a side holding that many positions has."""
        folder = self.folder / key
        try:
            meta = json.loads((folder / "meta.json").read_text())
            arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
            held = [int(n) for n in meta["held"]]
            layout = record_layout(sum(held), vocab, att_shape)
            ok = held == rows_of(int(meta["max_positions"])) and all(
                (arrays[name].shape, arrays[name].dtype) == layout[name] for name in ARRAYS
            )
        except FileNotFoundError:
            return None
        except Exception:
            ok = False
        if not ok:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        os.utime(folder / "meta.json")  # least recently used goes first
        return SideRecord(**arrays, max_positions=int(meta["max_positions"]), held=held)

    def start(self, held: list[int], max_positions: int, vocab: int, att_shape: tuple[int, int]) -> RecordWriter | None:
        """A new record being written (in a temporary folder), or None when it would be over half the limit."""
        rows = sum(held)
        size = sum(math.prod(shape) * dtype.itemsize for shape, dtype in record_layout(rows, vocab, att_shape).values())
        if rows == 0 or size > self.max_bytes // 2:
            return None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".writing-", dir=self.folder))
            return RecordWriter(tmp, held, max_positions, vocab, att_shape)
        except OSError:
            return None  # an unwritable cache costs the replay, not the diff

    def finish(self, writer: RecordWriter, key: str) -> None:
        """Close a written record and put it under ``key``; then keep the folder under the limit."""
        tmp = writer.folder
        try:
            if not writer.close():
                raise OSError("the record's rows were not written in order")
            meta = {"format": FORMAT, "max_positions": writer.max_positions, "held": writer.held}
            (tmp / "meta.json").write_text(json.dumps(meta))
            os.rename(tmp, self.folder / key)
        except OSError:  # another process put the same record there first, or the disk is full
            shutil.rmtree(tmp, ignore_errors=True)
            return
        self._trim()

    @staticmethod
    def discard(writer: RecordWriter) -> None:
        writer.close()
        shutil.rmtree(writer.folder, ignore_errors=True)

    def _trim(self) -> None:
        entries = []
        for folder in self.folder.iterdir():
            meta = folder / "meta.json"
            if folder.name.startswith(".writing-") and time.time() - folder.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(folder, ignore_errors=True)  # left by a diff that was killed while recording
            if folder.name.startswith(".") or not meta.exists():
                continue
            size = sum(f.stat().st_size for f in folder.iterdir())
            entries.append((meta.stat().st_mtime_ns, size, folder))
        total = sum(size for _, size, _ in entries)
        for _, size, folder in sorted(entries):
            if total <= self.max_bytes:
                break
            shutil.rmtree(folder, ignore_errors=True)
            total -= size
