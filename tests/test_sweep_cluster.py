"""pyllama.sweep on a real Dask LocalCluster of two worker processes on loopback, started here:
the table equals the cells run one by one in-process, bit for bit; a killed worker, an interrupt and
a raising plugin leave the table complete."""

from __future__ import annotations

import importlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import shared_file

from pyllama.model import Model
from pyllama.sweep import TIMING_COLUMNS, load_study, plan_study, run, run_cell
from pyllama.sweep.table import to_frame

distributed = pytest.importorskip("distributed")

DATA = Path(__file__).parent / "sweep_data"
PLUGINS = DATA / "plugins.py"
PROBES = [str(DATA / "probe_a.txt"), str(DATA / "probe_b.txt")]


def study(**extra) -> dict:
    s = {
        "models": [str(shared_file("stories260K.bin"))],
        "tokenizer": str(shared_file("tok512.bin")),
        "reference": "causal",
        "probes": PROBES,
        "plugins": [
            {"name": "sink", "sinks": 2, "window": [8, 16, 32]},
            {"name": "lattice", "base": 2, "window": [8, 16, 32]},
        ],
    }
    s.update(extra)
    return s


def without_timing(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=list(TIMING_COLUMNS)).reset_index(drop=True)


def test_cluster_table_equals_the_cells_run_one_by_one_in_process(cluster, tmp_path):
    out = tmp_path / "out"
    df = run(study(), out, scheduler=cluster.scheduler_address)
    assert len(df) == 2 * 3 * 2 and df["error"].isna().all()
    assert df["worker"].nunique() == 2  # both worker processes ran cells
    plan = plan_study(load_study(study()))
    local = to_frame([run_cell(cell)[0] for cell in plan.cells])
    pd.testing.assert_frame_equal(without_timing(df), without_timing(local), check_exact=True)
    # the files hold the same table (Parquet exactly; CSV through text)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), df, check_exact=True)
    assert pd.read_csv(out / "results.csv")["cell"].tolist() == df["cell"].tolist()
    # and the rows are the diff's own summaries: a cell is one Model.diff
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=1)
    for i in (0, 5, 11):
        row = df.iloc[i]
        s = model.diff("causal", row["spec"], probe=row["probe"]).summary
        for key in ("mean_kl", "max_kl", "max_abs_dlogit", "top1_agreement", "ppl_ratio", "bytes_last_b"):
            assert row[key] == s[key], (row["spec"], key)
        assert row["layer4_err_mean"] == s["layer_err_mean"][4]
    assert set(df["model_sha256"]) == {plan.cells[0].model_sha256}
    assert len(plan.cells[0].model_sha256) == 64
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        cached = client.run(lambda: list(importlib.import_module("pyllama.sweep.cell")._MODELS))
    assert list(cached.values()) == [[(row["model_path"], row["tokenizer"])]] * 2  # each worker mapped it once


