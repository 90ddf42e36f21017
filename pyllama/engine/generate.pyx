"""run.c's generation loop, with the prompt run in blocks (``Engine.generate_into`` documents it).

``generate`` resets the plugin, runs the known positions (the prompt) as passes of up to max_block
rows (forward.pyx: the same logits as one pass per position), then ``decode`` runs one position per token:
forward, the non-finite check, the next token (forced from the prompt, else sampled), the stop
test. With ``on_token=None`` and a native plugin the loop allocates nothing and never takes the GIL
inside a forward.
"""

from libc.stdint cimport int32_t
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from pyllama.errors import NonFiniteError

from pyllama.attention.base cimport Attention
from pyllama.engine.forward cimport forward, forward_block
from pyllama.engine.state cimport Transformer
from pyllama.kernels.finite cimport all_finite
from pyllama.kernels.threads cimport DecodeTeam, decode_start, token_start, token_end, decode_finish
from pyllama.sampler cimport Sampler


cdef double now_seconds() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef str plugin_name(Attention attention):
    """The registry name, or the class name of a plugin that has none (a local file's class)."""
    name = type(attention).name
    return type(attention).__name__ if name == Attention.name else name


cdef Py_ssize_t known_positions(const TokenLoop* loop) noexcept nogil:
    """The positions whose tokens are known: the prompt, up to steps and a stop id inside it."""
    cdef Py_ssize_t i, j
    cdef Py_ssize_t n_known = min(loop.n_prompt, loop.steps) if loop.steps > 0 else 0
    i = 1
    while loop.stop_in_prompt and i < n_known:
        for j in range(loop.n_stop):
            if loop.prompt[i] == loop.stop_ids[j]:
                n_known = i  # positions 0 .. i - 1 run, then the loop stops on prompt[i]
        i += 1
    return n_known


cdef int run_prompt(Transformer* t, Attention attention, const TokenLoop* loop, bint fast) except -1:
    """The known positions in passes of up to max_block rows; a pass ends at the compression event."""
    cdef Py_ssize_t c = 0, end
    cdef bint last
    while c < loop.n_known:
        end = min(c + t.config.max_block, loop.n_known)
        if c <= loop.compress_at < end:
            end = loop.compress_at + 1
        last = end == loop.n_known  # the decode samples from the last prompt position's logits only
        if fast:
            with nogil:
                forward_block(t, attention, loop.prompt + c, end - c, c, NULL, last)
        else:
            forward_block(t, attention, loop.prompt + c, end - c, c, NULL, last)
        if end - 1 == loop.compress_at:
            attention.compress(loop.compress_at)
        c = end
    return 0


cdef int decode_forward(Transformer* t, Attention attention, DecodeTeam* team, int token, long long pos,
                        bint fast) except -1:
    # one decode step on the team the controller picked; the cap is lifted even if forward raises
    token_start(team)
    try:
        if fast:
            with nogil:
                forward(t, attention, token, pos)
        else:
            forward(t, attention, token, pos)
    finally:
        token_end(team)
    return 0


cdef int decode(Transformer* t, Attention attention, Sampler sampler, TokenLoop* loop, object on_token,
                bint fast) except -1:
    """The token loop: position by position until ``steps`` or a stop id."""
    cdef DecodeTeam team  # picks 1 or n threads per token from their timings (kernels/threads.pyx)
    decode_start(&team, t.n_threads, t.weights.cls.data)
    try:
        decode_steps(t, attention, sampler, loop, on_token, fast, &team)
    finally:
        decode_finish(&team)
    return 0


cdef int decode_steps(Transformer* t, Attention attention, Sampler sampler, TokenLoop* loop, object on_token,
                      bint fast, DecodeTeam* team) except -1:
    """decode's loop, on the team that ``team`` picks per token."""
    cdef int token = loop.prompt[0]
    cdef int next_token
    cdef Py_ssize_t i
    while loop.pos < loop.steps:
        if loop.pos >= loop.n_known:
            decode_forward(t, attention, team, token, loop.pos, fast)
            if loop.pos == loop.compress_at:
                attention.compress(loop.pos)
        if loop.pos >= loop.n_known - 1 and (
                t.state.nonfinite_layer >= 0 or not all_finite(t.state.logits, t.config.vocab_size)):
            raise NonFiniteError.at(t.state.nonfinite_position if t.state.nonfinite_layer >= 0 else loop.pos,
                                    t.state.nonfinite_layer, t.state.nonfinite_stage, t.config.n_layers,
                                    plugin_name(attention))
        if loop.pos < loop.n_prompt - 1:
            next_token = loop.prompt[loop.pos + 1]
        else:
            next_token = sampler.sample_c(t.state.logits)
        loop.pos += 1
        if loop.pos >= loop.n_prompt or loop.stop_in_prompt:
            for i in range(loop.n_stop):
                if next_token == loop.stop_ids[i]:
                    loop.stop_token = next_token
        if loop.stop_token >= 0:
            break
        if loop.pos >= loop.n_prompt:
            loop.out[loop.n_out] = next_token
            loop.n_out += 1
        if on_token is not None:
            on_token(next_token)
        token = next_token
    return 0


cdef tuple generate(Transformer* t, Attention attention, const int32_t[::1] prompt, long long steps, Sampler sampler,
                    int32_t[::1] out, object on_token, const int32_t[::1] stop_ids, bint stop_in_prompt,
                    long long compress_at):
    """(n_generated, stop_token or -1, decode_seconds, positions_run, prompt_seconds); the caller has
    checked the prompt's ids, ``steps`` against the plugin and the size of ``out``."""
    cdef TokenLoop loop
    loop.prompt = &prompt[0]
    loop.n_prompt = prompt.shape[0]
    loop.steps = steps
    loop.n_stop = 0 if stop_ids is None else stop_ids.shape[0]
    loop.stop_ids = &stop_ids[0] if loop.n_stop > 0 else NULL
    loop.stop_in_prompt = stop_in_prompt
    loop.out = &out[0] if out.shape[0] > 0 else NULL
    loop.n_out = 0
    loop.stop_token = -1
    loop.pos = 0
    loop.compress_at = compress_at
    loop.n_known = known_positions(&loop)
    cdef bint fast = attention.native and on_token is None
    attention.reset()  # a new sequence from position 0 (plugins take positions in order)
    cdef double start = now_seconds()
    run_prompt(t, attention, &loop, fast)
    cdef double prompt_seconds = now_seconds() - start
    start = now_seconds()
    decode(t, attention, sampler, &loop, on_token, fast)
    cdef double elapsed = now_seconds() - start
    return loop.n_out, loop.stop_token, elapsed, loop.pos, prompt_seconds
