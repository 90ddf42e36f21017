"""GGUF speed, pyllama next to llama.cpp's ``llama-bench`` in one run: decode, prompt processing, bandwidth.

Seeded random-weight checkpoints of the tinyllamas shapes (speed does not depend on weight values)
are written with the shared tool and converted with ``pyllama convert`` to F32 and Q8_0 GGUF files;
with ``--llama-quantize`` the F32 file is also quantised by llama.cpp's own tool to the types of
``--quant-types`` (Q4_0, Q4_K_M, Q6_K by default), the files people download. ``--gguf FILE`` adds
any other GGUF (SmolLM2-135M-Instruct.Q4_1.gguf, say). Each file is timed by both engines at the
same thread count:

* decode: llama.cpp's text-generation test (``llama-bench -p 0 -n 128``: 128 tokens decoded one at
  a time from an empty context) against pyllama generating 128 tokens after BOS
  (``Generation.tok_per_s``, timed from the end of the first forward pass as run.c does);
* prompt processing (``--prompt``): ``llama-bench -p N -n 0`` against pyllama's block forward over
  N seeded random ids from position 0 (``pyllama bench``'s ``prompt_tok_per_s``), N = 256 where the
  context is 256 (the stories15M shape), 512 otherwise;
* the streaming limit (``--stream-limit``, F32 files): numpy's OpenBLAS ``W @ x`` over every matrix
  a token reads, threads pinned (``bench_engine.streaming_limit``), and each engine's decode as a
  fraction of it.

The two engines take turns, one run each, ``--repeats`` times per file and test, and each reports
its best run (``--statistic median``: the median): on a shared machine the fastest run is the one
least disturbed by other processes, and taking turns gives both engines the same quiet moments.
``--fa0-beside`` times llama-bench in every round also with ``-fa 0`` (newer builds attend with
flash attention by default, another arithmetic than pyllama's). Results are ratios measured in the
same run.

    python benchmarks/bench_gguf.py --llama-bench PATH/llama-bench --llama-quantize PATH/llama-quantize \\
        --threads 2 --repeats 5 --prompt --stream-limit --gguf SmolLM2-135M-Instruct.Q4_1.gguf

``--llama-bench`` takes a llama-bench binary you built from llama.cpp's sources (CPU backend;
leave AMX off: on CPUs with AMX, llama.cpp's AMX F16 kernel mis-computes rows whose length is not a
multiple of 16). Without it only pyllama's numbers are printed. Models and GGUF files go to
``--workdir`` (default: a cache folder outside the repository) and are reused between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import streaming_limit  # noqa: E402
from random_checkpoints import SHARED, random_checkpoint  # noqa: E402

from pyllama.bench import _prompt_runs  # noqa: E402
from pyllama.model import Model  # noqa: E402

SHAPES = ("stories15M", "stories42M", "stories110M")
CONVERTED = ("f32", "q8_0")  # written by pyllama convert
QUANTIZED = ("q4_0", "q4_k_m", "q6_k")  # written by llama-quantize from the F32 file


def default_workdir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "pyllama" / "bench-gguf"


def make_gguf(shape: str, qtype: str, workdir: Path, tokenizer: Path, quantize: str | None) -> Path | None:
    """The ``shape`` file stored as ``qtype`` (None when it needs llama-quantize and there is none)."""
    ckpt = random_checkpoint(shape, workdir)
    out = workdir / f"{shape}-random-{qtype}.gguf"
    if out.exists() and out.stat().st_mtime >= ckpt.stat().st_mtime:
        return out
    convert = [sys.executable, "-m", "pyllama", "convert", str(ckpt)]
    if qtype in CONVERTED:  # tensors on 64-byte lines, as both engines read them best
        cmd = [*convert, str(out), "--type", qtype, "-z", str(tokenizer), "--alignment", "64"]
    elif quantize:
        # llama-quantize pads its output at 32 bytes whatever its input's alignment: its input is a
        # file of GGUF's default alignment (from a 64 one it writes a file that does not load)
        f32 = workdir / f"{shape}-random-f32-align32.gguf"
        if not f32.exists() or f32.stat().st_mtime < ckpt.stat().st_mtime:
            subprocess.run(
                [*convert, str(f32), "--type", "f32", "-z", str(tokenizer), "--force"], check=True, capture_output=True
            )
        cmd = [quantize, str(f32), str(out), qtype.upper(), "2"]
    else:
        return None
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def pyllama_tok_s(model: Model, n_gen: int, threads: int) -> float:
    """One run: tok/s of ``n_gen`` tokens decoded after BOS."""
    return model.generate([1], steps=n_gen + 1, temperature=0.0, ignore_eos=True, threads=threads).tok_per_s


def llama_bench(binary: str, path: Path, n_prompt: int, n_gen: int, threads: int, extra: tuple[str, ...] = ()) -> dict:
    """One run of a llama-bench test (it warms up first by itself): its JSON record. ``extra``: more
    llama-bench arguments (``-fa 0``: newer builds attend with flash attention by default, another
    arithmetic than pyllama's, which is llama.cpp's without it)."""
    cmd = [binary, "-m", str(path), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads), "-r", "1", "-o", "json"]
    cmd += list(extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    (result,) = [r for r in json.loads(proc.stdout) if r.get("n_gen") == n_gen and r.get("n_prompt") == n_prompt]
    return result


def build_line(record: dict) -> str:
    """llama-bench's own closing line, ``build: <commit> (<number>)``."""
    return f"build: {record.get('build_commit')} ({record.get('build_number')})"


