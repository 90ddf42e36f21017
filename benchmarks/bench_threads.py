"""Threads that never cost: every call at the default thread count against the same call at one thread,
idle and beside a busy loop pinned to one core.

The calls a researcher makes from Python: ``Model.logits`` of 5, 64 and 512 tokens (a new engine each
call, as the API makes it), ``Model.generate`` of 128 positions from a 3-token prompt, and a diff
(``Model.diff`` of causal against ``sliding:32`` over 128 token ids, no cache). Each cell is the median of
``--calls`` calls at one thread and as many at the default thread count, interleaved call by call (1,
default, 1, default, ...: beside a busy loop the speed jumps between levels every few seconds, and
interleaving gives both the same share of each), after one warm-up pair; the ratio is default / 1
thread, so above 1.0 the default costs. The loaded phase starts its own ``taskset -c CPU`` busy loop
(``sh -c 'while :; do :; done'``) and kills it when done. ``--passes`` runs the whole table again; the
table gives each pass's ratio and their maximum.

Models: stories260K (``--models-dir``: stories260K.bin + tok512.bin), the stories42M shape with seeded
random weights written once into ``--workdir``, and SmolLM2-135M-Instruct Q4_1.

    python benchmarks/bench_threads.py --calls 15 --passes 3 --json bench_threads.json

``--baseline OLD.json`` (this script's JSON from another build, the same machine) adds the idle
default-thread medians of this run over that one's.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from random_checkpoints import SHARED, random_checkpoint

from pyllama.model import Model, default_threads

CALLS = ("logits 5", "logits 64", "logits 512", "generate 128", "diff 128")


@contextmanager
def busy_loop(cpu: int | None) -> Iterator[None]:
    """A shell busy loop pinned to ``cpu`` for the duration (None: nothing)."""
    if cpu is None:
        yield
        return
    proc = subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"])
    try:
        time.sleep(0.5)  # let the scheduler see it before the first call
        yield
    finally:
        proc.kill()
        proc.wait()


def call(model: Model, name: str, ids: np.ndarray) -> Callable[[int], object]:
    """The call ``name`` on ``model``, taking the thread count."""
    kind, size = name.split()
    n = int(size)
    if kind == "logits":
        return lambda threads: model.logits(ids[:n], threads=threads)
    if kind == "generate":
        prompt = [int(i) for i in ids[:3]]
        return lambda threads: model.generate(prompt, steps=n, temperature=0.0, threads=threads, ignore_eos=True)
    probe = ids[:n].tolist()
    return lambda threads: model.diff("causal", "sliding:32", probe=probe, threads=threads, progress=False, cache=False)


def seconds(run: Callable[[int], object], threads: int) -> float:
    start = time.perf_counter()
    run(threads)
    return time.perf_counter() - start


def cell(run: Callable[[int], object], calls: int, default: int) -> dict:
    """Medians of ``calls`` interleaved calls at one thread and at ``default`` threads."""
    seconds(run, 1), seconds(run, default)  # warm-up: page cache, first-call costs
    one, many = [], []
    for _ in range(calls):
        one.append(seconds(run, 1))
        many.append(seconds(run, default))
    m1, mn = statistics.median(one), statistics.median(many)
    return {"one": m1, "default": mn, "ratio": mn / m1}


def models(models_dir: Path, workdir: Path, names: list[str]) -> Iterator[tuple[str, Model]]:
    for name in names:
        if name == "stories260K":
            yield name, Model.load(models_dir / "stories260K.bin", tokenizer=models_dir / "tok512.bin")
        elif name == "SmolLM2":
            yield name, Model.load(models_dir / "SmolLM2-135M-Instruct.Q4_1.gguf")
        else:
            yield f"{name} shape", Model.load(random_checkpoint(name, workdir))


def table(results: dict, passes: int, baseline: dict | None) -> str:
    head = (
        "| model | call | phase | 1 thread, ms | default, ms | "
        + " | ".join(f"pass {i + 1}" for i in range(passes))
        + " | max |"
    )
    if baseline:
        head += " default / baseline |"
    lines = [head, "|" + " --- |" * 3 + " ---: |" * (passes + 3 + (1 if baseline else 0))]
    for key in results[0]:
        model, name, phase = key.split("|")
        cells = [r[key] for r in results]
        ratios = [c["ratio"] for c in cells]
        one = statistics.median(c["one"] for c in cells) * 1e3
        many = statistics.median(c["default"] for c in cells) * 1e3
        line = (
            f"| {model} | {name} | {phase} | {one:.1f} | {many:.1f} | "
            + " | ".join(f"{r:.2f}" for r in ratios)
            + f" | {max(ratios):.2f} |"
        )
        if baseline:
            old = [b[key]["default"] for b in baseline["passes"] if key in b]
            line += f" {many / (statistics.median(old) * 1e3):.3f} |" if old and phase == "idle" else " |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="stories260K,stories42M,SmolLM2")
    ap.add_argument("--models-dir", type=Path, default=SHARED / "models")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "pyllama-bench")
    ap.add_argument("--calls", type=int, default=15, help="calls per thread count per cell (median)")
    ap.add_argument("--passes", type=int, default=3, help="runs of the whole table")
    ap.add_argument("--only", default=",".join(CALLS), help="the calls to time, comma-separated")
    ap.add_argument("--busy-cpu", type=int, default=1, help="the core the busy loop is pinned to")
    ap.add_argument("--phases", default="idle,loaded", help="idle, loaded or both")
    ap.add_argument("--baseline", type=Path, help="this script's JSON from another build, for the idle medians")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a killed run still kills its busy loop
    args.workdir.mkdir(parents=True, exist_ok=True)
    default = default_threads()
    cpus = {"idle": None, "loaded": args.busy_cpu}
    ids = np.random.default_rng(0).integers(3, 500, 512).astype(np.int32)
    loaded = list(models(args.models_dir, args.workdir, args.models.split(",")))
    load_before = os.getloadavg()
    results: list[dict] = []
    for p in range(args.passes):
        results.append({})
        for phase in args.phases.split(","):
            with busy_loop(cpus[phase]):
                for label, model in loaded:
                    for name in args.only.split(","):
                        key = f"{label}|{name}|{phase}"
                        results[p][key] = cell(call(model, name, ids), args.calls, default)
                        print(f"pass {p + 1}, {key}: {results[p][key]}", flush=True)
    print(f"\ndefault threads: {default}; load average before {load_before}, after {os.getloadavg()}")
    print(f"medians of {args.calls} interleaved calls per cell; ratio: default / 1 thread\n")
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    print(table(results, args.passes, baseline))
    if args.json:
        args.json.write_text(json.dumps({"default_threads": default, "passes": results}, indent=1))


if __name__ == "__main__":
    main()
