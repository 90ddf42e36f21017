"""The experimental memories (kmeans, tiered, lattice): exactness in their degenerate settings, the
mechanics on hand-checkable cases, and each one's attention against an independent numpy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import shared_file

from pyllama.attention.registry import create_plugin, plugin_infos
from pyllama.config import ModelConfig
from pyllama.engine import Pool
from pyllama.errors import PluginError, PositionError, PyllamaError
from pyllama.plugins import tiered as tiered_mod
from pyllama.plugins.kmeans import KMeans
from pyllama.plugins.lattice import Lattice
from pyllama.plugins.tiered import Tiered

# float32 attention (fast exp, float32 dot products and running means) against a float64 reference
ATOL = 2e-5
RTOL = 1e-4

SMALL = ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=16, seq_len=64)


# ---- helpers ----------------------------------------------------------------------------------------
def bind(plugin, config=SMALL, threads=1):
    pool = Pool(threads)
    plugin._configure(config, pool)
    plugin.init(config, pool)
    return plugin


def random_qkv(T, config=SMALL, seed=0):
    rng = np.random.default_rng(seed)
    L, qd, kvd = config.n_layers, config.q_dim, config.kv_dim
    q = rng.standard_normal((T, L, qd)).astype(np.float32) * 2
    k = rng.standard_normal((T, L, kvd)).astype(np.float32) * 2
    v = rng.standard_normal((T, L, kvd)).astype(np.float32)
    return q, k, v


def drive(plugin, q, k, v, check=None):
    """Feed every position through every layer; ``check(t, layer, out)`` after each call."""
    T, L = q.shape[:2]
    outs = np.zeros(q.shape, dtype=np.float32)
    for t in range(T):
        for layer in range(L):
            out = np.zeros(q.shape[2], dtype=np.float32)
            plugin.attend(layer, t, q[t, layer], k[t, layer], v[t, layer], out)
            outs[t, layer] = out
            if check is not None:
                check(t, layer, out)
    return outs


def ref_head(qh, keys, values, bias=None):
    """float64 softmax attention of one head over rows ``keys``/``values`` [n, hd]."""
    s = keys.astype(np.float64) @ qh.astype(np.float64) / math.sqrt(qh.shape[0])
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    a = np.exp(s - s.max())
    return (a / a.sum()) @ values.astype(np.float64)


def heads(config=SMALL):
    hd = config.head_dim
    for h in range(config.n_heads):
        g = h // config.kv_mul
        yield h, slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)


def binary_buckets(units: int, base: int, levels: int = 0) -> list[int]:
    """Bucket sizes, oldest first, for ``units`` buckets of ``base`` tokens pushed (binary carries)."""
    if levels:
        low = units % (1 << (levels - 1))
        top = units - low
    else:
        low, top = units, 0
    sizes = [base << b for b in range(low.bit_length() - 1, -1, -1) if low >> b & 1]
    return ([top * base] if top else []) + sizes


# ---- registry ---------------------------------------------------------------------------------------
def test_listed_with_descriptions_and_knobs():
    infos = {i.name: i for i in plugin_infos()}
    for name, knob in (("kmeans", "budget"), ("tiered", "bits"), ("lattice", "base")):
        assert infos[name].error is None, infos[name].error
        assert infos[name].description and "\n" not in infos[name].description
        assert knob in [k.name for k in infos[name].knobs]
    assert "not memory" in infos["kmeans"].description


@pytest.mark.parametrize(
    "spec",
    [
        "tiered:bits=5",
        "tiered:warm=40,group=32",
        "lattice:levels=99",
        "kmeans:iters=0",
        "kmeans:clusters=0",
        "kmeans:iters=9223372036854775807",  # holds no memory, but each re-clustering would never end
    ],
)
def test_bad_knobs_are_plugin_errors(spec):
    with pytest.raises(PluginError):
        create_plugin(spec)


# ---- lattice ----------------------------------------------------------------------------------------
def test_lattice_buckets_are_the_binary_representation():
    one = ModelConfig(dim=8, hidden_dim=8, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=4, seq_len=16)
    lat = bind(Lattice(sinks=0, window=1, base=1), one)
    rng = np.random.default_rng(1)
    out = np.zeros(8, dtype=np.float32)
    for t in range(1, 200):
        x = rng.standard_normal(8).astype(np.float32)
        lat.attend(0, t - 1, x, x, x, out)
        # t tokens fed, window 1: t - 1 have left the window
        expected = [1 << b for b in range((t - 1).bit_length() - 1, -1, -1) if (t - 1) >> b & 1]
        assert lat.bucket_sizes(0) == expected, t
    assert lat.bucket_sizes(0) == [128, 64, 4, 2]  # 198 = 0b11000110


def test_lattice_buckets_with_base_sinks_window_and_levels():
    one = ModelConfig(dim=8, hidden_dim=8, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=4, seq_len=16)
    for levels in (0, 1, 2, 3):
        lat = bind(Lattice(sinks=2, window=3, base=4, levels=levels), one)
        x = np.ones(8, dtype=np.float32)
        out = np.zeros(8, dtype=np.float32)
        for t in range(52):
            lat.attend(0, t, x, x, x, out)
        # 52 tokens: 2 sinks, 3 in the window, 47 out = 11 buckets of 4 (0b1011) + 3 staged
        assert lat.staged(0) == 3
        assert lat.bucket_sizes(0) == binary_buckets(11, 4, levels)
        assert sum(lat.bucket_sizes(0)) == 44
    assert binary_buckets(11, 4) == [32, 8, 4]
    assert binary_buckets(11, 4, 2) == [40, 4]
    assert binary_buckets(11, 4, 1) == [44]


def rope_shift(x, delta, theta=10000.0):
    """Rotate every head of ``x`` by ``delta`` more positions (llama2.c pairs (2i, 2i+1)), in float64."""
    hd = SMALL.head_dim
    out = np.array(x, dtype=np.float64).reshape(-1, hd // 2, 2)
    ang = delta / theta ** (np.arange(0, hd, 2) / hd)
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = out[..., 0].copy(), out[..., 1].copy()
    out[..., 0] = x0 * c - x1 * s
    out[..., 1] = x0 * s + x1 * c
    return out.reshape(np.shape(x))


def lattice_reference(t, layer, q, k, v, S, W, B, levels, shift=False):
    """Expected output at position t: sinks, dyadic bucket means (log count bias), staged, window;
    with ``shift`` the sinks and buckets re-rotated to the positions just before the exact tail."""
    n_out = max(0, t + 1 - S - W)
    units, staged = divmod(n_out, B)
    sizes = binary_buckets(units, B, levels)
    n_sink = min(t + 1, S)
    first_exact = S + units * B if n_out else t + 1 - min(max(t + 1 - S, 0), W)
    offset = first_exact - n_sink - len(sizes) if shift else 0
    Ks, Vs, bias = [], [], []
    for p in range(n_sink):
        Ks.append(rope_shift(k[p, layer], offset))
        Vs.append(v[p, layer])
        bias.append(0.0)
    start = S
    for j, size in enumerate(sizes):
        mean = k[start : start + size, layer].astype(np.float64).mean(0)
        Ks.append(rope_shift(mean, n_sink + j + offset - (start + (size - 1) // 2)) if shift else mean)
        Vs.append(v[start : start + size, layer].astype(np.float64).mean(0))
        bias.append(math.log(size))
        start += size
    for p in list(range(start, start + staged)) + list(range(max(S, t + 1 - W), t + 1)):
        Ks.append(k[p, layer])
        Vs.append(v[p, layer])
        bias.append(0.0)
    K, V = np.array(Ks), np.array(Vs)
    expected = np.zeros(q.shape[2])
    for _h, qs, ks in heads():
        expected[qs] = ref_head(q[t, layer, qs], K[:, ks], V[:, ks], bias)
    return expected


@pytest.mark.parametrize(
    "S,W,B,levels,shift",
    [(2, 5, 1, 0, False), (0, 3, 4, 0, False), (3, 4, 2, 2, False), (2, 5, 1, 0, True), (3, 4, 2, 2, True)],
)
def test_lattice_matches_numpy_reference(S, W, B, levels, shift):
    T = 70
    q, k, v = random_qkv(T, seed=S + W + B)
    lat = bind(Lattice(sinks=S, window=W, base=B, levels=levels, shift=shift))
    # shift: float32 RoPE angles of positions up to T against float64 ones
    tol = 4 * ATOL if shift else ATOL

    def check(t, layer, out):
        expected = lattice_reference(t, layer, q, k, v, S, W, B, levels, shift)
        np.testing.assert_allclose(out, expected, rtol=RTOL, atol=tol)

    drive(lat, q, k, v, check)


def test_lattice_memory_is_logarithmic():
    lat = bind(Lattice(sinks=4, window=16, base=4))
    q, k, v = random_qkv(1, seed=3)
    out = np.zeros(SMALL.q_dim, dtype=np.float32)
    row = 2 * SMALL.kv_dim * 4
    mems = {}
    for t in range(4096):
        for layer in range(SMALL.n_layers):
            lat.attend(layer, t, q[0, layer], k[0, layer], v[0, layer], out)
        mems[t + 1] = lat.memory_bytes()
    for n in (64, 512, 4096):
        n_out = n - 20
        units, staged = divmod(n_out, 4)
        buckets = bin(units).count("1")
        assert lat.bucket_sizes(0) == binary_buckets(units, 4) or n != 4096
        assert mems[n] == SMALL.n_layers * ((20 + staged) * row + buckets * (row + 8))
    assert mems[4096] < 2 * mems[512]


# ---- tiered -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
def test_quantise_error_within_half_a_step(bits):
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal((200, 37)) * rng.uniform(0.01, 10, (200, 1))).astype(np.float32)
    x[5] = 3.25  # a constant group: scale 0, exact
    codes, scale, zero = tiered_mod.quantize(x, bits)
    assert codes.max() <= (1 << bits) - 1
    np.testing.assert_array_equal(zero, x.min(axis=1))
    np.testing.assert_allclose(scale, (x.max(axis=1) - x.min(axis=1)) / ((1 << bits) - 1), rtol=1e-6)
    err = np.abs(tiered_mod.dequantize(codes, scale, zero) - x)
    # at most half a quantisation step per element, up to float32 rounding of code * scale + zero
    bound = scale[:, None] / 2 + 4 * np.finfo(np.float32).eps * np.abs(x).max(axis=1, keepdims=True)
    assert (err <= bound).all()
    assert err[5].max() == 0
    # the step is what the bit width implies: finer by 2^4 - 1 vs 2^8 - 1
    assert err.max() > scale.max() / 2 * 0.5


def test_pack4_round_trip():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (9, 13), dtype=np.uint8)
    packed = tiered_mod.pack4(codes)
    assert packed.shape == (9, 7)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 1] << 4)
    np.testing.assert_array_equal(tiered_mod.unpack4(packed, 13), codes)


def quantise_ref(x, bits, axis):
    """Independent KIVI-style min/max quantise-dequantise along ``axis`` (float32 arithmetic)."""
    qmax = np.float32((1 << bits) - 1)
    mn = x.min(axis=axis, keepdims=True)
    scale = (x.max(axis=axis, keepdims=True) - mn) / qmax
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.clip(np.floor((x - mn) / scale + np.float32(0.5)), 0, qmax)
    codes = np.where(scale > 0, codes, 0).astype(np.float32)
    return codes * scale + mn


def tiered_reference_rows(t, layer, k, v, S, W, warm, bits, G, block):
    """Rows (key, value, bias, kind) attended at position t, for all kv_dim channels, in order."""
    kvd, hd = k.shape[2], SMALL.head_dim
    n_out = max(0, t + 1 - S - W)
    rows = [(k[p, layer], v[p, layer], 0.0) for p in range(min(t + 1, S))]
    if warm == 0:
        cold_k, cold_v = k[S : S + n_out, layer], v[S : S + n_out, layer]
        staged_from = S + n_out
        warm_rows = []
    else:
        formed, staged = divmod(n_out, G)
        held = min(formed, warm // G)
        evicted = formed - held
        deq = []  # dequantised tokens of every group formed, in order
        for gi in range(formed):
            kg = k[S + gi * G : S + (gi + 1) * G, layer]
            vg = v[S + gi * G : S + (gi + 1) * G, layer]
            dk = quantise_ref(kg, bits, axis=0)  # keys: per channel over the group's tokens
            vgs = min(G, hd)
            dv = np.zeros_like(vg)
            for c0 in range(0, kvd, hd):  # values: per token over channel groups inside each head
                for j in range(c0, c0 + hd, vgs):
                    dv[:, j : min(j + vgs, c0 + hd)] = quantise_ref(vg[:, j : min(j + vgs, c0 + hd)], bits, axis=1)
            deq.append((dk, dv))
        cold_k = np.concatenate([d[0] for d in deq[:evicted]] or [np.zeros((0, kvd), np.float32)])
        cold_v = np.concatenate([d[1] for d in deq[:evicted]] or [np.zeros((0, kvd), np.float32)])
        warm_rows = [(dk[i], dv[i], 0.0) for dk, dv in deq[evicted:] for i in range(G)]
        staged_from = S + formed * G
    for b0 in range(0, len(cold_k), block):
        ck, cv = cold_k[b0 : b0 + block], cold_v[b0 : b0 + block]
        rows.append((ck.astype(np.float64).mean(0), cv.astype(np.float64).mean(0), math.log(len(ck)), "cold"))
    rows += warm_rows
    rows += [(k[p, layer], v[p, layer], 0.0) for p in range(staged_from, max(S, t + 1 - W))]
    rows += [(k[p, layer], v[p, layer], 0.0) for p in range(max(S, t + 1 - W), t + 1)]
    return rows


@pytest.mark.parametrize(
    "S,W,warm,bits,G,block,topk",
    [
        (2, 5, 8, 4, 4, 3, 0),
        (0, 4, 12, 8, 6, 5, 0),
        (3, 3, 0, 4, 4, 4, 0),
        (1, 4, 16, 4, 8, 4, 2),
    ],
)
def test_tiered_matches_numpy_reference(S, W, warm, bits, G, block, topk):
    T = 80
    q, k, v = random_qkv(T, seed=warm + bits + G)
    tie = bind(Tiered(sinks=S, window=W, warm=warm, bits=bits, group=G, block=block, cold_topk=topk))

    def check(t, layer, out):
        rows = tiered_reference_rows(t, layer, k, v, S, W, warm, bits, G, block)
        expected = np.zeros(SMALL.q_dim)
        for _h, qs, ks in heads():
            sel = rows
            cold = [i for i, r in enumerate(rows) if len(r) == 4]
            if topk and len(cold) > topk:
                score = {
                    i: float(rows[i][0][ks].astype(np.float64) @ q[t, layer, qs]) / math.sqrt(SMALL.head_dim)
                    + rows[i][2]
                    for i in cold
                }
                keep = set(sorted(cold, key=lambda i: -score[i])[:topk])
                sel = [r for i, r in enumerate(rows) if i not in cold or i in keep]
            K = np.array([r[0][ks] for r in sel])
            V = np.array([r[1][ks] for r in sel])
            expected[qs] = ref_head(q[t, layer, qs], K, V, [r[2] for r in sel])
        np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)

    drive(tie, q, k, v, check)
    n_out = T - S - W
    tiers = tie.tiers(1)
    if warm:
        assert tiers["staged"] == n_out % G
        assert tiers["warm"] == min(n_out // G * G, warm)
    assert tiers["cold_tokens"] + tiers["warm"] + tiers["staged"] == n_out
    assert all(c == block for c in tiers["cold_counts"][:-1])


def test_tiered_ledger_counts_the_representation():
    S, W, warm, G, block = 4, 16, 64, 32, 32
    for bits in (4, 8):
        tie = bind(Tiered(sinks=S, window=W, warm=warm, bits=bits, group=G, block=block))
        q, k, v = random_qkv(1, seed=0)
        out = np.zeros(SMALL.q_dim, dtype=np.float32)
        T = 500
        for t in range(T):
            for layer in range(SMALL.n_layers):
                tie.attend(layer, t, q[0, layer], k[0, layer], v[0, layer], out)
        tiers = tie.tiers(0)
        kvd, hd = SMALL.kv_dim, SMALL.head_dim
        row = 2 * kvd * 4
        code_bytes = kvd * bits // 8
        value_groups = SMALL.n_kv_heads * math.ceil(hd / min(G, hd))
        group_bytes = 2 * G * code_bytes + 2 * kvd * 4 + 2 * G * value_groups * 4
        hot = S + W + tiers["staged"]
        expected = SMALL.n_layers * (hot * row + warm // G * group_bytes + tiers["cold_blocks"] * (row + 8))
        assert tie.memory_bytes() == expected
        assert tie.memory_bytes() < 2 * T * kvd * 4 * SMALL.n_layers / 4


# ---- kmeans -----------------------------------------------------------------------------------------
def clustered_example(budget, estimate=False):
    """1 layer, 1 head of dim 2; sink 0, window 13..14; the middle 1..12 cycles through three blobs."""
    one = ModelConfig(dim=2, hidden_dim=4, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=4, seq_len=32)
    km = bind(
        KMeans(clusters=3, budget=budget, sinks=1, window=2, iters=3, recluster=1000, seed=7, estimate=estimate), one
    )
    centres = np.array([[10.0, 0.0], [0.0, 10.0], [-10.0, 0.0]], dtype=np.float32)
    rng = np.random.default_rng(0)
    keys = [np.zeros(2, np.float32)] + [
        centres[(p - 1) % 3] + rng.normal(0, 0.1, 2).astype(np.float32) for p in range(1, 15)
    ]
    q = np.array([5.0, 0.0], dtype=np.float32)  # aligned with blob 0, orthogonal to 1, opposite to 2
    out = np.zeros(2, dtype=np.float32)
    for p in range(15):
        km.attend(0, p, q, keys[p], np.full(2, p, np.float32), out)
    return km, np.array(keys), out


def test_kmeans_assignments_on_three_blobs():
    km, keys, _ = clustered_example(budget=4)
    assert km.clustered(0)
    labels = km.assignments(0, 0)  # positions 1 .. 12
    assert labels.shape == (12,)
    for blob in range(3):
        members = labels[blob::3]
        assert (members == members[0]).all()
    assert len(set(labels.tolist())) == 3
    sizes = km.cluster_sizes(0, 0)
    assert sorted(sizes.tolist()) == [4, 4, 4]
    cent = km.centroids(0, 0)
    for c in range(3):
        np.testing.assert_allclose(cent[c], keys[1:13][labels == c].mean(0), rtol=1e-5, atol=1e-5)


def test_kmeans_budget_selection():
    # budget 4: the blob the query points at fills it; sinks and window always attended
    km, _, _ = clustered_example(budget=4)
    assert km.selected(0) == [0, 1, 4, 7, 10, 13, 14]
    # budget 5: one cluster is not enough, the next best (orthogonal blob 1) is taken whole
    km, _, _ = clustered_example(budget=5)
    assert km.selected(0) == [0, 1, 2, 4, 5, 7, 8, 10, 11, 13, 14]
    # budget >= the middle: everything, in order, no clustering needed
    km, _, _ = clustered_example(budget=12)
    assert km.selected(0) == list(range(15))
    assert not km.clustered(0)
    # estimate: the two clusters left out come back as one row each
    km, _, out = clustered_example(budget=4, estimate=True)
    assert km.estimated(0) == 2
    np.testing.assert_allclose(km.mean_values(0, 0)[km.assignments(0, 0)[1]], np.mean([2, 5, 8, 11]), rtol=1e-6)


def kmeans_reference(km, t, layer, q, k, v, S, W, budget, estimate, size_bias):
    M = max(0, t + 1 - S - W)
    expected = np.zeros(SMALL.q_dim)
    hd = SMALL.head_dim
    for h, qs, ks in heads():
        g = h // SMALL.kv_mul
        if M <= budget:
            positions, extra = list(range(t + 1)), []
        else:
            labels = km.assignments(layer, g)
            sizes = np.bincount(labels, minlength=km.clusters)
            np.testing.assert_array_equal(sizes, km.cluster_sizes(layer, g))
            cent = km.centroids(layer, g).astype(np.float64)
            mids = np.arange(S, S + M)
            for c in np.nonzero(sizes)[0]:  # centroids are the means of their members
                np.testing.assert_allclose(cent[c], k[mids[labels == c], layer, ks].mean(0), rtol=1e-4, atol=1e-4)
            score = {
                c: cent[c] @ q[t, layer, qs] / math.sqrt(hd) + (math.log(sizes[c]) if size_bias else 0.0)
                for c in np.nonzero(sizes)[0]
            }
            order = sorted(score, key=lambda c: (-score[c], c))
            chosen, taken = [], 0
            for c in order:
                if taken >= budget:
                    break
                chosen.append(c)
                taken += sizes[c]
            picked = sorted(int(p) for p in mids[np.isin(labels, chosen)])
            positions = list(range(min(t + 1, S))) + picked + list(range(max(S, t + 1 - W), t + 1))
            extra = (
                [
                    (cent[c], v[mids[labels == c], layer, ks].astype(np.float64).mean(0), math.log(sizes[c]))
                    for c in order
                    if c not in chosen
                ]
                if estimate
                else []
            )
            assert km.selected(h) == positions
        K = [k[p, layer, ks] for p in positions] + [e[0] for e in extra]
        V = [v[p, layer, ks] for p in positions] + [e[1] for e in extra]
        bias = [0.0] * len(positions) + [e[2] for e in extra]
        expected[qs] = ref_head(q[t, layer, qs], np.array(K), np.array(V), bias)
    return expected


@pytest.mark.parametrize(
    "C,budget,S,W,recluster,estimate,size_bias",
    [
        (4, 8, 2, 4, 16, False, True),
        (3, 5, 0, 3, 7, True, False),
        (6, 0, 1, 2, 1000, True, True),
    ],
)
def test_kmeans_matches_numpy_reference(C, budget, S, W, recluster, estimate, size_bias):
    T = 60
    q, k, v = random_qkv(T, seed=C + budget)
    km = bind(
        KMeans(
            clusters=C,
            budget=budget,
            sinks=S,
            window=W,
            iters=2,
            recluster=recluster,
            seed=1,
            estimate=estimate,
            size_bias=size_bias,
        )
    )

    def check(t, layer, out):
        expected = kmeans_reference(km, t, layer, q, k, v, S, W, budget, estimate, size_bias)
        np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)

    drive(km, q, k, v, check)
    assert km.clustered(0)


def test_kmeans_ledger_keeps_everything():
    km = bind(KMeans(clusters=4, budget=8, sinks=2, window=4))
    q, k, v = random_qkv(40, seed=0)
    drive(km, q, k, v)
    dense = 2 * SMALL.n_layers * 40 * SMALL.kv_dim * 4
    M = 40 - 6
    per_cluster = SMALL.head_dim * 4 + 4 + 8  # centroid, |centroid|^2, size
    assert km.memory_bytes() == dense + SMALL.n_layers * SMALL.n_kv_heads * (4 * per_cluster + M * 4)


# ---- all three --------------------------------------------------------------------------------------
SPECS = [
    "kmeans:clusters=5,budget=6,sinks=2,window=5,recluster=9,estimate,positions=128",
    "tiered:sinks=2,window=5,warm=8,group=4,block=3,cold_topk=2",
    "lattice:sinks=2,window=5,base=2,shift",
]


@pytest.mark.parametrize("spec", SPECS)
def test_same_results_for_any_thread_count_and_after_reset(spec, parallel_always):
    # parallel_always: these shapes are below the serial threshold, and a race between threads (kmeans
    # once shared one counter across its heads' loop) only shows on a real team
    q, k, v = random_qkv(90, seed=11)
    runs = []
    for threads in (1, 2, 3):
        plugin = bind(create_plugin(spec), threads=threads)
        runs.append(drive(plugin, q, k, v))
        if threads == 3:
            plugin.reset()
            runs.append(drive(plugin, q, k, v))
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)


@pytest.mark.parametrize("spec", SPECS)
def test_positions_must_come_in_order(spec):
    plugin = bind(create_plugin(spec))
    q, k, v = random_qkv(3)
    out = np.zeros(SMALL.q_dim, dtype=np.float32)
    plugin.attend(0, 0, q[0, 0], k[0, 0], v[0, 0], out)
    # one line for a user, like every other bad input (a PyllamaError), and still an IndexError
    with pytest.raises(PositionError, match="in order") as caught:
        plugin.attend(0, 2, q[1, 0], k[1, 0], v[1, 0], out)
    assert isinstance(caught.value, PyllamaError) and isinstance(caught.value, IndexError)


# ---- on stories260K ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    from pyllama.model import Model

    return Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"))


@pytest.mark.parametrize(
    "degenerate",
    [
        "kmeans:budget={n},positions={n}",
        "tiered:window={n}",
        "lattice:window={n}",
    ],
)
def test_degenerate_settings_are_causal_bit_for_bit(model, degenerate):
    # the whole standard probe, its long part (4x the context) included: causal gets a cache that long
    n = 4 * model.config.seq_len
    report = model.diff(f"causal:positions={n}", degenerate.format(n=n), probe="standard")
    assert report.n_positions > n
    assert not report.notes  # every position compared
    assert report.summary["max_abs_dlogit"] == 0.0
    assert report.exact


@pytest.mark.parametrize(
    "spec",
    [
        "kmeans:clusters=16,budget=32,window=32,recluster=64,estimate,positions={n}",
        "tiered:window=32,warm=64,bits=4,block=16,cold_topk=8",
        "lattice:window=32,base=4,levels=5",
    ],
)
def test_compressed_settings_run_the_long_probe(model, spec):
    n = 4 * model.config.seq_len
    report = model.diff(f"causal:positions={n}", spec.format(n=n), probe="long")
    s = report.summary
    assert report.n_positions == n
    assert not report.exact
    assert math.isfinite(s["mean_kl"]) and math.isfinite(s["max_kl"]) and s["mean_kl"] > 0
    assert math.isfinite(s["ppl_ratio"])
    assert s["top1_agreement"] > 0.5
    if spec.startswith("kmeans"):
        assert s["bytes_last_b"] > s["bytes_causal_last"]  # it saves compute, not memory
    else:
        assert s["bytes_last_b"] < s["bytes_causal_last"] / 4


def test_lattice_generates_far_past_the_context_in_log_memory(model):
    steps = 4 * model.config.seq_len
    out = model.generate(
        "Once upon a time", steps=steps, temperature=0.0, attention="lattice", ignore_eos=True, threads=1
    )
    assert out.steps == steps and not out.notices
    lat = Lattice()  # the defaults
    n_out = steps - lat.sinks - lat.window
    row = 2 * model.config.kv_dim * 4
    buckets = bin(n_out // lat.base).count("1")
    exact = lat.sinks + lat.window + n_out % lat.base
    assert out.memory_bytes == model.config.n_layers * (exact * row + buckets * (row + 8))
    assert out.memory_bytes < steps * row * model.config.n_layers / 10
