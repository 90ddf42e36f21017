"""``tiered``: hot exact rows, a warm quantised tier and cold block summaries.

Tokens age through three tiers, each a published idea:

* **hot** — the first ``sinks`` positions and the last ``window`` ones, exact float32
  (StreamingLLM's sinks + window, Xiao et al. 2023).
* **warm** — the ``warm`` tokens just older than the window, quantised to ``bits`` = 8 or 4 as
  KIVI does (Liu et al. 2024, arXiv 2402.02750): keys *per channel* over groups of ``group``
  tokens, values *per token* over groups of ``group`` channels (never crossing a head), each group
  with a float32 scale and zero point (asymmetric min/max: ``code = round((x - min) / scale)``,
  ``scale = (max - min) / (2^bits - 1)``, so the error of an element is at most ``scale / 2``).
  Keys are quantised per channel, so a key group needs ``group`` tokens: tokens leaving the window
  wait, exact, in a staging group (KIVI's full-precision residual) until it is full. 4-bit codes are
  packed two per byte.
* **cold** — older tokens merged into blocks of ``block`` tokens, each stored as its mean key, mean
  value and count and attended as one row with a ``log(count)`` bias (Compressive Transformer, Rae et
  al. 2020; InfLLM's blocks, Xiao et al. 2024, arXiv 2402.04617; ToMe's proportional attention,
  Bolya et al. 2023). A token reaches cold when its warm group is evicted; its contribution to the
  block mean is its dequantised key and value (the exact ones when ``warm`` = 0). The youngest block
  is attended while it fills. ``cold_topk`` > 0 attends only the k cold blocks whose
  ``q·mean/sqrt(d) + log(count)`` is largest, per query head.

The ledger is the real bytes of the representation: hot float32 rows (staging included), warm codes
with their scales and zero points, and cold summaries (two float32 rows and an int64 count each).
Cold memory grows by one summary per ``block`` tokens; its capacity is ``positions`` (default 16x
the model's context), allocated once in ``init`` like every other buffer.

Every step attends, per query head, with the shared routine over sinks, cold blocks (oldest first),
warm tokens (dequantised once per KV head into a scratch buffer), staged tokens and the window:
ascending position order. With ``sinks + window`` >= the sequence length nothing leaves the hot
tier and this is ``causal`` bit for bit.
"""

from cython.parallel cimport prange
from libc.math cimport floorf, logf, sqrtf
from libc.stdint cimport uint8_t
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention, kept_span, position_rows
from pyllama.kernels.matvec cimport dot_f32

from pyllama.attention.memory import gather_bytes, require_memory
from pyllama.attention.spec import Knob

COLD_CONTEXTS = 16  # positions=0: room for this many times the model's context


# ---- quantisation (KIVI-style asymmetric min/max) -------------------------------------------------
cdef inline int quant_code(float x, float zero, float scale, int qmax) noexcept nogil:
    cdef float c
    if not scale > 0.0:
        return 0
    c = floorf((x - zero) / scale + <float>0.5)
    if c < 0.0:
        return 0
    if c > qmax:
        return qmax
    return <int>c


cdef inline float dequant(int code, float zero, float scale) noexcept nogil:
    return <float>code * scale + zero


cdef inline void set_code(uint8_t* row, Py_ssize_t i, int code, int bits) noexcept nogil:
    if bits == 8:
        row[i] = <uint8_t>code
    elif i & 1:
        row[i >> 1] = <uint8_t>((row[i >> 1] & 0x0F) | (code << 4))
    else:
        row[i >> 1] = <uint8_t>((row[i >> 1] & 0xF0) | code)


cdef inline int get_code(const uint8_t* row, Py_ssize_t i, int bits) noexcept nogil:
    if bits == 8:
        return row[i]
    return (row[i >> 1] >> (4 * (i & 1))) & 0x0F


cdef void quant_range(const float* x, Py_ssize_t n, Py_ssize_t stride, int qmax, float* zero,
                      float* scale) noexcept nogil:
    """Zero point and scale of the ``n`` values ``x[0], x[stride], ...``."""
    cdef float mn = x[0], mx = x[0], a
    cdef Py_ssize_t i
    for i in range(1, n):
        a = x[i * stride]
        if a < mn:
            mn = a
        if a > mx:
            mx = a
    zero[0] = mn
    scale[0] = (mx - mn) / <float>qmax


