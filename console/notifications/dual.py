"""Notifications of dual-control requests: a dangerous action waiting for a second person
(``operators.services.dual``) is notified once per (endpoint, request) as the item
``dual:<request id>``, to the endpoints that want ``dual_control`` for the request's tenant
(a batch of several tenants: endpoints limited to tenants get none). Found two ways, as runs
and circuits are (``detect``): the ``dual_changed`` signal after the commit that made the
request, and the sweeper's pass over the requests still waiting that were made within
``WINDOW`` (a process killed between its commit and its receivers; an endpoint added since)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from console.notifications.bodies import Item, clean
from console.notifications.deliveries import WINDOW, active_endpoints, delivery_create
from console.notifications.models import NotificationDelivery, NotificationKind
from core.storage import is_storage_error
from operators.models import DualControlRequest, DualState
from operators.services.dual import expire_due
from sagas.models import WorkflowRun

log = logging.getLogger("console.notifications")

KIND = NotificationKind.DUAL_CONTROL
LIMIT = 500  # requests looked at per pass, newest first


def _item(request: DualControlRequest) -> Item:
    detail = (f"{request.summary}, asked by {request.requested_by_label}: another person must confirm it before "
              f"{request.deadline:%Y-%m-%d %H:%M} UTC")
    run = (WorkflowRun.objects.filter(id=request.object_id).only("workflow_name", "business_key").first()
           if request.object_type == "run" else None)
    return Item(kind=KIND, item=f"dual:{request.pk}", run_id=str(run.id) if run else None, tenant=request.tenant,
                workflow=run.workflow_name if run else "", business_key=run.business_key if run else "",
                detail=clean(detail), path=f"{reverse('console:approvals')}#dual-{request.pk}",
                facts={"request": request.pk, "action": request.action, "rule": request.policy,
                       "object_type": request.object_type, "object_id": request.object_id,
                       "requested_by": request.requested_by_label, "reason": clean(request.reason, 1000),
                       "deadline": request.deadline.isoformat()})


def deliveries_create_for_requests(*, ids: list[int] | None = None, window: timedelta = WINDOW,
                                   limit: int = LIMIT) -> int:
    """Create the missing deliveries for the waiting requests (``ids``, or those made within
    ``window``); how many. No query when no active endpoint wants the kind."""
    endpoints = [e for e in active_endpoints() if KIND in e.kinds]
    if not endpoints:
        return 0
    waiting = DualControlRequest.objects.filter(state=DualState.PENDING, deadline__gt=timezone.now())
    waiting = waiting.filter(pk__in=ids) if ids is not None else waiting.filter(created_at__gte=timezone.now() - window)
    requests = list(waiting.order_by("-created_at", "-id")[:limit])
    if not requests:
        return 0
    existing = set(NotificationDelivery.objects.filter(
        endpoint_id__in=[e.id for e in endpoints], kind=KIND, item__in={f"dual:{r.pk}" for r in requests},
    ).order_by().values_list("endpoint_id", "item"))
    created = 0
    for request in reversed(requests):
        item_key = f"dual:{request.pk}"
        missing = [e for e in endpoints if e.wants(KIND, request.tenant) and (e.id, item_key) not in existing]
        if missing:
            item = _item(request)
            created += sum(delivery_create(endpoint, item) for endpoint in missing)
    return created


def on_dual_changed(sender: Any, request: DualControlRequest, **kwargs: Any) -> None:
    if request.state == DualState.PENDING:
        deliveries_create_for_requests(ids=[request.pk])


def on_swept(sender: Any, **kwargs: Any) -> None:
    """The sweeper's pass: requests past their deadline are marked EXPIRED (audited; rows a
    person is deciding are skipped), then the waiting ones' missing notifications are made."""
    try:
        expired = expire_due()
    except Exception as exc:
        if is_storage_error(exc):  # PostgreSQL away: the sweeper logs the outage once; next pass
            return
        raise
    if expired:
        log.info("dual control: %d request(s) expired unconfirmed", expired)
    created = deliveries_create_for_requests()
    if created:
        log.info("notifications: %d dual-control delivery(ies) created by the sweeper's pass", created)


def connect_signals() -> None:
    """Called by ``detect.connect_signals`` (the console app's ``ready``)."""
    from operators.services.dual_rules import dual_changed
    from sagas.events import swept

    dual_changed.connect(on_dual_changed, dispatch_uid="console.notifications.dual_changed")
    swept.connect(on_swept, dispatch_uid="console.notifications.dual_swept")
