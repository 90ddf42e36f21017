"""The classifier over a block of positions, for teacher forcing.

``logits[b] = W_cls @ hidden[b]`` for every position b of a block through the engine's block
product ``matmul``, whose every element is ``matvec``'s, so the logits are bit-identical to what
``Engine.forward`` returns. A row of W is read once per block instead of once per position: the
classifier is the largest matrix of small models (stories15M: 9.2M of its 15M parameters).
"""

from pyllama.kernels.matvec cimport Matrix, QuantScratch, matrix_of, matmul, quant_scratch


def classify_block(tensor, const float[:, ::1] hidden, float[:, ::1] out, int n_threads=1):
    """``out[b] = tensor @ hidden[b]`` for b < hidden.shape[0], with the engine's arithmetic."""
    cdef Matrix m = matrix_of(tensor)
    cdef Py_ssize_t n_pos = hidden.shape[0]
    if hidden.shape[1] != m.cols or out.shape[1] != m.rows or out.shape[0] < n_pos:
        raise ValueError(f"classify_block: W is {m.rows}x{m.cols}, hidden {hidden.shape[0]}x{hidden.shape[1]}, "
                         f"out {out.shape[0]}x{out.shape[1]}")
    if n_pos == 0:
        return
    cdef QuantScratch scratch
    _owner = quant_scratch(&scratch, m.cols, n_pos)  # keeps the buffers alive
    with nogil:
        matmul(&out[0, 0], &m, &hidden[0, 0], n_pos, &scratch, n_threads)
