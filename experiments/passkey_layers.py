"""The passkey past a model's local window: `causal` and `sink` governing every layer or the global ones.

For each model file (SmolLM2-135M-Instruct and Gemma 3 270M by default) and each passkey length, every
spec of ``--specs`` scores the sequence (``score_retrieval``, teacher-forced, greedy answer decoded):
P(key), the ranks of its tokens, the greedy answer and the bytes held at the last position (on Gemma 3
the local layers' exact windows included). On a model without local layers ``layers=global`` changes
nothing, so SmolLM2's two sink rows agree: the control.

    python experiments/passkey_layers.py --models SmolLM2-135M-Instruct.Q4_1.gguf,gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pyllama import Model
from pyllama.diff.retrieval_scores import score_retrieval

SPECS = "causal;sink:4,256;sink:4,256,layers=global;sink:4,1024,layers=global"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated model files")
    ap.add_argument("--lengths", default="1500,3000", help="passkey lengths in tokens")
    ap.add_argument("--specs", default=SPECS, help="semicolon-separated plugin specs")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print("| model | length | plugin | bytes at the end | log10 P(key) | ranks | greedy | retrieves |")
    print("| --- | ---: | --- | ---: | ---: | --- | --- | --- |")
    for path in args.models.split(","):
        model = Model.load(path, threads=args.threads)
        for length in (int(n) for n in args.lengths.split(",")):
            for spec in args.specs.split(";"):
                run = score_retrieval(model, spec, f"passkey:length={length}", greedy=True)
                s = run.rows[0].a
                ranks = ",".join(str(r) for r in s.ranks)
                print(
                    f"| {Path(path).name} | {length:,} | `{spec}` | {run.memory[-1]:,} | "
                    f"{s.logp / math.log(10):.2f} | {ranks} | {s.greedy!r} | {'yes' if s.match else 'no'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
