"""Advancing a run: claim, replay, continue, record the outcome.

``advance(run_id)`` is what a worker's job calls. It claims the run with one
conditional UPDATE (a worker that loses the race returns quietly), checks the
definition hash, loads the journal in one query, runs the workflow function from
the top with a replaying ``Context``, and records how it ended, all under the
claim's fence. A heartbeat thread (``sagas.runtime.heartbeat``) extends the lease while the
function runs; ``sagas.runtime.identity`` names the worker in leases and the journal.

What is guaranteed: a journaled step is never executed again by any worker; a
worker that lost its lease records nothing more. What is not: a step whose
function ran but whose result was not journaled before a crash runs again
(at-least-once for steps; effects go through the ledger for more).
"""

from __future__ import annotations

import enum
import logging
import time
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError

from core.storage import is_storage_error, note_failure, note_success, wait_for_database
from sagas import events, gaps, services, tracing
from sagas.compensation import compensate_claimed, needs_compensation, plan_for_failure, undo_before_fork
from sagas.errors import (
    ApprovalRejected,
    ContinueAsNew,
    JournalGap,
    LeaseLost,
    NotSerializable,
    RunHalted,
    StepFailed,
    StorageUnavailable,
    Suspend,
    VersionMismatch,
    Yield,
)
from sagas.models import TERMINAL_STATUSES, JournalKind, RunStatus
from sagas.replay import continuation
from sagas.replay.context import Context
from sagas.replay.cursor import YIELD_PAUSED, YIELD_SHUTDOWN
from sagas.runtime import queue
from sagas.runtime.crashpoints import crash_point
from sagas.runtime.heartbeat import Heartbeat
from sagas.runtime.identity import worker_id
from sagas.store import systemdb
from sagas.store.systemdb import ClaimedRun, dumps
from sagas.versions import registry

log = logging.getLogger("sagas.replay.engine")
K = JournalKind


class Outcome(str, enum.Enum):
    NOT_CLAIMED = "not_claimed"
    COMPLETED = "completed"
    FAILED = "failed"
    NEEDS_ATTENTION = "needs_attention"
    YIELDED = "yielded"
    LEASE_LOST = "lease_lost"
    WAITING = "waiting"
    COMPENSATED = "compensated"
    # Compensating, handed back until something it waits for (a child being undone, flow control) moves.
    COMPENSATION_WAITS = "compensation_waits"
    STORAGE_UNAVAILABLE = "storage_unavailable"


def advance(run_id: str, *, owner: str | None = None) -> Outcome:
    """Claim the run and take it as far as it goes under this worker.

    Raises ``StorageUnavailable`` only when the claim itself could not reach the
    database (nothing was done; the caller waits and tries again). A storage failure
    after the claim is handled here: ``Outcome.STORAGE_UNAVAILABLE``, the run handed
    back or left to its lease, never FAILED.
    """
    owner = owner or worker_id()
    ttl = settings.SAGAS_LEASE_TTL
    claimed_at = time.monotonic()
    try:
        run = systemdb.claim(str(run_id), owner=owner, ttl=ttl)
    except Exception as exc:
        if not is_storage_error(exc):
            raise
        note_failure(exc, doing="claiming runs")
        raise StorageUnavailable(f"could not claim run {run_id}: {type(exc).__name__}: {exc}") from exc
    note_success()
    if run is None:
        log.debug("run %s: not claimable, skipping", run_id)
        return Outcome.NOT_CLAIMED
    log.info("run %s: claimed by %s (attempt %d, fence %d)", run.id, owner, run.attempts, run.fence)
    # The heartbeat announces the claim (run_changed) if the run is still under way a moment later.
    # The attempt's span (sagas.tracing) is the parent of the steps and effects it executes.
    with tracing.attempt_span(run, owner) as attempt, \
            Heartbeat(run.id, run.fence, ttl, status=run.status, claimed_at=claimed_at) as beat:
        try:
            outcome = _execute(run, owner, beat)
        except StorageUnavailable as exc:
            outcome = _storage_lost(run, owner, beat, exc)
        except Exception as exc:  # engine code outside the workflow (load, finish, compensate)
            if not is_storage_error(exc):
                raise
            note_failure(exc, doing=f"advancing run {run.id}")
            outcome = _storage_lost(run, owner, beat, exc)
        attempt.outcome(outcome.value)
    if outcome in _STATUS_AFTER:  # committed by _execute; LEASE_LOST: whoever took the run reports
        after = _STATUS_AFTER[outcome]
        if outcome == Outcome.YIELDED and run.status == RunStatus.COMPENSATING:
            after = RunStatus.COMPENSATING  # handed back, still compensating
        events.send_run_changed(run.id, after, cause=outcome.value)
        if after in TERMINAL_STATUSES:
            crash_point("before_tree_report", run.workflow_name)
            _tree_after_end(run.id)
    return outcome


