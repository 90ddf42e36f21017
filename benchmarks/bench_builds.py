"""Two builds of pyllama side by side: decode and prompt tok/s of each file, this checkout against
another one (an earlier commit, built in place), in the same run.

Each round runs ``pyllama bench --json`` once per build and file, in turn (a fresh process each,
``PYTHONPATH`` set to the build's checkout), and the table gives each build's median over the rounds
and the ratio this / other. The other checkout must be built in place first
(``python setup.py build_ext --inplace`` there, with this environment's Python).

    python benchmarks/bench_builds.py --other ../pyllama-old --threads 2 --rounds 5 FILE.gguf ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

THIS = Path(__file__).resolve().parents[1]


def bench(checkout: Path, model: Path, threads: int, steps: int, prompt: int) -> dict:
    """One ``pyllama bench --json`` of ``model`` with the code of ``checkout``: its decode and prompt tok/s."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, "-m", "pyllama", "bench", "-c", str(model), "--threads", str(threads), "--repeats", "1"]
    cmd += ["--steps", str(steps), "--prompt-tokens", str(prompt), "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=checkout)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--other", type=Path, required=True, help="the other checkout, built in place")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=128, help="decode positions per run")
    ap.add_argument("--prompt", type=int, default=512, help="prompt positions (pp)")
    ap.add_argument("--decode-key", default="tok_per_s", help="the JSON field of decode tok/s")
    ap.add_argument("--prompt-key", default="prompt_tok_per_s", help="the JSON field of prompt tok/s")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    builds = {"this": THIS, "other": args.other.resolve()}
    runs: dict = {f.name: {b: {"decode": [], "prompt": []} for b in builds} for f in args.files}
    for r in range(args.rounds):
        for f in args.files:
            for b, checkout in builds.items():
                got = bench(checkout, f.resolve(), args.threads, args.steps, args.prompt)
                runs[f.name][b]["decode"].append(got[args.decode_key])
                runs[f.name][b]["prompt"].append(got[args.prompt_key])
        print(f"round {r + 1} done", flush=True)
    print(f"\n{args.threads} threads, medians of {args.rounds} interleaved rounds; tok/s\n")
    print("| file | decode, this | decode, other | this / other | pp, this | pp, other | this / other |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, per in runs.items():
        m = {b: {k: statistics.median(v) for k, v in per[b].items()} for b in builds}
        print(
            f"| {name} | {m['this']['decode']:.1f} | {m['other']['decode']:.1f} | "
            f"{m['this']['decode'] / m['other']['decode']:.3f} | {m['this']['prompt']:.1f} | "
            f"{m['other']['prompt']:.1f} | {m['this']['prompt'] / m['other']['prompt']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
