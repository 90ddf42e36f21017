"""The diff harness: probes, metrics, what it detects, its report and exports, the CLI, and
generation past the trained context with a bounded plugin (stories260K)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

from pyllama import plots
from pyllama.attention import Attention
from pyllama.cli import EXIT_NOT_EXACT, main
from pyllama.diff.probes import LONG_FACTOR, load_probe, probe_from_text
from pyllama.errors import InputError
from pyllama.model import Model
from pyllama.plugins.causal import Causal
from pyllama.sampler import Sampler

MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "experiments" / "random_evict.py"


def _model_file(name: str) -> Path:
    path = MODELS / name
    if not path.exists():
        pytest.skip(f"{name} is not in shared/models beside the repository (needed for this test)")
    return path


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load(_model_file("stories260K.bin"), tokenizer=_model_file("tok512.bin"), threads=1)


@pytest.fixture(scope="module")
def stories_sliding32(model):
    return model.diff("causal", "sliding:32", probe="stories", threads=1)


# ---- probes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tokenizer, seq_len", [("tok512.bin", 512), ("tokenizer.bin", 256)])
def test_standard_probe_is_tokenised_to_fit_each_model(tokenizer, seq_len):
    from pyllama.tokenizer import load_tokenizer

    probe = load_probe("standard", load_tokenizer(_model_file(tokenizer)), seq_len)
    kinds = [s.kind for s in probe.segments]
    assert kinds.count("story") >= 6 and kinds.count("long") == 1 and kinds.count("recall") >= 3
    for seg in probe.segments:
        assert seg.tokens[0] == 1, "every sequence starts with BOS"
        if seg.kind == "long":
            assert len(seg) == LONG_FACTOR * seq_len
            assert (seg.tokens == 1).sum() >= 2, "stories are joined with BOS, as in the training data"
        else:
            assert 32 < len(seg) <= seq_len and not seg.note
    for seg in (s for s in probe.segments if s.kind == "recall"):
        assert len(seg.marks) >= 5
        starts = [m.start for m in seg.marks]
        gaps = np.diff(starts)
        assert gaps.max() >= 48 and gaps[-1] > gaps[1], "the name recurs at a growing distance"
        name = seg.marks[0].label
        pattern = seg.tokens[seg.marks[0].start : seg.marks[0].start + seg.marks[0].length]
        for m in seg.marks:
            assert np.array_equal(seg.tokens[m.start : m.start + m.length], pattern), name


def test_text_probes(tmp_path, model):
    f = tmp_path / "two.txt"
    f.write_text("Tom had a red ball.\n<|endoftext|>\nLily saw a big dog in the park.\n")
    probe = load_probe(f, model.tokenizer, 512)
    assert [s.name for s in probe.segments] == ["two-1", "two-2"]
    assert probe.segments[0].tokens.tolist() == model.tokenize("Tom had a red ball.")
    with pytest.raises(InputError, match="unknown probe 'nope'"):
        load_probe("nope", model.tokenizer, 512)


# ---- metrics ------------------------------------------------------------------------------------------
# ---- what the harness detects --------------------------------------------------------------------------
def test_sliding32_is_causal_before_32_and_differs_after(stories_sliding32):
    r = stories_sliding32
    early, late = r.position < 32, r.position >= 32
    assert early.sum() == 32 * len(r.segments)
    assert (r.max_abs_dlogit[early] == 0).all() and (r.kl[early] == 0).all() and (r.layer_err[early] == 0).all()
    assert (r.max_abs_dlogit[late] > 0).all() and (r.layer_err[late][:, 0] > 0).all()
    s = r.summary
    assert s["first_diff"]["position"] == 32 and s["first_diff_layer"] == 0 and not s["exact"]
    assert 0 < s["top1_agreement"] < 1 and s["max_kl"] >= s["p99_kl"] >= 0
    assert s["ppl_b"] > s["ppl_a"] > 1
    assert (r.mem_b[late] == 2 * 5 * 32 * 32 * 4).all(), "sliding:32 holds 32 positions of 5 layers x 32 floats"
    assert s["bytes_ratio_a"] == 1.0 and s["bytes_last_b"] == 2 * 5 * 32 * 32 * 4


class PerturbOneLayer(Attention):
    """Exact causal attention, except that one layer's output is scaled from a given position on."""

    description = "causal with one layer's attention output scaled (a test of per-layer attribution)"

    def __init__(self, layer: int, start: int, scale: float = 1.01):
        self.layer, self.start, self.scale = layer, start, scale
        self.inner = Causal()

    def init(self, config, pool):
        self.inner._configure(config, pool)  # a plugin driven by another plugin: no engine buffers
        self.inner.init(config, pool)

    def reset(self):
        self.inner.reset()

    def memory_bytes(self):
        return self.inner.memory_bytes()

    def attend(self, layer, pos, q, k, v, out):
        self.inner.attend(layer, pos, q, k, v, out)
        if layer == self.layer and pos >= self.start:
            out *= self.scale


