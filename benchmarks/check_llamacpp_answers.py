"""RULER answers of the full cache, pyllama against llama.cpp on the same tokens.

Before a task is said to be beyond a model (its ``causal`` score is 0), the same prompt goes through
llama.cpp's own greedy decoding: if llama.cpp answers it, the fault is pyllama's. For each task
(``--tasks``, default RULER's 11) at ``--length`` tokens and ``--seed``: the probe's prompt (context,
question, answer prefix, through the model's chat template) is decoded greedily by pyllama
(``Model.generate``, causal) and by ``llama-completion`` (``--temp 0``) from a text that llama.cpp
tokenizes back into the same ids, which is checked from its ``--verbose-prompt`` listing. Both answers
are scored by RULER's ``string_match_all``. Printed: one line per task, both scores, whether the
answers' tokens agree and how far.

    python benchmarks/check_llamacpp_answers.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --llama-completion PATH/llama-completion --length 4096
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from pyllama.diff.probes import load_probe
from pyllama.diff.probes.ruler_metrics import match_all, postprocess
from pyllama.diff.probes.ruler_tasks import TASKS
from pyllama.model import Model
from pyllama.tokenizer.gguf_vocab import TokenAttr


def prompt_text(tokenizer, ids: list[int]) -> str:
    """The text that tokenises back into ``ids`` with special tokens parsed: control tokens as
    their own text, the runs between them decoded."""
    out: list[str] = []
    run: list[int] = []
    for i in ids:
        if tokenizer.attrs[i] & TokenAttr.CONTROL:
            out.append(tokenizer.decode(run))
            out.append(tokenizer.tokens[i])
            run = []
        else:
            run.append(i)
    out.append(tokenizer.decode(run))
    return "".join(out)


def llamacpp_answer(binary: str, model: str, text: str, generate: int, context: int, threads: int):
    """llama.cpp's greedy continuation of ``text``: (its prompt's token ids, the generated text)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    cmd = [binary, "-m", model, "-f", f.name, "-n", str(generate), "--temp", "0", "-no-cnv", "--no-display-prompt",
           "-c", str(context), "-t", str(threads), "--verbose-prompt", "--no-warmup", "-s", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    Path(f.name).unlink()
    listing = re.findall(r"^\s*(\d+) -> '", done.stderr, flags=re.MULTILINE)
    return [int(x) for x in listing], done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--llama-completion", required=True, help="path to llama.cpp's llama-completion")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = Model.load(args.model, threads=args.threads)
    tok = model.tokenizer
    print(f"{'task':<17}{'pyllama':>9}{'llama.cpp':>11}  same prompt ids  answers (tokens agreeing / pyllama's)")
    for task in args.tasks.split(","):
        probe = f"ruler:task={task},length={args.length},seed={args.seed}"
        (seg,) = load_probe(probe, tok, model.config.seq_len).segments
        t = seg.target
        prompt = seg.tokens[: t.prompt].tolist()
        gen = model.generate(prompt, steps=t.prompt + t.generate, attention="causal", compress_at="none")
        ours = gen.ids[: next((i for i, x in enumerate(gen.ids) if x in t.stop), len(gen.ids))]
        ids, theirs = llamacpp_answer(
            args.llama_completion, args.model, prompt_text(tok, prompt), t.generate, len(seg) + 16, args.threads
        )
        their_ids = tok.encode(theirs, bos=False)
        pairs = zip(ours, their_ids, strict=False)
        agree = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(ours), len(their_ids)))
        score = [100.0 * match_all(postprocess(text), t.answers) for text in (tok.decode(ours), theirs)]
        print(f"{task:<17}{score[0]:>9.1f}{score[1]:>11.1f}  {str(ids == prompt):<16} {agree} / {len(ours)}")
        if score[0] != score[1] or agree < len(ours):
            print(f"    pyllama:   {tok.decode(ours)!r}\n    llama.cpp: {theirs!r}")


if __name__ == "__main__":
    main()
