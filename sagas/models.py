"""System tables of the engine: runs, their append-only journal, and registered versions."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Exists, OuterRef, Q

from ledger.journal import COMPENSATION_KINDS, EFFECT_KINDS
from sagas.errors import IllegalTransition
from sagas.store.key_grams import KeyGrams


class RunStatus(models.TextChoices):
    """A run's status; the allowed moves between them are ``RUN_TRANSITIONS`` below."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    NEEDS_ATTENTION = "NEEDS_ATTENTION"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


S = RunStatus
# The one table of legal run transitions. SQL in sagas/store/systemdb.py derives its
# ``status = ANY(...)`` guards from it through ``sources()``.
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    # PENDING -> NEEDS_ATTENTION: no live worker has the run's code (version_mismatch).
    S.PENDING: frozenset({S.RUNNING, S.NEEDS_ATTENTION, S.COMPENSATING, S.CANCELLED}),
    # RUNNING -> RUNNING is a new claim after the previous lease expired.
    S.RUNNING: frozenset(
        {S.RUNNING, S.PENDING, S.WAITING, S.NEEDS_ATTENTION, S.COMPENSATING, S.COMPLETED, S.FAILED, S.CANCELLED}
    ),
    S.WAITING: frozenset({S.PENDING, S.NEEDS_ATTENTION, S.COMPENSATING, S.CANCELLED}),
    S.NEEDS_ATTENTION: frozenset({S.PENDING, S.COMPENSATING, S.FAILED, S.CANCELLED}),
    S.COMPENSATING: frozenset({S.COMPENSATING, S.NEEDS_ATTENTION, S.COMPENSATED}),
    S.COMPENSATED: frozenset(),
    # COMPLETED -> COMPENSATING: only a child run, undone by its parent's compensation
    # (sagas.children); a top-level run that completed is never compensated.
    S.COMPLETED: frozenset({S.COMPENSATING}),
    # FAILED -> PENDING: redriven by an operator (sagas.repair), its effects still in place.
    S.FAILED: frozenset({S.COMPENSATING, S.PENDING}),
    S.CANCELLED: frozenset(),
}
TERMINAL_STATUSES = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.COMPENSATED})
# Statuses in which a worker holds (or held, if the lease expired) the run.
LEASED_STATUSES = frozenset({S.RUNNING, S.COMPENSATING})


def check_transition(old: str, new: str) -> None:
    if new not in RUN_TRANSITIONS[old]:
        raise IllegalTransition(f"a run cannot go from {old} to {new}")


def sources(new: str) -> list[str]:
    """Every status from which ``new`` may be reached, for SQL guards."""
    return sorted(old for old, targets in RUN_TRANSITIONS.items() if new in targets)


