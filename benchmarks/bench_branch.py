"""Compress once, branch many, timed: one context pass and k x r short branches against k x r whole runs.

One RULER sample on one model (``--task``, ``--length``, ``--seed``): every method (``--methods``)
at every ratio (``--ratios``) scored as a leaderboard's unit scores it (``score_sequence``: the
teacher-forced answer, and the greedy answer where the chain leaves it), two ways:

* **branched** — ``causal``'s run of the context once, recorded (``ContextRecord.run``), then each
  method and ratio started from the record the way a unit starts it (``starts.py``: an event method
  from its ``start_from`` and the event, over the question and the answer only; ``sliding``,
  ``sink`` and ``kmeans`` after their exact prefix, over the rest of the sequence);
* **whole** — each method and ratio run from position 0 (the context, the event, the rest).

Both give the same scores, bit for bit (checked here as well as in tests/test_leaderboard_branch.py).
Printed: each method and ratio's way and both times, the context pass, the branches' total and mean,
the whole runs' total and mean, and the ratio. Wall times on one thread; other work on the machine
only adds time to both.

    python benchmarks/bench_branch.py --model SmolLM2-135M-Instruct.Q4_1.gguf --length 1024
    python benchmarks/bench_branch.py --model SmolLM2-135M-Instruct.Q4_1.gguf --length 4096 \
        --methods sliding,sink,kmeans --ratios 0.25
"""

from __future__ import annotations

import argparse
import time

from pyllama.diff.probes import load_probe
from pyllama.diff.retrieval_scores import score_sequence
from pyllama.leaderboard.methods import method_spec
from pyllama.leaderboard.record import ContextRecord
from pyllama.leaderboard.starts import branch_way, start_for
from pyllama.model import Model

METHODS = "snapkv,pyramidkv,adakv,knorm,keydiff,expected,random"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--task", default="niah_single_2")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--ratios", default="0.5,0.9")
    args = parser.parse_args()
    model = Model.load(args.model, tokenizer=args.tokenizer, threads=1)
    probe = f"ruler:task={args.task},length={args.length},seed={args.seed}"
    (seg,) = load_probe(probe, model.tokenizer, model.config.seq_len).segments
    event = seg.context_end
    t0 = time.perf_counter()
    record = ContextRecord.run(model.engine("causal", threads=1), seg.tokens[: event + 1])
    context = time.perf_counter() - t0
    specs = [
        method_spec(m, float(r), record.positions) for m in args.methods.split(",") for r in args.ratios.split(",")
    ]
    branched, whole = [], []
    for spec in specs:
        engine = model.engine(spec, threads=1)
        way = branch_way(engine.attention)
        t0 = time.perf_counter()
        b = score_sequence(engine, seg, model.tokenizer, spec, event, start_for(way, record, engine.attention))
        branched.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        w = score_sequence(model.engine(spec, threads=1), seg, model.tokenizer, spec, event)
        whole.append(time.perf_counter() - t0)
        assert (b.score, b.event_bytes, b.last_bytes) == (w.score, w.event_bytes, w.last_bytes), spec
        print(f"{spec} ({way}): branched {branched[-1]:.2f} s, whole {whole[-1]:.2f} s", flush=True)
    k_r = len(specs)
    print(
        f"{probe} on {model.config.name if hasattr(model.config, 'name') else args.model}: {len(seg):,} tokens, "
        f"context {record.positions:,}, record {record.nbytes / 1e6:.0f} MB, {k_r} method-ratio branches"
    )
    print(
        f"branched: context pass {context:.2f} s + branches {sum(branched):.2f} s "
        f"(mean {sum(branched) / k_r:.3f} s) = {context + sum(branched):.2f} s"
    )
    print(f"whole:    {sum(whole):.2f} s (mean {sum(whole) / k_r:.2f} s per method and ratio)")
    print(f"whole / branched: {sum(whole) / (context + sum(branched)):.1f}x")


if __name__ == "__main__":
    main()
