"""The KV-method references (kv_methods_reference.py) against hand-computed cases, the knob arithmetic,
grouped-query aggregation, and properties every method's held sets must have.

Most hand cases use one head with head_dim 1, query 1 and keys ln(a_p): query t's weights are then
a_p / sum(a) over the rows it attends, so the held sets below follow from the a_p by hand (the comment
next to each case gives the arithmetic)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kv_methods_reference import (
    Knobs,
    Rope,
    adakv,
    expected,
    floor_share,
    h2o,
    kept_count,
    keydiff,
    keydiff_scorer,
    knorm,
    knorm_scorer,
    pyramid_target,
    pyramidkv,
    quest,
    random_eviction,
    random_score,
    random_scorer,
    scissorhands,
    snapkv,
    snapkv_scorer,
    splitmix64,
    tova,
)


def log_keys(a: list[float], q: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One head, head_dim 1: query q at every step, key ln(a_p), value p."""
    T = len(a)
    k = np.log(np.array(a, dtype=np.float64)).astype(np.float32).reshape(T, 1, 1)
    q_all = np.full((T, 1, 1), q, dtype=np.float32)
    v = np.arange(T, dtype=np.float32).reshape(T, 1, 1)
    return q_all, k, v


def held_lists(trace, head: int = 0) -> list[list[int]]:
    return [step[head].tolist() for step in trace.held]


def random_qkv(T: int, n_heads: int, n_kv: int, hd: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((T, n_heads, hd)) * 1.5).astype(np.float32)
    k = (rng.standard_normal((T, n_kv, hd)) * 1.5).astype(np.float32)
    v = rng.standard_normal((T, n_kv, hd)).astype(np.float32)
    q_pre = rng.standard_normal((T, n_heads, hd)).astype(np.float32)
    return q, k, v, q_pre


# ---- the knobs' arithmetic ----------------------------------------------------------------------------
def test_kept_count_is_the_exact_ceiling_of_the_kept_share():
    # ratio p/100 (and p/1000 for a few): ceil((1 - r) n) = n - floor(r n), computed exactly in integers
    for scale, numerators in ((100, range(100)), (1000, (1, 125, 290, 333, 999))):
        for p in numerators:
            ratio = float(f"{p / scale:.3f}")
            for n in range(0, 1500):
                assert kept_count(n, ratio) == n - (p * n) // scale, (ratio, n)


def test_kept_count_where_plain_floating_point_goes_wrong():
    assert math.ceil((1 - 0.7) * 10) == 4 and kept_count(10, 0.7) == 3
    assert math.floor(0.29 * 100) == 28 and kept_count(100, 0.29) == 71
    assert kept_count(1, 0.9) == 1 and kept_count(0, 0.5) == 0
    assert floor_share(0.2, 15) == 3


def test_knobs_refuse_two_budgets_or_none_and_a_ratio_outside_the_range():
    for bad in ({}, {"ratio": 0.5, "capacity": 4}, {"ratio": 1.0}, {"ratio": -0.1}):
        with pytest.raises(ValueError):
            Knobs(**bad)


@pytest.mark.parametrize("method", [h2o, tova, scissorhands])
def test_step_methods_hold_the_ceiling_of_the_kept_share_after_each_position(method):
    q, k, v, _ = random_qkv(12, 2, 1, 4, seed=3)
    trace = method(q, k, v, Knobs(ratio=0.5))
    assert [len(h[0]) for h in trace.held] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]  # ceil(0.5 (t + 1))
    trace = method(q, k, v, Knobs(ratio=0.75))
    assert [len(h[0]) for h in trace.held] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]  # ceil(0.25 (t + 1))
    trace = method(q, k, v, Knobs(capacity=5))
    assert [len(h[0]) for h in trace.held] == [1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5]


# ---- hand-computed cases --------------------------------------------------------------------------------
def test_h2o_keeps_the_window_and_the_largest_received_totals():
    # a = 4 1 2 1 1, capacity 3, window 1. Totals after t=2: p0 1 + .8 + 4/7, p1 .2 + 1/7, p2 2/7.
    # t=3 weights 4 1 2 1 /8: p0 2.87, p1 .47, p2 .54 (p3 protected) -> evict p1.
    # t=4 rows 0 2 3 4, weights 4 2 1 1 /8: p0 3.37, p2 .79, p3 .25 -> evict p3.
    q, k, v = log_keys([4, 1, 2, 1, 1])
    trace = h2o(q, k, v, Knobs(capacity=3, window=1))
    assert held_lists(trace) == [[0], [0, 1], [0, 1, 2], [0, 2, 3], [0, 2, 4]]
    assert [a[0].tolist() for a in trace.attended][3:] == [[0, 1, 2, 3], [0, 2, 3, 4]]
    assert all(step[0].size == 0 for step in trace.near)  # no score within 1e-5 of the boundary