def test_a_perturbed_layer_is_attributed_to_that_layer(model):
    r = model.diff(
        "causal",
        PerturbOneLayer(layer=2, start=5),
        text="Once upon a time, Lily saw a big dog in the "
        "park. The dog was brown and it liked to run. Lily threw a ball and the dog ran after it.",
        threads=2,  # a native and a Python plugin side by side on two threads
    )
    assert (r.layer_err[:, :2] == 0).all(), "layers before the perturbed one are untouched"
    after = r.position >= 5
    assert (r.layer_err[after, 2] > 0).all() and (r.layer_err[~after] == 0).all()
    assert r.summary["first_diff_layer"] == 2 and r.summary["first_diff"]["position"] == 5
    mean = np.array(r.summary["layer_err_mean"])
    assert mean[2] == pytest.approx(0.01 * after.mean(), rel=1e-3)


def test_probe_longer_than_a_plugin_is_compared_where_both_hold(model):
    r = model.diff("causal", "sliding:16", probe="long", threads=1)
    assert r.n_positions == 512 and r.segments[0].length == 4 * 512
    assert r.notes == ["long: compared positions 0..511 of 2,048 (causal:positions=0 holds 512)"]
    assert "note: long: compared positions 0..511 of 2,048 (causal:positions=0 holds 512)" in r.table()


def test_recall_scores_the_name_at_each_mention(model):
    r = model.diff("causal", "sliding:24", probe="recall", threads=1)
    rows = [x for x in r.recall if x.mention > 0]
    assert len(rows) >= 12 and {x.name for x in rows} == {"Pip", "Bruno", "Rosie"}
    assert all(0 < x.p_a <= 1 and 0 < x.p_b <= 1 for x in rows)
    near = [x for x in rows if x.distance < 24]
    assert near and all(x.logp_a == x.logp_b for x in near if x.position < 24)
    assert "recall: P(name) at each mention" in r.table()


def test_report_exports(stories_sliding32, tmp_path):
    r = stories_sliding32
    r.to_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert len(data["rows"]) == r.n_positions and data["summary"]["first_diff"]["position"] == 32
    assert set(data["rows"][0]) >= {
        "sequence",
        "position",
        "max_abs_dlogit",
        "kl",
        "agree",
        "dlogp",
        "mem_a",
        "mem_b",
        "layer4_err",
    }
    r.to_csv(tmp_path / "r.csv")
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == r.n_positions and rows[40]["position"] == str(r.position[40])
    df = r.to_pandas()
    assert len(df) == r.n_positions and df["kl"].dtype == np.float64
    assert (df.groupby("sequence")["position"].max() + 1).to_dict() == {s.name: s.compared for s in r.segments}


