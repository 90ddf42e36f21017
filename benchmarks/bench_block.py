"""Blocks of positions against decode: prompt processing and teacher forcing, per position.

For each tinyllamas shape (seeded random weights: speed does not depend on weight values):

1. decode tok/s: greedy generation from BOS (``Generation.tok_per_s``);
2. prompt tok/s: N seeded random ids from position 0 through ``Engine.forward_block`` (what
   ``generate`` does with a prompt and ``pyllama bench`` reports as ``prompt_tok_per_s``), N = 256
   for the stories15M shape (its context) and 512 otherwise, llama-bench's pp sizes;
3. a teacher-forced ``diff causal sliding:64`` over the ``standard`` probe: positions per second
   with blocks (the default) and, with ``--per-position``, without them; then with causal's run
   recorded (the first diff, ``diff_recording``) and replayed (every later one, ``diff_replay``),
   what ``pyllama diff`` does by default (``pyllama.diff.side_cache``).

Runs alternate between the variants; the best of ``--repeats`` is reported. Each rate is also given
per second of process CPU time (``*_cpu`` keys): at one thread that is the work itself, which a
machine loaded by other programs stretches in wall time but hardly in CPU time.

    python benchmarks/bench_block.py --threads 2 --repeats 3 --per-position --json bench_block.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from random_checkpoints import SHARED, random_checkpoint

from pyllama.diff import run_diff
from pyllama.diff.side_cache import SideCache
from pyllama.model import Model

SHAPES = {"stories15M": 256, "stories42M": 512, "stories110M": 512}


def prompt_tok_s(model: Model, n: int) -> tuple[float, float]:
    """Prompt tokens per second of wall time and of CPU time."""
    engine = model.engine("causal")
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, size=n, dtype=np.int32)
    engine.forward_block(tokens, 0)  # a warm-up, as llama-bench and pyllama bench time after one
    engine.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    engine.forward_block(tokens, 0)
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def decode_tok_s(model: Model, steps: int) -> tuple[float, float]:
    c0 = time.process_time()
    gen = model.generate([1], steps=steps, temperature=0.0, ignore_eos=True)
    return gen.tok_per_s, gen.steps / (time.process_time() - c0)


def diff_pos_s(model: Model, blocks: bool, cache: SideCache | None = None) -> tuple[float, float, int]:
    """``cache``: record side A (causal) there on the first call, replay it on the next ones."""
    c0 = time.process_time()
    report = run_diff(
        model.config,
        model.weights,
        "causal",
        "sliding:64",
        probe="standard",
        tokenizer=model.tokenizer,
        threads=model.threads,
        progress=False,
        blocks=blocks,
        cache=cache or False,
        model_file=model.path,
    )
    return report.n_positions / report.seconds, report.n_positions / (time.process_time() - c0), report.n_positions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--decode-steps", type=int, default=128)
    ap.add_argument("--per-position", action="store_true", help="also time the diff without blocks (slow)")
    ap.add_argument("--no-diff", action="store_true", help="only decode and prompt processing")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "pyllama-bench")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        tokenizer = SHARED / "models" / "tokenizer.bin"  # the tinyllamas' 32,000-token vocabulary (the probe's text)
        model = Model.load(random_checkpoint(shape, args.workdir), tokenizer=tokenizer, threads=args.threads)
        engine = model.engine("causal")
        best = dict.fromkeys(
            ["decode", "prompt", "diff_blocks", "diff_record", "diff_replay", "diff_per_position"], 0.0
        )
        cpu = dict.fromkeys(best, 0.0)
        n_diff = 0

        def keep(name: str, rates: tuple[float, ...], best=best, cpu=cpu) -> None:
            best[name], cpu[name] = max(best[name], rates[0]), max(cpu[name], rates[1])

        records = None
        if not args.no_diff:
            records = SideCache(tempfile.mkdtemp(prefix="records-", dir=args.workdir), max_bytes=64 * 2**30)
            keep("diff_record", diff_pos_s(model, True, records)[:2])  # the first diff records causal's run
        for _ in range(args.repeats):
            keep("decode", decode_tok_s(model, args.decode_steps))
            keep("prompt", prompt_tok_s(model, SHAPES[shape]))
            if not args.no_diff:
                *rates, n_diff = diff_pos_s(model, True)
                keep("diff_blocks", rates)
                keep("diff_replay", diff_pos_s(model, True, records)[:2])
        if args.per_position and not args.no_diff:
            keep("diff_per_position", diff_pos_s(model, False))  # once: it is the slow one
        row = {
            "shape": shape,
            "threads": args.threads,
            "prompt_tokens": SHAPES[shape],
            "decode_tok_per_s": best["decode"],
            "prompt_tok_per_s": best["prompt"],
            "prompt_vs_decode": best["prompt"] / best["decode"],
            "diff_positions": n_diff,
            "diff_blocks_pos_per_s": best["diff_blocks"],
            "diff_blocks_vs_decode": best["diff_blocks"] / best["decode"],
            "diff_recording_pos_per_s": best["diff_record"],
            "diff_replay_pos_per_s": best["diff_replay"],
            "diff_replay_vs_decode": best["diff_replay"] / best["decode"],
            "diff_per_position_pos_per_s": best["diff_per_position"] or None,
            "decode_tok_per_s_cpu": cpu["decode"],
            "prompt_tok_per_s_cpu": cpu["prompt"],
            "diff_blocks_pos_per_s_cpu": cpu["diff_blocks"],
            "prompt_vs_decode_cpu": cpu["prompt"] / cpu["decode"],
            "diff_blocks_vs_decode_cpu": cpu["diff_blocks"] / cpu["decode"] if cpu["diff_blocks"] else None,
            "block_buffer_bytes": engine.block_buffer_bytes(),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        if records is not None:
            shutil.rmtree(records.folder, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
