"""Audit entries for what automated actors change outside the console's action frame.

People act through ``operators.services.actions.perform``, which audits each action in its
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

from ledger.models import EffectRecord
from ledger.services import effect_resolved
from operators.actors import system_label
from operators.models import AuditEntry, AuditOutcome
from operators.services.actions import in_action
from operators.services.limits import clip_text
from sagas.integration import ArchivedBatch, runs_archived
from sagas.models import ArchivedRun


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


def _on_runs_archived(sender: Any, batch: ArchivedBatch, **kwargs: Any) -> None:
    """One ``runs.archived`` entry per retention batch, in the batch's transaction (sent by
    ``sagas.retention.archiving`` after the delete): a failure here rolls the batch back. The tenant is
    the batch's when it has one (else "": shown to those who see every tenant)."""
    count = len(batch.run_ids)
    AuditEntry.objects.create(
        actor=None, actor_label=system_label("retention"), action="runs.archived", object_type="archive_batch",
        object_id=str(batch.id), outcome=AuditOutcome.OK, tenant=batch.tenants[0] if len(batch.tenants) == 1 else "",
        after={"count": count, "first_run_id": batch.run_ids[0], "last_run_id": batch.run_ids[-1],
               "journal_entries": batch.journal_entries, "effects": batch.effects, "files": batch.files,
               "first_finished_at": batch.first_finished_at.isoformat() if batch.first_finished_at else None,
               "last_finished_at": batch.last_finished_at.isoformat() if batch.last_finished_at else None},
        message=f"archived {count} finished run(s) to {', '.join(batch.files)} and deleted them",
    )


def connect_signals() -> None:
    effect_resolved.connect(_on_effect_resolved, sender=EffectRecord, dispatch_uid="console.system_audit.effect")
    runs_archived.connect(_on_runs_archived, sender=ArchivedRun, dispatch_uid="console.system_audit.archived")
