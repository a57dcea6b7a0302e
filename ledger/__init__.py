"""The side-effect ledger: the one public API.

Connectors (``myapp/connectors.py``)::

    from ledger import connector, Connector, Outcome, Unknown, NotExecuted, Succeeded, Pending
    from ledger import Retryable, Throttled, Final, Timeout

Errors a workflow or a caller handles: ``EffectFailed`` (an effect failed for good),
``KeyConflict`` (a key reused with another payload), ``AlreadyResolved`` and
``InvalidResolution`` (from ``resolve``); ``ConnectorAlreadyRegistered`` (at start-up: two
connector classes under one name); all are ``LedgerError``s with a stable ``code``.

Settling an UNKNOWN effect by hand, with evidence::

    from ledger import resolve
    resolve(effect_id=e.id, outcome="succeeded", downstream_ref="ch_123", note="seen in the PSP", user=bob)

Flow control per connector (the limits every worker on every host shares, its circuit
breaker and its pause), read and changed live::

    from ledger import connector_states, connector_state, pause_connector, resume_connector
    from ledger import set_connector_limits, ConnectorPauseState, InvalidFlowSetting
    connector_state("payments.capture").as_dict()      # limits, pause, circuit, queue, latency
    pause_connector("payments.capture", reason="PSP incident INC-42", by="oncall")
    set_connector_limits("payments.capture", by="oncall", rate=20, burst=5)
    set_connector_limits("payments.capture", by="oncall", declared=True)   # back to the class's
    set_spend_limit(tenant="acme", connector="model", per_day=25, by="finance")  # usd per UTC day

Importing ``ledger`` touches no Django model; the functions need Django set up when called, and
so do ``ConnectorState``, ``ConnectorPauseState`` and ``InvalidFlowSetting`` (loaded on first use).
"""

from __future__ import annotations

from types import EllipsisType
from typing import TYPE_CHECKING, Any

from ledger.connectors import Connector, connector
from ledger.errors import (
    AlreadyResolved,
    ConnectorAlreadyRegistered,
    EffectFailed,
    Final,
    InvalidResolution,
    KeyConflict,
    LedgerError,
    Retryable,
    Throttled,
    Timeout,
)
from ledger.outcomes import NotExecuted, Outcome, Pending, Succeeded, Unknown

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from ledger.flow.selectors import ConnectorState
    from ledger.flow.services import ConnectorPauseState, InvalidFlowSetting
    from ledger.models import EffectRecord

__all__ = [
    "AlreadyResolved",
    "Connector",
    "ConnectorAlreadyRegistered",
    "ConnectorPauseState",
    "ConnectorState",
    "EffectFailed",
    "Final",
    "InvalidFlowSetting",
    "InvalidResolution",
    "KeyConflict",
    "LedgerError",
    "NotExecuted",
    "Outcome",
    "Pending",
    "Retryable",
    "Succeeded",
    "Throttled",
    "Timeout",
    "Unknown",
    "connector",
    "connector_state",
    "connector_states",
    "pause_connector",
    "resolve",
    "resume_connector",
    "set_connector_limits",
    "set_spend_limit",
]

