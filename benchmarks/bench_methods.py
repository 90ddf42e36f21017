"""Decode cost of the standard KV-cache methods at ratio 0.5 next to causal and sink, at the same positions.

On SmolLM2-135M (or any ``--model``), the context is ``--context`` positions (teacher-forced, in blocks),
then the compression event, then ``--steps`` decode steps whose times are kept. Two measurements:

* **attention alone** — each plugin bound to the model's shapes and fed random post-RoPE q, k, v (and
  queries before RoPE): the context in blocks, ``compress`` (timed: the event's cost, every layer), then
  each decode position through every layer, timed. What a method adds to a step, including its
  per-step eviction (h2o, tova, scissorhands).
* **whole decode step** — one engine per plugin, the same tokens, ``forward`` timed after the event:
  what a user sees, matmuls and classifier included.

``sink`` is sized to hold what ratio 0.5 holds after the event (4 sinks + a window of half the context),
the same bytes. Runs are interleaved ``--repeats`` times and the minimum per position kept (other work
on the machine only adds time); the table shows the median over the decode positions and the ratio to
causal.

    python benchmarks/bench_methods.py --model SmolLM2-135M-Instruct.Q4_1.gguf --context 1500 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from pyllama.attention.registry import create_plugin
from pyllama.engine import Pool
from pyllama.model import Model

METHODS = ["h2o", "tova", "scissorhands", "snapkv", "pyramidkv", "adakv", "knorm", "keydiff", "expected", "random"]


def bound(config, spec: str, threads: int, block: int):
    plugin = create_plugin(spec)
    rows = tuple(np.zeros((block, w), np.float32) for w in (config.q_dim, config.kv_dim, config.kv_dim, config.q_dim))
    pre_rope = np.zeros((block, config.q_dim), np.float32)
    plugin._configure(config, Pool(threads), rows, pre_rope)
    plugin.init(config, Pool(threads))
    return plugin, rows, pre_rope


def attention_times(config, spec: str, context: int, steps: int, threads: int, block: int = 64):
    """Seconds of each decode position's attend() over all layers after a context and its event, and
    the seconds of the event (``compress``) itself."""
    plugin, (q, k, v, out), pre_rope = bound(config, spec, threads, block)
    rng = np.random.default_rng(0)
    for buffer in (q, k, v, pre_rope):
        buffer[:] = rng.standard_normal(buffer.shape).astype(np.float32)
    for start in range(0, context, block):
        m = min(block, context - start)
        for layer in range(config.n_layers):
            plugin.attend_block(layer, start, q[:m], k[:m], v[:m], out[:m])
    clock = time.perf_counter
    t0 = clock()
    plugin.compress(context - 1)
    event = clock() - t0
    times = np.zeros(steps)
    for i in range(steps):
        pos, row = context + i, i % block
        t0 = clock()
        for layer in range(config.n_layers):
            plugin.attend(layer, pos, q[row], k[row], v[row], out[row])
        times[i] = clock() - t0
    return times, event


def step_times(model: Model, spec: str, tokens: np.ndarray, context: int, threads: int) -> np.ndarray:
    """Seconds of each forward(token, pos) after the context's block and the event."""
    engine = model.engine(spec, threads)
    engine.forward_block(tokens[:context], 0)
    engine.compress(context - 1)
    times = np.zeros(len(tokens) - context)
    clock = time.perf_counter
    for i, pos in enumerate(range(context, len(tokens))):
        t0 = clock()
        engine.forward(int(tokens[pos]), pos)
        times[i] = clock() - t0
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a checkpoint (SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--context", type=int, default=1500, help="positions before the compression event")
    ap.add_argument("--steps", type=int, default=128, help="decode positions timed after the event")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ratio", type=float, default=0.5)
    args = ap.parse_args()
    model = Model.load(args.model, threads=args.threads)
    cfg = model.config
    C, S = args.context, args.steps
    kept = C - int(args.ratio * C)
    specs = ["causal", f"sink:sinks=4,window={kept - 4}"] + [f"{m}:ratio={args.ratio}" for m in METHODS]
    tokens = np.random.default_rng(1).integers(10, cfg.vocab_size, C + S).astype(np.int32)
    att = {s: np.full(S, np.inf) for s in specs}
    event = {s: np.inf for s in specs}
    step = {s: np.full(S, np.inf) for s in specs}
    for r in range(args.repeats):
        for spec in specs:
            t0 = time.perf_counter()
            times, seconds = attention_times(cfg, spec, C, S, args.threads)
            att[spec], event[spec] = np.minimum(att[spec], times), min(event[spec], seconds)
            step[spec] = np.minimum(step[spec], step_times(model, spec, tokens, C, args.threads))
            print(f"  {r + 1}/{args.repeats} {spec}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(
        f"\n{args.model}: {cfg.n_layers} layers, {cfg.n_heads} query heads over {cfg.n_kv_heads} KV heads of "
        f"{cfg.head_dim}; context {C}, event after {C - 1}, decode positions {C}..{C + S - 1}, "
        f"{args.threads} thread(s), best of {args.repeats}, median over the positions\n"
    )
    print("| plugin | the event ms | attention alone ms | x causal | whole step ms | x causal | x sink |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    base_a, base_s = np.median(att["causal"]) * 1e3, np.median(step["causal"]) * 1e3
    sink_s = np.median(step[specs[1]]) * 1e3
    for spec in specs:
        a, s = np.median(att[spec]) * 1e3, np.median(step[spec]) * 1e3
        e = event[spec] * 1e3
        print(f"| `{spec}` | {e:.1f} | {a:.3f} | {a / base_a:.2f} | {s:.3f} | {s / base_s:.2f} | {s / sink_s:.2f} |")


if __name__ == "__main__":
    main()
