"""Bulk actions: one operator action repeated over many objects, as a background job.

A batch is previewed (``batch_preview``: the objects and the state each is in now, fixed as
the batch's items), confirmed with a reason (``batch_confirm``: one audit entry for the batch,
then jobs on the queue every worker reads) and worked through in chunks (``batch_work``).

Each item goes through the same frame as the single action (``operators.services.actions``):
the author's tenants and role as they are when the item is reached, the four-eyes rule for
approvals, and the state fixed at the preview (an item that moved on since is refused, not
acted on), with the single action's audit entry. The item's outcome is written in the same
transaction as the action and its audit entry: a job killed mid-chunk loses the whole chunk,
which a later job does again, so no item is ever acted on twice, and no item is ever left
without its entry. A confirmation carries the batch's token: confirming it again returns the
same batch. A batch whose jobs died is picked up again by the sweeper (``batches_resume_stale``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from console import topics
from console.broadcast import broadcast
from console.models import BulkBatch, BulkItem, BulkOutcome, BulkState
from console.selectors.bulk import ACTIONS, BulkAction, matching
from core.storage import is_database_error, is_storage_error
from ledger.services import RESOLUTION_OUTCOMES
from operators import roles
from operators.models import AuditEntry, AuditOutcome, DualControlRequest, DualState
from operators.selectors.tenancy import object_tenant
from operators.services.actions import Actor, Denied, Incomplete, Refused, audit_denied, second_person_request
from operators.services.dual_rules import (
    Asked,
    ConfirmationNeeded,
    bulk_min_items,
    confirming,
    covered,
    is_confirming,
    register_act,
)
from operators.services.limits import clip_text
from operators.services.queues import UNSAFE_OUTCOMES, approval_act, effect_manual_resolve
from operators.services.runs import run_cancel_act, run_move_act, run_redrive_act, run_retry_act
from operators.services.tenancy import OUTSIDE_TENANTS, NotFound
from sagas.events import swept
from sagas.integration import compensation_queue_name, get_queue, shutdown_requested

log = logging.getLogger("console.bulk")

CHUNK = 50  # items per transaction: the unit of progress, and what a kill can lose (and redo)
# Jobs queued per batch: two workers share a batch (items are claimed with SKIP LOCKED), about
# 1.6 times one's pace on the 2-core bench machine (bench/README.md); more only contend.
JOBS_PER_BATCH = 2
JOB = "console.jobs.bulk_batch_work"
MAX_ITEMS = 100_000
REASON_CHARS = 4000


def _lease() -> timedelta:
    """How long a batch may go without a chunk before the sweeper gives it to another job."""
    return timedelta(seconds=max(2 * settings.SAGAS_LEASE_TTL, 5.0))


def _batch_audit(actor: Actor, action: str, *, object_id: Any, outcome: str, reason: str = "", after: Any = None,
                 message: str = "", tenant: str = "") -> None:
    AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label, action=f"bulk.{action}", object_type="bulk_batch",
        object_id=str(object_id or ""), reason=clip_text(reason), ip=actor.ip, outcome=outcome, after=after,
        message=clip_text(message), tenant=tenant,
    )


def _check_role(actor: Actor, action: BulkAction, *, batch_id: Any = "", reason: str = "") -> None:
    """The author's role allows the single action (``Denied``, audited for the batch, if not)."""
    if not roles.can(actor.user, action.item_action):
        needed = roles.ACTION_ROLES[action.item_action]
        _batch_audit(actor, action.name, object_id=batch_id, outcome=AuditOutcome.DENIED, reason=reason,
                     message=f"role {needed} required")
        raise Denied(f"{actor.label} may not {action.label.lower()} in bulk: it needs the {needed} role")


def action_of(name: str) -> BulkAction:
    try:
        return ACTIONS[name]
    except KeyError:
        raise Incomplete(f"{name[:40]!r} is not a bulk action; choose one of {', '.join(ACTIONS)}") from None


def batch_denied(actor: Actor, *, action: str, reason: str = "") -> None:
    """Audit a bulk attempt by someone with no console role (the view then answers 403)."""
    _batch_audit(actor, action[:40] if action in ACTIONS else "unknown", object_id="", outcome=AuditOutcome.DENIED,
                 reason=reason, message="no console role")