def test_h2o_window_half_is_half_the_target():
    # capacity 4 -> window 2 once the cache is full: the newest two are never evicted even with no weight
    q, k, v = log_keys([1e6, 1e6, 1e6, 1e-6, 1e-6, 1e-6])
    trace = h2o(q, k, v, Knobs(capacity=4, window="half"))
    assert held_lists(trace)[-2:] == [[0, 1, 3, 4], [0, 1, 4, 5]]


def test_tova_evicts_the_lowest_current_weight_and_the_older_of_equals():
    # a = 4 1 2 1 1, capacity 3. t=3 weights 4 1 2 1 /8: p1 and p3 tie at 1/8 -> the older (p1) goes.
    # t=4 rows 0 2 3 4, weights 4 2 1 1 /8: p3 and p4 tie -> p3 goes (the current position is a candidate)
    q, k, v = log_keys([4, 1, 2, 1, 1])
    trace = tova(q, k, v, Knobs(capacity=3))
    assert held_lists(trace) == [[0], [0, 1], [0, 1, 2], [0, 2, 3], [0, 2, 4]]
    assert [n[0].tolist() for n in trace.near][3:] == [[1, 3], [3, 4]]  # the exact ties are flagged


def test_near_flags_both_sides_of_a_boundary_closer_than_the_threshold():
    # t=3 weights 4 1 2 1.000001 (/8.000001): p1 goes, p3 stays 1e-6 above it; both are flagged
    q, k, v = log_keys([4, 1, 2, 1.000001, 8])
    trace = tova(q, k, v, Knobs(capacity=3))
    assert held_lists(trace)[3] == [0, 2, 3] and trace.near[3][0].tolist() == [1, 3]
    assert trace.near[4][0].tolist() == []  # t=4: p3 (1/15) goes far below p2 (2/15)


def test_tova_evicts_the_current_position_when_it_is_the_lowest():
    q, k, v = log_keys([4, 2, 1])
    assert held_lists(tova(q, k, v, Knobs(capacity=2)))[-1] == [0, 1]


def test_scissorhands_evicts_the_position_most_often_below_uniform_attention():
    # a = 4 1 3 1 1, capacity 3, window 1, history 2 (steps t-1, t).
    # t=2 weights 4 1 3 /8 vs 1/3: p1 low. t=3 weights 4 1 3 1 /9 vs 1/4: p1, p3 low.
    # counts over t=2,3: p0 0, p1 2, p2 0 (p3 protected) -> evict p1.
    # t=4 rows 0 2 3 4, weights 4 3 1 1 /9 vs 1/4: p3, p4 low; counts over t=3,4: p0 0, p2 0, p3 2 -> p3.
    q, k, v = log_keys([4, 1, 3, 1, 1])
    trace = scissorhands(q, k, v, Knobs(capacity=3, window=1), history=2)
    assert held_lists(trace) == [[0], [0, 1], [0, 1, 2], [0, 2, 3], [0, 2, 4]]


def test_scissorhands_breaks_equal_counts_by_age():
    # a = 1 1 1 1: uniform weights are never below 1/n, every count is 0 -> the oldest candidate goes
    q, k, v = log_keys([1, 1, 1, 1])
    assert held_lists(scissorhands(q, k, v, Knobs(capacity=2), history=4))[-1] == [2, 3]


def test_scissorhands_counts_only_weights_strictly_below_uniform():
    # queries 0 until t=2: weights exactly 1/n, never below it. t=3 weights 3 3 1 1 /8 vs 1/4: p2 (and
    # the protected p3) are low -> p2 goes. (Counting "at or below" would give p0 3, p1 2, p2 2: p0 goes.)
    q, k, v = log_keys([3, 3, 1, 1])
    q[:3] = 0.0
    assert held_lists(scissorhands(q, k, v, Knobs(capacity=3, window=1), history=4))[3] == [0, 1, 3]


