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

Importing ``ledger`` touches no Django model; ``resolve`` needs Django set up when called.
"""

from __future__ import annotations

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

    from ledger.models import EffectRecord

__all__ = [
    "AlreadyResolved",
    "Connector",
    "ConnectorAlreadyRegistered",
    "EffectFailed",
    "Final",
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
    "resolve",
]


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
