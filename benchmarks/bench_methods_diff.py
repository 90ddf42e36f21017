"""A diff over one long passkey with each standard KV-cache method, next to ``sink`` at the same held bytes.

Each method runs at ``--ratio`` (quest at a capacity of the same share of the context, kvquant with
4-bit keys and values) as side B of ``pyllama diff causal METHOD --probe passkey:length=N``; side A
(``causal``) is recorded by the first diff and replayed by the others, so each diff's time is its
method's teacher-forced run plus the diff's metrics. ``sink`` holds 4 sinks and a window of what the
ratio keeps of the context: the bytes an event method holds right after the event. The figure is
process CPU seconds (one thread: other work on the machine adds little to it) and wall seconds, with
each method's CPU time over sink's, and the bytes held at the last position.

    python benchmarks/bench_methods_diff.py --model SmolLM2-135M-Instruct.Q4_1.gguf --length 4096
"""

from __future__ import annotations

import argparse
import time

from pyllama.model import Model

METHODS = [
    "h2o",
    "tova",
    "scissorhands",
    "snapkv",
    "pyramidkv",
    "adakv",
    "knorm",
    "keydiff",
    "expected",
    "random",
]


def specs(ratio: float, context: int) -> list[str]:
    kept = int(context * (1 - ratio))
    return [
        f"sink:sinks=4,window={kept - 4}",
        *[f"{m}:ratio={ratio}" for m in METHODS],
        f"quest:capacity={kept}",
        "kvquant:k=q4_0,v=q4_0",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a checkpoint (SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--length", type=int, default=4096, help="the passkey's length in tokens")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model = Model.load(args.model, threads=args.threads)
    probe = f"passkey:length={args.length}"
    model.diff("causal", "causal", probe=probe)  # records side A once: every diff below replays it
    rows = []
    for spec in specs(args.ratio, args.length - 20):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        report = model.diff("causal", spec, probe=probe)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        s = report.summary
        rows.append((spec, cpu, wall, s["bytes_last_b"], s["bytes_ratio_b"], report.retrieval[0].b.match))
        print(f"{spec}: {cpu:.1f} s CPU", flush=True)
    sink_cpu = rows[0][1]
    print(f"\n{model.path}, {probe}, ratio {args.ratio}, {args.threads} thread(s)\n")
    print("| side B | CPU s | wall s | x sink CPU | bytes at the end | x causal | greedy holds the key |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for spec, cpu, wall, held, ratio, match in rows:
        print(f"| `{spec}` | {cpu:.1f} | {wall:.1f} | {cpu / sink_cpu:.2f} | {held:,} | {ratio:.3f} | {match} |")


if __name__ == "__main__":
    main()
