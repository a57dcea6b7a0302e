"""Signals the ledger sends about effect records. The ledger knows nothing of its listeners.

``effect_changed`` (kwargs ``effect_id: int``, ``run_id: str``, ``status: str``,
``previous: str``) is sent after the commit that moved an effect from ``previous`` to
``status`` (``ledger.services.effect_transition``); never for a change that rolled back.
``circuit_changed`` (kwargs ``connector``, ``key``, ``state``, ``failures``, ``error``) is sent
after the commit that opened or closed a connector's circuit (``ledger.flow``).

``tickets_granted`` (kwargs ``runs``: a list of run ids as str) is sent after the commit that let
flow-control tickets go (``ledger.flow.pump``): their runs may dispatch their held effects now.

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
circuit_changed = Signal()
tickets_granted = Signal()


def _after_commit(signal: Signal, what: str, **kwargs: Any) -> None:
    def send() -> None:
        for receiver, result in signal.send_robust(sender=None, **kwargs):
            if isinstance(result, Exception):
                log.error("%s receiver %r failed: %s", what, receiver, result, exc_info=result)

    if connection.in_atomic_block:
        transaction.on_commit(send)
    else:
        send()


def send_circuit_changed(*, connector: str, key: str, state: str, failures: int, error: str) -> None:
    """Send ``circuit_changed`` once the current transaction commits."""
    _after_commit(circuit_changed, "circuit_changed", connector=connector, key=key, state=str(state),
                  failures=failures, error=error)


def send_tickets_granted(*, runs: list[str]) -> None:
    """Send ``tickets_granted`` once the current transaction commits."""
    _after_commit(tickets_granted, "tickets_granted", runs=runs)


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
