"""The ``pyllama`` command line: generate, tokenize, info (and the commands other modules add).

Errors a user can cause print one line (``error: ...``) and exit non-zero; ``--debug`` shows the
traceback instead. The core never imports click: only this module does.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import click

from pyllama import options
from pyllama.errors import PyllamaError, TokenizerError

EXIT_USER_ERROR = 1
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a command killed by a closed pipe exits with (`| head`)


class PyllamaGroup(click.Group):
    """Turns PyllamaError (and unreadable files) into one line on stderr and a non-zero exit."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # the reader went away (`| head -c 100`): stop quietly, as other command-line tools do.
            # stdout goes to /dev/null so that the interpreter's last flush does not fail again.
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # no real file descriptor (a test runner's stdout)
                pass
            ctx.exit(EXIT_BROKEN_PIPE)
        except (PyllamaError, OSError) as exc:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            msg = str(exc) if isinstance(exc, PyllamaError) else f"{exc.filename or ''}: {exc.strerror or exc}"
            click.echo(f"error: {msg}", err=True)
            ctx.exit(EXIT_USER_ERROR)
        except click.UsageError as exc:
            # click would print the whole usage block; one line says what is wrong and where to look
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            click.echo(f"error: {exc.format_message()} (see: {where} --help)", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=PyllamaGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show Python tracebacks instead of one-line errors.")
@click.version_option(package_name="pyllama-attn")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """pyllama: a fast, exact Llama engine for experimenting with attention.

    Models are llama2.c checkpoints (.bin) or GGUF files, memory-mapped. Attention is a plugin
    (--attention SPEC) that owns the whole KV cache; `pyllama plugins` lists them.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


# ---- shared options (defined once) ------------------------------------------------------------
def _in_range(check):
    """A click callback running one of pyllama.options' checks (the Python API runs the same)."""

    def callback(ctx: click.Context, param: click.Parameter, value):
        try:
            return check(value, name="")
        except PyllamaError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return callback


def _threads_in_range(value: int | None, name: str) -> int | None:
    return options.check_threads(value, name=name, allow_default=False)


checkpoint_option = click.option(
    "-c",
    "--checkpoint",
    required=True,
    type=click.Path(dir_okay=False),
    help="Model file: a llama2.c .bin (versions 0/1/2) or a .gguf, or a downloaded name (pyllama download --list).",
)
tokenizer_option = click.option(
    "-z",
    "--tokenizer",
    type=click.Path(dir_okay=False),
    default=None,
    help="Tokenizer: llama2.c tokenizer.bin/tok512.bin, or a GGUF. Default: the GGUF's own, or tokenizer.bin "
    "beside the checkpoint.",
)
threads_option = click.option(
    "--threads",
    type=int,
    default=None,
    callback=_in_range(_threads_in_range),
    help="Threads for the kernels and plugins (default: all cores; at most 4 per core). Results are identical "
    "for any count.",
)
attention_option = click.option(
    "--attention",
    "-a",
    default="causal",
    show_default=True,
    help="Attention plugin spec, e.g. causal, sliding:256, sink:4,252 (see `pyllama plugins`).",
)


def _require_tokenizer(model, checkpoint: str) -> None:
    """generate and diff need text: say why there is no tokenizer (none beside it, or one that does not fit)."""
    if model.tokenizer is None:
        if model.tokenizer_problem:
            raise TokenizerError(f"{model.tokenizer_problem}; pass the model's tokenizer with -z")
        raise click.UsageError(f"{checkpoint}: no tokenizer found beside it; pass one with -z")


@main.command()
@checkpoint_option
@tokenizer_option
@click.option("-i", "--prompt", default="", help="Prompt text (BOS and a leading space token are added, as run.c).")
@click.option(
    "-n",
    "--steps",
    type=int,
    default=256,
    show_default=True,
    callback=_in_range(options.check_steps),
    help="Positions to run, prompt included; 0 = the model's context. Clamped to what the plugin holds.",
)
@click.option(
    "-t",
    "--temperature",
    type=float,
    default=1.0,
    show_default=True,
    callback=_in_range(options.check_temperature),
    help="0 = greedy argmax; otherwise softmax(logits / T) sampling (finite, >= 0).",
)
@click.option(
    "-p",
    "--topp",
    type=float,
    default=0.9,
    show_default=True,
    callback=_in_range(options.check_topp),
    help="Top-p (nucleus) sampling threshold in [0, 1]; 0 or 1 samples from the full distribution.",
)
@click.option(
    "-s",
    "--seed",
    type=int,
    default=0,
    callback=_in_range(options.check_seed),
    help="RNG seed in [0, 2^64 - 1]; 0 = from the clock (like run.c).",
)
@attention_option
@threads_option
@click.option(
    "--ignore-eos",
    is_flag=True,
    help="Keep generating when an end token is sampled (BOS for llama2.c models, as run.c; "
    "the vocabulary's end-of-generation tokens for GGUF, as llama.cpp).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object {prompt_ids, ids, text, tok_per_s, prompt_tok_per_s, memory_bytes} "
    "instead of streaming.",
)
def generate(checkpoint, tokenizer, prompt, steps, temperature, topp, seed, attention, threads, ignore_eos, as_json):
    """Generate text, token for token like llama2.c's run.c with the same options.

    \b
    Example:
      pyllama generate -c stories260K.bin -z tok512.bin -i "Once upon a time" -t 0 -n 256
    Text streams to stdout; the achieved tok/s (from the end of the first forward pass, as run.c
    measures it) goes to stderr.
    """
    from pyllama.model import Model

    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads or 0)
    _require_tokenizer(model, checkpoint)

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = model.generate(
        prompt,
        steps=steps,
        temperature=temperature,
        topp=topp,
        seed=seed or None,
        attention=attention,
        threads=threads,
        ignore_eos=ignore_eos,
        on_text=None if as_json else stream,
    )
    for notice in result.notices:
        click.echo(f"note: {notice}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json()))
    else:
        sys.stdout.write("\n")
        if result.steps > 1:
            click.echo(f"achieved tok/s: {result.tok_per_s:f}", err=True)
        if len(result.prompt_ids) > 1:
            click.echo(f"prompt tok/s: {result.prompt_tok_per_s:f}", err=True)


@main.command()
@tokenizer_option
@click.option("--no-bos", is_flag=True, help="Do not prepend BOS (the raw encoding).")
@click.option("--json", "as_json", is_flag=True, help='Print {"ids": [...]}.')
@click.argument("text")
def tokenize(tokenizer, no_bos, as_json, text):
    """Print the token ids of TEXT, as run.c's encode(bos=1, eos=0) gives them.

    \b
    Example:
      pyllama tokenize -z tok512.bin "Once upon a time"   ->   1 403 407 261 378
    """
    from pyllama.tokenizer import load_tokenizer

    if tokenizer is None:
        raise click.UsageError("pass the tokenizer with -z (a llama2.c tokenizer .bin or a GGUF file)")
    tok = load_tokenizer(tokenizer)
    ids = tok.encode(text, bos=False if no_bos else None, eos=False)
    if as_json:
        click.echo(json.dumps({"ids": list(ids)}))
    else:
        click.echo(" ".join(str(i) for i in ids))


@main.command()
@click.argument("checkpoint", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the facts as one JSON object.")
def info(checkpoint, as_json):
    """Print a model file's config, parameter count, size and format."""
    from pyllama.checkpoint import load_checkpoint

    config, weights = load_checkpoint(checkpoint)
    facts = {
        "file": checkpoint,
        "format": weights.format,
        "bytes": weights.file_bytes,
        "parameters": weights.parameter_count(),
        **config.describe(),
        "tensor_types": sorted({t.qtype.name for t in weights.tensors()}),
    }
    if as_json:
        click.echo(json.dumps(facts))
        return
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        if isinstance(value, int) and not isinstance(value, bool) and key in ("bytes", "parameters"):
            value = f"{value:,}"
        click.echo(f"{key:<{width}}  {value}")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@tokenizer_option
@click.option("-i", "--prompt", required=True, help="Prompt text (BOS first, as llama.cpp tokenises it).")
@click.option(
    "--compare",
    "log",
    type=click.Path(dir_okay=False),
    default=None,
    help="A llama-eval-callback log of the same prompt: show llama.cpp's sums and the relative difference.",
)
@threads_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object {prompt_ids, tensors: [...]}.")
def trace(model, tokenizer, prompt, log, threads, as_json):
    """Sum every intermediate tensor of PROMPT under llama.cpp's names (inp_embd, Qcur-0, ... result_output).

    \b
    Example:
      llama-eval-callback -m stories260K-f32.gguf -p "Hello world" -n 1 > evalcb.log 2>&1
      pyllama trace stories260K-f32.gguf -i "Hello world" --compare evalcb.log
    """
    from pyllama.trace import format_rows, trace_file

    ids, rows = trace_file(model, prompt, tokenizer, log, threads)
    if as_json:
        click.echo(json.dumps({"prompt_ids": ids, "tensors": [r.to_json() for r in rows]}))
        return
    click.echo(f"prompt ids: {' '.join(map(str, ids))}")
    click.echo(format_rows(rows))


@main.command()
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
@click.option("--force", is_flag=True, help="Replace DST if it exists (never the input itself).")
def convert(src, dst, out_type, tokenizer, force):
    """Write a llama2.c checkpoint SRC (with its tokenizer) as a GGUF file DST that llama.cpp loads.

    \b
    Example:
      pyllama convert stories260K.bin stories260K-q8_0.gguf --type q8_0 -z tok512.bin
    """
    from pyllama.convert import convert_llama2c

    summary = convert_llama2c(src, dst, out_type, tokenizer, force=force)
    types = ", ".join(f"{n} {k}" for k, n in summary["tensor_types"].items())
    click.echo(f"wrote {dst}: {summary['bytes']:,} bytes ({types} tensors)")


EXIT_NOT_EXACT = 3  # diff --expect-exact: the two plugins are not bit-identical


def _output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An output of diff must be writable before the diff runs, not found unwritable after it."""
    if value is None:
        return None
    folder = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{value}: the folder {folder} does not exist", ctx=ctx, param=param)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{value}: the folder {folder} is not writable", ctx=ctx, param=param)
    return value


def _output_figure(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A figure path needs a writable folder and an extension matplotlib knows how to write."""
    if _output_file(ctx, param, value) is None:
        return None
    from matplotlib.backend_bases import FigureCanvasBase

    known = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(value)[1].lstrip(".").lower()
    if ext not in known:
        got = f"the extension .{ext}" if ext else "no extension"
        raise click.BadParameter(
            f"{value}: {got} is not a figure format; use one of {', '.join(sorted(known))}", ctx=ctx, param=param
        )
    return value


@main.command()
@click.argument("a")
@click.argument("b")
@checkpoint_option
@tokenizer_option
@click.option(
    "--probe",
    "probe",
    default=None,
    metavar="NAME[:OPTIONS]|FILE",
    help="standard (default: short stories, a run to 4x the context, name recall), stories, long, "
    "recall, or a text file (sequences separated by lines holding only <|endoftext|>). Retrieval "
    "probes, generated and seeded: passkey[:depth=0.5,length=N,seed=0,digits=5,chat=auto], "
    "needle[:depths=0/0.25/0.5/0.75/1,lengths=N/M,...] (one passkey per depth x length; "
    "default lengths 1/4, 1/2 and all of the context), copy[:span=32,length=N,seed=0]; "
    "length = tokens in the sequence (default half the context).",
)
@click.option(
    "--text",
    "text_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="A text file as the probe (same as --probe FILE).",
)
@click.option("-i", "--prompt", default=None, help="This prompt text as the probe.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    callback=_output_file,
    help="Write the summary and every per-position row as JSON.",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    callback=_output_file,
    help="Write every per-position row as CSV.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    callback=_output_figure,
    help="Write the overview figure (|Δlogit|, KL, per-layer error, memory, recall), e.g. diff.png "
    "(any format matplotlib writes: png, pdf, svg ...).",
)
@click.option(
    "--expect-exact",
    is_flag=True,
    help=f"Exit with status {EXIT_NOT_EXACT} unless every logit is bit-identical (max |Δlogit| == 0).",
)
@threads_option
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal, for long probes).")
@click.option(
    "--blocks/--no-blocks",
    default=True,
    show_default=True,
    help="Run positions in blocks (each weight read once per block; the same report) or one at a time.",
)
def diff(
    a,
    b,
    checkpoint,
    tokenizer,
    probe,
    text_file,
    prompt,
    json_path,
    csv_path,
    plot_path,
    expect_exact,
    threads,
    progress,
    blocks,
):
    """Teacher-force one token sequence through attention plugins A and B and compare them.

    \b
    Both share the model's weights. Per position: max |Δlogit|, KL(P_A ‖ P_B) in float64, top-1
    agreement, the teacher token's Δ log-prob, each layer's relative error of the attention output
    and each plugin's memory_bytes(). A sequence longer than a plugin holds is compared over the
    positions both hold (a note says so).

    \b
    Examples:
      pyllama diff causal sliding:64 -c stories260K.bin -z tok512.bin --plot sliding.png
      pyllama diff causal sink:0,64 --probe stories -c stories260K.bin -z tok512.bin
      pyllama diff causal:positions=2048 sink:4,60,shift -c stories260K.bin -z tok512.bin --csv rows.csv
      pyllama diff causal sliding:4096 -c stories260K.bin -z tok512.bin --expect-exact
      pyllama diff causal sink:4,256 -c SmolLM2-135M-Instruct --probe passkey:depth=0.5,length=1200

    \b
    On a retrieval probe (passkey, needle, copy) it also prints, per sequence and side, P(key)
    teacher-forced, the worst rank of the key's tokens, the greedy answer, and whether the plugin
    retrieves the key (every key token rank 1, the greedy answer holds it); for copy the loss on
    the second copy.
    """
    from pyllama.diff.probes import Probe, probe_from_text
    from pyllama.model import Model

    given = [x for x in (probe, text_file, prompt) if x is not None]
    if len(given) > 1:
        raise click.UsageError("give one of --probe, --text and -i/--prompt")
    model = Model.load(checkpoint, tokenizer=tokenizer, threads=threads or 0)
    _require_tokenizer(model, checkpoint)
    source: Probe | str
    if prompt is not None:
        source = probe_from_text(prompt, model.tokenizer, name="prompt")
    else:
        source = text_file or probe or "standard"
    report = model.diff(a, b, probe=source, threads=threads, progress=progress, blocks=blocks)
    click.echo(report.table())
    for path, write in ((json_path, report.to_json), (csv_path, report.to_csv), (plot_path, report.plot)):
        if path:
            write(path)
            click.echo(f"wrote {path}", err=True)
    if expect_exact and not report.exact:
        fd = report.summary.get("first_diff")
        where = f", first at position {fd['position']} of {fd['sequence']}" if fd else ""
        mx = report.summary.get("max_abs_dlogit", float("nan"))
        click.echo(f"error: not exact: max |Δlogit| = {mx:.6g}{where}", err=True)
        sys.exit(EXIT_NOT_EXACT)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, origin, description, knobs, error}.")
