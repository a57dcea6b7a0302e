"""Signals the ledger sends about effect records. The ledger knows nothing of its listeners.

``effect_changed`` (kwargs ``effect_id: int``, ``run_id: str``, ``status: str``,
``previous: str``) is sent after the commit that moved an effect from ``previous`` to
``status`` (``ledger.services.effect_transition``); never for a change that rolled back.
A failing receiver is logged and never raises into the caller. A listener must treat it
as "look again", not as a counted event.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connection, transaction
from django.dispatch import Signal

log = logging.getLogger("ledger.signals")

effect_changed = Signal()


def send_effect_changed(*, effect_id: int, run_id: Any, status: str, previous: str) -> None:
    """Send ``effect_changed`` once the current transaction commits (at once outside one)."""

    def send() -> None:
        results = effect_changed.send_robust(
            sender=None, effect_id=effect_id, run_id=str(run_id), status=str(status), previous=str(previous)
        )
        for receiver, result in results:
            if isinstance(result, Exception):
                log.error("effect_changed receiver %r failed for effect %s: %s", receiver, effect_id, result,
                          exc_info=result)

    if connection.in_atomic_block:
        transaction.on_commit(send)
    else:
        send()
