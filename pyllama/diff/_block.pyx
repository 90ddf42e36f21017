"""The classifier over a block of positions, for teacher forcing.

``logits[b] = W_cls @ hidden[b]`` for every position b of a block, each element computed by the
engine's own kernel arithmetic (``dot_f32`` for float32 weights, ``matvec`` otherwise), so the
logits are bit-identical to what ``Engine.forward`` returns. For float32 weights a row of W is read
once per block instead of once per position: the classifier is the largest matrix of small models
(stories15M: 9.2M of its 15M parameters), so this roughly halves the cost of a diff.
"""

from cython.parallel cimport prange

from pyllama.kernels.matvec cimport Matrix, QuantScratch, QTYPE_F32, dot_f32, matrix_of, matvec, quant_scratch


cdef void _block_f32(float* out, const float* w, const float* x, Py_ssize_t n_pos, Py_ssize_t rows,
                     Py_ssize_t cols, int n_threads) noexcept nogil:
    cdef Py_ssize_t i, b
    for i in prange(rows, schedule="static", num_threads=n_threads):
        for b in range(n_pos):
            out[b * rows + i] = dot_f32(w + i * cols, x + b * cols, cols)


def classify_block(tensor, const float[:, ::1] hidden, float[:, ::1] out, int n_threads=1):
    """``out[b] = tensor @ hidden[b]`` for b < hidden.shape[0], with the engine's arithmetic."""
    cdef Matrix m = matrix_of(tensor)
    cdef Py_ssize_t n_pos = hidden.shape[0]
    cdef Py_ssize_t b
    if hidden.shape[1] != m.cols or out.shape[1] != m.rows or out.shape[0] < n_pos:
        raise ValueError(f"classify_block: W is {m.rows}x{m.cols}, hidden {hidden.shape[0]}x{hidden.shape[1]}, "
                         f"out {out.shape[0]}x{out.shape[1]}")
    if n_pos == 0:
        return
    cdef QuantScratch scratch
    _owner = quant_scratch(&scratch, m.cols)  # keeps the buffers alive
    with nogil:
        if m.qtype == QTYPE_F32:
            _block_f32(&out[0, 0], <const float*>m.data, &hidden[0, 0], n_pos, m.rows, m.cols, n_threads)
        else:
            for b in range(n_pos):
                matvec(&out[b, 0], &m, &hidden[b, 0], &scratch, n_threads)
