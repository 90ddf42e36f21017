"""``pyllama leaderboard``: the board on Dask against the same units run in-process, resume, the
outputs (table, Markdown, figure), bad input in one line, and --quick on SmolLM2 (opt-in)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.leaderboard import Board, plan_board, run, run_unit
from pyllama.leaderboard.board import BoardError, load_board
from pyllama.leaderboard.report import board_points, markdown
from pyllama.leaderboard.unit import TIMING_COLUMNS

distributed = pytest.importorskip("distributed")


def board(**extra) -> Board:
    values = dict(
        models=[str(shared_file("stories260K.bin"))],
        methods=["snapkv", "sink", "h2o"],
        ratios=[0.0, 0.5, 0.9],
        tasks=["niah_single_1", "niah_multikey_2"],
        lengths=[300],
        samples=2,
        tokenizer=str(shared_file("tok512.bin")),
    )
    values.update(extra)
    return Board(**values)


def without_timing(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in TIMING_COLUMNS if c in df]).reset_index(drop=True)


def test_a_two_worker_cluster_gives_the_table_of_the_units_run_in_process(cluster, tmp_path):
    b = board()
    df = run(b, tmp_path / "out", scheduler=cluster.scheduler_address)
    plan = plan_board(b)
    assert len(df) == len(plan.keys) == 2 * 2 * (1 + 3 * 2)  # tasks x samples x (causal + methods x ratios)
    assert list(df["cell"]) == plan.keys and df["error"].isna().all()
    local = [row for unit in plan.units for row in run_unit(unit, threads=1)]
    want = pd.DataFrame(local).set_index("cell").loc[plan.keys].reset_index()[df.columns]
    pd.testing.assert_frame_equal(without_timing(df), without_timing(want), check_dtype=False)
    assert set(df["way"]) == {"context", "record", "prefix", "whole"}
    assert len(set(df["worker"])) == 2  # both workers ran units
    for name in ("results.parquet", "results.csv", "rows.jsonl", "leaderboard.md", "leaderboard.png"):
        assert (tmp_path / "out" / name).is_file(), name
    again = pd.read_parquet(tmp_path / "out" / "results.parquet")
    pd.testing.assert_frame_equal(without_timing(again), without_timing(df), check_dtype=False)


def test_resume_runs_only_the_rows_not_in_the_table(cluster, tmp_path):
    out = tmp_path / "out"
    first = run(board(methods=["sink"]), out, scheduler=cluster.scheduler_address)
    ran: list[str] = []
    both = run(board(methods=["sink", "sliding"]), out, scheduler=cluster.scheduler_address, resume=True,
               on_row=lambda row: ran.append(row["cell"]))  # fmt: skip
    assert set(ran) == set(both["cell"]) - set(first["cell"])  # only sliding's rows ran
    assert set(both[both["cell"].isin(ran)]["method"]) == {"sliding"}
    ran.clear()
    run(board(methods=["sink", "sliding"]), out, scheduler=cluster.scheduler_address, resume=True,
        on_row=lambda row: ran.append(row["cell"]))  # fmt: skip
    assert ran == []  # every row there: no unit runs, not even its context


def test_the_markdown_and_the_points_are_the_table_s_means(tmp_path):
    """board_points against plain pandas means; the Markdown shows them with the bytes removed."""
    rng = np.random.default_rng(0)
    rows = []
    for task, family in (("niah_single_1", "niah"), ("vt", "vt")):
        for seed in range(3):
            for method, ratio, removed in (("causal", 0.0, 0.0), ("sink", 0.5, 0.5), ("kmeans", 0.5, -0.003)):
                rows.append(dict(model="m.gguf", length=1024, task=task, family=family, seed=seed, method=method,
                                 ratio=ratio, score=float(rng.integers(0, 2) * 100), logp=float(rng.normal(-5, 2)),
                                 bytes_removed=removed, holds="everything" if method == "kmeans" else "rows",
                                 error=None))  # fmt: skip
    df = pd.DataFrame(rows)
    points = board_points(df)
    for (panel, method), want in df.groupby(["family", "method"]):
        got = points[(points["panel"] == panel) & (points["method"] == method)].iloc[0]
        assert got["score"] == pytest.approx(want["score"].mean()) and got["logp"] == pytest.approx(want["logp"].mean())
        assert got["score_lo"] <= got["score"] <= got["score_hi"] and got["n"] == 3
    average = points[points["panel"] == "average"].set_index("method")
    assert average.loc["sink", "logp"] == pytest.approx(df[df["method"] == "sink"]["logp"].mean())
    assert average.loc["sink", "saves_bytes"] and not average.loc["kmeans", "saves_bytes"]
    text = markdown(df)
    assert f"{average.loc['sink', 'score']:.1f} [" in text and "(50%)" in text and "kmeans (keeps every row)" in text
    assert "(-0.3%)" in text and "(-0%)" not in text  # a share under half a percent to a tenth, not as 0%


def test_a_board_file_runs_through_sweep(cluster, tmp_path, monkeypatch):
    (tmp_path / "board.toml").write_text(
        "[leaderboard]\n"
        f'models = ["{shared_file("stories260K.bin")}"]\n'
        f'tokenizer = "{shared_file("tok512.bin")}"\n'
        'methods = ["sliding"]\nratios = [0, 0.5]\ntasks = ["niah_single_1"]\nlengths = [300]\nsamples = 1\n'
    )
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
    result = CliRunner().invoke(main, ["sweep", str(tmp_path / "board.toml"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "2 rows: 2 run, 0 already done, 0 failed" in result.output
    assert set(pd.read_parquet(tmp_path / "o" / "results.parquet")["method"]) == {"causal", "sliding"}


# ---- refused before any work, in one line ---------------------------------------------------------------
def _refused(args: list[str]) -> str:
    result = CliRunner().invoke(main, ["leaderboard", *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_bad_input_is_refused_in_one_line(tmp_path):
    model, tok = str(shared_file("stories260K.bin")), str(shared_file("tok512.bin"))
    base = ["-c", model, "-z", tok, "--tasks", "niah_single_1", "--lengths", "300", "--out", str(tmp_path / "o")]
    assert "unknown attention plugin 'snapkvv'" in _refused([*base, "--methods", "snapkvv"])
    assert "tiered: no ratio knob" in _refused([*base, "--methods", "tiered"])
    assert "ratio 1.0 is out of range: valid is 0 <= x < 1" in _refused([*base, "--ratios", "0,1"])
    assert "ratio -0.25 is out of range" in _refused([*base, "--ratios", "-0.25"])
    assert "unknown task 'niah'" in _refused([*base, "--tasks", "niah"])
    line = _refused(["-c", model, "-z", tok, "--tasks", "cwe", "--lengths", "400", "--out", str(tmp_path / "o")])
    assert "ruler cwe: the sample with its smallest haystack takes" in line and "more than length=400" in line
    assert "1,024 is beyond" in _refused(["-c", model, "-z", tok, "--lengths", "1024", "--out", str(tmp_path / "o")])
    out = tmp_path / "folder"
    out.mkdir()
    shutil.copy(tok, out / "results.csv")  # the tokenizer, where the table would be written
    line = _refused(["-c", model, "-z", str(out / "results.csv"), "--tasks", "niah_single_1", "--lengths", "300",
                     "--out", str(out)])  # fmt: skip
    assert "results.csv: is the tokenizer of models[0]" in line
    assert not (tmp_path / "o").exists()  # nothing was written by any of them


def test_a_board_file_s_bad_entries_are_named(tmp_path):
    with pytest.raises(BoardError, match=r"board.toml: ratoi: unknown entry"):
        (tmp_path / "board.toml").write_text('[leaderboard]\nmodels = ["m"]\nratoi = [0.5]\n')
        load_board(tmp_path / "board.toml")
    with pytest.raises(BoardError, match=r"leaderboard: methods: method sink:window=8: the ratio sets window"):
        board(methods=["sink:window=8"])


@pytest.mark.leaderboard_long
def test_quick_on_smollm2_finishes_within_ten_minutes(tmp_path):
    """``--quick`` on SmolLM2 (the methods that exist): wall time on this machine's cores, the
    machine shared; each row's CPU seconds are in the table."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pyllama", "leaderboard", "-c", str(shared_file("SmolLM2-135M-Instruct.Q4_1.gguf")),
         "--quick", "--out", str(tmp_path / "q")], capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(tmp_path / "q" / "results.parquet")
    print(f"--quick: {len(df)} rows in {seconds:.0f} s wall")
    assert seconds <= 600
