"""Automatic reconciliation: re-query UNKNOWN effects whose connector has ``lookup``.

Back-off per effect: 2 s, 4 s, 8 s ... capped at 5 minutes. A conclusive answer
(``Succeeded`` or ``NotExecuted``) resolves the effect through the same service
a person uses, so the run is journaled and woken the same way; anything else
leaves it UNKNOWN for the next check (and in the console's queue).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from ledger.connectors import Operation, get_connector
from ledger.errors import ConnectorNotRegistered, LedgerError
from ledger.models import EffectRecord, EffectStatus
from ledger.outcomes import NotExecuted, Outcome, Succeeded, Unknown
from ledger.services import effect_resolve

log = logging.getLogger("ledger.reconcile")

BASE_SECONDS = 2.0
MAX_SECONDS = 300.0
BATCH = 200


def backoff(checks: int) -> float:
    return min(MAX_SECONDS, BASE_SECONDS * (2 ** max(0, checks)))


@dataclass
class ReconcileReport:
    checked: int = 0
    succeeded: int = 0
    not_executed: int = 0
    still_unknown: int = 0

    def __str__(self) -> str:
        return (
            f"checked={self.checked} succeeded={self.succeeded} not_executed={self.not_executed} "
            f"still_unknown={self.still_unknown}"
        )


def lookup(effect: EffectRecord) -> Outcome:
    """Ask the downstream system about ``effect`` (an effect or a compensation record)."""
    try:
        op = Operation(get_connector(effect.connector), effect.kind)
    except ConnectorNotRegistered as exc:
        return Unknown(str(exc))
    if not op.can_lookup:
        return Unknown("connector has no lookup for this kind of call")
    try:
        return op.lookup(effect.idempotency_key)
    except Exception as exc:  # a failed lookup is not evidence of anything
        return Unknown(f"lookup raised {type(exc).__name__}: {exc}")


def reconcile_effect(effect: EffectRecord, *, actor: str = "reconciler") -> Outcome:
    """Look the effect up once and resolve it if the answer is conclusive."""
    outcome = lookup(effect)
    try:
        if isinstance(outcome, Succeeded):
            effect_resolve(
                effect_id=effect.id, outcome="succeeded", note="provider lookup: succeeded", user=None,
                actor=actor, downstream_ref=outcome.downstream_ref, result=outcome.result, resolution="lookup",
            )
        elif isinstance(outcome, NotExecuted):
            effect_resolve(
                effect_id=effect.id, outcome="not_executed", note="provider lookup: no record of this key",
                user=None, actor=actor, resolution="lookup",
            )
    except LedgerError as exc:  # resolved meanwhile, or its run is live: look again next time
        log.info("effect %s: not resolved now: %s", effect.id, exc)
        return Unknown(str(exc))
    return outcome


def reconcile_due(*, limit: int = BATCH) -> ReconcileReport:
    report = ReconcileReport()
    due = list(
        EffectRecord.objects.filter(
            status=EffectStatus.UNKNOWN, next_check_at__isnull=False, next_check_at__lte=timezone.now()
        ).order_by("next_check_at")[:limit]
    )
    for effect in due:
        report.checked += 1
        outcome = reconcile_effect(effect)
        if isinstance(outcome, Succeeded):
            report.succeeded += 1
        elif isinstance(outcome, NotExecuted):
            report.not_executed += 1
        else:
            report.still_unknown += 1
            with transaction.atomic():
                updated = EffectRecord.objects.select_for_update().get(id=effect.id)
                if updated.status == EffectStatus.UNKNOWN:
                    updated.checks += 1
                    updated.next_check_at = timezone.now() + timedelta(seconds=backoff(updated.checks))
                    updated.save(update_fields=["checks", "next_check_at", "updated_at"])
    if report.checked:
        log.info("reconcile: %s", report)
    return report
