"""The contract's parts beyond attend: the compression event, queries before RoPE, held positions.

A Python plugin that records its calls shows where the driver puts the compression event (after the
context's last position, its pass ending there, before any call of the next position), that a
plugin asking for queries before RoPE gets the rows the engine rotates (rotating them by the
position gives the engine's queries bit for bit), and that the contract checks the new parts.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyllama.attention.base import Attention
from pyllama.attention.registry import check_plugin_class
from pyllama.errors import PluginError
from pyllama.model import Model
from pyllama.plugins.causal import Causal


class Recorder(Attention):
    """causal (a native plugin driven from Python), recording every call in order."""

    description = "causal, recording attend and compress calls"

    def __init__(self):
        self.inner = Causal()
        self.calls: list[tuple[str, int, int]] = []
        self.pre: dict[int, np.ndarray] = {}

    def init(self, config, pool):
        self.inner._configure(config, pool)
        self.inner.init(config, pool)

    def reset(self):
        self.inner.reset()
        self.calls.clear()

    def memory_bytes(self):
        return self.inner.memory_bytes()

    def attend(self, layer, pos, q, k, v, out):
        self.calls.append(("attend", layer, pos))
        if self.query_before_rope is not None and layer == 0:
            self.pre[pos] = (np.array(self.query_before_rope), np.array(q))
        self.inner.attend(layer, pos, q, k, v, out)

    def compress(self, pos):
        self.calls.append(("compress", -1, pos))


class PreRope(Recorder):
    description = "causal, recording its queries before RoPE"
    wants_pre_rope_query = True


@pytest.fixture(scope="module")
def model(stories260k, tok512):
    return Model.load(stories260k, tokenizer=tok512)


def _compress_calls(plugin):
    return [(i, pos) for i, (what, _, pos) in enumerate(plugin.calls) if what == "compress"]


@pytest.mark.parametrize("where", ["context", 4, 13, "none"])
def test_generate_calls_compress_once_after_the_event_position(model, where):
    plugin = Recorder()
    prompt = "Once upon a time, there was a little girl"  # 11 tokens with BOS
    gen = model.generate(prompt, steps=20, temperature=0.0, attention=plugin, compress_at=where)
    n_prompt = len(gen.prompt_ids)
    expect = {"context": n_prompt - 1, 4: 4, 13: 13, "none": None}[where]
    calls = _compress_calls(plugin)
    if expect is None:
        assert calls == []
        return
    assert [pos for _, pos in calls] == [expect]
    at = calls[0][0]
    before, after = plugin.calls[:at], plugin.calls[at + 1 :]
    # every layer has attended the event's position before it, and nothing past it has been attended yet
    assert {(layer, pos) for _, layer, pos in before} >= {(li, expect) for li in range(model.config.n_layers)}
    assert max(pos for _, _, pos in before) == expect
    assert min(pos for _, _, pos in after) == expect + 1


def test_the_event_changes_nothing_for_a_plugin_that_ignores_it(model):
    ids = [model.generate("Once upon a time", steps=40, temperature=0.0, compress_at=w).ids for w in (3, "none")]
    assert ids[0] == ids[1]


def test_a_plugin_gets_its_queries_before_rope(model):
    plugin = PreRope()
    model.generate("Once upon a time, there was", steps=12, temperature=0.0, attention=plugin)
    assert sorted(plugin.pre) == list(range(12))
    for pos, (pre, q) in plugin.pre.items():
        rotated = pre.copy()
        model.config.rerotate(rotated, pos)  # RoPE of position pos: the engine's own rotation
        assert np.array_equal(rotated, q), pos
    assert Recorder().query_before_rope is None  # one that does not ask gets nothing


def test_the_contract_checks_the_new_parts():
    class BadHolds(Recorder):
        holds = "some"

    class BadCompress(Recorder):
        def compress(self):
            pass

    with pytest.raises(PluginError, match="holds"):
        check_plugin_class(BadHolds, "bad")
    with pytest.raises(PluginError, match=r"compress\(self, pos\)"):
        check_plugin_class(BadCompress, "bad")
    assert Recorder().held_positions(0) is None


class Halving(Recorder):
    """causal whose ledger says half from the compression event on (a stand-in for a compressing method)."""

    description = "causal, reporting half its bytes after the compression event"
    compresses_at_event = True

    def __init__(self):
        super().__init__()
        self.compressed = False

    def reset(self):
        super().reset()
        self.compressed = False

    def compress(self, pos):
        super().compress(pos)
        self.compressed = True

    def memory_bytes(self):
        return self.inner.memory_bytes() // (2 if self.compressed else 1)


@pytest.fixture(scope="module")
def smollm2():
    from conftest import shared_file

    return Model.load(shared_file("SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.mark.parametrize("blocks", [True, False])
def test_a_diff_puts_the_event_after_the_probes_context(smollm2, blocks):
    plugin = Halving()
    r = smollm2.diff("causal", plugin, probe="passkey:length=300", blocks=blocks, cache=False)
    seg = r.segments[0]
    tokens = smollm2.tokenizer.encode("What is the pass key?", bos=False, eos=False)
    ids = r.token[: seg.compared].tolist()
    question = next(i for i in range(len(ids)) if ids[i : i + 3] == tokens[:3])  # the question's first tokens
    assert seg.event == question - 1
    calls = _compress_calls(plugin)
    assert [pos for _, pos in calls] == [seg.event]
    before = plugin.calls[: calls[0][0]]
    assert max(pos for _, _, pos in before) == seg.event  # the block ended at the event
    # the ledger: the event's row is taken after compress, the rows before it are not
    assert r.mem_b[seg.event] * 2 in (r.mem_a[seg.event], r.mem_a[seg.event] - 1)
    assert r.mem_b[seg.event - 1] == r.mem_a[seg.event - 1]
    assert r.exact  # the logits are causal's: only the ledger halved


def test_no_event_is_said_for_a_method_that_needs_one(smollm2):
    r = smollm2.diff("causal", Halving(), probe="passkey:length=200", compress_at="none", cache=False)
    assert all(s.event == -1 for s in r.segments)
    assert any("compresses at the compression event" in n for n in r.notes)
    r = smollm2.diff("causal", Halving(), probe="passkey:length=200", compress_at=50, cache=False)
    assert [s.event for s in r.segments] == [50]