@pytest.mark.parametrize(
    "kernel, pool, held",
    [
        (1, "avg", [0, 2, 4]),  # scores 4 1 3 2 /11: keep p0, p2
        (3, "avg", [1, 2, 4]),  # zero-padded means (0+4+1, 4+1+3, 1+3+2, 3+2+0)/3: keep p1 (8), p2 (6)
        (3, "max", [0, 1, 4]),  # maxima 4 4 3 3: keep p0, p1
    ],
)
def test_snapkv_scores_pools_and_keeps_the_observation_window(kernel, pool, held):
    # a = 4 1 3 2 1, event at 4, capacity 3, window 1: the observation query is 4, p4 is protected
    q, k, v = log_keys([4, 1, 3, 2, 1])
    trace = snapkv(q, k, v, Knobs(capacity=3, window=1), context_end=4, kernel=kernel, pool=pool)
    assert held_lists(trace) == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], held]


def test_snapkv_sums_the_observation_queries_and_evicts_the_older_of_equals():
    # a = 1 2 1 4 2, window 2: queries 3 (over 0..3, sum 8) and 4 (over 0..4, sum 10).
    # p0 = 1/8 + 1/10, p1 = 2/8 + 2/10, p2 = 1/8 + 1/10: p1 first, then p2 beats p0 (older goes first)
    q, k, v = log_keys([1, 2, 1, 4, 2])
    assert held_lists(snapkv(q, k, v, Knobs(capacity=3, window=2), 4, kernel=1))[4] == [1, 3, 4]
    assert held_lists(snapkv(q, k, v, Knobs(capacity=4, window=2), 4, kernel=1))[4] == [1, 2, 3, 4]


def test_pyramid_budgets_follow_kvcache_factory():
    # n 1000, capacity 300, window 64, beta 20, 32 layers: min (236 // 20) = 11, max 472 - 11 = 461,
    # steps (461 - 11) // 31 = 14: layer 0 keeps 64 + 461, layer 31 64 + 461 - 434
    assert pyramid_target(1000, 300, 64, 20, 0, 32) == 525
    assert pyramid_target(1000, 300, 64, 20, 31, 32) == 91
    assert pyramid_target(400, 300, 64, 20, 7, 32) == 300  # n < 2 (capacity - window): SnapKV's budget
    assert pyramid_target(200, 300, 64, 20, 7, 32) == 200  # n < capacity: no compression
    assert pyramid_target(1000, 300, 64, 20, 0, 1) == 525  # one layer: no slope


def test_pyramidkv_gives_deeper_layers_fewer_rows():
    q, k, v, _ = random_qkv(60, 2, 1, 4, seed=5)
    sizes = [len(pyramidkv(q, k, v, Knobs(capacity=30, window=4), 59, layer, 4).held[59][0]) for layer in range(4)]
    assert sizes == [pyramid_target(60, 30, 4, 20, layer, 4) for layer in range(4)]
    assert sizes[0] > sizes[-1]


def test_adakv_keeps_a_floor_per_head_and_shares_the_rest_globally():
    # knorm scores: head 0 keys 1 2 3 4, head 1 keys 5 6 7 8; ratio 0.5: 2 rows per head, 4 in all.
    # alpha 0.5 -> each head keeps its best floor(0.5 * 2) = 1 (p0); the other 2 go to the best
    # remaining scores overall: head 0's p1 (-2) and p2 (-3)
    k = np.array([[1, 5], [2, 6], [3, 7], [4, 8]], dtype=np.float32).reshape(4, 2, 1)
    q, v = np.ones((4, 2, 1), np.float32), np.ones((4, 2, 1), np.float32)
    trace = adakv(q, k, v, Knobs(ratio=0.5), 3, knorm_scorer(k), alpha=0.5)
    assert [h.tolist() for h in trace.held[3]] == [[0, 1, 2], [0]]
    trace = adakv(q, k, v, Knobs(ratio=0.5), 3, knorm_scorer(k), alpha=1.0)  # the floor is the whole share
    assert [h.tolist() for h in trace.held[3]] == [[0, 1], [0, 1]]


def test_knorm_keeps_the_smallest_keys():
    k = np.array([3, -1, 2, 0.5, 4], dtype=np.float32).reshape(5, 1, 1)  # norms 3 1 2 .5 4
    q = np.ones((5, 1, 1), np.float32)
    assert held_lists(knorm(q, k, k.copy(), Knobs(ratio=0.4), 4))[4] == [1, 2, 3]  # keep 5 - floor(2) = 3


