"""Journaled waits: approvals, timers and signals.

A waiting run holds no worker: ``Suspend`` unwinds the workflow and the engine
marks the run WAITING with ``wake_at``. What wakes it: a decision, a signal
(services below), or the sweeper when ``wake_at`` is due. Every decision that
changes the workflow's path (approved, rejected, expired, timed out) is
journaled before the workflow acts on it, so replay takes the same path.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sagas.errors import (
    AlreadyDecided,
    ApprovalEscalated,
    ApprovalRejected,
    FourEyesViolation,
    RunFinished,
    Suspend,
    WaitTimedOut,
)
from sagas.events import send_run_changed
from sagas.models import (
    OPEN_APPROVAL_STATES,
    TERMINAL_STATUSES,
    ApprovalRequest,
    ApprovalState,
    JournalKind,
    RunStatus,
    WorkflowRun,
    check_approval_transition,
    check_transition,
    paused_runs,
)
from sagas.replay.cursor import JournalCursor
from sagas.runtime import queue
from sagas.store import systemdb
from sagas.store.locks import approval_lock, run_lock
from sagas.store.systemdb import dumps
from sagas.validation import FREE_TEXT_CHARS, SIGNAL_NAME_CHARS, checked_json, checked_text

log = logging.getLogger("sagas.waits")
K = JournalKind
ON_TIMEOUT = ("escalate", "reject")


# --- inside a workflow ---------------------------------------------------------


def approval(ctx: JournalCursor, name: str, reason: str, timeout: timedelta, on_timeout: str = "escalate") -> dict:
    """Wait for a person to approve. Returns ``{"approved": True, "by": ..., "comment": ...}``;
    raises ``ApprovalRejected`` on rejection (or expiry with on_timeout="reject")."""
    if on_timeout not in ON_TIMEOUT:
        raise ValueError(f"on_timeout must be one of {ON_TIMEOUT}, not {on_timeout!r}")
    name = ctx.unique_name(name, space="approval")
    entry = ctx.replay_next(K.APPROVAL_REQUESTED, name)
    if entry is None:
        ctx.before_live()
        now = timezone.now()
        deadline = now + timeout
        with transaction.atomic():
            ctx.append(
                K.APPROVAL_REQUESTED, name,
                dumps({"reason": reason, "deadline": deadline.isoformat(), "on_timeout": on_timeout}),
            )
            ApprovalRequest.objects.create(
                run_id=ctx.run_id, step=name, reason=reason, on_timeout=on_timeout, requested_at=now,
                deadline=deadline,
            )
        raise Suspend(f"waiting for approval {name!r}", wake_at=deadline)
    decided = ctx.recorded_event(K.APPROVAL_DECIDED, name)
    payload = decided.payload if decided is not None else _decision_or_expiry(ctx, name, entry.payload)
    if payload.get("approved"):
        return {"approved": True, "by": payload.get("by"), "comment": payload.get("comment", "")}
    if payload.get("expired") and payload.get("on_timeout") == "escalate":
        raise ApprovalEscalated(
            f"approval {name!r} passed its deadline without a decision and was escalated",
            approval=name, deadline=entry.payload["deadline"],
        )
    by = "its deadline" if payload.get("expired") else payload.get("by")
    raise ApprovalRejected(f"approval {name!r} was rejected by {by}: {payload.get('comment', '')}".rstrip(": "))


def _decision_or_expiry(ctx: JournalCursor, name: str, requested: dict[str, Any]) -> dict[str, Any]:
    """No decision in the loaded journal: look at the approval now; expire it if due.

    Holds the run's row (fenced, FOR SHARE) before the approval's, in ``sagas.store.locks``'
    order, so an approver deciding at this moment (run, then approval) queues behind this
    worker instead of deadlocking with it. Runs only when a replay reaches an undecided
    approval, never per step.
    """
    expired = ctx.recorded_event(K.APPROVAL_EXPIRED, name)
    deadline = datetime.fromisoformat(requested["deadline"])
    with transaction.atomic():
        ctx.check_fence()
        request = ApprovalRequest.objects.select_for_update().get(run_id=UUID(ctx.run_id), step=name)
        if request.state in (ApprovalState.APPROVED, ApprovalState.REJECTED):
            # Decided after this worker loaded the journal; the decision is journaled too.
            return {"approved": request.state == ApprovalState.APPROVED, "by": request.decided_by_label,
                    "comment": request.comment}
        if expired is not None:
            return expired.payload
        if timezone.now() < deadline:
            raise Suspend(f"waiting for approval {name!r}", wake_at=deadline)
        new_state = ApprovalState.ESCALATED if request.on_timeout == "escalate" else ApprovalState.EXPIRED
        check_approval_transition(request.state, new_state)
        request.state = new_state
        request.save(update_fields=["state"])
        payload = {"approved": False, "expired": True, "on_timeout": request.on_timeout}
        ctx.append(K.APPROVAL_EXPIRED, name, dumps(payload))
    return payload


def sleep(ctx: JournalCursor, duration: timedelta) -> None:
    """Suspend until ``duration`` has passed (measured from the first execution)."""
    name = ctx.unique_name("sleep", space="timer")
    entry = ctx.replay_next(K.TIMER_SET, name)
    if entry is None:
        ctx.before_live()
        wake_at = timezone.now() + duration
        ctx.append(K.TIMER_SET, name, dumps({"wake_at": wake_at.isoformat(), "seconds": duration.total_seconds()}))
    else:
        wake_at = datetime.fromisoformat(entry.payload["wake_at"])
    if timezone.now() < wake_at:
        raise Suspend(f"sleeping until {wake_at:%Y-%m-%d %H:%M:%S} UTC", wake_at=wake_at)


def wait_for(ctx: JournalCursor, signal_name: str, timeout: timedelta) -> Any:
    """Wait for the next ``signal_name`` signal and return its payload; raises
    ``WaitTimedOut`` at the timeout. Signals sent before the wait are kept: the
    n-th wait for a name receives the n-th signal of that name."""
    name = ctx.unique_name(f"signal:{signal_name}", space="signal")
    index = int(name.rsplit("#", 1)[1]) if "#" in name else 1
    entry = ctx.replay_next(K.SIGNAL_WAIT, name)
    if entry is None:
        ctx.before_live()
        deadline = timezone.now() + timeout
        ctx.append(K.SIGNAL_WAIT, name, dumps({"signal": signal_name, "deadline": deadline.isoformat()}))
    else:
        deadline = datetime.fromisoformat(entry.payload["deadline"])
    if ctx.recorded_event(K.SIGNAL_TIMEOUT, name) is not None:
        raise WaitTimedOut(f"no {signal_name!r} signal before the timeout")
    received = ctx.signals_received(signal_name)
    if len(received) >= index:
        return received[index - 1].payload.get("payload")
    if timezone.now() < deadline:
        raise Suspend(f"waiting for signal {signal_name!r}", wake_at=deadline)
    ctx.append(K.SIGNAL_TIMEOUT, name, dumps({"signal": signal_name, "timed_out": True}))
    raise WaitTimedOut(f"no {signal_name!r} signal before the timeout")


# --- services (outside a run) -------------------------------------------------------


def wake_locked(
    run: WorkflowRun, *, kind: str, name: str, payload: dict, actor: str, priority: int | None = None
) -> None:
    """Journal an event on a locked run and, if it waits, make it PENDING and enqueue it (at
    ``priority``, else the run's own)."""
    systemdb.append_event(str(run.id), kind=kind, name=name, payload=dumps(payload), worker=actor)
    resumable = run.status == RunStatus.WAITING or (
        run.status == RunStatus.NEEDS_ATTENTION and run.status_reason == "approval_escalated"
    )
    if resumable:
        check_transition(run.status, RunStatus.PENDING)
        WorkflowRun.objects.filter(id=run.id).update(
            status=RunStatus.PENDING, status_reason="", error=None, wake_at=None, updated_at=timezone.now()
        )
        queue.enqueue_after_commit(run.id, run.definition_hash, priority=priority or run.priority)
    send_run_changed(run.id, RunStatus.PENDING if resumable else run.status, cause=kind)


def approval_decide(
    *, approval_id: int, user: User, approve: bool, comment: str = "",
) -> ApprovalRequest:
    """Approve or reject. Four-eyes: the run's starter cannot decide. A second decision is
    refused and says who decided and when. The decision is journaled and wakes the run.

    Locks the run, then the approval (``sagas.store.locks``' order, the same as cancelling or
    compensating the run, which expire its approvals)."""
    checked_text(comment, what="the comment", max_length=FREE_TEXT_CHARS)
    with transaction.atomic():
        run, request = approval_lock(approval_id=approval_id)
        if request.state not in OPEN_APPROVAL_STATES:
            who = request.decided_by_label or "its deadline"
            when = f" at {request.decided_at:%Y-%m-%d %H:%M:%S} UTC" if request.decided_at else ""
            raise AlreadyDecided(f"already {request.state.lower()} by {who}{when}")
        if run.status in TERMINAL_STATUSES:
            raise RunFinished(f"run {run.id} is {run.status}; its approvals can no longer be decided")
        if run.started_by_id is not None and run.started_by_id == user.pk:
            raise FourEyesViolation(f"{user.get_username()} started this run and cannot approve its steps")
        new_state = ApprovalState.APPROVED if approve else ApprovalState.REJECTED
        check_approval_transition(request.state, new_state)
        request.state = new_state
        request.decided_by = user
        request.decided_by_label = user.get_username()
        request.decided_at = timezone.now()
        request.comment = comment
        request.save(update_fields=["state", "decided_by", "decided_by_label", "decided_at", "comment"])
        wake_locked(
            run, kind=K.APPROVAL_DECIDED, name=request.step, actor=user.get_username(),
            payload={"approved": approve, "by": user.get_username(), "comment": comment},
        )
    return request


# How far a signal follows a chain of ``ctx.continue_as_new`` runs before giving up.
CHAIN_HOPS = 10_000


def signal_send(*, run_id: str, name: str, payload: Any = None, actor: str = "api") -> str:
    """Deliver signal ``name`` to a run; it is kept until a ``ctx.wait_for(name)`` takes it.
    ``InvalidArgument`` or ``NotSerializable`` (``sagas.validation``) before anything is written.

    A run that continued as new (``ctx.continue_as_new``) passes the signal on to the run that
    continues it, down the chain to the one still going: a sender that knows a loop by its first
    run (or its business key) keeps reaching it. Returns the id of the run that got it."""
    checked_text(name, what="the signal name", max_length=SIGNAL_NAME_CHARS, required=True, one_line=True)
    payload = checked_json(payload, what="the signal's payload")
    with transaction.atomic():
        return signal_send_locked(run_id=run_id, name=name, payload=payload, actor=actor)


def signal_send_locked(*, run_id: str, name: str, payload: Any, actor: str) -> str:
    """``signal_send``'s writes, inside the caller's transaction (arguments already checked):
    a parent signalling its child journals both in one commit (``sagas.children``)."""
    run = run_lock(run_id=run_id)
    for _hop in range(CHAIN_HOPS):
        if run.status not in TERMINAL_STATUSES or run.continued_to is None:
            break
        run = run_lock(run_id=str(run.continued_to))  # locked oldest first, as continuation does
    if run.status in TERMINAL_STATUSES:
        raise RunFinished(f"run {run.id} is {run.status}; it takes no more signals")
    wake_locked(run, kind=K.SIGNAL_RECEIVED, name=name, payload={"payload": payload, "by": actor}, actor=actor)
    return str(run.id)


def runs_wake_due(*, limit: int = 1000) -> int:
    """WAITING runs whose ``wake_at`` is due become PENDING (timer fired, deadline reached).

    One transaction per run, holding only that run's row (``sagas.store.locks``' first lock):
    an approval whose deadline passed is expired by the worker that resumes the run, so
    the sweeper never holds an approval and cannot deadlock with an operator."""
    woken = 0
    due = list(
        WorkflowRun.objects.filter(status=RunStatus.WAITING, wake_at__lte=timezone.now())
        .exclude(paused_runs())  # a paused run's timer fires when it is resumed (sagas.pausing)
        .order_by("wake_at").values_list("id", flat=True)[:limit]
    )
    for run_id in due:
        with transaction.atomic():
            if run_wake_if_due(run_lock(run_id=run_id), actor="sweeper"):
                woken += 1
    return woken


def run_wake_if_due(run: WorkflowRun, *, actor: str) -> bool:
    """A WAITING run (locked by the caller) whose timer or deadline is due becomes PENDING:
    ``timer_fired`` is journaled with how late it fires. False if nothing is due."""
    if run.status != RunStatus.WAITING or run.wake_at is None or run.wake_at > timezone.now():
        return False
    wake_locked(run, kind=K.TIMER_FIRED, name="", actor=actor,
          payload={"due": run.wake_at.isoformat(), "late_by_ms": int(
              (timezone.now() - run.wake_at).total_seconds() * 1000)})
    return True


def runs_wake_released(*, run_ids: list[str]) -> int:
    """Flow control let a held effect of each run go (``ledger.flow.pump``): journal
    ``flow_released`` and, if the run waits, make it PENDING and wake a worker for it through
    the first-priority queue.

    Journaled whatever the run's status: a run still on its way to WAITING (its worker saw the
    hold a moment ago) then finds something journaled since it looked, and replays at once
    instead of sleeping (``systemdb.suspend``'s ``expect_last_seq``). A finished run is left
    alone. One transaction per run, holding only its row. Returns the runs woken."""
    woken = 0
    for run_id in run_ids:
        with transaction.atomic():
            run = WorkflowRun.objects.select_for_update().filter(id=run_id).first()
            if run is None or run.status in TERMINAL_STATUSES:
                continue
            # Woken ahead of every run waiting for a worker (the first queue): the call was given
            # capacity at its provider, which lapses unused (GRANT_TTL) if the run queues behind a
            # backlog of runs not yet started. Its work from here is short: one call.
            wake_locked(run, kind=K.FLOW_RELEASED, name="", payload={}, actor="flow control",
                        priority=queue.PRIORITIES[0])
            woken += run.status == RunStatus.WAITING
            if run.status == RunStatus.COMPENSATING and run.lease_expires_at is None:  # handed back, held
                queue.enqueue_after_commit(run.id, run.definition_hash, compensating=True, priority=run.priority)
                woken += 1
    return woken
