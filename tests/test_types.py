"""The types hold: mypy is clean on the package, and every compiled module's ``.pyi`` stub is what
the compiled module really is.

mypy reads the stubs, never the ``.pyx``, so a stub that drifts from its module hides real errors.
stubtest and three checks of this file keep them together:

* mypy's ``stubtest`` imports each compiled module and compares it with its stub: names present
  on one side only, function and method signatures (parameter names, kinds, defaults), module
  constants. ``stubtest_allowlist.txt`` lists what it cannot see in a Cython module, with why.
* stubtest reads no base classes, and a ``cdef class`` constructor is a slot wrapper without a
  signature, so two checks here read them from the module: each stub class names its runtime
  bases, and each stub ``__init__`` has the parameters and defaults of the signature Cython embeds
  in the class docstring (``embedsignature``, ``pyllama/build_config.py``).
* every compiled module that Python code can use (it defines a class or function, or a ``.py``
  imports it) has a stub.

mypy and stubtest come with the test extras; a machine without them skips with the reason. mypy
keeps its cache in the repository's ``.mypy_cache`` (git-ignored): a first run takes ~8 s, a later one
under 1 s. stubtest builds its stubs afresh each time (~7 s).
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALLOWLIST = REPO / "tests" / "stubtest_allowlist.txt"
PYTHON_USERS = ("pyllama", "plugins", "tests", "benchmarks", "experiments")  # where .py files import modules


def _module_name(path: Path) -> str:
    """``plugins/sink.pyx`` -> ``pyllama.plugins.sink`` (plugins/ is packaged as pyllama.plugins)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(["pyllama", *parts] if parts[0] == "plugins" else parts)


def _compiled() -> dict[str, Path]:
    """Every compiled module of the package: its name and its ``.pyx``."""
    found = [p for d in ("pyllama", "plugins") for p in (REPO / d).rglob("*.pyx") if "build" not in p.parts]
    return {_module_name(p): p for p in sorted(found)}


def _stubbed() -> dict[str, Path]:
    """The compiled modules that have a stub: name -> ``.pyi``."""
    return {name: pyx.with_suffix(".pyi") for name, pyx in _compiled().items() if pyx.with_suffix(".pyi").exists()}


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True)


def test_mypy_is_clean_on_the_package():
    proc = _run("mypy")  # the files and options: pyproject.toml's [tool.mypy]
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _stub_tree(root: Path) -> Path:
    """A folder where mypy finds ``pyllama.plugins``'s stubs: a ``pyllama`` of links to the package's
    entries and to ``plugins/`` (the build maps plugins/ to pyllama.plugins; mypy's search cannot)."""
    package = root / "pyllama"
    package.mkdir(parents=True)
    for entry in (REPO / "pyllama").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "plugins").symlink_to(REPO / "plugins")
    return root


def test_stubs_match_the_compiled_modules(tmp_path):
    stubs = _stub_tree(tmp_path / "stubs")
    config = tmp_path / "mypy.ini"
    # the package's own .py files give the stubs their types; test_mypy_is_clean_on_the_package checks them
    config.write_text(f"[mypy]\nmypy_path = {stubs}\nignore_missing_imports = true\nfollow_imports = silent\n")
    # run outside the repository, so that its pyllama/ folder is neither the runtime nor the stubs'
    args = ["mypy.stubtest", "--concise", "--mypy-config-file", str(config), "--allowlist", str(ALLOWLIST)]
    proc = _run(*args, *_stubbed(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _stub_classes(path: Path) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)}


def _imported_names(path: Path) -> dict[str, str]:
    """A stub's ``from m import X``: X -> ``m.X``."""
    names = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return names


def test_stub_classes_name_their_runtime_bases():
    wrong = []
    for name, stub in _stubbed().items():
        module, imported = importlib.import_module(name), _imported_names(stub)
        for cls_name, node in _stub_classes(stub).items():
            if not hasattr(module, cls_name):
                continue  # a stub class the module lacks: stubtest names it
            said = [imported.get(ast.unparse(b), f"{name}.{ast.unparse(b)}") for b in node.bases] or ["builtins.object"]
            runtime = [f"{b.__module__}.{b.__qualname__}" for b in getattr(module, cls_name).__bases__]
            if said != runtime:
                wrong.append(f"{name}.{cls_name}: the stub says {said}, the module {runtime}")
    assert not wrong, "\n".join(wrong)


