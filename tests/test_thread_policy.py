"""The thread policy (pyllama/kernels/threads.pyx): the serial threshold and the decode controller.

The controller picks 1 or n threads per decode token from measured token times. It must never change
a bit (every logit equal to a fixed 1-thread run while it switches, with ``parallel_always`` forcing
real parallel regions), its cap must reach every thread decision and never outlive the token, and its
choices, driven on a simulated clock, must come within a few percent of the better team per token.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pyllama.attention.base import Attention
from pyllama.engine.core import Engine
from pyllama.kernels.thread_simulation import simulate_blocks, simulate_decode, simulate_sized_blocks
from pyllama.kernels.threads import (
    decode_policy,
    decode_stats,
    forget_teams,
    serial_below,
    set_decode_policy,
    team_for,
)
from pyllama.model import Model
from pyllama.plugins.causal import Causal
from pyllama.sampler import Sampler

PROMPT = np.array([1, 403, 407], dtype=np.int32)
BIG = 1 << 40  # more work than any threshold: team_for then shows the cap alone


@pytest.fixture(autouse=True)
def _fresh_memory():
    """Each test's models start afresh: a model loaded where an earlier test's was shares its key."""
    forget_teams()


@pytest.fixture
def policy():
    """Set the decode policy for one test; the previous one comes back afterwards."""
    previous = decode_policy()
    yield set_decode_policy
    set_decode_policy(previous)


def _decode_logits(engine, steps: int, seed: int) -> tuple[list[np.ndarray], list[int]]:
    """Every position's logits (copied in on_token) and the sampled ids of one generation."""
    logits: list[np.ndarray] = []
    out = np.zeros(steps, dtype=np.int32)
    n, *_ = engine.generate_into(
        PROMPT, steps, Sampler(512, 1.0, 0.9, seed), out, lambda t: logits.append(np.array(engine.logits_view))
    )
    return logits, out[:n].tolist()


@pytest.mark.parametrize("name", ["alternate", "adaptive"])
def test_the_controller_never_changes_a_logit(stories260k, tok512, parallel_always, policy, name):
    model = Model.load(stories260k, tokenizer=tok512, threads=2)
    policy("fixed")
    want_logits, want_ids = _decode_logits(model.engine("causal", threads=1), 120, seed=5)
    policy(name)
    got_logits, got_ids = _decode_logits(model.engine("causal", threads=2), 120, seed=5)
    stats = decode_stats()
    assert stats["policy"] == name and stats["threads"] == 2
    if name == "alternate":  # both teams really ran, in turn
        assert stats["tokens_1"] > 50 and stats["tokens_n"] > 50 and stats["switches"] > 100
    assert got_ids == want_ids
    assert len(got_logits) == len(want_logits)
    for got, want in zip(got_logits, want_logits, strict=True):
        assert np.array_equal(got, want)  # bit for bit, not close


def test_the_fast_path_samples_the_same_ids_while_teams_alternate(stories260k, tok512, parallel_always, policy):
    # no callback and a native plugin: the loop runs without the GIL, as in generate and bench
    model = Model.load(stories260k, tokenizer=tok512, threads=2)
    runs = {}
    for name, threads in (("fixed", 1), ("alternate", 2)):
        policy(name)
        runs[name] = model.generate([1], steps=200, temperature=1.0, seed=11, threads=threads, ignore_eos=True).ids
    assert decode_stats()["tokens_1"] > 0 and decode_stats()["tokens_n"] > 0
    assert runs["alternate"] == runs["fixed"]


class TeamRecorder(Attention):
    """Exact causal attention that records, at layer 0, the team a parallel loop would get now."""

    def __init__(self, fail_at: int = -1) -> None:
        self.inner = Causal()
        self.fail_at = fail_at
        self.teams: list[tuple[int, int]] = []

    def init(self, config, pool):
        self.inner._configure(config, pool)
        self.inner.init(config, pool)

    def reset(self):
        self.inner.reset()
        self.teams.clear()

    def attend(self, layer, pos, q, k, v, out):
        if layer == 0:
            self.teams.append((pos, team_for(2, BIG)))
            if pos == self.fail_at:
                raise RuntimeError(f"plugin failure at {pos}")
        self.inner.attend(layer, pos, q, k, v, out)

    def memory_bytes(self):
        return self.inner.memory_bytes()


