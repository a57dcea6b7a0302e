"""Reads: the endpoints, the deliveries with their state (read from their run and effect), and
what ``system.notify`` posts for one delivery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from console.notifications.models import NotificationDelivery, NotificationEndpoint
from ledger.models import EffectRecord, EffectStatus
from operators.selectors.paging import Cursor, Page, keyset_page
from operators.selectors.tenancy import User, scope
from sagas.models import RunStatus, WorkflowRun

DELIVERIES_PAGE_SIZE = 50
POST_STEP = "post"


def endpoints_all() -> QuerySet[NotificationEndpoint]:
    return NotificationEndpoint.objects.all()


def endpoint_get(endpoint_id: Any) -> NotificationEndpoint | None:
    try:
        return NotificationEndpoint.objects.filter(id=int(endpoint_id)).first()
    except (TypeError, ValueError, OverflowError):
        return None


def delivery_message(delivery_id: int) -> dict[str, Any]:
    """What ``system.notify`` posts: the delivery, its endpoint and the (already redacted) body.
    No URL and no secret: the connector reads those at the moment it calls."""
    delivery = NotificationDelivery.objects.get(id=delivery_id)
    return {"delivery": delivery.id, "endpoint": delivery.endpoint_id, "kind": delivery.kind, "body": delivery.body}


@dataclass(frozen=True)
class DeliveryRow:
    delivery: NotificationDelivery
    run: WorkflowRun | None
    effect: EffectRecord | None

    @property
    def state(self) -> str:
        """pending, sending, retrying, delivered, unknown or failed."""
        effect, run = self.effect, self.run
        if effect is not None:
            if effect.status == EffectStatus.SUCCEEDED:
                return "delivered"
            if effect.status == EffectStatus.UNKNOWN:
                return "unknown"
            if effect.status == EffectStatus.FAILED_FINAL:
                return "failed"
            if effect.attempts > 1:
                return "retrying"
            return "sending" if effect.status == EffectStatus.IN_PROGRESS else "pending"
        if run is not None and run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            return "failed"
        return "pending"

    @property
    def badge(self) -> str:
        """The status badge class the other pages use for the same meaning."""
        return {"delivered": "SUCCEEDED", "unknown": "UNKNOWN", "failed": "FAILED", "retrying": "IN_PROGRESS",
                "sending": "IN_PROGRESS"}.get(self.state, "PENDING")

    @property
    def attempts(self) -> int:
        return self.effect.attempts if self.effect is not None else 0


def deliveries_page(*, user: User, cursor: Cursor | None = None, size: int = DELIVERIES_PAGE_SIZE,
                    kind: str = "") -> Page[DeliveryRow]:
    """Newest first, the user's tenants only; each with its run and its ``post`` effect (two queries)."""
    qs = scope(NotificationDelivery.objects.select_related("endpoint").defer("body"), user)
    if kind:
        qs = qs.filter(kind=kind)
    page = keyset_page(qs, field="created_at", descending=True, cursor=cursor, size=size)
    return Page(items=_rows(page.items), next=page.next, total=page.total)


def _rows(deliveries: list[NotificationDelivery]) -> list[DeliveryRow]:
    """Each delivery with its ``system.notify`` run and that run's ``post`` effect (two queries)."""
    run_ids = [d.notify_run_id for d in deliveries if d.notify_run_id]
    runs = {r.id: r for r in WorkflowRun.objects.filter(id__in=run_ids).only("id", "status", "status_reason")}
    effects = {e.run_id: e for e in EffectRecord.objects.filter(run_id__in=run_ids, step_name=POST_STEP).only(
        "id", "run_id", "status", "attempts", "error_message", "completed_at")}
    return [
        DeliveryRow(d, runs.get(d.notify_run_id), effects.get(d.notify_run_id))
        if d.notify_run_id else DeliveryRow(d, None, None)
        for d in deliveries
    ]


def delivery_states(delivery_ids: list[int]) -> dict[int, str]:
    """The state of each delivery, by id."""
    return {row.delivery.id: row.state
            for row in _rows(list(NotificationDelivery.objects.filter(id__in=delivery_ids).defer("body")))}