def batch_preview(actor: Actor, *, action: str, ids: Iterable[str] | None, filters: Mapping[str, str]) -> BulkBatch:
    """A draft batch of the objects ``action`` would act on (``selectors.bulk.matching``), each
    with the state it is in now. ``Denied`` (audited) if the author's role does not allow the
    action; ``selectors.bulk.BadSelection`` for unreadable ids or filters."""
    bulk = action_of(action)
    _check_role(actor, bulk)
    # One row past the cap tells "too many" without reading a million rows into the web process.
    rows = matching(bulk, user=actor.user, ids=list(ids) if ids is not None else None, filters=filters,
                    limit=MAX_ITEMS + 1)
    if len(rows) > MAX_ITEMS:
        raise Incomplete(f"More than {MAX_ITEMS:,} objects match; a batch takes at most {MAX_ITEMS:,}. "
                         "Narrow the filters.")
    selection: dict[str, Any] = {"ids": len(rows)} if ids is not None else {"filter": dict(filters)}
    tenants = {tenant for _, _, tenant in rows}
    with transaction.atomic():
        batch = BulkBatch.objects.create(
            token=uuid.uuid4(), user=actor.user, user_label=actor.label, ip=actor.ip, action=bulk.name,
            selection=selection, total=len(rows), tenant=tenants.pop() if len(tenants) == 1 else "",
        )
        BulkItem.objects.bulk_create(
            (BulkItem(batch=batch, object_type=bulk.object_type, object_id=pk, expected=state)
             for pk, state, _ in rows),
            batch_size=2000,
        )
    return batch


VERSIONED = frozenset({"run.move", "run.redrive"})  # the batch carries a target version


def _confirm_problem(bulk: BulkAction, batch: BulkBatch, *, reason: str, confirmed: bool, outcome: str,
                     evidence: str, version: int | None = None) -> str:
    if not confirmed:
        return "Tick the confirmation: nothing was queued."
    if not reason.strip():
        return "A reason is required; it goes into the audit entry of every item. Nothing was queued."
    if len(reason) > REASON_CHARS or "\x00" in reason:
        return f"The reason must be at most {REASON_CHARS} characters, without NUL. Nothing was queued."
    if bulk.object_type == "effect":
        if outcome not in RESOLUTION_OUTCOMES:
            return f"Choose what happened: one of {', '.join(RESOLUTION_OUTCOMES)}. Nothing was queued."
        if outcome == "succeeded" and not evidence.strip():
            return "A succeeded resolution needs the downstream reference as evidence. Nothing was queued."
        if len(evidence) > 300 or "\x00" in evidence or "\n" in evidence:
            return "The downstream reference must be one line of at most 300 characters. Nothing was queued."
    if bulk.name == "run.move" and version is None:
        return "Choose the version to move the runs to. Nothing was queued."
    if batch.total == 0:
        return "Nothing to do: no item is left in this batch."
    return ""


@register_act
def batch_confirm(actor: Actor, *, token: Any, reason: str, confirmed: bool, outcome: str = "",
                  evidence: str = "", version: int | None = None) -> BulkBatch:
    """Queue a draft batch of ``actor``'s with ``reason`` (and, to resolve effects, the
    ``outcome`` and the downstream reference ``evidence`` for every item): one audit entry for
    the batch, then jobs after commit. Confirming a batch that is already confirmed returns it
    unchanged (a double submit, a reload). ``Incomplete`` when something is missing (nothing is
    queued), ``Denied`` (audited) when the role no longer allows it."""
    with transaction.atomic():
        batch = BulkBatch.objects.select_for_update().get(token=token)
        if batch.state != BulkState.DRAFT:
            return batch
        if batch.user_id != actor.user.pk and not is_confirming():  # a draft is its author's only (or a
            raise NotFound("no such batch")  # second person's, confirming the author's request)
        bulk = ACTIONS[batch.action]
        problem = _confirm_problem(bulk, batch, reason=reason, confirmed=confirmed, outcome=outcome,
                                   evidence=evidence, version=version)
        if problem:
            raise Incomplete(problem)
    _check_role(actor, bulk, batch_id=batch.id, reason=reason)
    with transaction.atomic():
        batch = BulkBatch.objects.select_for_update().get(id=batch.id)
        if batch.state != BulkState.DRAFT:
            return batch
        asked = _needs_second_person(bulk, batch, token=token, reason=reason, confirmed=confirmed, outcome=outcome,
                                     evidence=evidence, version=version)
        if asked is not None:
            request = second_person_request(actor, asked, action=bulk.item_action, object_type="bulk",
                                            object_id=batch.id, tenant=batch.tenant, reason=reason,
                                            seen={"state": batch.state, "items": batch.total})
        else:
            return _queue(actor, bulk, batch, reason=reason, outcome=outcome, evidence=evidence, version=version)
    raise ConfirmationNeeded(request)