class WorkflowRun(models.Model):
    # Not a column: set on the run sagas.start() returns, True when that call created it and
    # False when a run with the same business key was already there.
    created_now: bool

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow_name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    definition_hash = models.CharField(max_length=64)
    input = models.JSONField(null=True, blank=True)
    summary = models.JSONField(
        null=True, blank=True,
        help_text="what its workflow declares a person needs to know (sagas.summaries), from the input at start",
    )
    business_key = models.CharField(max_length=200, blank=True, default="")
    tenant = models.CharField(max_length=100, default="default")

    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING)
    # Why the run needs attention or failed: version_mismatch, non_determinism,
    # budget_exceeded, workflow_error ... (machine-readable, stable).
    status_reason = models.CharField(max_length=50, blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)

    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fence = models.BigIntegerField(default=0, help_text="+1 on every claim; every write checks it")
    attempts = models.PositiveIntegerField(default=0, help_text="number of claims")
    last_seq = models.PositiveIntegerField(
        default=0, help_text="steps_used and cost_used count the journal up to this seq (sagas.store.numbering)"
    )

    steps_used = models.PositiveIntegerField(default=0)
    cost_used = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    max_cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    max_duration = models.DurationField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True, help_text="when a waiting run's timer is due")
    # Held by an operator (sagas.pausing): not claimed, not woken, stopped at its next step
    # boundary if a worker has it, until resumed. Who and why are in the journal and the audit log.
    paused_at = models.DateTimeField(null=True, blank=True, help_text="paused by an operator since")
    # Which runs a saturated worker takes first: 1 (first) to 5 (last), 3 by default
    # (sagas.runtime.queue: one queue per priority, read in that order).
    priority = models.PositiveSmallIntegerField(default=3, db_default=3)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    started_via = models.CharField(max_length=20, default="api")
    # A chain of runs made by ``ctx.continue_as_new(state)``: the run this one continues, and
    # the run that continues this one (set when this run ends that way). Plain ids, not
    # foreign keys: retention archives a chain's older runs while the newer ones live on.
    continued_from = models.UUIDField(null=True, blank=True, help_text="the run this one continues")
    continued_to = models.UUIDField(null=True, blank=True, help_text="the run that continues this one")
    # A run re-run from a step of another (sagas.repair.run_fork): the source and the position
    # (its journal's seq) the new run executes from; the source's forks are found by this field.
    forked_from = models.UUIDField(null=True, blank=True, help_text="the run this one was re-run from")
    forked_at_seq = models.PositiveIntegerField(null=True, blank=True)
    # A child run started by ``ctx.start_child`` (sagas.children): the run that started it. Plain
    # id, as for chains. ``detached``: started to outlive its parent, which neither waits for it,
    # cancels it nor compensates it.
    parent_run = models.UUIDField(null=True, blank=True, help_text="the run that started this one as its child")
    detached = models.BooleanField(default=False, db_default=False,
                                   help_text="a child started to outlive its parent")

    class Meta:
        constraints = [
            # start() is idempotent per business key: see sagas.services.run_start.
            models.UniqueConstraint(
                fields=["tenant", "workflow_name", "business_key"],
                condition=~Q(business_key=""),
                name="run_unique_business_key",
            ),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
            models.CheckConstraint(condition=Q(priority__gte=1, priority__lte=5), name="run_priority_valid"),
        ]
        indexes = [
            models.Index(fields=["status", "updated_at"], name="run_status_updated"),
            # Console list filters use (status|workflow|workflow+version|tenant, created_at, id) and a
            # pattern index on business_key, created in migration 0006 (CONCURRENTLY, outside Meta).
            # No index on updated_at alone: every query on it filters by status (migration 0013).
            models.Index(fields=["-created_at", "-id"], name="run_created_keyset"),
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status__in=["RUNNING", "COMPENSATING"]),
                name="run_live_lease",
            ),
            models.Index(fields=["wake_at"], condition=Q(status="WAITING"), name="run_wake_due"),
            # The few paused runs, for the overview and the runs list's filter (migration 0017).
            models.Index(fields=["-paused_at"], condition=Q(paused_at__isnull=False), name="run_paused"),
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="run_finished"),
            # The oldest run in flight of a version, for the workers page's stranded versions (0026).
            models.Index(fields=["definition_hash", "created_at"],
                         condition=Q(status__in=["PENDING", "RUNNING", "WAITING", "NEEDS_ATTENTION"]),
                         name="run_in_flight_hash"),
            # The oldest run needing a person or failed, per reason, for the overview (migration 0022).
            models.Index(fields=["status", "status_reason", "updated_at"],
                         condition=Q(status__in=["NEEDS_ATTENTION", "FAILED"]), name="run_attention"),
            # A run's re-runs from a step, for its page and the next re-run's checks (migration 0019).
            models.Index(fields=["forked_from"], condition=Q(forked_from__isnull=False), name="run_forked_from"),
            # A run's children, oldest first, for its page, its compensation and the sweeper's
            # catch-up; top-level runs (most) are not in it (migration 0034).
            models.Index(fields=["parent_run", "created_at"], condition=Q(parent_run__isnull=False),
                         name="run_children"),
            # Attached children in flight, for the sweeper's check that their parent has not ended.
            models.Index(fields=["parent_run"], condition=Q(parent_run__isnull=False, detached=False, status__in=[
                "PENDING", "RUNNING", "WAITING", "NEEDS_ATTENTION"]), name="run_children_in_flight"),
            # The top-level runs alone, newest first, for the runs list's "top-level runs only" (the
            # console and the API): without it a page walks past every child created since (a fan-out
            # of 50,000 children skipped in 9 ms, growing with the fan-out). Migration 0035.
            models.Index(fields=["-created_at", "-id"], condition=Q(parent_run__isnull=True), name="run_top_level"),
            # The console's search by any part of a business key: every 3- and 4-character piece
            # of it (sagas.store.key_grams; migration 0029, which replaced 0010's trigram index).
            GinIndex(KeyGrams("business_key"), name="run_business_key_grams"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} v{self.version} {self.id} [{self.status}]"


