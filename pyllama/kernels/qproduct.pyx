"""The product of weight matrices of every type: the type table compiled with this build's kernels, and
the one loop that runs a product over it.

A weight type is one row of the C table in ``qtypes.h`` (``qtype.h`` says what a row holds): ggml's name
and GGUF id, values and bytes per block, what the activation is quantised to before the row products, and
its kernels. This module compiles the table with every kernel, for the SIMD path chosen at compile time
(``simd_path``), and is how the rest of pyllama reads it: Cython through ``qtype_row``, ``product_many``
and ``dequantize_row``, Python through ``type_rows`` (``pyllama.kernels.qtypes`` makes ``QType`` and
``STORED_TYPES`` of them).

``product_many`` computes ``out_k[p, r] = W_k[r] · x[p]`` for ``n_pos`` positions and up to ``MAX_MANY``
matrices of x's columns. Matrices whose rows share an activation (the row's ``act``; llama2.c's int8
groups also their group size) are multiplied in one parallel loop: the activation of each position is
quantised once, into ``scratch`` (sized for ``n_pos`` positions by ``matvec.quant_scratch``); the units of
all the matrices (rows, groups of rows, strips: each type's ``units`` says) are numbered one matrix after
another and split over the threads in contiguous shares, as a static schedule splits a loop; each share
of each matrix is one call of its type's ``vec`` (one position) or ``mat`` (a block, every weight row
read once for all the positions). A position of decode is quantised before the threads start; the
positions of a block by the team, which waits until all are before it multiplies. Which units a thread
takes never changes a bit: element (p, r) is the type's kernel on W[r] and x[p] whatever the grouping,
``n_pos`` or the thread count, so a block product is bit-identical to the one-position product on x[p].
The loop reads only the rows' fields: nothing depends on the order of the type ids.
"""

from cython.parallel cimport parallel, prange

import threading
import time

import numpy as np

from pyllama.kernels.aligned import zeros_aligned

from pyllama.kernels.matvec cimport MAX_MANY, PACK_MAPPED, PACK_PENDING, PACK_READY
from pyllama.kernels.threads cimport team_barrier, team_size

cdef extern from "qtypes.h":
    const QTypeRow* TYPES "pyllama_qtypes"
    const ActRow* ACTS "pyllama_acts_table"
    const int N_QTYPES "PYLLAMA_N_QTYPES"
    const int N_ACTS "PYLLAMA_N_ACTS"
    const int ACT_Q8_0 "PYLLAMA_ACT_Q8_0"
    const int ACT_Q8_1 "PYLLAMA_ACT_Q8_1"
    const int ACT_Q8_K "PYLLAMA_ACT_Q8_K"
    const char* qblocks_path "pyllama_qblocks_path"() noexcept nogil
    bint qblocks_native "pyllama_qblocks_native"() noexcept nogil
    void pack_all "pyllama_pack_all"(void (*pack)(const pyllama_matrix* m, Py_ssize_t g0, Py_ssize_t g1,
                                                  unsigned char* out) noexcept nogil,
                                     const pyllama_matrix* m, unsigned char* out, int n_threads) noexcept nogil
    int slot_state "pyllama_slot_state"(const int* state) noexcept nogil
    void slot_publish "pyllama_slot_publish"(int* state, int value) noexcept nogil


cdef const QTypeRow* qtype_row(int qtype) noexcept nogil:
    return &TYPES[qtype]


cdef inline pyllama_matrix c_matrix(const Matrix* m) noexcept nogil:
    cdef pyllama_matrix c
    c.data = m.data
    c.packed = NULL
    if m.pack != NULL and slot_state(&m.pack.state) == PACK_READY:
        c.packed = m.pack.packed
    c.scales = m.scales
    c.group_size = m.group_size
    c.rows = m.rows
    c.cols = m.cols
    return c


cdef inline pyllama_acts activations(QuantScratch* scratch, const float* x, const Matrix* m,
                                     Py_ssize_t n_pos) noexcept nogil:
    """The n_pos positions' activations in the scratch: every buffer holds n_pos equal strides; a scale per
    32 values (Q8_0, Q8_1; Q8_K uses one in 8 of them) or per group of llama2.c's int8 groups."""
    cdef pyllama_acts a
    a.q = scratch.q
    a.d = scratch.scales
    a.s = scratch.sums
    a.bsums = scratch.bsums
    a.isums = scratch.isums
    a.x = x
    a.cols = m.cols
    a.n_pos = n_pos
    a.group_size = m.group_size
    a.d_stride = m.cols // m.group_size if m.group_size > 0 else m.cols // 32
    return a


cdef inline bint share_activation(const Matrix* a, const Matrix* b) noexcept nogil:
    return a.cols == b.cols and TYPES[a.qtype].act == TYPES[b.qtype].act and a.group_size == b.group_size