def test_plots_return_figures(stories_sliding32, tmp_path):
    r = stories_sliding32
    for make in (
        plots.divergence_figure,
        plots.layer_error_figure,
        plots.memory_figure,
        plots.recall_figure,
        plots.report_figure,
    ):
        fig = make(r)
        assert isinstance(fig, Figure) and fig.axes
        titled = [ax for ax in fig.axes if ax.get_title()]
        assert fig.get_suptitle() and titled and all(ax.get_ylabel() for ax in titled)
    r.plot(tmp_path / "overview.png")
    assert (tmp_path / "overview.png").read_bytes()[:4] == b"\x89PNG"


def test_thread_count_and_concurrency_do_not_change_the_report(model):
    one = model.diff(
        "causal",
        "sink:2,20,shift",
        probe=probe_from_text("Tom and Ben went to the park. " * 8, model.tokenizer),
        threads=1,
    )
    two = model.diff(
        "causal",
        "sink:2,20,shift",
        probe=probe_from_text("Tom and Ben went to the park. " * 8, model.tokenizer),
        threads=2,
    )
    for name, col in one.columns().items():
        assert np.array_equal(col, two.columns()[name], equal_nan=col.dtype.kind == "f"), name


@pytest.mark.parametrize("name", ["stories260K.bin", "stories260K-f16.gguf", "stories260K-q8_0.gguf"])
def test_block_classifier_gives_the_engines_logits_bit_for_bit(name):
    from pyllama.diff.sides import LiveSide
    from pyllama.engine import Engine

    m = Model.load(_model_file(name), tokenizer=None, threads=1)
    tokens = np.random.default_rng(0).integers(3, m.config.vocab_size, 70).astype(np.int32)
    engine = m.engine("causal", threads=1)
    expect = np.array([np.array(engine.forward(int(t), p)) for p, t in enumerate(tokens)])
    for threads, n in ((1, len(tokens)), (2, 10)):  # blocks of 64 and a partial one; rows split over threads
        side = LiveSide(
            "causal", Engine(m.config, m.weights, Causal(), threads, max_block=64), 64, m.config, m.weights, threads
        )
        got = []
        for c0 in range(0, n, 64):
            block = tokens[c0 : min(c0 + 64, n)]
            side.run(block, c0, "test", 0)
            got.append(side.logits[: len(block)].copy())
        assert np.array_equal(np.concatenate(got), expect[:n])


def test_diff_input_errors(model):
    p = Causal()
    with pytest.raises(InputError, match="two plugin instances"):
        model.diff(p, p, probe="stories")
    with pytest.raises(InputError, match="outside the model's vocabulary of 512"):
        model.diff("causal", "causal", probe=[1, 600, 3])
    with pytest.raises(InputError, match="either probe= or text="):
        model.diff("causal", "causal", probe="stories", text="hi")


