"""One exception hierarchy for the engine, each with a stable ``code``.

Two families:

* ``SagaError`` (an ``Exception``): errors callers are expected to handle, such as
  a workflow that is not registered or a start that conflicts with an existing run.
* ``EngineSignal`` (a ``BaseException``): control flow inside a running workflow
  (suspend, halt, lease lost). They subclass ``BaseException`` so that a
  workflow's own ``except Exception`` cannot swallow them, as in DBOS.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ledger.journal import FenceLost


class SagaError(Exception):
    """Base of the errors callers handle; ``code`` is stable, ``as_dict()`` is what APIs show."""

    code = "saga_error"

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self)}


class WorkflowNotRegistered(SagaError):
    """No workflow of that name (or version) is registered in this process."""

    code = "workflow_not_registered"


class DuplicateWorkflow(SagaError):
    """A different definition was registered under a ``(name, version)`` already taken: bump the version."""

    code = "duplicate_workflow"


class StartConflict(SagaError):
    """A run with this tenant, workflow and business key exists with a different input or version."""

    code = "start_conflict"


class InvalidArgument(SagaError, ValueError):
    """An argument is malformed: the wrong type, empty, too long for its column, a NUL or
    control character, a negative budget. Raised before anything is written."""

    code = "invalid_argument"


class IllegalTransition(SagaError):
    code = "illegal_transition"


class NotSerializable(SagaError):
    """A step returned, or a workflow was given, a value that is not JSON, or JSON that
    PostgreSQL cannot store (NUL, too deep, too large: ``ledger.storable``)."""

    code = "not_serializable"


class StepFailed(SagaError):
    """A step's function raised. Raised identically on first execution and on replay.

    ``error_type`` and ``message`` are what the original exception said; on the
    first execution the original exception is also chained as ``__cause__``.
    """

    code = "step_failed"

    def __init__(self, step: str, error_type: str, message: str) -> None:
        super().__init__(f"step {step!r} raised {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.message = message


class ChildFailed(SagaError):
    """A child run (``ctx.start_child``) ended without completing: it failed, was cancelled, or
    compensated itself. Raised by ``ctx.wait_child``/``ctx.gather`` identically on every replay;
    unhandled, it fails the parent, which then compensates (on_failure="compensate"), its
    finished children included. ``error`` is the child's own error, as its run records it."""

    code = "child_failed"

    def __init__(self, *, child_run_id: str, workflow: str, call: str, status: str, error: dict | None) -> None:
        message = (error or {}).get("message") or status.lower()
        super().__init__(f"child {workflow} ({call}, run {child_run_id}) ended {status}: {message}")
        self.child_run_id = child_run_id
        self.workflow = workflow
        self.call = call
        self.status = status
        self.error = error or {}

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self), "child_run_id": self.child_run_id,
                "workflow": self.workflow, "call": self.call, "status": self.status, "child_error": self.error}


class ApprovalRejected(SagaError):
    """An approval was rejected (or expired with on_timeout="reject"). Unhandled, it fails
    the run, which then compensates (on_failure="compensate")."""

    code = "approval_rejected"


class WaitTimedOut(SagaError):
    """``ctx.wait_for`` reached its timeout without the signal."""

    code = "wait_timed_out"


class AlreadyDecided(SagaError):
    """The approval was already decided (or expired); the message says by whom and when."""

    code = "already_decided"


class FourEyesViolation(SagaError):
    """The user who started a run cannot approve its steps."""

    code = "four_eyes"


class RunFinished(SagaError):
    """The action needs a run that is not finished."""

    code = "run_finished"


class ActionNotAllowed(SagaError):
    """The run is not in a state that allows this action (a stale page, or a race)."""

    code = "action_not_allowed"


# --- control flow inside a run ------------------------------------------------


class EngineSignal(BaseException):
    """Base of every signal the engine uses to unwind a workflow function."""

    code = "engine_signal"