class WorkflowPause(models.Model):
    """Every run of a workflow (or of one of its versions) held by an operator, new runs too,
    until the pause is lifted (``sagas.pausing``). A run is paused if its own ``paused_at`` is
    set or a pause here covers it."""

    workflow_name = models.CharField(max_length=200)
    version = models.PositiveIntegerField(null=True, blank=True, help_text="empty: every version")
    reason = models.TextField()
    paused_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="+")
    paused_by_label = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow_name", "version"], nulls_distinct=False,
                                    name="workflow_pause_unique"),
        ]

    def __str__(self) -> str:
        which = f"v{self.version}" if self.version is not None else "every version"
        return f"{self.workflow_name} ({which}) paused by {self.paused_by_label}"


def paused_runs() -> Q:
    """The runs held by an operator: paused themselves, or covered by a ``WorkflowPause``
    (the ORM form of ``sagas.store.systemdb.PAUSED``)."""
    covering = WorkflowPause.objects.filter(workflow_name=OuterRef("workflow_name")).filter(
        Q(version__isnull=True) | Q(version=OuterRef("version"))
    )
    return Q(paused_at__isnull=False) | Q(Exists(covering))


class JournalKind(models.TextChoices):
    STARTED = "started"
    CLAIMED = "claimed"
    STEP = "step"
    NOW = "now"
    RANDOM = "random"
    UUID = "uuid"
    COMPLETED = "completed"
    FAILED = "failed"
    HALTED = "halted"
    YIELDED = "yielded"
    RESUMED = "resumed"
    OPERATOR_ACTION = "operator_action"
    # Repair (sagas.repair): the run's code changed to another version; the run continues
    # from where it stopped (a failed step, listed in the payload, is asked again).
    MOVED = "moved"
    REDRIVEN = "redriven"
    # A run re-run from a step of another (sagas.repair): at the head of the new run's journal,
    # after the entries copied from the source; on the source, an operator_action "fork".
    FORKED = "forked"
    # Written by the ledger's protocol; their one definition is ``ledger.journal``.
    EFFECT_INTENT = EFFECT_KINDS.intent
    EFFECT_REFUSED = EFFECT_KINDS.refused
    EFFECT_RESULT = EFFECT_KINDS.result
    EFFECT_RESOLVED = "effect_resolved"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    APPROVAL_EXPIRED = "approval_expired"
    TIMER_SET = "timer_set"
    TIMER_FIRED = "timer_fired"
    SIGNAL_WAIT = "signal_wait"
    SIGNAL_RECEIVED = "signal_received"
    SIGNAL_TIMEOUT = "signal_timeout"
    SUSPENDED = "suspended"
    # Flow control let a held effect of the run go (ledger.flow.pump): an event, never replayed.
    FLOW_RELEASED = "flow_released"
    CANCELLED = "cancelled"
    COMPENSATION_STARTED = "compensation_started"
    COMPENSATION_ITEM = "compensation_item"
    COMPENSATION_INTENT = COMPENSATION_KINDS.intent
    COMPENSATION_RESULT = COMPENSATION_KINDS.result
    COMPENSATION_REFUSED = COMPENSATION_KINDS.refused
    COMPENSATION_FINISHED = "compensation_finished"
    # Child runs (sagas.children): started (a position), finished (an event on the parent,
    # written when the child ends), joined (a position: what a wait_child/gather decided).
    CHILD_STARTED = "child_started"
    CHILD_FINISHED = "child_finished"
    CHILDREN_JOINED = "children_joined"
    CHILD_SIGNALLED = "child_signalled"


