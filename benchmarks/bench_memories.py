"""Decode cost of the experimental memories next to causal's, at the same positions.

Two measurements on a stories15M-shaped model (a seeded random-weight checkpoint: speed does not
depend on weight values), both over ``--positions`` positions:

* **attention alone** — each plugin bound to the model's shapes and fed random post-RoPE q, k, v
  through every layer, position after position; the time of one position (all layers) is what the
  plugin adds to a decode step. Cheap, so it is repeated more and is the cleaner number.
* **whole decode step** — one engine per plugin, teacher-forced with random tokens, every
  ``forward`` timed: what a user sees, matmuls and classifier included.

Times are averaged over bins of ``--bin`` positions (a multiple of kmeans' ``recluster``, so its
periodic clustering is amortised inside a bin); runs are interleaved ``--repeats`` times and the
minimum per bin is kept (other work on the machine only ever adds time). Reported per bin: ms per
position and the ratio to causal at the same position. The crossover is the first bin from which a
plugin stays cheaper than causal.

    python benchmarks/bench_memories.py --positions 4096 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from random_checkpoints import random_checkpoint

from pyllama.attention.registry import create_plugin
from pyllama.engine import Pool
from pyllama.model import Model


def attention_times(config, spec: str, n: int, threads: int, seed: int = 0) -> np.ndarray:
    """Seconds per position of ``spec``'s attend() over all layers, random inputs."""
    plugin = create_plugin(spec)
    pool = Pool(threads)
    plugin._configure(config, pool)
    plugin.init(config, pool)
    rng = np.random.default_rng(seed)
    m = 97  # a pool of random vectors, cycled (a prime, so q, k, v pairings vary)
    q = rng.standard_normal((m, config.q_dim)).astype(np.float32)
    kv = rng.standard_normal((m, config.kv_dim)).astype(np.float32)
    out = np.zeros(config.q_dim, dtype=np.float32)
    times = np.zeros(n)
    clock = time.perf_counter
    attend = plugin.attend
    for pos in range(n):
        qq, kk, vv = q[pos % m], kv[pos % m], kv[(pos * 7 + 3) % m]
        t0 = clock()
        for layer in range(config.n_layers):
            attend(layer, pos, qq, kk, vv, out)
        times[pos] = clock() - t0
    return times


def step_times(model: Model, spec: str, tokens: np.ndarray, threads: int) -> np.ndarray:
    """Seconds of each forward(token, pos), positions 0 .. len(tokens) - 1."""
    engine = model.engine(spec, threads)
    out = np.zeros(len(tokens))
    clock = time.perf_counter
    for pos in range(len(tokens)):
        t0 = clock()
        engine.forward(int(tokens[pos]), pos)
        out[pos] = clock() - t0
    return out


def crossover(ratio: np.ndarray, ends: np.ndarray) -> int | None:
    """The first bin end from which ``ratio`` stays below 1, or None."""
    below = ratio < 1.0
    for i in range(len(below)):
        if below[i:].all():
            return int(ends[i])
    return None


def report(title: str, ms: dict[str, np.ndarray], plugins: list[str], ends: np.ndarray, B: int) -> dict:
    print(f"\n{title}\n")
    print("| positions | causal ms | " + " | ".join(f"{s} ms (x causal)" for s in plugins) + " |")
    print("|" + "---:|" * (2 + len(plugins)))
    for i, end in enumerate(ends):
        cells = [f"{ms[s][i]:.3f} ({ms[s][i] / ms['causal'][i]:.2f})" for s in plugins]
        print(f"| {end - B}..{end - 1} | {ms['causal'][i]:.3f} | " + " | ".join(cells) + " |")
    out = {}
    print()
    for s in plugins:
        c = crossover(ms[s] / ms["causal"], ends)
        out[s] = c
        print(
            f"{s}: cheaper than causal for good from the bin ending at position "
            f"{c if c is not None else 'never'}; at the last bin {ms[s][-1] / ms['causal'][-1]:.2f}x causal"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="stories15M")
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--bin", type=int, default=256, help="positions per reported bin")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of the attention-alone measurement")
    ap.add_argument("--step-repeats", type=int, default=2, help="interleaved runs of the whole-step measurement")
    ap.add_argument("--no-steps", action="store_true", help="skip the (slow) whole-step measurement")
    ap.add_argument(
        "--plugins",
        nargs="+",
        default=["kmeans", "lattice", "tiered", "sink"],
        help="specs compared with causal (a cache of --positions is added where one is needed)",
    )
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "pyllama-bench")
    ap.add_argument("--json", type=Path, help="also write the per-bin numbers here")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    N, B = args.positions, args.bin
    model = Model.load(random_checkpoint(args.shape, args.workdir), threads=args.threads)
    cfg = model.config

    def full(spec: str) -> str:  # plugins whose capacity is a number of positions get N
        name = spec.split(":")[0]
        if name in ("causal", "kmeans", "tiered") and "positions=" not in spec:
            return f"{spec}{',' if ':' in spec else ':'}positions={N}"
        return spec

    specs = ["causal"] + list(args.plugins)
    n_bins = N // B
    ends = np.arange(1, n_bins + 1) * B

    def binned(t: np.ndarray) -> np.ndarray:
        return t[: n_bins * B].reshape(n_bins, B).mean(axis=1) * 1e3

    print(
        f"{args.shape} shape: dim {cfg.dim}, {cfg.n_layers} layers, {cfg.n_heads} heads of {cfg.head_dim}, "
        f"context {cfg.seq_len}; {args.threads} thread(s); plugins: " + ", ".join(full(s) for s in specs)
    )
    att = {s: np.full(N, np.inf) for s in specs}
    for r in range(args.repeats):
        for spec in specs:
            t0 = time.perf_counter()
            att[spec] = np.minimum(att[spec], attention_times(cfg, full(spec), N, args.threads))
            print(f"  attention {r + 1}/{args.repeats} {full(spec)}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    att_ms = {s: binned(att[s]) for s in specs}
    result = {
        "shape": args.shape,
        "threads": args.threads,
        "bin": B,
        "ends": ends.tolist(),
        "specs": {s: full(s) for s in specs},
        "attention_ms": {s: v.tolist() for s, v in att_ms.items()},
    }
    result["attention_crossover"] = report(
        f"attention alone (all {cfg.n_layers} layers), ms per position, best of {args.repeats}, "
        f"mean over [end - {B}, end)",
        att_ms,
        args.plugins,
        ends,
        B,
    )

    if not args.no_steps:
        tokens = np.random.default_rng(0).integers(1, cfg.vocab_size, N)
        steps = {s: np.full(N, np.inf) for s in specs}
        for r in range(args.step_repeats):
            for spec in specs:
                t0 = time.perf_counter()
                steps[spec] = np.minimum(steps[spec], step_times(model, full(spec), tokens, args.threads))
                print(
                    f"  step {r + 1}/{args.step_repeats} {full(spec)}: {time.perf_counter() - t0:.1f} s",
                    file=sys.stderr,
                )
        step_ms = {s: binned(steps[s]) for s in specs}
        result["step_ms"] = {s: v.tolist() for s, v in step_ms.items()}
        result["step_crossover"] = report(
            f"whole decode step, ms per step, best of {args.step_repeats}, mean over [end - {B}, end)",
            step_ms,
            args.plugins,
            ends,
            B,
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
