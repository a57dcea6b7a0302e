"""Writes: staff configure endpoints. Each change and its audit entry commit together; an attempt
by someone who is not staff is refused (``NotStaff``) and audited as denied.

Audit entries (``object_type`` ``notification_endpoint``) hold the endpoint's settings before
and after, never its secret: a rotation shows as ``"secret": "rotated"``, with the scheme it
left and how long the replaced secret still signs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from console.notifications.models import NotificationEndpoint
from core.webhooks import new_secret
from operators.models import AuditEntry, AuditOutcome
from operators.services.actions import Actor
from operators.services.limits import clip_text

OBJECT_TYPE = "notification_endpoint"
CREATE, UPDATE, ROTATE = "notification.endpoint_create", "notification.endpoint_update", "notification.secret_rotate"
FIELDS = ("name", "url", "format", "kinds", "tenants", "active")


class NotStaff(Exception):
    """Only staff configure notifications (HTTP 403)."""


def is_staff(user: User) -> bool:
    return bool(user.is_authenticated and (user.is_staff or user.is_superuser))


def snapshot(endpoint: NotificationEndpoint) -> dict[str, Any]:
    return {field: getattr(endpoint, field) for field in FIELDS}


def _audit(actor: Actor, action: str, object_id: Any, *, outcome: str, before: Any = None, after: Any = None,
           message: str = "") -> None:
    AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label, action=action, object_type=OBJECT_TYPE,
        object_id=str(object_id or ""), before=before, after=after, ip=actor.ip, outcome=outcome,
        message=clip_text(message), tenant="",
    )


def require_staff(actor: Actor, action: str, object_id: Any) -> None:
    """``NotStaff`` (audited as denied, whatever was sent) unless ``actor`` is staff."""
    if not is_staff(actor.user):
        _audit(actor, action, object_id, outcome=AuditOutcome.DENIED, message="staff required")
        raise NotStaff(f"{actor.label} may not configure notifications: only staff may")


def endpoint_create(*, actor: Actor, values: dict[str, Any]) -> NotificationEndpoint:
    """A new endpoint with a new Standard Webhooks secret."""
    require_staff(actor, CREATE, "")
    with transaction.atomic():
        endpoint = NotificationEndpoint.objects.create(
            **{f: values[f] for f in FIELDS}, secret=new_secret(), created_by=actor.user)
        _audit(actor, CREATE, endpoint.id, outcome=AuditOutcome.OK, after=snapshot(endpoint))
    return endpoint


def endpoint_update(*, actor: Actor, endpoint_id: int, values: dict[str, Any]) -> NotificationEndpoint:
    require_staff(actor, UPDATE, endpoint_id)
    with transaction.atomic():
        endpoint = NotificationEndpoint.objects.select_for_update().get(id=endpoint_id)
        before = snapshot(endpoint)
        for field in FIELDS:
            setattr(endpoint, field, values[field])
        endpoint.save()
        _audit(actor, UPDATE, endpoint.id, outcome=AuditOutcome.OK, before=before, after=snapshot(endpoint))
    return endpoint


def endpoint_rotate_secret(*, actor: Actor, endpoint_id: int,
                           keep_old: timedelta = timedelta(0)) -> NotificationEndpoint:
    """A new Standard Webhooks secret; bodies signed from now on use it (a delivery being retried
    too). For ``keep_old`` they are signed with the replaced secret as well, in its own scheme (a
    legacy one: the old headers too), so the receiver can switch when it deploys."""
    require_staff(actor, ROTATE, endpoint_id)
    with transaction.atomic():
        endpoint = NotificationEndpoint.objects.select_for_update().get(id=endpoint_id)
        before = endpoint.signature_scheme
        endpoint.rotate_secret(keep_old=keep_old)
        endpoint.save(update_fields=["secret", "signature_scheme", "previous_secret", "previous_scheme",
                                     "previous_until", "updated_at"])
        _audit(actor, ROTATE, endpoint.id, outcome=AuditOutcome.OK, before={"signature_scheme": before},
               after={"secret": "rotated", "signature_scheme": endpoint.signature_scheme,
                      "old_secret_signs_until": endpoint.previous_until.isoformat() if endpoint.previous_until
                      else None})
    return endpoint
