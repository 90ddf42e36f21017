"""Recorded diff sides (pyllama.diff.side_cache): side A recorded by one diff and replayed by the
next gives the same report, every column, as running it; records are keyed on the model file, the
plugin spec and the probe, are whole or absent, and stay under their size limit."""

from __future__ import annotations

import dataclasses
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.diff import run_diff
from pyllama.diff.side_cache import SideCache
from pyllama.model import Model
from pyllama.plugins.causal import Causal

BUILTINS = [
    "causal",
    "sliding:16",
    "sink:2,10,shift",
    "kmeans:clusters=4,budget=8,sinks=2,window=8,recluster=16",
    "tiered:sinks=2,window=8,warm=32,group=16,block=8",
    "lattice:sinks=2,window=8,base=4",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Model:
    # a copy, so that a test may touch its modification time
    path = tmp_path_factory.mktemp("model") / "stories260K.bin"
    shutil.copyfile(shared_file("stories260K.bin"), path)
    return Model.load(path, tokenizer=shared_file("tok512.bin"), threads=1)


def _tokens(model: Model, n: int = 150, seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, model.config.vocab_size, size=k, dtype=np.int32) for k in (n, n // 3)]


def _assert_same_report(got, expect) -> None:
    for f in dataclasses.fields(expect):
        if f.name in ("seconds", "replayed", "threads"):
            continue
        a, b = getattr(got, f.name), getattr(expect, f.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), f.name
        else:
            assert a == b, f.name


def _records(folder) -> list:
    return [p for p in folder.iterdir() if (p / "meta.json").exists()] if folder.exists() else []


@pytest.mark.parametrize("a", BUILTINS)
def test_replayed_side_gives_the_report_of_the_live_side(model, tmp_path, a, parallel_always):
    probe = _tokens(model)
    live = model.diff(a, "sink:4,12", probe=probe, threads=2, cache=False)
    first = model.diff(a, "sink:4,12", probe=probe, threads=1, cache=tmp_path)
    assert first.replayed == [] and len(_records(tmp_path)) == 1
    again = model.diff(a, "sink:4,12", probe=probe, threads=2, cache=tmp_path)
    assert again.replayed == ["A"]
    _assert_same_report(first, live)
    _assert_same_report(again, live)
    assert again.mem_a.max() > 0 and np.any(again.layer_err > 0)
    # B replays A's record when it is the same plugin: every logit equal
    both = model.diff(a, a, probe=probe, threads=1, cache=tmp_path, blocks=False)
    assert both.replayed == ["A", "B"] and both.exact


def test_standard_probe_replayed_over_the_positions_both_hold(model, tmp_path):
    """causal holds the context (512) of the long sequence, sliding more: A records what it holds."""
    live = model.diff("causal", "sliding:64", threads=2, cache=False)
    assert any("causal:positions=0 holds 512" in n for n in live.notes)
    model.diff("causal", "sliding:64", threads=2, cache=tmp_path)
    again = model.diff("causal", "sink:4,60", threads=2, cache=tmp_path)
    assert again.replayed == ["A"]
    _assert_same_report(model.diff("causal", "sink:4,60", threads=1, cache=False), again)
    _assert_same_report(model.diff("causal", "sliding:64", threads=1, cache=tmp_path), live)


def test_a_side_holding_more_than_is_compared_is_not_recorded(model, tmp_path):
    report = model.diff("sliding:64", "causal", probe="standard", cache=tmp_path)
    assert report.notes and _records(tmp_path) == []


def test_only_built_in_specs_of_a_model_file_are_recorded(model, tmp_path):
    probe = _tokens(model, 40)
    model.diff(Causal(), "sliding:8", probe=probe, cache=tmp_path)
    assert _records(tmp_path) == []
    run_diff(model.config, model.weights, "causal", "sliding:8", probe, cache=tmp_path)  # no model file
    assert _records(tmp_path) == []


def test_a_changed_model_file_or_probe_is_not_replayed(model, tmp_path):
    probe = _tokens(model, 40)
    model.diff("causal", "sliding:8", probe=probe, cache=tmp_path)
    assert model.diff("causal", "sliding:8", probe=probe, cache=tmp_path).replayed == ["A"]
    assert model.diff("causal", "sliding:8", probe=_tokens(model, 40, seed=4), cache=tmp_path).replayed == []
    st = os.stat(model.path)
    os.utime(model.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert model.diff("causal", "sliding:8", probe=probe, cache=tmp_path).replayed == []
    assert model.diff("causal", "sliding:8", probe=probe, cache=tmp_path).replayed == ["A"]


def test_a_damaged_record_is_removed_and_run_again(model, tmp_path):
    probe = _tokens(model, 40)
    expect = model.diff("causal", "sliding:8", probe=probe, cache=tmp_path)
    (record,) = _records(tmp_path)
    with open(record / "logits.npy", "r+b") as f:
        f.truncate(1000)
    got = model.diff("causal", "sliding:8", probe=probe, cache=tmp_path)
    assert got.replayed == []
    _assert_same_report(got, expect)
    assert model.diff("causal", "sliding:8", probe=probe, cache=tmp_path).replayed == ["A"]


def test_records_stay_under_the_limit_least_recently_used_first(model, tmp_path):
    probes = [_tokens(model, 40, seed=s) for s in range(3)]
    model.diff("causal", "sliding:8", probe=probes[0], cache=tmp_path / "one")
    size = sum(f.stat().st_size for f in _records(tmp_path / "one")[0].iterdir())
    store = SideCache(tmp_path, max_bytes=int(2.5 * size))
    for p in probes:
        model.diff("causal", "sliding:8", probe=p, cache=store)
    assert len(_records(tmp_path)) == 2
    assert model.diff("causal", "sliding:8", probe=probes[0], cache=store).replayed == []  # the oldest went
    assert model.diff("causal", "sliding:8", probe=probes[2], cache=store).replayed == ["A"]
    model.diff("causal", "sliding:8", probe=probes[0], cache=SideCache(tmp_path / "small", max_bytes=size))
    assert _records(tmp_path / "small") == []  # over half the limit: not kept


def test_cli_replays_and_says_so(model, tmp_path):
    args = ["diff", "causal", "sliding:16", "-c", str(model.path), "-z", str(shared_file("tok512.bin"))]
    args += ["--probe", "stories"]
    env = {"PYLLAMA_DIFF_CACHE": str(tmp_path)}
    first = CliRunner().invoke(main, args, env=env)
    second = CliRunner().invoke(main, args, env=env)
    off = CliRunner().invoke(main, [*args, "--no-cache"], env=env)
    assert first.exit_code == second.exit_code == off.exit_code == 0, first.output + second.output
    assert "replayed" not in first.output and "A replayed from its recorded run" in second.output
    assert "replayed" not in off.output
    body = [line for line in second.output.splitlines()[1:]]
    assert body == first.output.splitlines()[1:]


def test_a_record_written_out_of_order_is_not_kept(tmp_path):
    store = SideCache(tmp_path, max_bytes=2**30)
    writer = store.start([3, 2], 10, 5, (2, 4))
    rows = {"logits": np.zeros((2, 5)), "att": np.zeros((2, 2, 4)), "mem": np.zeros(2), "bad": np.zeros(2)}
    writer.append(0, **rows)
    writer.append(3, **rows)  # rows 2 and 3: row 2 is skipped
    store.finish(writer, "k")
    assert _records(tmp_path) == [] and list(tmp_path.iterdir()) == []
    writer = store.start([3, 2], 10, 5, (2, 4))
    writer.append(0, **rows)
    three = {"logits": np.ones((3, 5)), "att": np.ones((3, 2, 4)), "mem": np.ones(3), "bad": np.ones(3)}
    writer.append(2, **three)
    store.finish(writer, "k")
    record = store.open("k", lambda n: [3, 2], 5, (2, 4))
    assert record is not None and record.logits.shape == (5, 5) and record.mem.tolist() == [0, 0, 1, 1, 1]


def test_a_bad_size_limit_is_one_clear_error(model, tmp_path):
    args = ["diff", "causal", "sliding:16", "-c", str(model.path), "-z", str(shared_file("tok512.bin"))]
    env = {"PYLLAMA_DIFF_CACHE": str(tmp_path), "PYLLAMA_DIFF_CACHE_GIB": "lots"}
    result = CliRunner().invoke(main, [*args, "--probe", "stories"], env=env)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "PYLLAMA_DIFF_CACHE_GIB=lots: not a size in GiB" in result.output
