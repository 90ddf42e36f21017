"""Regenerate the figure gallery (docs/gallery/*.png) from real stories260K data.

Every figure is drawn by a function of ``pyllama.plots``, the same ones ``pyllama diff --plot``, the
notebooks and the experiments use, so the gallery shows what they produce:

    python docs/make_gallery.py                       # models from shared/models beside the repository
    python docs/make_gallery.py -c stories260K.bin -z tok512.bin --out docs/gallery

The data are those of notebooks/divergence.ipynb and notebooks/past_context.ipynb: each built-in
plugin at the memory of 64 dense positions diffed against ``causal:positions=2048`` over the standard
probe, and the teacher-forced NLL along the probe's long run. Takes about 30 s on two cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pyllama import plots
from pyllama.diff.probes import load_probe
from pyllama.model import Model

REPO = Path(__file__).resolve().parents[1]
SHARED_MODELS = REPO.parent / "shared" / "models"
DPI = 100
BUDGET = 64  # positions of a dense float32 cache: each plugin holds about this much at the end of the long run


def plugin_specs(context: int) -> tuple[str, list[str]]:
    """The reference and the plugins of the divergence figures (as in notebooks/divergence.ipynb)."""
    long = 4 * context
    ref = f"causal:positions={long}"
    return ref, [
        ref,  # the identity: exact
        f"sliding:{BUDGET}",
        f"sink:4,{BUDGET - 4}",
        f"kmeans:budget={BUDGET // 2},sinks=4,window={BUDGET // 2 - 4},positions={long}",
        f"tiered:sinks=4,window={BUDGET // 4},warm={BUDGET},bits=4,group=16,block={2 * BUDGET}",
        f"lattice:sinks=4,window={BUDGET - 20},base=8",
    ]


def teacher_nll(model: Model, spec: str, tokens: np.ndarray) -> np.ndarray:
    """-log P(tokens[pos + 1] | tokens[: pos + 1]) at each position the plugin holds; NaN past it."""
    engine = model.engine(spec, threads=1)
    out = np.full(len(tokens) - 1, np.nan)
    for pos in range(min(len(tokens) - 1, engine.max_positions)):
        logits = np.asarray(engine.forward(int(tokens[pos]), pos), dtype=np.float64)
        out[pos] = np.logaddexp.reduce(logits) - logits[tokens[pos + 1]]
    return out


def save(fig, path: Path) -> None:
    fig.savefig(path, dpi=DPI, pil_kwargs={"optimize": True})
    print(f"  {path.name}: {path.stat().st_size / 1024:.0f} KiB", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--checkpoint", default=str(SHARED_MODELS / "stories260K.bin"))
    ap.add_argument("-z", "--tokenizer", default=str(SHARED_MODELS / "tok512.bin"))
    ap.add_argument("--out", default=str(REPO / "docs" / "gallery"), help="folder for the PNGs (default: docs/gallery)")
    ap.add_argument("--threads", type=int, default=2, help="threads per diff (its two plugins run side by side)")
    args = ap.parse_args(argv)
    for f in (args.checkpoint, args.tokenizer):
        if not Path(f).is_file():
            ap.error(f"{f}: no such file (pass -c CHECKPOINT -z TOKENIZER)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Model.load(args.checkpoint, tokenizer=args.tokenizer, threads=1)
    context = model.config.seq_len
    t0 = time.perf_counter()

    ref, specs = plugin_specs(context)
    reports = [model.diff(ref, spec, probe="standard", threads=args.threads, progress=False) for spec in specs]
    if not reports[0].exact:
        raise SystemExit(f"{ref} against itself is not exact: the engine is broken, no gallery")
    print(f"{len(reports)} diffs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    lattice = reports[-1]
    save(plots.compare_divergence_figure(reports, smooth=32, context=context), out / "divergence.png")
    save(plots.layer_error_figure(lattice), out / "layer_error.png")
    save(plots.compare_memory_figure(reports, context=context), out / "memory.png")
    save(plots.pareto_figure(reports), out / "pareto.png")

    # the overview `pyllama diff --plot` writes, with the recall panel: StreamingLLM inside the context
    overview = model.diff("causal", f"sink:4,{BUDGET - 4}", probe="standard", threads=args.threads, progress=False)
    save(plots.report_figure(overview), out / "overview.png")

    tokens = next(s.tokens for s in load_probe("long", model.tokenizer, context).segments if s.kind == "long")
    nll_specs = ["causal", "sliding:128", "sink:4,124", "sink:4,124,shift", "lattice"]
    nll_specs.append(f"causal:positions={4 * context}")  # exact attention past the context: RoPE extrapolates
    curves = {spec: teacher_nll(model, spec, tokens) for spec in nll_specs}
    save(plots.nll_figure(curves, context=context, smooth=64), out / "nll.png")
    print(f"gallery written to {out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
