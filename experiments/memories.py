"""The experimental memories against exact attention at equal memory budgets.

For each budget (in positions of a dense float32 K/V cache: ``budget x 2 x n_layers x kv_dim x 4``
bytes) every plugin gets settings that hold about that much at the end of the standard probe's long
run, and is diffed against ``causal`` over the standard probe (the causal cache is made as long as
the probe, so every position is compared). Reported per setting: mean and p99 KL(causal ‖ plugin),
top-1 agreement, perplexity ratio, and the bytes held at the last position. ``sliding`` and
``sink`` are the baselines. ``kmeans`` is the odd one out: it keeps the whole cache (it saves
compute, not memory), so it is given the budget as the number of rows it attends.

    python experiments/memories.py -c stories260K.bin -z tok512.bin --out docs/
    python experiments/memories.py -c stories260K.bin -z tok512.bin --growth --steps 4000

Writes ``memories.md`` (the table) and ``memories.png`` (KL against bytes; KL along the long run),
and with ``--growth`` ``memories_growth.md``/``.png``: ``memory_bytes()`` of ``lattice`` against
position while generating far past the context, next to ``sink`` (flat) and ``causal`` (linear).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from pyllama import plots
from pyllama.errors import InputError
from pyllama.kernels.qproduct import simd_path
from pyllama.model import Model
from pyllama.outputs import check_outputs, model_inputs

REPO = Path(__file__).resolve().parents[1]
SHARED_MODELS = REPO.parent / "shared" / "models"
OUTPUTS = ("memories.md", "memories.png", "memories_divergence.png", "memories_growth.md", "memories_growth.png")


def settings(budget: int, long_len: int) -> list[tuple[str, str]]:
    """(family, spec) pairs that hold about ``budget`` dense positions at the end of the long run."""
    half = budget // 2
    return [
        ("sliding", f"sliding:{budget}"),
        ("sink", f"sink:4,{budget - 4}"),
        # attends sinks + window + ~budget/2 chosen rows; holds everything
        ("kmeans", f"kmeans:budget={half},sinks=4,window={half - 4},positions={long_len}"),
        ("kmeans", f"kmeans:budget={half},sinks=4,window={half - 4},estimate,positions={long_len}"),
        # a quarter of the budget exact, warm quantised tokens, cold blocks of 2 x budget tokens
        ("tiered", f"tiered:sinks=4,window={budget // 4},warm={budget},bits=4,group=16,block={2 * budget}"),
        ("tiered", f"tiered:sinks=4,window={budget // 4},warm={half},bits=8,group=16,block={2 * budget},cold_topk=8"),
        # exact sinks + window + staging, and one bucket summary per set bit of t / base
        ("lattice", f"lattice:sinks=4,window={budget - 20},base=8"),
        ("lattice", f"lattice:sinks=4,window={budget - 28},base=2"),
    ]


def run_table(model: Model, budgets: list[int], threads: int | None) -> list[dict]:
    long_len = 4 * model.config.seq_len
    reference = f"causal:positions={long_len}"
    rows = []
    for budget in budgets:
        for family, spec in settings(budget, long_len):
            t0 = time.perf_counter()
            report = model.diff(reference, spec, probe="standard", threads=threads)
            s = report.summary
            rows.append(
                {
                    "budget": budget,
                    "family": family,
                    "spec": spec,
                    "report": report,
                    "mean_kl": s["mean_kl"],
                    "p99_kl": s["p99_kl"],
                    "top1": s["top1_agreement"],
                    "ppl_ratio": s["ppl_ratio"],
                    "bytes": s["bytes_last_b"],
                    "bytes_causal": s["bytes_causal_last"],
                    "budget_bytes": budget * report.kv_bytes_per_position,
                }
            )
            print(
                f"  {spec:<80} mean KL {s['mean_kl']:.4f}  p99 {s['p99_kl']:.3f}  top-1 "
                f"{100 * s['top1_agreement']:.1f}%  ppl x{s['ppl_ratio']:.3f}  {s['bytes_last_b']:,} B  "
                f"({time.perf_counter() - t0:.1f} s)",
                file=sys.stderr,
            )
    return rows


def table_markdown(model: Model, rows: list[dict]) -> str:
    name = Path(str(model.path)).name
    long_len = 4 * model.config.seq_len
    out = [
        f"Against `causal:positions={long_len}` on {name}, standard probe "
        f"({rows[0]['report'].n_positions:,} positions, every one compared). Bytes at the last position of "
        f"the long run (position {long_len - 1}); causal holds {rows[0]['bytes_causal']:,} B there. Kernels: "
        f"the {simd_path()} build (a float32 model's last bits follow the SIMD path: docs/exactness.md).",
        "",
        "| budget | plugin | bytes at the end | x budget | mean KL | p99 KL | top-1 | ppl ratio |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['budget']} ({r['budget_bytes'] // 1024} KiB) | `{r['spec']}` | {r['bytes']:,} | "
            f"{r['bytes'] / r['budget_bytes']:.2f} | {r['mean_kl']:.4f} | {r['p99_kl']:.3f} | "
            f"{100 * r['top1']:.1f}% | {r['ppl_ratio']:.3f} |"
        )
    return "\n".join(out) + "\n"


def table_figures(rows: list[dict], out: Path, context: int) -> None:
    """memories.png: every setting's mean KL against its bytes (the Pareto picture);
    memories_divergence.png: KL and max |Δlogit| along the probe at the largest budget.
    Both are the package's own figures (pyllama.plots), as in the notebooks and `diff --plot`."""
    plots.pareto_figure([r["report"] for r in rows]).savefig(out / "memories.png", dpi=100)
    top = max(r["budget"] for r in rows)
    at_top = [r["report"] for r in rows if r["budget"] == top]
    fig = plots.compare_divergence_figure(at_top, smooth=64, context=context)
    fig.savefig(out / "memories_divergence.png", dpi=100)


