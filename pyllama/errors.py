"""The one exception family of pyllama.

Every error a user can cause (a bad file, a bad argument, a prompt that does not fit) is a
``PyllamaError`` whose message is one line: what was expected, what was found, and what to do.
The CLI prints that line and exits non-zero; ``--debug`` shows the traceback.
"""


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


class DownloadError(PyllamaError):
    """A known model could not be fetched, or what arrived is not the published file."""