def test_the_cap_reaches_plugins_during_decode_only(stories260k, policy, parallel_always):
    model = Model.load(stories260k, threads=2)
    recorder = TeamRecorder()
    engine = model.engine(recorder)
    policy("alternate")
    out = np.zeros(64, dtype=np.int32)
    engine.generate_into(PROMPT, 40, Sampler(512, 0.0, 0.9, 1), out)
    prompt_teams = [team for pos, team in recorder.teams if pos < len(PROMPT)]
    decode_teams = [team for pos, team in recorder.teams if pos >= len(PROMPT)]
    assert prompt_teams == [2, 2, 2]  # the prompt's positions are not the controller's
    assert decode_teams[:6] == [2, 1, 2, 1, 2, 1]  # the first token runs on the caller's team
    assert team_for(2, BIG) == 2  # nothing left behind


def test_a_failing_token_leaves_no_cap_behind(stories260k, policy):
    model = Model.load(stories260k, threads=2)
    engine = model.engine(TeamRecorder(fail_at=7))
    policy("alternate")
    out = np.zeros(64, dtype=np.int32)
    with pytest.raises(Exception, match="plugin failure at 7"):
        engine.generate_into(PROMPT, 40, Sampler(512, 0.0, 0.9, 1), out)
    assert (7, 1) in engine.attention.teams or (7, 2) in engine.attention.teams
    assert team_for(2, BIG) == 2


def test_parallel_always_makes_every_loop_parallel(parallel_always):
    assert team_for(2, 1) == 2 and team_for(2, 0) == 2  # the tests' fixture: every loop parallel


def test_the_default_threshold():
    assert serial_below() == (1 << 15) + 1
    assert team_for(2, 512 * 64) == 1  # stories260K's classifier, its largest product
    assert team_for(2, 8 * 8 * 512) == 1  # stories260K's attention at its 512-position context (8 heads x 8)
    assert team_for(2, 288 * 288) == 2  # the stories15M shape's smallest products
    assert team_for(2, 6 * 48 * 114) == 2  # its attention from 114 cached rows (2^16 left it serial to 227)
    assert team_for(1, BIG) == 1 and team_for(0, BIG) == 1


# The controller on a simulated clock: token i costs seconds_1[i] on one thread, seconds_n[i] on two.
# The bound is what the policy promises: the better team within ~2% on 256 tokens (a probe that loses
# stops at its first token, and the gap grows past the run), and across a change of load, better than
# either.


def _sim(seconds_1, seconds_n, policy="adaptive"):
    s1, sn = np.asarray(seconds_1, dtype=float), np.asarray(seconds_n, dtype=float)
    return simulate_decode(2, s1.tolist(), sn.tolist(), policy), s1, sn


@pytest.mark.parametrize(
    "one, two, settled",
    [
        (9.5e-3, 5.2e-3, 2),  # stories15M shape, idle: two threads 1.8x faster
        (47e-3, 28e-3, 2),  # stories110M shape, idle
        (9.0e-3, 12.5e-3, 1),  # 15M shape beside a busy loop: 0.72x
        (43e-3, 80e-3, 1),  # 110M shape beside a busy loop: 0.54x
        (0.3e-3, 0.7e-3, 1),  # stories260K, loaded
    ],
)
def test_steady_load_settles_on_the_faster_team(one, two, settled):
    stats, s1, sn = _sim(np.full(256, one), np.full(256, two))
    assert stats["settled"] == settled
    assert stats["seconds"] <= 1.02 * min(s1.sum(), sn.sum())
    assert stats["tokens_1"] + stats["tokens_n"] == 256


def test_equal_teams_do_not_flap():
    # both teams serial (stories260K below the threshold): times equal, no switch, little probing
    stats, _, _ = _sim(np.full(5000, 0.3e-3), np.full(5000, 0.3e-3))
    assert stats["switches"] == 0 and stats["probes"] < 10


