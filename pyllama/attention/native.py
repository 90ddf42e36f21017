"""Cython plugins in a local file (``path/to/file.pyx:ClassName``), compiled on first use.

A researcher writes one ``cdef class`` (usually a ``GatherAttention`` subclass, see
``experiments/random_evict_native.pyx``) and names it in a spec like a Python file plugin. The file
is compiled with the package's own build configuration (:mod:`pyllama.build_config`: the same
compiler flags, Cython directives and ``PYLLAMA_*`` switches as ``setup.py``), against the ``.pxd``
files installed with pyllama, into a cache folder keyed by the file's contents, those ``.pxd``
files, the build configuration and the Python/pyllama versions: the first use takes seconds, later
ones import the built module.

The build runs in a child process so that compiler output never reaches the terminal; on failure
the whole log is kept next to the build and the error names its first error line and its path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

from pyllama.build_config import BuildConfig, build_config, switches
from pyllama.errors import PluginError
from pyllama.hub import cache_dir
from pyllama.version import __version__

# Run in the child: cythonize one module and build it in place (argv: pyx, include dir, the build
# configuration as JSON: compile args, link args, Cython directives).
_BUILD = """
import json
import sys
import numpy as np
from Cython.Build import cythonize
from setuptools import Distribution, Extension

pyx, include, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ext = Extension(pyx[:-4], [pyx], include_dirs=[np.get_include()], extra_compile_args=cfg["compile_args"],
                extra_link_args=cfg["link_args"])
modules = cythonize([ext], include_path=[include, "."], quiet=True, compiler_directives=cfg["directives"])
dist = Distribution({"ext_modules": modules, "script_args": ["build_ext", "--inplace", "-q"]})
dist.parse_command_line()
dist.run_commands()
"""


def compiler_command() -> list[str]:
    """The C compiler setuptools uses for extensions (Python's own CC)."""
    return (sysconfig.get_config_var("CC") or "cc").split()


@functools.lru_cache(maxsize=4)
def _config_for(switches: tuple[tuple[str, bool], ...]) -> BuildConfig:
    return build_config(compiler_command(), {name: "1" if on else "" for name, on in switches})


def plugin_build_config() -> BuildConfig:
    """The package's build configuration under the current PYLLAMA_* switches (probed once per setting)."""
    return _config_for(tuple(sorted(switches().items())))


def _first_error(log: str) -> str:
    """The line of a build log that says what went wrong (Cython's or the C compiler's)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("Error compiling Cython file"):
            # Cython prints the source excerpt, then "file:line:col: message"
            for follow in lines[i + 1 :]:
                if ".pyx:" in follow and follow.count(":") >= 3:
                    return follow.rsplit("/", 1)[-1]
        if " error: " in ln or ln.startswith("error:"):
            return ln.rsplit("/", 1)[-1]
    return lines[-1] if lines else "no output"


def _declarations() -> bytes:
    """pyllama's .pxd files: a plugin is compiled against them (the layout of GatherAttention and
    friends), so a change to any of them must build it again, not load a stale binary."""
    package = Path(__file__).resolve().parents[1]
    return b"".join(p.read_bytes() for p in sorted(package.rglob("*.pxd")))


def build_pyx(path: Path, label: str, cache: Path | None = None) -> Path:
    """The compiled extension module of ``path`` (built now unless the cache has it)."""
    source = path.read_bytes()
    cfg = plugin_build_config()
    tag = f"{sys.implementation.cache_tag}-{__version__}-{cfg.cache_tag}"
    digest = hashlib.sha1(source + _declarations() + tag.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in path.stem)
    module = f"pyllama_user_{stem}_{digest}"
    folder = (cache if cache is not None else cache_dir()) / "plugins" / module
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    built = folder / f"{module}{suffix}"
    if built.is_file():
        return built

    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{module}.", dir=folder.parent))
    (work / f"{module}.pyx").write_bytes(source)
    for pxd in path.parent.glob("*.pxd"):  # the file's own declarations, cimported by name
        shutil.copy(pxd, work / pxd.name)
    include = str(Path(__file__).resolve().parents[2])  # the folder holding the pyllama package
    settings = json.dumps({"compile_args": cfg.compile_args, "link_args": cfg.link_args, "directives": cfg.directives})
    # the build is silent and slow: say once why nothing happens for a while (a cached build says nothing)
    print(f"compiling {path.name} (first use; later runs load the cached build)...", file=sys.stderr, flush=True)
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, f"{module}.pyx", include, settings],
        cwd=work,
        capture_output=True,
        text=True,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or not (work / built.name).is_file():
        (work / "build.log").write_text(log)
        raise PluginError(
            f"attention plugin {label}: compiling {path.name} failed: {_first_error(log)} "
            f"(full log: {work / 'build.log'})"
        )
    try:
        work.rename(folder)
    except OSError:  # built meanwhile by another process: use theirs
        shutil.rmtree(work, ignore_errors=True)
    return built


def import_pyx(path: Path, label: str) -> types.ModuleType:
    """Compile (or find in the cache) and import a Cython plugin file."""
    built = build_pyx(path, label)
    name = built.name.split(".", 1)[0]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, built)
    if spec is None or spec.loader is None:
        raise PluginError(f"attention plugin {label}: cannot import the module built from {path.name}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(
            f"attention plugin {label}: importing {path.name} failed ({type(exc).__name__}: {exc})"
        ) from exc
    sys.modules[name] = module
    return module
