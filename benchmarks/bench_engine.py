"""Decode speed of pyllama next to llama2.c's run.c, a numpy forward pass and the BLAS streaming limit.

Everything is measured in the same run, at the same thread count, on seeded random-weight
checkpoints of the tinyllamas shapes (speed does not depend on weight values), and reported as
ratios. Decode reads every weight once per token, so the "streaming limit" is how fast numpy's
BLAS matrix-vector product streams the same matrices: pyllama's tok/s as a fraction of it says how
close to memory bandwidth the engine runs.

    python benchmarks/bench_engine.py --runc path/to/llama2.c/run --threads 2

``--runc`` takes llama2.c's run.c built with its Makefile's ``runomp`` target (OpenMP); build it
yourself from llama2.c's sources. Without it the run.c column is left out. ``--runc-scalar`` adds a
second run.c column for a build without ``-Ofast -march=native`` (``gcc -O3 -fopenmp run.c -lm``),
where gcc keeps run.c's matmul scalar.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))

from numpy_forward import NumpyForward  # noqa: E402
from random_checkpoints import SHARED, random_checkpoint  # noqa: E402

from pyllama.model import Model  # noqa: E402
from pyllama.tokenizer import load_tokenizer  # noqa: E402

SHAPES = ("stories15M", "stories42M", "stories110M")
PROMPT = "Once upon a time"


def pyllama_tok_s(model: Model, steps: int, attention) -> float:
    out = model.generate(PROMPT, steps=steps, temperature=0.0, ignore_eos=True, attention=attention)
    return out.tok_per_s


def runc_tok_s(binary: str, ckpt: Path, tokenizer: Path, steps: int, threads: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(
        [binary, str(ckpt), "-z", str(tokenizer), "-t", "0", "-n", str(steps), "-i", PROMPT],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    match = re.search(r"achieved tok/s: ([0-9.]+)", proc.stderr)
    if not match:
        raise RuntimeError(f"run.c printed no tok/s: {proc.stderr[-200:]}")
    return float(match.group(1))


def numpy_tok_s(model: Model, steps: int) -> float:
    ref = NumpyForward(model.config, model.weights)
    ref.forward(1, 0)
    t0 = time.perf_counter()
    n = min(steps, model.config.seq_len) - 1
    for pos in range(1, n + 1):
        ref.forward(1, pos)
    return n / (time.perf_counter() - t0)


def streaming_limit(model: Model, repeats: int = 5) -> tuple[float, float]:
    """(tok/s-equivalent, GB/s) of numpy's BLAS streaming one token's worth of weight matrices."""
    mats = [
        np.asarray(t.data).reshape(t.rows, t.cols)
        for t in model.weights.tensors()
        if t is not model.weights.token_embedding or model.config.shared_classifier
    ]
    xs = {m.shape[1]: np.ones(m.shape[1], np.float32) for m in mats}
    nbytes = sum(m.nbytes for m in mats)
    for m in mats:  # fault the pages in
        m @ xs[m.shape[1]]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for m in mats:
            m @ xs[m.shape[1]]
        best = min(best, time.perf_counter() - t0)
    return 1.0 / best, nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runc", help="llama2.c run binary built with `make runomp` (omit to skip the column)")
    ap.add_argument("--runc-scalar", help="run.c built with `gcc -O3 -fopenmp` (scalar matmul; optional)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="best of N for every figure")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "pyllama-bench")
    ap.add_argument("--tokenizer", type=Path, default=SHARED / "models" / "tokenizer.bin")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    with threadpool_limits(args.threads):
        for shape in args.shapes:
            ckpt = random_checkpoint(shape, args.workdir)
            t0 = time.perf_counter()
            model = Model.load(ckpt, threads=args.threads)  # the memory map and header checks only
            load_ms = (time.perf_counter() - t0) * 1e3
            model.tokenizer = load_tokenizer(args.tokenizer, vocab_size=model.config.vocab_size)
            pl = pl_reg = rc = rcs = 0.0
            for _ in range(args.repeats):  # interleaved, best of N, so drift hits both alike
                pl = max(pl, pyllama_tok_s(model, args.steps, None))
                pl_reg = max(pl_reg, pyllama_tok_s(model, args.steps, "causal"))
                if args.runc:
                    rc = max(rc, runc_tok_s(args.runc, ckpt, args.tokenizer, args.steps, args.threads))
                if args.runc_scalar:
                    rcs = max(rcs, runc_tok_s(args.runc_scalar, ckpt, args.tokenizer, args.steps, args.threads))
            npf = numpy_tok_s(model, min(args.steps, 64))
            limit, gbps = streaming_limit(model)
            row = {
                "shape": shape,
                "threads": args.threads,
                "load_ms": round(load_ms, 2),
                "weights_MB": round(sum(t.nbytes for t in model.weights.tensors()) / 1e6, 1),
                "pyllama_tok_s": round(pl, 1),
                "pyllama_registry_causal_tok_s": round(pl_reg, 1),
                "runc_tok_s": round(rc, 1) if rc else None,
                "numpy_tok_s": round(npf, 1),
                "stream_limit_tok_s": round(limit, 1),
                "stream_GB_s": round(gbps, 1),
                "runc_scalar_tok_s": round(rcs, 1) if rcs else None,
                "vs_runc": round(pl / rc, 2) if rc else None,
                "vs_runc_scalar": round(pl / rcs, 2) if rcs else None,
                "vs_numpy": round(pl / npf, 2),
                "of_stream_limit": round(pl / limit, 3),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    cols = [
        "shape",
        "load_ms",
        "pyllama_tok_s",
        "pyllama_registry_causal_tok_s",
        "runc_tok_s",
        "runc_scalar_tok_s",
        "numpy_tok_s",
        "stream_limit_tok_s",
        "vs_runc",
        "vs_runc_scalar",
        "vs_numpy",
        "of_stream_limit",
    ]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