def test_keydiff_keeps_the_keys_least_like_the_mean_direction():
    # unit keys (1,0) (1,0) (0,1) (1,0): anchor (.75, .25). p2 is least similar; p0 p1 p3 tie -> newest
    k = np.array([[1, 0], [2, 0], [0, 1], [1, 0]], dtype=np.float32).reshape(4, 1, 2)
    q = np.ones((4, 1, 2), np.float32)
    assert held_lists(keydiff(q, k, k.copy(), Knobs(capacity=2), 3))[3] == [2, 3]
    scores = keydiff_scorer(k)(3, [np.arange(4)], [np.zeros(4, bool)], 0)[0]
    assert scores[0] == scores[1] == scores[3] and scores[2] == pytest.approx(-0.25 / math.sqrt(0.625))


def expected_case(a: list[float], b: list[float], cov_keys: bool):
    """head_dim 4, RoPE on dims 0-1 only; the query mean lives on dim 2, which RoPE leaves alone. Without
    covariance keys carry 2 ln(a_p) on dim 2 (z_p = ln a_p); with alternating +-1 queries (mean 0,
    variance 1) keys carry sqrt(8 ln a_p) (z_p = c^2 / (2 * 4) = ln a_p). Values have norm b_p."""
    T, hd = len(a), 4
    k = np.zeros((T, 1, hd), np.float32)
    k[:, 0, 0], k[:, 0, 1] = np.arange(T), -1.0  # rotated dims: the mean query is 0 there
    k[:, 0, 2] = np.sqrt(8 * np.log(a)) if cov_keys else 2 * np.log(a)
    v = np.zeros((T, 1, hd), np.float32)
    v[:, 0, 3] = b
    q_pre = np.zeros((T, 1, hd), np.float32)
    q_pre[:, 0, 2] = [(-1) ** p for p in range(T)] if cov_keys else 1.0
    q_pre[0, 0, :] = [50.0, 0.0, 100.0, 0.0]  # the sink's outlier query stays out of the statistics
    return np.ones((T, 1, hd), np.float32), q_pre, k, v


def test_expected_attention_is_the_mean_query_attention_times_the_value_norm():
    # a = _ 1 2 4 1, b = _ 3 1 1 2, sink p0: scores a/8 * b = .375 .25 .5 .25 -> keep p3, p1 (+ the sink)
    rope = Rope(10000.0, n_rot=2)
    q, q_pre, k, v = expected_case([1, 1, 2, 4, 1], [1, 3, 1, 1, 2], cov_keys=False)
    assert held_lists(expected(q, q_pre, k, v, Knobs(capacity=3, sinks=1), 4, rope))[4] == [0, 1, 3]
    assert held_lists(expected(q, q_pre, k, v, Knobs(capacity=3, sinks=1, window=1), 4, rope))[4] == [0, 3, 4]


def test_expected_attention_uses_half_the_key_covariance_quadratic_form():
    # queries 1 -1 1 -1 after the sink: mean 0, (1/N) variance 1 -> z = ln a as above; without the
    # covariance term every z is 0, the softmax is uniform and the value norms b decide: p1 (3), p4 (2)
    rope = Rope(10000.0, n_rot=2)
    q, q_pre, k, v = expected_case([1, 1, 2, 4, 1], [1, 3, 1, 1, 2], cov_keys=True)
    assert held_lists(expected(q, q_pre, k, v, Knobs(capacity=3, sinks=1), 4, rope))[4] == [0, 1, 3]
    trace = expected(q, q_pre, k, v, Knobs(capacity=3, sinks=1), 4, rope, covariance=False)
    assert held_lists(trace)[4] == [0, 1, 4]


