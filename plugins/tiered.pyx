"""``tiered``: hot exact rows, a warm quantised tier and cold block summaries.

Tokens age through three tiers, each a published idea:

* **hot** — the first ``sinks`` positions and the last ``window`` ones, exact float32
  (StreamingLLM's sinks + window, Xiao et al. 2023).
* **warm** — the ``warm`` tokens just older than the window, quantised to ``bits`` = 8 or 4 as
  KIVI does (Liu et al. 2024, arXiv 2402.02750): keys *per channel* over groups of ``group``
  tokens, values *per token* over groups of ``group`` channels (never crossing a head), each group
  with a float32 scale and zero point (asymmetric min/max, ``pyllama.attention.quant``: the error
  of an element is at most half its scale).
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

The hot rows are the sinks + window layout of ``pyllama.attention.window``; a token leaving the
window reaches ``leave_window``. Every step attends, per query head, with the shared routine over
sinks, cold blocks (oldest first), warm tokens (dequantised once per KV head into a scratch
buffer), staged tokens and the window: ascending position order. With ``sinks + window`` >= the
sequence length nothing leaves the hot tier and this is ``causal`` bit for bit.
"""

from cython.parallel cimport prange
from libc.math cimport logf, sqrtf
from libc.stdint cimport uint8_t
from libc.string cimport memcpy

import numpy as np

from pyllama.attention.base cimport threads_for
from pyllama.attention.gather cimport GatherAttention, take_rows
from pyllama.attention.quant cimport KiviLayout, dequantize_token, quantize_group
from pyllama.attention.window cimport WindowAttention, kept_span
from pyllama.kernels.matvec cimport dot_f32

from pyllama.attention.memory import require_memory
from pyllama.attention.quant import dequantize, pack4, quantize, unpack4
from pyllama.attention.spec import Knob, check_knobs
from pyllama.attention.window import sink_window_knobs
from pyllama.errors import PluginError

__all__ = ["COLD_CONTEXTS", "Tiered", "dequantize", "pack4", "quantize", "unpack4"]  # the quantisation on numpy

COLD_CONTEXTS = 16  # positions=0: room for this many times the model's context