def _tree_after_end(run_id: str) -> None:
    """Tell the run's parent it ended and close its attached children (``sagas.children``).
    Our storage failing here loses nothing: the sweeper's ``children_catch_up`` does it later."""
    try:
        services.tree_after_end(run_id)
    except Exception as exc:
        if not is_storage_error(exc):
            raise
        note_failure(exc, doing=f"reporting the end of run {run_id} to its tree")


_STATUS_AFTER = {
    Outcome.COMPLETED: RunStatus.COMPLETED,
    Outcome.FAILED: RunStatus.FAILED,
    Outcome.NEEDS_ATTENTION: RunStatus.NEEDS_ATTENTION,
    Outcome.YIELDED: RunStatus.PENDING,
    Outcome.WAITING: RunStatus.WAITING,
    Outcome.COMPENSATED: RunStatus.COMPENSATED,
    Outcome.COMPENSATION_WAITS: RunStatus.COMPENSATING,
}


def _execute(run: ClaimedRun, owner: str, beat: Heartbeat | None = None) -> Outcome:
    try:
        if run.status == RunStatus.COMPENSATING:
            ctx = Context(run=run, journal=[], worker_id=owner)
            try:
                return _compensate(run, owner, beat.watch(ctx) if beat else ctx)
            except Suspend as wait:  # flow control holds a compensating call: hand the run back
                log.info("run %s: compensation held (%s)", run.id, wait.reason)
                return _yield(run, owner, wait.reason, wake=False)
        definition = _definition_for(run)
        known = systemdb.initial_journal(run)  # a first claim knows its journal: no query
        while True:
            journal = known if known is not None else systemdb.load_journal(run.id)
            known = None  # a replay after this one reads what arrived meanwhile
            ctx = Context(
                run=run, journal=journal, worker_id=owner, approve_irreversible=definition.approve_irreversible
            )
            if beat is not None:
                beat.watch(ctx)
            try:
                if ctx.undo_pending:  # a re-run with "compensate first": undo before going on
                    undo_before_fork(ctx)
                value = definition.fn(ctx, run.input)
                ctx.check_finished()
                try:
                    dumps(value)
                except (TypeError, ValueError) as exc:
                    raise NotSerializable(f"the workflow returned a value that is not JSON: {exc}") from exc
            except Suspend as wait:
                if _suspend(run, owner, ctx, wait):
                    return Outcome.WAITING
                continue  # a decision or signal arrived while we ran: replay with it
            except ContinueAsNew as cont:
                crash_point("before_continue_as_new", run.workflow_name)
                if continuation.continue_claimed(run, owner=owner, expect_last_seq=ctx.last_seq, state=cont.state):
                    return Outcome.COMPLETED  # this run is done; its successor is woken
                continue  # a signal or decision arrived while we ran: replay with it
            except JournalGap as gap:
                # Never replayed: the journal it would replay from is the one that lost entries.
                gap.details["effects"] = gaps.record_gap(ctx, gap)
                return _halt(run, owner, gap) or Outcome.NEEDS_ATTENTION
            except RunHalted as halt:
                outcome = _halt(run, owner, halt, expect_last_seq=ctx.last_seq)
                if outcome is not None:
                    return outcome
                continue  # a decision or resolution arrived while we ran: replay with it
            except LeaseLost:
                if systemdb.fence_behind(run.id, fence=run.fence):
                    return _claim_went_back(run, owner, ctx)
                raise
            except Yield:
                raise
            except (OperationalError, InterfaceError) as exc:
                # The workflow's own query on our database failed because the database
                # went away: the infrastructure's failure, not the workflow's.
                raise StorageUnavailable(f"{type(exc).__name__}: {exc}") from exc
            except Exception as exc:
                return _fail(run, owner, ctx, definition, exc)
            break
        crash_point("before_complete", run.workflow_name)
        systemdb.finish(
            run.id,
            fence=run.fence,
            status=RunStatus.COMPLETED,
            kind=K.COMPLETED,
            worker=owner,
            payload={"result": value},
            result=value,
            terminal=True,
        )
        log.info("run %s: completed", run.id)
        return Outcome.COMPLETED
    except RunHalted as halt:
        return _halt(run, owner, halt) or Outcome.NEEDS_ATTENTION
    except Yield as stop:
        return _yield(run, owner, str(stop))
    except LeaseLost as lost:
        log.warning("run %s: lease lost, stopping without recording: %s", run.id, lost)
        return Outcome.LEASE_LOST


