"""Option values outside their range are refused in one line that states the range, from the CLI
and from Python alike (never clamped in silence, never an OverflowError or a MemoryError traceback);
output problems are found before the work is done; a closed pipe ends the output quietly."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.errors import PyllamaError
from pyllama.model import Model


def _fails(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def model_args():
    return ["-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]


@pytest.fixture(scope="module")
def model():
    return Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"))


def test_steps_that_end_inside_the_prompt_say_so(model):
    """steps count positions, the prompt's included: fewer than the prompt's tokens generate nothing,
    which a notice says; as many generate one token (run.c samples after the prompt's last position)."""
    short = model.generate("Once upon a time", steps=4, temperature=0.0)
    assert short.ids == [] and any("nothing is generated" in n for n in short.notices), short.notices
    full = model.generate("Once upon a time", steps=5, temperature=0.0)
    assert len(full.ids) == 1 and not any("nothing is generated" in n for n in full.notices)


# ---- sampling and run options ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, says",
    [
        (["-p", "2"], "0 <= x <= 1"),
        (["-p", "-0.5"], "0 <= x <= 1"),
        (["-p", "nan"], "0 <= x <= 1"),
        (["-t", "-1"], "x >= 0"),
        (["-t", "nan"], "x >= 0"),
        (["-t", "inf"], "x >= 0"),
        (["-n", "-5"], "x >= 0"),
        (["--threads", "0"], "1 <= x <= "),
        (["--threads", "1000"], "1 <= x <= "),
        (["-s", str(2**64)], f"0 <= x <= {2**64 - 1}"),
        (["-s", "-1"], f"0 <= x <= {2**64 - 1}"),
    ],
)
def test_generate_refuses_values_out_of_range(model_args, args, says):
    line = _fails(["generate", *model_args, "-i", "Once", *args])
    assert says in line, line


@pytest.mark.parametrize("command", ["bench", "diff"])
def test_threads_are_bounded_in_every_command(model_args, command):
    extra = ["causal", "causal", "-i", "Once"] if command == "diff" else []
    line = _fails([command, *extra, *model_args, "--threads", "1000"])
    assert "1 <= x <= " in line


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"topp": 2.0}, "topp"),
        ({"topp": math.nan}, "topp"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"steps": -5}, "steps"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -3}, "seed"),
        ({"threads": 1000}, "threads"),
        ({"threads": -1}, "threads"),
    ],
)
def test_the_python_api_refuses_them_too(model, kwargs, says):
    with pytest.raises(PyllamaError, match=says):
        model.generate("Once", **{"steps": 8, **kwargs})


@pytest.mark.parametrize(
    ("tokens", "says"),
    [
        ([1.5, 2], "integer ids"),
        ([1, 2**33], "outside the vocabulary"),  # not wrapped to a valid int32 id
        ([], "non-empty"),
        ([[1, 2]], "1-D"),
    ],
)
def test_logits_refuses_what_is_not_a_sequence_of_ids(model, tokens, says):
    with pytest.raises(PyllamaError, match=says):
        model.logits(tokens)


def test_tokenize_refuses_what_is_not_text(model):
    with pytest.raises(PyllamaError, match="must be a str"):
        model.tokenize(5)


def test_model_load_refuses_a_thread_count_out_of_range():
    with pytest.raises(PyllamaError, match="threads"):
        Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=100000)


def test_largest_seed_is_accepted(model):
    a = model.generate("Once", steps=12, temperature=1.0, seed=2**64 - 1)
    b = model.generate("Once", steps=12, temperature=1.0, seed=2**64 - 1)
    assert a.ids == b.ids


# ---- knob values beyond what the machine holds -------------------------------------------------------
HUGE_KNOBS = [
    ("sliding:99999999999999999999", "window"),
    ("causal:positions=99999999999", "bytes"),
    ("sink:sinks=9223372036854775807", "bytes"),
    ("lattice:base=4611686018427387904", "bytes"),
    ("sliding:4000000000000", "bytes"),
    ("kmeans:positions=99999999999", "bytes"),
    ("tiered:positions=99999999999", "bytes"),
    ("kmeans:clusters=9223372036854775807", "bytes"),
]