def test_the_default_local_cluster_is_sized_to_the_machine_and_pins_threads():
    from pyllama.model import default_threads
    from pyllama.sweep.cluster import cluster_client, local_size

    cores = default_threads()
    assert local_size(None, None) == (cores, 1)
    assert local_size(None, cores) == (1, cores)
    with cluster_client(workers=1, threads_per_cell=cores) as (client, threads):
        env = client.run(lambda: {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
        info = client.nthreads()
    assert threads == cores
    assert list(env.values()) == [{"OMP_NUM_THREADS": str(cores), "OPENBLAS_NUM_THREADS": str(cores)}]
    assert list(info.values()) == [1]  # one cell at a time per worker process


def test_a_killed_worker_mid_cell_still_gives_a_complete_table(cluster, tmp_path):
    marker = tmp_path / "stalled.pid"
    s = study(probes=PROBES[:1])
    s["plugins"] = [
        {"name": "sink", "window": [8, 16]},
        {"name": f"{PLUGINS}:Stall", "marker": str(marker)},
        {"name": "lattice", "window": [8, 16]},
    ]
    killed = []

    def kill_when_stalled():
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if marker.exists():
            pid = int(marker.read_text())
            os.kill(pid, signal.SIGKILL)  # the worker process, in the middle of its cell
            killed.append(pid)

    killer = threading.Thread(target=kill_when_stalled, daemon=True)
    killer.start()
    df = run(s, tmp_path / "out", scheduler=cluster.scheduler_address)
    killer.join(timeout=5)
    assert killed, "the stalling cell never started"
    assert len(df) == 5 and df["error"].isna().all(), df["error"].tolist()
    stalled = df[df["plugin"].str.endswith(":Stall")].iloc[0]
    assert stalled["exact"] and stalled["max_abs_dlogit"] == 0.0  # it is causal, run again to the end
    assert not stalled["worker"].endswith(f":{killed[0]}")
    rows = [json.loads(x) for x in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert sorted(r["cell"] for r in rows) == sorted(df["cell"])  # each cell's row once


def test_resume_after_an_interrupt_runs_only_the_missing_cells(cluster, tmp_path):
    out = tmp_path / "out"
    seen: list[str] = []

    def interrupt_after_three(row):
        seen.append(row["cell"])
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(study(), out, scheduler=cluster.scheduler_address, on_row=interrupt_after_three)
    stored = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert [r["cell"] for r in stored] == seen  # every finished row was on disk at once
    resumed: list[str] = []
    df = run(study(), out, scheduler=cluster.scheduler_address, resume=True, on_row=lambda r: resumed.append(r["cell"]))
    assert len(df) == 12 and df["error"].isna().all()
    assert sorted(resumed) == sorted(set(df["cell"]) - set(seen))  # only the missing cells ran
    first = {r["cell"]: r for r in stored}
    kept = df[df["cell"].isin(seen)]
    assert kept["worker"].tolist() == [first[c]["worker"] for c in kept["cell"]]  # those rows are the old ones
    again: list[str] = []
    run(study(), out, scheduler=cluster.scheduler_address, resume=True, on_row=lambda r: again.append(r["cell"]))
    assert again == []


def test_a_raising_plugin_is_one_row_with_its_error_and_the_rest_are_intact(cluster, tmp_path):
    s = study(probes=PROBES[:1])
    s["plugins"] = [
        {"name": "sink", "window": [8, 16]},
        {"name": f"{PLUGINS}:Fragile", "fail_at": [-1, 20]},
        {"name": "lattice", "window": [8, 16]},
    ]
    df = run(s, tmp_path / "out", scheduler=cluster.scheduler_address, per_position=True)
    failed = df[df["error"].notna()]
    assert len(df) == 6 and len(failed) == 1
    assert failed.iloc[0]["knob_fail_at"] == 20
    assert "fragile: failed on purpose after 20 positions" in failed.iloc[0]["error"]
    assert "\n" not in failed.iloc[0]["error"]
    assert pd.isna(failed.iloc[0]["mean_kl"])
    ok = df[df["error"].isna()]
    plan = plan_study(load_study(s))
    local = to_frame([run_cell(c)[0] for c in plan.cells if "fail_at=20" not in c.spec])
    pd.testing.assert_frame_equal(without_timing(ok), without_timing(local), check_exact=True, check_dtype=False)
    positions = pd.read_parquet(tmp_path / "out" / "positions.parquet")
    assert set(positions["cell"]) == set(ok["cell"])
    n = int(ok.iloc[0]["positions"])
    assert (positions.groupby("cell").size() == n).all()


def test_the_command_runs_a_study_file_on_a_scheduler(cluster, tmp_path):
    from click.testing import CliRunner

    from pyllama.cli import main

    study_file = tmp_path / "study.toml"
    study_file.write_text(
        f'models = ["{shared_file("stories260K.bin")}"]\n'
        f'tokenizer = "{shared_file("tok512.bin")}"\n'
        f'probes = ["{PROBES[0]}"]\n'
        '[[plugins]]\nname = "sliding"\nwindow = [8, 16]\n',
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = ["sweep", str(study_file), "--out", str(out), "--scheduler", cluster.scheduler_address, "--per-position"]
    result = CliRunner().invoke(main, [*args, "--progress"])
    assert result.exit_code == 0, result.output
    assert f"2 cells, 0 failed: wrote {out}/results.parquet and {out}/results.csv" in result.output
    assert "2/2" in result.output  # the progress bar counted the cells as they finished
    df = pd.read_parquet(out / "results.parquet")
    assert df["spec"].tolist() == ["sliding:window=8", "sliding:window=16"]
    assert len(pd.read_parquet(out / "positions.parquet")) == 2 * int(df["positions"].iloc[0])
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "rows.jsonl exists: pass --resume" in again.output
    resumed = CliRunner().invoke(main, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"2 cells: 0 run, 2 already done, 0 failed: wrote {out}/results.parquet" in resumed.output


def test_the_command_exits_non_zero_after_writing_the_table_when_a_cell_failed(cluster, tmp_path):
    from click.testing import CliRunner

    from pyllama.cli import main

    study_file = tmp_path / "study.toml"
    study_file.write_text(
        f'models = ["{shared_file("stories260K.bin")}"]\n'
        f'tokenizer = "{shared_file("tok512.bin")}"\n'
        f'probes = ["{PROBES[0]}"]\n'
        '[[plugins]]\nname = "sliding"\nwindow = 8\n'
        f'[[plugins]]\nname = "{PLUGINS}:Fragile"\nfail_at = [-1, 5]\n',
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = ["sweep", str(study_file), "--out", str(out), "--scheduler", cluster.scheduler_address]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert result.stdout.strip().splitlines() == [
        f"3 cells, 1 failed: wrote {out}/results.parquet and {out}/results.csv"
    ]
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith("cell ") and "fragile: failed on purpose after 5 positions" in error
    df = pd.read_parquet(out / "results.parquet")  # the table is written all the same
    assert len(df) == 3 and df["error"].notna().tolist() == [False, False, True]
    # --resume runs the failed cell again: it fails again, and says what was run and what was kept
    resumed = CliRunner().invoke(main, [*args, "--resume"])
    assert resumed.exit_code == 1, resumed.output
    assert resumed.stdout.startswith("3 cells: 1 run, 2 already done, 1 failed: wrote ")


def test_threads_per_cell_beyond_the_workers_limit_are_refused_before_any_cell(cluster, tmp_path):
    from pyllama.errors import InputError
    from pyllama.options import max_threads

    rows = []  # the workers run on this machine: their limit is this machine's
    with pytest.raises(InputError, match=rf"^threads per cell {max_threads() + 1} is out of range on the cluster: "):
        run(study(), tmp_path / "out", scheduler=cluster.scheduler_address, threads_per_cell=max_threads() + 1,
            on_row=rows.append)  # fmt: skip
    assert rows == [] and not (tmp_path / "out").exists()