def _split_top(text: str, sep: str) -> list[str]:
    """Split at each ``sep`` outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _embedded_init(cls: type) -> list[tuple[str, str | None]] | None:
    """The constructor Cython writes as the first line of the class docstring, as (name, default
    source or None): ``Engine(config, Attention attention, int n=1)`` -> config, attention, n=1.
    None: the class defines no ``__init__`` of its own."""
    first = (cls.__doc__ or "").split("\n", 1)[0]
    if "__init__" not in vars(cls) or not first.startswith(f"{cls.__name__}(") or not first.endswith(")"):
        return None
    params = []
    for item in filter(None, (s.strip() for s in _split_top(first[len(cls.__name__) + 1 : -1], ","))):
        head, *default = _split_top(item, "=")  # "int n: int = 0" -> "int n: int ", " 0"
        name = head.split(":")[0].split()[-1]  # the C type before the name and the annotation after it go
        params.append((name, default[0].strip() if default else None))
    return params


def _stub_init(node: ast.ClassDef) -> list[tuple[str, ast.expr | None]] | None:
    """The stub's ``__init__`` parameters after ``self``: (name, default or None)."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            args = item.args
            positional = args.posonlyargs + args.args
            defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
            named = list(zip([a.arg for a in positional], defaults, strict=True))
            named += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
            return named[1:]
    return None


def _default_value(module, source: str) -> object:
    """The value of a default as Cython embeds it: a literal, a Python name of the module, or a C
    constant (``cdef enum``), which has no Python value, so its line in the ``.pyx`` is read."""
    try:
        return eval(source, vars(module))
    except NameError:
        pyx = _compiled()[module.__name__].read_text(encoding="utf-8")
        match = re.search(rf"^\s*{re.escape(source)}\s*=\s*([^#\n]+)", pyx, re.MULTILINE)
        assert match is not None, f"{module.__name__}: default {source} is neither a Python name nor a C constant"
        return eval(match.group(1), {})


def _init_problems(module, cls: type, node: ast.ClassDef) -> list[str]:
    runtime, stub = _embedded_init(cls), _stub_init(node)
    if runtime is None:
        return [] if stub is None else ["the stub has an __init__, the module embeds none to check it against"]
    if stub is None:
        return [f"the stub has no __init__, the module's takes {[n for n, _ in runtime]}"]
    if [n for n, _ in stub] != [n for n, _ in runtime]:
        return [f"__init__ parameters: the stub has {[n for n, _ in stub]}, the module {[n for n, _ in runtime]}"]
    problems = []
    for (name, said), (_, source) in zip(stub, runtime, strict=True):
        if (said is None) != (source is None):
            problems.append(f"__init__ parameter {name}: a default on one side only")
        elif said is not None and source is not None and not (isinstance(said, ast.Constant) and said.value is ...):
            value = _default_value(module, source)
            if ast.literal_eval(said) != value:
                problems.append(
                    f"__init__ parameter {name}: the stub's default is {ast.unparse(said)}, the module's {value!r}"
                )
    return problems


def test_stub_constructors_match_the_compiled_classes():
    wrong = []
    for name, stub in _stubbed().items():
        module = importlib.import_module(name)
        for cls_name, node in _stub_classes(stub).items():
            if not hasattr(module, cls_name):
                continue  # a stub class the module lacks: stubtest names it
            wrong += [f"{name}.{cls_name}: {p}" for p in _init_problems(module, getattr(module, cls_name), node)]
    assert not wrong, "\n".join(wrong)


def _imports_of(path: Path) -> set[str]:
    """Every module a ``.py`` file imports by name (``from a import b`` counts both a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    return found


def test_every_compiled_module_python_can_use_has_a_stub():
    imported = set().union(*(_imports_of(p) for d in PYTHON_USERS for p in (REPO / d).rglob("*.py")))
    missing = []
    for name, pyx in _compiled().items():
        module = importlib.import_module(name)
        public = {n: v for n, v in vars(module).items() if not n.startswith("_")}
        defined = [n for n, v in public.items() if getattr(v, "__module__", None) == name]
        if (defined or name in imported) and not pyx.with_suffix(".pyi").exists():
            why = f"defines {', '.join(sorted(defined))}" if defined else "is imported by Python code"
            missing.append(f"{pyx.relative_to(REPO)} {why} but has no .pyi beside it")
    assert not missing, "\n".join(missing)
