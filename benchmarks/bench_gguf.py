"""GGUF decode speed, F32 and Q8_0: pyllama next to llama.cpp's ``llama-bench``, in one run.

Seeded random-weight checkpoints of the tinyllamas shapes (speed does not depend on weight values)
are written with the shared tool, converted with ``pyllama convert`` to F32 and Q8_0 GGUF files, and
each file is timed by both engines at the same thread count: llama.cpp's text-generation test
(``llama-bench -p 0 -n 128``: 128 tokens decoded one at a time from an empty context) and pyllama
generating 128 tokens after BOS (``Generation.tok_per_s``, timed from the end of the first forward
pass as run.c does). The two engines take turns, one run each, ``--repeats`` times per file, and
each reports its best run: on a shared machine the fastest run is the one least disturbed by other
processes, and taking turns gives both engines the same quiet moments. Results are ratios measured
in the same run.

    python benchmarks/bench_gguf.py --llama-bench path/to/llama-bench --threads 2

``--llama-bench`` takes a llama-bench binary you built from llama.cpp's sources (CPU backend;
leave AMX off: on CPUs with AMX, llama.cpp's AMX F16 kernel mis-computes rows whose length is not a
multiple of 16). Without it only pyllama's numbers are printed. Models and GGUF files go to
``--workdir`` (default: a cache folder outside the repository) and are reused between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SHAPES = ("stories15M", "stories42M", "stories110M")
TYPES = ("f32", "q8_0")

from random_checkpoints import SHARED, random_checkpoint  # noqa: E402

from pyllama.checkpoint import load_checkpoint  # noqa: E402
from pyllama.model import Model  # noqa: E402


def default_workdir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "pyllama" / "bench-gguf"


def make_gguf(shape: str, qtype: str, workdir: Path, tokenizer: Path) -> Path:
    ckpt = random_checkpoint(shape, workdir)
    out = workdir / f"{shape}-random-{qtype}.gguf"
    if not out.exists() or out.stat().st_mtime < ckpt.stat().st_mtime:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pyllama.cli",
                "convert",
                str(ckpt),
                str(out),
                "--type",
                qtype,
                "-z",
                str(tokenizer),
            ],
            check=True,
            capture_output=True,
        )
    return out


def pyllama_tok_s(model: Model, n_gen: int, threads: int) -> float:
    """One run: tok/s of ``n_gen`` tokens decoded after BOS."""
    return model.generate([1], steps=n_gen + 1, temperature=0.0, ignore_eos=True, threads=threads).tok_per_s


def llama_bench_tok_s(binary: str, path: Path, n_gen: int, threads: int) -> float:
    """One run of llama-bench's tg test (it warms up first by itself)."""
    cmd = [binary, "-m", str(path), "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", "1", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    (result,) = [r for r in json.loads(proc.stdout) if r.get("n_gen") == n_gen]
    return max(result["samples_ts"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", help="path to llama.cpp's llama-bench binary (CPU build)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--tokens", type=int, default=128, help="tokens to decode per run (llama-bench -n)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per engine and file (the best counts)")
    ap.add_argument("--workdir", type=Path, default=default_workdir())
    ap.add_argument(
        "--tokenizer",
        type=Path,
        default=SHARED / "models" / "tokenizer.bin",
        help="the 32,000-token llama2.c tokenizer.bin (the GGUF files need a vocabulary)",
    )
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.tokenizer.exists():
        ap.error(f"{args.tokenizer}: not found; pass the llama2.c tokenizer.bin with --tokenizer")

    rows = []
    for shape in args.shapes.split(","):
        for qtype in TYPES:
            path = make_gguf(shape, qtype, args.workdir, args.tokenizer)
            cfg, weights = load_checkpoint(path)
            model = Model(cfg, weights, None, str(path), threads=args.threads)
            pyllama_tok_s(model, min(args.tokens, 16), args.threads)  # warm-up
            ours, theirs = 0.0, None
            for _ in range(args.repeats):
                ours = max(ours, pyllama_tok_s(model, args.tokens, args.threads))
                if args.llama_bench:
                    theirs = max(theirs or 0.0, llama_bench_tok_s(args.llama_bench, path, args.tokens, args.threads))
            rows.append(
                {
                    "model": shape,
                    "type": qtype.upper(),
                    "mib": path.stat().st_size / 2**20,
                    "pyllama_tok_s": ours,
                    "llama_cpp_tok_s": theirs,
                    "ratio": ours / theirs if theirs else None,
                }
            )
            print(
                f"  {shape} {qtype}: pyllama {ours:.1f} tok/s" + (f", llama.cpp {theirs:.1f} tok/s" if theirs else ""),
                file=sys.stderr,
            )

    print(f"\ndecode tok/s, {args.tokens} tokens, {args.threads} threads, best of {args.repeats}\n")
    print("| model | type | MiB | pyllama tok/s | llama.cpp tok/s | pyllama / llama.cpp |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        theirs = f"{r['llama_cpp_tok_s']:.1f}" if r["llama_cpp_tok_s"] else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        print(f"| {r['model']} | {r['type']} | {r['mib']:.1f} | {r['pyllama_tok_s']:.1f} | {theirs} | {ratio} |")
    print(
        "\nQ8_0 / F32 decode speed in pyllama: "
        + ", ".join(
            f"{shape} {q['pyllama_tok_s'] / f['pyllama_tok_s']:.2f}x"
            for shape in args.shapes.split(",")
            for f in [r for r in rows if r["model"] == shape and r["type"] == "F32"]
            for q in [r for r in rows if r["model"] == shape and r["type"] == "Q8_0"]
        )
    )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