# Flow control's errors and state live with the services and selectors that raise and make them
# (``ledger.flow``, which loads the models): imported on first use, so importing ``ledger`` stays
# model-free.
_LAZY = {"ConnectorPauseState": "ledger.flow.services", "ConnectorState": "ledger.flow.selectors",
         "InvalidFlowSetting": "ledger.flow.services"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ledger' has no attribute {name!r}")


def resolve(
    *,
    effect_id: int,
    outcome: str,
    note: str,
    user: User | None = None,
    actor: str = "",
    downstream_ref: str = "",
    result: dict[str, Any] | None = None,
) -> EffectRecord:
    """Record, with evidence, what happened to an effect whose outcome is UNKNOWN (or that is
    stuck IN_PROGRESS), and return the effect as it is now.

    ``outcome``: ``"succeeded"`` (``downstream_ref`` is required: the provider's reference;
    ``result`` is what the workflow gets, by default what the connector's ``manual_result``
    makes of the reference), ``"not_executed"`` (confirmed not done: it is retried with the
    same key) or ``"failed"`` (the workflow gets ``EffectFailed``). ``note`` (the evidence)
    is required. The resolution is stored on the effect (who: ``user`` or ``actor``, when,
    the note) and journaled on its run, which resumes by itself once none of its effects is
    UNKNOWN.

    Refused, with nothing changed: a second resolution (``AlreadyResolved``, naming who
    resolved it and when), a missing note or reference, an unknown outcome, or a run that a
    worker is advancing right now (``InvalidResolution``). The console's resolve calls this
    too, and adds its audit-log entry; this entry point writes none.
    """
    from ledger.services import effect_resolve

    return effect_resolve(effect_id=effect_id, outcome=outcome, note=note, user=user, actor=actor,
                          downstream_ref=downstream_ref, result=result, resolution="manual")


def connector_states() -> list[ConnectorState]:
    """Every connector with flow control, by name, as it is now: its limits (and the ones its
    class declares), its pause, its circuit (the worst of its keys'), the calls out and waiting,
    and the last minutes' error rate and latency (``ConnectorState``; ``.as_dict()`` is what the
    HTTP API answers).

    A connector has flow control once a worker that registers it has started (each worker
    writes its connectors' declared limits at start-up); before that it is not listed, and its
    calls are not limited. A read: nothing is locked, and the figures may move at once.
    """
    from ledger.flow.selectors import connector_states as states

    return states()


def connector_state(name: str) -> ConnectorState | None:
    """One connector's flow control as ``connector_states`` gives it, with its latest circuit
    changes (``.changes``, newest first, at most 20: each key's open, half-open and closed,
    with the failures counted and the error that opened it); ``None`` for a name without flow
    control."""
    from ledger.flow.selectors import connector_state as state

    return state(name)


def pause_connector(name: str, *, reason: str, by: str) -> ConnectorState:
    """Hold every call to connector ``name`` that is not sent yet, and return its state.

    A held call is never sent while the pause lasts: its record stays PENDING (never UNKNOWN)
    and its run suspends, holding no worker, until ``resume_connector``. Calls already out
    finish; other connectors go on. Every worker on every host sees the pause from its next
    dispatch. ``by`` (who, as the console shows it) and ``reason`` are kept with the pause.

    Refused, with nothing changed: a connector that is paused already (``ConnectorPauseState``,
    naming who paused it and when); a name without flow control (``LookupError``). No audit-log
    entry is written: the console and the HTTP API call the same service and add theirs.
    """
    from ledger.flow.selectors import connector_state as state
    from ledger.flow.services import connector_pause

    connector_pause(connector=name, by=by, reason=reason)
    return _now(state(name), name)


def resume_connector(name: str, *, reason: str, by: str) -> ConnectorState:
    """Lift connector ``name``'s pause, and return its state: the calls that waited go, oldest
    first (taking turns between tenants), at the connector's rate.

    Refused, with nothing changed: a connector that is not paused (``ConnectorPauseState``); a
    name without flow control (``LookupError``). ``reason`` and ``by`` are not stored (the pause
    is gone); the console and the HTTP API record them in their audit-log entry, and this
    function writes none.
    """
    from ledger.flow.selectors import connector_state as state
    from ledger.flow.services import connector_resume

    connector_resume(connector=name, by=by, reason=reason)
    return _now(state(name), name)


def set_connector_limits(
    name: str,
    *,
    by: str,
    declared: bool = False,
    rate: float | EllipsisType | None = ...,
    burst: int | EllipsisType = ...,
    max_in_flight: int | EllipsisType | None = ...,
    key_field: str | EllipsisType = ...,
    circuit_failures: int | EllipsisType = ...,
    circuit_window_seconds: float | EllipsisType = ...,
    circuit_cooldown_seconds: float | EllipsisType = ...,
) -> ConnectorState:
    """Change connector ``name``'s limits live, and return its state.

    The limits given change; the others keep their values (read under the connector's row lock,
    so a change someone makes meanwhile to another limit is kept). ``rate`` (calls per second)
    and ``max_in_flight`` (calls out at once) take ``None`` for "no limit"; ``burst``: calls
    that may go at once after a quiet spell; ``key_field``: what the limits are kept per (``""``
    one set, ``"tenant"``, or a payload field); ``circuit_failures`` (0: no breaker),
    ``circuit_window_seconds`` and ``circuit_cooldown_seconds``: the circuit breaker.
    ``declared=True`` (and no limit given) puts back what the connector's class declares, and
    it follows the class again from the next worker start; otherwise the values set are kept
    across restarts, marked as changed by ``by``.

    Every worker applies them from its next dispatch; calls already out are not affected.
    Refused, with nothing changed: a value out of range or of the wrong type, no limit given
    without ``declared``, or limits given with it (``InvalidFlowSetting``, saying which value
    and why); a name without flow control (``LookupError``). No audit-log entry is written: the
    console and the HTTP API call the same service and add theirs.
    """
    from django.db import transaction

    from ledger.flow.selectors import connector_state as state
    from ledger.flow.services import InvalidFlowSetting, Limits, connector_limits_set
    from ledger.models import ConnectorFlow

    given = {field: value for field, value in (
        ("rate", rate), ("burst", burst), ("max_in_flight", max_in_flight), ("key_field", key_field),
        ("circuit_failures", circuit_failures), ("circuit_window_seconds", circuit_window_seconds),
        ("circuit_cooldown_seconds", circuit_cooldown_seconds)) if value is not ...}
    if declared and given:
        raise InvalidFlowSetting(f"declared=True puts back every declared limit; do not give {', '.join(given)} "
                                 f"with it")
    if not declared and not given:
        raise InvalidFlowSetting("give at least one limit to change, or declared=True")
    with transaction.atomic():
        flow = ConnectorFlow.objects.select_for_update().filter(connector=name).first()
        if flow is None:
            raise LookupError(f"no connector named {name!r} has flow control here")
        limits = None if declared else Limits(**{**Limits.of(flow).as_dict(), **given})
        connector_limits_set(connector=name, by=by, limits=limits)
    return _now(state(name), name)


def _now(found: ConnectorState | None, name: str) -> ConnectorState:
    if found is None:  # flow rows are never deleted: only a name that never had one
        raise LookupError(f"no connector named {name!r} has flow control here")
    return found


def set_spend_limit(*, tenant: str, connector: str, per_day: float | str | None, by: str) -> None:
    """Limit what ``tenant`` spends on ``connector`` per UTC day, in the runs' cost unit (usd);
    ``tenant="*"``: every tenant without a limit of its own (each counted on its own);
    ``per_day=None`` removes the limit.

    Counted: model turns of ``run_agent`` (on ``"model"``), costs a step charges with
    ``ctx.add_cost(..., connector=...)``, and effects a connector prices (``Connector.cost``).
    A call or model turn that finds the day's spend at or over the limit parks its run
    (NEEDS_ATTENTION, ``spend_limit``, with the figures); once under a raised limit (or on the
    next UTC day) the sweeper resumes it. Refused with nothing changed (``InvalidFlowSetting``):
    an amount that is negative, not a number, over 99999999.999999 or with more than 6 decimal
    places (it would be rounded, not kept as given: ``0.1 + 0.2`` is refused, ``"0.3"`` is not),
    and an empty tenant or connector, or one too long (100 and 200 characters) or with spaces
    around it. No audit-log entry is written: the console and the HTTP API call the same service
    and add their own.
    """
    from ledger.flow.services import spend_limit_set

    spend_limit_set(tenant=tenant, connector=connector, per_day=per_day, by=by)
