"""The two sides of a diff: a plugin run live on an engine, or a recorded run replayed.

Either side fills, for a block of positions of one sequence, the same buffers that the harness
compares: ``logits`` [m, vocab], ``att`` [m, n_layers, q_dim], ``mem`` [m], ``bad_layer`` [m], and
the log-softmax constants of its rows (``softmax``; ``keep_exps``: side A, whose probabilities KL
weighs with). A live side may also write what it computed into a record being made
(:mod:`pyllama.diff.side_cache`), which a later diff replays instead of running the plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pyllama.attention.base import Attention
from pyllama.attention.guard import plugin_calls
from pyllama.attention.registry import create_plugin
from pyllama.attention.spec import PluginSpec
from pyllama.diff._block import classify_block
from pyllama.diff._capture import DiffCapture
from pyllama.diff._metrics import RowSoftmax
from pyllama.diff.branch import decode_answer
from pyllama.engine import Engine
from pyllama.errors import PluginError, PyllamaError
from pyllama.kernels.aligned import zeros_aligned

if TYPE_CHECKING:
    from pyllama.checkpoint.weights import Weights
    from pyllama.config import ModelConfig
    from pyllama.diff.probes import Segment
    from pyllama.diff.side_cache import RecordWriter, SideRecord


class LiveSide:
    """One engine with its block buffers, which a ``DiffCapture`` observing the engine fills: every
    layer's attention output, the final hidden state and the ledger of each position. The engine
    skips its classifier; ``run`` applies it to the whole block afterwards (``classify_block``: the
    same arithmetic, weights read once per block), then the log-softmax of every row.

    ``blocks``: the engine runs a block of positions in one pass (``Engine.forward_block``: the same
    bits as one pass per position); False: one pass per position. ``recording``: a record being
    made, whose rows this side writes as it goes."""

    replayed = False

    def __init__(
        self,
        label: str,
        engine: Engine,
        block: int,
        config: ModelConfig,
        weights: Weights,
        n_threads: int,
        blocks: bool = True,
        keep_exps: bool = True,
    ) -> None:
        self.label = label
        self.engine = engine
        self.classifier = weights.classifier
        self.n_threads = n_threads
        self.blocks = blocks
        self.block = block
        self.recording: RecordWriter | None = None
        self.hidden = zeros_aligned((block, config.dim))  # the classifier's block product reads it
        self.logits = zeros_aligned((block, config.vocab_size))
        self.att = np.zeros((block, config.n_layers, config.q_dim), dtype=np.float32)
        self.mem = np.zeros(block, dtype=np.int64)
        self.bad_layer = np.full(block, -1, dtype=np.int32)  # the engine's nonfinite_layer per position
        self.softmax = RowSoftmax(block, config.vocab_size, keep_exps)
        self.capture = DiffCapture(engine.attention, config, self.att, self.hidden, self.mem, label)
        engine.set_observer(self.capture)

    @property
    def max_positions(self) -> int:
        return self.engine.max_positions

    @property
    def compresses_at_event(self) -> bool:
        return bool(self.engine.attention.compresses_at_event)

    def reset(self) -> None:
        self.engine.reset()

    def release(self) -> None:
        self.engine.set_observer(None)

    def greedy(self, seg: Segment, event: int = -1) -> list[int]:
        """The greedy answer of ``seg``, its prompt run again with the compression event after ``event``."""
        return decode_answer(self.engine, seg, event)

    def run(self, tokens: np.ndarray, start: int, where: str, seq: int, event: bool = False) -> None:
        """Positions ``start..`` of sequence ``seq`` (``tokens``) into the buffers. ``event``: the
        compression event comes after the block's last position; its ledger row is taken after it."""
        m = tokens.shape[0]
        self.at = f"position {start}" if m == 1 else f"positions {start}..{start + m - 1}"
        self.capture.begin(start)
        try:
            if self.blocks:
                self.engine.forward_block(np.ascontiguousarray(tokens, dtype=np.int32), start, classify=False)
                self.bad_layer[:m] = self.engine.block_nonfinite_layers[:m]
            else:
                self._run_positions(tokens, start)
            if event:
                self.at = f"the compression event after position {start + m - 1}"
                self.engine.compress(start + m - 1)
                self.mem[m - 1] = self.capture.memory_bytes()
        except PyllamaError:
            raise
        except Exception as exc:  # the plugin's failure (its attend or memory_bytes), in one line
            raise PluginError(f"{self.label}: failed at {where} {self.at} ({type(exc).__name__}: {exc})") from exc
        classify_block(self.classifier, self.hidden[:m], self.logits, self.n_threads)
        self.softmax.compute(self.logits[:m], self.n_threads)  # here: the two sides run concurrently
        if self.recording is not None:
            row = self.recording.offsets[seq] + start
            self.recording.append(
                row, logits=self.logits[:m], att=self.att[:m], mem=self.mem[:m], bad=self.bad_layer[:m]
            )

    def _run_positions(self, tokens: np.ndarray, start: int) -> None:
        for i in range(tokens.shape[0]):
            pos = start + i
            self.at = f"position {pos}"  # where a failure is reported (run's one wrapper)
            self.engine.forward_block(np.ascontiguousarray(tokens[i : i + 1], dtype=np.int32), pos, classify=False)
            self.bad_layer[i] = self.engine.nonfinite_layer


class ReplaySide:
    """A recorded run of a plugin: ``run`` points the buffers at the record's rows (memory-mapped,
    read-only) and computes their log-softmax. An engine is made only if a retrieval probe needs
    the plugin's greedy answer."""

    replayed = True

    def __init__(
        self,
        label: str,
        spec: PluginSpec | Attention,
        record: SideRecord,
        block: int,
        config: ModelConfig,
        weights: Weights,
        n_threads: int,
        keep_exps: bool = True,
    ) -> None:
        self.label = label
        self.spec = spec
        self.record = record
        self.offsets = record.offsets
        self.config, self.weights, self.n_threads, self.block = config, weights, n_threads, block
        self.softmax = RowSoftmax(block, config.vocab_size, keep_exps)
        self.logits = record.logits[:0]
        self.att = record.att[:0]
        self.mem = record.mem[:0]
        self.bad_layer = record.bad[:0]
        self._engine: Engine | None = None

    @property
    def max_positions(self) -> int:
        return self.record.max_positions

    @property
    def compresses_at_event(self) -> bool:
        return bool(getattr(getattr(self.spec, "cls", None), "compresses_at_event", False))

    def reset(self) -> None:
        pass

    def release(self) -> None:
        pass

    def greedy(self, seg: Segment, event: int = -1) -> list[int]:
        if self._engine is None:
            plugin = create_plugin(self.spec)
            with plugin_calls(self.label, "init"):
                self._engine = Engine(self.config, self.weights, plugin, self.n_threads, max_block=self.block)
        return decode_answer(self._engine, seg, event)

    def run(self, tokens: np.ndarray, start: int, where: str, seq: int, event: bool = False) -> None:
        # a record holds the rows of its own events (their positions are part of its key)
        r = slice(self.offsets[seq] + start, self.offsets[seq] + start + tokens.shape[0])
        rec = self.record
        self.logits, self.att, self.mem, self.bad_layer = rec.logits[r], rec.att[r], rec.mem[r], rec.bad[r]
        self.softmax.compute(self.logits, self.n_threads)
