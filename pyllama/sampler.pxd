cdef struct ProbIndex:
    float prob
    int index

cdef class Sampler:
    cdef readonly int vocab_size
    cdef readonly float temperature
    cdef readonly float topp
    cdef public unsigned long long rng_state
    cdef ProbIndex* probindex
    cdef int sample_c(self, float* logits) noexcept nogil
