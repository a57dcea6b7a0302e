"""Checks of what callers pass to the engine's public functions, before anything is written.

Text and JSON go through ``ledger.storable`` (NUL, lone surrogates, depth, size); this module
adds the engine's own rules (column lengths, budgets) and turns its ``ValueError`` into the
engine's typed errors: ``InvalidArgument`` (also a ``ValueError``) for arguments,
``NotSerializable`` for JSON values.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from ledger.storable import json_storable, text_storable
from sagas.errors import ActionNotAllowed, InvalidArgument, NotSerializable

# Column lengths of WorkflowRun (sagas.models); free text as the console caps it.
NAME_CHARS = 200
BUSINESS_KEY_CHARS = 200
TENANT_CHARS = 100
STARTED_VIA_CHARS = 20
SIGNAL_NAME_CHARS = 200
FREE_TEXT_CHARS = 4000  # a reason, a comment
MAX_COST = Decimal("99999999.999999")  # DecimalField(max_digits=14, decimal_places=6)


def actor_label(user: Any) -> str:
    """Who an action's journal entry names: the user's name, or "system" for none."""
    return user.get_username() if user is not None else "system"


def required_reason(reason: Any, what: str) -> str:
    """An operator action's reason, stripped: storable and at most ``FREE_TEXT_CHARS``
    (``InvalidArgument``), and not empty (``ActionNotAllowed``: "a reason is required to ...")."""
    checked_text(reason, what="reason", max_length=FREE_TEXT_CHARS)
    if not str(reason).strip():
        raise ActionNotAllowed(f"a reason is required to {what}")
    return str(reason).strip()


def checked_text(value: Any, *, what: str, max_length: int, required: bool = False, one_line: bool = False) -> str:
    """``ledger.storable.text_storable``, raising ``InvalidArgument``."""
    try:
        return text_storable(value, what=what, max_length=max_length, required=required, one_line=one_line)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def checked_json(value: Any, *, what: str) -> Any:
    """``value`` as PostgreSQL will store it (a JSON round trip), or ``NotSerializable``."""
    try:
        return json.loads(json_storable(value, what=what))
    except ValueError as exc:
        raise NotSerializable(str(exc)) from None


@dataclass(frozen=True)
class StartArguments:
    input: Any
    max_cost: Decimal | None


# The largest value of the integer columns (max_steps, version): PostgreSQL's integer.
MAX_WHOLE = 2**31 - 1


def _whole(value: Any, *, what: str, minimum: int) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WHOLE
    ):
        raise InvalidArgument(f"{what} must be a whole number from {minimum} to {MAX_WHOLE} (or None), "
                              f"not {str(value)[:40]}")


def start_arguments_check(
    *,
    input: Any,
    business_key: Any,
    tenant: Any,
    started_by: Any,
    started_via: Any,
    max_steps: Any,
    max_cost: Any,
    max_duration: Any,
) -> StartArguments:
    """Every argument of ``start`` but the workflow's name and version (``start_name_check``):
    ``InvalidArgument`` or ``NotSerializable`` naming the first problem found."""
    checked_text(business_key, what="business_key", max_length=BUSINESS_KEY_CHARS, one_line=True)
    checked_text(tenant, what="tenant", max_length=TENANT_CHARS, required=True, one_line=True)
    checked_text(started_via, what="started_via", max_length=STARTED_VIA_CHARS, required=True, one_line=True)
    if started_by is not None:
        from django.contrib.auth.models import AbstractBaseUser

        if not isinstance(started_by, AbstractBaseUser) or started_by.pk is None:
            raise InvalidArgument(f"started_by must be a saved user (or None), not {started_by!r}")
    _whole(max_steps, what="max_steps", minimum=1)
    cost = None
    if max_cost is not None:
        if isinstance(max_cost, bool) or not isinstance(max_cost, (int, float, Decimal)) or not math.isfinite(max_cost):
            raise InvalidArgument(f"max_cost must be a finite number (or None), not {max_cost!r}")
        cost = Decimal(str(max_cost))
        if not Decimal(0) <= cost <= MAX_COST:
            raise InvalidArgument(f"max_cost must be between 0 and {MAX_COST}, not {max_cost!r}")
    if max_duration is not None and (not isinstance(max_duration, timedelta) or max_duration <= timedelta(0)):
        raise InvalidArgument(f"max_duration must be a positive timedelta (or None), not {max_duration!r}")
    return StartArguments(input=checked_json(input, what="the run's input"), max_cost=cost)


def priority_check(priority: Any) -> int:
    """A run's priority as ``start`` takes it: a whole number from 1 (taken first) to 5."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 5:
        raise InvalidArgument(f"priority must be a whole number from 1 (taken first) to 5, not {str(priority)[:40]}")
    return priority


def start_name_check(name: Any, version: Any) -> None:
    """The workflow's ``name`` and ``version`` as ``start`` takes them (``InvalidArgument``)."""
    checked_text(name, what="the workflow name", max_length=NAME_CHARS, required=True, one_line=True)
    _whole(version, what="version", minimum=1)
