"""``pyllama leaderboard --dry-run``: each unit's branches counted by the way the board runs them, its
estimated cost from the cost model, the rows already done, and the command's summary."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.leaderboard import Board, plan_board, run_unit
from pyllama.leaderboard.cost import BRANCH_PASSES, dry_run
from pyllama.leaderboard.methods import kept_positions
from pyllama.leaderboard.starts import WAYS
from pyllama.sweep.table import RowStore


def board(**extra) -> Board:
    values = dict(
        models=[str(shared_file("stories260K.bin"))],
        methods=["snapkv", "sink", "quest"],
        ratios=[0.0, 0.5, 0.9],
        tasks=["niah_single_1"],
        lengths=[300],
        samples=2,
        tokenizer=str(shared_file("tok512.bin")),
    )
    values.update(extra)
    return Board(**values)


def test_a_dry_run_counts_each_unit_s_branches_as_its_run_starts_them():
    b = board()
    df = dry_run(b)
    plan = plan_board(b)
    assert len(df) == len(plan.units)
    for unit, (_, est) in zip(plan.units, df.iterrows(), strict=True):
        rows = run_unit(unit, threads=1)
        for way in ("record", "replay", "prefix", "whole"):
            assert est[f"{way}_branches"] == sum(r.get("way") == way for r in rows), (unit.seed, way)
        assert est["refused_branches"] == sum(r["error"] is not None for r in rows)
        context = est["context"]
        assert context == rows[0]["context"]
        ceiling = sum(r.get("way") == "context" for r in rows)
        # a prefix branch (sink) also runs the share of the context after its sinks and window: the positions it keeps
        run = sum(1 - kept_positions(r["ratio"], context) / context for r in rows if r.get("way") == "prefix")
        cost = BRANCH_PASSES["llama"]  # stories260K is a llama: SmolLM2's board's figures
        assert all(tuple(entry.ways) == WAYS for entry in BRANCH_PASSES.values())
        assert est["passes_from"] == cost.board == "smollm2-4096"
        want = 1.0 + cost.ceiling * ceiling + sum(cost.ways[w] * est[f"{w}_branches"] for w in cost.ways)
        assert est["passes"] == pytest.approx(want + cost.ways["whole"] * run)
        assert est["prefix_branches"] == 2 and run > 0
        assert est["est_cpu_seconds"] > 0.0
    # one context pass is timed per model and length: every unit's seconds are its passes times it
    per_pass = df["est_cpu_seconds"] / df["passes"]
    assert per_pass.max() == pytest.approx(per_pass.min())


def test_a_dry_run_counts_the_rows_already_in_out(tmp_path):
    b = board(samples=1)
    (unit,) = plan_board(b).units
    store = RowStore(tmp_path, resume=False)
    for row in run_unit(unit, threads=1)[:3]:
        store.append(row)
    df = dry_run(b, out=tmp_path)
    assert list(df["done"]) == [3]


def test_a_unit_whose_sample_fails_counts_every_branch_refused_at_no_cost(monkeypatch):
    import pyllama.leaderboard.cost as cost

    def no_sample(unit):
        raise ValueError("the sample does not fit")  # run_unit writes every row with this error

    monkeypatch.setattr(cost, "unit_sample", no_sample)
    b = board(samples=1)
    (unit,) = plan_board(b).units
    (est,) = (row for _, row in dry_run(b).iterrows())
    assert [est[f"{w}_branches"] for w in cost.BRANCH_WAYS] == [0, 0, 0, 0, len(unit.branches)]
    assert (est["context"], est["passes"], est["passes_from"], est["est_cpu_seconds"]) == (0, 0.0, "", 0.0)


def test_the_command_says_what_the_board_would_cost_and_runs_nothing(tmp_path):
    out = tmp_path / "board"
    args = ["leaderboard", "-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    args += ["--methods", "snapkv,sink", "--ratios", "0,0.5", "--tasks", "niah_single_1", "--lengths", "300"]
    args += ["--samples", "2", "--out", str(out), "--dry-run", "--workers", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(
        "stories260K.bin, 300 tokens: 2 units, 6 branches (2 record, 0 replay, 2 prefix, 0 whole, 0 refused"
    )
    assert lines[-1].startswith("board: 2 units, 6 rows (0 already in") and "on 2 workers" in lines[-1]
    assert not out.exists()  # a dry run writes nothing


def test_a_board_file_s_dry_run_through_sweep_says_the_same(tmp_path):
    study = tmp_path / "board.toml"
    study.write_text(
        "[leaderboard]\n"
        f'models = ["{shared_file("stories260K.bin")}"]\n'
        f'tokenizer = "{shared_file("tok512.bin")}"\n'
        'methods = ["snapkv", "sink"]\nratios = [0, 0.5]\ntasks = ["niah_single_1"]\nlengths = [300]\nsamples = 2\n'
    )
    result = CliRunner().invoke(main, ["sweep", str(study), "--dry-run", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "2 units, 6 branches (2 record, 0 replay, 2 prefix, 0 whole, 0 refused" in result.output
    assert not (tmp_path / "board").exists()
