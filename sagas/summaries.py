"""A run's summary: the few fields of its input a person needs to decide about the run (an
order id, a customer, an amount), declared by its workflow and stored on the run at start.

``@workflow(..., summary=...)`` takes a function of the input returning a dict, or a list of
input field names (dotted paths into nested dicts, ``"address.city"``; a digit segment indexes
a list). The console shows the summary, redacted, on the effects queue, the approvals inbox,
the run list and the compensation pages.

A summary never fails a start: a function that raises or returns something that is not a JSON
object is stored as ``{ERROR_KEY: "<what went wrong>"}`` and logged once per workflow version
and kind of error in the process. Values are kept short (``MAX_VALUE_CHARS``: longer strings
are cut, nested values become cut compact JSON text), at most ``MAX_FIELDS`` of them.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ledger.storable import json_storable

log = logging.getLogger("sagas.summaries")

ERROR_KEY = "_summary_error"
MAX_FIELDS = 20
MAX_VALUE_CHARS = 200
MAX_KEY_CHARS = 100

Spec = Callable[[Any], Any] | Sequence[str]

_warned: set[tuple[str, int, str]] = set()


def summary_spec_check(spec: Any) -> tuple[str, ...] | Callable[[Any], Any] | None:
    """``spec`` as the registry keeps it (a tuple of paths, or the function), or ``ValueError``."""
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        raise ValueError("summary must be a function of the input or a list of input field names, "
                         f"not {spec!r}")
    paths = tuple(spec)
    if not paths or len(paths) > MAX_FIELDS:
        raise ValueError(f"summary must name between 1 and {MAX_FIELDS} input fields, not {len(paths)}")
    for path in paths:
        if not isinstance(path, str) or not path or len(path) > MAX_KEY_CHARS or "" in path.split("."):
            raise ValueError(f"summary field names must be non-empty strings such as 'customer' or "
                             f"'address.city' (at most {MAX_KEY_CHARS} characters), not {path!r}")
    return paths


def _lookup(value: Any, path: str) -> tuple[bool, Any]:
    for segment in path.split("."):
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return False, None
    return True, value


def _short(value: Any) -> Any:
    """A scalar as it is (a string cut), anything else as cut compact JSON text."""
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _fields(spec: Spec, input: Any) -> dict[str, Any]:
    if callable(spec):
        made = spec(copy.deepcopy(input))  # the function cannot change the input being stored
        if not isinstance(made, Mapping):
            raise TypeError(f"the summary function returned {type(made).__name__}, not a dict")
        items = list(made.items())
    else:
        items = [(path, found) for path in spec for ok, found in [_lookup(input, path)] if ok]
    if len(items) > MAX_FIELDS:
        raise ValueError(f"the summary has {len(items)} fields; at most {MAX_FIELDS} are kept")
    out: dict[str, Any] = {}
    for key, value in items:
        if not isinstance(key, str):
            raise TypeError(f"summary keys must be strings, not {type(key).__name__}")
        json_storable(value, what=f"summary field {key[:MAX_KEY_CHARS]!r}")  # ValueError: not JSON
        out[key[:MAX_KEY_CHARS]] = _short(value)
    json_storable(out, what="the summary")
    return out


def summary_compute(spec: Spec | None, input: Any, *, workflow: str, version: int) -> dict[str, Any] | None:
    """The summary of a run of ``workflow`` with ``input`` (already checked storable JSON), or
    None when the workflow declares none. Never raises for the workflow's code: an error is
    stored in the summary (``ERROR_KEY``) and logged once."""
    if spec is None:
        return None
    try:
        return _fields(spec, input)
    except Exception as exc:  # the workflow author's code: anything may happen
        problem = f"{type(exc).__name__}: {exc}"[:MAX_VALUE_CHARS]
        problem = problem.encode("utf-8", "replace").decode("utf-8").replace("\x00", "")  # storable
        marker = (workflow, version, type(exc).__name__)
        if marker not in _warned:
            _warned.add(marker)
            log.warning("the summary of workflow %r v%d failed (%s); its runs start with an error marker "
                        "in place of the summary (logged once per process)", workflow, version, problem,
                        exc_info=True)
        return {ERROR_KEY: problem}
