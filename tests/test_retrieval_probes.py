"""Retrieval probes (passkey, needle, copy): generated deterministically, scored as an independent
numpy computation from the logits says, and exact for plugins in their degenerate settings."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from pyllama.cli import main
from pyllama.diff.probes import PROBE_NAMES, is_probe_name, load_probe
from pyllama.diff.retrieval_scores import score_retrieval, teacher_rank
from pyllama.errors import InputError
from pyllama.model import Model


@pytest.fixture(scope="module")
def model(stories260k, tok512):
    return Model.load(stories260k, tokenizer=tok512, threads=1)


def _probe(model, spec):
    return load_probe(spec, model.tokenizer, model.config.seq_len)


@pytest.mark.parametrize("spec", ["passkey:depth=0.3,length=300", "needle:depths=0/1,lengths=200/300", "copy"])
def test_same_seed_same_tokens(model, spec):
    a, b = _probe(model, spec), _probe(model, spec)
    assert [s.name for s in a.segments] == [s.name for s in b.segments]
    for x, y in zip(a.segments, b.segments, strict=True):
        assert np.array_equal(x.tokens, y.tokens) and x.target == y.target


def test_a_different_seed_draws_a_different_key(model):
    keys = {_probe(model, f"passkey:length=300,seed={seed}").segments[0].target.key for seed in range(4)}
    assert len(keys) == 4 and all(len(k) == 5 and k.isdigit() for k in keys)
    spans = [_probe(model, f"copy:seed={seed}").segments[0] for seed in (0, 1)]
    assert not np.array_equal(spans[0].tokens, spans[1].tokens)


def test_passkey_layout(model):
    """The key's tokens end the sequence, spell the key, and the needle holds the same key at the
    asked depth of the filler; lengths never exceed what was asked."""
    pr = _probe(model, "needle:depths=0/0.5/1,lengths=256/512")
    assert len(pr.segments) == 6
    tok = model.tokenizer
    for seg in pr.segments:
        t = seg.target
        assert len(seg) <= t.requested and len(seg) >= t.requested - 16
        assert t.start + t.length == len(seg)
        assert tok.decode([int(seg.tokens[t.start - 1]), *seg.tokens[t.start :].tolist()]).strip() == t.key
        assert tok.decode(seg.tokens[: t.start].tolist()).endswith("The pass key is ")
        needle_text = tok.decode(seg.tokens[t.needle - 1 : t.needle + t.length].tolist())
        assert t.key in needle_text
    # at one length, the needle moves from the start of the filler to its end with the depth
    d0, d5, d1 = (s.target.needle for s in pr.segments[3:])
    assert d0 < d5 < d1


def test_copy_layout(model):
    seg = _probe(model, "copy:span=16,length=300,seed=2").segments[0]
    t = seg.target
    first = seg.tokens[t.needle : t.needle + 16]
    second = seg.tokens[t.start - 1 : t.start + t.length]
    assert len(seg) == 300 and np.array_equal(first, second) and t.length == 15


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("passkey:depth=1.5", r"outside \[0, 1\]"),
        ("passkey:deep=0.5", "takes depth"),
        ("passkey:length=abc", "not a valid int"),
        ("needle:lengths=", "grid is empty"),
        ("passkey:chat=yes", "no chat template"),
        ("copy:span=400,length=300", "span=400"),
        ("passkey:length=64", "prompt without filler"),
    ],
)
def test_bad_options_are_one_clear_error(model, spec, problem):
    with pytest.raises(InputError, match=problem):
        _probe(model, spec)


def test_names():
    assert all(is_probe_name(n) for n in PROBE_NAMES)
    assert is_probe_name("needle:depths=0/1") and is_probe_name("copy") and not is_probe_name("needles")


def _numpy_scores(model, seg):
    """log P(key) and ranks from the logits of position-by-position forwards, in plain numpy."""
    t = seg.target
    logits = model.logits(seg.tokens)  # the block forward: the same bits as forward()
    lp, ranks = 0.0, []
    for j in range(t.length):
        row = logits[t.start - 1 + j].astype(np.float64)
        tok = int(seg.tokens[t.start + j])
        m = row.max()
        lp += row[tok] - m - np.log(np.exp(row - m).sum())
        f32 = logits[t.start - 1 + j]
        ranks.append(int(np.sum(f32 > f32[tok]) + np.sum(f32[:tok] == f32[tok]) + 1))
    return lp, ranks


def test_scores_match_numpy_and_the_diff(model):
    spec = "needle:depths=0/1,lengths=200/300"
    report = model.diff("causal", "sink:4,32", probe=spec)
    run = score_retrieval(model, "causal", spec)
    assert len(report.retrieval) == len(run.rows) == 4
    for seg, row, alone in zip(_probe(model, spec).segments, report.retrieval, run.rows, strict=True):
        lp, ranks = _numpy_scores(model, seg)
        assert row.a.logp == pytest.approx(lp, rel=1e-9, abs=1e-9)
        assert list(row.a.ranks) == ranks
        # the single-plugin scorer gives the diff's side A bit for bit
        assert alone.a.logp == row.a.logp and alone.a.ranks == row.a.ranks
        assert row.a.retrieves == (max(ranks) == 1)
        assert row.distance == seg.target.start - seg.target.needle
    assert report.summary["retrieval_a"] == np.mean([r.a.retrieves for r in report.retrieval])


def test_teacher_rank_breaks_ties_as_argmax():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, 1.0, np.nan, 0.0]], dtype=np.float32)
    assert teacher_rank(logits, np.array([2, 0, 1])).tolist() == [2, 1, 4]
    assert teacher_rank(logits[:2], np.array([1, -1])).tolist() == [1, 0]
    assert teacher_rank(logits[:1], np.array([1]))[0] == 1 and int(np.argmax(logits[0])) == 1


def test_greedy_decoding_agrees_with_the_teacher_chain(model):
    """Where the argmax chain leaves the key, the greedy answer is decoded for real; its first token
    is the argmax of the prompt's last row either way."""
    spec = "passkey:depth=0.5,length=300"
    report = model.diff("causal", "sliding:16", probe=spec)
    row = report.retrieval[0]
    seg = _probe(model, spec).segments[0]
    engine = model.engine("causal")
    prompt = seg.tokens[: seg.target.prompt]
    engine.reset()
    ids = []
    logits = None
    for pos, tok in enumerate(prompt.tolist()):
        logits = np.array(engine.forward(tok, pos))
    for pos in range(len(prompt), len(prompt) + seg.target.length):
        ids.append(int(np.argmax(logits)))
        logits = np.array(engine.forward(ids[-1], pos))
    assert row.a.greedy == model.tokenizer.decode([int(prompt[-1]), *ids])
    assert row.a.match == (seg.target.key in row.a.greedy)


