"""Time to a GGUF vocabulary's tokenizer: pyllama's bulk reader vs gguf-py's ``GGUFReader``.

Each measurement is a fresh Python process (nothing cached in the interpreter), timed from before
the call to after it, wall and CPU. "cold": the file is first dropped from the page cache
(``posix_fadvise(DONTNEED)`` on that file only); "warm": it was just read. The peer is
``gguf.GGUFReader(path)``, the per-element parse pyllama used before, which is only the parse: it
builds no tokenizer. ``--python`` adds another interpreter's ``pyllama`` (e.g. an older checkout)
as a second peer.

``--llama-simple PATH`` adds llama.cpp as a peer: its ``llama-simple`` example run on the same file
(one token from a one-word prompt), a fresh process timed as a whole, wall and CPU. For a model
that is the whole load (vocabulary, tensors, context) plus one token; for a vocabulary-only file
llama.cpp stops with "tensor 'token_embd.weight' not found" right after reading the vocabulary,
so the figure is its vocabulary load plus process start. llama.cpp's own ``load time`` line is
recorded when printed.

    python benchmarks/bench_vocab.py ../shared/models/vocab/ggml-vocab-qwen2.gguf \\
        ../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf --repeats 3
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

TIMED = r"""
import sys, time
path, what = sys.argv[1], sys.argv[2]
if what == "gguf-py":
    import gguf
    t0, c0 = time.perf_counter(), time.process_time()
    gguf.GGUFReader(path)
else:
    from pyllama.tokenizer import load_tokenizer
    t0, c0 = time.perf_counter(), time.process_time()
    load_tokenizer(path)
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def measure(python: str, path: str, what: str, cold: bool, repeats: int) -> tuple[float, float]:
    """Best (wall, cpu) seconds of ``repeats`` fresh processes."""
    runs = []
    for _ in range(repeats):
        _evict(path) if cold else _warm(path)
        # cwd: away from any checkout, so each interpreter imports its own installed pyllama
        out = subprocess.run(
            [python, "-c", TIMED, os.path.abspath(path), what],
            capture_output=True,
            text=True,
            check=True,
            cwd=tempfile.gettempdir(),
        )
        runs.append(tuple(float(x) for x in out.stdout.split()))
    return min(r[0] for r in runs), min(r[1] for r in runs)


def measure_llama(binary: str, path: str, cold: bool, repeats: int) -> tuple[float, float, float | None]:
    """Best (wall, cpu) seconds of ``repeats`` llama-simple processes, and its best ``load time`` in s."""
    walls, cpus, loads = [], [], []
    for _ in range(repeats):
        _evict(path) if cold else _warm(path)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([binary, "-m", path, "-n", "1", "-t", "1", "Hello"], capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        found = re.search(r"load time =\s*([0-9.]+) ms", proc.stderr)
        if found:
            loads.append(float(found.group(1)) / 1e3)
    return min(walls), min(cpus), min(loads) if loads else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--python", default=None, help="another interpreter whose pyllama is a second peer")
    parser.add_argument("--llama-simple", help="llama.cpp's llama-simple binary: llama.cpp as a peer")
    parser.add_argument("--no-gguf-py", action="store_true", help="skip the gguf-py peer (18 s per run on qwen2)")
    args = parser.parse_args()
    peers = [("pyllama", sys.executable, "pyllama")]
    if args.python:
        peers.append(("pyllama (--python)", args.python, "pyllama"))
    if not args.no_gguf_py:
        peers.append(("gguf-py GGUFReader", sys.executable, "gguf-py"))
    print("| file | reader | cold wall s | cold cpu s | warm wall s | warm cpu s | cpu vs pyllama |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for path in args.files:
        base = None
        for label, python, what in peers:
            cold = measure(python, path, what, True, args.repeats)
            warm = measure(python, path, what, False, args.repeats)
            base = base or warm[1]
            cells = [os.path.basename(path), label, *(f"{t:.3f}" for t in (*cold, *warm)), f"{warm[1] / base:.1f}x"]
            print("| " + " | ".join(cells) + " |")
        if args.llama_simple:
            cold = measure_llama(args.llama_simple, path, True, args.repeats)
            warm = measure_llama(args.llama_simple, path, False, args.repeats)
            load = "" if warm[2] is None else f" (its load time {warm[2]:.3f} s)"
            cells = [
                os.path.basename(path),
                "llama.cpp llama-simple" + load,
                *(f"{t:.3f}" for t in (*cold[:2], *warm[:2])),
            ]
            print("| " + " | ".join(cells) + f" | {warm[1] / base:.1f}x |")


if __name__ == "__main__":
    main()