def quantize(x, int bits):
    """KIVI-style quantisation with the plugin's arithmetic: each row of ``x`` (float32 [n, m]) is
    one group. Returns ``(codes uint8 [n, m], scale float32 [n], zero float32 [n])``; the plugin
    quantises key channels (a row = one channel over ``group`` tokens) and value groups this way."""
    if bits not in (4, 8):
        raise ValueError(f"quantize: bits must be 4 or 8, got {bits}")
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef Py_ssize_t n = xv.shape[0], m = xv.shape[1], r, c
    if m < 1:
        raise ValueError("quantize: groups must hold at least one value")
    codes = np.zeros((n, m), dtype=np.uint8)
    scale = np.zeros(n, dtype=np.float32)
    zero = np.zeros(n, dtype=np.float32)
    cdef uint8_t[:, ::1] cv = codes
    cdef float[::1] sv = scale
    cdef float[::1] zv = zero
    cdef int qmax = (1 << bits) - 1
    for r in range(n):
        quant_range(&xv[r, 0], m, 1, qmax, &zv[r], &sv[r])
        for c in range(m):
            cv[r, c] = quant_code(xv[r, c], zv[r], sv[r], qmax)
    return codes, scale, zero


def dequantize(codes, scale, zero):
    """The inverse of :func:`quantize`: float32 [n, m] = code * scale + zero, row by row."""
    cdef const uint8_t[:, ::1] cv = np.ascontiguousarray(codes, dtype=np.uint8)
    cdef const float[::1] sv = np.ascontiguousarray(scale, dtype=np.float32)
    cdef const float[::1] zv = np.ascontiguousarray(zero, dtype=np.float32)
    cdef Py_ssize_t n = cv.shape[0], m = cv.shape[1], r, c
    if sv.shape[0] != n or zv.shape[0] != n:
        raise ValueError("dequantize: one scale and one zero point per row")
    out = np.zeros((n, m), dtype=np.float32)
    cdef float[:, ::1] ov = out
    for r in range(n):
        for c in range(m):
            ov[r, c] = dequant(cv[r, c], zv[r], sv[r])
    return out