def _claim_went_back(run: ClaimedRun, owner: str, ctx: Context) -> Outcome:
    """The run's fence is below our claim's: the database we reach now lost the claim and what
    followed it (a failover with asynchronous replication; ``sagas.gaps``). The run stops for a
    person, fenced past our claim, with every effect it may hide UNKNOWN."""
    gap = JournalGap(
        f"the journal went back in time: this worker's claim (fence {run.fence}) and its entries up to "
        f"{ctx.last_seq}, acknowledged by the database, are missing from the database it reaches now (a failover "
        f"to a standby that had not received them); every effect in the gap is UNKNOWN until a person settles it",
        lost_from=min((seq for seq, _k, _n in ctx.written), default=run.last_seq), lost_to=ctx.last_seq,
        lost=[{"seq": seq, "kind": kind, "name": name} for seq, kind, name in ctx.written], worker=owner,
        claim_lost=True,
    )
    gap.details["effects"] = gaps.record_gap(ctx, gap)
    if systemdb.halt_behind(run.id, fence=run.fence, worker=owner, reason=gap.reason, payload=gap.as_dict()) is None:
        log.warning("run %s: lease lost, stopping without recording (the claim went back, then moved on)", run.id)
        return Outcome.LEASE_LOST
    log.warning("run %s: needs attention (%s): %s", run.id, gap.reason, gap.message)
    return Outcome.NEEDS_ATTENTION


# How many times a join re-checks what arrived while it was suspending, before it replays instead.
SUSPEND_RECHECKS = 100


def _suspend(run: ClaimedRun, owner: str, ctx: Context, wait: Suspend) -> bool:
    """WAITING with ``wake_at``, unless something was journaled since ``ctx`` loaded (False: the
    caller replays with it).

    A join of child runs (``wait.awaiting``) is not replayed for the end of a child that does not
    end the wait: while a fan-out's children end every few milliseconds, replaying its long
    journal at each would keep the parent on a worker the whole time. What arrived is read
    instead (one small query), and the suspension tried again past it, unless it is anything
    else (a signal, a decision), a child that did not complete, or the last awaited child."""
    expect, remaining = ctx.last_seq, set(wait.awaiting)
    payload: dict[str, Any] = {"reason": wait.reason, "wake_at": wait.wake_at.isoformat() if wait.wake_at else None}
    if wait.awaiting:
        payload["awaiting"] = len(wait.awaiting)
    for _ in range(SUSPEND_RECHECKS):
        if systemdb.suspend(run.id, fence=run.fence, worker=owner, expect_last_seq=expect, wake_at=wait.wake_at,
                            payload=payload, reason=wait.status_reason):
            log.info("run %s: waiting (%s)", run.id, wait.reason)
            return True
        if not remaining:
            return False
        arrived = systemdb.entries_after(run.id, after_seq=expect)
        if not arrived:
            return False
        for _seq, kind, name, status in arrived:
            if kind != K.CHILD_FINISHED or (name in remaining and status != RunStatus.COMPLETED):
                return False
            remaining.discard(name)
        if not remaining:
            return False
        expect = arrived[-1][0]
    return False


