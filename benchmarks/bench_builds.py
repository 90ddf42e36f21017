"""Two builds of pyllama side by side: decode and prompt tok/s of each file, this environment's
pyllama against another environment's (an earlier commit installed in a virtual environment of its
own), in the same run.

Each round runs ``python -m pyllama bench --json`` once per build and file, in turn (a fresh process
each), and the table gives each build's median over the rounds and the ratio this / other. Each build
needs its own environment: an editable install maps ``pyllama.plugins`` to its own checkout, so a
``PYTHONPATH`` pointing at another checkout would mix the two builds' plugins.

    git worktree add ../pyllama-old COMMIT && python -m venv ../venv-old
    ../venv-old/bin/pip install -e ../pyllama-old
    python benchmarks/bench_builds.py --other ../venv-old/bin/python --threads 2 --rounds 5 FILE.gguf ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def bench(python: str, model: Path, threads: int, steps: int, prompt: int, repeats: int, attention: str) -> dict:
    """One ``pyllama bench --json`` of ``model`` by the pyllama of ``python``: its decode and prompt tok/s."""
    cmd = [python, "-m", "pyllama", "bench", "-c", str(model), "--threads", str(threads), "--repeats", str(repeats)]
    cmd += ["--steps", str(steps), "--prompt-tokens", str(prompt), "--attention", attention, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=model.parent)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--other", required=True, help="the Python of the other build's environment")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs per process, the best kept: the first block product of a file repacks its matrices (a load cost)",
    )
    ap.add_argument("--steps", type=int, default=128, help="decode positions per run")
    ap.add_argument("--prompt", type=int, default=512, help="prompt positions (pp)")
    ap.add_argument("--attention", default="causal", help="the attention plugin spec both builds run")
    ap.add_argument("--decode-key", default="tok_per_s", help="the JSON field of decode tok/s")
    ap.add_argument("--prompt-key", default="prompt_tok_per_s", help="the JSON field of prompt tok/s")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    builds = {"this": sys.executable, "other": args.other}
    runs: dict = {f.name: {b: {"decode": [], "prompt": []} for b in builds} for f in args.files}
    for r in range(args.rounds):
        for f in args.files:
            order = list(builds.items())
            for b, python in order if r % 2 == 0 else order[::-1]:  # neither build always runs first
                got = bench(python, f.resolve(), args.threads, args.steps, args.prompt, args.repeats, args.attention)
                runs[f.name][b]["decode"].append(got[args.decode_key])
                runs[f.name][b]["prompt"].append(got[args.prompt_key])
        print(f"round {r + 1} done", flush=True)
    print(f"\n{args.attention}, {args.threads} threads, medians of {args.rounds} interleaved rounds; tok/s\n")
    print("| file | decode, this | decode, other | this / other | pp, this | pp, other | this / other |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}" if b > 0 else "-"

    for name, per in runs.items():
        m = {b: {k: statistics.median(v) for k, v in per[b].items()} for b in builds}
        print(
            f"| {name} | {m['this']['decode']:.1f} | {m['other']['decode']:.1f} | "
            f"{ratio(m['this']['decode'], m['other']['decode'])} | {m['this']['prompt']:.1f} | "
            f"{m['other']['prompt']:.1f} | {ratio(m['this']['prompt'], m['other']['prompt'])} |"
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