class Suspend(EngineSignal):
    """The run waits (approval, timer, signal): release the worker, status WAITING.

    ``wake_at`` is when the sweeper should wake it even if nothing else does.
    """

    code = "suspend"

    def __init__(self, reason: str, wake_at: datetime | None = None, *, awaiting: frozenset[str] = frozenset(),
                 status_reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.wake_at = wake_at
        # A join of child runs (sagas.children): the calls it waits for. A child's end journaled
        # while the run was being suspended does not make it replay unless it ends the wait.
        self.awaiting = awaiting
        # The WAITING run's status_reason ("awaiting_children": woken only when the wait can end).
        self.status_reason = status_reason


class LeaseLost(EngineSignal, FenceLost):
    """Another worker claimed the run (its fence moved on): stop and record nothing.
    The ledger's ``FenceLost``, as the run's journal raises it."""

    code = "lease_lost"


class StorageUnavailable(EngineSignal):
    """PostgreSQL or Redis failed under the engine (a restart, a failover, a dropped
    connection): never the workflow's failure.

    A ``BaseException``, so a workflow's own ``except Exception`` cannot swallow it.
    The engine never records FAILED or compensates because of it: the worker hands
    the run back once the database answers again, or leaves it to its lease.
    """

    code = "storage_unavailable"


class Yield(EngineSignal):
    """The worker is shutting down: hand the run back (PENDING) at a step boundary."""

    code = "yield"


class ContinueAsNew(EngineSignal):
    """``ctx.continue_as_new(state)``: end this run and go on in a fresh run of the same
    workflow with ``state`` as its input (``sagas.replay.continuation``). ``state`` is already checked
    storable JSON (as PostgreSQL will return it)."""

    code = "continue_as_new"

    def __init__(self, state: Any) -> None:
        super().__init__("continue as new")
        self.state = state


class RunHalted(EngineSignal):
    """The run cannot continue without a person: it goes to NEEDS_ATTENTION.

    ``reason`` is the stable machine-readable reason stored on the run
    (``non_determinism``, ``version_mismatch``, ``budget_exceeded`` ...), and
    ``details`` is a JSON object shown in the console.
    """

    code = "run_halted"
    reason = "halted"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.reason, "message": self.message, **self.details}


class NonDeterminismError(RunHalted):
    """The code asked for a different step than the journal recorded at this position."""

    code = reason = "non_determinism"


class VersionMismatch(RunHalted):
    """The run's definition hash is not the one this worker has for its version."""

    code = reason = "version_mismatch"


class BudgetExceeded(RunHalted):
    code = reason = "budget_exceeded"


class SpendLimitReached(RunHalted):
    """The run's tenant has spent its day's limit on a connector (``ledger.flow.spend``): the call
    or model turn did not go out. Resumed by the sweeper once the limit is raised or the UTC day
    turns; ``details`` has the figures."""

    code = reason = "spend_limit"


class JournalGap(RunHalted):
    """The journal went back in time under a live worker: entries this worker wrote and the
    database acknowledged are not on the database it reaches now (a failover to a standby that
    had not received them, with asynchronous replication). The run stops for a person; every
    effect in the gap is UNKNOWN (``sagas.gaps``), never "not executed"."""

    code = reason = "journal_gap"


class EffectUnknown(RunHalted):
    """An effect's outcome is not known: the run waits for reconciliation or a person."""

    code = reason = "effect_unknown"


class ModelUnavailable(RunHalted):
    """An agent's model request kept failing for a reason that is not the request's fault
    (rate limit, overload, server error, connection, quota, credentials) after its retries.
    Nothing is journaled for the turn; ``retry`` sends it again under the same key."""

    code = reason = "model_unavailable"


class ApprovalEscalated(RunHalted):
    """An approval passed its deadline with on_timeout="escalate": a person must look;
    the approval can still be decided, which resumes the run."""

    code = reason = "approval_escalated"


class CompensationStuck(RunHalted):
    """A compensation failed or has an unknown outcome: never skipped, a person decides."""

    code = "compensation_stuck"

    def __init__(self, message: str, *, reason: str, **details: object) -> None:
        super().__init__(message, **details)
        self.reason = reason
