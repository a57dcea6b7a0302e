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
    # PENDING -> UNKNOWN: a failover lost commits (sagas.gaps), its dispatch mark among them maybe.
    E.PENDING: frozenset({E.IN_PROGRESS, E.FAILED_FINAL, E.UNKNOWN}),
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
    # The flow-control key the effect's limits are kept per (``ConnectorFlow.key_field``), "" for one
    # set per connector; fixed at the intent, so a call is counted in the bucket it waited in.
    flow_key = models.CharField(max_length=200, blank=True, default="", db_default="")

    status = models.CharField(max_length=20, choices=EffectStatus.choices, default=EffectStatus.PENDING)
    result = models.JSONField(null=True, blank=True)
    downstream_ref = models.CharField(max_length=300, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0, help_text="dispatches made")
    throttled = models.PositiveIntegerField(
        default=0, db_default=0, help_text="dispatches refused by the provider's rate limit (429s; not attempts)")
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
            # The calls out right now, per connector and flow key: what a concurrency limit counts
            # (ledger.flow.gate), built CONCURRENTLY by migration 0007.
            models.Index(fields=["connector", "flow_key", "dispatched_at"], condition=Q(status="IN_PROGRESS"),
                         name="effect_in_flight"),
            # Each connector's calls by when they ended: the connectors page's latency and errors.
            # Partial (ended calls only), so the open effects' queue, whose rows have none, never
            # picks it for its connector filter over effect_open_context.
            models.Index(fields=["connector", "completed_at"], condition=Q(completed_at__isnull=False),
                         name="effect_completed"),
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


# --- flow control (ledger.flow) -------------------------------------------------------------


class CircuitState(models.TextChoices):
    CLOSED = "closed", "closed: calls go through"
    OPEN = "open", "open: calls wait until the cool-down has passed"
    HALF_OPEN = "half_open", "half-open: one trial call is out"


class HoldReason(models.TextChoices):
    RATE = "rate_limit", "rate limit"
    CONCURRENCY = "concurrency", "concurrency limit"
    PAUSED = "paused", "connector paused"
    CIRCUIT = "circuit_open", "circuit open"
    QUEUED = "queued", "queued behind earlier calls"


class ConnectorFlow(models.Model):
    """The flow-control settings of one connector, shared by every worker on every host.

    A row is written for each registered connector when a worker starts
    (``ledger.flow.services.sync_declared``) with the limits its class declares; a person who
    changes them (``changed_by_label`` set) keeps their values until they reset them. A
    connector without a row is unlimited, unpaused and has the default circuit breaker.
    """

    connector = models.CharField(max_length=200, primary_key=True)
    rate = models.FloatField(null=True, blank=True, help_text="calls per second; empty: no rate limit")
    burst = models.PositiveIntegerField(default=1, help_text="calls that may go at once after a quiet spell")
    max_in_flight = models.PositiveIntegerField(null=True, blank=True, help_text="calls out at once; empty: no limit")
    key_field = models.CharField(
        max_length=100, blank=True, default="",
        help_text='what the limits are kept per: "" one set for the connector, "tenant", or a payload field',
    )
    circuit_failures = models.PositiveIntegerField(
        default=5, help_text="consecutive retryable failures or timeouts that open the circuit; 0: no breaker")
    circuit_window_seconds = models.FloatField(default=60.0)
    circuit_cooldown_seconds = models.FloatField(default=30.0)
    declared = models.JSONField(default=dict, help_text="the limits the connector's class declares")
    changed_by_label = models.CharField(max_length=200, blank=True, default="")
    changed_at = models.DateTimeField(null=True, blank=True)

    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by_label = models.CharField(max_length=200, blank=True, default="")
    paused_reason = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(rate__isnull=True) | Q(rate__gt=0), name="flow_rate_positive"),
            models.CheckConstraint(condition=Q(burst__gte=1), name="flow_burst_positive"),
            models.CheckConstraint(condition=Q(max_in_flight__isnull=True) | Q(max_in_flight__gte=1),
                                   name="flow_in_flight_positive"),
        ]

    def __str__(self) -> str:
        return f"flow of {self.connector}"

    @property
    def limited(self) -> bool:
        return self.rate is not None or self.max_in_flight is not None