@pytest.mark.parametrize("spec, says", HUGE_KNOBS)
def test_huge_knob_values_are_one_line_errors(model_args, spec, says):
    line = _fails(["generate", *model_args, "-i", "Once", "-n", "8", "-a", spec])
    assert line.startswith("error: ") and says in line, line


@pytest.mark.parametrize("spec, says", HUGE_KNOBS)
def test_huge_knob_values_are_pyllama_errors_in_python(model, spec, says):
    with pytest.raises(PyllamaError, match=says):
        model.generate("Once", steps=8, attention=spec)
    with pytest.raises(PyllamaError, match=says):
        model.diff("causal", spec, text="Once upon a time")


def _direct(spec: str):
    """The built-in class of ``spec`` constructed directly with the spec's values (no spec parsing)."""
    import importlib

    from pyllama.attention.registry import BUILTINS
    from pyllama.attention.spec import split_spec

    name, _, args = split_spec(spec)
    module, _, cls = BUILTINS[name].partition(":")
    klass = getattr(importlib.import_module(module), cls)
    kwargs = {}
    for i, item in enumerate(a for a in args.split(",") if a):
        key, eq, value = item.partition("=")
        if not eq:
            key, value = klass.knobs[i].name, item
        kwargs[key] = True if value in ("", "true") and klass.knobs[i].type is bool else int(value)
    return klass, kwargs


DIRECT_BAD = [
    "sliding:99999999999999999999",
    "sliding:0",
    "causal:positions=99999999999999999999",
    "causal:positions=-1",
    "sink:sinks=9223372036854775808",
    "sink:window=0",
    "lattice:levels=63",
    "lattice:base=0",
    "kmeans:clusters=0",
    "kmeans:seed=18446744073709551616",
    "tiered:bits=5",
    "tiered:warm=100",
    "tiered:group=99999999999999999999",
]


@pytest.mark.parametrize("spec", DIRECT_BAD)
def test_direct_construction_refuses_what_the_spec_refuses(spec):
    """Sliding(10**20) is the same one-line PyllamaError as sliding:10**20, not an OverflowError."""
    from pyllama.attention.registry import create_plugin

    klass, kwargs = _direct(spec)
    with pytest.raises(PyllamaError) as direct:
        klass(**kwargs)
    with pytest.raises(PyllamaError) as via_spec:
        create_plugin(spec)
    assert "\n" not in str(direct.value)
    assert str(direct.value) in str(via_spec.value), (str(direct.value), str(via_spec.value))


@pytest.mark.parametrize(
    "spec", ["causal:positions=99999999999", "sliding:4000000000000", "tiered:positions=99999999999"]
)
def test_direct_construction_is_bounded_by_the_machine_at_init(model, spec):
    from pyllama.engine import Engine

    klass, kwargs = _direct(spec)
    with pytest.raises(PyllamaError, match="bytes"):
        Engine(model.config, model.weights, klass(**kwargs), 1)


def test_the_memory_error_names_bytes_needed_and_held(model):
    with pytest.raises(PyllamaError) as info:
        model.generate("Once", steps=8, attention="causal:positions=99999999999")
    # keys and values (2 x 5 layers x P positions x kv_dim 32 x 4 bytes), the per-head pointer tables
    # (8 heads x P x (8 + 8) bytes), the per-layer counters (5 x 8 bytes) and the scores, one row per
    # query of a block (8 heads x 16 queries x P x 4 bytes), and the 32 lanes of llama.cpp's weighted
    # sum per head (8 heads x 32 x head_dim 8 x 4 bytes)
    P = 99999999999
    needed = 2 * 5 * P * 32 * 4 + 8 * P * 16 + 5 * 8 + 8 * 16 * P * 4 + 8 * 32 * 8 * 4
    assert f"needs {needed:,} bytes" in str(info.value) and "of memory this machine has" in str(info.value)