def test_the_mean_rotation_averages_cos_and_sin_of_each_pair():
    rope = Rope(100.0, n_rot=4)  # freqs 1 and 1/10
    rot = rope.mean_rotation(head_dim=6, first=1, count=2)  # positions 1 and 2
    c0, s0 = (math.cos(1) + math.cos(2)) / 2, (math.sin(1) + math.sin(2)) / 2
    c1, s1 = (math.cos(0.1) + math.cos(0.2)) / 2, (math.sin(0.1) + math.sin(0.2)) / 2
    assert rot[0, 0] == pytest.approx(c0) and rot[0, 1] == pytest.approx(-s0) and rot[1, 0] == pytest.approx(s0)
    assert rot[2, 2] == pytest.approx(c1) and rot[3, 2] == pytest.approx(s1)
    assert rot[4:, 4:].tolist() == [[1, 0], [0, 1]] and rot[0, 2] == 0  # dims past n_rot stay
    neox = Rope(100.0, n_rot=4, style="neox").mean_rotation(head_dim=4, first=1, count=2)
    assert neox[0, 2] == pytest.approx(-s0) and neox[2, 0] == pytest.approx(s0) and neox[1, 3] == pytest.approx(-s1)


def test_quest_attends_its_own_page_and_the_pages_of_highest_bound():
    # page 2, capacity 4: query 5 attends page 2 (4, 5) plus one of page 0 (keys (1,0), (0,1): max (1,1),
    # min (0,0)) and page 1 (keys (-1,2), (.5,-1): max (.5,2), min (-1,-1)).
    # q (1,1): bounds 1+1 = 2 vs .5+2 = 2.5 -> page 1; q (2,.1): 2+.1 = 2.1 vs 1+.2 = 1.2 -> page 0
    k = np.array([[1, 0], [0, 1], [-1, 2], [0.5, -1], [0, 0], [0, 0]], dtype=np.float32).reshape(6, 1, 2)
    for query, attended in (([1, 1], [2, 3, 4, 5]), ([2, 0.1], [0, 1, 4, 5])):
        q = np.zeros((6, 1, 2), np.float32)
        q[5, 0] = query
        trace = quest(q, k, k.copy(), capacity=4, page=2, dense_layers=0)
        assert trace.attended[5][0].tolist() == attended
        assert trace.held[5][0].tolist() == list(range(6))  # quest holds everything
    # query 4 is zero: both bounds 0, the older page goes first
    assert trace.attended[4][0].tolist() == [2, 3, 4]
    dense = quest(q, k, k.copy(), capacity=4, page=2, context_end=5, dense_layers=0)
    assert dense.attended[5][0].tolist() == list(range(6))  # the context is attended in full
    assert quest(q, k, k.copy(), capacity=4, page=2, layer=1).attended[5][0].tolist() == list(range(6))


def test_random_scores_come_from_splitmix64():
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # the first output of SplitMix64 seeded with 0
    assert random_score(7, 1, 2, 0, 5) == random_score(7, 1, 2, 0, 5)
    assert random_score(7, 1, 2, 0, 5) != random_score(7, 1, 2, 1, 5)  # each compression draws afresh
    assert 0 <= random_score(0, 0, 0, 0, 0) < 2.0**53


def test_random_eviction_is_seeded():
    q, k, v, _ = random_qkv(40, 2, 2, 4, seed=1)
    first = random_eviction(q, k, v, Knobs(ratio=0.5), 39, seed=3)
    again = random_eviction(q, k, v, Knobs(ratio=0.5), 39, seed=3)
    other = random_eviction(q, k, v, Knobs(ratio=0.5), 39, seed=4)
    assert [h.tolist() for h in first.held[39]] == [h.tolist() for h in again.held[39]]
    assert [h.tolist() for h in first.held[39]] != [h.tolist() for h in other.held[39]]
    assert [len(h) for h in first.held[39]] == [20, 20]


# ---- grouped-query attention --------------------------------------------------------------------------
def test_group_scores_are_the_mean_over_the_query_heads():
    # one KV head, two query heads; keys (ln w0, ln w1) and queries sqrt(2) e_h give head h the weights w_h.
    # candidates p0..p4 (w0, w1) = (.02 .22) (.13 .13) (.22 .03) (.001 .30) (.30 .001); p5 (protected)
    # takes the rest. The group mean (.12 .13 .125 .15 .15) evicts p0; the max (.22 .13 .22 .30 .30)
    # would evict p1, head 0 alone p3, head 1 alone p4
    w0 = np.array([0.02, 0.13, 0.22, 0.001, 0.30, 0.329])
    w1 = np.array([0.22, 0.13, 0.03, 0.30, 0.001, 0.319])
    k = np.stack([np.log(w0), np.log(w1)], axis=1).astype(np.float32).reshape(6, 1, 2)
    q = np.zeros((6, 2, 2), np.float32)
    q[:, 0, 0] = q[:, 1, 1] = math.sqrt(2)
    assert held_lists(snapkv(q, k, k.copy(), Knobs(capacity=5, window=1), 5, kernel=1))[5] == [1, 2, 3, 4, 5]
    assert held_lists(tova(q, k, k.copy(), Knobs(capacity=5, window=1)))[5] == [1, 2, 3, 4, 5]
    assert held_lists(tova(q[:, :1], k, k.copy(), Knobs(capacity=5, window=1)))[5] == [0, 1, 2, 4, 5]


