"""pyllama's modules import one another as a tree you can draw: no cycle, counting the imports
inside functions too, and an import inside a function only where it buys something (a heavy
optional library loaded at first use), each named in ``LAZY`` with the reason. No module takes
another's private names (``_name``), by import or by attribute.

The graph is built from the sources, not from ``sys.modules``: ``.py`` files with ``ast`` (module
level and function level), ``.pyx`` files by their import lines (Cython has no ``ast``; its imports
sit at module level). A ``cimport`` is left out: it declares C names for the compiler (a struct, a
function's signature), which is no Python import. ``from x import y`` is an edge to the module ``x.y``
when there is one, else to ``x`` (a package's ``__init__`` when ``x`` is a package); the parent
package a submodule import loads first is no edge of its own, since Python puts the package in
``sys.modules`` before its submodules run. Imports under ``if TYPE_CHECKING:`` are annotations
only, never run, and are left out. ``plugins/`` is the package ``pyllama.plugins``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"pyllama": REPO / "pyllama", "pyllama.plugins": REPO / "plugins"}

# (importing module, imported module or library) -> why the import waits for its first use
LAZY: dict[tuple[str, str], str] = {
    ("pyllama.diff.report", "pyllama.plots"): "matplotlib, only when a report is drawn",
    ("pyllama.cli.diff", "matplotlib"): "matplotlib, only when diff --plot names a figure",
    ("pyllama.diff.report", "pandas"): "pandas, only for a report's DataFrame",
    ("pyllama.sweep.table", "pandas"): "pandas, only for the results' DataFrame",
    ("pyllama.sweep.runner", "pandas"): "pandas, only for the DataFrame a dry run returns",
    ("pyllama.leaderboard.cost", "pandas"): "pandas, only for the DataFrame a dry run returns",
    ("pyllama.sweep.table", "pyarrow"): "pyarrow, only when per-position tables are written",
    ("pyllama.sweep.cluster", "distributed"): "Dask, only when a sweep starts a cluster",
    ("pyllama.hub", "tqdm"): "the progress bar, only when a download runs",
    ("pyllama.diff.harness", "tqdm"): "the progress bar, only for long probes (tqdm.auto probes for IPython)",
    ("pyllama.sweep.cluster", "tqdm"): "the progress bar, only when cells run",
    ("pyllama.diff.probes.ruler_text", "wonderwords"): "its word lists (~50 ms to load), only for a RULER task",
    # pyllama.chat imports jinja2 (13-39 ms, a tenth of `import pyllama`), which only a chat needs
    ("pyllama.model", "pyllama.chat"): "jinja2, only when Model.chat renders a template",
    ("pyllama.diff.probes.retrieval", "pyllama.chat"): "jinja2, only for a retrieval probe on an instruct model",
    ("pyllama.diff.probes.ruler", "pyllama.chat"): "jinja2, only for a RULER task on an instruct model",
    ("pyllama.cli.chat", "pyllama.chat"): "jinja2, only when `pyllama chat` runs (pyllama.cli loads every command)",
    ("pyllama.leaderboard.report", "pandas"): "pandas, only for a board's table",
    ("pyllama.leaderboard.report", "pyllama.plots.leaderboard"): "matplotlib, only when a board is drawn",
    ("pyllama.leaderboard.cli", "pandas"): "pandas, only when --samples-needed reads a table",
    ("pyllama.leaderboard.cli", "pyllama.plots.leaderboard"): "matplotlib, only when --samples-needed draws",
}

_PYX_IMPORT = re.compile(r"^(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+))")


def _modules() -> dict[str, Path]:
    """Module name -> its source file (``x.py`` or ``x.pyx``)."""
    out: dict[str, Path] = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".py", ".pyx") or "build" in path.relative_to(REPO).parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if package == "pyllama" and parts[:1] == ["plugins"]:
                continue
            out[name] = path
    return out


MODULES = _modules()


def _target(name: str) -> str:
    """The pyllama module ``name`` names (its longest prefix that is one), or the library's top name."""
    if name.split(".")[0] != "pyllama":
        return name.split(".")[0]
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


