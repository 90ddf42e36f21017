"""The smaller defects a new user's trial found, each reproduced here: Ctrl-C during a sweep, budget
sizing against a plugin that refuses small values, chat's default length, the first compile of a
.pyx plugin, the retrieval marks of the per-position figure, an empty probe text, a misspelt
retrieval option, and the tensor types ``pyllama info`` lists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main

PER_POSITION_260K = 2 * 5 * 32 * 4  # stories260K: K and V, 5 layers, kv_dim 32, float32


def one_error_line(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ---- 1. Ctrl-C ends a sweep with one line ---------------------------------------------------------
def test_ctrl_c_ends_a_sweep_with_one_line_and_no_worker_tracebacks(tmp_path):
    pytest.importorskip("distributed")
    plugins = Path(__file__).parent / "sweep_data" / "plugins.py"
    marker = tmp_path / "stalled.pid"
    study = tmp_path / "study.toml"
    study.write_text(
        f'models = ["{shared_file("stories260K.bin")}"]\ntokenizer = "{shared_file("tok512.bin")}"\n'
        f'probes = ["{Path(__file__).parent / "sweep_data" / "probe_a.txt"}"]\n'
        '[[plugins]]\nname = "sink"\nwindow = [8, 16]\n'
        f'[[plugins]]\nname = "{plugins}:Stall"\nmarker = "{marker}"\n',
        encoding="utf-8",
    )
    out = tmp_path / "out"
    # its own process group, as a shell runs a command: Ctrl-C on a terminal signals the whole group,
    # the Dask worker processes included
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyllama", "sweep", str(study), "--out", str(out), "--workers", "2", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    store = out / "rows.jsonl"

    def finished() -> int:
        return len(store.read_text().splitlines()) if store.exists() else 0

    try:
        # one worker stalls in the Stall cell, the other runs both sink cells and waits: Ctrl-C then
        deadline = time.monotonic() + 120
        while (not marker.exists() or finished() < 2) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert marker.exists() and finished() == 2, proc.communicate()[1]
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert finished() == 2  # the stalling cell never finished
    assert lines[0] == (
        f"interrupted: 2 of 3 cells finished (kept in {store}); run the same command with --resume to run the other 1"
    )


# ---- 2. budget sizing: a plugin's refusal of a small value means "too small" -----------------------
WINDOW_BUDGET = """from pyllama.attention.spec import Knob
from pyllama.plugins.sliding import Sliding


class WindowBudget(Sliding):
    description = "the last `budget` positions; `window` must be smaller (knobs that constrain each other)"
    knobs = (
        Knob("window", int, 16, "a part of the budget", min=1),
        Knob("budget", int, 64, "positions held", min=1),
    )

    def __init__(self, window: int = 16, budget: int = 64):
        if window >= budget:
            raise ValueError(f"window ({window}) must be less than budget ({budget})")
        super().__init__(budget)  # Sliding holds its window: here the budget
