"""No output replaces an input: every command that writes files refuses, in one line, non-zero and
before any work, an output that is one of its inputs (also through a symbolic or hard link) or
another of its outputs, and every input is byte-identical afterwards.

The models are copies in a temporary folder: a regression here must never reach the shared files.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, shared_file

from pyllama.cli import main
from pyllama.errors import InputError
from pyllama.outputs import check_outputs, model_inputs, plugin_inputs, probe_inputs, same_file

PROMPT = "Once upon a time, there was a little girl named Lily."
PLUGIN = """from pyllama.plugins.causal import Causal


class Mine(Causal):
    description = "causal attention, from a file"
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def files(tmp_path):
    """Copies of stories260K.bin and tok512.bin, a probe text, a plugin file and a study."""
    model = tmp_path / "stories260K.bin"
    model.write_bytes(shared_file("stories260K.bin").read_bytes())
    tok = tmp_path / "tok512.bin"
    tok.write_bytes(shared_file("tok512.bin").read_bytes())
    probe = tmp_path / "probe.txt"
    probe.write_text(PROMPT + "\n", encoding="utf-8")
    plugin = tmp_path / "mine.py"
    plugin.write_text(PLUGIN, encoding="utf-8")
    return {"model": model, "tok": tok, "probe": probe, "plugin": plugin}


class Unchanged:
    """Every file of the test's folder, hashed now and checked later."""

    def __init__(self, *folders: Path) -> None:
        self.hashes = {p: sha(p) for f in folders for p in f.rglob("*") if p.is_file()}

    def check(self) -> None:
        for path, digest in self.hashes.items():
            assert path.is_file() and sha(path) == digest, f"{path} changed"


def refused_line(args: list[str], *folders: Path) -> str:
    """Run the CLI; it must exit non-zero with one line on stderr and leave every file as it was."""
    before = Unchanged(*folders)
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    before.check()
    return lines[0]


def diff_args(files: dict, *extra: str, tokenizer: bool = True, source: tuple = ("-i", PROMPT)) -> list[str]:
    z = ["-z", str(files["tok"])] if tokenizer else []
    return ["diff", "causal", "sink:4,60", "-c", str(files["model"]), *z, *source, "--no-cache", *extra]


# ---- diff --------------------------------------------------------------------------------------
def test_diff_json_over_the_model_is_refused(files, tmp_path):
    line = refused_line(diff_args(files, "--json", str(files["model"])), tmp_path)
    assert line.startswith(f"error: --json {files['model']}: is the model")


def test_diff_csv_over_the_tokenizer_is_refused(files, tmp_path):
    line = refused_line(diff_args(files, "--csv", str(files["tok"])), tmp_path)
    assert line.startswith(f"error: --csv {files['tok']}: is the tokenizer")


def test_diff_over_the_tokenizer_found_beside_the_checkpoint_is_refused(files, tmp_path):
    beside = tmp_path / "tokenizer.bin"
    files["tok"].rename(beside)
    line = refused_line(diff_args(files, "--json", str(beside), tokenizer=False), tmp_path)
    assert line.startswith(f"error: --json {beside}: is the tokenizer")


def test_diff_plot_and_json_to_one_file_is_refused(files, tmp_path):
    both = tmp_path / "x.png"
    line = refused_line(diff_args(files, "--plot", str(both), "--json", str(both)), tmp_path)
    assert line == f"error: --plot {both}: is also the file of --json: give each output its own name"
    assert not both.exists()  # before any work: nothing written


def test_diff_output_through_a_symlink_to_the_model_is_refused(files, tmp_path):
    link = tmp_path / "report.json"
    link.symlink_to(files["model"])
    line = refused_line(diff_args(files, "--json", str(link)), tmp_path)
    assert line.startswith(f"error: --json {link}: is the model {files['model']}")
    assert link.is_symlink()


def test_diff_output_through_a_hard_link_to_the_tokenizer_is_refused(files, tmp_path):
    hard = tmp_path / "rows.csv"
    os.link(files["tok"], hard)
    line = refused_line(diff_args(files, "--csv", str(hard)), tmp_path)
    assert line.startswith(f"error: --csv {hard}: is the tokenizer {files['tok']}")


def test_diff_output_over_the_probe_text_is_refused(files, tmp_path):
    for source in ("--text", "--probe"):
        args = diff_args(files, "--json", str(files["probe"]), source=(source, str(files["probe"])))
        line = refused_line(args, tmp_path)
        assert line.startswith(f"error: --json {files['probe']}: is the probe text")


def test_diff_output_over_a_plugin_file_is_refused(files, tmp_path):
    args = diff_args(files, "--csv", str(files["plugin"]))
    args[2] = f"{files['plugin']}:Mine"
    line = refused_line(args, tmp_path)
    assert line.startswith(f"error: --csv {files['plugin']}: is the plugin file of {files['plugin']}:Mine")


def test_diff_writes_its_outputs_when_they_are_distinct(files, tmp_path):
    before = Unchanged(tmp_path)
    json_path, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    result = CliRunner().invoke(main, diff_args(files, "--json", str(json_path), "--csv", str(csv_path)))
    assert result.exit_code == 0, result.output
    assert json_path.read_bytes()[:1] == b"{" and csv_path.read_text().startswith("sequence,")
    before.check()


