"""Audit entries for what automated actors change outside the console's action frame.

People act through ``console.services.actions.perform``, which audits each action in its
transaction. Some changes a person would otherwise make are made by the system itself: the
reconciler settles an UNKNOWN effect when the provider's lookup answers. Each such resolution
writes one ``effect.resolve`` entry, by the named system actor (``system: reconciler``, no user),
inside the resolution's own transaction (``ledger.services.effect_resolved`` is sent there), so
the entry commits or rolls back with it. A resolution made inside a console action (an
operator's "query provider") is the action's, already audited: it is skipped here.

Automated actors that act as a user through ``perform`` (the demo's approver bot) name
themselves with ``Actor(system=...)`` and are audited by the frame.
"""

from __future__ import annotations

from typing import Any

from console.actors import system_label
from console.models import AuditEntry, AuditOutcome
from console.services.actions import in_action
from console.services.limits import clip_text
from ledger.models import EffectRecord
from ledger.services import effect_resolved


def _on_effect_resolved(sender: Any, effect: EffectRecord, outcome: str, actor: str, **kwargs: Any) -> None:
    if in_action():
        return
    user = effect.resolved_by
    AuditEntry.objects.create(
        actor=user, actor_label=(user.get_username() if user is not None else system_label(actor))[:200],
        action="effect.resolve", object_type="effect", object_id=str(effect.id), outcome=AuditOutcome.OK,
        reason=clip_text(effect.resolution_note), tenant=effect.tenant,
        after={"state": effect.status, "downstream_ref": effect.downstream_ref, "resolution": effect.resolution,
               "resolved_by": effect.resolved_by_label,
               "resolved_at": effect.resolved_at.isoformat() if effect.resolved_at else None},
        message=f"resolved as {outcome.replace('_', ' ')} ({effect.resolution or 'manual'})",
    )


def connect_signals() -> None:
    effect_resolved.connect(_on_effect_resolved, sender=EffectRecord, dispatch_uid="console.system_audit.effect")
