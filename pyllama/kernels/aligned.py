"""Zeroed arrays that start on a 64-byte cache line, for the buffers the kernels read in vectors, and
large outputs in small pages.

numpy places a large array 16 bytes past a page boundary (its allocations come from malloc, which
keeps a 16-byte header there), so a row of 16 floats loaded from it spans two cache lines, and
AVX-512 loads that span lines cost twice: a block's float32 products ran at 0.65-0.75 of their
speed on aligned rows (42M F32 pp512 at 2 threads: 2,428-2,503 tok/s with the engine's
activations 16 bytes off, 2,730-2,828 aligned). Rows whose width is a multiple of 16 values stay
aligned after the first.
"""

from __future__ import annotations

import mmap

import numpy as np

LINE = 64


def zeros_aligned(shape: int | tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """``np.zeros(shape, dtype)`` whose first element starts a 64-byte line (the array keeps its
    buffer alive through ``.base``)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(n + LINE, dtype=np.uint8)
    start = -raw.ctypes.data % LINE
    return raw[start : start + n].view(dtype).reshape(shape)


def zeros_small_pages(shape: int | tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """``np.zeros(shape, dtype)`` in pages of its own (page-aligned), kept out of transparent huge pages:
    for a large output that one call fills. numpy asks the kernel for huge pages on large arrays, and
    finding free ones stalled it: every other 512-position ``Model.logits`` of SmolLM2 (a 100 MB
    output) spent 0.27 s more in the kernel (13%). The array keeps its mapping alive through ``.base``."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    if n == 0:
        return np.zeros(shape, dtype)
    buffer = mmap.mmap(-1, n)  # anonymous: zero-filled, each page on its first touch
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)