# Kinds written by ``ctx`` calls in the workflow's own order. Replay matches them
# position by position; every other kind is an event around the run (claims,
# outcomes, operator actions) that replay skips.
# An operator's repairs of a run (sagas.repair, sagas.pausing, retries), as the run page lists them.
REPAIR_KINDS = ("moved", "redriven", "forked", "operator_action")
CALL_KINDS = frozenset(
    {
        JournalKind.STEP,
        JournalKind.NOW,
        JournalKind.RANDOM,
        JournalKind.UUID,
        JournalKind.EFFECT_INTENT,
        JournalKind.EFFECT_REFUSED,
        JournalKind.APPROVAL_REQUESTED,
        JournalKind.TIMER_SET,
        JournalKind.SIGNAL_WAIT,
        JournalKind.CHILD_STARTED,
        JournalKind.CHILDREN_JOINED,
        JournalKind.CHILD_SIGNALLED,
    }
)


class JournalEntry(models.Model):
    """One entry of a run's history. Append-only: a database trigger refuses UPDATE and DELETE.
    ``run`` has no FK constraint in the database, a delete guard on the run instead (why: migration 0014)."""

    run = models.ForeignKey(WorkflowRun, on_delete=models.PROTECT, related_name="journal", db_index=False,
                            db_constraint=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    name = models.CharField(max_length=200, blank=True, default="")
    payload = models.JSONField(null=True, blank=True)
    worker_id = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="journal_unique_run_seq")]
        indexes = [
            # A run's repairs (moves, redrives, re-runs, operators' actions) for its page, without
            # reading its whole history (migration 0020). Few entries: the index stays small.
            models.Index(fields=["run", "-seq"], condition=Q(kind__in=REPAIR_KINDS), name="journal_repairs"),
            # A parent's entry for one child (started, finished), found by the call's name when the
            # child ends, without reading a fan-out's long journal (migration 0037).
            models.Index(fields=["run", "name"], condition=Q(kind__in=["child_started", "child_finished"]),
                         name="journal_children"),
        ]
        ordering = ["run", "seq"]
        verbose_name_plural = "journal entries"

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind} {self.name}"


class WorkflowVersion(models.Model):
    """Every (name, version, hash) a process has registered, with its source for diffs."""

    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    definition_hash = models.CharField(max_length=64)
    source = models.TextField()
    module = models.CharField(max_length=300)
    first_registered_at = models.DateTimeField(auto_now_add=True)
    last_registered_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "version", "definition_hash"], name="version_unique_hash")
        ]
        ordering = ["name", "-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version} ({self.definition_hash[:12]})"


class RunCount(models.Model):
    """How many runs there are per (tenant, status, status_reason), kept exact by triggers on
    the runs table (``sagas.store.counts``): the overview reads these instead of counting a
    million runs. The triggers write into ``RunCountDelta`` (inserts only: no row is ever
    contended); the sweeper folds the deltas in here. A count is this row plus its deltas."""

    tenant = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    status_reason = models.CharField(max_length=50, blank=True, default="")
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "status", "status_reason"], name="run_count_key")]

    def __str__(self) -> str:
        return f"{self.tenant} {self.status} {self.status_reason}: {self.n}"