class _Imports(ast.NodeVisitor):
    """Every import of one module: (target, line, inside a function)."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.package = module if is_package else module.rsplit(".", 1)[0]
        self.found: list[tuple[str, int, bool]] = []
        self.depth = 0

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((_target(alias.name), node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self.found.append((sub if sub in MODULES else _target(base), node.lineno, self.depth > 0))


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """Each import statement of ``module``, once per (target, line)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(text))
        return list(dict.fromkeys(visitor.found))
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        match = _PYX_IMPORT.match(line)
        if match:
            found.append((_target(match.group(1) or match.group(2)), lineno, False))
    return found


def _graph() -> tuple[dict[str, dict[str, str]], list[tuple[str, str, str]]]:
    """``(edges, lazy)``: module -> {imported pyllama module: where}, and every import inside a
    function as (module, target, where)."""
    edges: dict[str, dict[str, str]] = {m: {} for m in MODULES}
    lazy = []
    for module, path in MODULES.items():
        for target, lineno, in_function in _imports(module, path):
            where = f"{path.relative_to(REPO)}:{lineno}"
            if in_function:
                lazy.append((module, target, where))
            if target in MODULES and target != module:
                edges[module].setdefault(target, where)
    return edges, lazy


def _find_cycle(edges: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, colouring the path)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_graph_sees_the_package():
    """The scan finds the modules and the imports it is about (or the tests below prove nothing)."""
    edges, lazy = _graph()
    assert {"pyllama.model", "pyllama.diff.harness", "pyllama.chat", "pyllama.plots", "pyllama.plugins.sink"} <= set(
        MODULES
    )
    assert "pyllama.diff" in edges["pyllama.model"]  # from pyllama.diff import ...: the package
    assert "pyllama.attention.registry" in edges["pyllama.diff.harness"]
    assert "pyllama.attention.base" in edges["pyllama.plugins.sink"]  # an import in a .pyx
    assert ("pyllama.diff.report", "pyllama.plots") in {(m, t) for m, t, _ in lazy}
    assert not any(t.startswith("pyllama") and t not in MODULES for targets in edges.values() for t in targets)


def test_find_cycle_finds_one():
    edges = {"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}, "d": {"a": ""}}
    assert _find_cycle(edges) == ["a", "b", "c", "a"]
    edges["c"] = {}
    assert _find_cycle(edges) is None


def test_no_import_cycle():
    edges, _ = _graph()
    cycle = _find_cycle(edges)
    if cycle is not None:
        steps = [f"  {a} -> {b}  ({edges[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
        raise AssertionError("import cycle among pyllama's modules:\n" + "\n".join(steps))


def test_imports_inside_functions_are_the_deliberate_ones():
    _, lazy = _graph()
    print(f"{len(lazy)} imports inside functions, {len({(m, t) for m, t, _ in lazy})} distinct (module, target)")
    unlisted = [f"{where}: {module} imports {target}" for module, target, where in lazy if (module, target) not in LAZY]
    assert not unlisted, (
        "imports inside functions that buy nothing listed: import at the top of the module, or add the "
        "pair to LAZY with the reason\n" + "\n".join(unlisted)
    )
    stale = sorted(set(LAZY) - {(m, t) for m, t, _ in lazy})
    assert not stale, f"LAZY lists imports that are no longer lazy: {stale}"


def _private_uses(module: str, path: Path) -> list[str]:
    """``from pyllama.x import _name`` and ``x._name`` where ``x`` is an imported pyllama module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: set[str] = set()  # local names bound to pyllama modules
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyllama") and not node.level:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    modules.add(alias.asname or alias.name)
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{path.relative_to(REPO)}:{node.lineno}: imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name.startswith("pyllama") and a.asname)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            out.append(f"{path.relative_to(REPO)}:{node.lineno}: reads {node.value.id}.{node.attr}")
    return out


def test_no_module_takes_another_modules_private_names():
    found = [use for module, path in MODULES.items() if path.suffix == ".py" for use in _private_uses(module, path)]
    assert not found, "private names used outside their module (make them public where shared):\n" + "\n".join(found)