def pack4(codes):
    """4-bit codes (uint8 [n, m], values < 16) packed two per byte as the plugin stores them:
    element 2i in the low nibble of byte i, element 2i+1 in the high nibble."""
    cdef const uint8_t[:, ::1] cv = np.ascontiguousarray(codes, dtype=np.uint8)
    cdef Py_ssize_t n = cv.shape[0], m = cv.shape[1], r, c
    out = np.zeros((n, (m + 1) // 2), dtype=np.uint8)
    cdef uint8_t[:, ::1] ov = out
    for r in range(n):
        for c in range(m):
            set_code(&ov[r, 0], c, cv[r, c] & 0x0F, 4)
    return out


def unpack4(packed, Py_ssize_t m):
    """The inverse of :func:`pack4` for rows of ``m`` codes."""
    cdef const uint8_t[:, ::1] pv = np.ascontiguousarray(packed, dtype=np.uint8)
    cdef Py_ssize_t n = pv.shape[0], r, c
    if pv.shape[1] != (m + 1) // 2:
        raise ValueError(f"unpack4: rows of {m} codes take {(m + 1) // 2} bytes, got {pv.shape[1]}")
    out = np.zeros((n, m), dtype=np.uint8)
    cdef uint8_t[:, ::1] ov = out
    for r in range(n):
        for c in range(m):
            ov[r, c] = get_code(&pv[r, 0], c, 4)
    return out


cdef class Tiered(GatherAttention):
    name = "tiered"
    description = ("hot exact sinks + window, warm KIVI-quantised tokens (int8/int4), cold block "
                   "summaries with a log(count) bias")
    knobs = (
        Knob("sinks", int, 4, "first positions always kept exact (attention sinks)", min=0),
        Knob("window", int, 64, "most recent positions kept exact, the current one included", min=1),
        Knob("warm", int, 128, "tokens in the quantised tier (a multiple of group; 0 = none)", min=0),
        Knob("bits", int, 4, "bits per warm code: 4 or 8", min=4, max=8),
        Knob("group", int, 32, "quantisation group: tokens per key scale, channels per value scale", min=1),
        Knob("block", int, 32, "tokens merged into one cold summary", min=1),
        Knob("cold_topk", int, 0, "attend only the k best cold blocks per query head; 0 = all", min=0),
        Knob("positions", int, 0, "positions it can hold (cold capacity); 0 = 16x the model's context", min=0),
    )

    cdef object _cold_k, _cold_v, _cold_n, _counts  # also read from Python (inspection, ledger)
    cdef float* sink_k       # [n_layers, sinks, kv_dim]
    cdef float* sink_v
    cdef float* ring_k       # [n_layers, window, kv_dim]: position t >= sinks in row (t - sinks) % window
    cdef float* ring_v
    cdef float* stage_k      # [n_layers, group, kv_dim]: exact tokens waiting to be quantised as a group
    cdef float* stage_v
    cdef uint8_t* kcode      # [n_layers, n_groups, group, row_bytes] warm ring of quantised groups
    cdef uint8_t* vcode
    cdef float* kscale       # [n_layers, n_groups, kv_dim]: per channel, over the group's tokens
    cdef float* kzero
    cdef float* vscale       # [n_layers, n_groups, group, n_vgroups]: per token, over channel groups
    cdef float* vzero
    cdef float* cold_k       # [n_layers, n_blocks, kv_dim] block means
    cdef float* cold_v
    cdef long long* cold_n   # [n_layers, n_blocks] tokens in each block
    cdef long long* length   # [n_layers] positions seen; then n_stage, w_first, w_count, n_closed
    cdef long long* n_stage
    cdef long long* w_first  # ring slot of the oldest warm group
    cdef long long* w_count  # warm groups held
    cdef long long* n_closed  # full cold blocks; block n_closed is the one filling
    cdef float* tmp          # [2, kv_dim] a dequantised token on its way to cold
    cdef float* deq_k        # [n_kv_heads, warm, head_dim] this step's dequantised warm tokens
    cdef float* deq_v
    cdef float* bias         # [n_heads, rows]
    cdef float* cscore       # [n_heads, n_blocks] cold block scores (cold_topk)
    cdef uint8_t* cmark      # [n_heads, n_blocks] chosen cold blocks (cold_topk)
    cdef readonly long long sinks, window, warm, group, block, cold_topk, positions
    cdef readonly int bits
    cdef int qmax
    cdef long long n_groups, n_blocks, row_bytes
    cdef int vg, n_vgh, n_vg  # channels per value group, value groups per head and per token

    def __init__(self, sinks: int = 4, window: int = 64, warm: int = 128, bits: int = 4, group: int = 32,
                 block: int = 32, cold_topk: int = 0, positions: int = 0):
        if sinks < 0 or window < 1 or warm < 0 or group < 1 or block < 1 or cold_topk < 0 or positions < 0:
            raise ValueError(f"tiered: need sinks >= 0, window >= 1, warm >= 0, group >= 1, block >= 1, "
                             f"cold_topk >= 0, positions >= 0; got {sinks}, {window}, {warm}, {group}, {block}, "
                             f"{cold_topk}, {positions}")
        if bits not in (4, 8):
            raise ValueError(f"tiered: bits must be 4 or 8, got {bits}")
        if warm % group:
            raise ValueError(f"tiered: warm ({warm}) must be a multiple of group ({group}): keys are quantised "
                             "per channel over whole groups of tokens")
        self.sinks = sinks
        self.window = window
        self.warm = warm
        self.bits = bits
        self.qmax = (1 << bits) - 1
        self.group = group
        self.block = block
        self.cold_topk = cold_topk
        self.positions = positions
        if positions > 0:
            self.max_positions = positions

    def planned_bytes(self, config):
        """What init allocates (Python integers: no overflow for any knob value)."""
        S, W, G, P, warm = int(self.sinks), int(self.window), int(self.group), int(self.max_positions), int(self.warm)
        L, KVH, H, hd, kv = config.n_layers, config.n_kv_heads, config.n_heads, config.head_dim, config.kv_dim
        if self.positions == 0:
            P = COLD_CONTEXTS * config.seq_len
        NG, NB = max(warm // G, 1), (P + int(self.block) - 1) // int(self.block) + 1
        row_bytes = kv if self.bits == 8 else (kv + 1) // 2
        n_vg = KVH * -(-hd // min(G, hd))
        rows = S + NB + warm + G + W
        cold = 2 * L * NB * kv * 4 + L * NB * 8 + 5 * L * 8
        hot = 2 * L * (max(S, 1) + W + G) * kv * 4
        warm_tier = 2 * L * NG * G * row_bytes + 2 * L * NG * kv * 4 + 2 * L * NG * G * n_vg * 4
        scratch = 2 * kv * 4 + 2 * KVH * max(warm, 1) * hd * 4 + H * rows * 4 + H * NB * (4 + 1)
        return gather_bytes(config, rows) + cold + hot + warm_tier + scratch

    def init(self, config, pool):
        if self.positions == 0:
            self.max_positions = COLD_CONTEXTS * config.seq_len
        require_memory("tiered", f"positions={int(self.max_positions):,}, sinks={int(self.sinks):,}, "
                       f"window={int(self.window):,}, warm={int(self.warm):,}", self.planned_bytes(config))
        cdef long long S = self.sinks, W = self.window, G = self.group, P = self.max_positions
        L, kv, hd = config.n_layers, config.kv_dim, config.head_dim
        self.n_groups = self.warm // G
        self.n_blocks = (P + self.block - 1) // self.block + 1
        self.row_bytes = kv if self.bits == 8 else (kv + 1) // 2
        self.vg = min(G, hd)
        self.n_vgh = (hd + self.vg - 1) // self.vg
        self.n_vg = config.n_kv_heads * self.n_vgh
        self.init_gather(config, S + self.n_blocks + self.warm + G + W)
        NG, NB, R, H = max(self.n_groups, 1), self.n_blocks, self.rows, config.n_heads
        self._cold_k = np.zeros((L, NB, kv), dtype=np.float32)
        self._cold_v = np.zeros((L, NB, kv), dtype=np.float32)
        self._cold_n = np.zeros((L, NB), dtype=np.int64)
        self._counts = np.zeros((5, L), dtype=np.int64)
        self.sink_k = <float*>self.own(np.zeros((L, max(S, 1), kv), dtype=np.float32))
        self.sink_v = <float*>self.own(np.zeros((L, max(S, 1), kv), dtype=np.float32))
        self.ring_k = <float*>self.own(np.zeros((L, W, kv), dtype=np.float32))
        self.ring_v = <float*>self.own(np.zeros((L, W, kv), dtype=np.float32))
        self.stage_k = <float*>self.own(np.zeros((L, G, kv), dtype=np.float32))
        self.stage_v = <float*>self.own(np.zeros((L, G, kv), dtype=np.float32))
        self.kcode = <uint8_t*>self.own(np.zeros((L, NG, G, self.row_bytes), dtype=np.uint8))
        self.vcode = <uint8_t*>self.own(np.zeros((L, NG, G, self.row_bytes), dtype=np.uint8))
        self.kscale = <float*>self.own(np.zeros((L, NG, kv), dtype=np.float32))
        self.kzero = <float*>self.own(np.zeros((L, NG, kv), dtype=np.float32))
        self.vscale = <float*>self.own(np.zeros((L, NG, G, self.n_vg), dtype=np.float32))
        self.vzero = <float*>self.own(np.zeros((L, NG, G, self.n_vg), dtype=np.float32))
        self.cold_k = <float*>self.own(self._cold_k)
        self.cold_v = <float*>self.own(self._cold_v)
        self.cold_n = <long long*>self.own(self._cold_n)
        self.length = <long long*>self.own(self._counts)
        self.n_stage = self.length + self.n_layers
        self.w_first = self.length + 2 * self.n_layers
        self.w_count = self.length + 3 * self.n_layers
        self.n_closed = self.length + 4 * self.n_layers
        self.tmp = <float*>self.own(np.zeros((2, kv), dtype=np.float32))
        self.deq_k = <float*>self.own(np.zeros((config.n_kv_heads, max(self.warm, 1), hd), dtype=np.float32))
        self.deq_v = <float*>self.own(np.zeros((config.n_kv_heads, max(self.warm, 1), hd), dtype=np.float32))
        self.bias = <float*>self.own(np.zeros((H, R), dtype=np.float32))
        self.cscore = <float*>self.own(np.zeros((H, NB), dtype=np.float32))
        self.cmark = <uint8_t*>self.own(np.zeros((H, NB), dtype=np.uint8))

    def reset(self):
        if self._counts is not None:
            self._counts[...] = 0
            self._cold_n[...] = 0

    def memory_bytes(self):
        # hot float32 rows (sinks, window, staging) + warm codes, scales and zero points + cold summaries
        if self._counts is None:
            return 0
        kv = self.kv_dim
        row = 2 * kv * 4
        group_bytes = 2 * self.group * self.row_bytes + 2 * kv * 4 + 2 * self.group * self.n_vg * 4
        total = 0
        for layer in range(self.n_layers):
            t, staged, _, groups, closed = (int(x) for x in self._counts[:, layer])
            hot = min(t, self.sinks) + min(max(t - self.sinks, 0), self.window) + staged
            cold = closed + (1 if self._cold_n[layer, closed] > 0 else 0)
            total += hot * row + groups * group_bytes + cold * (row + 8)
        return total

    # ---- introspection (tests, experiments) ---------------------------------------------------------
    def tiers(self, int layer):
        """How ``layer``'s aged tokens are held right now: exact hot rows, staged, warm and cold."""
        if self._counts is None:
            raise RuntimeError("tiered: not initialised (bind it to a model or call init first)")
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"tiered: layer {layer} out of range")
        t, staged, _, groups, closed = (int(x) for x in self._counts[:, layer])
        n_cold = closed + (1 if self._cold_n[layer, closed] > 0 else 0)
        counts = [int(x) for x in self._cold_n[layer, :n_cold]]
        return {
            "positions": t,
            "sinks": min(t, self.sinks),
            "window": min(max(t - self.sinks, 0), self.window),
            "staged": staged,
            "warm": groups * self.group,
            "cold_blocks": n_cold,
            "cold_tokens": sum(counts),
            "cold_counts": counts,
        }

    def cold_summaries(self, int layer):
        """``(mean keys [n, kv_dim], mean values [n, kv_dim], counts [n])`` of ``layer``'s cold blocks."""
        n = self.tiers(layer)["cold_blocks"]
        return (self._cold_k[layer, :n].copy(), self._cold_v[layer, :n].copy(), self._cold_n[layer, :n].copy())

    # ---- the step -----------------------------------------------------------------------------------
    cdef void _dequant_token(self, int layer, long long slot, long long t, Py_ssize_t c0, Py_ssize_t c1,
                             float* key, float* value) noexcept nogil:
        """Channels c0 .. c1-1 (whole heads) of token ``t`` of warm group ``slot``: key[c - c0], value[c - c0]."""
        cdef long long G = self.group
        cdef long long gi = layer * self.n_groups + slot
        cdef const uint8_t* krow = self.kcode + (gi * G + t) * self.row_bytes
        cdef const uint8_t* vrow = self.vcode + (gi * G + t) * self.row_bytes
        cdef const float* ks = self.kscale + gi * self.kv_dim
        cdef const float* kz = self.kzero + gi * self.kv_dim
        cdef const float* vs = self.vscale + (gi * G + t) * self.n_vg
        cdef const float* vz = self.vzero + (gi * G + t) * self.n_vg
        cdef Py_ssize_t c, g0, g1, j, hd = self.head_dim
        cdef float s, z
        # codes first (the bit width decided once), then code * scale + zero
        if self.bits == 8:
            for c in range(c0, c1):
                key[c - c0] = <float>krow[c]
                value[c - c0] = <float>vrow[c]
        else:
            for c in range(c0, c1):
                key[c - c0] = <float>((krow[c >> 1] >> (4 * (c & 1))) & 0x0F)
                value[c - c0] = <float>((vrow[c >> 1] >> (4 * (c & 1))) & 0x0F)
        for c in range(c0, c1):  # keys: a scale and zero point per channel
            key[c - c0] = key[c - c0] * ks[c] + kz[c]
        g0 = c0
        while g0 < c1:  # values: one scale and zero point per group of channels inside a head
            g1 = g0 + self.vg
            if g1 > (g0 // hd + 1) * hd:
                g1 = (g0 // hd + 1) * hd
            j = (g0 // hd) * self.n_vgh + (g0 % hd) // self.vg
            s = vs[j]
            z = vz[j]
            for c in range(g0, g1):
                value[c - c0] = value[c - c0] * s + z
            g0 = g1

    cdef void _cold_add(self, int layer, const float* key, const float* value) noexcept nogil:
        """Merge one token into the filling cold block (running means); close it when full."""
        cdef Py_ssize_t kv = self.kv_dim, i
        cdef long long b = self.n_closed[layer]
        cdef long long idx = layer * self.n_blocks + b
        cdef float* mk = self.cold_k + idx * kv
        cdef float* mv = self.cold_v + idx * kv
        cdef long long n = self.cold_n[idx] + 1
        cdef float fn = <float>n
        if n == 1:
            memcpy(mk, key, kv * sizeof(float))
            memcpy(mv, value, kv * sizeof(float))
        else:
            for i in range(kv):
                mk[i] = mk[i] + (key[i] - mk[i]) / fn
                mv[i] = mv[i] + (value[i] - mv[i]) / fn
        self.cold_n[idx] = n
        if n == self.block:
            self.n_closed[layer] = b + 1
            if b + 1 < self.n_blocks:
                self.cold_n[idx + 1] = 0

    cdef void _quantize_stage(self, int layer, long long slot) noexcept nogil:
        """Quantise the full staging group of ``layer`` into warm ring slot ``slot``."""
        cdef long long G = self.group
        cdef long long gi = layer * self.n_groups + slot
        cdef Py_ssize_t kv = self.kv_dim, c, t, j, c0, c1
        cdef const float* sk = self.stage_k + layer * G * kv
        cdef const float* sv = self.stage_v + layer * G * kv
        cdef uint8_t* kcodes = self.kcode + gi * G * self.row_bytes
        cdef uint8_t* vcodes = self.vcode + gi * G * self.row_bytes
        cdef float* ks = self.kscale + gi * kv
        cdef float* kz = self.kzero + gi * kv
        cdef float* vs
        cdef float* vz
        for c in range(kv):  # keys: per channel over the group's tokens
            quant_range(sk + c, G, kv, self.qmax, &kz[c], &ks[c])
            for t in range(G):
                set_code(kcodes + t * self.row_bytes, c, quant_code(sk[t * kv + c], kz[c], ks[c], self.qmax),
                         self.bits)
        for t in range(G):  # values: per token over groups of channels within a head
            vs = self.vscale + (gi * G + t) * self.n_vg
            vz = self.vzero + (gi * G + t) * self.n_vg
            for j in range(self.n_vg):
                c0 = (j // self.n_vgh) * self.head_dim + (j % self.n_vgh) * self.vg
                c1 = c0 + self.vg
                if c1 > (j // self.n_vgh + 1) * self.head_dim:
                    c1 = (j // self.n_vgh + 1) * self.head_dim
                quant_range(sv + t * kv + c0, c1 - c0, 1, self.qmax, &vz[j], &vs[j])
                for c in range(c0, c1):
                    set_code(vcodes + t * self.row_bytes, c, quant_code(sv[t * kv + c], vz[j], vs[j], self.qmax),
                             self.bits)

    cdef void _leave_window(self, int layer, const float* key, const float* value) noexcept nogil:
        """One token leaves the window: into staging (or straight to cold when there is no warm tier)."""
        cdef Py_ssize_t kv = self.kv_dim
        cdef long long G = self.group, NG = self.n_groups, t, slot
        if NG == 0:
            self._cold_add(layer, key, value)
            return
        cdef long long ns = self.n_stage[layer]
        memcpy(self.stage_k + (layer * G + ns) * kv, key, kv * sizeof(float))
        memcpy(self.stage_v + (layer * G + ns) * kv, value, kv * sizeof(float))
        ns += 1
        self.n_stage[layer] = ns
        if ns < G:
            return
        if self.w_count[layer] == NG:  # the oldest warm group goes cold, token by token
            slot = self.w_first[layer]
            for t in range(G):
                self._dequant_token(layer, slot, t, 0, kv, self.tmp, self.tmp + kv)
                self._cold_add(layer, self.tmp, self.tmp + kv)
            self.w_first[layer] = (slot + 1) % NG
            self.w_count[layer] -= 1
        self._quantize_stage(layer, (self.w_first[layer] + self.w_count[layer]) % NG)
        self.w_count[layer] += 1
        self.n_stage[layer] = 0

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.check_in_order(layer, pos, self.length[layer])
        cdef long long S = self.sinks, W = self.window, G = self.group, R = self.rows, NB = self.n_blocks
        cdef Py_ssize_t kv = self.kv_dim, hd = self.head_dim
        cdef float* key_row
        cdef float* value_row
        if position_rows(pos, layer, S, W, kv, self.sink_k, self.sink_v, self.ring_k, self.ring_v,
                         &key_row, &value_row):
            self._leave_window(layer, key_row, value_row)  # pos - W leaves: pos overwrites its row
        memcpy(key_row, k, kv * sizeof(float))
        memcpy(value_row, v, kv * sizeof(float))
        self.length[layer] = pos + 1

        cdef long long n_sink, ring_start, n_ring
        kept_span(pos, S, W, &n_sink, &ring_start, &n_ring)
        cdef long long ns = self.n_stage[layer]
        cdef long long n_warm = self.w_count[layer] * G
        cdef long long n_closed = self.n_closed[layer]
        cdef long long n_cold = n_closed + (1 if self.cold_n[layer * NB + n_closed] > 0 else 0)
        cdef long long n_cold_att = n_cold if self.cold_topk == 0 or n_cold < self.cold_topk else self.cold_topk
        cdef long long n = n_sink + n_cold_att + n_warm + ns + n_ring
        cdef long long topk = self.cold_topk if n_cold > n_cold_att else 0
        cdef float inv_scale = 1.0 / sqrtf(<float>hd)

        # the warm tokens, dequantised once per KV head, oldest first
        cdef int g, h, gh
        cdef long long r
        if n_warm > 0:
            for g in prange(self.n_kv_heads, schedule="static",
                            num_threads=threads_for(self.n_threads, n_warm * self.kv_dim)):
                for r in range(n_warm):
                    self._dequant_token(layer, (self.w_first[layer] + r // G) % self.n_groups, r % G,
                                        g * hd, (g + 1) * hd, self.deq_k + (g * self.warm + r) * hd,
                                        self.deq_v + (g * self.warm + r) * hd)

        cdef long long i, j, b, best, _pick
        cdef Py_ssize_t off
        cdef const float** kp
        cdef const float** vp
        cdef float* bias
        cdef float* cs
        cdef uint8_t* mark
        cdef const float* qh
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.n_heads * hd)):
            gh = h // self.kv_mul
            off = gh * hd
            qh = q + h * hd
            kp = self.kptr + h * R
            vp = self.vptr + h * R
            bias = self.bias + h * R
            for i in range(n_sink):
                kp[i] = self.sink_k + (layer * S + i) * kv + off
                vp[i] = self.sink_v + (layer * S + i) * kv + off
                bias[i] = 0.0
            j = n_sink
            mark = self.cmark + h * NB
            if topk > 0:  # the k cold blocks with the highest q·mean/sqrt(d) + log(count)
                cs = self.cscore + h * NB
                for b in range(n_cold):
                    cs[b] = (dot_f32(qh, self.cold_k + (layer * NB + b) * kv + off, hd) * inv_scale
                             + logf(<float>self.cold_n[layer * NB + b]))
                    mark[b] = 0
                for _pick in range(topk):
                    best = -1
                    for b in range(n_cold):
                        if mark[b] == 0 and (best < 0 or cs[b] > cs[best]):
                            best = b
                    mark[best] = 1
            for b in range(n_cold):
                if topk > 0 and mark[b] == 0:
                    continue
                kp[j] = self.cold_k + (layer * NB + b) * kv + off
                vp[j] = self.cold_v + (layer * NB + b) * kv + off
                bias[j] = logf(<float>self.cold_n[layer * NB + b])
                j = j + 1
            for i in range(n_warm):
                kp[j + i] = self.deq_k + (gh * self.warm + i) * hd
                vp[j + i] = self.deq_v + (gh * self.warm + i) * hd
                bias[j + i] = 0.0
            j = j + n_warm
            for i in range(ns):
                kp[j + i] = self.stage_k + (layer * G + i) * kv + off
                vp[j + i] = self.stage_v + (layer * G + i) * kv + off
                bias[j + i] = 0.0
            j = j + ns
            for i in range(n_ring):  # ascending positions ring_start .. pos
                kp[j + i] = self.ring_k + (layer * W + (ring_start + i - S) % W) * kv + off
                vp[j + i] = self.ring_v + (layer * W + (ring_start + i - S) % W) * kv + off
                bias[j + i] = 0.0
            self.attend_gathered(h, q, bias if n_cold_att > 0 else NULL, n, out)
        return 0
