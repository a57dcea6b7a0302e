"""Finding what needs a person, and creating its deliveries (each sent by a ``system.notify`` run).

Two ways in, both ending in ``deliveries_create_for_runs``, which is idempotent (one delivery
per (endpoint, kind, item), a unique constraint), so they may overlap freely:

* ``on_run_changed``: the engine's ``run_changed`` signal, after the commit that moved a run to
  NEEDS_ATTENTION, FAILED or WAITING: in the process that committed, for those transitions
  only, a few indexed queries (the run, its UNKNOWN effects, its open approvals, the deliveries
  already made) when an endpoint is active; no query when none is (``active_endpoints``), nor for a step, a
  claim or a completion.
* ``on_swept``: after every sweeper pass, the runs in those statuses updated in the last
  ``WINDOW`` (the index ``run_status_updated``), for what the signal missed: a process killed
  between its commit and its receivers, an endpoint added after the item appeared.

Runs of ``system.*`` workflows (the notifications themselves) never notify, so a delivery that
fails or is UNKNOWN is shown in the console and does not feed itself.

A connector's circuit opening or closing is found the same two ways (``circuits``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from console.notifications.bodies import Item, clean
from console.notifications.deliveries import WINDOW, active_endpoints, delivery_create, forget_endpoints
from console.notifications.models import NotificationDelivery, NotificationEndpoint, NotificationKind
from ledger.models import EffectKind, EffectRecord, EffectStatus
from sagas.models import OPEN_APPROVAL_STATES, ApprovalRequest, RunStatus, WorkflowRun

log = logging.getLogger("console.notifications")

SYSTEM_PREFIX = "system."
WATCHED = frozenset({RunStatus.NEEDS_ATTENTION, RunStatus.FAILED, RunStatus.WAITING})
SWEEP_LIMIT = 500
K = NotificationKind


def _run_items(run: WorkflowRun, unknown: list[EffectRecord], approvals: list[ApprovalRequest]) -> list[Item]:
    """What about ``run`` needs a person now, one ``Item`` each (``unknown``: its UNKNOWN effects,
    ``approvals``: its open approvals)."""
    base: dict[str, Any] = {"run_id": str(run.id), "tenant": run.tenant, "workflow": run.workflow_name,
                            "business_key": clean(run.business_key, 200)}
    run_path = reverse("console:run", args=[run.id])
    message = clean((run.error or {}).get("message", "") if isinstance(run.error, dict) else run.error)
    items = []
    if run.status == RunStatus.NEEDS_ATTENTION:
        for effect in unknown:
            what = "undo of " if effect.kind == EffectKind.COMPENSATION else ""
            items.append(Item(kind=K.UNKNOWN_EFFECT, item=f"effect:{effect.id}", **base,
                              path=reverse("console:effects"),
                              detail=clean(f"{what}{effect.step_name} ({effect.connector}): "
                                           f"{effect.error_message or 'outcome not known'}")))
        if run.status_reason == "compensation_failed":
            items.append(Item(kind=K.COMPENSATION_FAILED, item=f"run:{run.id}", **base, path=run_path,
                              detail=message or "a compensation failed"))
        elif run.status_reason == "version_mismatch":
            items.append(Item(kind=K.VERSION_MISMATCH, item=f"run:{run.id}", **base, path=run_path,
                              detail=message or f"no live worker runs {run.workflow_name} v{run.version}"))
    if run.status == RunStatus.FAILED:
        reason = run.status_reason or "failed"
        items.append(Item(kind=K.RUN_FAILED, item=f"run:{run.id}", **base, path=run_path,
                          detail=clean(f"{reason}: {message}" if message else reason)))
    if run.status in (RunStatus.WAITING, RunStatus.NEEDS_ATTENTION):
        for approval in approvals:
            items.append(Item(kind=K.APPROVAL_WAITING, item=f"approval:{approval.id}", **base,
                              path=reverse("console:approvals"),
                              detail=clean(f"{approval.step}: {approval.reason} (deadline "
                                           f"{approval.deadline:%Y-%m-%d %H:%M} UTC)")))
    return items


def deliveries_create_for_runs(runs: Iterable[WorkflowRun]) -> int:
    """Create the missing deliveries for what these runs need a person for; how many were created.
    At most four queries for any number of runs (endpoints, UNKNOWN effects, open approvals, the
    deliveries already made), plus one transaction per delivery created."""
    endpoints = active_endpoints()
    if not endpoints:
        return 0
    runs = [r for r in runs if r.status in WATCHED and not r.workflow_name.startswith(SYSTEM_PREFIX)]
    if not runs:
        return 0
    attention = [run.id for run in runs if run.status == RunStatus.NEEDS_ATTENTION]
    unknown: dict[Any, list[EffectRecord]] = {}
    for effect in EffectRecord.objects.filter(run_id__in=attention, status=EffectStatus.UNKNOWN).only(
            "id", "run_id", "step_name", "connector", "kind", "error_message") if attention else ():
        unknown.setdefault(effect.run_id, []).append(effect)
    waiting = [run.id for run in runs if run.status != RunStatus.FAILED]
    approvals: dict[Any, list[ApprovalRequest]] = {}
    for approval in ApprovalRequest.objects.filter(run_id__in=waiting, state__in=OPEN_APPROVAL_STATES).only(
            "id", "run_id", "step", "reason", "deadline") if waiting else ():
        approvals.setdefault(approval.run_id, []).append(approval)
    items = [item for run in runs for item in _run_items(run, unknown.get(run.id, []), approvals.get(run.id, []))]
    if not items:
        return 0
    # Looked up on the unique index (endpoint, kind, item): run_id has no index, and this runs on
    # every watched transition and every sweeper pass.
    existing = set(NotificationDelivery.objects.filter(
        endpoint_id__in=[e.id for e in endpoints], kind__in={i.kind for i in items}, item__in={i.item for i in items},
    ).order_by().values_list("endpoint_id", "kind", "item"))
    created = 0
    for item in items:
        for endpoint in endpoints:
            if endpoint.wants(item.kind, item.tenant) and (endpoint.id, item.kind, item.item) not in existing:
                created += delivery_create(endpoint, item)
    return created


def deliveries_create_for_run(run_id: str) -> int:
    return deliveries_create_for_runs(WorkflowRun.objects.filter(id=run_id).defer("input", "result"))


def deliveries_create_recent(*, window: timedelta = WINDOW, limit: int = SWEEP_LIMIT) -> int:
    """The sweeper's pass: runs in a watched status updated within ``window``."""
    since = timezone.now() - window
    runs = (WorkflowRun.objects.filter(status__in=sorted(WATCHED), updated_at__gte=since)
            .exclude(workflow_name__startswith=SYSTEM_PREFIX).defer("input", "result").order_by("-updated_at")[:limit])
    return deliveries_create_for_runs(runs)


def on_run_changed(sender: Any, run_id: str, status: str, cause: str, **kwargs: Any) -> None:
    if status in WATCHED:
        deliveries_create_for_run(run_id)


def on_swept(sender: Any, **kwargs: Any) -> None:
    created = deliveries_create_recent()
    if created:
        log.info("notifications: %d delivery(ies) created by the sweeper's pass", created)


def connect_signals() -> None:
    """Called by the console app's ``ready``."""
    from django.db.models.signals import post_save

    from console.notifications import circuits, dual
    from sagas.events import run_changed, swept

    post_save.connect(forget_endpoints, sender=NotificationEndpoint, dispatch_uid="console.notifications.forget")
    run_changed.connect(on_run_changed, dispatch_uid="console.notifications.run_changed")
    swept.connect(on_swept, dispatch_uid="console.notifications.swept")
    circuits.connect_signals()
    dual.connect_signals()