class RunCountDelta(models.Model):
    """A change to ``RunCount`` not folded in yet (+n or -n), written by the runs table's triggers."""

    tenant = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    status_reason = models.CharField(max_length=50, blank=True, default="")
    n = models.IntegerField()


class InFlightCount(models.Model):
    """How many runs in flight (PENDING, RUNNING, WAITING, NEEDS_ATTENTION) there are per
    (tenant, workflow, version, definition hash, status), kept like ``RunCount``
    (``sagas.store.counts``): the workers page's stranded versions read these."""

    tenant = models.CharField(max_length=100)
    workflow_name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    definition_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=20)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "workflow_name", "version", "definition_hash",
                                                       "status"], name="in_flight_count_key")]


class InFlightCountDelta(models.Model):
    """A change to ``InFlightCount`` not folded in yet, written by the runs table's triggers."""

    tenant = models.CharField(max_length=100)
    workflow_name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    definition_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=20)
    n = models.IntegerField()


class WorkerProcess(models.Model):
    """A live (or recently live) worker and the code versions it can run.

    Workers upsert their row at start and on every background beat. The sweeper
    uses it to tell "waiting for a worker" from "no worker has this code".
    """

    name = models.CharField(max_length=200, unique=True)
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    definitions = models.JSONField(default=list, help_text="[{name, version, hash}] this worker runs")
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApprovalState(models.TextChoices):
    PENDING = "PENDING"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    EXPIRED = "EXPIRED"  # deadline passed with on_timeout="reject": counts as a rejection
    ESCALATED = "ESCALATED"  # deadline passed with on_timeout="escalate": still decidable


A = ApprovalState
APPROVAL_TRANSITIONS: dict[str, frozenset[str]] = {
    A.PENDING: frozenset({A.APPROVED, A.REJECTED, A.EXPIRED, A.ESCALATED}),
    A.ESCALATED: frozenset({A.APPROVED, A.REJECTED}),
    A.APPROVED: frozenset(),
    A.REJECTED: frozenset(),
    A.EXPIRED: frozenset(),
}
OPEN_APPROVAL_STATES = frozenset({A.PENDING, A.ESCALATED})


def check_approval_transition(old: str, new: str) -> None:
    if new not in APPROVAL_TRANSITIONS[old]:
        raise IllegalTransition(f"an approval cannot go from {old} to {new}")


