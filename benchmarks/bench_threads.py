"""Threads under load: decode tok/s at 1 thread and at the default thread count, idle and beside a
busy loop pinned to one core, before and after the thread policy (pyllama/kernels/threads.pyx).

"before" is the policy as it was: every decode token on the full team (``set_decode_policy("fixed")``)
and the old serial threshold, 2^15 multiply-adds. "after" is the default: the adaptive decode
controller and the 2^15 + 1 threshold. Both are set at run time in one process, so every round runs
1 thread, default-before and default-after in turn, generation by generation, on the same mapped
weights; the table gives the
median of ``--runs`` rounds, and the median of the per-round ratios after / 1 thread (each round's
default run against the 1-thread run just before it, which a slow drift of the machine's load
moves less than it moves two separate medians). The loaded half starts its own ``taskset -c CPU`` busy loop
(``sh -c 'while :; do :; done'``) and kills it when done. Decode is timed as ``pyllama bench``
times it (``Generation.tok_per_s``: greedy, end tokens ignored, from the end of the first forward).

Models: stories260K (``--models-dir``: stories260K.bin + tok512.bin) and the stories15M and
stories110M shapes with seeded random weights, written once into ``--workdir``.

    python benchmarks/bench_threads.py --runs 5 --json bench_threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from random_checkpoints import SHARED, random_checkpoint

from pyllama.kernels.threads import decode_stats, set_decode_policy, set_serial_below
from pyllama.model import Model, default_threads

OLD_SERIAL_BELOW = 1 << 15  # the threshold before the policy
POLICIES = {"before": ("fixed", OLD_SERIAL_BELOW), "after": ("adaptive", None)}


@contextmanager
def busy_loop(cpu: int | None):
    """A shell busy loop pinned to ``cpu`` for the duration (None: nothing)."""
    if cpu is None:
        yield
        return
    proc = subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"])
    try:
        time.sleep(0.5)  # let the scheduler see it before the first run
        yield
    finally:
        proc.kill()
        proc.wait()


def decode_seconds(model: Model, steps: int, threads: int, policy: str) -> tuple[float, float, dict]:
    """One generation of ``steps`` positions: (tokens decoded, decode seconds, the controller's stats)."""
    name, threshold = POLICIES[policy]
    previous_policy = set_decode_policy(name)
    previous_threshold = set_serial_below() if threshold is None else set_serial_below(threshold)
    try:
        prompt = "Once upon a time" if model.tokenizer is not None else [1]
        out = model.generate(prompt, steps=steps, temperature=0.0, attention="causal", threads=threads, ignore_eos=True)
        decoded = out.steps - min(len(out.prompt_ids), out.steps)  # the positions tok_per_s counts
        return decoded, decoded / out.tok_per_s, decode_stats()
    finally:
        set_decode_policy(previous_policy)
        set_serial_below(previous_threshold)


def measure(model: Model, steps: int, runs: int, cpu: int | None, sequences: int = 1) -> dict:
    """Median tok/s of ``runs`` rounds of (1 thread, default before, default after).

    A round's three runs are interleaved generation by generation (1 thread, before, after, 1
    thread, ...), ``sequences`` generations each, and each run's tok/s is its tokens over its decode
    time: beside a busy loop a short decode's speed jumps between two levels every few seconds
    (stories260K: about 4,500 and 6,500 tok/s, whichever code runs), and interleaving gives the three
    the same share of each level instead of handing a whole level to one of them."""
    n = default_threads()
    configs = {"1 thread": (1, "before"), "before": (n, "before"), "after": (n, "after")}
    cells: dict[str, list[float]] = {k: [] for k in configs}
    teams: list[dict] = []
    with busy_loop(cpu):
        decode_seconds(model, min(steps, 32), n, "after")  # warm-up: page cache, first-call costs
        for _ in range(runs):
            totals = {k: [0.0, 0.0] for k in configs}
            for _ in range(sequences):
                for k, (threads, policy) in configs.items():
                    tokens, seconds, stats = decode_seconds(model, steps, threads, policy)
                    totals[k][0] += tokens
                    totals[k][1] += seconds
                    if k == "after":
                        after_stats = stats
            for k, (tokens, seconds) in totals.items():
                cells[k].append(tokens / seconds)
            teams.append(after_stats)  # the round's last "after" generation's controller
    return {
        "median": {k: statistics.median(v) for k, v in cells.items()},
        "paired_after_over_1": statistics.median(a / o for a, o in zip(cells["after"], cells["1 thread"], strict=True)),
        "runs": cells,
        "after_teams": teams,
    }


def models(models_dir: Path, workdir: Path, names: list[str]) -> list[tuple[str, Path, Path | None]]:
    out = []
    for name in names:
        if name == "stories260K":
            out.append((name, models_dir / "stories260K.bin", models_dir / "tok512.bin"))
        else:
            out.append((f"{name} shape", random_checkpoint(name, workdir), None))
    return out


def table(results: dict) -> str:
    lines = [
        "| model | phase | 1 thread | default, before | default, after | before / 1 thread | after / 1 thread "
        "| after / before | after / 1 thread, per round |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, phases in results.items():
        for phase, r in phases.items():
            m = r["median"]
            one, before, after = m["1 thread"], m["before"], m["after"]
            lines.append(
                f"| {model} | {phase} | {one:.1f} | {before:.1f} | {after:.1f} | {before / one:.2f} | "
                f"{after / one:.2f} | {after / before:.2f} | {r['paired_after_over_1']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="stories260K,stories15M,stories110M")
    ap.add_argument("--models-dir", type=Path, default=SHARED / "models")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "pyllama-bench")
    ap.add_argument("--steps", type=int, default=256, help="positions per run (pyllama bench's default)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--sequences",
        default="stories260K=32,stories15M=4",
        help="generations per run, per model (name=N,...; default 1): stories260K decodes 256 positions in "
        "about 50 ms, shorter than the speed swings beside a busy loop, so its runs take 32, the 15M shape's 4",
    )
    ap.add_argument("--busy-cpu", type=int, default=1, help="the core the busy loop is pinned to")
    ap.add_argument("--phases", default="idle,loaded", help="idle, loaded or both")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a killed run still kills its busy loop
    args.workdir.mkdir(parents=True, exist_ok=True)
    phases = {"idle": None, "loaded": args.busy_cpu}
    results: dict = {}
    load_before = os.getloadavg()
    sequences = dict(item.split("=") for item in args.sequences.split(",") if item)
    for (label, path, tok), name in zip(
        models(args.models_dir, args.workdir, args.models.split(",")), args.models.split(","), strict=True
    ):
        model = Model.load(path, tokenizer=tok)
        results[label] = {}
        for phase in args.phases.split(","):
            results[label][phase] = measure(model, args.steps, args.runs, phases[phase], int(sequences.get(name, 1)))
            print(f"{label}, {phase}: {results[label][phase]['median']}", flush=True)
    print(f"\ndefault threads: {default_threads()}; load average before {load_before}, after {os.getloadavg()}")
    print(
        f"decode tok/s, median of {args.runs} rounds, {args.steps} positions per generation, generations per "
        f"run: {args.sequences or 1}\n"
    )
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
