"""A branch's local layers from the record, timed: kept (``LayerSplit.start_local``) against replayed.

On a model with local layers (Gemma 3: a 512-position window on 15 of its 18 layers) a branch that
starts from the record fills the model's own window on every local layer. Two ways, timed on one
RULER sample's recorded context (``--task``, ``--length``, ``--seed``):

* **kept** — the record's rows put in the window as attending would leave them, no attention
  (``LayerSplit.start_local``, what ``starts.py`` does);
* **replayed** — the window's attention calls made again over the whole context with the recorded
  rows, in blocks of ``starts.REPLAY_BLOCK`` positions (``starts.replay_layer``, what a branch did
  before).

Both leave each local layer holding the same positions (checked here; the rows and the outputs that
follow are checked bit for bit in tests/test_leaderboard_branch.py). Printed: the context pass that
made the record, both ways' seconds over all local layers (the best of ``--repeats``), and the ratio.
CPU seconds of one thread: other work on the machine does not add to them.

    python benchmarks/bench_local_start.py --model gemma-3-270m-q4_k_m.gguf --length 4096
"""

from __future__ import annotations

import argparse
import sys
import time

from pyllama.attention.layers import LayerSplit
from pyllama.diff.probes import load_probe
from pyllama.leaderboard.record import ContextRecord
from pyllama.leaderboard.starts import replay_layer
from pyllama.model import Model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model with local layers (Gemma 3)")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--task", default="niah_single_2")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="each way's time is the best of this many")
    args = parser.parse_args()
    model = Model.load(args.model, tokenizer=args.tokenizer, threads=1)
    probe = f"ruler:task={args.task},length={args.length},seed={args.seed}"
    (seg,) = load_probe(probe, model.tokenizer, model.config.seq_len).segments
    engine = model.engine("causal", threads=1)
    if not isinstance(engine.attention, LayerSplit):
        sys.exit(f"bench_local_start: {args.model} has no local layers (its layers all attend globally)")
    t0 = time.process_time()
    rec = ContextRecord.run(engine, seg.tokens[: seg.context_end + 1])
    context = time.process_time() - t0
    split, n = engine.attention, rec.positions
    local = split.local_layers

    def keep() -> None:
        for layer in local:
            split.start_local(layer, rec.keys[layer], rec.values[layer])

    def replay() -> None:
        for layer in local:
            replay_layer(split, rec, layer, n)

    seconds, held = {}, {}
    for name, way in (("kept", keep), ("replayed", replay)):
        best = float("inf")
        for _ in range(args.repeats):
            engine.reset()
            t0 = time.process_time()
            way()
            best = min(best, time.process_time() - t0)
        seconds[name] = best
        held[name] = [[h.tolist() for h in split.held_positions(layer) or ()] for layer in local]
    assert held["kept"] == held["replayed"], "the two ways hold different positions"
    print(
        f"{probe}: context {n:,} positions recorded in {context:.2f} CPU s; "
        f"{len(local)} local layers of {model.config.n_layers}"
    )
    print(f"kept:     {seconds['kept']:.4f} CPU s")
    print(f"replayed: {seconds['replayed']:.4f} CPU s ({seconds['replayed'] / context:.2f} of the context pass)")
    print(f"replayed / kept: {seconds['replayed'] / seconds['kept']:.0f}x")


if __name__ == "__main__":
    main()