@click.option("--markdown", is_flag=True, help="Print the README table of plugins and knobs.")
def plugins(as_json, markdown):
    """List every attention plugin: built-ins, installed (entry point group pyllama.attention), registered.

    \b
    Use one with --attention NAME[:ARGS]: positional values fill the knobs in order, key=value sets
    one, a bare bool knob name sets it true (sliding:256, sink:4,252,shift, causal:positions=2048).
    A class in a local file is path/to/file.py:ClassName[:ARGS] (a .pyx file is compiled on first use).
    """
    from pyllama.attention.registry import plugin_infos, plugins_markdown

    infos = plugin_infos()
    if as_json:
        click.echo(json.dumps([i.to_json() for i in infos]))
        return
    if markdown:
        click.echo(plugins_markdown())
        return
    width = max([len(i.name) for i in infos] + [6])
    for info in infos:
        if info.error:
            click.echo(f"{info.name:<{width}}  [{info.origin}] cannot be used: {info.error}")
            continue
        origin = "" if info.origin == "built-in" else f"  [{info.origin}]"
        click.echo(f"{info.name:<{width}}  {info.description}{origin}")
        for k in info.knobs:
            click.echo(
                f"{'':<{width}}    {k.name:<10} {k.describe_range():<14} default {k.describe_default():<8} {k.help}"
            )
    click.echo(
        "\nUse: --attention NAME[:ARGS], e.g. sink:4,252,shift; "
        "a local class: path/to/file.py:ClassName[:ARGS] (or .pyx)"
    )


