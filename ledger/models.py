"""The side-effect ledger: what we know about each external operation.

The ledger knows nothing of workflows beyond ids (``run_id``, ``step_name``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from ledger.errors import LedgerError


class EffectStatus(models.TextChoices):
    PENDING = "PENDING", "intent recorded, not dispatched"
    IN_PROGRESS = "IN_PROGRESS", "dispatched, outcome not yet recorded"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    FAILED_FINAL = "FAILED_FINAL", "failed permanently"
    UNKNOWN = "UNKNOWN", "outcome unknown"


E = EffectStatus
# The one table of legal effect transitions.
EFFECT_TRANSITIONS: dict[str, frozenset[str]] = {
    E.PENDING: frozenset({E.IN_PROGRESS, E.FAILED_FINAL}),
    # IN_PROGRESS -> PENDING: a Retryable error (known not executed) before the next attempt.
    E.IN_PROGRESS: frozenset({E.IN_PROGRESS, E.PENDING, E.SUCCEEDED, E.FAILED_FINAL, E.UNKNOWN}),
    # UNKNOWN -> PENDING: evidence that it was not executed (lookup or a person): retry, same key.
    E.UNKNOWN: frozenset({E.UNKNOWN, E.IN_PROGRESS, E.PENDING, E.SUCCEEDED, E.FAILED_FINAL}),
    E.SUCCEEDED: frozenset(),
    E.FAILED_FINAL: frozenset(),
}


class IllegalEffectTransition(LedgerError):
    code = "illegal_effect_transition"


def check_effect_transition(old: str, new: str) -> None:
    if new not in EFFECT_TRANSITIONS[old]:
        raise IllegalEffectTransition(f"an effect cannot go from {old} to {new}")


class EffectKind(models.TextChoices):
    EFFECT = "effect"
    COMPENSATION = "compensation"


class EffectRecord(models.Model):
    tenant = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=300)
    kind = models.CharField(max_length=20, choices=EffectKind.choices, default=EffectKind.EFFECT)
    run_id = models.UUIDField(help_text="the run that recorded the intent")
    # The run's workflow and business key, copied from the run when the record is inserted (by a
    # trigger: sagas.store.effect_context), so the ambiguous-effects queue filters and searches
    # its open effects on their own columns instead of looking up each one's run.
    workflow_name = models.CharField(max_length=200, blank=True, default="", db_default="", editable=False)
    business_key = models.CharField(max_length=200, blank=True, default="", db_default="", editable=False)
    step_name = models.CharField(max_length=200)
    connector = models.CharField(max_length=200)
    request_payload = models.JSONField()
    payload_hash = models.CharField(max_length=64)

    status = models.CharField(max_length=20, choices=EffectStatus.choices, default=EffectStatus.PENDING)
    result = models.JSONField(null=True, blank=True)
    downstream_ref = models.CharField(max_length=300, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0, help_text="dispatches made")
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")

    intent_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Reconciliation: automatic (lookup) or manual (a person with evidence).
    checks = models.PositiveIntegerField(default=0, help_text="lookups made by the reconciler")
    next_check_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolved_by_label = models.CharField(max_length=200, blank=True, default="", help_text="who, for display")
    resolution = models.CharField(max_length=40, blank=True, default="")
    resolution_note = models.TextField(blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], name="effect_unique_tenant_key"),
            models.CheckConstraint(condition=Q(status__in=EffectStatus.values), name="effect_status_valid"),
        ]
        indexes = [
            models.Index(fields=["run_id"], name="effect_run"),
            # The open effects in intent order, carrying what the ambiguous-effects queue and the
            # overview count, filter and search on: their count and oldest are read from the index
            # alone (20,000 open effects at 10M runs: 25 ms reading the rows, a few ms without;
            # 0003), and so are the workflow and business key of each (0004).
            models.Index(fields=["intent_at", "id"],
                         include=["status", "dispatched_at", "run_id", "tenant", "connector", "workflow_name",
                                  "business_key"],
                         condition=Q(status__in=["UNKNOWN", "IN_PROGRESS"]), name="effect_open_context"),
            models.Index(fields=["next_check_at"], condition=Q(status="UNKNOWN"), name="effect_check_due"),
            # And effect_open_connector, for the queue's connector filter, in migration 0005 only:
            # its predicate is one Django's Index cannot state.
        ]

    def __str__(self) -> str:
        return f"{self.connector} {self.idempotency_key} [{self.status}]"

    @property
    def is_settled(self) -> bool:
        return self.status in (EffectStatus.SUCCEEDED, EffectStatus.FAILED_FINAL)


class EffectKeyIndex(models.Model):
    """The idempotency key of a settled effect whose record was archived with its run.

    While ``expires_at`` has not passed, the intent path treats the key as taken, as it
    treats a key in ``EffectRecord``: the same payload gets the recorded outcome (``result``
    for SUCCEEDED, ``EffectFailed`` for FAILED_FINAL) and the connector is not called; a
    different payload is refused (``KeyConflict``). After that, the row is purged
    (``ledger.keyindex.keys_purge``) and the key is free again.
    """

    tenant = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=300)
    kind = models.CharField(max_length=20, choices=EffectKind.choices, default=EffectKind.EFFECT)
    payload_hash = models.CharField(max_length=64)
    connector = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=EffectStatus.choices)
    result = models.JSONField(null=True, blank=True)
    downstream_ref = models.CharField(max_length=300, blank=True, default="")
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    run_id = models.UUIDField(help_text="the archived run that recorded the effect")
    step_name = models.CharField(max_length=200)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], name="effect_key_index_unique"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="effect_key_index_expiry")]

    def __str__(self) -> str:
        return f"{self.connector} {self.idempotency_key} [{self.status}, archived]"