# ---- the Python API ----------------------------------------------------------------------------
def test_a_reports_writers_refuse_the_model_and_the_tokenizer(files, tmp_path):
    from pyllama.model import Model

    model = Model.load(files["model"], tokenizer=files["tok"], threads=1)
    report = model.diff("causal", "sink:4,60", text=PROMPT, cache=False)
    before = Unchanged(tmp_path)
    with pytest.raises(InputError, match="is the model"):
        report.to_json(files["model"])
    with pytest.raises(InputError, match="is the tokenizer"):
        report.to_csv(files["tok"])
    with pytest.raises(InputError, match="is the model"):
        report.plot(files["model"])
    before.check()
    report.to_json(tmp_path / "ok.json")  # another name is written
    assert (tmp_path / "ok.json").stat().st_size > 0


def test_a_probe_file_and_a_plugin_file_are_inputs_of_the_report(files, tmp_path):
    from pyllama.model import Model

    model = Model.load(files["model"], tokenizer=files["tok"], threads=1)
    report = model.diff("causal", f"{files['plugin']}:Mine", probe=str(files["probe"]), cache=False)
    before = Unchanged(tmp_path)
    with pytest.raises(InputError, match="is the probe text"):
        report.to_json(files["probe"])
    with pytest.raises(InputError, match="is the plugin file"):
        report.to_csv(files["plugin"])
    before.check()


# ---- convert keeps its refusals (through the shared check) -------------------------------------
def test_convert_refuses_its_input_through_a_symlink(files, tmp_path):
    link = tmp_path / "out.gguf"
    link.symlink_to(files["model"])
    line = refused_line(["convert", str(files["model"]), str(link), "-z", str(files["tok"]), "--force"], tmp_path)
    assert "is the input" in line and str(files["model"]) in line


# ---- sweep -------------------------------------------------------------------------------------
def study(tmp_path: Path, files: dict, probe: Path, name: str = "study.toml") -> Path:
    path = tmp_path / name
    path.write_text(
        f'models = ["{files["model"]}"]\ntokenizer = "{files["tok"]}"\nprobes = ["{probe}"]\n'
        '[[plugins]]\nname = "sink"\n',
        encoding="utf-8",
    )
    return path


def test_sweep_table_over_a_probe_file_is_refused(files, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    probe = out / "results.csv"  # the table sweep writes at the end
    probe.write_text(PROMPT + "\n", encoding="utf-8")
    line = refused_line(["sweep", str(study(tmp_path, files, probe)), "--out", str(out)], tmp_path)
    assert line.startswith(f"error: --out {probe}: is the study's probes[0]")
    assert not (out / "rows.jsonl").exists()


def test_sweep_whose_default_folder_is_the_study_itself_is_refused(files, tmp_path):
    bare = study(tmp_path, files, files["probe"], name="study")  # no .toml: the default --out is the file
    line = refused_line(["sweep", str(bare)], tmp_path)
    assert line.startswith(f"error: --out {bare}: is the study file")


def test_sweep_run_refuses_an_output_that_is_the_model(files, tmp_path):
    from pyllama.sweep import run

    out = tmp_path / "out"
    out.mkdir()
    (out / "rows.jsonl").symlink_to(files["model"])
    before = Unchanged(tmp_path)
    with pytest.raises(InputError, match="is the study's models\\[0\\]"):
        run(study(tmp_path, files, files["probe"]), out, resume=True)
    before.check()


# ---- the experiments' scripts ------------------------------------------------------------------
@pytest.mark.parametrize("script", ["memories.py", "retrieval.py"])
def test_an_experiment_refuses_to_write_over_its_tokenizer(files, tmp_path, script):
    out = tmp_path / "out"
    out.mkdir()
    table = out / script.replace(".py", ".md")
    table.write_bytes(files["tok"].read_bytes())  # the tokenizer, named as the table it writes
    before = Unchanged(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(REPO / "experiments" / script), "-c", str(files["model"]), "-z", str(table),
         "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {table}: is the tokenizer"), proc.stderr
    before.check()


# ---- the check itself --------------------------------------------------------------------------
def test_same_file_follows_links_and_spellings(tmp_path):
    a = tmp_path / "a.bin"
    a.write_bytes(b"x")
    (tmp_path / "sym").symlink_to(a)
    os.link(a, tmp_path / "hard")
    assert same_file(a, tmp_path / "sym") and same_file(a, tmp_path / "hard")
    assert same_file(a, tmp_path / "." / "a.bin")
    assert same_file(tmp_path / "new.json", tmp_path / "new.json")  # neither exists yet
    assert not same_file(a, tmp_path / "b.bin")


def test_check_outputs_names_the_option_and_the_file(tmp_path):
    a = tmp_path / "a.bin"
    a.write_bytes(b"x")
    with pytest.raises(InputError, match=r"^--out .*a\.bin: is the model \(the same file\)"):
        check_outputs({"the model": a}, {"--out": a})
    with pytest.raises(InputError, match="is also the file of --json"):
        check_outputs({}, {"--json": tmp_path / "x", "--csv": None, "--plot": tmp_path / "x"})
    check_outputs({"the model": a, "the tokenizer": None}, {"--json": tmp_path / "x", "--csv": tmp_path / "y"})


def test_the_input_helpers(files, tmp_path):
    beside = tmp_path / "tokenizer.bin"
    beside.write_bytes(b"t")
    assert model_inputs(files["model"]) == {"the model": str(files["model"]), "the tokenizer": str(beside)}
    assert model_inputs(files["model"], files["tok"])["the tokenizer"] == str(files["tok"])
    assert probe_inputs("standard") == {} and probe_inputs("passkey:depth=0.5") == {}
    assert probe_inputs(str(files["probe"])) == {"the probe text": str(files["probe"])}
    assert probe_inputs([1, 2, 3]) == {}
    spec = f"{files['plugin']}:Mine:positions=8"
    assert plugin_inputs("causal", spec, None) == {f"the plugin file of {spec}": str(files["plugin"])}