def _home(path) -> str:
    """``path`` with the home folder shown as ``~``."""
    import os

    text, home = os.fspath(path), os.path.expanduser("~")
    return "~" + text[len(home) :] if home not in ("", "/") and text.startswith(home + os.sep) else text


@main.command()
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
    stories260K; a GGUF model carries its own). Afterwards -c/-z take the name anywhere:
      pyllama download stories15M
      pyllama generate -c stories15M -i "Once upon a time"
    $PYLLAMA_DOWNLOAD_MIRROR=URL fetches MIRROR/FILENAME instead of the public URLs.
    """
    from pyllama import hub
    from pyllama.errors import DownloadError

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
        if not got.verified:
            click.echo(f"note: {name} was not verified by hash (no published sha256 is known), only by size", err=True)


@main.command()
@checkpoint_option
@tokenizer_option
@click.option(
    "-n",
    "--steps",
    type=click.IntRange(min=2),
    default=256,
    show_default=True,
    help="Positions per run, prompt included (clamped to what the attention plugin holds).",
)
@threads_option
@attention_option
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Runs; tok/s is the best.")
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Positions of the prompt-processing runs (llama-bench -p; clamped to what the plugin holds).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def bench(checkpoint, tokenizer, steps, threads, attention, repeats, prompt_tokens, as_json):
    """Decode tok/s, load time, bytes read per token and the bandwidth they imply.

    \b
    Greedy, end tokens ignored, tok/s measured as `generate` measures it (best of --repeats).
    bytes/token: every layer matrix and the classifier as stored (quantised sizes included),
    which each decode step reads once; GB/s = bytes/token x tok/s.
    Example:
      pyllama bench -c stories260K.bin -z tok512.bin --steps 256
    """
    from pyllama.bench import run_bench

    result = run_bench(
        checkpoint,
        tokenizer,
        steps=steps,
        threads=threads or 0,
        attention=attention,
        repeats=repeats,
        prompt_tokens=prompt_tokens,
    )
    for notice in result.notices:
        click.echo(f"note: {notice}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json()))
        return
    facts = {
        "checkpoint": result.checkpoint,
        "attention": result.attention,
        "threads": result.threads,
        "steps": f"{result.steps} (best of {result.repeats})",
        "decode tok/s": f"{result.tok_per_s:,.1f}",
        "prompt tok/s": f"{result.prompt_tok_per_s:,.1f} ({result.prompt_tokens} positions)",
        "load ms": f"{result.load_ms:,.2f}",
        "weights bytes": f"{result.weights_bytes:,}",
        "bytes/token": f"{result.bytes_per_token:,}",
        "effective GB/s": f"{result.gb_per_s:.2f}",
        "attention memory": f"{result.memory_bytes:,} B",
    }
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        click.echo(f"{key:<{width}}  {value}")


from pyllama.sweep.cli import sweep  # noqa: E402  (its own module: the study runner's options live with it)

main.add_command(sweep)

from pyllama.cli_chat import chat  # noqa: E402  (it takes the shared options defined above)

main.add_command(chat)

if __name__ == "__main__":
    main()