def _compensate(run: ClaimedRun, owner: str, ctx: Context) -> Outcome:
    """Run the compensation plan under this claim; COMPENSATED when every item is done."""
    compensate_claimed(ctx)
    systemdb.finish(
        run.id,
        fence=run.fence,
        status=RunStatus.COMPENSATED,
        kind=K.COMPENSATION_FINISHED,
        worker=owner,
        payload={"state": "COMPLETED"},
        terminal=True,
    )
    log.info("run %s: compensated", run.id)
    return Outcome.COMPENSATED


def _definition_for(run: ClaimedRun) -> registry.WorkflowDefinition:
    definition = registry.find(run.workflow_name, run.version)
    if definition is None:
        raise VersionMismatch(
            f"{run.workflow_name} version {run.version} is not registered on worker {worker_id()}",
            run_hash=run.definition_hash,
            worker_hash=None,
            worker=worker_id(),
        )
    if run.definition_hash not in definition.accepted_hashes:
        raise VersionMismatch(
            f"{run.workflow_name} version {run.version} changed since this run started: "
            f"run has {run.definition_hash[:12]}, worker {worker_id()} has {definition.definition_hash[:12]}",
            run_hash=run.definition_hash,
            worker_hash=definition.definition_hash,
            worker=worker_id(),
        )
    return definition


def _halt(run: ClaimedRun, owner: str, halt: RunHalted, *, expect_last_seq: int | None = None) -> Outcome | None:
    """Park the run for a person (NEEDS_ATTENTION). With ``expect_last_seq``, None when
    something was journaled since (an approval decided just after it escalated, an
    effect resolved just after it went UNKNOWN): parking on that stale view would leave
    the run waiting for a person who has already acted."""
    details = halt.as_dict()
    try:
        seq = systemdb.finish(
            run.id,
            fence=run.fence,
            status=RunStatus.NEEDS_ATTENTION,
            kind=K.HALTED,
            worker=owner,
            payload=details,
            reason=halt.reason,
            error=details,
            expect_last_seq=expect_last_seq,
        )
    except LeaseLost:
        return Outcome.LEASE_LOST
    if seq is None:
        log.info("run %s: %s, but something arrived meanwhile; replaying", run.id, halt.reason)
        return None
    log.warning("run %s: needs attention (%s): %s", run.id, halt.reason, halt.message)
    return Outcome.NEEDS_ATTENTION