@pytest.mark.parametrize(
    "run",
    [
        lambda q, k, v, qp: h2o(q, k, v, Knobs(ratio=0.5, window=2)),
        lambda q, k, v, qp: scissorhands(q, k, v, Knobs(capacity=9, window=2), history=4),
        lambda q, k, v, qp: snapkv(q, k, v, Knobs(ratio=0.6, window=3, every=5), 15),
        lambda q, k, v, qp: knorm(q, k, v, Knobs(ratio=0.5), 15),
        lambda q, k, v, qp: expected(q, qp, k, v, Knobs(ratio=0.5, sinks=2), 15, Rope(10000.0, 4)),
    ],
)
def test_per_head_methods_select_each_kv_head_from_its_own_query_group(run):
    q, k, v, q_pre = random_qkv(30, 4, 2, 4, seed=11)
    whole = run(q, k, v, q_pre)
    for g in range(2):
        alone = run(q[:, 2 * g : 2 * g + 2], k[:, g : g + 1], v[:, g : g + 1], q_pre[:, 2 * g : 2 * g + 2])
        assert held_lists(whole, g) == held_lists(alone, 0)


def test_tova_holds_one_set_per_layer():
    q, k, v, _ = random_qkv(25, 4, 2, 4, seed=2)
    trace = tova(q, k, v, Knobs(ratio=0.6))
    assert all(step[0].tolist() == step[1].tolist() for step in trace.held)


# ---- properties of every method ------------------------------------------------------------------------
T_PROP, END = 36, 20


def every_method(q, k, v, q_pre, ratio: float | None, capacity: int | None, every: int = 0) -> dict:
    def knobs(**extra):
        return Knobs(ratio=ratio, capacity=capacity, every=every, **extra)

    rope = Rope(10000.0, 4, "neox")
    return {
        "h2o": h2o(q, k, v, knobs(window=3, sinks=1)),
        "h2o-half": h2o(q, k, v, knobs(window="half")),
        "tova": tova(q, k, v, knobs(window=2)),
        "scissorhands": scissorhands(q, k, v, knobs(window=3, sinks=2), history=4),
        "snapkv": snapkv(q, k, v, knobs(window=4), END),
        "snapkv-max": snapkv(q, k, v, knobs(window=4, sinks=1), END, pool="max"),
        "pyramidkv": pyramidkv(q, k, v, knobs(window=4), END, layer=1, n_layers=3),
        "adakv": adakv(q, k, v, knobs(window=4), END, snapkv_scorer(q, k, 4)),
        "knorm": knorm(q, k, v, knobs(sinks=1), END),
        "keydiff": keydiff(q, k, v, knobs(window=2), END),
        "expected": expected(q, q_pre, k, v, knobs(sinks=2), END, rope, future=16),
        "random": random_eviction(q, k, v, knobs(window=2), END, seed=9, layer=1),
    }