class FlowBucket(models.Model):
    """The shared state of one limit: a connector's, or one key's where its limits have a key.

    ``tat`` is the rate limiter's theoretical arrival time (GCRA): the next call may go once
    ``tat - now <= (burst - 1) / rate``; sending one moves it on by ``1 / rate``. ``vtime`` is
    the fair queue's virtual time, the tag of the last ticket let go. ``grant_tat`` is the same
    clock as ``tat`` for letting held calls go (``ledger.flow.pump``): they are let go at the
    rate, however long each then takes to reach its dispatch. The circuit's state and its count
    of consecutive failures live here too."""

    connector = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    tat = models.DateTimeField(null=True, blank=True)
    grant_tat = models.DateTimeField(null=True, blank=True)
    vtime = models.BigIntegerField(default=0)
    circuit = models.CharField(max_length=20, choices=CircuitState.choices, default=CircuitState.CLOSED)
    failures = models.PositiveIntegerField(default=0, help_text="consecutive failures in the window")
    first_failure_at = models.DateTimeField(null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    trial_effect_id = models.BigIntegerField(null=True, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True, help_text="of the circuit's state")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["connector", "key"], name="flow_bucket_unique")]

    def __str__(self) -> str:
        return f"{self.connector}[{self.key}] {self.circuit}"


class TicketState(models.TextChoices):
    WAITING = "waiting"
    GRANTED = "granted"


class FlowTicket(models.Model):
    """An effect that flow control holds back: its record is PENDING and it was never sent.

    Tickets of one bucket are let go in ``(tag, id)`` order: ``tag`` is a start-time fair
    queueing tag, so the oldest ticket of each ``lane`` (a tenant) takes turns with the other
    lanes' instead of queueing behind a whole backlog. A GRANTED ticket's run has been woken
    and may take the next token; it is deleted in the transaction that dispatches its effect.
    """

    effect = models.OneToOneField(EffectRecord, on_delete=models.CASCADE, related_name="flow_ticket")
    run_id = models.UUIDField()
    connector = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    lane = models.CharField(max_length=100, blank=True, default="")
    tag = models.BigIntegerField()
    reason = models.CharField(max_length=20, choices=HoldReason.choices)
    state = models.CharField(max_length=10, choices=TicketState.choices, default=TicketState.WAITING)
    created_at = models.DateTimeField()
    granted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["connector", "key", "tag", "id"], condition=Q(state="waiting"),
                         name="flow_ticket_queue"),
            models.Index(fields=["connector", "key", "lane", "tag"], condition=Q(state="waiting"),
                         name="flow_ticket_lane"),
            models.Index(fields=["connector", "key", "granted_at"], condition=Q(state="granted"),
                         name="flow_ticket_granted"),
            models.Index(fields=["run_id"], name="flow_ticket_run"),
        ]

    def __str__(self) -> str:
        return f"ticket {self.id} {self.connector}[{self.key}] {self.state} ({self.reason})"


class CircuitChange(models.Model):
    """One change of a circuit's state (closed -> open -> half-open -> closed or open again): the
    connectors page's timeline and what notifications are sent for. Written in the transaction
    that changes the state; append-only."""

    connector = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(max_length=20, choices=CircuitState.choices)
    failures = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="", help_text="the failure that opened it")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["connector", "-at"], name="circuit_change_recent")]

    def __str__(self) -> str:
        return f"{self.connector}[{self.key}] -> {self.state} at {self.at:%H:%M:%S}"


class SpendLimit(models.Model):
    """At most ``per_day`` (in the runs' cost unit, usd) spent by ``tenant`` on ``connector`` per
    UTC day; ``tenant = "*"``: every tenant that has no row of its own (each counted on its own).
    A call or model turn that finds the day's spend at or over it parks its run (``spend_limit``)."""

    EVERY_TENANT = "*"

    tenant = models.CharField(max_length=100)
    connector = models.CharField(max_length=200)
    per_day = models.DecimalField(max_digits=14, decimal_places=6)
    changed_by_label = models.CharField(max_length=200, blank=True, default="")
    changed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "connector"], name="spend_limit_unique"),
            models.CheckConstraint(condition=Q(per_day__gte=0), name="spend_limit_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} on {self.connector}: {self.per_day}/day"


class SpendDay(models.Model):
    """What ``tenant`` spent on ``connector`` on one UTC day: added to in the transaction that
    journals the cost (a model turn's step, or an effect's result)."""

    tenant = models.CharField(max_length=100)
    connector = models.CharField(max_length=200)
    day = models.DateField()
    spent = models.DecimalField(max_digits=14, decimal_places=6, default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "connector", "day"], name="spend_day_unique")]

    def __str__(self) -> str:
        return f"{self.tenant} on {self.connector} {self.day}: {self.spent}"