class ApprovalRequest(models.Model):
    run = models.ForeignKey(WorkflowRun, on_delete=models.PROTECT, related_name="approvals")
    step = models.CharField(max_length=200)
    reason = models.TextField()
    on_timeout = models.CharField(max_length=20, default="escalate")
    requested_at = models.DateTimeField()
    deadline = models.DateTimeField()
    state = models.CharField(max_length=20, choices=ApprovalState.choices, default=ApprovalState.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_by_label = models.CharField(max_length=200, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    # Whether the run is WAITING or NEEDS_ATTENTION, i.e. asks someone to decide: kept by
    # triggers from the run's status whatever is written here (sagas.store.approval_waits).
    run_waits = models.BooleanField(default=False, db_default=False, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="approval_unique_run_step")]
        indexes = [
            models.Index(fields=["deadline"], condition=Q(state="PENDING"), name="approval_pending_deadline"),
            models.Index(fields=["state", "deadline", "id"], name="approval_state_deadline"),
            # The inbox, soonest deadline first, read in order and stopped at its limit (migration 0023).
            models.Index(fields=["deadline", "id"], condition=Q(state__in=["PENDING", "ESCALATED"]),
                         name="approval_open_deadline"),
            # The open approvals whose run waits for a decision: the inbox's pages and count, the
            # overview's count and oldest, all from this index alone (migration 0025).
            models.Index(fields=["deadline", "id"], include=["requested_at"],
                         condition=Q(state__in=["PENDING", "ESCALATED"], run_waits=True),
                         name="approval_waiting_deadline"),
            models.Index(fields=["-decided_at", "-id"], condition=Q(decided_at__isnull=False),
                         name="approval_recently_decided"),
        ]

    def __str__(self) -> str:
        return f"approval {self.step} of {self.run_id} [{self.state}]"


class CompensationState(models.TextChoices):
    RUNNING = "RUNNING"
    NEEDS_ATTENTION = "NEEDS_ATTENTION"
    COMPLETED = "COMPLETED"


C = CompensationState
COMPENSATION_TRANSITIONS: dict[str, frozenset[str]] = {
    C.RUNNING: frozenset({C.NEEDS_ATTENTION, C.COMPLETED}),
    C.NEEDS_ATTENTION: frozenset({C.RUNNING}),
    C.COMPLETED: frozenset(),
}


def check_compensation_transition(old: str, new: str) -> None:
    if new not in COMPENSATION_TRANSITIONS[old]:
        raise IllegalTransition(f"a compensation plan cannot go from {old} to {new}")


class CompensationPlan(models.Model):
    run = models.OneToOneField(WorkflowRun, on_delete=models.PROTECT, related_name="compensation")
    reason = models.TextField()
    trigger = models.CharField(max_length=20, help_text="automatic | operator | cancel | rejection")
    state = models.CharField(max_length=20, choices=CompensationState.choices, default=CompensationState.RUNNING)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_by_label = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"compensation of {self.run_id} [{self.state}]"


class CompensationItemState(models.TextChoices):
    PENDING = "PENDING"
    SUCCEEDED = "SUCCEEDED"
    UNKNOWN = "UNKNOWN"
    FAILED = "FAILED"
    IRREVERSIBLE = "IRREVERSIBLE"  # nothing can undo it; listed so people see it


class CompensationItem(models.Model):
    plan = models.ForeignKey(CompensationPlan, on_delete=models.PROTECT, related_name="items")
    position = models.PositiveIntegerField(help_text="0 = undone first (the newest effect)")
    effect_id = models.BigIntegerField(null=True, blank=True, help_text="the ledger record being undone")
    # Or a child run (sagas.children): undone by its own compensation, which this item waits for.
    child_run = models.UUIDField(null=True, blank=True, help_text="the child run being undone")
    step_name = models.CharField(max_length=200)
    connector = models.CharField(max_length=200)
    compensation_key = models.CharField(max_length=300, blank=True, default="")
    state = models.CharField(
        max_length=20, choices=CompensationItemState.choices, default=CompensationItemState.PENDING
    )
    compensation_effect_id = models.BigIntegerField(null=True, blank=True, help_text="its own ledger record")

    class Meta:
        ordering = ["plan", "position"]
        constraints = [models.UniqueConstraint(fields=["plan", "position"], name="compensation_item_position")]

    def __str__(self) -> str:
        return f"{self.position}: undo {self.step_name} [{self.state}]"


class ArchivedRun(models.Model):
    """A run retention archived and deleted (``sagas.retention.archiving``): its lines are in the gzip
    member at ``offset`` (``length`` bytes) of ``location``; this row, never deleted, says which."""

    run_id = models.UUIDField(primary_key=True)
    workflow_name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    tenant = models.CharField(max_length=100)
    business_key = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=20, choices=RunStatus.choices)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField()
    location = models.CharField(max_length=1000, help_text="the archive file's URL")
    offset = models.BigIntegerField(help_text="where the run's gzip member starts in the file")
    length = models.BigIntegerField(help_text="the member's length in bytes")
    batch = models.UUIDField(help_text="the archive batch (one audit entry each)")

    class Meta:
        indexes = [models.Index(fields=["-archived_at"], name="archived_run_recent")]

    def __str__(self) -> str:
        return f"{self.workflow_name} v{self.version} {self.run_id} [archived {self.archived_at:%Y-%m-%d}]"


