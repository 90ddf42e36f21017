"""llama.cpp's ``llama-eval-callback`` logs, read back: every callback's tensor name, op, shape, the
values it printed and its sum.

A callback is a header line ``common_debug_cb_eval: NAME = (f32) OP(ARGS) = {ne0, ne1, ne2, ne3}``
(``ggml_debug:`` in older llama.cpp), the tensor's values (the first and last 3 along each
dimension, 4 decimals) and ``sum = S``. Names repeat (``Qcur-0`` is the product, its reshape and its
RoPE), so the callbacks are kept in order; ``last`` gives the last one of each name, which is what
the shared ``*.sums.json`` files hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_HEADER = re.compile(r"^(?:common_debug_cb_eval|ggml_debug):\s+(.+?) = \((\w+)\)\s+(\w+)\((.*)\) = \{([\d, ]+)\}\s*$")
_NUMBER = re.compile(r"-?(?:\d+\.\d*|\d+|inf|nan)", re.IGNORECASE)


@dataclass
class Callback:
    name: str
    op: str
    args: str  # the op's sources as printed: ``blk.0.attn_q.weight{640, 1024, 1, 1}, attn_norm-0{...}``
    ne: list[int]
    rows: list[list[float]] = field(default_factory=list)  # printed rows: first 3 and last 3 values each
    sum: float | None = None


def parse(path: str | Path) -> list[Callback]:
    """Every callback of the log at ``path``, in order."""
    out: list[Callback] = []
    current: Callback | None = None
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        header = _HEADER.match(line)
        if header:
            ne = [int(v) for v in header.group(5).split(",")]
            current = Callback(header.group(1), header.group(3), header.group(4), ne)
            out.append(current)
            continue
        text = line.strip()
        if current is None or not text:
            continue
        if text.startswith("sum = "):
            current.sum = float(text[len("sum = ") :])
            current = None
        elif text.startswith("[") and _NUMBER.search(text):
            current.rows.append([float(v) for v in _NUMBER.findall(text)])
    return out


def last(callbacks: list[Callback]) -> dict[str, Callback]:
    """The last callback of each name."""
    return {cb.name: cb for cb in callbacks}


def printed(values: np.ndarray) -> np.ndarray:
    """What the log prints of a tensor (numpy shape = ggml's ne reversed, up to 4 dimensions): along
    every dimension the first and last 3 indices (all of them when there are 6 or fewer), as rows of
    the innermost one (``common_debug_print_tensor``)."""
    for axis, size in enumerate(values.shape):
        if size > 6:
            values = np.take(values, [0, 1, 2, size - 3, size - 2, size - 1], axis=axis)
    return values.reshape(-1, values.shape[-1])


def unnamed_products(callbacks: list[Callback], weight: str) -> dict[int, str]:
    """Per layer, the name llama.cpp gave the product with ``blk.N.<weight>`` (``node_<id>`` when the
    graph names it nothing, as Gemma 3's attention output)."""
    pattern = re.compile(rf"^blk\.(\d+)\.{re.escape(weight)}\{{")
    return {int(m.group(1)): cb.name for cb in callbacks if cb.op == "MUL_MAT" and (m := pattern.match(cb.args))}


def products_of(callbacks: list[Callback], op: str, source: str) -> dict[int, str]:
    """Per layer N, the name of the ``op`` whose first source is ``source``-N (``SCALE(Qcur-N...)``)."""
    pattern = re.compile(rf"^{re.escape(source)}-(\d+)\{{")
    return {int(m.group(1)): cb.name for cb in callbacks if cb.op == op and (m := pattern.match(cb.args))}
