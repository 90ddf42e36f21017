"""The one exception family of pyllama.

Every error a user can cause (a bad file, a bad argument, a prompt that does not fit) is a
``PyllamaError`` whose message is one line: what was expected, what was found, and what to do.
The CLI prints that line and exits non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations


class PyllamaError(Exception):
    """Base class of every error pyllama reports to a user."""


class CheckpointError(PyllamaError):
    """A model file is missing, truncated, of a foreign format or internally inconsistent."""


class TokenizerError(PyllamaError):
    """A tokenizer file is unreadable or does not fit the model."""


class PluginError(PyllamaError):
    """An attention plugin is unknown, misconfigured or breaks the attention contract."""


class InputError(PyllamaError):
    """A prompt, probe or option value cannot be used as given."""


class PositionError(InputError, IndexError):
    """A token id outside the vocabulary, or a position a plugin cannot take: beyond what it holds,
    or out of order for a plugin whose state follows the sequence. Also an IndexError, which is
    what an out-of-range index is in Python."""


class DownloadError(PyllamaError):
    """A known model could not be fetched, or what arrived is not the published file."""


class NonFiniteError(PyllamaError):
    """A forward pass produced NaN or Inf (bad weights, or a plugin that wrote them)."""

    # what the engine saw go bad first, by its stage code (pyllama/engine/core.pxd NONFINITE_*)
    STAGES = (
        "its input: the token's embedding row holds NaN or Inf",
        "the query/key/value projections: the layer's attention weights or norm hold NaN or Inf",
        "the attention output written by the plugin {plugin}",
        "the attention's output projection: the layer's wo weights hold NaN or Inf",
        "the feed-forward block: the layer's feed-forward weights or norm hold NaN or Inf",
        "the logits: the final norm or the classifier weights hold NaN or Inf",
    )

    @classmethod
    def at(cls, pos: int, layer: int, stage: int, n_layers: int, plugin: str) -> NonFiniteError:
        """The one-line error for a forward pass whose first non-finite value was at ``layer``
        (-1: only in the logits) of position ``pos``."""
        if layer < 0:
            where, stage = f"after the last layer ({n_layers - 1})", len(cls.STAGES) - 1
        else:
            where = f"layer {layer}"
        what = cls.STAGES[stage].format(plugin=plugin)
        return cls(f"non-finite values (NaN or Inf) at position {pos}, {where}, first in {what}; generation stopped")
