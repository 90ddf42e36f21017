"""Model: the Python API. A checkpoint and its tokenizer, bound to attention plugins on demand.

m = Model.load("stories260K.bin", tokenizer="tok512.bin")
out = m.generate("Once upon a time", steps=256, temperature=0.0)
logits = m.forward(token, pos)
block = m.logits(token_ids)        # float32[len(token_ids), vocab], positions run in blocks
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.guard import checked_memory_bytes, plugin_calls, plugin_failure, plugin_label
from pyllama.attention.registry import create_plugin, resolve_attention
from pyllama.attention.spec import PluginSpec
from pyllama.checkpoint.weights import Weights
from pyllama.config import ARITHMETICS, ModelConfig
from pyllama.diff import DiffReport, run_diff
from pyllama.diff.probes import ProbeSource, probe_from_text
from pyllama.engine import Engine
from pyllama.errors import InputError, PyllamaError, TokenizerError
from pyllama.kernels.aligned import zeros_small_pages
from pyllama.load import open_model
from pyllama.options import (
    check_compress_at,
    check_seed,
    check_steps,
    check_temperature,
    check_threads,
    check_topp,
    compress_position,
    usable_cpus,
)
from pyllama.sampler import Sampler
from pyllama.tokenizer.base import Tokenizer
from pyllama.tokenizer.llama2c import Llama2cTokenizer

BOS = 1


@dataclass
class Generation:
    """What one ``generate`` call produced."""

    prompt_ids: list[int]
    ids: list[int]  # generated after the prompt (the end token that stopped generation not included)
    text: str  # what was streamed: prompt text and generated text, decoded like run.c prints it
    tok_per_s: float  # decode: positions after the prompt per second (from BOS alone: timed as run.c does)
    memory_bytes: int  # the attention plugin's ledger at the end
    stop_token: int | None = None  # the end token that stopped generation (BOS for llama2.c models)
    steps: int = 0  # positions run
    notices: list[str] = field(default_factory=list)
    prompt_tok_per_s: float = 0.0  # the prompt's positions per second (run as blocks of positions)

    @property
    def stopped_on_bos(self) -> bool:
        return self.stop_token == BOS

    def __str__(self) -> str:
        return self.text  # print(m.generate(...)) shows the story

    def to_json(self) -> dict:
        return {
            "prompt_ids": self.prompt_ids,
            "ids": self.ids,
            "text": self.text,
            "tok_per_s": self.tok_per_s,
            "prompt_tok_per_s": self.prompt_tok_per_s,
            "memory_bytes": self.memory_bytes,
        }


def default_threads() -> int:
    return usable_cpus()


class Model:
    """Weights (memory-mapped), config and tokenizer of one model."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Weights,
        tokenizer: Tokenizer | None = None,
        path: str | None = None,
        threads: int = 0,
    ) -> None:
        self.config = config
        self.weights = weights
        self.tokenizer = tokenizer
        self.path = path
        self.threads = check_threads(threads) or default_threads()
        self._engine: Engine | None = None
        self.tokenizer_problem: str | None = None  # why a tokenizer beside the checkpoint was not used

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        tokenizer: str | os.PathLike | None = None,
        threads: int = 0,
        arithmetic: str | None = None,
    ) -> Model:
        """Map a llama2.c ``.bin`` or a ``.gguf`` file. ``tokenizer``: a llama2.c tokenizer file or a
        GGUF (its vocabulary is used); default: the GGUF's own vocabulary, else ``tokenizer.bin``
        beside the checkpoint if there is one, else no tokenizer (ids only). ``path`` and ``tokenizer``
        may be names of downloaded known files (``Model.load("stories15M")``; ``pyllama download``),
        and a downloaded known model gets its own downloaded tokenizer by default. The file is
        sniffed and parsed once (``pyllama.load``). ``arithmetic``: ``"run.c"`` or ``"ggml"``, whose
        rmsnorm/SwiGLU rounding to reproduce; default: the format's own program (run.c for llama2.c
        files, ggml for GGUF files). ``threads``: the kernels' threads, 0 (the default) for all cores;
        the results are the same bits for any count."""
        if arithmetic is not None and arithmetic not in ARITHMETICS:
            raise InputError(f"arithmetic must be one of {', '.join(ARITHMETICS)}, not {arithmetic!r}")
        check_threads(threads)
        opened = open_model(path, tokenizer)
        config = opened.config if arithmetic is None else dataclasses.replace(opened.config, arithmetic=arithmetic)
        model = cls(config, opened.weights, opened.tokenizer, str(opened.path), threads)
        model.tokenizer_problem = opened.tokenizer_problem
        return model

    def chat(self, message: str, system: str | None = None, template: str | None = None, **options: Any) -> Generation:
        """One chat turn: ``message`` rendered with the file's ``tokenizer.chat_template`` (or
        ``template``), generated until the end-of-turn token; ``.text`` is the reply. ``options``:
        those of ``generate``. See ``pyllama.chat``."""
        from pyllama import chat  # lazy: jinja2 only when a chat template is rendered

        return chat.generate(self, message, system, template, **options)

    # ---- engines -----------------------------------------------------------------------------
    def engine(self, attention: str | PluginSpec | Attention | None = None, threads: int | None = None) -> Engine:
        """A new engine over these weights bound to ``attention``: a spec string (resolved here), a
        PluginSpec (``resolve_spec``), an Attention instance, or None: causal."""
        check_threads(threads)
        attention = resolve_attention(attention)
        plugin = create_plugin(attention)
        with plugin_calls(plugin_label(attention), "init"):
            return Engine(self.config, self.weights, plugin, threads or self.threads)

    def forward(self, token: int, pos: int) -> np.ndarray:
        """Logits (a float32 copy) for ``token`` at ``pos`` through exact causal attention.

        Positions must be fed in order from 0 on the model's default engine; ``reset()`` starts over.
        """
        if self._engine is None:
            self._engine = self.engine()
        return np.array(self._engine.forward(token, pos))

    def reset(self) -> None:
        if self._engine is not None:
            self._engine.reset()

    def logits(
        self,
        tokens: list[int] | np.ndarray,
        attention: str | PluginSpec | Attention | None = None,
        threads: int | None = None,
    ) -> np.ndarray:
        """float32[len(tokens), vocab]: the logits of every position of ``tokens`` fed from position 0,
        run in blocks of positions (each weight read once per block; bit-identical to ``forward``
        position by position). ``attention``: a plugin spec or instance (default: causal)."""
        given = np.asarray(tokens)
        if given.ndim != 1 or given.shape[0] == 0:
            raise InputError(f"logits: tokens must be a non-empty 1-D sequence of ids, got shape {given.shape}")
        if given.dtype.kind not in "iu":
            raise InputError(f"logits: tokens must be integer ids, got {given.dtype} values")
        bad = (given < 0) | (given >= self.config.vocab_size)  # before int32 could wrap a large id
        if bad.any():
            raise InputError(
                f"logits: token id {int(given[bad][0])} is outside the vocabulary of {self.config.vocab_size}"
            )
        ids = np.ascontiguousarray(given, dtype=np.int32)
        engine = self.engine(attention, threads)
        if ids.shape[0] > engine.max_positions:
            raise InputError(
                f"logits: {ids.shape[0]} tokens but the attention plugin holds {engine.max_positions} positions"
            )
        out = zeros_small_pages((ids.shape[0], self.config.vocab_size), np.float32)
        engine.forward_block(ids, 0, out)
        return out

    def diff(
        self,
        a: str | PluginSpec | Attention | None,
        b: str | PluginSpec | Attention | None,
        probe: ProbeSource | None = None,
        text: str | None = None,
        threads: int | None = None,
        progress: bool | None = None,
        blocks: bool = True,
        greedy: bool = True,
        cache: bool | str | os.PathLike | None = None,
        compress_at: int | str | None = "context",
    ) -> DiffReport:
        """Teacher-force a probe through plugins ``a`` and ``b`` (specs or instances) on these weights.
        Each spec is resolved once, here; the report names each side by its canonical spec.

        ``probe``: ``"standard"`` (the default), ``"stories"``, ``"long"``, ``"recall"``, a text file
        path, a ``pyllama.diff.Probe`` or token ids; ``text``: a prompt string as the probe instead.
        Returns a ``pyllama.diff.DiffReport`` (per-position numpy arrays, ``.summary``,
        ``.to_pandas()``, ``.plot()``). ``blocks=False`` runs one position at a time instead of
        blocks of positions: the same report (timing aside), slower. A retrieval probe
        (``"passkey:depth=0.5,length=2000"``, ``"needle:..."``, ``"copy:..."``) adds each side's key
        scores (``report.retrieval``); ``greedy=False`` skips decoding the greedy answer where a
        side's chain leaves the key (see ``pyllama.diff.retrieval_scores``).

        ``cache``: side A's run (a built-in plugin) is recorded on disk the first time and replayed
        by later diffs of the same model file, plugin spec and probe, which then run one forward per
        position instead of two, with the same report bit for bit (``pyllama.diff.side_cache``).
        None: the default folder, unless ``$PYLLAMA_DIFF_CACHE`` is ``off``; a path: that folder;
        False: neither record nor replay. ``compress_at``: the plugins' compression event after each
        sequence's context (``"context"``: a retrieval probe's haystack, before its question), after
        a position, or never (``"none"``).
        """
        check_threads(threads)
        a, b = resolve_attention(a), resolve_attention(b)
        if text is not None:
            if probe is not None:
                raise InputError("diff: give either probe= or text=, not both")
            probe = probe_from_text(text, self._require_tokenizer(), name="prompt")
        return run_diff(
            self.config,
            self.weights,
            a,
            b,
            "standard" if probe is None else probe,
            tokenizer=self.tokenizer,
            threads=threads or self.threads,
            progress=progress,
            blocks=blocks,
            name=str(self.path or "model"),
            greedy=greedy,
            cache=cache,
            model_file=self.path,
            compress_at=compress_at,
        )

    # ---- text --------------------------------------------------------------------------------
    def _require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise TokenizerError(f"{self.path}: no tokenizer: pass one with tokenizer=... (-z on the CLI)")
        return self.tokenizer

    @property
    def stop_ids(self) -> frozenset[int]:
        """Sampled ids that end ``generate``: the tokenizer's (BOS for llama2.c vocabularies, as run.c;
        a GGUF vocabulary's end-of-generation tokens, as llama.cpp); BOS without a tokenizer."""
        return self.tokenizer.stop_ids if self.tokenizer is not None else frozenset({BOS})

    @property
    def stops_like_runc(self) -> bool:
        """run.c stops on BOS even when the prompt forces it; llama.cpp only on sampled tokens."""
        return self.tokenizer is None or isinstance(self.tokenizer, Llama2cTokenizer)

    def tokenize(self, text: str, bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; ``bos`` None: as the tokenizer says (llama2.c: always BOS)."""
        if not isinstance(text, str):
            raise InputError(f"tokenize: text must be a str, got {type(text).__name__}")
        return list(self._require_tokenizer().encode(text, bos=bos, eos=False))

    def _prompt_and_steps(self, prompt: str | list[int], steps: int, max_pos: int) -> tuple[list[int], int, list[str]]:
        """The prompt's ids, checked, and ``steps`` (0: the context) clamped to what the plugin holds."""
        notices: list[str] = []
        prompt_ids = list(prompt) if not isinstance(prompt, str) else self.tokenize(prompt)
        if not prompt_ids:
            raise InputError("the prompt needs at least one token (BOS)")
        bad = [t for t in prompt_ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise InputError(f"prompt token id {bad[0]} is outside the model's vocabulary of {self.config.vocab_size}")
        if steps == 0:
            steps = min(self.config.seq_len, max_pos)
        if steps > max_pos:
            notices.append(
                f"steps {steps} clamped to {max_pos}: the attention plugin holds {max_pos} positions"
                + (" (the model's context)" if max_pos == self.config.seq_len else "")
            )
            steps = max_pos
        if steps < len(prompt_ids) <= max_pos:
            notices.append(
                f"steps {steps} end inside the prompt's {len(prompt_ids)} tokens: nothing is generated "
                f"(pass more steps, e.g. -n {min(len(prompt_ids) + 256, max_pos)})"
            )
        if len(prompt_ids) > max_pos:
            raise InputError(
                f"the prompt is {len(prompt_ids)} tokens but the attention plugin holds {max_pos} positions: "
                "shorten the prompt or use a plugin with more positions (e.g. causal:positions=N)"
            )
        return prompt_ids, steps, notices

    def generate(
        self,
        prompt: str | list[int] = "",
        steps: int = 256,
        temperature: float = 0.0,
        topp: float = 0.9,
        seed: int | None = None,
        attention: str | PluginSpec | Attention | None = None,
        threads: int | None = None,
        ignore_eos: bool = False,
        on_text: Callable[[str], None] | None = None,
        compress_at: int | str | None = "context",
    ) -> Generation:
        """Generate like llama2.c's run.c: ``steps`` counts positions including the prompt's.

        Generation stops when an end token is sampled (``stop_ids``) unless ``ignore_eos``.
        ``steps`` 0 means the model's context; more than the plugin holds is clamped with a
        notice. ``seed`` None or 0: from the clock, as run.c. ``on_text`` receives text as it is
        decoded (never a split UTF-8 character). ``compress_at``: the plugin's compression event
        (``Attention.compress``) after the prompt ("context", the default), after a position, or
        never ("none"). Values out of range raise InputError; NaN or Inf in a forward pass raises
        NonFiniteError naming the position and layer.
        """
        temperature, topp = check_temperature(temperature), check_topp(topp)
        steps, seed = check_steps(steps), check_seed(seed)
        where = check_compress_at(compress_at)
        attention = resolve_attention(attention)
        engine = self.engine(attention, threads)
        label = plugin_label(attention)
        prompt_ids, steps, notices = self._prompt_and_steps(prompt, steps, engine.max_positions)
        if not seed:
            seed = int(time.time()) & 0xFFFFFFFF  # run.c: (unsigned int)time(NULL)
        sampler = Sampler(self.config.vocab_size, temperature, topp, seed)
        out = np.zeros(max(steps - len(prompt_ids) + 1, 1), dtype=np.int32)
        text = _TextStream(self.tokenizer, prompt_ids[0], on_text) if self.tokenizer is not None else None
        prompt_arr = np.asarray(prompt_ids, dtype=np.int32)
        stop_ids = None if ignore_eos else np.array(sorted(self.stop_ids), dtype=np.int32)
        try:
            n, stop_token, elapsed, pos, prompt_seconds = engine.generate_into(
                prompt_arr,
                steps,
                sampler,
                out,
                text.on_token if text is not None else None,
                stop_ids=stop_ids,
                stop_in_prompt=self.stops_like_runc,
                compress_at=compress_position(where, len(prompt_ids) - 1),
            )
        except PyllamaError:
            raise
        except Exception as exc:
            if text is not None and text.failure and exc is text.failure[0]:
                raise
            raise plugin_failure(label, "attend", exc) from exc
        if text is not None:
            text.flush()
        n_prompt_run = min(len(prompt_ids), pos)  # the positions the prompt's block pass ran
        tok_per_s = (pos - n_prompt_run) / elapsed if elapsed > 0 and pos > n_prompt_run else 0.0
        prompt_tok_per_s = n_prompt_run / prompt_seconds if prompt_seconds > 0 else 0.0
        return Generation(
            prompt_ids=prompt_ids,
            ids=out[:n].tolist(),
            text="".join(text.pieces) if text is not None else "",
            tok_per_s=tok_per_s,
            memory_bytes=checked_memory_bytes(engine.attention, label),
            stop_token=int(stop_token) if stop_token >= 0 else None,
            steps=int(pos),
            notices=notices,
            prompt_tok_per_s=prompt_tok_per_s,
        )


class _TextStream:
    """Generated ids to text as run.c prints it (never a split UTF-8 character), handed to ``on_text``.

    A failure here (decoding, or the caller's ``on_text``) is the caller's, not the plugin's:
    ``failure`` keeps it so that ``generate`` re-raises it as it is."""

    def __init__(self, tokenizer: Tokenizer, first: int, on_text: Callable[[str], None] | None) -> None:
        self.decoder, head = tokenizer.start(first)
        self.on_text = on_text
        self.pieces: list[str] = []
        self.failure: list[BaseException] = []
        self._emit(head)  # the prompt's first token, unless it is BOS

    def _emit(self, s: str) -> None:
        if s:
            self.pieces.append(s)
            if self.on_text is not None:
                self.on_text(s)

    def on_token(self, token: int) -> None:
        try:
            self._emit(self.decoder.feed(token))
        except BaseException as exc:
            self.failure.append(exc)
            raise

    def flush(self) -> None:
        self._emit(self.decoder.flush())