"""


def test_budget_sizing_takes_a_refused_small_value_as_too_small(tmp_path):
    (tmp_path / "wb.py").write_text(WINDOW_BUDGET, encoding="utf-8")
    study = tmp_path / "study.toml"
    budget_bytes = 40_000
    study.write_text(
        f'models = ["{shared_file("stories260K.bin")}"]\ntokenizer = "{shared_file("tok512.bin")}"\n'
        f'probes = ["stories"]\nbudgets = [{budget_bytes}]\n'
        '[[plugins]]\nname = "wb.py:WindowBudget"\nsize_by = "budget"\n',
        encoding="utf-8",
    )
    result = CliRunner().invoke(main, ["sweep", str(study), "--dry-run"])
    assert result.exit_code == 0, result.output
    # it holds min(position + 1, budget) positions: the largest budget within the bytes
    expected = budget_bytes // PER_POSITION_260K
    assert f"WindowBudget:window=16,budget={expected} " in result.output, result.output


def test_budget_sizing_still_reports_a_budget_below_every_accepted_value(tmp_path):
    (tmp_path / "wb.py").write_text(WINDOW_BUDGET, encoding="utf-8")
    study = tmp_path / "study.toml"
    study.write_text(
        f'models = ["{shared_file("stories260K.bin")}"]\ntokenizer = "{shared_file("tok512.bin")}"\n'
        'probes = ["stories"]\nbudgets = [10000]\n'
        '[[plugins]]\nname = "wb.py:WindowBudget"\nsize_by = "budget"\n',
        encoding="utf-8",
    )
    line = one_error_line(["sweep", str(study), "--dry-run"])
    smallest = 17  # the least budget the constructor takes with window 16
    assert line.startswith(
        f"error: study.toml: plugins[0] (wb.py:WindowBudget), budget 10000: budget 10,000 B is below what "
        f"budget={smallest} holds ({smallest * PER_POSITION_260K:,} B at position "
    ), line


# ---- 3. chat stops at a finite default length ------------------------------------------------------
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_chat_stops_after_256_new_tokens_by_default(tmp_path):
    from pyllama import chat
    from pyllama.model import Model

    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=1)
    result = chat.generate(model, "Once upon a time", template=TEMPLATE, ignore_eos=True)
    assert len(result.ids) == chat.DEFAULT_REPLY_TOKENS == 256  # not the rest of the 512-token context
    longer = chat.generate(model, "Once upon a time", template=TEMPLATE, ignore_eos=True, steps=0)
    # -n 0: the context, as before (the last position's token is sampled, not run: one more than the rest)
    assert len(longer.ids) == model.config.seq_len - len(longer.prompt_ids) + 1


def test_chat_cli_default_length_is_documented_and_applied(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    result = CliRunner().invoke(main, ["chat", "--help"])
    assert "256 new tokens" in " ".join(result.output.split())
    args = ["chat", "-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    result = CliRunner().invoke(main, [*args, "--template", str(template), "--json", "Once upon a time"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["ids"]) <= 256


# ---- 4. the first compile of a .pyx plugin says so ------------------------------------------------
def test_compiling_a_pyx_plugin_prints_one_line_first_and_nothing_when_cached(tmp_path, monkeypatch, capsys):
    from pyllama.attention import native

    source = tmp_path / "mine.pyx"
    source.write_text("# cython: language_level=3\n", encoding="utf-8")
    builds = []

    real_run = subprocess.run

    def fake_build(cmd, *args, **kwargs):  # the plugin build leaves its module behind, at once
        if not (len(cmd) > 3 and cmd[1] == "-c" and cmd[3].endswith(".pyx")):
            return real_run(cmd, *args, **kwargs)  # the compiler probes of the build configuration
        builds.append(cmd)
        module = cmd[3][: -len(".pyx")]
        (Path(kwargs["cwd"]) / f"{module}{native.importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    native.plugin_build_config()  # probed before the patch: its compiler checks print nothing

    monkeypatch.setattr(native.subprocess, "run", fake_build)
    native.build_pyx(source, "mine.pyx:Mine", cache=tmp_path / "cache")
    first = capsys.readouterr()
    assert first.err == "compiling mine.pyx (first use; later runs load the cached build)...\n" and first.out == ""
    native.build_pyx(source, "mine.pyx:Mine", cache=tmp_path / "cache")
    assert capsys.readouterr().err == "" and len(builds) == 1


# ---- 5. the per-position figure marks the needle, the answer and P(key) ------------------------------
def test_the_overview_figure_of_a_passkey_diff_marks_needle_answer_and_p_key():
    from matplotlib.lines import Line2D
    from matplotlib.patches import Polygon, Rectangle

    from pyllama import plots
    from pyllama.diff.probes import load_probe
    from pyllama.model import Model

    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=1)
    spec = "passkey:depth=0.3,length=300"
    target = load_probe(spec, model.tokenizer, model.config.seq_len).segments[0].target
    report = model.diff("causal", "sink:4,28", probe=spec, cache=False)
    row = report.retrieval[0]
    fig = plots.report_figure(report)
    for ax in fig.axes[:2]:  # |Δlogit| and KL against position
        needles = [ln for ln in ax.lines if isinstance(ln, Line2D) and ln.get_label() == "needle"]
        assert len(needles) == 1 and list(needles[0].get_xdata()) == [target.needle, target.needle]
        spans = [p for p in ax.patches if isinstance(p, (Polygon, Rectangle)) and p.get_label() == "answer"]
        assert len(spans) == 1
        span = spans[0]
        x = span.get_xy()[:, 0] if isinstance(span, Polygon) else [span.get_x(), span.get_x() + span.get_width()]
        assert min(x) == target.start - 0.5 and max(x) == target.start + target.length - 0.5
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts) + fig.get_suptitle()
    assert f"P(key): A {row.a.p:.3g}, B {row.b.p:.3g}" in texts, texts


# ---- 6. an empty or unreadable probe text says so ---------------------------------------------------
@pytest.mark.parametrize("option", ["--text", "--probe"])
def test_an_empty_probe_text_says_it_is_empty(tmp_path, option):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    model = ["-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    for path in ("/dev/null", str(empty)):
        line = one_error_line(["diff", "causal", "sink:4,60", *model, option, path, "--no-cache"])
        assert line == f"error: {path}: the probe text is empty"


def test_an_unreadable_probe_text_says_so(tmp_path, monkeypatch):
    locked = tmp_path / "locked.txt"
    locked.write_text("Once upon a time\n", encoding="utf-8")
    locked.chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root reads it anyway: fail as for any other user
        real_read = Path.read_text

        def refuse(self, *args, **kwargs):
            if self == locked:
                raise PermissionError(13, "Permission denied", str(self))
            return real_read(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", refuse)
    model = ["-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    line = one_error_line(["diff", "causal", "sink:4,60", *model, "--probe", str(locked), "--no-cache"])
    assert line == f"error: {locked}: cannot read the probe text (Permission denied)"


# ---- 7. a misspelt retrieval option is named, with the valid ones -------------------------------------
def test_an_unknown_retrieval_option_is_named_with_a_suggestion():
    model = ["-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    line = one_error_line(["diff", "causal", "sink:4,60", *model, "--probe", "passkey:lenght=100", "--no-cache"])
    assert line == (
        "error: probe 'passkey:lenght=100': unknown option 'lenght' (did you mean 'length'?); "
        "passkey takes depth, length, seed, digits, chat"
    )
    line = one_error_line(["diff", "causal", "sink:4,60", *model, "--probe", "copy:xyz", "--no-cache"])
    assert line == "error: probe 'copy:xyz': expected option=value, got 'xyz'; copy takes span, length, seed"


# ---- 8. info lists every tensor type of the file ---------------------------------------------------
def test_info_lists_every_tensor_type_of_a_gguf_as_gguf_py_reads_it():
    from gguf import GGUFReader

    path = shared_file("SmolLM2-135M-Instruct.Q4_1.gguf")
    expected = sorted({t.tensor_type.name for t in GGUFReader(path).tensors})
    assert "F32" in expected  # the norm vectors
    result = CliRunner().invoke(main, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tensor_types"] == expected


def test_info_of_a_llama2c_file_lists_f32():
    result = CliRunner().invoke(main, ["info", str(shared_file("stories260K.bin")), "--json"])
    assert json.loads(result.stdout)["tensor_types"] == ["F32"]


def test_info_of_a_converted_q8_0_file_lists_the_norms_f32_too(tmp_path):
    from gguf import GGUFReader

    out = tmp_path / "m.gguf"
    args = ["convert", str(shared_file("stories260K.bin")), str(out), "--type", "q8_0"]
    assert CliRunner().invoke(main, [*args, "-z", str(shared_file("tok512.bin"))]).exit_code == 0
    result = CliRunner().invoke(main, ["info", str(out), "--json"])
    expected = sorted({t.tensor_type.name for t in GGUFReader(out).tensors})
    assert json.loads(result.stdout)["tensor_types"] == expected == ["F32", "Q8_0"]
