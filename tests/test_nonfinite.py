"""NaN and Inf are never silent: ``generate`` stops with one line naming the position and the layer,
and ``diff`` counts a non-finite value as a difference, reports where it first appeared and keeps it
in every metric (a plugin that writes NaN never looks better than one that does not)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.errors import NonFiniteError
from pyllama.model import Model

# stories260K: dim 64, 5 layers, vocabulary 512 (the llama2.c layout: embedding, rms_att, wq, ...)
DIM, LAYERS, VOCAB = 64, 5, 512

NAN_PLUGIN = '''
import numpy as np
from pyllama.attention.base import Attention
from pyllama.plugins.causal import Causal


class NanAt(Attention):
    """Exact causal attention, except that it writes {value} into layer {layer} at position {pos}."""

    description = "causal, poisoned once"

    def __init__(self):
        self.inner = Causal()

    def init(self, config, pool):
        self.inner._configure(config, pool)
        self.inner.init(config, pool)

    def reset(self):
        self.inner.reset()

    def attend(self, layer, pos, q, k, v, out):
        self.inner.attend(layer, pos, q, k, v, out)
        if layer == {layer} and pos == {pos}:
            out[3] = {value}

    def memory_bytes(self):
        return self.inner.memory_bytes()
'''


def _plugin(tmp_path, layer: int, pos: int, value: str = "np.nan") -> str:
    path = tmp_path / f"nan_{layer}_{pos}.py"
    path.write_text(NAN_PLUGIN.format(layer=layer, pos=pos, value=value))
    return f"{path}:NanAt"


@pytest.fixture(scope="module")
def model():
    return Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"))


@pytest.fixture
def nan_weights(tmp_path):
    """stories260K with one NaN in layer 2's wq."""
    data = bytearray(shared_file("stories260K.bin").read_bytes())
    offset = 28 + 4 * (VOCAB * DIM + LAYERS * DIM + 2 * DIM * DIM + 5)
    data[offset : offset + 4] = struct.pack("<f", math.nan)
    path = tmp_path / "nan.bin"
    path.write_bytes(bytes(data))
    return path


def _fails(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---- generate ------------------------------------------------------------------------------------------
def test_nan_weights_stop_generate_naming_layer_and_position(nan_weights):
    line = _fails(["generate", "-c", str(nan_weights), "-z", str(shared_file("tok512.bin")), "-i", "Once", "-t", "0"])
    assert "non-finite" in line and "position 0" in line and "layer 2" in line, line


def test_nan_from_a_plugin_stops_generate(model, tmp_path):
    spec = _plugin(tmp_path, layer=1, pos=3)
    with pytest.raises(NonFiniteError, match=r"position 3.*layer 1"):
        model.generate("Once", steps=20, temperature=0.0, attention=spec)
    line = _fails(
        ["generate", "-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin")), "-a", spec]
    )
    assert "position 3" in line and "layer 1" in line
    assert "plugin NanAt" in line  # a file plugin is named by its class (it has no registry name)


def test_the_error_after_streamed_text_ends_that_line_first(tmp_path):
    # the text generated before the failure goes out without a newline; the error must not be glued
    # to it on the terminal ("Once upon aerror: ...")
    spec = _plugin(tmp_path, layer=1, pos=8)
    args = ["generate", "-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    result = CliRunner().invoke(main, [*args, "-a", spec, "-i", "Once", "-t", "0"])
    assert result.exit_code == 1 and "position 8" in result.stderr
    assert result.stdout.startswith("Once") and result.stdout.endswith("\n"), repr(result.stdout)


def test_inf_from_a_plugin_is_caught_too(model, tmp_path):
    with pytest.raises(NonFiniteError, match=r"position 5.*layer 4"):
        model.generate("Once", steps=20, temperature=0.0, attention=_plugin(tmp_path, 4, 5, "np.inf"))


def test_a_finite_run_is_unchanged(model):
    """The check costs nothing in results: the same ids as before (greedy, stories260K)."""
    out = model.generate("Once upon a time", steps=40, temperature=0.0)
    assert len(out.ids) > 10 and all(0 <= i < VOCAB for i in out.ids)


# ---- diff -------------------------------------------------------------------------------------------------
def test_diff_counts_nan_as_a_difference(model, tmp_path):
    text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
    clean = model.diff("causal", "causal", text=text)
    assert clean.exact and clean.summary["first_nonfinite"] is None
    report = model.diff("causal", _plugin(tmp_path, layer=1, pos=3), text=text)
    s = report.summary
    assert not report.exact
    assert s["first_diff"]["position"] == 3
    assert s["first_nonfinite"] == {"position": 3, "sequence": "prompt", "side": "B", "layer": 1}
    assert s["top1_agreement"] == pytest.approx(3 / report.n_positions)  # positions 0..2 agree, no later one
    assert math.isinf(s["max_abs_dlogit"]) and math.isinf(s["max_kl"])
    assert not s["ppl_ratio"] < 1.0 and not math.isfinite(s["ppl_b"])  # never better than the exact side
    assert np.isinf(report.layer_err[3, 1])
    assert "non-finite" in report.table() and "position 3" in report.table()


def test_diff_nan_in_the_logits_only(model, nan_weights):
    """Both sides share NaN weights: identical bits, still a difference (nothing was measured)."""
    bad = Model.load(nan_weights, tokenizer=shared_file("tok512.bin"))
    report = bad.diff("causal", "causal", text="Once upon a time")
    assert not report.exact
    assert report.summary["first_nonfinite"]["position"] == 0
    assert report.summary["first_nonfinite"]["layer"] == 2
    assert report.summary["top1_agreement"] == 0.0


def test_diff_expect_exact_fails_on_nan(tmp_path):
    spec = _plugin(tmp_path, layer=0, pos=1)
    args = ["diff", "causal", spec, "-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    result = CliRunner().invoke(main, [*args, "-i", "Once upon a time", "--expect-exact"])
    assert result.exit_code == 3, result.output
    assert "first non-finite" in result.output and "position 1" in result.output


# ---- blocks: a prompt and a diff run as blocks of positions report the same place -----------------------
def test_nan_inside_the_prompt_block_names_its_position(model, tmp_path):
    """Position 3 of "Once upon a time" (5 ids) runs inside the prompt's block, not as a decode step."""
    assert len(model.tokenize("Once upon a time")) > 4
    with pytest.raises(NonFiniteError, match=r"position 3.*layer 1"):
        model.generate("Once upon a time", steps=20, temperature=0.0, attention=_plugin(tmp_path, layer=1, pos=3))


def test_nan_weights_inside_the_prompt_block(nan_weights):
    bad = Model.load(nan_weights, tokenizer=shared_file("tok512.bin"))
    with pytest.raises(NonFiniteError, match=r"position 0.*layer 2"):
        bad.generate("Once upon a time", steps=20, temperature=0.0)


def test_diff_nonfinite_columns_are_the_same_with_and_without_blocks(model, tmp_path):
    text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
    spec = _plugin(tmp_path, layer=2, pos=6)
    with_blocks = model.diff("causal", spec, text=text, blocks=True)
    per_position = model.diff("causal", spec, text=text, blocks=False)
    assert with_blocks.summary["first_nonfinite"] == per_position.summary["first_nonfinite"]
    assert with_blocks.summary["first_nonfinite"]["layer"] == 2
    assert np.array_equal(with_blocks.nonfinite_b, per_position.nonfinite_b)