def _item_rule(bulk: BulkAction, outcome: str) -> str | None:
    """The dual-control rule that covers the batch's single action, if any."""
    if bulk.name == "run.cancel_compensate":
        return "run.compensate"
    if bulk.name in ("run.move", "run.redrive"):
        return bulk.name
    if bulk.name == "effect.resolve" and outcome in UNSAFE_OUTCOMES:
        return "effect.resolve_unsafe"
    return None


def _needs_second_person(bulk: BulkAction, batch: BulkBatch, *, token: Any, **asked: Any) -> Asked | None:
    """Dual control of a batch: a rule covers its single action (for the batch's tenant; any
    tenant a rule names for a batch of several), or the batch rule and its size. The items are
    then done without asking again (``_chunk`` runs them as confirmed)."""
    if is_confirming():
        return None
    rule = _item_rule(bulk, asked["outcome"])
    if not covered(rule, batch.tenant):
        rule = "bulk" if covered("bulk", batch.tenant) and batch.total >= bulk_min_items() else None
    if rule is None:
        return None
    return Asked(rule, batch_confirm.__name__, {"token": str(token), **asked},
                 f"{bulk.label}: {batch.total} {bulk.kind} (bulk batch {batch.id})")


def _queue(actor: Actor, bulk: BulkAction, batch: BulkBatch, *, reason: str, outcome: str, evidence: str,
           version: int | None) -> BulkBatch:
    """Queue the locked draft ``batch``: its audit entry, then its jobs after commit."""
    now = timezone.now()
    batch.state, batch.reason, batch.confirmed_at, batch.heartbeat_at = BulkState.QUEUED, reason, now, now
    batch.outcome, batch.evidence = (outcome, evidence.strip()) if bulk.object_type == "effect" else ("", "")
    batch.version = version if bulk.name in VERSIONED else None
    batch.save(update_fields=["state", "reason", "confirmed_at", "heartbeat_at", "outcome", "evidence", "version"])
    _batch_audit(actor, bulk.name, object_id=batch.id, outcome=AuditOutcome.OK, reason=reason,
                 after={"items": batch.total, "selection": batch.selection, "outcome": batch.outcome,
                        "evidence": batch.evidence, "version": batch.version},
                 tenant=batch.tenant)
    batch_id = batch.id
    for _ in range(JOBS_PER_BATCH):
        transaction.on_commit(lambda: enqueue(batch_id))
    transaction.on_commit(lambda: broadcast(topics.BULK))
    return batch


# --- the job -------------------------------------------------------------------------------


def enqueue(batch_id: int) -> bool:
    """Put a job for the batch on the queue every worker reads (``<SAGAS_QUEUE>:compensation``).
    False (logged) when Redis is away: the sweeper enqueues it later."""
    try:
        get_queue(compensation_queue_name()).enqueue(
            JOB, batch_id, job_timeout=-1, result_ttl=0, failure_ttl=24 * 3600, description=f"bulk batch {batch_id}",
        )
    except redis.RedisError as exc:
        log.warning("could not enqueue bulk batch %s (%s); the sweeper will", batch_id, exc)
        return False
    return True


