"""A plugin that raises is reported in one line by every command (generate, bench, diff), as a
PluginError from Python; every built-in refuses positions out of order in the same way."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.attention.registry import create_plugin
from pyllama.cli import main
from pyllama.config import ModelConfig
from pyllama.engine import Pool
from pyllama.errors import PluginError, PositionError
from pyllama.model import Model

BROKEN = """
import numpy as np
from pyllama.attention.base import Attention


class Broken(Attention):
    description = "raises in {where}"

    def init(self, config, pool):
        if "{where}" == "init":
            raise RuntimeError("boom in init")

    def attend(self, layer, pos, q, k, v, out):
        if "{where}" == "attend" and pos == 2:
            raise ZeroDivisionError("boom in attend")
        out[:] = 0.0

    def memory_bytes(self):
        if "{where}" == "memory_bytes":
            raise KeyError("boom in memory_bytes")
        return 0
"""

WHERE = ["init", "attend", "memory_bytes"]


@pytest.fixture(scope="module")
def plugin_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("broken")
    files = {}
    for where in WHERE:
        path = folder / f"broken_{where}.py"
        path.write_text(BROKEN.format(where=where))
        files[where] = f"{path}:Broken"
    return files


@pytest.fixture(scope="module")
def model_args():
    return ["-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]


def _fails(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("command", ["generate", "bench", "diff"])
def test_a_raising_plugin_is_one_line(plugin_files, model_args, command, where):
    spec = plugin_files[where]
    if command == "diff":
        args = ["diff", "causal", spec, *model_args, "-i", "Once upon a time"]
    else:
        args = [command, *model_args, "-a", spec, "-n", "8"] + (["-i", "Once"] if command == "generate" else [])
    line = _fails(args)
    assert line.startswith("error: ") and f"boom in {where}" in line, line
    assert "Broken" in line or "broken" in line


@pytest.mark.parametrize("where", WHERE)
def test_python_api_raises_plugin_error(plugin_files, where):
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"))
    with pytest.raises(PluginError, match=f"boom in {where}"):
        model.generate("Once", steps=8, attention=plugin_files[where])


def test_an_error_of_the_text_callback_is_not_blamed_on_the_plugin():
    model = Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"))

    def on_text(text):
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        model.generate("Once", steps=8, on_text=on_text)


# ---- positions in order -------------------------------------------------------------------------------
SMALL = ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=16, seq_len=64)


@pytest.mark.parametrize("spec", ["causal", "sliding:8", "sink:2,6", "sink:2,6,shift", "kmeans", "tiered", "lattice"])
@pytest.mark.parametrize("jump", [2, 0, -1])
def test_every_builtin_refuses_positions_out_of_order(spec, jump):
    plugin = create_plugin(spec)
    pool = Pool(1)
    plugin._configure(SMALL, pool)
    plugin.init(SMALL, pool)
    rng = np.random.default_rng(0)
    q = rng.standard_normal(SMALL.q_dim).astype(np.float32)
    k = rng.standard_normal(SMALL.kv_dim).astype(np.float32)
    out = np.zeros(SMALL.q_dim, dtype=np.float32)
    for layer in range(SMALL.n_layers):
        plugin.attend(layer, 0, q, k, k, out)
    with pytest.raises(PositionError, match="in order"):  # a PyllamaError: one line, no traceback
        plugin.attend(0, jump, q, k, k, out)
    plugin.reset()
    plugin.attend(0, 0, q, k, k, out)  # after reset, position 0 again
