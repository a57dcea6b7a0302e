"""Creating a delivery (and the ``system.notify`` run that sends it), and the active endpoints,
for both ways items are found: runs (``detect``) and connectors' circuits (``circuits``)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction

from console.notifications.bodies import Item, body_for
from console.notifications.models import NotificationDelivery, NotificationEndpoint

NOTIFY_WORKFLOW = "system.notify"
WINDOW = timedelta(minutes=10)  # how far back the sweeper's pass looks for what was missed
# The tenant of the system.notify run of an item that belongs to no tenant (a connector's circuit):
# a run needs one. The delivery itself has none, so only users who see every tenant see it.
NO_TENANT = "system"


def delivery_create(endpoint: NotificationEndpoint, item: Item) -> bool:
    """Create the delivery and start its run, in one transaction; False when it exists."""
    from sagas import start

    try:
        with transaction.atomic():
            delivery = NotificationDelivery.objects.create(
                endpoint=endpoint, kind=item.kind, item=item.item, run_id=item.run_id, tenant=item.tenant,
                workflow=item.workflow, business_key=item.business_key, summary=item.summary, body={},
            )
            delivery.body = body_for(item, endpoint.format, delivery_id=delivery.id)
            run = start(NOTIFY_WORKFLOW, {"delivery": delivery.id}, business_key=f"delivery-{delivery.id}",
                        tenant=item.tenant or NO_TENANT, started_via="notify")
            delivery.notify_run_id = run.id
            delivery.save(update_fields=["body", "notify_run_id"])
    except IntegrityError:  # another process created it first
        return False
    return True


# "No endpoint is active", remembered for a second per process: with none configured, a watched
# transition costs no query. Saving an endpoint forgets it in the saving process; other
# processes see a new endpoint within NONE_TTL (and the sweeper's pass catches up). Endpoints
# that exist are always read fresh.
NONE_TTL = 1.0
_none_until = 0.0


def active_endpoints() -> list[NotificationEndpoint]:
    global _none_until
    if time.monotonic() < _none_until:
        return []
    found = list(NotificationEndpoint.objects.filter(active=True))
    if not found:
        _none_until = time.monotonic() + NONE_TTL
    return found


def forget_endpoints(**kwargs: Any) -> None:
    global _none_until
    _none_until = 0.0