@pytest.mark.parametrize("arrives", [True, False])
def test_a_change_of_load_is_followed(arrives):
    idle, loaded = np.full(1000, 5e-3), np.full(1000, 14e-3)
    two = np.r_[idle, loaded] if arrives else np.r_[loaded, idle]
    stats, s1, sn = _sim(np.full(2000, 9e-3), two)
    assert stats["settled"] == (1 if arrives else 2)
    assert stats["seconds"] < 0.85 * min(s1.sum(), sn.sum())  # better than either team throughout
    # load arriving is seen at once (the settled team's time jumps); load leaving at the next probe,
    # up to 1 / PROBE_BUDGET probe-losses later
    assert stats["seconds"] <= (1.03 if arrives else 1.06) * np.minimum(s1, sn).sum()


def test_stalls_on_the_team_count_by_their_mean():
    # beside a busy loop a two-thread token is fast or waits for a descheduled worker: 1 in 3 stalls
    rng = np.random.default_rng(0)
    two = np.where(rng.random(2000) < 1 / 3, 25e-3, 4e-3)  # mean 11 ms against 9 ms on one thread
    stats, s1, _ = _sim(np.full(2000, 9e-3), two)
    assert stats["settled"] == 1
    assert stats["seconds"] <= 1.03 * s1.sum()


def test_fixed_and_alternate_policies():
    fixed, _, _ = _sim(np.full(50, 1e-3), np.full(50, 9e-3), "fixed")
    assert fixed["tokens_n"] == 50 and fixed["probes"] == 0
    alternate, _, _ = _sim(np.full(50, 1e-3), np.full(50, 9e-3), "alternate")
    assert alternate["tokens_1"] == 25 and alternate["tokens_n"] == 25


def test_policy_names_are_checked(policy):
    with pytest.raises(ValueError, match="adaptive, alternate"):
        set_decode_policy("passive")


def test_the_environment_sets_the_policy():
    env = dict(os.environ, PYLLAMA_DECODE_POLICY="fixed")
    code = "from pyllama.kernels.threads import decode_policy; print(decode_policy())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "fixed"


def test_a_probe_onto_a_stalled_team_stops_after_one_token():
    # heavy load: a team token waits 200 ms for a descheduled worker, against 9 ms on one thread
    stats, s1, _ = _sim(np.full(256, 9e-3), np.full(256, 0.2))
    assert stats["settled"] == 1 and stats["tokens_n"] == 1 and stats["probes"] == 1
    assert stats["seconds"] <= s1.sum() + 0.2


def test_the_next_decode_of_the_same_model_starts_from_the_choice():
    one, stalled = [9e-3] * 256, [0.2] * 256
    first = simulate_decode(2, one, stalled, key=0x1000, start=100.0)
    again = simulate_decode(2, one, stalled, key=0x1000, start=100.0 + first["seconds"] + 0.5)
    other = simulate_decode(2, one, stalled, key=0x2000, start=100.0 + first["seconds"] + 0.5)
    later = simulate_decode(2, one, stalled, key=0x1000, start=400.0)  # too long ago: probes afresh
    assert first["tokens_n"] == 1 and again["tokens_n"] == 0 and again["probes"] == 0
    assert other["tokens_n"] == 1 and later["tokens_n"] == 1


def test_a_losing_probe_costs_one_token():
    # idle 15M shape: two threads faster. A fresh decode times 2 tokens on one thread, probes the team
    # (and settles there); every later probe of one thread stops at its first, slower, token
    stats, _, _ = _sim(np.full(4000, 7.3e-3), np.full(4000, 4.8e-3))
    assert stats["settled"] == 2 and stats["switches"] == 1 and stats["probes"] > 3
    assert stats["tokens_1"] == 2 + (stats["probes"] - 1)


def test_a_team_that_stalls_at_random_does_not_win_on_lucky_tokens():
    # beside a busy loop, 7 in 10 two-thread tokens are fast (6 ms against 7.6 ms on one thread) and
    # the others wait for a descheduled worker (40 ms): the team's mean is twice one thread's, however
    # good a run of fast tokens a probe sees (a probe that settled on two lucky ones cost up to 4.6%)
    slow = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        one = 7.6e-3 * rng.lognormal(0, 0.08, 256)
        two = np.where(rng.random(256) < 0.3, 40e-3, 6e-3) * rng.lognormal(0, 0.05, 256)
        stats, s1, _ = _sim(one, two)
        if stats["seconds"] > 1.03 * s1.sum():
            slow.append((seed, stats["seconds"] / s1.sum()))
    assert slow == []


