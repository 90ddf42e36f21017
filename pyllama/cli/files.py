"""Model files: ``pyllama info`` (what a file holds), ``convert`` (llama2.c to GGUF) and
``download`` (known checkpoints into the cache).
"""

from __future__ import annotations

import json
import os
import sys

import click
import numpy as np

from pyllama import hub
from pyllama.convert import convert_llama2c
from pyllama.errors import DownloadError
from pyllama.load import open_checkpoint

__all__ = ["convert", "download", "info"]


@click.command()
@click.argument("checkpoint", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the facts as one JSON object.")
def info(checkpoint, as_json):
    """Print a model file's config, parameter count, size and format."""
    _, parsed = open_checkpoint(checkpoint)
    config, weights = parsed.config, parsed.weights
    facts = {
        "file": checkpoint,
        "format": weights.format,
        "bytes": weights.file_bytes,
        "parameters": weights.parameter_count(),
        **config.describe(),
        "tensor_types": _tensor_types(weights),
    }
    if as_json:
        click.echo(json.dumps(facts))
        return
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        if isinstance(value, int) and not isinstance(value, bool) and key in ("bytes", "parameters"):
            value = f"{value:,}"
        elif key in _FLOAT32_FACTS:  # a float32 in the file: its shortest float32 form (1e-05, not 9.99...e-06)
            value = str(np.float32(value))
        elif key in ("layer_windows", "layer_rope_bases"):
            value = _per_layer(value, global_zero=key == "layer_windows")
        elif key == "rope_freq_factors" and value is not None:
            value = _runs(value)
        click.echo(f"{key:<{width}}  {value}")


def _tensor_types(weights) -> list[str]:
    """Every tensor type stored in the file, as gguf-py lists a GGUF's (the F32 norm vectors too)."""
    listed = getattr(weights.source, "tensors", None)  # a GGUF's reader: every tensor the file holds
    if listed is not None:
        return sorted({t.tensor_type.name for t in listed})
    # a llama2.c file: its matrices' type, and its norm vectors, which are float32 in every version
    return sorted({t.qtype.name for t in weights.tensors()} | {"F32"})


_FLOAT32_FACTS = ("norm_eps", "embedding_scale", "attention_scale")


def _shown(value, global_zero: bool = False) -> str:
    """A window (0: ``global``) or a float32 number in its shortest form (whole numbers without ``.0``)."""
    if global_zero and value == 0:
        return "global"
    return str(int(value)) if float(value).is_integer() else str(np.float32(value))


def _per_layer(values: list, global_zero: bool = False) -> str:
    """A per-layer list as its distinct values and the layers that have each: ``512 (layers 0-4, 6-10),
    global (layers 5, 11)``; one value: ``global (every layer)``."""
    if len(set(values)) == 1:
        return f"{_shown(values[0], global_zero)} (every layer)"
    groups = []
    for value in dict.fromkeys(values):
        layers = [i for i, v in enumerate(values) if v == value]
        spans: list[list[int]] = []  # [first, last] layer of each run
        for i in layers:
            if spans and spans[-1][1] == i - 1:
                spans[-1][1] = i
            else:
                spans.append([i, i])
        ranges = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
        groups.append(f"{_shown(value, global_zero)} (layers {ranges})")
    return ", ".join(groups)


def _runs(values: list) -> str:
    """Float32 values with repeats collapsed: ``1 x8, 2.69453, 8 x7``."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return ", ".join(_shown(v) + (f" x{n}" if n > 1 else "") for v, n in out)


@click.command()
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option(
    "--type",
    "out_type",
    type=click.Choice(["f32", "f16", "q8_0"]),
    default="f32",
    show_default=True,
    help="How matrices are stored (q8_0: rows that are not whole 32-value blocks stay f32).",
)
@click.option(
    "-z",
    "--tokenizer",
    type=click.Path(dir_okay=False),
    default=None,
    help="The llama2.c tokenizer of the checkpoint (default: tokenizer.bin beside it).",
)
@click.option(
    "--alignment",
    type=click.Choice(["32", "64"]),
    default="32",
    show_default=True,
    help="Where tensors start. 32: GGUF's default, as llama.cpp's converters write. 64: every tensor on a "
    "cache line (general.alignment = 64), which pyllama's float32 kernels read faster; llama.cpp loads it, "
    "but its llama-quantize pads its output at 32 whatever the input says, so quantise from a 32 file.",
)
@click.option("--force", is_flag=True, help="Replace DST if it exists (never the input itself).")
def convert(src, dst, out_type, tokenizer, alignment, force):
    """Write a llama2.c checkpoint SRC (with its tokenizer) as a GGUF file DST that llama.cpp loads.

    \b
    Example:
      pyllama convert stories260K.bin stories260K-q8_0.gguf --type q8_0 -z tok512.bin
    """
    summary = convert_llama2c(src, dst, out_type, tokenizer, force=force, alignment=int(alignment))
    types = ", ".join(f"{n} {k}" for k, n in summary["tensor_types"].items())
    click.echo(f"wrote {dst}: {summary['bytes']:,} bytes ({types} tensors)")


def _home(path) -> str:
    """``path`` with the home folder shown as ``~``."""
    text, home = os.fspath(path), os.path.expanduser("~")
    return "~" + text[len(home) :] if home not in ("", "/") and text.startswith(home + os.sep) else text


@click.command()
@click.argument("names", nargs=-1, metavar="NAME...")
@click.option("--list", "as_list", is_flag=True, help="Show the known names, their sizes and whether each is cached.")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Cache folder (default: $PYLLAMA_CACHE, else ~/.cache/pyllama).",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def download(names, as_list, cache_dir, progress):
    """Fetch known checkpoints and tokenizers into the cache, checking size and sha256.

    \b
    A model's tokenizer comes with it (tokenizer.bin for stories15M/42M/110M, tok512 for
    stories260K; a GGUF model carries its own). Each file comes under its own licence
    (docs/models.md). Afterwards -c/-z take the name anywhere:
      pyllama download stories15M
      pyllama generate -c stories15M -i "Once upon a time"
    $PYLLAMA_DOWNLOAD_MIRROR=URL fetches MIRROR/FILENAME instead of the public URLs.
    """
    if as_list:
        rows = hub.status_rows(cache_dir)
        width = max(len(r["name"]) for r in rows)
        click.echo(f"{'name':<{width}}  {'kind':<9}  {'bytes':>11}  sha256   cached")
        for r in rows:
            sha, cached = "known" if r["sha256"] else "unknown", "yes" if r["cached"] else "no"
            click.echo(f"{r['name']:<{width}}  {r['kind']:<9}  {r['bytes']:>11,}  {sha:<7}  {cached}")
        click.echo(f"cache: {_home(hub.cache_dir(cache_dir))}")
        return
    if not names:
        raise click.UsageError(f"name a file to download ({', '.join(hub.KNOWN)}), or --list")
    wanted: list[str] = []
    for name in names:
        entry = hub.lookup(name)
        if entry is None:
            raise DownloadError(f"{name}: not a known model or tokenizer; known: {', '.join(hub.KNOWN)}")
        for n in (entry.name, entry.tokenizer):
            if n is not None and n not in wanted:
                wanted.append(n)
    show = sys.stderr.isatty() if progress is None else progress
    for name in wanted:
        got = hub.download(name, cache=cache_dir, progress=show)
        where = _home(got.path)
        if got.was_cached:
            click.echo(f"{name}: already in the cache: {where}")
            continue
        check = "sha256 verified" if got.verified else "size checked"
        click.echo(f"{name}: {got.entry.bytes:,} bytes, {check}: {where}")
        if got.entry.licence:
            click.echo(f"note: {name} is provided under and subject to its terms: {got.entry.licence}", err=True)
        if not got.verified:
            click.echo(f"note: {name} was not verified by hash (no published sha256 is known), only by size", err=True)
