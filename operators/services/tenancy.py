"""Actions on objects outside the actor's tenants (operators/selectors/tenancy.py): refused as if
the object did not exist (HTTP 404, so the answer does not say it exists), and the attempt is
written to the audit log as denied, with the object's tenant (so the attempt is shown to that
tenant's users and to those who see every tenant, not to the one who tried)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import Http404

from operators.models import AuditEntry, AuditOutcome
from operators.selectors.tenancy import may_see, object_tenant
from operators.services.limits import clip_text

if TYPE_CHECKING:
    from operators.services.actions import Actor

OUTSIDE_TENANTS = "outside the user's tenants"


class NotFound(Http404):
    """The object is not in the user's tenants: for them it does not exist (HTTP 404 wherever
    it is raised; a view need not catch it)."""


def check_tenant(actor: Actor, action: str, object_type: str, object_id: Any, *, reason: str = "") -> str | None:
    """Return the object's tenant (None: no such object; the action itself answers that) if
    ``actor`` may act on it; otherwise audit the attempt as denied (in its own transaction:
    nothing else is written) and raise ``NotFound``."""
    tenant = object_tenant(object_type, object_id)
    if tenant is None or may_see(actor.user, tenant):
        return tenant
    audit_outside(actor, action, object_type, object_id, tenant=tenant, reason=reason)
    raise NotFound(f"no such {object_type}")


def audit_outside(actor: Actor, action: str, object_type: str, object_id: Any, *, tenant: str,
                  reason: str = "") -> None:
    """Record an attempt on ``tenant``'s object by someone who does not see ``tenant`` (denied,
    with that tenant, so its users see the attempt). Its own write: nothing else is."""
    AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label, action=action, object_type=object_type,
        object_id=str(object_id)[:100], reason=clip_text(reason), ip=actor.ip, outcome=AuditOutcome.DENIED,
        message=OUTSIDE_TENANTS, tenant=tenant,
    )