def _act(batch: BulkBatch, bulk: BulkAction, actor: Actor, item: BulkItem) -> None:
    """The single action on one item, through ``actions.perform`` (its checks and audit entry)."""
    common: dict[str, Any] = {"expected": item.expected}
    if bulk.name == "run.retry":
        run_retry_act(actor, run_id=item.object_id, reason=batch.reason, **common)
    elif bulk.name in ("run.cancel", "run.cancel_compensate"):
        run_cancel_act(actor, run_id=item.object_id, reason=batch.reason,
                       compensate=bulk.name == "run.cancel_compensate", **common)
    elif bulk.name == "run.move":
        run_move_act(actor, run_id=item.object_id, version=batch.version or 0, reason=batch.reason, **common)
    elif bulk.name == "run.redrive":
        run_redrive_act(actor, run_id=item.object_id, version=batch.version, reason=batch.reason, **common)
    elif bulk.name == "effect.resolve":
        effect_manual_resolve(actor, effect_id=int(item.object_id), outcome=batch.outcome,
                              downstream_ref=batch.evidence, note=batch.reason, **common)
    else:
        approval_act(actor, approval_id=int(item.object_id), approve=bulk.name == "approval.approve",
                     comment=batch.reason, **common)


class _Unexpected(Exception):
    """An item failed in a way its action does not answer (neither refused nor denied)."""


def _item(batch: BulkBatch, bulk: BulkAction, actor: Actor, item: BulkItem, *, careful: bool,
          confirmed: bool = False) -> tuple[str, str]:
    """Act on one item; its outcome and why. A refusal or denial keeps the audit entry the
    single action wrote. Any other failure: in a first pass, ``_Unexpected`` (the chunk rolls
    back and is done again ``careful``ly); when ``careful``, the item is in a savepoint, rolled
    back alone and audited as a refusal, so one bad item cannot stop the batch. Storage errors
    are raised as they are: the chunk is done again later."""
    if not actor.user.is_active:
        audit_denied(actor, bulk.item_action, bulk.object_type, item.object_id, reason=batch.reason)
        return BulkOutcome.DENIED, "the batch's author is deactivated"
    if not confirmed and covered(_item_rule(bulk, batch.outcome), batch.tenant):
        return BulkOutcome.REFUSED, ("a dual-control rule covers this action now and the batch was not confirmed by a "
                                     "second person: ask for it again")
    savepoint = transaction.savepoint() if careful else None
    try:
        with confirming() if confirmed else nullcontext():  # a confirmed batch: its items ask no one again
            _act(batch, bulk, actor, item)
    except (Denied, NotFound, Refused, Incomplete) as exc:
        if savepoint:
            transaction.savepoint_commit(savepoint)
        if isinstance(exc, Denied):
            return BulkOutcome.DENIED, str(exc)
        if isinstance(exc, NotFound):
            return BulkOutcome.DENIED, OUTSIDE_TENANTS
        return BulkOutcome.REFUSED, str(exc)
    except Exception as exc:
        if is_storage_error(exc):
            raise
        if savepoint is None:
            raise _Unexpected(f"{item.object_type} {item.object_id}") from exc
        transaction.savepoint_rollback(savepoint)
        log.exception("bulk batch %s: %s %s failed", batch.id, item.object_type, item.object_id)
        message = f"failed: {type(exc).__name__}: {exc}"
        AuditEntry.objects.create(
            actor=actor.user, actor_label=actor.label, action=bulk.item_action, object_type=item.object_type,
            object_id=item.object_id, reason=clip_text(batch.reason), ip=actor.ip, outcome=AuditOutcome.REFUSED,
            message=clip_text(message), tenant=object_tenant(item.object_type, item.object_id) or "",
        )
        return BulkOutcome.REFUSED, message
    if savepoint:
        transaction.savepoint_commit(savepoint)
    return BulkOutcome.OK, ""


