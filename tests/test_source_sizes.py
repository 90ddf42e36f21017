"""Source files stay readable: no file over ~400 lines and no function over ~80 in the package,
plugins/ and experiments/ (tests may be longer). There are no exceptions: a file that grows past the
limit is split by concern (the Q8_0 C left quant.pyx for kernels/q8_0.h that way).

Python functions are found with ``ast``; Cython ones (``def``/``cdef``/``cpdef`` with a body) by
indentation, which is how Cython itself delimits them. A function's length runs from its ``def``
line to its last non-blank line, docstring and comments included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("pyllama", "plugins", "experiments")
# the style's ~400 and ~80, the "~" read as 5%
MAX_FILE_LINES = 420
MAX_FUNCTION_LINES = 84

# a def whose name is followed by "(" before any "=" (``cdef int n = f(x)`` is a variable)
_CYTHON_DEF = re.compile(r"^(\s*)(?:async\s+)?(?:def|cpdef|cdef)\s[^=(]*?(\w+)\s*\(")


def _sources() -> list[Path]:
    return sorted(
        p
        for folder in FOLDERS
        for p in (REPO / folder).rglob("*")
        if p.suffix in (".py", ".pyx", ".pxd", ".pyi") and "build" not in p.relative_to(REPO).parts
    )


def _python_functions(text: str) -> list[tuple[str, int]]:
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _cython_functions(text: str) -> list[tuple[str, int]]:
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        match = _CYTHON_DEF.match(line)
        if match is None or line.lstrip().startswith(("cdef class", "cdef struct", "cdef extern")):
            continue
        end = i  # the signature may run over several lines: it ends where the parentheses close
        depth = line.count("(") - line.count(")")
        while depth > 0 and end + 1 < len(lines):
            end += 1
            depth += lines[end].count("(") - lines[end].count(")")
        if not lines[end].split("#")[0].rstrip().endswith(":"):
            continue  # a declaration (.pxd, cdef extern), no body
        indent, last = _indent(line), end
        for j in range(end + 1, len(lines)):
            body = lines[j]
            if body.strip() and not body.lstrip().startswith("#") and _indent(body) <= indent:
                break
            if body.strip():
                last = j
        out.append((match.group(2), last - i + 1))
    return out


def _offenders() -> list[str]:
    found = []
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8")
        n_lines = text.count("\n")
        if n_lines > MAX_FILE_LINES:
            found.append(f"{rel}: {n_lines} lines (at most {MAX_FILE_LINES})")
        functions = _python_functions(text) if path.suffix == ".py" else _cython_functions(text)
        for name, length in functions:
            if length > MAX_FUNCTION_LINES:
                found.append(f"{rel}::{name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_no_file_or_function_is_too_long():
    assert _offenders() == []


def test_the_cython_scan_finds_functions_and_skips_declarations():
    source = (
        "cdef extern from *:\n"
        "    int f(int x)\n"
        "cdef int g(int a,\n"
        "           int b) noexcept nogil:\n"
        "    cdef int n = f(a)\n"
        "    # a comment at any indent\n"
        "# here too\n"
        "    return n\n"
        "\n"
        "cdef class C:\n"
        "    cpdef double h(self):\n"
        "        return 1.0\n"
        "cdef int declared(int x) noexcept nogil\n"
    )
    assert _cython_functions(source) == [("g", 6), ("h", 2)]
