"""RULER answers of the full cache, pyllama against llama.cpp on the same tokens.

Before a task is said to be beyond a model (its ``causal`` score is 0), the same prompt goes through
llama.cpp's own greedy decoding: if llama.cpp answers it, the fault is pyllama's. For each task
(``--tasks``, default RULER's 11) at ``--length`` tokens and ``--seed``: the probe's prompt (context,
question, answer prefix, through the model's chat template) is decoded greedily by pyllama (causal,
the engine's own passes, keeping each token's top-2 margin) and by ``llama-completion`` (``--temp
0``, flash attention off: pyllama's arithmetic is llama.cpp's without it) from a text that llama.cpp
tokenizes back into the same ids, which is checked from its ``--verbose-prompt`` listing. Both
answers are scored by RULER's ``string_match_all``. Printed: one line per task, both scores, how
many of pyllama's answer tokens llama.cpp's answer agrees with (its text tokenised again), and
pyllama's top-2 margin (nats) at the first token where they part.

    python benchmarks/check_llamacpp_answers.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --llama-completion PATH/llama-completion --length 4096
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from pyllama.diff.probes import load_probe
from pyllama.diff.probes.ruler_metrics import match_all, postprocess
from pyllama.diff.probes.ruler_tasks import TASKS
from pyllama.model import Model
from pyllama.tokenizer.gguf_vocab import TokenAttr


def prompt_text(tokenizer, ids: list[int]) -> str:
    """The text that tokenises back into ``ids`` with special tokens parsed: control tokens as
    their own text, the runs between them decoded (each after the token before it)."""
    out: list[str] = []
    start = 0
    for k in [*(k for k, i in enumerate(ids) if tokenizer.attrs[i] & TokenAttr.CONTROL), len(ids)]:
        if k > start:
            run = ids[start:k]
            out.append(tokenizer.decode([ids[start - 1], *run]) if start else tokenizer.decode_sequence(run))
        if k < len(ids):
            out.append(tokenizer.tokens[ids[k]])
        start = k + 1
    return "".join(out)


def llamacpp_answer(binary: str, model: str, text: str, generate: int, context: int, threads: int, extra: list[str]):
    """llama.cpp's greedy continuation of ``text``: (its prompt's token ids, the generated text)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text + "\n" if text.endswith("\n") else text)  # it drops a prompt file's last newline
    cmd = [binary, "-m", model, "-f", f.name, "-n", str(generate), "--temp", "0", "-no-cnv", "--no-display-prompt",
           "-c", str(context), "-t", str(threads), "--verbose-prompt", "--no-warmup", "-fa", "off", *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    Path(f.name).unlink()
    listing = re.findall(r"^\S+ I +(\d+) -> '", done.stderr, flags=re.MULTILINE)  # --verbose-prompt's lines
    return [int(x) for x in listing], done.stdout.split(" [end of text]")[0]


def greedy_with_margins(model: Model, prompt: list[int], steps: int, stop: tuple[int, ...]):
    """pyllama's greedy answer after ``prompt`` (causal, the engine's own passes) and, for each of its
    tokens, the margin of its logit over the runner-up: where llama.cpp parts from it, a small margin
    says a near-tie that another program's rounding may tip."""
    engine = model.engine("causal")
    logits = engine.forward_block(np.ascontiguousarray(prompt, dtype=np.int32), 0)
    ids: list[int] = []
    margins: list[float] = []
    for pos in range(len(prompt), len(prompt) + steps):
        top2 = np.argsort(logits)[-2:]
        token = int(top2[1])
        if token in stop:
            break
        ids.append(token)
        margins.append(float(logits[top2[1]] - logits[top2[0]]))
        logits = engine.forward(token, pos)
    return ids, margins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--llama-completion", required=True, help="path to llama.cpp's llama-completion")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--llama-args", type=shlex.split, default=[], help="more llama-completion arguments ('-ctk f32 -ctv f32')"
    )
    args = parser.parse_args()
    model = Model.load(args.model, threads=args.threads)
    tok = model.tokenizer
    print(f"{'task':<17}{'pyllama':>9}{'llama.cpp':>11}  same prompt  answer tokens agreeing  margin there")
    for task in args.tasks.split(","):
        probe = f"ruler:task={task},length={args.length},seed={args.seed}"
        (seg,) = load_probe(probe, tok, model.config.seq_len).segments
        t = seg.target
        prompt = seg.tokens[: t.prompt].tolist()
        ours, margins = greedy_with_margins(model, prompt, t.generate, t.stop)
        context = t.prompt + t.generate + 16
        # llama.cpp adds the BOS itself where the file says to (Gemma 3): the text then starts after it
        added_bos = tok.vocab.add_bos and prompt[0] == tok.bos_id
        ids, theirs = llamacpp_answer(args.llama_completion, args.model, prompt_text(tok, prompt[added_bos:]),
                                      t.generate, context, args.threads, args.llama_args)  # fmt: skip
        text = tok.decode([prompt[-1], *ours])  # as the leaderboard reads the answer (key_score)
        score = [100.0 * match_all(postprocess(a), t.answers) for a in (text, theirs)]
        # where the answers part: llama.cpp's answer tokenised again (its text gives no ids), the first
        # token that differs. Comparing texts instead put the parting one token late wherever llama.cpp
        # took a longer token that pyllama's text begins ("VA" against "V"), with that token's margin.
        # llama.cpp's answer going on past pyllama's whole one agrees with all of it (its text tokenised
        # again may merge pyllama's last token with what follows: "\n\n" and the "\n\n" it prints at the end)
        their_ids = tok.encode(theirs, bos=False)
        parts = next((i for i, (a, b) in enumerate(zip(ours, their_ids, strict=False)) if a != b), None)
        if parts is None and len(their_ids) < len(ours):
            parts = len(their_ids)  # llama.cpp's answer stops where pyllama's goes on
        if theirs.startswith(text):
            parts = None
        agree = f"{len(ours)} / {len(ours)}" if parts is None else f"{parts} / {len(ours)}"
        margin = "-" if parts is None else f"{margins[parts]:.3f}"
        print(f"{task:<17}{score[0]:>9.1f}{score[1]:>11.1f}  {str(ids == prompt):<12} {agree:<23} {margin}")
        if score[0] != score[1] or parts is not None:
            print(f"    pyllama:   {text!r}\n    llama.cpp: {theirs!r}")


if __name__ == "__main__":
    main()