def measure(label: str, qtype: str, path: Path, args: argparse.Namespace) -> dict:
    model = Model.load(path, threads=args.threads)
    pyllama_tok_s(model, min(args.tokens, 16), args.threads)  # warm-up
    n_prompt = 256 if model.config.seq_len <= 256 else 512
    row: dict = {"model": label, "type": qtype.upper(), "mib": path.stat().st_size / 2**20, "n_prompt": n_prompt}
    flash = [("", tuple(args.llama_bench_args))]  # llama-bench's settings: its own, and -fa 0 beside it
    if args.fa0_beside:
        flash.append(("_fa0", (*args.llama_bench_args, "-fa", "0")))
    runs: dict[str, list[float]] = {}
    prompt = args.prompt and qtype.lower() in args.prompt_types.split(",")
    for _ in range(args.repeats):  # turns: one run of each engine per round
        runs.setdefault("tg", []).append(pyllama_tok_s(model, args.tokens, args.threads))
        for suffix, extra in flash if args.llama_bench else ():
            rec = llama_bench(args.llama_bench, path, 0, args.tokens, args.threads, extra)
            runs.setdefault("tg_llama" + suffix, []).append(rec["avg_ts"])
            row["build"] = build_line(rec)
        if prompt:
            runs.setdefault("pp", []).append(max(_prompt_runs(model, "causal", n_prompt, 1)[0]))
            for suffix, extra in flash if args.llama_bench else ():
                rec = llama_bench(args.llama_bench, path, n_prompt, 0, args.threads, extra)
                runs.setdefault("pp_llama" + suffix, []).append(rec["avg_ts"])
                row["flash_attn" + suffix] = rec.get("flash_attn")
    reduce = max if args.statistic == "best" else statistics.median
    row.update({k: reduce(v) for k, v in runs.items()})
    if args.stream_limit and qtype == "f32":
        with threadpool_limits(args.threads):
            row["stream_limit_tok_s"], row["stream_gb_s"] = streaming_limit(model)
    print("  " + json.dumps(row), file=sys.stderr, flush=True)
    return row


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def fmt(x: float | None) -> str:
    return f"{x:.1f}" if x else "-"


