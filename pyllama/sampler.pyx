"""The sampler: a faithful port of llama2.c run.c's — argmax, temperature, top-p, xorshift RNG.

Same arithmetic in the same order as run.c (float32 softmax with libm ``expf``, the same cutoff
before sorting, the C library's ``qsort`` with the same comparator, the same coin), so a seeded run
reproduces run.c's run with the same seed. Like run.c, sampling overwrites the logits buffer with
probabilities.
"""

from libc.math cimport expf
from libc.stdlib cimport malloc, free, qsort


cdef unsigned int random_u32(unsigned long long* state) noexcept nogil:
    # xorshift*, as in run.c
    state[0] ^= state[0] >> 12
    state[0] ^= state[0] << 25
    state[0] ^= state[0] >> 27
    return <unsigned int>((state[0] * <unsigned long long>0x2545F4914F6CDD1D) >> 32)


cdef float random_f32(unsigned long long* state) noexcept nogil:
    return (random_u32(state) >> 8) / <float>16777216.0


cdef int sample_argmax(const float* probabilities, int n) noexcept nogil:
    cdef int max_i = 0, i
    cdef float max_p = probabilities[0]
    for i in range(1, n):
        if probabilities[i] > max_p:
            max_i = i
            max_p = probabilities[i]
    return max_i


cdef void softmax_libm(float* x, int n) noexcept nogil:
    # run.c's softmax exactly (libm expf, serial sum, division), kept apart from the engine's fast one
    cdef float max_val = x[0]
    cdef int i
    for i in range(1, n):
        if x[i] > max_val:
            max_val = x[i]
    cdef float total = 0.0
    for i in range(n):
        x[i] = expf(x[i] - max_val)
        total += x[i]
    for i in range(n):
        x[i] /= total


cdef int sample_mult(const float* probabilities, int n, float coin) noexcept nogil:
    cdef float cdf = 0.0
    cdef int i
    for i in range(n):
        cdf += probabilities[i]
        if coin < cdf:
            return i
    return n - 1


cdef int compare_desc(const void* a, const void* b) noexcept nogil:
    cdef const ProbIndex* a_ = <const ProbIndex*>a
    cdef const ProbIndex* b_ = <const ProbIndex*>b
    if a_.prob > b_.prob:
        return -1
    if a_.prob < b_.prob:
        return 1
    return 0


cdef int sample_topp(const float* probabilities, int n, float topp, ProbIndex* probindex, float coin) noexcept nogil:
    cdef int n0 = 0, i
    cdef float one = 1.0  # float arithmetic, as run.c's 1.0f
    cdef float cutoff = (one - topp) / (n - 1)
    for i in range(n):
        if probabilities[i] >= cutoff:
            probindex[n0].index = i
            probindex[n0].prob = probabilities[i]
            n0 += 1
    qsort(probindex, n0, sizeof(ProbIndex), compare_desc)
    cdef float cumulative_prob = 0.0
    cdef int last_idx = n0 - 1
    for i in range(n0):
        cumulative_prob += probindex[i].prob
        if cumulative_prob > topp:
            last_idx = i
            break
    cdef float r = coin * cumulative_prob
    cdef float cdf = 0.0
    for i in range(last_idx + 1):
        cdf += probindex[i].prob
        if r < cdf:
            return probindex[i].index
    return probindex[last_idx].index


cdef class Sampler:
    """Chooses the next token from logits: greedy at temperature 0, else (top-p) sampling."""

    def __cinit__(self, int vocab_size, float temperature=0.0, float topp=0.9, unsigned long long seed=0):
        if vocab_size <= 0:
            raise ValueError("vocab_size must be positive")
        self.vocab_size = vocab_size
        self.temperature = temperature
        self.topp = topp
        self.rng_state = seed
        self.probindex = <ProbIndex*>malloc(vocab_size * sizeof(ProbIndex))
        if self.probindex == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.probindex)

    cdef int sample_c(self, float* logits) noexcept nogil:
        cdef int q
        cdef float coin
        if self.temperature == 0.0:
            return sample_argmax(logits, self.vocab_size)
        for q in range(self.vocab_size):
            logits[q] /= self.temperature
        softmax_libm(logits, self.vocab_size)
        coin = random_f32(&self.rng_state)
        if self.topp <= 0 or self.topp >= 1:
            return sample_mult(logits, self.vocab_size, coin)
        return sample_topp(logits, self.vocab_size, self.topp, self.probindex, coin)

    def sample(self, float[::1] logits):
        """Sample from ``logits`` (float32[vocab_size], overwritten like run.c does)."""
        if logits.shape[0] != self.vocab_size:
            raise ValueError(f"sample: expected {self.vocab_size} logits, got {logits.shape[0]}")
        return self.sample_c(&logits[0])
