"""The KV-cache methods (h2o, tova, scissorhands, snapkv, pyramidkv, adakv, knorm, keydiff, expected,
random) driven alone on random queries, keys and values, against the numpy references of
kv_methods_reference.py: the positions held after every step are the reference's (a difference only at
a score the reference flags within 1e-5 of the boundary, counted), and the output is the shared
routine's bits over the rows attended. Also: blocks, thread counts, ``every``, ``start_from``, the
ledger and the knobs' refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from kv_methods_drive import attach, check_layers, drive
from kv_methods_reference import Knobs

from pyllama.attention.base import UNBOUNDED
from pyllama.attention.registry import create_plugin
from pyllama.config import ModelConfig
from pyllama.errors import PluginError, PositionError

CONFIG = ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=16, seq_len=96)
T, EVENT = 60, 40


def random_qkv(seed: int, T: int = T, config: ModelConfig = CONFIG):
    rng = np.random.default_rng(seed)
    L = config.n_layers
    q = (rng.standard_normal((T, L, config.q_dim)) * 1.5).astype(np.float32)
    k = (rng.standard_normal((T, L, config.kv_dim)) * 1.5).astype(np.float32)
    v = rng.standard_normal((T, L, config.kv_dim)).astype(np.float32)
    q_pre = rng.standard_normal((T, L, config.q_dim)).astype(np.float32)
    return q, k, v, q_pre


CASES = [
    ("h2o:ratio=0.5,window=3,sinks=1", "h2o", Knobs(ratio=0.5, window=3, sinks=1), {}),
    ("h2o:capacity=12", "h2o", Knobs(capacity=12, window="half"), {}),
    ("tova:ratio=0.6,window=2", "tova", Knobs(ratio=0.6, window=2), {}),
    ("tova:capacity=9,sinks=2", "tova", Knobs(capacity=9, sinks=2), {}),
    (
        "scissorhands:ratio=0.5,window=3,history=4,sinks=2",
        "scissorhands",
        Knobs(ratio=0.5, window=3, sinks=2),
        {"history": 4},
    ),
    ("scissorhands:capacity=10,window=2", "scissorhands", Knobs(capacity=10, window=2), {"history": 32}),
    ("knorm:ratio=0.5,sinks=1", "knorm", Knobs(ratio=0.5, sinks=1), {}),
    ("knorm:capacity=14,window=3,every=5", "knorm", Knobs(capacity=14, window=3, every=5), {}),
    ("keydiff:ratio=0.4,window=2", "keydiff", Knobs(ratio=0.4, window=2), {}),
    ("keydiff:ratio=0.3,sinks=2,every=4", "keydiff", Knobs(ratio=0.3, sinks=2, every=4), {}),
    ("random:ratio=0.5,seed=9,window=2", "random", Knobs(ratio=0.5, window=2), {"seed": 9}),
    ("random:capacity=12,seed=3,every=6", "random", Knobs(capacity=12, every=6), {"seed": 3}),
    ("snapkv:ratio=0.5,window=4", "snapkv", Knobs(ratio=0.5, window=4), {}),
    ("snapkv:ratio=0.6,window=3,every=5", "snapkv", Knobs(ratio=0.6, window=3, every=5), {}),
    (
        "snapkv:capacity=16,window=4,kernel=3,pool=max,sinks=1",
        "snapkv",
        Knobs(capacity=16, window=4, sinks=1),
        {"kernel": 3, "pool": "max"},
    ),
    ("snapkv:capacity=16,window=5,kernel=1", "snapkv", Knobs(capacity=16, window=5), {"kernel": 1}),
    ("expected:ratio=0.5,future=16", "expected", Knobs(ratio=0.5, sinks=4), {"future": 16}),
    (
        "expected:capacity=15,sinks=2,window=3,every=6,epsilon=0.01",
        "expected",
        Knobs(capacity=15, sinks=2, window=3, every=6),
        {"epsilon": 0.01, "future": 512},
    ),
    ("expected:ratio=0.5,sinks=0,covariance=false", "expected", Knobs(ratio=0.5), {"covariance": False}),
    ("adakv:ratio=0.5,window=4", "adakv", Knobs(ratio=0.5, window=4), {"scorer": "snapkv"}),
    (
        "adakv:scorer=knorm,ratio=0.5,alpha=0.5,every=5",
        "adakv",
        Knobs(ratio=0.5, every=5),
        {"scorer": "knorm", "alpha": 0.5},
    ),
    ("adakv:scorer=keydiff,capacity=14,window=2", "adakv", Knobs(capacity=14, window=2), {"scorer": "keydiff"}),
    (
        "adakv:scorer=expected,ratio=0.6,future=32",
        "adakv",
        Knobs(ratio=0.6, sinks=4),
        {"scorer": "expected", "expected": {"future": 32}},
    ),
    (
        "adakv:scorer=random,ratio=0.5,seed=5,alpha=0",
        "adakv",
        Knobs(ratio=0.5),
        {"scorer": "random", "seed": 5, "alpha": 0.0},
    ),
    ("pyramidkv:ratio=0.5,window=4", "pyramidkv", Knobs(ratio=0.5, window=4), {}),
    ("pyramidkv:capacity=20,window=4,beta=4,every=7", "pyramidkv", Knobs(capacity=20, window=4, every=7), {"beta": 4}),
]


def check_against_reference(spec, method, knobs, extra, seed=0, config=CONFIG):
    q, k, v, q_pre = random_qkv(seed, config=config)
    plugin = attach(create_plugin(spec), config)
    run = drive(plugin, q, k, v, q_pre, event=EVENT if plugin.compresses_at_event else None)
    return check_layers(run.held, run.out, q, k, v, q_pre, config, (method, knobs, extra), EVENT, "run.c")


@pytest.mark.parametrize("spec, method, knobs, extra", CASES, ids=[c[0] for c in CASES])
def test_held_positions_and_outputs_follow_the_reference(spec, method, knobs, extra):
    agreement = check_against_reference(spec, method, knobs, extra)
    # these seeds put no score within 1e-5 of a boundary: every step of every layer is the reference's
    assert agreement.steps == T * CONFIG.n_layers and not agreement.parted_near, agreement


def test_expected_turns_the_pairs_of_the_model_s_layout():
    # the same check on a NEOX model (pairs i, i + n_rot / 2) that rotates half of each head (n_rot 4 of 8)
    neox = dataclasses.replace(CONFIG, rope_style="neox", n_rot=4)
    agreement = check_against_reference(
        "expected:ratio=0.5,sinks=1,future=40", "expected", Knobs(ratio=0.5, sinks=1), {"future": 40}, config=neox
    )
    assert agreement.steps == T * CONFIG.n_layers and not agreement.parted_near, agreement


# ---- blocks, threads, compress once branch many -------------------------------------------------------
SPECS = [
    "h2o:ratio=0.5,window=3,sinks=1",
    "tova:capacity=9,sinks=2",
    "scissorhands:ratio=0.5,window=3,history=4",
    "snapkv:ratio=0.6,window=3,every=5",
    "pyramidkv:capacity=20,window=4,beta=4,every=7",
    "adakv:ratio=0.5,window=4,every=9",
    "adakv:scorer=expected,ratio=0.6,future=32",
    "knorm:capacity=14,window=3,every=5",
    "keydiff:ratio=0.3,sinks=2,every=4",
    "expected:capacity=15,sinks=2,window=3,every=6,epsilon=0.01",
    "random:capacity=12,seed=3,every=6",
]
EVENT_SPECS = [s for s in SPECS if not s.startswith(("h2o", "tova", "scissorhands"))]


def final_held(plugin) -> list:
    return [[h.tolist() for h in plugin.held_positions(layer)] for layer in range(CONFIG.n_layers)]


@pytest.mark.parametrize("spec", SPECS)
def test_blocks_and_threads_give_the_bits_of_one_position_at_a_time(spec):
    from pyllama.kernels.threads import set_serial_below

    q, k, v, q_pre = random_qkv(1)
    one = attach(create_plugin(spec), CONFIG)
    event = EVENT if one.compresses_at_event else None
    single = drive(one, q, k, v, q_pre, event=event)
    # 4 threads over 2 KV heads: a step splits each KV head's query heads in two (group_parts)
    for block, threads in ((7, 1), (16, 1), (1, 2), (5, 2), (1, 4)):
        plugin = attach(create_plugin(spec), CONFIG, threads)
        previous = set_serial_below(0)  # every loop on the team, however little work
        try:
            run = drive(plugin, q, k, v, q_pre, event=event, block=block if block > 1 else 0, record=False)
        finally:
            set_serial_below(previous)
        np.testing.assert_array_equal(run.out, single.out, err_msg=f"{spec} block {block} threads {threads}")
        assert final_held(plugin) == final_held(one)


def test_causal_steps_give_the_same_bits_for_any_split_of_a_kv_heads_query_heads():
    from pyllama.kernels.threads import set_serial_below

    q, k, v, _ = random_qkv(3)
    single = drive(attach(create_plugin("causal"), CONFIG), q, k, v, event=None, record=False)
    for threads in (2, 3, 4):  # 2 KV heads: teams of 3 and 4 split each one's two query heads
        previous = set_serial_below(0)
        try:
            run = drive(attach(create_plugin("causal"), CONFIG, threads), q, k, v, event=None, record=False)
        finally:
            set_serial_below(previous)
        np.testing.assert_array_equal(run.out, single.out, err_msg=f"threads {threads}")


@pytest.mark.parametrize("spec", EVENT_SPECS)
def test_start_from_a_recorded_causal_run_gives_the_bits_of_running_from_position_0(spec):
    q, k, v, q_pre = random_qkv(2)
    whole = attach(create_plugin(spec), CONFIG)
    from_zero = drive(whole, q, k, v, q_pre, event=EVENT, block=8, record=False)
    causal = attach(create_plugin("causal"), CONFIG)
    exact = drive(causal, q, k, v, event=None, record=False)
    np.testing.assert_array_equal(from_zero.out[: EVENT + 1], exact.out[: EVENT + 1])  # exact until the event
    branch = attach(create_plugin(spec), CONFIG)
    for layer in range(CONFIG.n_layers):
        branch.start_from(
            layer, k[: EVENT + 1, layer], v[: EVENT + 1, layer], q[: EVENT + 1, layer], q_pre[: EVENT + 1, layer]
        )
    branch.compress(EVENT)
    rest = drive(branch, q, k, v, q_pre, block=8, record=False, first=EVENT + 1)
    np.testing.assert_array_equal(rest.out[EVENT + 1 :], from_zero.out[EVENT + 1 :])
    assert final_held(branch) == final_held(whole) and branch.memory_bytes() == whole.memory_bytes()


def extra_bytes(spec: str, t: int) -> int:
    """What a method holds besides its rows after position t (docs: its docstring's State line)."""
    L, hd, H = CONFIG.n_layers, CONFIG.head_dim, CONFIG.n_heads
    if spec.startswith(("snapkv", "pyramidkv")) or spec.startswith("adakv") and "scorer=" not in spec:
        window = int(spec.split("window=")[1].split(",")[0])
        return L * min(window, t + 1) * CONFIG.q_dim * 4  # the observation queries
    if spec.startswith("expected") or "scorer=expected" in spec:
        return L * H * 8 * (hd + hd * (hd + 1) // 2)  # the sums of the queries and of their products
    return 0


@pytest.mark.parametrize("spec", SPECS)
def test_the_ledger_counts_the_rows_held_and_the_method_s_state(spec):
    q, k, v, q_pre = random_qkv(3)
    plugin = attach(create_plugin(spec), CONFIG)
    run = drive(plugin, q, k, v, q_pre, event=EVENT if plugin.compresses_at_event else None)
    per_row = 2 * CONFIG.head_dim * 4 + (8 if spec.startswith(("h2o", "scissorhands")) else 0)
    for t in range(T):
        rows = sum(len(h) for layer in run.held[t] for h in layer)
        assert run.memory[t] == rows * per_row + extra_bytes(spec, t), (spec, t)
    assert run.memory[-1] < run.memory[EVENT - 1] or not plugin.compresses_at_event


# ---- knobs, events, the wrapper -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, says",
    [
        ("h2o:ratio=1", r"^h2o: ratio=1 is outside \[0, 1\)"),
        ("snapkv:ratio=1.5", r"^snapkv: ratio=1.5 is outside \[0, 1\)"),
        ("knorm:ratio=-0.1", r"^knorm: ratio=-0.1 is below its minimum 0"),
        ("tova:ratio=0.3,capacity=64", r"^tova: ratio=0.3 and capacity=64 together"),
        ("snapkv:capacity=32", r"^snapkv: capacity=32 is smaller than window=64 \+ sinks=0"),
        ("scissorhands:capacity=20,window=16,sinks=8", r"^scissorhands: capacity=20 is smaller than window=16"),
        ("expected:capacity=3", r"^expected: capacity=3 is smaller than window=0 \+ sinks=4"),
        ("adakv:scorer=h2o", r"^adakv: scorer='h2o' is not one of snapkv, knorm, keydiff, expected, random"),
        ("adakv:scorer=knorm,kernel=7", r"^adakv: kernel=7 is not a knob of scorer=knorm"),
        ("adakv:scorer=snapkv,capacity=10", r"^adakv:scorer=snapkv: capacity=10 is smaller than window=64"),
        ("adakv:alpha=1.5", r"^adakv: alpha=1.5 is above its maximum 1"),
        ("snapkv:kernel=4", r"^snapkv: kernel=4 is even"),
        ("pyramidkv:window=0", r"^pyramidkv: window=0 leaves no observation query"),
        ("h2o:window=most", r"^h2o: window='most' is neither 'half' nor a number"),
        ("scissorhands:history=65", r"^scissorhands: history=65 is above its maximum 64"),
    ],
)
def test_bad_knob_combinations_are_refused_in_one_line_naming_the_method_and_the_knob(spec, says):
    with pytest.raises(PluginError, match=says) as caught:
        create_plugin(spec)
    assert "\n" not in str(caught.value)


def test_adakv_wraps_its_scorer_with_the_scorer_s_defaults():
    plugin = create_plugin("adakv:scorer=expected")
    assert plugin.wants_pre_rope_query and plugin.compresses_at_event
    assert (plugin.inner.sinks, plugin.inner.window, plugin.inner.future) == (4, 0, 512)
    assert not create_plugin("adakv").wants_pre_rope_query and create_plugin("adakv").inner.window == 64
    assert create_plugin("adakv:scorer=random,seed=4,window=2").inner.seed == 4


def test_adakv_heads_hold_different_numbers_of_rows_within_the_layer_s_total():
    q, k, v, q_pre = random_qkv(4)
    k[:, :, : CONFIG.head_dim] *= 3  # KV head 0's keys are longer: knorm ranks them lower
    plugin = attach(create_plugin("adakv:scorer=knorm,ratio=0.5"), CONFIG)
    drive(plugin, q, k, v, q_pre, event=EVENT, block=16, record=False)
    for layer in range(CONFIG.n_layers):
        sizes = plugin.rows_held_per_head(layer)
        after_event = T - EVENT - 1
        assert sum(sizes) == 2 * ((EVENT + 1) - (EVENT + 1) // 2) + 2 * after_event  # the per-head targets' sum
        assert sizes[0] < sizes[1] and sizes[0] - after_event >= int(0.2 * ((EVENT + 1) - (EVENT + 1) // 2))
        assert [len(h) for h in plugin.held_positions(layer)] == sizes


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_adakv_with_one_kv_head_is_its_scorer(ratio):
    """AdaKV shares a layer's budget among its KV heads; with one (Gemma 3 270M) there is nothing to
    share, so it holds what snapkv holds and attends to the same bits (the Gemma 3 board's rows agree)."""
    config = ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=16, seq_len=96)
    q, k, v, q_pre = random_qkv(5, config=config)
    runs = []
    for spec in (f"adakv:ratio={ratio},window=4", f"snapkv:ratio={ratio},window=4"):
        plugin = attach(create_plugin(spec), config)
        runs.append(drive(plugin, q, k, v, q_pre, event=EVENT))
    ada, snap = ([[[list(h) for h in layer] for layer in step] for step in run.held] for run in runs)
    assert ada == snap and np.array_equal(runs[0].out, runs[1].out)
    assert len(ada[-1][0][0]) < T  # the event removed rows


@pytest.mark.parametrize("spec", EVENT_SPECS)
def test_without_an_event_a_compressing_method_attends_causally_and_never_compresses(spec):
    q, k, v, q_pre = random_qkv(5)
    plugin = attach(create_plugin(spec), CONFIG)
    run = drive(plugin, q, k, v, q_pre, event=None, block=9, record=False)
    exact = drive(attach(create_plugin("causal"), CONFIG), q, k, v, record=False)
    np.testing.assert_array_equal(run.out, exact.out)
    assert final_held(plugin) == [[list(range(T))] * CONFIG.n_kv_heads] * CONFIG.n_layers


def test_compress_comes_after_every_layer_attended_the_position():
    q, k, v, q_pre = random_qkv(6)
    plugin = attach(create_plugin("knorm"), CONFIG)
    drive(plugin, q[:10], k[:10], v[:10], q_pre[:10], record=False)
    with pytest.raises(PositionError, match=r"knorm: compress\(5\) but layer 0 has attended 10 positions"):
        plugin.compress(5)
    plugin.reset()
    assert final_held(plugin) == [[[]] * CONFIG.n_kv_heads] * CONFIG.n_layers
    with pytest.raises(PositionError, match=r"knorm: compress\(5\) but no layer has attended position 5"):
        plugin.compress(5)  # a layer that attended nothing is one the method does not govern; not all of them
    with pytest.raises(PluginError, match="snapkv: start_from needs the queries"):
        attach(create_plugin("snapkv"), CONFIG).start_from(0, k[:5, 0], v[:5, 0])


def test_a_step_method_with_a_capacity_runs_past_the_context_in_flat_memory():
    plugin = attach(create_plugin("h2o:capacity=8"), CONFIG)
    assert plugin.max_positions == UNBOUNDED
    q, k, v, q_pre = random_qkv(7, T=CONFIG.seq_len + 40)
    run = drive(plugin, q, k, v, q_pre)
    assert run.memory[-1] == run.memory[20] == CONFIG.n_layers * CONFIG.n_kv_heads * 8 * (2 * CONFIG.head_dim * 4 + 8)
