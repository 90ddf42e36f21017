"""``pyllama sweep``'s refusals of bad input that is not a study entry: a malformed scheduler address,
a study file that is not text, thread counts beyond the engine's limit; plugin arguments refused with
the entry's prefix; counts written in the singular for one. Each is one line, exit status 1, nothing
run or written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.options import max_threads, usable_cpus

DATA = Path(__file__).parent / "sweep_data"
PROBE_A = DATA / "probe_a.txt"
SINK = '[[plugins]]\nname = "sink"\n'


def study_toml(tmp_path: Path, extra: str = SINK, head: str = "") -> Path:
    path = tmp_path / "study.toml"
    path.write_text(
        f'models = ["{shared_file("stories260K.bin")}"]\ntokenizer = "{shared_file("tok512.bin")}"\n'
        f'probes = ["{PROBE_A}"]\n{head}{extra}',
        encoding="utf-8",
    )
    return path


def refused(study: Path, *args: str) -> str:
    """The one line of a refused sweep (exit status 1, no output folder)."""
    out = study.parent / "out"
    result = CliRunner().invoke(main, ["sweep", str(study), "--out", str(out), *args])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not out.exists()
    return lines[0]


# ---- defect 1: a malformed --scheduler address --------------------------------------------------
@pytest.mark.parametrize(
    "address",
    ["notaurl", "tcp://127.0.0.1", "tcp://localhost:abc", "tcp://localhost:99999", "tcp://:8786", "inproc://x"],
)
def test_refuses_a_malformed_scheduler_address(tmp_path, address):
    line = refused(study_toml(tmp_path), "--scheduler", address)
    assert line == (
        f"error: --scheduler {address!r}: not a Dask scheduler address (expected tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786)"
    )


def test_a_malformed_scheduler_address_from_the_environment_is_named_as_such(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1")
    line = refused(study_toml(tmp_path))
    assert line.startswith("error: DASK_SCHEDULER_ADDRESS 'tcp://127.0.0.1': not a Dask scheduler address")


def test_a_tls_address_without_certificates_is_refused(tmp_path):
    line = refused(study_toml(tmp_path), "--scheduler", "tls://127.0.0.1:8786")
    assert "a tls:// scheduler needs the client's TLS certificates in the Dask config" in line


def test_a_malformed_scheduler_address_prints_nothing_else_and_exits_at_once(tmp_path):
    """The real entry point: no traceback, and no Client finaliser noise (nor its 10 s wait) at exit."""
    study = study_toml(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyllama",
            "sweep",
            str(study),
            "--out",
            str(tmp_path / "out"),
            "--scheduler",
            "notaurl",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: --scheduler 'notaurl': not a Dask scheduler address (expected tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786)"
    ]


# ---- defect 2: a study file that is not UTF-8 ---------------------------------------------------
def test_refuses_a_study_file_that_is_not_utf8(tmp_path):
    study = tmp_path / "random.toml"
    study.write_bytes(b"models = [\x80\xff\xfe]\n" + bytes(range(256)) * 40)
    result = CliRunner().invoke(main, ["sweep", str(study), "--dry-run"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"error: {study}: not UTF-8 text (byte 0x80 at offset 10); a study is a TOML file saved as UTF-8"
    ]


# ---- defect 3: thread counts beyond the engine's limit, refused before any work -----------------
@pytest.mark.parametrize("dry_run", [False, True])
def test_refuses_threads_per_cell_beyond_the_engine_limit(tmp_path, dry_run):
    top = max_threads()
    args = ["--threads-per-cell", str(top + 1)] + (["--dry-run"] if dry_run else [])
    line = refused(study_toml(tmp_path), *args)
    assert line == (
        f"error: threads per cell {top + 1} is out of range: valid is 1 <= x <= {top} "
        f"(4 x the {usable_cpus()} usable CPUs)"
    )


def test_refuses_more_local_workers_than_the_engine_limit_of_threads(tmp_path):
    top = max_threads()
    line = refused(study_toml(tmp_path), "--workers", str(top + 1))
    assert line == (
        f"error: {top + 1} workers x 1 thread per cell = {top + 1} threads is out of range: valid is at most {top} "
        f"(4 x the {usable_cpus()} usable CPUs); lower the workers or the threads per cell"
    )


# ---- defect 4: a plugin's own argument checks carry the entry's prefix --------------------------
TIERED = '[[plugins]]\nname = "sliding"\n[[plugins]]\nname = "sink"\n[[plugins]]\nname = "tiered"\nbits = 5\n'


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_value_the_plugin_constructor_refuses_names_the_entry(tmp_path, dry_run):
    line = refused(study_toml(tmp_path, TIERED), *(["--dry-run"] if dry_run else []))
    assert line == "error: study.toml: plugins[2] (tiered): tiered: bits must be 4 or 8, got 5"


def test_a_value_the_plugin_constructor_refuses_names_the_entry_and_budget(tmp_path):
    line = refused(study_toml(tmp_path, '[[plugins]]\nname = "tiered"\nbits = 5\n', head="budgets = [40000]\n"))
    assert line == "error: study.toml: plugins[0] (tiered), budget 40000: tiered: bits must be 4 or 8, got 5"


def test_a_reference_the_plugin_constructor_refuses_names_the_reference(tmp_path):
    line = refused(study_toml(tmp_path, head='reference = "tiered:bits=5"\n'))
    assert line == "error: study.toml: reference: tiered: bits must be 4 or 8, got 5"


BROKEN = """from pyllama.plugins.causal import Causal


class Broken(Causal):
    description = "causal attention whose constructor has a bug"

    def __init__(self, positions: int = 0):
        raise RuntimeError("broken on purpose")
"""


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_plugin_whose_constructor_breaks_is_refused_in_one_line_naming_the_entry(tmp_path, dry_run):
    (tmp_path / "broken.py").write_text(BROKEN, encoding="utf-8")
    study = study_toml(tmp_path, SINK + '[[plugins]]\nname = "broken.py:Broken"\n')
    line = refused(study, *(["--dry-run"] if dry_run else []))
    assert line == "error: study.toml: plugins[1] (broken.py:Broken): RuntimeError: broken on purpose"


# ---- defect 5: one is singular ------------------------------------------------------------------
def test_counts_of_one_are_singular(tmp_path):
    result = CliRunner().invoke(main, ["sweep", str(study_toml(tmp_path)), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("1 cell, 1 to run: ")


def test_an_unknown_knob_of_a_plugin_with_one_knob_is_singular(tmp_path):
    line = refused(study_toml(tmp_path, '[[plugins]]\nname = "sliding"\nwindw = 8\n'))
    assert line == "error: study.toml: plugins[0] (sliding): unknown knob 'windw'; its only knob: window"


def test_budgets_on_a_plugin_with_one_knob_name_it_as_the_size_by(tmp_path):
    line = refused(study_toml(tmp_path, '[[plugins]]\nname = "causal"\n', head="budgets = [40000]\n"))
    assert line == "error: study.toml: plugins[0] (causal): budgets need a knob to size: set size_by = 'positions'"
