"""Seconds to score a retrieval probe with one plugin: ``score_retrieval`` (blocks of positions, the
haystack's rows never classified) against the same sequences fed one ``forward`` per position (the
decode path, every position's logits computed), and against a diff of the plugin with ``causal``
(two engines, every row classified and compared). The three give the same key scores.

    python benchmarks/bench_retrieval.py -c SmolLM2-135M-Instruct.Q4_1.gguf --probe needle:depths=0/1,lengths=512
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pyllama.diff.probes import load_probe
from pyllama.diff.retrieval_scores import score_retrieval
from pyllama.model import Model


def per_position(model: Model, spec: str, probe: str, threads: int) -> tuple[float, list[bool]]:
    """Every sequence one forward per position; retrieves = the argmax of each key row is the key token."""
    pr = load_probe(probe, model.tokenizer, model.config.seq_len)
    engine = model.engine(spec, threads)
    t0 = time.perf_counter()
    hits = []
    for seg in pr.segments:
        t = seg.target
        engine.reset()
        ok = True
        for pos, tok in enumerate(seg.tokens[:-1].tolist()):
            logits = engine.forward(tok, pos)
            if pos >= t.start - 1:
                ok &= int(np.argmax(logits)) == int(seg.tokens[pos + 1])
        hits.append(ok)
    return time.perf_counter() - t0, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--checkpoint", required=True)
    ap.add_argument("-z", "--tokenizer", default=None)
    ap.add_argument("--probe", default="needle:depths=0/1,lengths=512")
    ap.add_argument("--spec", default="causal")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-diff", action="store_true", help="skip the diff against causal")
    args = ap.parse_args()
    model = Model.load(args.checkpoint, tokenizer=args.tokenizer, threads=args.threads)
    run = score_retrieval(model, args.spec, args.probe, threads=args.threads)
    hits = [r.a.retrieves for r in run.rows]
    print(f"score_retrieval  {run.positions:,} positions  {run.seconds:8.2f} s  retrieves {hits}")
    seconds, slow_hits = per_position(model, args.spec, args.probe, args.threads)
    assert slow_hits == hits, (slow_hits, hits)
    print(f"per position     {run.positions:,} positions  {seconds:8.2f} s  {seconds / run.seconds:.2f}x the blocks")
    if not args.no_diff:
        t0 = time.perf_counter()
        report = model.diff("causal", args.spec, probe=args.probe, threads=args.threads, greedy=False)
        seconds = time.perf_counter() - t0
        assert [r.b.retrieves for r in report.retrieval] == hits
        print(f"diff vs causal   {report.n_positions:,} positions  {seconds:8.2f} s  {seconds / run.seconds:.2f}x")


if __name__ == "__main__":
    main()
