"""No output replaces an input: the one check every command that writes files runs before any work.

A command names what it reads and what it will write, and ``check_outputs`` refuses, in one line,
an output that is one of its inputs or another of its outputs (``diff --json MODEL``, ``--csv
TOKENIZER``, ``--plot x.png --json x.png``). Two names are the same file when they resolve to the
same path (symbolic links followed) or, when both exist, share a device and inode (hard links).

    check_outputs(
        {**model_inputs(checkpoint, tokenizer), **probe_inputs(probe), **plugin_inputs(a, b)},
        {"--json": json_path, "--csv": csv_path, "--plot": plot_path},
    )

Inputs are keyed by what they are (``"the model"``), outputs by the option that names them
(``"--json"``); both are how the message names them, and a value of None is left out. A command
added later calls the same function with its own names; the helpers below give the inputs of a
model, a probe and plugin specs the way the loaders will resolve them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from pyllama import hub
from pyllama.diff.probes import PROBE_NAMES
from pyllama.errors import InputError, PyllamaError
from pyllama.load import BESIDE

__all__ = ["check_outputs", "diff_inputs", "model_inputs", "plugin_inputs", "probe_inputs", "same_file"]

PathLike = str | os.PathLike
# what names the files: {name: path}, or (name, path) pairs when names repeat (a folder's outputs)
Named = Mapping[str, PathLike | None] | Iterable[tuple[str, PathLike | None]]
# path/to/file.py:Class[:args] (or .pyx): the plugin spec grammar's local-file form
_FILE_SPEC = re.compile(r"^(?P<path>.+?\.pyx?):[A-Za-z_][A-Za-z0-9_]*(?::.*)?$")


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once links are resolved, or (both
    existing) the same device and inode, which also catches a hard link."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:  # one of them does not exist yet: no hard link to compare
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _pairs(named: Named) -> list[tuple[str, PathLike]]:
    items = named.items() if isinstance(named, Mapping) else named
    return [(name, path) for name, path in items if path is not None]


def check_outputs(inputs: Named, outputs: Named) -> None:
    """InputError naming the option and the file when an output is one of ``inputs`` or an earlier
    one of ``outputs``. Call it before any work: nothing is read or written here beyond ``stat``."""
    given_inputs, given_outputs = _pairs(inputs), _pairs(outputs)
    for i, (option, out) in enumerate(given_outputs):
        for what, path in given_inputs:
            if same_file(out, path):
                shown = "" if os.fspath(path) == os.fspath(out) else f" {os.fspath(path)}"
                raise InputError(
                    f"{option} {os.fspath(out)}: is {what}{shown} (the same file): write it to another name"
                )
        for other, path in given_outputs[:i]:
            if same_file(out, path):
                raise InputError(
                    f"{option} {os.fspath(out)}: is also the file of {other}: give each output its own name"
                )


def model_inputs(checkpoint: PathLike | None, tokenizer: PathLike | None = None) -> dict[str, str]:
    """The files reading ``checkpoint`` (with ``tokenizer``) opens, resolved as ``pyllama.load``
    resolves them: downloaded names to their cached files, and with no tokenizer given, a downloaded
    model's own tokenizer or the ``tokenizer.bin`` beside the checkpoint (a GGUF does not read it,
    but it is kept safe all the same: nothing is opened here to tell). A name that does not resolve
    is left as given: loading it reports the problem."""
    out: dict[str, str] = {}
    if checkpoint is not None:
        model = _resolved(checkpoint, "model")
        out["the model"] = model
        if tokenizer is None:
            companion = hub.companion_tokenizer(model) if os.path.isfile(model) else None
            beside = os.path.join(os.path.dirname(model), BESIDE)
            tokenizer = companion or (beside if os.path.isfile(beside) else None)
    if tokenizer is not None:
        out["the tokenizer"] = _resolved(tokenizer, "tokenizer")
    return out


def _resolved(path: PathLike, kind: str) -> str:
    try:
        return os.fspath(hub.resolve(path, kind=kind))
    except PyllamaError:
        return os.fspath(path)


def probe_inputs(probe: object, what: str = "the probe text") -> dict[str, str]:
    """``{what: path}`` when ``probe`` is a text file a diff would read (a built-in probe's name is
    not a file, even if a file of that name exists: ``load_probe`` takes the name)."""
    if not isinstance(probe, (str, os.PathLike)) or probe in PROBE_NAMES:
        return {}
    return {what: os.fspath(probe)} if os.path.exists(probe) else {}


def plugin_inputs(*specs: object) -> dict[str, str]:
    """The plugin files named by specs of the form ``path/to/file.py:Class[:args]`` (or ``.pyx``),
    given as strings or resolved (a ``PluginSpec`` whose origin is ``file PATH``)."""
    out: dict[str, str] = {}
    for spec in specs:
        origin = getattr(spec, "origin", None)
        if isinstance(origin, str) and origin.startswith("file "):
            out.setdefault(f"the plugin file of {spec}", os.path.expanduser(origin[len("file ") :]))
            continue
        m = _FILE_SPEC.match(spec) if isinstance(spec, str) else None
        if m is not None:
            out.setdefault(f"the plugin file of {spec}", os.path.expanduser(m.group("path")))
    return out


def diff_inputs(model_file: PathLike | None, tokenizer: object, probe: object, *specs: object) -> dict[str, str]:
    """The files a diff read (for its report's writers): the model file, the tokenizer's file (a
    tokenizer read from a file is named by its path), a probe text and plugin files."""
    files = {"the model": os.fspath(model_file)} if model_file is not None else {}
    name = getattr(tokenizer, "name", None)
    if isinstance(name, str) and os.path.isfile(name):
        files["the tokenizer"] = name
    return {**files, **probe_inputs(probe), **plugin_inputs(*specs)}
