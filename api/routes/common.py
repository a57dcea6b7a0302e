"""What the API's routes share: free text, console actions' refusals as problems, ids from
the URL, and keyset pages (a ``cursor`` in, a ``next`` link out)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest
from pydantic import AfterValidator, BeforeValidator, Field

from api.errors import Problem
from ledger.errors import InvalidResolution
from operators.selectors.paging import BadCursor, Cursor, decode_cursor
from operators.services.actions import MISSING_EXPECTED, Denied, Incomplete, Refused
from sagas.errors import FourEyesViolation, InvalidArgument, NotSerializable

MAX_PAGE = 200  # rows a page may ask for (``limit``)
# What the schema says of a name or key on one line (a workflow, a tenant, a business key): no NUL
# and no control character, as the engine's checks (``sagas.validation``) refuse them.
ONE_LINE = r"^[^\x00-\x1f\x7f-\x9f]*$"
# A page cursor, as the previous page's ``cursor`` gave it (``operators.selectors.paging``), or empty:
# microseconds since 1970 (17 digits reach the year 5000) and the last row's id, a UUID's 32 hex
# digits (runs) or a number (effects, approvals; 18 digits stay within PostgreSQL's bigint).
CURSOR = r"^([0-9]{1,17}_[0-9a-f]{32})?$"
INT_CURSOR = r"^([0-9]{1,17}_[0-9]{1,18})?$"
# A run's id (a UUID, lower or upper case, with or without its dashes), or empty.
UUID_OR_EMPTY = r"^([0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12})?$"


def one_of(values: Any) -> str:
    """The pattern of a query filter that takes one of ``values`` exactly, or empty (no filter)."""
    return choice(values)[:-1] + "?$"


def choice(values: Any) -> str:
    """The pattern of a value that is one of ``values`` exactly."""
    return "^(" + "|".join(re.escape(str(v)) for v in values) + ")$"


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain a NUL character")
    return text


# Free text the audit log and the journal keep as sent; the schema says "no NUL" as a pattern.
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, AfterValidator(_no_nul), Field(json_schema_extra={"pattern": NO_NUL})]

_NUMBER = re.compile(r"[+-]?\d+(\.\d*)?([eE][+-]?\d+)?")


def _iso_only(value: Any) -> Any:
    """A date-time is ISO 8601 text, as the schema says (``format: date-time``): pydantic would
    also take a number as seconds since 1970 (``created_to=0.5``), which the schema refuses."""
    if isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
        raise ValueError("must be an ISO 8601 date-time (2026-12-07T09:30:00Z), not a number")
    return value


def _in_utc(value: datetime) -> datetime:
    """In UTC (no offset: taken as UTC), as PostgreSQL is given it: it refuses offsets past
    ±15:59, which ISO 8601 allows ("-18:18"). A time that leaves years 1 to 9999 once in UTC
    (0001-01-01T00:00+01:00) is the first or last time there is: no run is created outside them."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return (datetime.min if value.year == 1 else datetime.max).replace(tzinfo=UTC)


IsoDateTime = Annotated[datetime, BeforeValidator(_iso_only), AfterValidator(_in_utc)]  # as the schema's date-time


def integral_float(value: Any) -> Any:
    """JSON Schema's integer includes 594.0, which a strict int field (never "5" or true) would
    refuse: ``Annotated[int, Field(strict=True, ge=..), BeforeValidator(integral_float)]``."""
    return int(value) if isinstance(value, float) and value.is_integer() else value

# What ``str.strip`` takes away (Python's whitespace): a name may not start or end with one.
_SPACE = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


# Text that must say something: at least one character that is not a space, and no NUL.
SAID = f"^[^\\x00]*[^{_SPACE}\\x00][^\\x00]*$"


def name_pattern(most: int) -> str:
    """1 to ``most`` characters, no NUL, no space around them (as ``spend_names_checked``)."""
    return f"^[^{_SPACE}\\x00]([^\\x00]{{0,{most - 2}}}[^{_SPACE}\\x00])?$"

API_MISSING_EXPECTED = ("send `expected`: the state you saw (for instance WAITING), so it can be checked that "
                        "nothing changed since; nothing was changed")


@contextmanager
def console_action(what: str, object_id: Any) -> Iterator[None]:
    """Run a console action (``operators.services``) on ``what`` ``object_id``: its exceptions as
    problems. The action audits itself (denied, refused, done); this only says it to the caller."""
    try:
        yield
    except ObjectDoesNotExist:
        raise Problem("not-found", f"no {what} {str(object_id)[:100]!r}") from None
    except Denied as exc:
        raise Problem("forbidden", str(exc)) from None
    except Incomplete as exc:
        raise Problem("validation", API_MISSING_EXPECTED if str(exc) == MISSING_EXPECTED else str(exc)) from None
    except Refused as exc:
        cause = exc.__cause__
        if isinstance(cause, FourEyesViolation):
            raise Problem("four-eyes", str(exc)) from None
        if isinstance(cause, (InvalidArgument, NotSerializable, InvalidResolution, ValueError)):
            raise Problem("validation", str(exc)) from None
        raise Problem("stale-state" if exc.states_now else "conflict", str(exc)) from None


def next_link(request: HttpRequest, name: str, value: Any) -> str | None:
    """This request's URL with ``name`` set to ``value`` (the next page), or None for no next page."""
    if value is None:
        return None
    params = request.GET.copy()
    params[name] = str(value)
    return request.build_absolute_uri(f"{request.path}?{params.urlencode()}")


def parse_cursor(text: str, *, key: type) -> Cursor | None:
    if not text:
        return None
    try:
        return decode_cursor(text, key=key)
    except BadCursor as exc:
        raise Problem("validation", f"{exc}: send back the `cursor` of a `next` link") from None


def run_id_of(run_id: str) -> str:
    """``run_id`` as a canonical UUID string; not-found for anything else (as an unknown run)."""
    try:
        return str(uuid.UUID(run_id))
    except (ValueError, TypeError):
        raise Problem("not-found", f"no run {run_id[:100]!r}") from None


def int_id_of(text: str, what: str) -> int:
    """``text`` as a row id; not-found for anything else (as an unknown id)."""
    if text.isascii() and text.isdigit() and 0 < int(text) < 2**63:
        return int(text)
    raise Problem("not-found", f"no {what} {text[:100]!r}")