# ---- output files of diff ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "option, path, says",
    [
        ("--plot", "x.txt", "txt"),
        ("--plot", "nosuchdir/x.png", "nosuchdir"),
        ("--json", "nosuchdir/x.json", "nosuchdir"),
        ("--csv", "nosuchdir/x.csv", "nosuchdir"),
    ],
)
def test_diff_output_paths_are_checked_before_the_diff_runs(model_args, tmp_path, monkeypatch, option, path, says):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the diff ran although its output cannot be written")

    monkeypatch.setattr(Model, "diff", must_not_run)
    line = _fails(["diff", "causal", "sliding:8", *model_args, "-i", "Once", option, str(tmp_path / path)])
    assert says in line, line


def test_unwritable_folder_is_refused(model_args, tmp_path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        monkeypatch.setattr(Model, "diff", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
        line = _fails(["diff", "causal", "sliding:8", *model_args, "-i", "Once", "--plot", str(locked / "x.png")])
        assert "locked" in line and "writable" in line
    finally:
        locked.chmod(0o700)


# ---- a closed pipe ---------------------------------------------------------------------------------------
def test_generate_into_a_closed_pipe_exits_quietly(model_args):
    cmd = [sys.executable, "-m", "pyllama", "generate", *model_args, "-n", "0", "-a", "sliding:64"]
    cmd += ["-i", "Once upon a time", "--ignore-eos", "-n", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(proc.stdout.read(100)) == 100
    proc.stdout.close()  # as `| head -c 100` does
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert proc.returncode in (0, 141), err
    assert "error" not in err and "Traceback" not in err and "Exception" not in err, err


# ---- the tokenizer beside a checkpoint ------------------------------------------------------------------
def test_a_tokenizer_beside_with_the_wrong_vocabulary_is_named(tmp_path):
    ckpt = tmp_path / "model.bin"
    ckpt.write_bytes(shared_file("stories260K.bin").read_bytes())
    (tmp_path / "tokenizer.bin").write_bytes(shared_file("tokenizer.bin").read_bytes())  # 32,000 tokens
    line = _fails(["generate", "-c", str(ckpt), "-i", "Once"])
    assert "tokenizer.bin" in line and "32000" in line.replace(",", "") and "512" in line, line
    assert "no tokenizer found" not in line


def test_no_tokenizer_beside_still_says_so(tmp_path):
    ckpt = tmp_path / "model.bin"
    ckpt.write_bytes(shared_file("stories260K.bin").read_bytes())
    line = _fails(["generate", "-c", str(ckpt), "-i", "Once"])
    assert "no tokenizer" in line and "-z" in line


@pytest.mark.parametrize(
    "spec",
    [
        "causal",
        "causal:positions=100",
        "sliding:8",
        "sink:0,8",
        "sink:3,5,shift",
        "kmeans",
        "kmeans:clusters=5,estimate",
        "tiered",
        "tiered:bits=8,warm=64,group=16,block=7",
        "lattice",
        "lattice:sinks=0,base=3,levels=4",
    ],
)
def test_planned_bytes_are_what_init_allocates(model, spec):
    """The memory bound is only as good as the plan: it must equal what init really allocates."""
    from pyllama.attention.registry import create_plugin
    from pyllama.engine import Pool

    plugin = create_plugin(spec)
    plugin._configure(model.config, Pool(1))
    planned = plugin.planned_bytes(model.config)
    plugin.init(model.config, Pool(1))
    assert planned == plugin.owned_bytes()


def test_require_memory_names_both_sizes():
    from pyllama.attention.memory import require_memory

    require_memory("causal", "positions=10", 1000, available=1000)
    with pytest.raises(PyllamaError, match=r"causal: positions=10 needs 1,001 bytes .* the 1,000 bytes"):
        require_memory("causal", "positions=10", 1001, available=1000)
