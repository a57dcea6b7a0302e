"""Saga Console's durable execution engine: the one public API.

Everything a workflow author or an integrator calls is importable from here (the
connector API and ``resolve`` from ``ledger``); the submodules are internal and may
move, except the extension modules for tools built on the engine (``sagas.integration``,
``sagas.models``, ``sagas.selectors``, ``sagas.errors``, ``sagas.events``, ``sagas.agents``,
``sagas.testing``; ``sagas.integration``'s docstring says what each is for).

Inside, the engine is grouped by concept: ``store`` (the system tables' SQL, journal
numbering, locks, database roles), ``runtime`` (worker processes, heartbeat, the queue, the
sweeper, crash points), ``replay`` (the engine loop, ``Context``, the journal cursor,
continue-as-new), ``versions`` (the registry and definition hashes), ``retention`` (archiving
and the archive store), ``agents``; waits, compensation, services and selectors are modules
of their own. Importing ``sagas`` is cheap and touches no Django model: functions import
what they need when called, so they need Django set up (``django.setup()``, or
any code running under ``manage.py``) by then.

Authoring::

    from sagas import workflow, Context

Starting and steering runs (keyword arguments; each is one transaction, and locks
the run first, so two people acting on one run queue instead of racing)::

    run = start("order_fulfilment", {"id": "o-1"}, business_key="o-1", tenant="acme")
    get_run(run.id); approvals(run.id); effects(run.id); compensation_preview(run_id=run.id)
    approve(run_id=run.id, name="ship", user=alice)      # or reject(...), by approval_id too
    signal(run_id=run.id, name="payment_settled", payload={...})
    cancel(run_id=run.id, reason="...", compensate=False)
    compensate(run_id=run.id, reason="...")
    retry(run_id=run.id, reason="...")
    workers()

Schedules (``sagas.schedules``): ``@workflow(..., schedules=[schedule("nightly", cron="0 2 * * *",
timezone="Europe/Berlin")])`` in code, or at run time::

    create_schedule("settlement", schedule("nightly", cron="0 2 * * *", timezone="Europe/Berlin"))
    pause_schedule("nightly", reason="..."); resume_schedule("nightly"); trigger_schedule("nightly")
    backfill_preview("nightly", start=..., end=...); backfill_schedule("nightly", start=..., end=...)

Agents (pydantic-ai): ``run_agent(ctx, agent, prompt)`` inside a workflow
journals each model request (keyed by run and turn) and each tool call; ``effect_tool("connector")``
makes a tool a ledgered effect; approval-required tools wait in the console's inbox.

Look-ups return the engine's own model instances (``WorkflowRun``, ``ApprovalRequest``,
``ledger``'s ``EffectRecord``) as they are at the time of the call: read their fields,
never ``save()`` them; change state only through these functions. An unknown id
raises the model's ``DoesNotExist`` (a ``django.core.exceptions.ObjectDoesNotExist``),
except in ``get_run``, which returns None.

Errors: every error a caller handles is a ``SagaError`` with a stable ``code``
(``StartConflict``, ``AlreadyDecided``, ``FourEyesViolation`` ...). Arguments are checked
before anything is written: a malformed one raises ``InvalidArgument`` (also a
``ValueError``), a JSON value PostgreSQL cannot store ``NotSerializable``. ``StorageUnavailable``
and ``NonDeterminismError`` are ``BaseException``s: the engine's, never the workflow's
to swallow.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sagas.errors import (
    ActionNotAllowed,
    AlreadyDecided,
    ApprovalRejected,
    ChildFailed,
    DuplicateWorkflow,
    FourEyesViolation,
    InvalidArgument,
    NonDeterminismError,
    NotSerializable,
    RunFinished,
    SagaError,
    StartConflict,
    StepFailed,
    StorageUnavailable,
    WaitTimedOut,
    WorkflowNotRegistered,
)
from sagas.schedules.spec import DEFAULT_BUSINESS_KEY, ScheduleSpec
from sagas.versions.registry import workflow

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from ledger.models import EffectRecord
    from sagas.compensation import PlannedItem
    from sagas.models import ApprovalRequest, RunStatus, Schedule, ScheduleTick, WorkflowRun
    from sagas.repair import ForkPlan
    from sagas.replay.check import CheckReport
    from sagas.replay.context import Context
    from sagas.runtime.readiness import WorkerStatus
    from sagas.schedules.services import BackfillItem

__all__ = [
    "ActionNotAllowed",
    "AlreadyDecided",
    "ApprovalRejected",
    "ChildFailed",
    "Context",
    "DuplicateWorkflow",
    "FourEyesViolation",
    "InvalidArgument",
    "NonDeterminismError",
    "NotSerializable",
    "RunFinished",
    "RunStatus",
    "SagaError",
    "ScheduleSpec",
    "StartConflict",
    "StepFailed",
    "StorageUnavailable",
    "WaitTimedOut",
    "WorkflowNotRegistered",
    "approvals",
    "approve",
    "backfill_preview",
    "backfill_schedule",
    "cancel",
    "compensate",
    "compensation_preview",
    "create_schedule",
    "delete_schedule",
    "effect_tool",
    "effects",
    "fork",
    "fork_preview",
    "get_run",
    "move",
    "pause",
    "pause_schedule",
    "pause_workflow",
    "redrive",
    "reject",
    "replay_check",
    "resume",
    "resume_schedule",
    "resume_workflow",
    "retry",
    "run_agent",
    "schedule",
    "schedule_ticks",
    "schedules",
    "signal",
    "start",
    "trigger_schedule",
    "workers",
    "workflow",
]


# --- runs ---------------------------------------------------------------------------


def start(
    name: str,
    input: Any = None,
    *,
    business_key: str = "",
    tenant: str = "default",
    version: int | None = None,
    started_by: User | None = None,
    started_via: str = "api",
    max_steps: int | None = None,
    max_cost: float | None = None,
    max_duration: timedelta | None = None,
    priority: int | None = None,
) -> WorkflowRun:
    """Start a run of workflow ``name`` (the newest registered version unless ``version``)
    and return it, PENDING; a worker with that exact code picks it up after the commit.

    Idempotent per ``(tenant, name, business_key)``: the same input returns the existing
    run; a different input, or a ``version`` other than the existing run's, raises
    ``StartConflict`` and starts nothing. Budgets default to the workflow's. The person in
    ``started_by`` cannot approve the run's approvals (four-eyes).
    ``WorkflowNotRegistered`` if this process does not have the workflow.

    Checked before the database is touched, nothing written when refused:

    * ``InvalidArgument`` (a ``ValueError``): ``name``, ``tenant`` (1-100 characters),
      ``business_key`` (0-200) or ``started_via`` (1-20) not a string, too long, or holding
      a control character (NUL included); ``version`` or ``max_steps`` not a whole number
      from 1 to 2,147,483,647; ``max_cost`` not a finite number in 0-99,999,999.999999;
      ``max_duration`` not a positive ``timedelta``; ``started_by`` not a saved user;
      ``priority`` not a whole number from 1 to 5.

    ``priority``: 1 (taken first by a saturated worker) to 5; default: the workflow's
    (``@workflow(priority=)``, else 3).
    * ``NotSerializable``: ``input`` not JSON, or JSON PostgreSQL cannot store: a NUL
      (``U+0000``) or lone surrogate in a string or key, nesting deeper than 64 levels,
      more than 10 MiB encoded (``ledger.storable``).
    """
    from sagas.services import run_start

    return run_start(
        name=name, input=input, business_key=business_key, tenant=tenant, version=version,
        started_by=started_by, started_via=started_via, max_steps=max_steps, max_cost=max_cost,
        max_duration=max_duration, priority=priority,
    )


def get_run(run_id: Any) -> WorkflowRun | None:
    """The run as it is now (``status``, ``status_reason``, ``result``, ``error`` ...), or None
    when there is no run with that id (or the id is not a UUID)."""
    from django.core.exceptions import ValidationError

    from sagas.models import WorkflowRun

    try:
        return WorkflowRun.objects.filter(id=run_id).first()
    except (ValidationError, ValueError, TypeError):
        return None


def approvals(run_id: Any) -> list[ApprovalRequest]:
    """The run's approvals, oldest request first: ``step`` (its name, ``#2`` for a repeat),
    ``state`` (PENDING, APPROVED, REJECTED, EXPIRED, ESCALATED), ``reason``, ``deadline``,
    ``decided_by_label``, ``decided_at``, ``comment``; ``id`` is what ``approve`` takes."""
    from sagas.models import ApprovalRequest

    return list(ApprovalRequest.objects.filter(run_id=run_id).order_by("requested_at", "id"))


def effects(run_id: Any) -> list[EffectRecord]:
    """The ledger records of the run, in the order their intents were recorded: ``step_name``,
    ``connector``, ``kind`` ("effect", or "compensation" for an undo), ``status`` (PENDING,
    IN_PROGRESS, SUCCEEDED, FAILED_FINAL, UNKNOWN), ``idempotency_key``, ``result``,
    ``downstream_ref``, ``attempts``, and who resolved it if a person did; ``id`` is what
    ``ledger.resolve`` takes."""
    from ledger.models import EffectRecord

    return list(EffectRecord.objects.filter(run_id=run_id).order_by("intent_at", "id"))


def compensation_preview(*, run_id: Any) -> list[PlannedItem]:
    """What ``compensate`` would do now, newest effect first: each item's ``step_name``,
    ``connector``, ``compensation_key``, and ``reversible`` with ``why_not`` when it cannot
    be undone (irreversible, no compensation, connector not registered here). Writes nothing."""
    from sagas.compensation import compensation_preview as preview
    from sagas.models import WorkflowRun

    return preview(run=WorkflowRun.objects.get(id=run_id))


# --- actions on a run ---------------------------------------------------------------


def _approval_id(approval_id: int | None, run_id: Any, name: str | None) -> int:
    if (approval_id is None) == (run_id is None or name is None):
        raise TypeError("give either approval_id, or run_id and name")
    if approval_id is not None:
        return approval_id
    from sagas.models import ApprovalRequest

    return ApprovalRequest.objects.values_list("id", flat=True).get(run_id=run_id, step=name)


def approve(
    *,
    user: User,
    approval_id: int | None = None,
    run_id: Any = None,
    name: str | None = None,
    comment: str = "",
) -> ApprovalRequest:
    """Approve one approval, named by ``approval_id`` or by ``run_id`` and its ``name`` (as
    in ``ctx.approval(name, ...)``); the decision is journaled and wakes the run.

    Four-eyes: the person who started the run cannot (``FourEyesViolation``). A second
    decision raises ``AlreadyDecided`` naming who decided and when; a finished run,
    ``RunFinished``. An escalated approval (past its deadline) can still be approved.
    ``comment``: at most 4,000 characters, no NUL (``InvalidArgument``).
    """
    from sagas.waits import approval_decide

    return approval_decide(approval_id=_approval_id(approval_id, run_id, name), user=user, approve=True,
                           comment=comment)


def reject(
    *,
    user: User,
    approval_id: int | None = None,
    run_id: Any = None,
    name: str | None = None,
    comment: str = "",
) -> ApprovalRequest:
    """Reject one approval (see ``approve`` for how it is named and what is refused). The
    workflow's ``ctx.approval`` raises ``ApprovalRejected``; unhandled, the run fails and
    compensates (``on_failure="compensate"``)."""
    from sagas.waits import approval_decide

    return approval_decide(approval_id=_approval_id(approval_id, run_id, name), user=user, approve=False,
                           comment=comment)


def signal(*, run_id: Any, name: str, payload: Any = None, actor: str = "api") -> str:
    """Deliver signal ``name`` (with a JSON ``payload``) to a run. It is kept until a
    ``ctx.wait_for(name)`` takes it: signals sent before the wait are not lost, and the
    n-th wait for a name receives the n-th signal. ``RunFinished`` if the run is finished;
    ``InvalidArgument`` or ``NotSerializable`` for a name or payload ``start`` would refuse.
    A run that continued as new passes it on to the run continuing it (the id returned)."""
    from sagas.waits import signal_send

    return signal_send(run_id=str(run_id), name=name, payload=payload, actor=actor)


def cancel(*, run_id: Any, reason: str, compensate: bool, user: User | None = None) -> WorkflowRun:
    """Cancel a run and return it as it is now. A worker advancing it stops at its next step
    boundary (its writes are refused); a waiting run stops at once; open approvals expire.

    ``compensate`` is the caller's explicit choice: True undoes the run's succeeded effects
    (the run goes COMPENSATING, then COMPENSATED) when there are any; False leaves them
    (CANCELLED). A ``reason`` is required (``ActionNotAllowed``); a finished run raises
    ``RunFinished``; a compensating one, ``ActionNotAllowed``.
    """
    from sagas.services import run_cancel

    return run_cancel(run_id=str(run_id), user=user, reason=reason, compensate=compensate)


def compensate(*, run_id: Any, reason: str, user: User | None = None) -> WorkflowRun:
    """Undo a run's succeeded effects, newest first (``compensation_preview`` shows the plan),
    and return the run, now COMPENSATING. Each undo goes through the ledger under key
    ``"<effect key>:compensate"``; an effect that cannot be undone is listed as irreversible,
    and a compensation that fails parks the run (NEEDS_ATTENTION), skipping nothing.

    A ``reason`` is required (``ActionNotAllowed``); a completed, compensated or cancelled run
    raises ``RunFinished``; one already compensating, ``ActionNotAllowed``.
    """
    from sagas.compensation import compensation_start
    from sagas.models import WorkflowRun

    compensation_start(run_id=str(run_id), user=user, reason=reason)
    return WorkflowRun.objects.get(id=run_id)


def retry(*, run_id: Any, reason: str, user: User | None = None) -> WorkflowRun:
    """Let a run parked in NEEDS_ATTENTION go on, and return it, where retrying means
    something: an exhausted budget (raised by its original size, recorded), a version
    mismatch (only once a live worker has the run's code again), failed compensations
    (retried under a new key). Any other reason raises ``ActionNotAllowed`` saying what to
    do instead (resolve the effect, decide the approval, deploy a fix as a new version)."""
    from sagas.services import run_retry

    return run_retry(run_id=str(run_id), user=user, reason=reason)


def pause(*, run_id: Any, reason: str, user: User | None = None) -> WorkflowRun:
    """Hold a run while someone investigates, and return it. It is not claimed, and its timers
    do not fire, until ``resume``; a worker advancing it finishes the step in flight, records
    it, and hands the run back at the next step boundary. Signals, decisions and resolutions
    that arrive meanwhile are recorded and acted on at resume. Journaled on the run.

    A ``reason`` is required and a paused run cannot be paused again (``ActionNotAllowed``);
    a finished run raises ``RunFinished``."""
    from sagas.pausing import run_pause

    return run_pause(run_id=run_id, user=user, reason=reason)


def resume(*, run_id: Any, reason: str, user: User | None = None) -> WorkflowRun:
    """Lift a run's pause and return it: it is queued for a worker again, and a timer or
    deadline that fell due during the pause fires now. ``ActionNotAllowed`` if the run is not
    paused, or is held by its workflow's pause (lift that with ``resume_workflow``)."""
    from sagas.pausing import run_resume

    return run_resume(run_id=run_id, user=user, reason=reason)


def pause_workflow(name: str, *, version: int | None = None, reason: str, user: User | None = None) -> None:
    """Hold every run of workflow ``name`` (of one ``version``, or of every version), runs
    started later included, until ``resume_workflow`` with the same ``version``. Runs being
    advanced stop at their next step boundary, as with ``pause``. ``InvalidArgument`` for a
    workflow with neither a registered version nor runs; ``ActionNotAllowed`` if that same
    pause is already in place."""
    from sagas.pausing import workflow_pause

    workflow_pause(workflow_name=name, version=version, user=user, reason=reason)


def resume_workflow(name: str, *, version: int | None = None, reason: str, user: User | None = None) -> int:
    """Lift the pause ``pause_workflow(name, version=...)`` set, and return how many runs were
    queued again at once (the sweeper finds the rest, and fires the timers that fell due).
    ``ActionNotAllowed`` if there is no such pause."""
    from sagas.pausing import workflow_resume

    return workflow_resume(workflow_name=name, version=version, user=user, reason=reason)


def move(*, run_id: Any, version: int, reason: str, user: User | None = None) -> WorkflowRun:
    """Move a run that has not finished to ``version`` of its workflow, keeping its id and its
    history, and return it: its next claim replays on that code. Only if its history replays
    cleanly on that code, checked under the run's lock (``replay_check``); ``ActionNotAllowed``
    with the divergence otherwise. A run parked because no worker had its code
    (``version_mismatch``) or because its code diverged (``non_determinism``) goes on at once.
    A run a worker is advancing is refused: ``pause`` it first. A FAILED run is ``redrive``n.
    Journaled as ``moved`` (from, to, by whom, why)."""
    from sagas.repair import run_move

    return run_move(run_id=run_id, version=version, user=user, reason=reason)


def redrive(*, run_id: Any, reason: str, version: int | None = None, user: User | None = None) -> WorkflowRun:
    """Continue a FAILED run (its effects in place), or one parked because its code diverged,
    from where it stopped, keeping its id and history, and return it (PENDING). A step that
    failed is asked again. With ``version``, the run is moved to that code first, checked as
    ``move`` checks. Journaled as ``redriven``. ``ActionNotAllowed`` for any other run, or one
    whose effects are being or were compensated."""
    from sagas.repair import run_redrive

    return run_redrive(run_id=run_id, user=user, reason=reason, version=version)


def fork_preview(*, run_id: Any, at_seq: int, compensate_first: bool = False) -> ForkPlan:
    """What re-running a run from the step at ``at_seq`` of its journal (``fork``) would do:
    each effect of the run with its fate (``kept``: before the step, its recorded outcome;
    ``reused``: done after it, answered from the ledger if the new run asks for it with the same
    payload; ``undone``: with ``compensate_first``, compensated by the new run before it goes on,
    then asked again under the new run's key; ``again``: not done (or undone since), executed if
    asked; ``blocks``: unknown, or not safe in this mode, see its note), whether it is
    irreversible, what the new run's budget starts with, and ``blockers``."""
    from sagas.models import WorkflowRun
    from sagas.repair import fork_plan

    return fork_plan(WorkflowRun.objects.get(id=run_id), at_seq, compensate_first=compensate_first)


def fork(*, run_id: Any, at_seq: int, reason: str, version: int | None = None, user: User | None = None,
         compensate_first: bool = False) -> WorkflowRun:
    """Re-run a run from the step at ``at_seq`` of its journal as a new run, linked both ways,
    and return the new run (PENDING). Its journal starts with a copy of the history before that
    step; it executes from there, on the source's code or ``version``. No effect is done twice:
    effects before the step keep their outcomes; effects done after it are reused when asked for
    with the same payload, or, with ``compensate_first``, compensated (ledgered, newest first) by
    the new run before it goes on (``fork_preview``). ``ActionNotAllowed`` while an outcome is
    unknown, while a worker advances the source, or when the copied history does not replay on
    the code."""
    from sagas.repair import run_fork

    return run_fork(run_id=run_id, at_seq=at_seq, user=user, reason=reason, version=version,
                    compensate_first=compensate_first)


def replay_check(
    name: str, *, version: int | None = None, module: str | None = None, runs: Any = None,
    runs_of_version: int | None = None, sample: int = 100,
) -> CheckReport:
    """Would this code resume these runs? Replays the recorded journals of workflow ``name``'s
    runs against a version of its code, executing nothing and writing nothing, and returns a
    report (``.runs``: each ``compatible``, ``diverges`` with the position, what the journal
    holds, what the code asked for and the source line, or ``error``; ``.counts``; ``.ok``).

    The code: ``version`` of the registered workflow (default the newest), or ``module`` (a
    dotted name or a ``.py`` path) for code not deployed yet. The runs: ``runs`` (ids), or every
    run in flight (of ``runs_of_version`` only, if given) plus the ``sample`` most recently
    finished. ``WorkflowNotRegistered`` / ``InvalidArgument`` when there is no such code."""
    from sagas.replay.check import definition_for, runs_to_check
    from sagas.replay.check import replay_check as check

    definition = definition_for(name, version, module=module)
    return check(definition, runs_to_check(name, version=runs_of_version, sample=sample, run_ids=runs))


# --- schedules ----------------------------------------------------------------------


def schedule(
    name: str,
    *,
    cron: str = "",
    every: timedelta | None = None,
    timezone: str = "UTC",
    input: Any = None,
    tenant: str = "default",
    business_key: str = DEFAULT_BUSINESS_KEY,
    jitter: timedelta = timedelta(0),
    catch_up: str = "last",
    catch_up_window: timedelta = timedelta(hours=1),
    overlap: str = "skip",
) -> ScheduleSpec:
    """A schedule, for ``@workflow(..., schedules=[...])`` or ``create_schedule``: ``cron`` (five
    fields, in ``timezone``) or ``every`` (a ``timedelta``, ticks at multiples of it since
    1970-01-01 UTC). ``ScheduleSpec``'s docstring says what each option does; the defaults are
    "fire only the last missed tick, within an hour" and "skip a tick while the previous run is
    still going". ``InvalidArgument`` (a ``ValueError``) for a malformed one."""
    return ScheduleSpec(
        name=name, cron=cron, every=every, timezone=timezone, input=input, tenant=tenant,
        business_key=business_key, jitter=jitter, catch_up=catch_up, catch_up_window=catch_up_window,
        overlap=overlap,
    ).checked()


def create_schedule(workflow: str, spec: ScheduleSpec) -> Schedule:
    """Create schedule ``spec`` (``schedule(...)``) of workflow ``workflow`` and return it; its
    first tick is the first one after now. ``InvalidArgument`` if the name is taken;
    ``WorkflowNotRegistered`` if this process does not have the workflow."""
    import dataclasses

    from sagas.schedules.services import schedule_create

    return schedule_create(spec=dataclasses.replace(spec, workflow=workflow))


def schedules() -> list[Schedule]:
    """Every schedule, by name: its spec, ``paused``, ``next_tick_at`` and ``due_at``."""
    from sagas.models import Schedule

    return list(Schedule.objects.order_by("name"))


def schedule_ticks(name: str, *, limit: int = 50) -> list[ScheduleTick]:
    """The newest ``limit`` ticks of schedule ``name`` handled so far, newest first: ``tick_at``,
    ``outcome`` (started, skipped, buffered, missed, failed), ``how`` (schedule, catch_up,
    trigger, backfill), ``run_id``, ``note``, ``handled_at``."""
    from sagas.models import ScheduleTick

    return list(ScheduleTick.objects.filter(schedule__name=name).order_by("-tick_at")[:limit])


def pause_schedule(name: str, *, reason: str, user: User | None = None) -> Schedule:
    """Stop schedule ``name`` firing; ticks that fall while it is paused are not fired (unless
    backfilled).
    ``ActionNotAllowed`` if it is paused already or the reason is empty."""
    from sagas.schedules.services import schedule_pause
    from sagas.validation import actor_label

    return schedule_pause(name=name, reason=reason, actor=actor_label(user))


def resume_schedule(name: str) -> Schedule:
    """Fire schedule ``name`` again, from its first tick after now."""
    from sagas.schedules.services import schedule_resume

    return schedule_resume(name=name)


def trigger_schedule(name: str, *, overlap: str | None = None, user: User | None = None) -> ScheduleTick:
    """Fire schedule ``name`` once now (a paused one too), under its overlap policy or
    ``overlap``; returns the tick, whose ``outcome`` says what happened."""
    from sagas.schedules.services import schedule_trigger
    from sagas.validation import actor_label

    return schedule_trigger(name=name, overlap=overlap, actor=actor_label(user))


def backfill_preview(name: str, *, start: Any, end: Any) -> list[BackfillItem]:
    """The ticks of schedule ``name`` in ``[start, end]`` that ``backfill_schedule`` would fire,
    with each run's business key and the ticks already handled (left alone). Writes nothing."""
    from sagas.schedules.services import backfill_preview as preview

    return preview(name=name, start=start, end=end)


def backfill_schedule(name: str, *, start: Any, end: Any, overlap: str = "allow_all",
                      user: User | None = None) -> list[ScheduleTick]:
    """Fire each tick of schedule ``name`` in ``[start, end]`` (at most 1,000) not handled yet,
    oldest first; returns those ticks."""
    from sagas.schedules.services import schedule_backfill
    from sagas.validation import actor_label

    return schedule_backfill(name=name, start=start, end=end, overlap=overlap, actor=actor_label(user))


def delete_schedule(name: str) -> None:
    """Delete schedule ``name`` and its record of ticks; the runs it started stay. A schedule
    declared in code comes back when the next worker starts unless it is removed from the code."""
    from sagas.schedules.services import schedule_delete

    schedule_delete(name=name)


# --- workers ------------------------------------------------------------------------


def workers(*, include_stopped: bool = False) -> list[WorkerStatus]:
    """The workers in the registry, by name, each with the versions it runs and ``live``
    (beating recently); stopped or silent ones only with ``include_stopped``. A worker
    started with ``sagas_worker --ready-file`` also writes a file once it is ready
    (``sagas.runtime.readiness``)."""
    from sagas.runtime.readiness import workers_status

    return workers_status(include_stopped=include_stopped)


def __getattr__(attr: str) -> Any:
    # Names whose modules import Django models: loaded on first use, after apps are ready.
    if attr == "Context":
        from sagas.replay.context import Context

        return Context
    if attr == "RunStatus":
        from sagas.models import RunStatus

        return RunStatus
    if attr in ("run_agent", "effect_tool"):  # imports pydantic-ai: only for those who use it
        from sagas import agents

        return getattr(agents, attr)
    raise AttributeError(f"module 'sagas' has no attribute {attr!r}")
