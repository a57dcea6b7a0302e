"""Notifications when a connector's circuit opens or closes: one delivery per (endpoint, change).

Each change is a ``CircuitChange`` row, written in the transaction that changed the circuit
(``ledger.flow.gate``), and is notified as the item ``circuit:<row id>``, so the unique
(endpoint, kind, item) makes it one delivery per endpoint however often it is seen. Found two
ways, as runs are (``detect``):

* ``on_circuit_changed``: the ledger's ``circuit_changed`` signal, after that commit, in the
  process that committed. The signal carries no row id, so it is taken as "look again" at that
  connector's changes within ``WINDOW``;
* ``on_swept``: after every sweeper pass, every connector's changes within ``WINDOW``: what a
  process killed between its commit and its receivers missed, or an endpoint added since.

Only opening and closing are notified (half-open is the trial call between them). A closing says
what had opened the circuit: its failures and error. A circuit is kept per key when the
connector's limits are (a tenant, a payload field): each key's circuit is notified. Endpoints
limited to some tenants get none of these: a connector serves every tenant, and its error may
come from any tenant's call. ``webhook.post``, the notifications' own connector, never
notifies: an endpoint that fails would open its circuit and feed itself.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from console.notifications.bodies import Item, clean
from console.notifications.deliveries import WINDOW, active_endpoints, delivery_create
from console.notifications.models import NotificationDelivery, NotificationEndpoint, NotificationKind
from ledger.models import CircuitChange, CircuitState, ConnectorFlow

log = logging.getLogger("console.notifications")

NOTIFY_CONNECTOR = "webhook.post"
KINDS = {CircuitState.OPEN: NotificationKind.CIRCUIT_OPENED, CircuitState.CLOSED: NotificationKind.CIRCUIT_CLOSED}
LIMIT = 500  # changes looked at per pass, newest first
MAX_ERROR = 1000  # of the error, in the generic body's ``error``


def _connectors_path() -> str:
    try:
        return reverse("console:connectors")
    except NoReverseMatch:  # a console without the connectors page
        return reverse("console:overview")


def _opening(change: CircuitChange) -> CircuitChange | None:
    """The change that opened the circuit ``change`` closes (the newest opening before it)."""
    return (CircuitChange.objects.filter(connector=change.connector, key=change.key, state=CircuitState.OPEN,
                                         at__lte=change.at, id__lt=change.id)
            .order_by("-at", "-id").first())


def _item(change: CircuitChange) -> Item:
    """What the notification of ``change`` says: the connector (and key), the new state, and the
    failures counted and the error when it opened, each redacted (``clean``)."""
    key = clean(change.key, 200)
    where = change.connector + (f" (key {key})" if change.key else "")
    opened = change if change.state == CircuitState.OPEN else _opening(change)
    failures = opened.failures if opened else 0
    error = opened.error if opened else ""
    if change.state == CircuitState.OPEN:
        detail = (f"{where}: {failures} failure(s) in a row, so its calls wait, unsent, until a trial call "
                  f"succeeds; the last: {error or 'no message'}")
    else:
        since = f" (open since {opened.at:%Y-%m-%d %H:%M:%S} UTC, after {failures} failure(s))" if opened else ""
        detail = f"{where}: a trial call succeeded, so its calls go again{since}"
    facts: dict[str, Any] = {
        "connector": change.connector, "key": key, "state": change.state, "at": change.at.isoformat(),
        "failures": failures, "error": clean(error, MAX_ERROR),
        "opened_at": opened.at.isoformat() if opened else None,
    }
    return Item(kind=KINDS[CircuitState(change.state)], item=f"circuit:{change.id}", run_id=None, tenant="",
                workflow="", business_key="", detail=clean(detail), path=_connectors_path(), facts=facts)


def _wanted(endpoints: list[NotificationEndpoint]) -> list[NotificationEndpoint]:
    return [e for e in endpoints if any(e.wants(kind, "") for kind in KINDS.values())]


def deliveries_create_for_circuits(*, connectors: list[str] | None = None, window: timedelta = WINDOW,
                                   limit: int = LIMIT) -> int:
    """Create the missing deliveries for the circuits of ``connectors`` (None: every connector
    with flow control) that opened or closed within ``window``; how many were created. No query
    when no active endpoint wants these kinds (``active_endpoints``); otherwise three, plus the
    opening's for each closing notified and one transaction per delivery created."""
    endpoints = _wanted(active_endpoints())
    if not endpoints:
        return 0
    names = connectors if connectors is not None else list(ConnectorFlow.objects.values_list("connector", flat=True))
    names = [name for name in names if name != NOTIFY_CONNECTOR]
    if not names:
        return 0
    # On the index (connector, -at): one range per connector.
    changes = list(CircuitChange.objects.filter(
        connector__in=names, at__gte=timezone.now() - window, state__in=list(KINDS),
    ).order_by("-at", "-id")[:limit])
    if not changes:
        return 0
    existing = set(NotificationDelivery.objects.filter(
        endpoint_id__in=[e.id for e in endpoints], kind__in=set(KINDS.values()),
        item__in={f"circuit:{c.id}" for c in changes},
    ).order_by().values_list("endpoint_id", "kind", "item"))
    created = 0
    for change in reversed(changes):  # oldest first: an opening is sent before its closing
        kind, item_key = KINDS[CircuitState(change.state)], f"circuit:{change.id}"
        missing = [e for e in endpoints if e.wants(kind, "") and (e.id, kind, item_key) not in existing]
        if missing:
            item = _item(change)
            created += sum(delivery_create(endpoint, item) for endpoint in missing)
    return created


def on_circuit_changed(sender: Any, connector: str, state: str, **kwargs: Any) -> None:
    if state in KINDS and connector != NOTIFY_CONNECTOR:
        deliveries_create_for_circuits(connectors=[connector])


def on_swept(sender: Any, **kwargs: Any) -> None:
    created = deliveries_create_for_circuits()
    if created:
        log.info("notifications: %d circuit delivery(ies) created by the sweeper's pass", created)


def connect_signals() -> None:
    """Called by ``detect.connect_signals`` (the console app's ``ready``)."""
    from ledger.signals import circuit_changed
    from sagas.events import swept

    circuit_changed.connect(on_circuit_changed, dispatch_uid="console.notifications.circuit_changed")
    swept.connect(on_swept, dispatch_uid="console.notifications.circuits_swept")