class TickOutcome(models.TextChoices):
    """What became of one tick of a schedule (``sagas.schedules``)."""

    STARTED = "started"  # a run was started for it (``run_id``)
    SKIPPED = "skipped"  # the previous tick's run was still going (overlap "skip"), or a tick was already buffered
    BUFFERED = "buffered"  # waits for the previous tick's run to finish (overlap "buffer_one")
    MISSED = "missed"  # due while nothing fired ticks, and the catch-up mode or window left it out
    FAILED = "failed"  # the start was refused (``note`` says why); the schedule goes on


class Schedule(models.Model):
    """A workflow started on a calendar (``sagas.schedules``): its spec, and where firing is.

    ``next_tick_at`` is the oldest tick not handled yet; ``due_at`` is when it fires (the tick
    plus its jitter). Firing a tick locks this row, so one process handles each tick; the unique
    ``(schedule, tick_at)`` of ``ScheduleTick`` and the run's business key make sure of it."""

    name = models.CharField(max_length=200, unique=True)
    workflow_name = models.CharField(max_length=200)
    tenant = models.CharField(max_length=100, default="default")
    cron = models.CharField(max_length=200, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    every = models.DurationField(null=True, blank=True)
    input = models.JSONField(null=True, blank=True)
    business_key = models.CharField(max_length=200)
    jitter = models.DurationField()
    catch_up = models.CharField(max_length=10)
    catch_up_window = models.DurationField()
    overlap = models.CharField(max_length=20)
    source = models.CharField(max_length=10, help_text='"code" (declared in @workflow) or "api"')
    paused = models.BooleanField(default=False)
    paused_reason = models.TextField(blank=True, default="")
    next_tick_at = models.DateTimeField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    buffered_tick_at = models.DateTimeField(null=True, blank=True)
    last_run_id = models.UUIDField(null=True, blank=True, help_text="the run of the newest tick started")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["due_at"], condition=Q(paused=False), name="schedule_due"),
            models.Index(fields=["buffered_tick_at"], condition=Q(buffered_tick_at__isnull=False),
                         name="schedule_buffered"),
        ]

    def __str__(self) -> str:
        return f"schedule {self.name} ({self.cron or self.every}) -> {self.workflow_name}"

    @property
    def timing(self) -> str:
        """The schedule's calendar in words: ``0 2 * * * (Europe/Berlin)`` or ``every 0:15:00``."""
        return f"{self.cron} ({self.timezone})" if self.cron else f"every {self.every}"


class ScheduleTick(models.Model):
    """One tick of a schedule that was handled: started, skipped, buffered, missed or failed."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="ticks")
    tick_at = models.DateTimeField()
    outcome = models.CharField(max_length=10, choices=TickOutcome.choices)
    how = models.CharField(max_length=10, help_text="schedule, catch_up, trigger or backfill")
    run_id = models.UUIDField(null=True, blank=True)
    note = models.TextField(blank=True, default="")
    handled_at = models.DateTimeField()
    actor_label = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["schedule", "tick_at"], name="schedule_tick_once")]
        indexes = [
            models.Index(fields=["schedule", "-tick_at"], name="schedule_tick_recent"),
            models.Index(fields=["run_id"], name="schedule_tick_run", condition=Q(run_id__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id}@{self.tick_at:%Y-%m-%d %H:%M:%S} {self.outcome}"

    @property
    def late_by(self) -> timedelta:
        """How long after its tick it was handled (its jitter included)."""
        return self.handled_at - self.tick_at


class SweepTurn(models.Model):
    """When the workers' sweep last ran (one row): a worker's background thread sweeps only when
    a sweep interval has passed since, so N workers make one sweep per interval between them,
    not N (``sagas.runtime.recovery.try_sweep_locked``)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    swept_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"last sweep {self.swept_at:%Y-%m-%d %H:%M:%S}"
