"""``Context``: the object a workflow function receives.

Contract: every ``ctx`` call takes the next position in the run's journal.

* Within the recorded journal, the recorded value is returned and nothing runs.
  If the recorded entry's kind or name differs from what the code asks for, the
  run halts with ``NonDeterminismError`` naming both.
* Past the end of the journal, the call runs for real and its outcome is
  appended under the worker's fence before the value is returned. A value is
  returned only once it is durable, and it is returned as JSON round-trips it,
  so first execution and replay see identical values.

The cursor underneath (positions, fenced appends, budgets) is ``sagas.replay.cursor``'s
``JournalCursor``, which ``Context`` extends; ``ctx.effect`` runs the ledger's protocol
(``ledger.protocol``) against it.
"""

from __future__ import annotations

import functools
import json
import random as _random
import uuid as _uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar, cast

from django.db import InterfaceError, OperationalError
from django.utils import timezone

from core.storage import is_storage_error, note_failure
from ledger.connectors import get_connector
from ledger.errors import OutcomeUnknown, PayloadNotJSON, ReplayDiverged
from ledger.flow import spend
from ledger.protocol import run_effect
from sagas import tracing, waits
from sagas.children import ChildHandle
from sagas.errors import (
    ContinueAsNew,
    EffectUnknown,
    NonDeterminismError,
    NotSerializable,
    SpendLimitReached,
    StepFailed,
    StorageUnavailable,
)
from sagas.models import JournalKind
from sagas.replay import children
from sagas.replay.cursor import JournalCursor, shutdown_requested
from sagas.runtime.crashpoints import crash_point
from sagas.store.systemdb import ClaimedRun, Entry, dumps
from sagas.validation import checked_json

K = JournalKind

F = TypeVar("F", bound=Callable[..., Any])

# ``shutdown_requested`` is the cursor's; the worker sets it on SIGTERM (imported from here).
__all__ = ["IRREVERSIBLE_APPROVAL_TIMEOUT", "Context", "shutdown_requested"]

# The automatic gate before an irreversible connector escalates after this long.
IRREVERSIBLE_APPROVAL_TIMEOUT = timedelta(hours=24)


