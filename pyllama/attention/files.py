"""Plugins in local files: ``path/to/file.py:ClassName`` imported on demand, ``file.pyx:ClassName``
compiled on first use (:mod:`pyllama.attention.native`); each file version is imported once and
its class checked against the contract (:mod:`pyllama.attention.contract`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import types
from pathlib import Path

from pyllama.attention.base import Attention
from pyllama.attention.contract import check_plugin_class
from pyllama.attention.native import import_pyx
from pyllama.errors import PluginError

__all__ = ["load_file_plugin"]

_file_classes: dict[tuple[str, float, str], type] = {}


def load_file_plugin(path: str, class_name: str) -> type:
    """The class ``class_name`` of the Python (or Cython) file ``path``, imported once per file version."""
    label = f"{path}:{class_name}"
    file = Path(path).expanduser()
    if not file.is_file():
        raise PluginError(f"attention plugin {label}: no such file {path}")
    file = file.resolve()
    key = (str(file), file.stat().st_mtime, class_name)
    if key in _file_classes:
        return _file_classes[key]
    if file.suffix == ".pyx":
        module = import_pyx(file, label)
    else:
        module = _import_python_file(file, path, label)
    module_name = module.__name__
    cls = getattr(module, class_name, None)
    if cls is None:
        found = [
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Attention) and v.__module__ == module_name
        ]
        raise PluginError(
            f"attention plugin {label}: {path} has no class {class_name!r}"
            + (f"; it defines {', '.join(found)}" if found else "; it defines no Attention subclass")
        )
    check_plugin_class(cls, label)
    _file_classes[key] = cls
    return cls


def _import_python_file(file: Path, path: str, label: str) -> types.ModuleType:
    digest = hashlib.sha1(f"{file}:{file.stat().st_mtime}".encode()).hexdigest()[:10]
    module_name = f"pyllama_user_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', file.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise PluginError(f"attention plugin {label}: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise PluginError(f"attention plugin {label}: importing {path} failed ({type(exc).__name__}: {exc})") from exc
    return module
