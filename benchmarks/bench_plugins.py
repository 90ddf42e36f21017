"""Attention plugins and the diff harness: what a plugin costs, and how long a diff takes.

1. Decode tok/s of the engine with ``causal`` built directly (``Engine(..., Causal(), ...)``, the
   engine's default) and through the registry (``--attention causal``), plus the other built-ins
   and the pure-Python example plugin, as ratios to the first. A native plugin adds no Python call
   per layer, so the registry's ``causal`` runs at the same speed.
2. Seconds for a teacher-forced ``diff causal sliding:64`` over the ``standard`` probe on the real
   stories260K and on a random-weight checkpoint of the stories15M shape (32,000-token vocabulary,
   context 256; speed does not depend on weight values).

Runs are interleaved and repeated; the median is reported.

    python benchmarks/bench_plugins.py --threads 1 --json bench_plugins.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from random_checkpoints import REPO, SHARED, random_checkpoint

from pyllama.attention.registry import create_plugin
from pyllama.engine import Engine
from pyllama.model import Model
from pyllama.plugins.causal import Causal
from pyllama.sampler import Sampler

MODELS = SHARED / "models"
EXAMPLE = REPO / "experiments" / "random_evict.py"
NATIVE_EXAMPLE = REPO / "experiments" / "random_evict_native.pyx"


def decode_tok_s(model: Model, make_plugin, steps: int, threads: int) -> float:
    """Greedy decode of ``steps`` positions from BOS, timed like run.c (after the first forward)."""
    engine = Engine(model.config, model.weights, make_plugin(), threads)
    out = np.zeros(steps + 1, dtype=np.int32)
    prompt = np.array([1], dtype=np.int32)
    _, _, seconds, pos, _ = engine.generate_into(
        prompt, steps, Sampler(model.config.vocab_size, 0.0, 0.9, 1), out, None, None
    )
    return (pos - 1) / seconds


def bench_decode(model: Model, threads: int, repeats: int) -> dict:
    steps = model.config.seq_len
    variants = {
        "causal (Engine default, built directly)": lambda: Causal(),
        "causal (registry: --attention causal)": lambda: create_plugin("causal"),
        "sliding:64": lambda: create_plugin("sliding:64"),
        "sink:4,60": lambda: create_plugin("sink:4,60"),
        "sink:4,60,shift": lambda: create_plugin("sink:4,60,shift"),
        "random_evict:64 (pure Python)": lambda: create_plugin(f"{EXAMPLE}:RandomEvict:budget=64"),
        "random_evict_native:64 (Cython file)": lambda: create_plugin(f"{NATIVE_EXAMPLE}:RandomEvictNative:budget=64"),
    }
    runs: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, make in variants.items():
            runs[name].append(decode_tok_s(model, make, steps, threads))
    med = {k: statistics.median(v) for k, v in runs.items()}
    base = med["causal (Engine default, built directly)"]
    return {k: {"tok_s": round(v, 1), "ratio": round(v / base, 3)} for k, v in med.items()}


def bench_diff(model: Model, threads: int, repeats: int, a: str = "causal", b: str = "sliding:64") -> dict:
    secs = []
    for _ in range(repeats):
        t = time.perf_counter()
        report = model.diff(a, b, probe="standard", threads=threads, progress=False)
        secs.append(time.perf_counter() - t)
    return {
        "pair": f"{a} vs {b}",
        "positions": report.n_positions,
        "seconds": round(statistics.median(secs), 2),
        "positions_per_s": round(report.n_positions / statistics.median(secs), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    results: dict = {"threads": args.threads}
    small = Model.load(MODELS / "stories260K.bin", tokenizer=MODELS / "tok512.bin", threads=args.threads)
    results["decode stories260K"] = bench_decode(small, args.threads, args.repeats)
    results["diff stories260K"] = bench_diff(small, args.threads, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = random_checkpoint("stories15M", Path(tmp))
        m15 = Model.load(ckpt, tokenizer=MODELS / "tokenizer.bin", threads=args.threads)
        results["decode stories15M-shaped"] = bench_decode(m15, args.threads, args.repeats)
        results["diff stories15M-shaped"] = bench_diff(m15, args.threads, args.repeats)
        del m15
    for section, value in results.items():
        if isinstance(value, dict) and section.startswith("decode"):
            print(f"\n{section} (threads={args.threads}): tok/s, ratio to the engine default")
            for name, r in value.items():
                print(f"  {name:<42} {r['tok_s']:>9.1f}  {r['ratio']:.3f}")
        elif isinstance(value, dict):
            print(
                f"\n{section} (threads={args.threads}): {value['pair']} over the standard probe: "
                f"{value['positions']} positions in {value['seconds']} s ({value['positions_per_s']} positions/s)"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