def growth(model: Model, steps: int, out: Path, threads: int | None, seed: int = 0) -> str:
    """Generate ``steps`` tokens with lattice (sampled, temperature 1), recording memory_bytes() each
    step beside sink and causal fed the same tokens; writes memories_growth.md and .png."""
    specs = ["lattice", "sink", f"causal:positions={steps}"]
    mem, lat = growth_run(model, specs, steps, threads, seed)
    md = growth_markdown(model, specs, mem, lat, steps)
    (out / "memories_growth.md").write_text(md)
    growth_figure(model, specs, mem, lat, steps).savefig(out / "memories_growth.png", dpi=120)
    return md


def growth_run(
    model: Model, specs: list[str], steps: int, threads: int | None, seed: int
) -> tuple[dict[str, np.ndarray], object]:
    """memory_bytes() after each position for every spec: the first one generates (sampled), the
    others are fed its tokens. Returns the bytes per spec and the first spec's attention object."""
    mem = {}
    rng = np.random.default_rng(seed)
    tokens = None
    first = None
    for spec in specs:
        engine = model.engine(spec, threads)
        m = np.zeros(steps, dtype=np.int64)
        t0 = time.perf_counter()
        if tokens is None:  # the first spec generates; the others are fed the same tokens
            tokens = np.zeros(steps, dtype=np.int64)
            tok = 1
            for pos in range(steps):
                tokens[pos] = tok
                logits = np.asarray(engine.forward(tok, pos), dtype=np.float64)
                p = np.exp(logits - logits.max())
                tok = int(rng.choice(p.size, p=p / p.sum()))
                m[pos] = engine.attention.memory_bytes()
            first = engine.attention
        else:
            for pos in range(steps):
                engine.forward(int(tokens[pos]), pos)
                m[pos] = engine.attention.memory_bytes()
        mem[spec] = m
        print(f"  {spec}: {steps} positions in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return mem, first


def lattice_exact_bytes(model: Model, lat, t: np.ndarray | int) -> np.ndarray | int:
    """Bytes of lattice's exact rows after t positions: sinks + window, plus the staging rows not yet
    merged into a bucket (``(t - sinks - window) % base``), in every layer."""
    row = 2 * model.config.kv_dim * 4
    n_out = np.maximum(t - lat.sinks - lat.window, 0)
    return model.config.n_layers * (np.minimum(t, lat.sinks + lat.window) + n_out % lat.base) * row


def growth_markdown(model: Model, specs: list[str], mem: dict[str, np.ndarray], lat, steps: int) -> str:
    """The growth table at powers of two (and the last position), each lattice row checked against
    its closed form: exact rows plus one summary (a key and a value row and a count) per set bit."""
    checkpoints = [p for p in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384) if p <= steps]
    if steps not in checkpoints:
        checkpoints.append(steps)
    lines = [
        f"`lattice` (defaults: {lat.sinks} sinks, window {lat.window}, base {lat.base}) generating {steps} tokens "
        f"on {Path(str(model.path)).name} (context {model.config.seq_len}); `memory_bytes()` after position t-1:",
        "",
        "| t | lattice bytes | buckets per layer | levels | sink bytes | causal bytes |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    row = 2 * model.config.kv_dim * 4
    for t in checkpoints:
        n_out = max(0, t - lat.sinks - lat.window)
        n_buckets = bin(n_out // lat.base).count("1")
        assert mem["lattice"][t - 1] == lattice_exact_bytes(model, lat, t) + model.config.n_layers * n_buckets * (
            row + 8
        )
        lines.append(
            f"| {t:,} | {int(mem['lattice'][t - 1]):,} | {n_buckets} | {(n_out // lat.base).bit_length()} | "
            f"{int(mem['sink'][t - 1]):,} | {int(mem[specs[2]][t - 1]):,} |"
        )
    lines += ["", f"bucket sizes of layer 0 at the end (oldest first): {lat.bucket_sizes(0)}"]
    return "\n".join(lines) + "\n"


def growth_figure(model: Model, specs: list[str], mem: dict[str, np.ndarray], lat, steps: int):
    """Left: memory_bytes() of every spec against position (log-log); right: lattice's summary rows
    per layer, recovered from its bytes, against popcount and bit length of its bucket units."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.2))
    ax, ax2 = fig.subplots(1, 2)
    x = np.arange(1, steps + 1)
    for spec, color in zip(specs, ("#D55E00", "#000000", "#0072B2"), strict=True):
        ax.plot(x, mem[spec] / 1024, color=color, lw=1.2, label=spec)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.axvline(model.config.seq_len, color="grey", lw=0.8, ls=":")
        a.grid(alpha=0.3, which="both")
        a.set_xlabel("position t (log2)")
    ax.set_yscale("log")
    ax.text(model.config.seq_len, ax.get_ylim()[1] * 0.5, " trained context", color="grey", fontsize=8)
    ax.set_ylabel("memory_bytes() (KiB, log)")
    ax.set_title("flat (sink), linear (causal), logarithmic (lattice)")
    ax.legend(fontsize=8)
    # the summary part: one bucket per set bit of (t - sinks - window) // base
    units = np.maximum(x - lat.sinks - lat.window, 0) // lat.base
    buckets = np.array([bin(int(u)).count("1") for u in units])
    levels = np.array([int(u).bit_length() for u in units])
    summary = mem["lattice"] - lattice_exact_bytes(model, lat, x)
    row = 2 * model.config.kv_dim * 4
    ax2.plot(
        x,
        summary / (model.config.n_layers * (row + 8)),
        color="#D55E00",
        lw=1.0,
        label="bucket summaries per layer (from memory_bytes)",
    )
    ax2.plot(x, buckets, color="#000000", lw=0.8, ls="--", label="popcount((t - sinks - window) // base)")
    ax2.plot(x, levels, color="#0072B2", lw=1.2, label="levels = bit length: log2 t + O(1)")
    ax2.set_ylabel("rows")
    ax2.set_title("lattice: summary rows grow as log t")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-c", "--checkpoint", default=str(SHARED_MODELS / "stories260K.bin"))
    ap.add_argument("-z", "--tokenizer", default=str(SHARED_MODELS / "tok512.bin"))
    ap.add_argument("--out", default=str(REPO / "docs"), help="folder for the table and figures (default: docs/)")
    ap.add_argument("--budgets", default="64,128", help="memory budgets in dense positions, comma-separated")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--growth", action="store_true", help="only the lattice memory-growth run")
    ap.add_argument("--steps", type=int, default=4000, help="positions generated by --growth")
    args = ap.parse_args(argv)
    for f in (args.checkpoint, args.tokenizer):
        if not Path(f).is_file():
            ap.error(f"{f}: no such file (pass -c CHECKPOINT -z TOKENIZER)")
    out = Path(args.out)
    try:  # never write a table or figure over the model or its tokenizer
        check_outputs(model_inputs(args.checkpoint, args.tokenizer), [("--out", out / name) for name in OUTPUTS])
    except InputError as exc:
        sys.exit(f"error: {exc}")
    out.mkdir(parents=True, exist_ok=True)
    model = Model.load(args.checkpoint, tokenizer=args.tokenizer)
    if args.growth:
        print(growth(model, args.steps, out, args.threads))
        return
    budgets = [int(b) for b in args.budgets.split(",")]
    if any(b < 48 or b % 8 for b in budgets):
        ap.error("budgets are multiples of 8, at least 48")
    rows = run_table(model, budgets, args.threads)
    md = table_markdown(model, rows)
    (out / "memories.md").write_text(md)
    table_figures(rows, out, model.config.seq_len)
    print(md)
    assert all(math.isfinite(r["mean_kl"]) for r in rows)


if __name__ == "__main__":
    main()
