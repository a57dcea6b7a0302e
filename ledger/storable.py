"""What PostgreSQL will store, checked before anything is written: JSON values and text.

Entry points that take values from callers (``sagas.start``, ``signal``, approval comments,
``ledger.resolve``'s evidence) check them here first, so a bad value is a clear
``ValueError`` naming what is wrong, never a ``DataError``, ``RecursionError`` or
``IntegrityError`` from deep inside a transaction. Callers re-raise it as their own typed
error (``sagas.NotSerializable``, ``sagas.InvalidArgument``, ``ledger``'s ``InvalidResolution``).

Limits, and why:

* NUL (U+0000) anywhere, in a string or a key: PostgreSQL's text and jsonb cannot hold it.
* Lone surrogates (U+D800-U+DFFF): not UTF-8; jsonb refuses them.
* JSON nested deeper than ``MAX_JSON_DEPTH`` containers: Python's encoder recurses once per
  level (100,000 levels is a ``RecursionError``) and so would every page that shows the
  value; also what a circular structure reports. Checked without recursion.
* JSON longer than ``MAX_JSON_BYTES`` once encoded (10 MiB): a run's input or a signal is
  a message, not a file; store large data elsewhere and pass a reference.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 10 * 1024 * 1024

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _string_problem(text: str) -> str:
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode), which PostgreSQL cannot store"
    return ""


def json_storable(value: Any, *, what: str) -> str:
    """``value`` as compact JSON text, or ``ValueError`` saying why PostgreSQL cannot store it
    (not JSON, NUL, a lone surrogate, deeper than ``MAX_JSON_DEPTH``, larger than
    ``MAX_JSON_BYTES``). Tuples become lists and non-string keys strings, as ``json`` does."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    size = 0  # a lower bound of the encoded length: every node takes a byte, a string its length
    while stack:
        item, depth = stack.pop()
        size += 1
        if isinstance(item, str):
            size += len(item)
            problem = _string_problem(item)
            if problem:
                raise ValueError(f"{what} {problem}")
        elif isinstance(item, (dict, list, tuple)):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels (or refers to itself)")
            if isinstance(item, dict):
                for key in item:
                    if isinstance(key, str):
                        stack.append((key, depth + 1))
                children: Iterable[Any] = item.values()
            else:
                children = item
            stack.extend((child, depth + 1) for child in children)
        if size > MAX_JSON_BYTES:
            break
    if size <= MAX_JSON_BYTES:
        try:
            text = json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"{what} is not JSON: {exc}") from None
        size = len(text.encode("utf-8"))
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{what} is larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB as JSON")
    return text


def text_storable(value: Any, *, what: str, max_length: int, required: bool = False, one_line: bool = False) -> str:
    """``value`` unchanged if it is a string PostgreSQL stores as given, or ``ValueError``:
    not a string, empty when ``required``, longer than ``max_length`` characters, NUL or a
    lone surrogate; with ``one_line`` (names, keys, tenants) any control character."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {type(value).__name__}")
    if required and not value.strip():
        raise ValueError(f"{what} must not be empty")
    if len(value) > max_length:
        raise ValueError(f"{what} is longer than {max_length} characters ({len(value)})")
    problem = _string_problem(value)
    if problem:
        raise ValueError(f"{what} {problem}")
    if one_line:
        control = _CONTROL.search(value)
        if control:
            raise ValueError(f"{what} contains a control character (U+{ord(control.group()):04X})")
    return value