@pytest.mark.parametrize(
    "b", ["sliding:1024", "sink:4,1020", "kmeans:budget=1024", "tiered:window=1024", "lattice:window=1024"]
)
def test_expect_exact_holds_on_the_retrieval_probes(stories260k, tok512, b):
    for probe in ("needle:depths=0/1,lengths=192/512", "copy:span=16,length=200"):
        args = ["diff", "causal", b, "-c", str(stories260k), "-z", str(tok512), "--probe", probe, "--threads", "1"]
        result = CliRunner().invoke(main, [*args, "--expect-exact"])
        assert result.exit_code == 0, result.output
        assert "EXACT" in result.output and "retrieval" in result.output


def test_cli_json_and_csv_carry_the_scores(stories260k, tok512, tmp_path):
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    args = ["diff", "causal", "sink:4,28", "-c", str(stories260k), "-z", str(tok512), "--probe", "copy:span=16"]
    result = CliRunner().invoke(main, [*args, "--json", str(out_json), "--csv", str(out_csv)])
    assert result.exit_code == 0, result.output
    assert "loss on the second copy" in result.output
    data = json.loads(out_json.read_text())
    (row,) = data["retrieval"]
    assert row["kind"] == "copy" and row["loss_a"] > 0 and len(row["ranks_b"]) == 15
    assert data["summary"]["copy_loss_b"] == pytest.approx(row["loss_b"])
    header = out_csv.read_text().splitlines()[0].split(",")
    assert "rank_a" in header and "rank_b" in header


def test_a_study_names_retrieval_probes(stories260k, tok512):
    """A study's probes may be retrieval specs; each cell's row carries the retrieval scores."""
    from pyllama.sweep import load_study, plan_study
    from pyllama.sweep.cell import run_cell

    probe = "needle:depths=0/1,lengths=192/256"
    study = {
        "models": [str(stories260k)],
        "tokenizer": str(tok512),
        "probes": [probe, "copy:span=8,length=128"],
        "budgets": [40_000],
        "plugins": [{"name": "sink", "sinks": 4}],
    }
    cells = plan_study(load_study(study)).cells
    assert [c.probe for c in cells] == [probe, "copy:span=8,length=128"]
    row, _ = run_cell(cells[0])
    assert row["error"] is None
    report = Model.load(stories260k, tokenizer=tok512).diff("causal", cells[0].spec, probe=probe)
    for key in ("retrieval_a", "retrieval_b", "key_logp_a", "key_logp_b"):
        assert row[key] == report.summary[key]
    assert row["bytes_last_b"] <= 40_000
    with pytest.raises(Exception, match="depth 2.0 is outside"):
        plan_study(load_study(dict(study, probes=["passkey:depth=2"])))