def test_the_probe_schedule_counts_decode_time_only():
    # a probe onto a stalled team lost 191 ms: at 0.5% of decode time, the next probe is due after
    # 38 s of decoding, not 38 s of the clock; a decode of the same model 30 s later (the others ran
    # in between) resumes that wait and probes nothing
    one, stalled = [9e-3] * 256, [0.2] * 256
    first = simulate_decode(2, one, stalled, key=0x3000, start=500.0)
    again = simulate_decode(2, one, stalled, key=0x3000, start=500.0 + first["seconds"] + 30.0)
    assert first["probes"] == 1 and again["probes"] == 0 and again["tokens_n"] == 0


# ---- the block controller: the same policy on blocks of positions (prompts, Model.logits, diffs) ----


def _block_logits(model: Model, plugin: Attention, threads: int, tokens: np.ndarray) -> np.ndarray:
    engine = Engine(model.config, model.weights, plugin, threads, max_block=8)
    out = np.zeros((tokens.shape[0], model.config.vocab_size), dtype=np.float32)
    engine.forward_block(tokens, 0, out)
    return out


def test_blocks_on_alternating_teams_give_the_same_bits(stories260k, parallel_always, policy):
    """An engine made under "alternate" runs its blocks on 2, 1, 2, ... threads (each block's
    positions on one team, as recorded by the plugin); every logit equals a 1-thread engine's."""
    model = Model.load(stories260k, threads=2)
    tokens = np.random.default_rng(3).integers(0, 512, 61).astype(np.int32)
    policy("fixed")
    want = _block_logits(model, Causal(), 1, tokens)
    policy("alternate")
    recorder = TeamRecorder()
    got = _block_logits(model, recorder, 2, tokens)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    teams = [team for _, team in recorder.teams]
    assert teams == [2 if (pos // 8) % 2 == 0 else 1 for pos in range(61)], teams
    assert team_for(2, BIG) == 2  # no cap left behind


def test_a_failing_block_leaves_no_cap_behind(stories260k, policy):
    model = Model.load(stories260k, threads=2)
    policy("alternate")
    engine = Engine(model.config, model.weights, TeamRecorder(fail_at=11), 2, max_block=8)
    engine.forward_block(np.arange(1, 9, dtype=np.int32), 0)  # a block on 2 threads: the next is on 1
    with pytest.raises(Exception, match="plugin failure at 11"):
        engine.forward_block(np.arange(1, 9, dtype=np.int32), 8)
    assert (11, 1) in engine.attention.teams
    assert team_for(2, BIG) == 2


@pytest.mark.parametrize(
    "one, two, settled",
    [
        (40e-3, 22e-3, 2),  # a 42M-shape block of 128 positions, idle: two threads 1.8x faster
        (45e-3, 80e-3, 1),  # beside a busy loop: two threads stall at their barriers
    ],
)
def test_blocks_settle_on_the_faster_team(one, two, settled):
    s1, sn = np.full(400, one), np.full(400, two)
    stats = simulate_blocks(2, s1.tolist(), sn.tolist())
    assert stats["settled"] == settled
    # a probe that loses costs one layer (and its untimed warm-up); past that the policy's 2% holds
    assert stats["seconds"] <= 1.02 * min(s1.sum(), sn.sum()) + 2 * max(one, two)


def test_an_idle_run_pays_one_lost_probe():
    """On an idle machine the first probe of one thread loses at its first timed layer and the next
    waits until that loss is PROBE_BUDGET (0.5%) of the time: a run of 200 layers probes once."""
    stats = simulate_blocks(2, [4e-3] * 200, [2.2e-3] * 200)
    assert stats["probes"] == 1 and stats["tokens_1"] == 2 and stats["settled"] == 2


def test_a_new_engine_of_the_same_model_starts_from_the_choice():
    """Model.logits makes an engine per call: the next one starts where the last one of that model
    settled, so a short call beside a busy core runs on one thread from its first layer."""
    loaded_1, loaded_n = [2e-3] * 60, [6e-3] * 60
    first = simulate_blocks(2, loaded_1, loaded_n, key=7, start=1000.0)
    assert first["settled"] == 1
    again = simulate_blocks(2, [2e-3] * 30, [6e-3] * 30, key=7, start=1000.0 + first["seconds"])
    assert again["tokens_n"] == 0 and again["tokens_1"] == 30
    other = simulate_blocks(2, [2e-3] * 30, [6e-3] * 30, key=8, start=1000.0 + first["seconds"])
    assert other["tokens_n"] > 0  # another model starts on the team


def test_a_probe_goes_on_across_calls_shorter_than_it():
    """stories260K's 64-position Model.logits runs 5 layers, fewer than a probe needs: a probe in
    progress is remembered with the choice, so once load arrives the calls after move to one thread."""
    idle = simulate_blocks(2, [4e-3] * 200, [2.2e-3] * 200, key=9, start=2000.0)
    assert idle["settled"] == 2
    now, teams = 2000.0 + idle["seconds"], []
    for _ in range(12):  # beside a busy core: the team's layers stall
        call = simulate_blocks(2, [2e-3] * 4, [6e-3] * 4, key=9, start=now)
        now += call["seconds"]
        teams.append(call["tokens_n"])
    assert teams[-4:] == [0, 0, 0, 0], teams


def test_blocks_of_another_size_keep_their_own_choice():
    """A generate's 5-position prompt, where one thread wins per layer, then 128-position blocks, where
    the team is 1.8x faster: the long blocks run on the team. (Timed as one class, the short blocks'
    layers counted their fixed costs 25 times over and one thread won for the long ones too.)"""
    short = [(5, [1e-4] * 8, [3e-4] * 8)] * 6
    long = [(128, [4e-3] * 8, [2.2e-3] * 8)] * 4
    teams = simulate_sized_blocks(2, short + long, 128, key=11, start=3000.0)
    assert teams[5][-1] == 1  # the short blocks settled on one thread
    assert all(team == 2 for team in teams[-1]), teams[6:]


def test_a_small_model_diffs_on_one_thread(stories260k, tok512, monkeypatch):
    """stories260K's blocks are shorter than handing one to a second Python thread: its diff at 2 threads
    runs on one thread, the two sides one after the other, with the same report."""
    from pyllama.diff import harness

    def no_pool(*args, **kwargs):
        raise AssertionError("a second thread was started")

    model = Model.load(stories260k, tokenizer=tok512, threads=2)
    assert model.config.position_work < harness.DIFF_THREADS_FROM
    ids = list(range(3, 100))
    one = model.diff("causal", "sliding:32", probe=ids, threads=1, progress=False, cache=False)
    monkeypatch.setattr(harness, "ThreadPoolExecutor", no_pool)
    two = model.diff("causal", "sliding:32", probe=ids, threads=2, progress=False, cache=False)
    assert np.array_equal(one.columns()["max_abs_dlogit"], two.columns()["max_abs_dlogit"])
    assert one.summary["max_abs_dlogit"] > 0  # the window of 32 drops rows: the report is not trivial
    assert two.threads == 1
    monkeypatch.setattr(harness, "DIFF_THREADS_FROM", 0)
    with pytest.raises(AssertionError, match="second thread"):
        model.diff("causal", "sliding:32", probe=ids, threads=2, progress=False, cache=False)


def test_a_small_block_runs_on_one_thread(stories260k, policy):
    """A block of less than 128 times the serial threshold (2^22 multiply-adds) never wakes the team:
    stories260K's 5 positions are 1.3M; its 64 are 16.6M and run on the caller's team."""
    model = Model.load(stories260k, threads=2)
    assert 5 * model.config.position_work < 1 << 22 <= 64 * model.config.position_work
    policy("fixed")
    engine = Engine(model.config, model.weights, TeamRecorder(), 2, max_block=128)
    engine.forward_block(np.arange(1, 6, dtype=np.int32), 0)
    assert {team for _, team in engine.attention.teams} == {1}
    engine.forward_block(np.arange(1, 65, dtype=np.int32), 5)
    assert {team for pos, team in engine.attention.teams if pos >= 5} == {2}
    assert team_for(2, BIG) == 2  # no cap left behind
