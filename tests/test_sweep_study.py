"""pyllama.sweep without a cluster: study checks, grid expansion, budgets, dry-run costs, and the
CLI's one-line refusals of bad studies (before any work starts)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.model import Model
from pyllama.sweep import StudyError, dry_run, load_study, plan_study

DATA = Path(__file__).parent / "sweep_data"
PROBE_A, PROBE_B = DATA / "probe_a.txt", DATA / "probe_b.txt"


@pytest.fixture
def base(stories260k, tok512) -> dict:
    return {
        "models": [str(stories260k)],
        "tokenizer": str(tok512),
        "probes": [str(PROBE_A), str(PROBE_B)],
        "plugins": [{"name": "sink", "sinks": 2, "window": [8, 16, 32]}, {"name": "lattice", "window": [8, 16]}],
    }


def write_toml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_grid_is_the_product_in_study_order(base):
    plan = plan_study(load_study(base))
    specs = [(Path(c.probe).name, c.spec) for c in plan.cells]
    expected = [
        (probe, spec)
        for probe in ("probe_a.txt", "probe_b.txt")
        for spec in (
            "sink:sinks=2,window=8,shift=false",
            "sink:sinks=2,window=16,shift=false",
            "sink:sinks=2,window=32,shift=false",
            "lattice:sinks=4,window=8,base=8,levels=0,shift=false",
            "lattice:sinks=4,window=16,base=8,levels=0,shift=false",
        )
    ]
    assert specs == expected
    assert len({c.key for c in plan.cells}) == len(plan.cells)
    assert all(c.reference == "causal:positions=0" for c in plan.cells)
    assert dict(plan.cells[0].knobs) == {"sinks": 2, "window": 8, "shift": False}


def test_cell_keys_depend_on_content_not_on_paths(base, tmp_path):
    keys = [c.key for c in plan_study(load_study(base)).cells]
    moved = tmp_path / "elsewhere.txt"
    moved.write_bytes(PROBE_A.read_bytes())
    again = dict(base, probes=[str(moved), str(PROBE_B)])
    assert [c.key for c in plan_study(load_study(again)).cells] == keys
    changed = dict(base, reference="causal:positions=1024")
    assert not set(c.key for c in plan_study(load_study(changed)).cells) & set(keys)


def test_seeds_drive_the_seed_knob_of_plugins_that_have_one(base):
    study = dict(base, probes=[str(PROBE_A)], seeds=[0, 7])
    study["plugins"] = [{"name": "kmeans", "clusters": 4, "budget": 8, "window": 8}, {"name": "sink", "window": 8}]
    cells = plan_study(load_study(study)).cells
    assert [(c.family, c.seed, dict(c.knobs).get("seed")) for c in cells] == [
        ("kmeans", 0, 0),
        ("kmeans", 7, 7),
        ("sink", None, None),
    ]


def test_budgets_size_the_window_to_the_bytes_held_at_the_last_position(base, stories260k, tok512):
    budgets = [16_000, 30_000]
    study = dict(base, probes=[str(PROBE_B)], budgets=budgets)
    study["plugins"] = [{"name": "sink", "sinks": 2}, {"name": "lattice", "base": 2}]
    cells = plan_study(load_study(study)).cells
    assert [(c.family, c.budget) for c in cells] == [("sink", b) for b in budgets] + [("lattice", b) for b in budgets]
    model = Model.load(stories260k, tokenizer=tok512, threads=1)
    for cell in cells:
        window = dict(cell.knobs)["window"]
        held = model.diff("causal", cell.spec, probe=str(PROBE_B)).summary["bytes_last_b"]
        assert held <= cell.budget, cell.spec
        bigger = cell.spec.replace(f"window={window},", f"window={window + 1},")
        assert model.diff("causal", bigger, probe=str(PROBE_B)).summary["bytes_last_b"] > cell.budget, bigger


def test_a_budget_nothing_fits_in_is_refused(base):
    study = dict(base, budgets=[100], plugins=[{"name": "sink", "sinks": 2}])
    with pytest.raises(StudyError, match=r"plugins\[0\] \(sink\), budget 100: budget 100 B is below what window=1"):
        plan_study(load_study(study))


def test_dry_run_costs_come_from_measured_positions_and_bytes_per_token(base, stories260k, tok512):
    study = dict(base, probes=[str(PROBE_A), "long"], plugins=[{"name": "sink", "window": [8, 16]}])
    df = dry_run(study)
    model = Model.load(stories260k, tokenizer=tok512)
    n_a = len(model.tokenize(PROBE_A.read_text().strip()))
    # the long probe runs to 4x the context, but causal holds the context (512): that is what is compared
    assert df["positions"].tolist() == [n_a, n_a, 512, 512]
    c = model.config  # a float32 .bin: every layer matrix and the classifier, 4 bytes a weight
    layer = 2 * c.dim * c.q_dim + 2 * c.dim * c.kv_dim + 3 * c.dim * c.hidden_dim
    per_token = 4 * (c.n_layers * layer + c.vocab_size * c.dim)
    assert (df["bytes_streamed"] == 2 * df["positions"] * per_token).all()
    seconds = df["est_seconds"].to_numpy()
    assert (seconds > 0).all()
    np.testing.assert_allclose(seconds[2] / seconds[0], 512 / n_a)  # proportional to positions, not a constant
    assert not df["done"].any()


# ---- refusals: one line naming the entry, exit status 1, nothing written -------------------------
def run_cli(*args: str):
    return CliRunner().invoke(main, ["sweep", *args])


def refused(tmp_path: Path, toml: str, *args: str) -> str:
    study = write_toml(tmp_path / "study.toml", toml)
    result = run_cli(str(study), "--out", str(tmp_path / "out"), *args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not (tmp_path / "out").exists()
    return lines[0]


def models_toml(extra: str = "", models: str | None = None) -> str:
    model = models or f'["{shared_file("stories260K.bin")}"]'
    return f'models = {model}\ntokenizer = "{shared_file("tok512.bin")}"\nprobes = ["{PROBE_A}"]\n{extra}'


def test_refuses_an_unknown_plugin(tmp_path):
    line = refused(tmp_path, models_toml('[[plugins]]\nname = "sink"\n[[plugins]]\nname = "slidng"\nwindow = 8\n'))
    assert "study.toml: plugins[1] (slidng): unknown attention plugin 'slidng'; available: causal" in line


def test_refuses_an_unknown_knob(tmp_path):
    line = refused(tmp_path, models_toml('[[plugins]]\nname = "sink"\nwindw = [8, 16]\n'))
    assert "study.toml: plugins[0] (sink): unknown knob 'windw'; its knobs: sinks, window, shift" in line


def test_refuses_a_bad_knob_value(tmp_path):
    line = refused(tmp_path, models_toml('[[plugins]]\nname = "sink"\nwindow = [8, 0]\n'))
    assert "plugins[0] (sink): sink: window=0 is below its minimum 1" in line


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ('[[plugins]]\nname = "sink"\nwindow = []\n', "plugins[0] (sink): window = [] is empty: the grid has no cells"),
        ("", "plugins: the grid is empty"),
    ],
)
def test_refuses_an_empty_grid(tmp_path, extra, where):
    assert where in refused(tmp_path, models_toml(extra))


def test_refuses_a_missing_model(tmp_path):
    line = refused(tmp_path, models_toml('[[plugins]]\nname = "sink"\n', models='["nowhere/stories9M.bin"]'))
    assert "study.toml: models[0]: no such model file 'nowhere/stories9M.bin'" in line


def test_refuses_an_unknown_entry(tmp_path):
    line = refused(tmp_path, models_toml('probe = "standard"\n[[plugins]]\nname = "sink"\n'))
    assert "study.toml: probe: unknown entry; a study has models, tokenizer" in line


def test_refuses_an_unreachable_scheduler_quickly(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    toml = models_toml('[[plugins]]\nname = "sink"\n')
    t0 = time.perf_counter()
    line = refused(tmp_path, toml, "--scheduler", f"tcp://127.0.0.1:{port}")
    assert f"error: scheduler tcp://127.0.0.1:{port}: cannot connect within 5 s" in line
    assert time.perf_counter() - t0 < 30
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", f"tcp://127.0.0.1:{port}")
    (tmp_path / "study.toml").unlink()
    assert f"scheduler tcp://127.0.0.1:{port}" in refused(tmp_path, toml)


def test_dry_run_prints_every_cell_and_runs_nothing(tmp_path):
    study = write_toml(tmp_path / "study.toml", models_toml('[[plugins]]\nname = "sink"\nwindow = [8, 16, 32]\n'))
    result = run_cli(str(study), "--dry-run")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 + 3 + 1
    assert "sink:sinks=4,window=16,shift=false" in lines[2]
    assert lines[-1].startswith("3 cells, 3 to run:")
    assert not (tmp_path / "study").exists()


def test_refuses_seeds_that_no_plugin_takes(base):
    with pytest.raises(StudyError, match=r"^study: seeds: no plugin of the study has a seed knob"):
        load_study(dict(base, seeds=[0, 1]))
