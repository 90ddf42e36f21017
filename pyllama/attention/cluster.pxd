# Seeded k-means over cached key rows (k-means++, Lloyd, running means) (cluster.pyx).

from libc.stdint cimport int32_t, uint64_t, uint8_t


# ---- seeded random numbers (xorshift64*, seeded with splitmix64) ----------------------------------
cdef inline uint64_t splitmix64(uint64_t x) noexcept nogil:
    x = x + <uint64_t>0x9E3779B97F4A7C15ULL
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return x ^ (x >> 31)


cdef inline uint64_t xorshift64s(uint64_t* state) noexcept nogil:
    cdef uint64_t x = state[0]
    x = x ^ (x >> 12)
    x = x ^ (x << 25)
    x = x ^ (x >> 27)
    state[0] = x
    return x * <uint64_t>0x2545F4914F6CDD1DULL


cdef inline double uniform01(uint64_t* state) noexcept nogil:
    return <double>(xorshift64s(state) >> 11) * (1.0 / 9007199254740992.0)


cdef struct Clusters:   # the clusters of one set of rows (kmeans: one layer and KV head)
    long long n         # clusters
    Py_ssize_t dim      # floats per row
    float* cent         # [n, dim] centroids (mean keys)
    float* cnorm        # [n] |centroid|^2
    float* cval         # [n, dim] mean values (NULL: not kept)
    long long* size     # [n] members
    int32_t* assign     # [positions] cluster of each member position


cdef struct ClusterScratch:  # the clustering's working memory, for up to `positions` rows and n clusters
    float* dist         # [positions] k-means++ D^2
    float* xnorm        # [positions] |key|^2
    double* sums        # [n, dim]
    double* vsums       # [n, dim]
    long long* cnt      # [n]


cdef int nearest(const Clusters* cl, const float* x, long long n_valid) noexcept nogil
cdef void cluster_rows(Clusters* cl, ClusterScratch* w, const float* keys, const float* values, Py_ssize_t stride,
                       long long first, long long m, long long iters, uint64_t state) noexcept nogil
cdef void add_member(Clusters* cl, const float* key, const float* value, long long p) noexcept nogil
cdef long long rank_clusters(const Clusters* cl, const float* q, bint size_bias, float* score, int32_t* order,
                             uint8_t* mark) noexcept nogil
