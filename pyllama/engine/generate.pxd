# run.c's generation loop (generate.pyx): the prompt as blocks, then one position per token.

from libc.stdint cimport int32_t

from pyllama.attention.base cimport Attention
from pyllama.engine.state cimport Transformer
from pyllama.sampler cimport Sampler

cdef struct TokenLoop:
    const int32_t* prompt      # [n_prompt]
    Py_ssize_t n_prompt
    Py_ssize_t n_known         # positions whose tokens are known (the prompt's, up to steps / a stop id)
    long long steps            # positions to run, prompt included
    const int32_t* stop_ids    # [n_stop]
    Py_ssize_t n_stop
    bint stop_in_prompt        # a stop id next in the prompt stops too (run.c's rule for BOS)
    int32_t* out               # the sampled ids
    Py_ssize_t n_out           # how many were written
    int stop_token             # the stop id that ended the loop, -1: none
    long long pos              # positions run
    long long compress_at      # the plugin's compression event after this position, -1: none

cdef tuple generate(Transformer* t, Attention attention, const int32_t[::1] prompt, long long steps, Sampler sampler,
                    int32_t[::1] out, object on_token, const int32_t[::1] stop_ids, bint stop_in_prompt,
                    long long compress_at)