def print_tables(rows: list[dict], args: argparse.Namespace) -> None:
    builds = sorted({r["build"] for r in rows if r.get("build")})
    print(
        f"\n{args.threads} threads, {args.statistic} of {args.repeats}, the engines taking turns; "
        f"llama-bench {', '.join(builds)}"
    )
    for test, title in (("tg", f"decode tok/s ({args.tokens} tokens)"), ("pp", "prompt processing tok/s")):
        if test == "pp" and not args.prompt:
            continue
        fa = sorted({str(r.get("flash_attn")) for r in rows if r.get("flash_attn") is not None})
        setting = " ".join(args.llama_bench_args) or "as built"
        print(f"\n{title}; llama-bench {setting} (flash_attn: {', '.join(fa) or '-'})")
        beside = " | llama.cpp -fa 0 | pyllama / -fa 0" if args.fa0_beside else ""
        print(f"\n| model | type | MiB | N | pyllama tok/s | llama.cpp tok/s | pyllama / llama.cpp{beside} |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if beside else ""))
        for r in rows:
            if not r.get(test):
                continue
            n = r["n_prompt"] if test == "pp" else args.tokens
            peer = r.get(test + "_llama")
            line = f"| {r['model']} | {r['type']} | {r['mib']:.1f} | {n} | {fmt(r[test])} | {fmt(peer)} | "
            line += f"{ratio(r[test], peer)} |"
            if beside:
                fa0 = r.get(test + "_llama_fa0")
                line += f" {fmt(fa0)} | {ratio(r[test], fa0)} |"
            print(line)
    limited = [r for r in rows if r.get("stream_limit_tok_s")]
    if limited:
        print("\nF32 decode against the streaming limit (numpy OpenBLAS W @ x over the same matrices)\n")
        print("| model | limit tok/s | limit GB/s | pyllama of limit | llama.cpp of limit |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for r in limited:
            lim = r["stream_limit_tok_s"]
            print(
                f"| {r['model']} | {lim:.1f} | {r['stream_gb_s']:.1f} | {ratio(r['tg'], lim)} | "
                f"{ratio(r['tg_llama'], lim)} |"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", help="path to llama.cpp's llama-bench binary (CPU build)")
    ap.add_argument(
        "--llama-bench-args",
        type=shlex.split,
        default=(),
        help="more llama-bench arguments, e.g. '-fa 0' (flash attention off: pyllama attends as llama.cpp does "
        "without it; builds from mid 2025 on turn it on by default)",
    )
    ap.add_argument("--llama-quantize", help="path to llama.cpp's llama-quantize (adds the --quant-types files)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}; '' for none"
    )
    ap.add_argument("--types", default=",".join(CONVERTED + QUANTIZED), help="comma-separated storage types")
    ap.add_argument("--gguf", type=Path, action="append", default=[], help="another GGUF file to time (repeatable)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens to decode per run (llama-bench -n)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per engine and file, taking turns")
    ap.add_argument(
        "--statistic", choices=("best", "median"), default="best", help="what of the runs counts (default: best)"
    )
    ap.add_argument("--fa0-beside", action="store_true", help="also time llama-bench with -fa 0 in every round")
    ap.add_argument("--prompt", action="store_true", help="also time prompt processing (pp256 / pp512)")
    ap.add_argument("--prompt-types", default="f32,q8_0", help="the storage types --prompt times")
    ap.add_argument("--stream-limit", action="store_true", help="F32 files: decode as a fraction of the BLAS limit")
    ap.add_argument("--workdir", type=Path, default=default_workdir())
    ap.add_argument(
        "--tokenizer",
        type=Path,
        default=SHARED / "models" / "tokenizer.bin",
        help="the 32,000-token llama2.c tokenizer.bin (the GGUF files need a vocabulary)",
    )
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.tokenizer.exists():
        ap.error(f"{args.tokenizer}: not found; pass the llama2.c tokenizer.bin with --tokenizer")

    rows = [measure(*path.stem.rpartition(".")[::2], path, args) for path in args.gguf]  # name.TYPE.gguf
    for shape in filter(None, args.shapes.split(",")):
        for qtype in args.types.split(","):
            path = make_gguf(shape, qtype, args.workdir, args.tokenizer, args.llama_quantize)
            if path is None:
                print(f"  {shape} {qtype}: skipped (needs --llama-quantize)", file=sys.stderr)
                continue
            rows.append(measure(shape, qtype, path, args))
    print_tables(rows, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
