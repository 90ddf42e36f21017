"""The ``pyllama`` command line, one module per command group (the core never imports click):

- ``app``: the group, its one-line errors and ``--debug``;
- ``shared``: the options several commands take, defined once;
- ``generate``: generate, tokenize; ``chat``: chat; ``diff``: diff; ``measure``: bench, trace;
  ``files``: info, convert, download; ``plugins``: plugins; ``pyllama.sweep.cli``: sweep;
  ``pyllama.leaderboard.cli``: leaderboard.
"""

from pyllama.cli.app import EXIT_BROKEN_PIPE, EXIT_USER_ERROR, PyllamaGroup, main
from pyllama.cli.chat import chat
from pyllama.cli.diff import EXIT_NOT_EXACT, diff
from pyllama.cli.files import convert, download, info
from pyllama.cli.generate import generate, tokenize
from pyllama.cli.measure import bench, trace
from pyllama.cli.plugins import plugins
from pyllama.leaderboard.cli import leaderboard
from pyllama.sweep.cli import sweep

# in the order `pyllama --help` listed them before (click sorts them by name anyway)
for _command in (generate, tokenize, info, trace, convert, diff, plugins, download, bench, sweep, chat, leaderboard):
    main.add_command(_command)

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_NOT_EXACT", "EXIT_USER_ERROR", "PyllamaGroup", "main"]