cdef void product_many(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                       QuantScratch* scratch, int n_threads) noexcept nogil:
    """Matrices that share an activation in one loop (a decode step's or a block's Q, K and V; the FFN's
    gate and up: one barrier instead of count, and x quantised once), any other mix one after another."""
    cdef int k
    cdef bint shared = True
    for k in range(count):
        if ms[k].pack != NULL and slot_state(&ms[k].pack.state) == PACK_PENDING:
            make_packed(ms[k].pack, n_threads)
    for k in range(1, count):
        shared = shared and share_activation(ms[0], ms[k])
    if shared:
        product(count, outs, ms, x, n_pos, scratch, n_threads)
        return
    for k in range(count):
        product(1, &outs[k], &ms[k], x, n_pos, scratch, n_threads)


cdef void product(int count, float** outs, const Matrix** ms, const float* x, Py_ssize_t n_pos,
                  QuantScratch* scratch, int n_threads) noexcept nogil:
    """count matrices whose rows share one activation: x quantised once, their units in one parallel loop."""
    cdef pyllama_matrix cm[MAX_MANY]
    cdef const QTypeRow* types[MAX_MANY]
    cdef Py_ssize_t first[MAX_MANY + 1]
    cdef long long work = 0
    cdef int k, t
    cdef Py_ssize_t p
    first[0] = 0
    for k in range(count):
        types[k] = &TYPES[ms[k].qtype]
        cm[k] = c_matrix(ms[k])
        first[k + 1] = first[k] + types[k].units(&cm[k], n_pos)
        work += ms[k].rows * ms[k].cols * n_pos // types[k].work_div
    cdef pyllama_acts acts = activations(scratch, x, ms[0], n_pos)
    cdef const ActRow* act = &ACTS[types[0].act]
    # small products stay on the calling thread (threads.pyx)
    cdef bint serial = team_size(n_threads, work) == 1
    if serial or n_pos == 1:
        # one position (decode) is quantised before the team starts: no barrier inside it
        for p in range(n_pos):
            act.quantise(&acts, p)
    if serial:
        run_units(count, outs, cm, types, first, 0, first[count], &acts)
        return
    if n_pos == 1:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            run_share(count, outs, cm, types, first, t, n_threads, &acts)
        return
    # a block: the team quantises the positions (one thread alone had the other waiting, 2% of a 15M prompt
    # at 2 threads), waits until all are, then multiplies
    with parallel(num_threads=n_threads):
        for p in prange(n_pos, schedule="static"):
            act.quantise(&acts, p)
        team_barrier()
        for t in prange(n_threads, schedule="static"):
            run_share(count, outs, cm, types, first, t, n_threads, &acts)


cdef inline void run_share(int count, float** outs, const pyllama_matrix* cm, const QTypeRow** types,
                           const Py_ssize_t* first, int t, int team, const pyllama_acts* acts) noexcept nogil:
    """Thread t's share of the units (numbered one matrix after another): a contiguous range, the first
    n % team threads one unit more, as a static schedule splits n iterations."""
    cdef Py_ssize_t n = first[count]
    cdef Py_ssize_t share = n // team, extra = n % team
    cdef Py_ssize_t u0 = t * share + min(<Py_ssize_t>t, extra)
    run_units(count, outs, cm, types, first, u0, u0 + share + (1 if t < extra else 0), acts)


cdef inline void run_units(int count, float** outs, const pyllama_matrix* cm, const QTypeRow** types,
                           const Py_ssize_t* first, Py_ssize_t u0, Py_ssize_t u1,
                           const pyllama_acts* acts) noexcept nogil:
    """Units u0 .. u1 - 1 of the matrices taken one after another: each matrix's part in one kernel call."""
    cdef int k
    cdef Py_ssize_t lo, hi
    for k in range(count):
        lo = max(u0, first[k]) - first[k]
        hi = min(u1, first[k + 1]) - first[k]
        if lo >= hi:
            continue
        if acts.n_pos == 1:
            types[k].vec(&cm[k], lo, hi, acts, outs[k])
        else:
            types[k].mat(&cm[k], lo, hi, acts, outs[k])


cdef void make_packed(PackSlot* slot, int n_threads) noexcept nogil:
    with gil:
        (<PackedCopy>slot.owner).make(n_threads)


cdef Py_ssize_t packed_size(int qtype, Py_ssize_t rows, Py_ssize_t cols) noexcept nogil:
    if TYPES[qtype].packed_bytes == NULL or TYPES[qtype].pack == NULL:
        return 0
    return TYPES[qtype].packed_bytes(rows, cols)


