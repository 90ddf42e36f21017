# What a forward hands out besides its logits, for the diff harness (capture.pyx): each layer's
# attention output, the final hidden state, and the plugin's ledger after each position.

from pyllama.attention.base cimport Attention
from pyllama.engine.state cimport Capture, Config

cdef int bind_capture(Capture* cap, const Config* c, object attention, object hidden, bint logits) except -1
cdef int bind_ledger(Capture* cap, const Config* c, object ledger) except -1
cdef void capture_attention(Capture* cap, const Config* c, int li, const float* att_out) noexcept nogil
cdef void capture_block_attention(Capture* cap, const Config* c, int li, const float* batt,
                                  Py_ssize_t n) noexcept nogil
cdef void capture_hidden(Capture* cap, const float* x, Py_ssize_t n_values) noexcept nogil
cdef int ledger_step(Capture* cap, Attention attention, Py_ssize_t i, long long* last) except -1
cdef void ledger_running_sums(Capture* cap, long long base, Py_ssize_t n) noexcept nogil