cdef class Tiered(WindowAttention):
    name = "tiered"
    description = ("hot exact sinks + window, warm KIVI-quantised tokens (int8/int4), cold block "
                   "summaries with a log(count) bias")
    holds = "summaries"  # held_positions: every position seen (exact, or in a quantised tier or a summary)
    knobs = (
        *sink_window_knobs(4, 64, "kept exact"),
        Knob("warm", int, 128, "tokens in the quantised tier (a multiple of group; 0 = none)", min=0),
        Knob("bits", int, 4, "bits per warm code: 4 or 8", min=4, max=8),
        Knob("group", int, 32, "quantisation group: tokens per key scale, channels per value scale", min=1),
        Knob("block", int, 32, "tokens merged into one cold summary", min=1),
        Knob("cold_topk", int, 0, "attend only the k best cold blocks per query head; 0 = all", min=0),
        Knob("positions", int, 0, "positions it can hold (cold capacity); 0 = 16x the model's context", min=0),
    )

    cdef object _cold_k, _cold_v, _cold_n  # also read from Python (inspection, ledger)
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
    cdef long long* n_stage  # [n_layers] the counters' rows 1 .. 4 (row 0: positions seen)
    cdef long long* w_first  # ring slot of the oldest warm group
    cdef long long* w_count  # warm groups held
    cdef long long* n_closed  # full cold blocks; block n_closed is the one filling
    cdef float* tmp          # [2, kv_dim] a dequantised token on its way to cold
    cdef float* deq_k        # [n_kv_heads, warm, head_dim] this step's dequantised warm tokens
    cdef float* deq_v
    cdef float* bias         # [n_heads, rows]
    cdef float* cscore       # [n_heads, n_blocks] cold block scores (cold_topk)
    cdef uint8_t* cmark      # [n_heads, n_blocks] chosen cold blocks (cold_topk)
    cdef readonly long long warm, group, block, cold_topk, positions
    cdef readonly int bits
    cdef int qmax
    cdef long long n_groups, n_blocks, row_bytes
    cdef int vg, n_vgh, n_vg  # channels per value group, value groups per head and per token
    cdef KiviLayout kivi      # the same facts for pyllama.attention.quant

    def __init__(self, sinks: int = 4, window: int = 64, warm: int = 128, bits: int = 4, group: int = 32,
                 block: int = 32, cold_topk: int = 0, positions: int = 0):
        check_knobs(self, sinks=sinks, window=window, warm=warm, bits=bits, group=group, block=block,
                    cold_topk=cold_topk, positions=positions)
        if bits not in (4, 8):
            raise PluginError(f"tiered: bits must be 4 or 8, got {bits}")
        if warm % group:
            raise PluginError(f"tiered: warm ({warm}) must be a multiple of group ({group}): keys are quantised "
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
        cold = 2 * L * NB * kv * 4 + L * NB * 8
        staging = 2 * L * G * kv * 4
        warm_tier = 2 * L * NG * G * row_bytes + 2 * L * NG * kv * 4 + 2 * L * NG * G * n_vg * 4
        scratch = 2 * kv * 4 + 2 * KVH * max(warm, 1) * hd * 4 + H * rows * 4 + H * NB * (4 + 1)
        return self.window_bytes(config, rows, 5, 0) + cold + staging + warm_tier + scratch

    def init(self, config, pool):
        if self.positions == 0:
            self.max_positions = COLD_CONTEXTS * config.seq_len
        require_memory("tiered", f"positions={int(self.max_positions):,}, sinks={int(self.sinks):,}, "
                       f"window={int(self.window):,}, warm={int(self.warm):,}", self.planned_bytes(config))
        cdef long long G = self.group, P = self.max_positions
        L, kv, hd = config.n_layers, config.kv_dim, config.head_dim
        self.n_groups = self.warm // G
        self.n_blocks = (P + self.block - 1) // self.block + 1
        self.row_bytes = kv if self.bits == 8 else (kv + 1) // 2
        self.vg = min(G, hd)
        self.n_vgh = (hd + self.vg - 1) // self.vg
        self.n_vg = config.n_kv_heads * self.n_vgh
        self.kivi.bits, self.kivi.qmax, self.kivi.group = self.bits, self.qmax, G
        self.kivi.kv_dim, self.kivi.head_dim, self.kivi.row_bytes = kv, hd, self.row_bytes
        self.kivi.vg, self.kivi.n_vgh, self.kivi.n_vg = self.vg, self.n_vgh, self.n_vg
        self.init_window(config, self.sinks + self.n_blocks + self.warm + G + self.window, 5, 0)
        self.n_stage = self.length + self.n_layers
        self.w_first = self.length + 2 * self.n_layers
        self.w_count = self.length + 3 * self.n_layers
        self.n_closed = self.length + 4 * self.n_layers
        NG, NB, R, H = max(self.n_groups, 1), self.n_blocks, self.rows, config.n_heads
        self._cold_k = np.zeros((L, NB, kv), dtype=np.float32)
        self._cold_v = np.zeros((L, NB, kv), dtype=np.float32)
        self._cold_n = np.zeros((L, NB), dtype=np.int64)
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
        self.tmp = <float*>self.own(np.zeros((2, kv), dtype=np.float32))
        self.deq_k = <float*>self.own(np.zeros((config.n_kv_heads, max(self.warm, 1), hd), dtype=np.float32))
        self.deq_v = <float*>self.own(np.zeros((config.n_kv_heads, max(self.warm, 1), hd), dtype=np.float32))
        self.bias = <float*>self.own(np.zeros((H, R), dtype=np.float32))
        self.cscore = <float*>self.own(np.zeros((H, NB), dtype=np.float32))
        self.cmark = <uint8_t*>self.own(np.zeros((H, NB), dtype=np.uint8))

    def reset(self):
        WindowAttention.reset(self)
        if self._cold_n is not None:
            self._cold_n[...] = 0

    def held_positions(self, int layer):
        return GatherAttention.held_positions(self, layer)

    def memory_bytes(self):
        # hot float32 rows (sinks, window, staging) + warm codes, scales and zero points + cold summaries
        if self._counts is None:
            return 0
        kv = self.kv_dim
        row = 2 * kv * 4
        group_bytes = 2 * self.group * self.row_bytes + 2 * kv * 4 + 2 * self.group * self.n_vg * 4
        total = 0
        held = self.held_exact()
        for layer in range(self.n_layers):
            _, staged, _, groups, closed = (int(x) for x in self._counts[:, layer])
            cold = closed + (1 if self._cold_n[layer, closed] > 0 else 0)
            total += (int(held[layer]) + staged) * row + groups * group_bytes + cold * (row + 8)
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

    cdef void _dequant_token(self, int layer, long long slot, long long t, Py_ssize_t c0, Py_ssize_t c1,
                             float* key, float* value) noexcept nogil:
        """Channels c0 .. c1-1 (whole heads) of token ``t`` of warm group ``slot``: key[c - c0], value[c - c0]."""
        cdef long long gi = layer * self.n_groups + slot, row = gi * self.group + t
        dequantize_token(&self.kivi, self.kcode + row * self.row_bytes, self.vcode + row * self.row_bytes,
                         self.kscale + gi * self.kv_dim, self.kzero + gi * self.kv_dim, self.vscale + row * self.n_vg,
                         self.vzero + row * self.n_vg, c0, c1, key, value)

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
        cdef long long G = self.group, gi = layer * self.n_groups + slot
        quantize_group(&self.kivi, self.stage_k + layer * G * self.kv_dim, self.stage_v + layer * G * self.kv_dim,
                       self.kcode + gi * G * self.row_bytes, self.vcode + gi * G * self.row_bytes,
                       self.kscale + gi * self.kv_dim, self.kzero + gi * self.kv_dim, self.vscale + gi * G * self.n_vg,
                       self.vzero + gi * G * self.n_vg)

    cdef void leave_window(self, int layer, const float* key, const float* value) noexcept nogil:
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

    cdef void _choose_cold(self, int h, int layer, const float* qh, long long n_cold, long long topk) noexcept nogil:
        """Mark the ``topk`` cold blocks with the highest q·mean/sqrt(d) + log(count) for query head h."""
        cdef long long NB = self.n_blocks, b, best, _pick
        cdef Py_ssize_t hd = self.head_dim, off = (h // self.kv_mul) * self.head_dim
        cdef float inv_scale = 1.0 / sqrtf(<float>hd)
        cdef float* cs = self.cscore + h * NB
        cdef uint8_t* mark = self.cmark + h * NB
        for b in range(n_cold):
            cs[b] = (dot_f32(qh, self.cold_k + (layer * NB + b) * self.kv_dim + off, hd) * inv_scale
                     + logf(<float>self.cold_n[layer * NB + b]))
            mark[b] = 0
        for _pick in range(topk):
            best = -1
            for b in range(n_cold):
                if mark[b] == 0 and (best < 0 or cs[b] > cs[best]):
                    best = b
            mark[best] = 1

    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) except -1 nogil:
        self.keep(layer, pos, k, v)  # a token leaving the window is staged (leave_window)
        cdef long long G = self.group, R = self.rows, NB = self.n_blocks
        cdef Py_ssize_t kv = self.kv_dim, hd = self.head_dim
        cdef long long n_sink, ring_start, n_ring
        kept_span(pos, self.sinks, self.window, &n_sink, &ring_start, &n_ring)
        cdef long long ns = self.n_stage[layer]
        cdef long long n_warm = self.w_count[layer] * G
        cdef long long n_closed = self.n_closed[layer]
        cdef long long n_cold = n_closed + (1 if self.cold_n[layer * NB + n_closed] > 0 else 0)
        cdef long long n_cold_att = n_cold if self.cold_topk == 0 or n_cold < self.cold_topk else self.cold_topk
        cdef long long n = n_sink + n_cold_att + n_warm + ns + n_ring
        cdef long long topk = self.cold_topk if n_cold > n_cold_att else 0

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

        # rows, ascending in position: sinks, cold blocks (oldest first), warm, staged, window
        cdef long long j, b
        cdef Py_ssize_t off
        cdef const float** kp
        cdef const float** vp
        cdef float* bias
        for h in prange(self.n_heads, schedule="static",
                        num_threads=threads_for(self.n_threads, n * self.n_heads * hd)):
            gh = h // self.kv_mul
            off = gh * hd
            kp = self.kptr + h * R
            vp = self.vptr + h * R
            bias = self.bias + h * R
            j = self.take_sinks(kp, vp, bias, 0, layer, self.sink_k + self.layer_at(layer), n_sink, off)
            if topk > 0:
                self._choose_cold(h, layer, q + h * hd, n_cold, topk)
            for b in range(n_cold):
                if topk > 0 and self.cmark[h * NB + b] == 0:
                    continue
                kp[j] = self.cold_k + (layer * NB + b) * kv + off
                vp[j] = self.cold_v + (layer * NB + b) * kv + off
                bias[j] = logf(<float>self.cold_n[layer * NB + b])
                j = j + 1
            j = take_rows(kp, vp, bias, j, self.deq_k + gh * self.warm * hd, self.deq_v + gh * self.warm * hd,
                          n_warm, hd)
            j = take_rows(kp, vp, bias, j, self.stage_k + layer * G * kv + off, self.stage_v + layer * G * kv + off,
                          ns, kv)
            self.take_window(kp, vp, bias, j, layer, ring_start, n_ring, off)
            self.attend_gathered(h, q, bias if n_cold_att > 0 else NULL, n, out)
        return 0
