# Every thread decision of the kernels and plugins goes through team_size (see threads.pyx).

cdef int team_size(int n_threads, long long work) noexcept nogil