def _chunk(batch_id: int, *, careful: bool = False) -> int:
    """Act on the next ``CHUNK`` pending items no other job holds; how many. One transaction:
    the items' actions, audit entries and outcomes, and the batch's counters. (A savepoint per
    item only when an item failed unexpectedly: two round trips per item saved otherwise.)"""
    batch = BulkBatch.objects.get(id=batch_id)
    bulk = ACTIONS[batch.action]
    # Fresh each chunk: a role or tenant taken away mid-batch applies from the next chunk on.
    actor = Actor(user=get_user_model().objects.get(pk=batch.user_id), ip=batch.ip)
    # Dual control: a batch a second person confirmed does its items as confirmed (no request per
    # item). One that was not, whose single action a rule now covers, has those items refused.
    confirmed = DualControlRequest.objects.filter(object_type="bulk", object_id=str(batch_id),
                                                  state=DualState.CONFIRMED).exists()
    try:
        with transaction.atomic():
            items = list(BulkItem.objects.select_for_update(skip_locked=True)
                         .filter(batch_id=batch_id, outcome=BulkOutcome.PENDING).order_by("id")[:CHUNK])
            counts: Counter[str] = Counter()
            now = timezone.now()
            for item in items:
                item.outcome, message = _item(batch, bulk, actor, item, careful=careful, confirmed=confirmed)
                # Stored as the audit log stores it: a NUL in an error would fail the chunk's
                # UPDATE on every retry, and 100,000 unbounded messages would bloat the table.
                item.message = clip_text(message)
                item.acted_at = now
                counts[item.outcome] += 1
            if items:
                BulkItem.objects.bulk_update(items, ["outcome", "message", "acted_at"])
            BulkBatch.objects.filter(id=batch_id).update(
                ok=F("ok") + counts[BulkOutcome.OK], refused=F("refused") + counts[BulkOutcome.REFUSED],
                denied=F("denied") + counts[BulkOutcome.DENIED], heartbeat_at=timezone.now(),
            )
    except _Unexpected:
        return _chunk(batch_id, careful=True)
    if items:
        broadcast(topics.BULK)
    return len(items)


def _finish(batch_id: int) -> bool:
    """Mark the batch done if no item is pending any more (not merely locked by another job)."""
    with transaction.atomic():
        if BulkItem.objects.filter(batch_id=batch_id, outcome=BulkOutcome.PENDING).exists():
            return False
        changed = BulkBatch.objects.filter(id=batch_id, state=BulkState.RUNNING).update(
            state=BulkState.DONE, finished_at=timezone.now())
    if changed:
        broadcast(topics.BULK)
    return True


def batch_work(*, batch_id: int) -> str:
    """The job: work through the batch's pending items, a chunk at a time, until none is left.
    Safe to run twice at once or again after a kill (items are claimed with SKIP LOCKED and
    done once). On a worker's warm stop it hands the rest to a new job."""
    started = BulkBatch.objects.filter(id=batch_id, state__in=[BulkState.QUEUED, BulkState.RUNNING]).update(
        state=BulkState.RUNNING, heartbeat_at=timezone.now())
    if not started:
        return "nothing to do"
    BulkBatch.objects.filter(id=batch_id, started_at__isnull=True).update(started_at=timezone.now())
    broadcast(topics.BULK)
    retries = 0
    while True:
        if shutdown_requested.is_set():
            enqueue(batch_id)
            return "handed back"
        try:
            if _chunk(batch_id) == 0:
                break
            retries = 0
        except Exception as exc:  # a deadlock with a worker, a dropped connection: the chunk rolled back
            retries += 1
            if not is_database_error(exc) or retries > 3:
                raise  # the job fails; the sweeper gives the batch to a new job after its lease
            log.warning("bulk batch %s: chunk rolled back (%s); again", batch_id, exc)
            connection.close()
            time.sleep(0.5 * retries)
    return "done" if _finish(batch_id) else "left to the job holding the last items"


def connect_signals() -> None:
    """After each sweep, give stopped batches to a new job (called by the app's ``ready``)."""
    swept.connect(batches_resume_stale, dispatch_uid="console.bulk.resume")


def batches_resume_stale(**_: Any) -> int:
    """Enqueue a job for each confirmed batch that has had no chunk for longer than its lease
    (its job died with its worker, or Redis lost it). Called after each sweep."""
    stopped = BulkBatch.objects.filter(Q(heartbeat_at__lt=timezone.now() - _lease()) | Q(heartbeat_at__isnull=True),
                                       state__in=[BulkState.QUEUED, BulkState.RUNNING])
    resumed = 0
    for batch_id in list(stopped.values_list("id", flat=True)[:100]):
        # One sweeper at a time wins each batch: the heartbeat moves, so the next pass waits a lease again.
        if stopped.filter(id=batch_id).update(heartbeat_at=timezone.now()) and enqueue(batch_id):
            resumed += 1
    if resumed:
        log.info("resumed %d bulk batch(es) whose job stopped", resumed)
    return resumed
