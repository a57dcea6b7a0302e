"""What a workflow definition's hash covers: the source of the module that defines it.

``definition_source(fn)`` is the text recorded for a definition (and diffed on the
console's versions page): the whole source file of the module that defines ``fn``, minus
the *other* workflow definitions in it (functions decorated with ``@workflow``, by that
name, an alias imported from ``sagas``, or ``<anything>.workflow``). So the module's
imports, constants, helper functions and classes are covered, and editing any of them gives
every workflow of the module a new hash; adding ``version=3`` next to an unchanged
``version=2`` does not change version 2's hash.

``definition_hash(source)`` is the SHA-256 of that text with what cannot change behaviour
taken out: comments, docstrings, blank lines and trailing blanks (never inside a string
literal, where they are data). Any other edit, even a formatting one, changes the hash.

Not covered (a change there keeps the hash, so version routing cannot see it): code in
other modules (helpers or step functions imported from elsewhere, connectors, libraries),
data files, settings and the environment. ``ctx.step`` journaling and non-determinism
detection are what protect runs from those. When the module's source file cannot be read
(a function made in a REPL or by ``exec``, a module shipped without its ``.py``), the
text is the function's own source, or failing that its bytecode.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import os
import re
import sys
import textwrap
import tokenize
from collections.abc import Callable
from typing import Any

_WORKFLOW_MODULES = ("sagas", "sagas.versions.registry")


def function_source(fn: Callable[..., Any]) -> str:
    """The function's own source, dedented, trailing blanks removed (the fallback text)."""
    try:
        raw = inspect.getsource(fn)
    except (OSError, TypeError):  # defined in a REPL or exec(): the bytecode instead
        raw = repr(fn.__code__.co_code) + repr(fn.__code__.co_consts)
    lines = [line.rstrip() for line in textwrap.dedent(raw).splitlines()]
    return "\n".join(lines).strip() + "\n"


def definition_source(fn: Callable[..., Any]) -> str:
    """The text a definition's hash covers (see the module's docstring)."""
    fn = inspect.unwrap(fn)
    text = _module_text(fn)
    if text is None:
        return function_source(fn)
    try:
        tree = ast.parse(text)
    except SyntaxError:  # the file changed since it was imported
        return function_source(fn)
    lines = text.splitlines()
    dropped = _other_workflow_lines(tree, fn.__code__.co_firstlineno)
    kept = "\n".join(line.rstrip() for number, line in enumerate(lines, start=1) if number not in dropped)
    return re.sub(r"\n{4,}", "\n\n\n", kept).strip() + "\n"  # no gap wider than two blank lines


def definition_hash(source: str) -> str:
    """SHA-256 of ``source`` without its comments, docstrings, blank lines and trailing blanks."""
    return hashlib.sha256(_code_only(source).encode("utf-8")).hexdigest()


def _module_text(fn: Callable[..., Any]) -> str | None:
    """The source file of ``fn``'s module, if ``fn`` is defined in it."""
    module = sys.modules.get(fn.__module__)
    path = getattr(module, "__file__", None)
    code = getattr(fn, "__code__", None)
    if not path or not path.endswith(".py") or code is None:
        return None
    if os.path.realpath(path) != os.path.realpath(code.co_filename):
        return None
    try:
        with tokenize.open(path) as handle:  # honours an encoding declaration
            return handle.read()
    except (OSError, SyntaxError):
        return None


def _other_workflow_lines(tree: ast.Module, own_first_line: int) -> set[int]:
    """Line numbers of every ``@workflow``-decorated function in ``tree`` except the one
    starting at ``own_first_line`` (its first decorator's line, as in ``co_firstlineno``)."""
    names = {"workflow"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in _WORKFLOW_MODULES:
            names.update(alias.asname for alias in node.names if alias.name == "workflow" and alias.asname)

    def is_workflow(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return (isinstance(target, ast.Name) and target.id in names) or (
            isinstance(target, ast.Attribute) and target.attr == "workflow"
        )

    dropped: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.decorator_list:
            continue
        first = min(d.lineno for d in node.decorator_list)
        if first != own_first_line and any(is_workflow(d) for d in node.decorator_list):
            dropped.update(range(first, (node.end_lineno or node.lineno) + 1))
    return dropped


def _code_only(source: str) -> str:
    """``source`` without comments, docstrings, blank lines and trailing blanks, leaving
    string literals as they are. Falls back to ``source`` if it does not parse."""
    try:
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, tokenize.TokenError):
        return source
    lines = source.splitlines()
    cut: dict[int, list[tuple[int, int]]] = {}  # line number -> [start, end) columns to remove

    def remove(start: tuple[int, int], end: tuple[int, int]) -> None:
        (row, col), (end_row, end_col) = start, end
        for number in range(row, end_row + 1):
            cut.setdefault(number, []).append((col if number == row else 0,
                                               end_col if number == end_row else len(lines[number - 1])))

    def chars(row: int, byte_col: int) -> int:  # ast columns are UTF-8 byte offsets
        return len(lines[row - 1].encode("utf-8")[:byte_col].decode("utf-8", "ignore"))

    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                first.value.value, str
            ):
                docstrings.add(id(first.value))
                remove((first.lineno, chars(first.lineno, first.col_offset)),
                       (first.end_lineno or first.lineno, chars(first.end_lineno or first.lineno,
                                                                first.end_col_offset or 0)))
    # Lines that end inside a string literal keep their trailing blanks; lines inside one are
    # kept even when blank.
    open_at_end: set[int] = set()
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and id(node) not in docstrings:
            end = node.end_lineno or node.lineno
            if end > node.lineno and (isinstance(node, ast.JoinedStr) or isinstance(node.value, (str, bytes))):
                open_at_end.update(range(node.lineno, end))
                inside.update(range(node.lineno + 1, end + 1))
    for token in tokens:
        if token.type == tokenize.COMMENT:
            remove(token.start, token.end)

    out = []
    for number, line in enumerate(lines, start=1):
        for start, end in sorted(cut.get(number, []), reverse=True):
            line = line[:start] + line[end:]
        if number not in open_at_end:
            line = line.rstrip()
        if line.strip() or number in inside:
            out.append(line)
    return "\n".join(out) + "\n"