cdef class PackedCopy:
    """The packed copy of one tensor's matrix (qpacked.h), made once, by the first product that needs it.

    Made under a lock: two engines in two Python threads (a diff's two sides) may reach the same pending
    copy at once, and the GIL alone would let both make it, the second replacing (and freeing) the copy
    the first had published while products read it. The first makes it, the others wait and read it;
    the groups are packed by OpenMP threads. A copy that cannot be allocated leaves the matrix on the
    file's layout (the same bits, more slowly)."""

    def __init__(self, tensor):
        self.source = tensor.data
        self.qtype, self.rows, self.cols = int(tensor.qtype), tensor.rows, tensor.cols
        self.copy = None
        self.seconds = 0.0
        self.slot.packed = NULL
        self.slot.state = PACK_PENDING
        self.slot.owner = <void*>self
        self.lock = threading.Lock()

    cdef void make(self, int n_threads):
        with self.lock:
            self.make_locked(n_threads)

    cdef void make_locked(self, int n_threads):
        if slot_state(&self.slot.state) != PACK_PENDING:
            return
        t0 = time.perf_counter()
        cdef Py_ssize_t n = packed_size(self.qtype, self.rows, self.cols)
        try:
            copy = zeros_aligned(n, np.uint8)
        except MemoryError:
            slot_publish(&self.slot.state, PACK_MAPPED)
            return
        cdef unsigned char[::1] out = copy
        cdef const unsigned char[::1] src = np.asarray(self.source).reshape(-1).view(np.uint8)
        cdef pyllama_matrix m
        m.data, m.packed, m.scales = &src[0], NULL, NULL
        m.group_size, m.rows, m.cols = 0, self.rows, self.cols
        pack_all(TYPES[self.qtype].pack, &m, &out[0], max(n_threads, 1))
        self.copy = copy
        self.slot.packed = &out[0]
        slot_publish(&self.slot.state, PACK_READY)
        self.seconds = time.perf_counter() - t0

    @property
    def ready(self) -> bool:
        return slot_state(&self.slot.state) == PACK_READY

    @property
    def nbytes(self) -> int:
        return 0 if self.copy is None else self.copy.nbytes


cdef void dequantize_row(float* out, const Matrix* m, Py_ssize_t row) noexcept nogil:
    cdef pyllama_matrix c = c_matrix(m)
    TYPES[m.qtype].dequantize_row(&c, row, out)


# ---- Python's view of the table, and tests' -----------------------------------------------------

def type_rows() -> list[tuple]:
    """Every row of the table, in id order: (id, name, GGUF id, values per block, bytes per block,
    activation name, work_div); None for a field the row leaves unset (a row being written)."""
    rows = []
    cdef const QTypeRow* t
    for i in range(N_QTYPES):
        t = &TYPES[i]
        act = ACTS[t.act].name.decode() if 0 <= t.act < N_ACTS and ACTS[t.act].name != NULL else None
        rows.append((i, t.name.decode() if t.name != NULL else None, t.ggml, t.block, t.block_bytes, act,
                     t.work_div))
    return rows


def kernel_addresses(int qtype) -> dict[str, int]:
    """The addresses of a row's kernels and of its activation's quantiser (0: not set), for the table's
    completeness test."""
    if not 0 <= qtype < N_QTYPES:
        raise ValueError(f"kernel_addresses: no type id {qtype} (0 to {N_QTYPES - 1})")
    cdef const QTypeRow* t = &TYPES[qtype]
    quantise = <size_t>ACTS[t.act].quantise if 0 <= t.act < N_ACTS else 0
    return {"units": <size_t>t.units, "vec": <size_t>t.vec, "mat": <size_t>t.mat,
            "dequantize_row": <size_t>t.dequantize_row, "quantise": quantise}


def quantize_activation_np(const float[::1] x, str kind):
    """The activation quantisation of the products, for tests: ``kind`` Q8_0 -> (q, d, None),
    Q8_1 -> (q, d, s), Q8_K -> (q, d, bsums)."""
    block = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}.get(kind)
    if block is None:
        raise ValueError(f"quantize_activation: unknown kind {kind!r} (Q8_0, Q8_1, Q8_K)")
    cdef Py_ssize_t n = x.shape[0]
    if n == 0 or n % block:
        raise ValueError(f"quantize_activation: {n} values is not a positive multiple of {block}")
    q = np.zeros(n, dtype=np.int8)
    d = np.zeros(n // 32, dtype=np.float32)
    s = np.zeros(n // 32, dtype=np.float32)
    bsums = np.zeros(n // 16, dtype=np.int16)
    cdef signed char[::1] qv = q
    cdef float[::1] dv = d
    cdef float[::1] sv = s
    cdef short[::1] bv = bsums
    cdef pyllama_acts a
    a.q, a.d, a.s, a.bsums, a.x = &qv[0], &dv[0], &sv[0], &bv[0], &x[0]
    a.cols, a.n_pos, a.d_stride, a.group_size = n, 1, n // 32, 0
    cdef int act = ACT_Q8_0 if kind == "Q8_0" else ACT_Q8_1 if kind == "Q8_1" else ACT_Q8_K
    with nogil:
        ACTS[act].quantise(&a, 0)
    return q, d[: n // block].copy(), (None if kind == "Q8_0" else s if kind == "Q8_1" else bsums)


def simd_path() -> str:
    """The instruction set this build multiplies with: ``avx512-vnni``, ``avx512``, ``avx2`` or
    ``portable`` (chosen at compile time, see build_config.py)."""
    return qblocks_path().decode()


def built_for_this_cpu() -> bool:
    """True for a -march=native build (the default); False for PYLLAMA_PORTABLE=1."""
    return qblocks_native()