# ---- the CLI ------------------------------------------------------------------------------------------
def test_cli_diff_writes_everything_and_gates_on_exactness(tmp_path):
    ckpt, tok = str(_model_file("stories260K.bin")), str(_model_file("tok512.bin"))
    text = tmp_path / "probe.txt"
    text.write_text(
        "Once upon a time, there was a little girl named Lily. She had a small dog named Max. "
        "Max liked to run in the park. One day, Lily and Max saw a big red ball.\n"
    )
    runner = CliRunner()
    out = {k: tmp_path / f"r.{k}" for k in ("json", "csv", "png")}
    res = runner.invoke(
        main,
        [
            "diff",
            "causal",
            "sliding:8",
            "-c",
            ckpt,
            "-z",
            tok,
            "--text",
            str(text),
            "--json",
            str(out["json"]),
            "--csv",
            str(out["csv"]),
            "--plot",
            str(out["png"]),
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "first difference    position 8 (probe)" in res.stdout
    assert all(p.exists() and p.stat().st_size > 0 for p in out.values())
    res = runner.invoke(
        main,
        ["diff", "causal", "sliding:8", "-c", ckpt, "-z", tok, "--text", str(text), "--expect-exact", "--threads", "1"],
    )
    assert res.exit_code == EXIT_NOT_EXACT
    assert res.stderr.strip() == "error: not exact: max |Δlogit| = " + res.stderr.split("= ")[1].strip()
    assert "first at position 8 of probe" in res.stderr
    res = runner.invoke(
        main,
        [
            "diff",
            "causal",
            "sink:0,64",
            "-c",
            ckpt,
            "-z",
            tok,
            "-i",
            "Once upon a time",
            "--expect-exact",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0 and "EXACT" in res.stdout
    res = runner.invoke(main, ["diff", "causal", "slidng:8", "-c", ckpt, "-z", tok, "-i", "hi"])
    assert res.exit_code == 1
    assert res.stderr.strip().startswith("error: unknown attention plugin 'slidng'; available: causal, sliding, sink")
    res = runner.invoke(main, ["diff", "causal", "sliding:8", "-c", ckpt, "-z", tok, "-i", "hi", "--probe", "long"])
    assert res.exit_code != 0 and "give one of --probe, --text and -i/--prompt" in res.output


def test_cli_plugins_lists_every_plugin_with_knobs():
    res = CliRunner().invoke(main, ["plugins"])
    assert res.exit_code == 0
    for line in ("causal", "sliding", "sink"):
        assert any(out.startswith(line + " ") for out in res.stdout.splitlines())
    assert "window     int >= 1" in res.stdout and "shift      bool" in res.stdout
    listed = json.loads(CliRunner().invoke(main, ["plugins", "--json"]).stdout)
    sink = next(p for p in listed if p["name"] == "sink")
    assert [k["name"] for k in sink["knobs"]] == ["sinks", "window", "shift"] and sink["knobs"][1]["default"] == 252
    assert CliRunner().invoke(main, ["plugins", "--markdown"]).stdout.startswith("| plugin | what it keeps |")


# ---- generation past the context ------------------------------------------------------------------------
def test_generate_with_sink_runs_past_the_context_with_flat_memory(model):
    ckpt, tok = str(_model_file("stories260K.bin")), str(_model_file("tok512.bin"))
    res = CliRunner().invoke(
        main,
        [
            "generate",
            "-c",
            ckpt,
            "-z",
            tok,
            "--attention",
            "sink:4,60",
            "-n",
            "2000",
            "-t",
            "0.8",
            "-s",
            "7",
            "--ignore-eos",
            "--json",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["ids"]) == 2000  # the prompt is BOS alone: 2000 positions, each samples one token
    assert out["memory_bytes"] == 2 * 5 * 64 * 32 * 4
    tail = model.tokenizer.decode([1] + out["ids"][1000:])
    words = tail.split()
    assert len(words) > 150 and sum(w.strip('.,!?"').isalpha() for w in words) > 0.9 * len(words)
    assert sum(w.strip('.,!?"').lower() in {"the", "a", "and", "to", "was", "she", "he"} for w in words) > 20
    # the ledger, position by position, through the Python API (from BOS alone: the ids of a longer
    # prompt reach on_token after the prompt has run as a block)
    engine = model.engine("sink:4,60", threads=1)
    ledger: list[int] = []
    prompt = np.array([1], dtype=np.int32)
    ids = np.zeros(1200, dtype=np.int32)
    n, _, _, pos, _ = engine.generate_into(
        prompt, 1200, Sampler(512, 0.8, 0.9, 3), ids, lambda t: ledger.append(engine.attention.memory_bytes()), None
    )
    assert pos == 1200 > model.config.seq_len
    assert ledger[:3] == [2 * 5 * k * 32 * 4 for k in (1, 2, 3)]
    assert set(ledger[63:]) == {2 * 5 * 64 * 32 * 4}


def test_python_example_plugin_runs_through_generate():
    ckpt, tok = str(_model_file("stories260K.bin")), str(_model_file("tok512.bin"))
    res = CliRunner().invoke(
        main,
        [
            "generate",
            "-c",
            ckpt,
            "-z",
            tok,
            "--attention",
            f"{EXAMPLE}:RandomEvict:budget=32",
            "-n",
            "600",
            "-t",
            "0",
            "--ignore-eos",
            "--json",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["ids"]) == 600 and out["memory_bytes"] == 2 * 5 * 32 * 32 * 4