def _fail(
    run: ClaimedRun, owner: str, ctx: Context, definition: registry.WorkflowDefinition, exc: Exception
) -> Outcome:
    """The workflow raised. With effects to undo and on_failure="compensate", compensate now
    (under this claim); otherwise the run is FAILED."""
    if isinstance(exc, StepFailed):
        reason = "step_failed"
    elif isinstance(exc, ApprovalRejected):
        reason = "approval_rejected"
    else:
        reason = "workflow_error"
    error = {"code": reason, "type": type(exc).__name__, "message": str(exc)[:4000]}
    if isinstance(exc, StepFailed):
        error["step"] = exc.step
    try:
        if definition.on_failure == "compensate" and needs_compensation(run.id):
            ctx.append(K.FAILED, "", dumps(error))
            trigger = "rejection" if isinstance(exc, ApprovalRejected) else "automatic"
            plan_for_failure(ctx, reason=error["message"], trigger=trigger)
            log.warning("run %s: failed (%s); compensating", run.id, error["message"])
            try:
                return _compensate(run, owner, ctx)
            except Suspend as wait:  # held by flow control, or waiting for a child to be undone
                log.info("run %s: compensation waits (%s)", run.id, wait.reason)
                systemdb.finish(run.id, fence=run.fence, status=RunStatus.COMPENSATING, kind=K.YIELDED,
                                worker=owner, payload={"reason": wait.reason})
                return Outcome.COMPENSATION_WAITS
        systemdb.finish(
            run.id,
            fence=run.fence,
            status=RunStatus.FAILED,
            kind=K.FAILED,
            worker=owner,
            payload=error,
            reason=reason,
            error=error,
            terminal=True,
        )
    except LeaseLost:
        return Outcome.LEASE_LOST
    log.warning("run %s: failed: %s", run.id, error["message"])
    return Outcome.FAILED


def _storage_lost(run: ClaimedRun, owner: str, beat: Heartbeat, exc: BaseException) -> Outcome:
    """Our storage failed under the run: not the workflow's failure, so nothing about the
    run is decided. Wait (not past the lease and one more TTL) for PostgreSQL, then hand
    the run back (PENDING or COMPENSATING, journaled as ``yielded``) and wake a worker
    for it, so it resumes at once rather than after its lease. If the database does not
    answer in time, or another worker has taken over, the lease and the sweeper do it.
    """
    log.warning("run %s: storage unavailable, handing the run back: %s", run.id, exc)
    until = max(beat.lease_until, time.monotonic()) + float(settings.SAGAS_LEASE_TTL)
    if not wait_for_database(until=until, doing=f"handing back run {run.id}"):
        log.warning("run %s: the database did not answer in time; left to its lease", run.id)
        return Outcome.STORAGE_UNAVAILABLE
    try:
        status = _hand_back(run, owner, {"reason": "storage unavailable",
                                         "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
    except LeaseLost:
        return Outcome.LEASE_LOST
    except Exception as again:
        if not is_storage_error(again):
            raise
        note_failure(again, doing=f"handing back run {run.id}")
        return Outcome.STORAGE_UNAVAILABLE
    events.send_run_changed(run.id, status, cause="yielded")
    return Outcome.STORAGE_UNAVAILABLE


def _hand_back(run: ClaimedRun, owner: str, payload: dict, *, wake: bool = True) -> str:
    """Release the run as it is (PENDING, or COMPENSATING: it must not run forward), journal
    ``yielded`` and, with ``wake``, wake a worker for it. Returns the status; raises ``LeaseLost``."""
    status = RunStatus.COMPENSATING if run.status == RunStatus.COMPENSATING else RunStatus.PENDING
    systemdb.finish(run.id, fence=run.fence, status=status, kind=K.YIELDED, worker=owner, payload=payload)
    if wake:
        queue.enqueue_advance(run.id, run.definition_hash, compensating=status == RunStatus.COMPENSATING,
                              priority=run.priority)
    return status


def _yield(run: ClaimedRun, owner: str, reason: str = YIELD_SHUTDOWN, *, wake: bool | None = None) -> Outcome:
    """Hand the run back at a step boundary: the worker is shutting down (another worker goes
    on with it), or an operator paused it (nobody does until it is resumed, which wakes it), or
    flow control holds a compensating call (``wake=False``: the pump wakes it when the call may
    go, and the sweeper finds it meanwhile as a COMPENSATING run nobody holds)."""
    paused = reason == YIELD_PAUSED
    try:
        _hand_back(run, owner, {"reason": reason}, wake=not paused if wake is None else wake)
    except LeaseLost:
        return Outcome.LEASE_LOST
    log.info("run %s: handed back (%s)", run.id, reason)
    return Outcome.YIELDED