def _engine_call(method: F) -> F:
    """A ``ctx`` method: a PostgreSQL or Redis failure inside it is the engine's, not the
    workflow's. It leaves as ``StorageUnavailable`` (a BaseException), so a workflow's own
    ``except Exception`` around ``ctx.step``/``ctx.effect`` cannot swallow it and carry on
    as if the step had failed."""

    @functools.wraps(method)
    def wrapper(self: Context, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            note_failure(exc, doing=f"advancing run {self.run_id}")
            raise StorageUnavailable(f"{method.__name__}: {type(exc).__name__}: {exc}") from exc

    return cast(F, wrapper)


class Context(JournalCursor):
    """What a workflow function receives: ``ctx.step``, ``ctx.effect``, ``ctx.approval``,
    ``ctx.sleep``, ``ctx.wait_for``, ``ctx.start_child``/``wait_child``/``gather``,
    ``ctx.now``/``random``/``uuid``, ``ctx.add_cost``; each is
    journaled, and on replay returns what was recorded instead of acting again.

    Also the run's ``run_id``, ``workflow_name``, ``version``, ``tenant``, ``business_key``,
    ``attempt`` (claims so far), ``input``, and ``replaying``, ``steps_used``, ``cost_used``.
    The cursor methods it inherits (``sagas.replay.cursor``) are for the engine, not for workflows."""

    def __init__(
        self, *, run: ClaimedRun, journal: list[Entry], worker_id: str, approve_irreversible: bool = True
    ) -> None:
        super().__init__(run=run, journal=journal, worker_id=worker_id, approve_irreversible=approve_irreversible)
        self.workflow_name = run.workflow_name
        self.version = run.version
        self.business_key = run.business_key
        self.attempt = run.attempts
        self.input = run.input
        self._pending_cost = 0.0
        self._pending_spend: dict[str, float] = {}

    @_engine_call
    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once; journal and return its JSON value.

        If ``fn`` raises, the error's type and message are journaled and
        ``StepFailed`` is raised, on this execution and on every replay.
        """
        name = self.unique_name(name)
        entry = self.replay_next(K.STEP, name)
        if entry is not None:
            return self._step_outcome(entry)
        self.before_live()
        crash_point("before_step", name)
        with tracing.step_span(self, name):  # executed live: a replayed step has no span
            self._pending_cost, self._pending_spend = 0.0, {}
            error: Exception | None = None
            try:
                value = fn(*args, **kwargs)
            except (OperationalError, InterfaceError):
                # The step used Django's database and it went away: our infrastructure,
                # not the step's failure. Not journaled; the step runs again after recovery.
                raise
            except Exception as exc:  # EngineSignal is a BaseException and passes through
                error = exc
            if error is None:
                try:
                    encoded = dumps({"value": value})
                except (TypeError, ValueError) as exc:
                    error = NotSerializable(f"step {name!r} returned a value that is not JSON: {exc}")
            if error is not None:
                encoded = dumps({"error": {"type": type(error).__name__, "message": str(error)[:4000]}})
            cost, self._pending_cost = self._pending_cost, 0.0
            spent, self._pending_spend = self._pending_spend, {}
            if cost:
                encoded = encoded[:-1] + f',"cost":{cost!r}}}'
            crash_point("after_step", name)
            self.append(K.STEP, name, encoded, steps=1, cost=cost, spend=spent)
            crash_point("after_step_record", name)
            entry = Entry(0, K.STEP, name, json.loads(encoded))
            if error is not None:
                raise StepFailed(name, type(error).__name__, str(error)[:4000]) from error
            return entry.payload["value"]

    @_engine_call
    def now(self) -> datetime:
        """The current time, recorded on first execution and replayed afterwards."""
        return datetime.fromisoformat(self._recorded(K.NOW, lambda: timezone.now().isoformat()))

    @_engine_call
    def random(self) -> float:
        """A float in [0, 1), recorded on first execution and replayed afterwards."""
        return self._recorded(K.RANDOM, _random.random)

    @_engine_call
    def uuid(self) -> _uuid.UUID:
        """A random UUID4, recorded on first execution and replayed afterwards."""
        return _uuid.UUID(self._recorded(K.UUID, lambda: str(_uuid.uuid4())))

    @_engine_call
    def approval(
        self, name: str, reason: str, timeout: timedelta, on_timeout: str = "escalate"
    ) -> dict[str, Any]:
        """Wait (holding no worker) until a person approves; see ``sagas.waits.approval``."""
        return waits.approval(self, name, reason, timeout, on_timeout)

    @_engine_call
    def sleep(self, duration: timedelta) -> None:
        """A journaled timer: the run waits (holding no worker) and the sweeper wakes it."""
        waits.sleep(self, duration)

    @_engine_call
    def wait_for(self, signal_name: str, timeout: timedelta) -> Any:
        """Wait for a signal sent with ``sagas.waits.signal_send``; see ``sagas.waits.wait_for``."""
        return waits.wait_for(self, signal_name, timeout)

    @_engine_call
    def start_child(
        self, workflow: str, input: Any = None, *, business_key: str = "", detached: bool = False,
        max_cost: float | None = None, max_steps: int | None = None, priority: int | None = None,
    ) -> ChildHandle:
        """Start a run of ``workflow`` as this run's child; returns its handle at once.

        The child's id comes from this run and the call (``child:<workflow>``, ``#n`` for the
        n-th), so a replay or a crash never starts a second one. Same tenant and starter. Without
        its own ``max_cost``, a child spends from this run's budget. ``detached``: the child
        outlives this run (never cancelled or compensated with it). See ``sagas.children``."""
        return children.start_child(
            self, workflow, input, business_key=business_key, detached=detached, max_cost=max_cost,
            max_steps=max_steps, priority=priority,
        )

    @_engine_call
    def wait_child(self, handle: ChildHandle) -> Any:
        """Wait (holding no worker) until the child ends; its result, or ``ChildFailed`` with
        its error if it failed, was cancelled or compensated."""
        return children.join(self, [handle], what="wait_child")[0]

    @_engine_call
    def gather(self, handles: list[ChildHandle]) -> list[Any]:
        """Wait (holding no worker) for every child in ``handles``; their results in that order.
        The first child (in that order) known not to have completed raises ``ChildFailed`` as
        soon as it is known, without waiting for the others."""
        return children.join(self, list(handles), what="gather")

    @_engine_call
    def signal_child(self, handle: ChildHandle, name: str, payload: Any = None) -> None:
        """Send signal ``name`` to a child (its ``ctx.wait_for(name)`` takes it), once."""
        children.signal_child(self, handle, name, payload)

    @_engine_call
    def effect(self, name: str, connector_name: str, payload: dict, key: str | None = None) -> Any:
        """A ledgered external effect: intent, dispatch, outcome, recovery, and their
        guarantee, are the ledger's (``ledger.protocol``), recorded in this run's journal.

        The engine's part: an irreversible connector first waits for the approval
        ``approve:<name>`` (escalated after ``IRREVERSIBLE_APPROVAL_TIMEOUT``) unless the
        workflow opted out, as approvals are waits; and what the ledger reports becomes the
        run's control flow: an unknown outcome halts the run (``EffectUnknown``), a key or
        payload other than the recorded one is ``NonDeterminismError``, a payload that is not
        JSON is ``NotSerializable``. ``EffectFailed`` and ``KeyConflict`` reach the workflow.
        """
        if self.approve_irreversible and get_connector(connector_name).irreversible:
            waits.approval(
                self, f"approve:{name}",
                reason=f"Irreversible: {connector_name} ({name}) cannot be undone once it runs",
                timeout=IRREVERSIBLE_APPROVAL_TIMEOUT,
            )
        if not self.replaying:  # a call not yet journaled: within its tenant's spend limit?
            self.check_spend(connector_name)
        # A span unless the outcome is journaled; current while the connector runs (trace_headers).
        with tracing.effect_span(self, name, connector_name, key):
            try:
                return run_effect(self, name=name, connector_name=connector_name, payload=payload, key=key)
            except OutcomeUnknown as exc:
                raise EffectUnknown(exc.message, **exc.details) from exc
            except ReplayDiverged as exc:
                raise NonDeterminismError(str(exc), journal=exc.recorded, code_asked=exc.asked) from exc
            except PayloadNotJSON as exc:
                raise NotSerializable(str(exc)) from None

    @_engine_call
    def continue_as_new(self, state: Any = None) -> NoReturn:
        """End this run here and go on in a fresh run of the same workflow, with ``state`` as
        its input: for loops that run for weeks (an agent's turns), whose journal would
        otherwise grow, and be replayed, without end. Never returns; call it where the
        workflow would return (``return ctx.continue_as_new(state)`` reads well).

        Contract (``sagas.replay.continuation``), in one transaction under this worker's fence: this
        run becomes COMPLETED (``status_reason`` ``continued_as_new``, result
        ``{"continued_as": "<new run id>"}``, journal entry ``continued_as_new``) and the new
        run is created PENDING, linked both ways (``continued_to`` / ``continued_from``). The
        new run is then woken (if that wake-up is lost, the sweeper finds the run). So a
        crash anywhere leaves either no successor (this run replays to this call and
        continues again) or exactly one (this run is finished and is never replayed).

        * The successor runs the newest version of the workflow registered in the worker
          that continues (as Temporal's continue-as-new picks up the current code): a long
          loop moves to new code at its next continuation, never in the middle of a run.
        * Budgets are the chain's: the successor starts with this run's ``steps_used`` and
          ``cost_used`` and keeps its limits, and its ``started_at`` is the chain's first
          start, so ``max_duration`` counts from there. A budget already used up stops this
          run here (``budget_exceeded``) instead of starting a successor.
        * Same tenant and starter (four-eyes holds along the chain); ``started_via``
          ``continue_as_new``; business key ``<first run's key>#<position>`` (the first key
          stays with the first run, so ``start`` with it still finds the chain's first run;
          empty if the first run had none, or if that key is taken).
        * ``state`` must be JSON that PostgreSQL can store, as for ``start``'s input;
          otherwise ``NotSerializable`` is raised here, and nothing is continued.
        * Not carried over: the journal (that is the point), the step-name counters, and
          anything to compensate: a failure in the new run compensates its own effects
          only; earlier runs of the chain completed.
        """
        checked = checked_json(state, what="the state given to ctx.continue_as_new")
        self.check_finished()
        self.before_live()
        raise ContinueAsNew(checked)

    def add_cost(self, amount: float, unit: str = "usd", *, connector: str = "") -> None:
        """Charge ``amount`` to the run's budget. Call it inside a step: the cost is
        recorded with that step's journal entry (and not charged again on replay).
        ``connector``: also count it in the tenant's daily spend on that connector, which a
        spend limit bounds (``ledger.flow.spend``; ``run_agent`` charges its turns to "model")."""
        if unit != "usd":
            raise ValueError("only unit='usd' is supported")
        if amount < 0:
            raise ValueError("cost cannot be negative")
        if not self.replaying:
            self._pending_cost += float(amount)
            if connector:
                self._pending_spend[connector] = self._pending_spend.get(connector, 0.0) + float(amount)

    def check_spend(self, connector: str) -> None:
        """Before a call or model turn goes out for real: ``SpendLimitReached`` (the run parks)
        if the tenant has reached its day's spend limit on ``connector``."""
        reached = spend.over(tenant=self.tenant, connector=connector)
        if reached is not None:
            raise SpendLimitReached(reached.describe(), **reached.as_dict())

    # --- recorded values ------------------------------------------------------

    def _recorded(self, kind: str, make: Callable[[], Any]) -> Any:
        name = self.unique_name(str(kind), space=str(kind))
        entry = self.replay_next(kind, name)
        if entry is not None:
            return entry.payload["value"]
        self.before_live()
        value = make()
        self.append(kind, name, dumps({"value": value}))
        return value

    def _step_outcome(self, entry: Entry) -> Any:
        payload = entry.payload
        if "error" in payload:
            err = payload["error"]
            raise StepFailed(entry.name, err.get("type", "Exception"), err.get("message", ""))
        return payload["value"]