def causal_output(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Dense causal attention, float64, written without the reference's helpers."""
    T, n_heads, hd = q.shape
    group = n_heads // k.shape[1]
    out = np.zeros((T, n_heads, hd))
    for t in range(T):
        for h in range(n_heads):
            s = k[: t + 1, h // group].astype(np.float64) @ q[t, h].astype(np.float64) / math.sqrt(hd)
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ v[: t + 1, h // group].astype(np.float64)
    return out


def test_ratio_zero_keeps_everything_and_attends_causally():
    q, k, v, q_pre = random_qkv(T_PROP, 4, 2, 4, seed=4)
    dense = causal_output(q, k, v)
    traces = every_method(q, k, v, q_pre, ratio=0.0, capacity=None, every=4)
    traces["quest"] = quest(q, k, v, capacity=T_PROP, page=4, dense_layers=0)
    for name, trace in traces.items():
        for t in range(T_PROP):
            for g in range(2):
                assert trace.held[t][g].tolist() == list(range(t + 1)), name
                assert trace.attended[t][g].tolist() == list(range(t + 1)), name
        np.testing.assert_allclose(trace.out, dense, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("ratio, capacity, every", [(0.5, None, 0), (0.3, None, 6), (None, 12, 0), (None, 9, 5)])
def test_held_sets_are_sorted_grow_by_one_and_keep_the_protected(ratio, capacity, every):
    q, k, v, q_pre = random_qkv(T_PROP, 4, 2, 4, seed=8)
    for name, trace in every_method(q, k, v, q_pre, ratio, capacity, every).items():
        previous = [np.zeros(0, np.int64)] * 2
        for t in range(T_PROP):
            for g in range(2):
                held, rows = trace.held[t][g], trace.attended[t][g]
                assert rows.tolist() == sorted(previous[g].tolist() + [t]), (name, t)
                assert np.all(np.diff(held) > 0) and set(held.tolist()) <= set(rows.tolist()), (name, t)
                assert set(trace.near[t][g].tolist()) <= set(rows.tolist()), (name, t)
            previous = trace.held[t]
        sinks = {"h2o": 1, "scissorhands": 2, "snapkv-max": 1, "knorm": 1, "expected": 2}.get(name, 0)
        window = {"h2o": 3, "tova": 2, "scissorhands": 3, "keydiff": 2, "random": 2}.get(name, 0)
        window = 4 if name.startswith(("snapkv", "pyramidkv", "adakv")) else window
        for t in range(T_PROP):
            for g in range(2):
                held = set(trace.held[t][g].tolist())
                assert set(range(min(sinks, t + 1))) <= held, (name, t)
                assert set(range(max(t - window + 1, 0), t + 1)) <= held, (name, t)


@pytest.mark.parametrize("ratio, capacity", [(0.5, None), (None, 12)])
def test_event_methods_compress_only_at_the_event_and_every_n_after(ratio, capacity):
    q, k, v, q_pre = random_qkv(T_PROP, 4, 2, 4, seed=6)
    events = {END, END + 5, END + 10, END + 15}
    for name, trace in every_method(q, k, v, q_pre, ratio, capacity, every=5).items():
        if name in ("h2o", "h2o-half", "tova", "scissorhands"):
            continue
        for t in range(T_PROP):
            rows, held = trace.attended[t], trace.held[t]
            shrank = any(len(h) < len(r) for h, r in zip(held, rows, strict=True))
            assert shrank == (t in events), (name, t)
            if t in events and name not in ("pyramidkv", "adakv"):
                target = kept_count(len(rows[0]), ratio) if ratio is not None else min(len(rows[0]), capacity)
                assert [len(h) for h in held] == [max(target, 4 if name.startswith("snapkv") else 0)] * 2
            if t in events and name == "adakv":
                targets = [kept_count(len(r), ratio) if ratio is not None else capacity for r in rows]
                assert sum(len(h) for h in held) == sum(targets), t
    no_event = snapkv(q, k, v, Knobs(ratio=0.5, window=4, every=5), context_end=None)
    assert all(len(step[0]) == t + 1 for t, step in enumerate(no_event.held))


def test_step_methods_hold_the_protected_when_they_outnumber_the_target():
    q, k, v, _ = random_qkv(12, 2, 1, 4, seed=7)
    trace = h2o(q, k, v, Knobs(ratio=0.8, window=4, sinks=1))
    # target ceil(0.2 (t + 1)) is below the 1 sink + 4 recent until t = 24: they are all kept
    assert [len(h[0]) for h in trace.held] == [min(t + 1, 5) for t in range(12)]


def test_adakv_per_head_sizes_differ_and_respect_the_floor():
    q, k, v, _ = random_qkv(40, 4, 2, 4, seed=12)
    k[:, 1] *= 4  # head 1's keys are larger: knorm ranks them lower
    trace = adakv(q, k, v, Knobs(ratio=0.5), 39, knorm_scorer(k), alpha=0.2)
    sizes = [len(h) for h in trace.held[39]]
    assert sum(sizes) == 40 and sizes[0] > sizes[1] >= floor_share(0.2, 20)
    seeded = adakv(q, k, v, Knobs(ratio=0.5), 39, random_scorer(1, 0), alpha=0.2)
    assert sum(len(h) for h in seeded.held[39]) == 40
