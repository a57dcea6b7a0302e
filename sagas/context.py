"""``Context``: the object a workflow function receives, and the replay cursor.

Contract: every ``ctx`` call takes the next position in the run's journal.

* Within the recorded journal, the recorded value is returned and nothing runs.
  If the recorded entry's kind or name differs from what the code asks for, the
  run halts with ``NonDeterminismError`` naming both.
* Past the end of the journal, the call runs for real and its outcome is
  appended under the worker's fence before the value is returned. A value is
  returned only once it is durable, and it is returned as JSON round-trips it,
  so first execution and replay see identical values.
"""

from __future__ import annotations

import functools
import json
import math
import random as _random
import threading
import time
import uuid as _uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from config.storage import Backoff, is_database_error, is_storage_error, note_failure, note_success
from sagas import systemdb
from sagas.crashpoints import crash_point
from sagas.errors import BudgetExceeded, NonDeterminismError, NotSerializable, StepFailed, StorageUnavailable, Yield
from sagas.models import CALL_KINDS, JournalKind
from sagas.systemdb import ClaimedRun, Entry, dumps

K = JournalKind

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


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

    return wrapper  # type: ignore[return-value]


# Set by the worker on SIGTERM: running workflows hand their run back at the
# next step boundary instead of holding a warm shutdown hostage.
shutdown_requested = threading.Event()


class Context:
    """What a workflow function receives: ``ctx.step``, ``ctx.effect``, ``ctx.approval``,
    ``ctx.sleep``, ``ctx.wait_for``, ``ctx.now``/``random``/``uuid``, ``ctx.add_cost``; each is
    journaled, and on replay returns what was recorded instead of acting again."""

    def __init__(
        self, *, run: ClaimedRun, journal: list[Entry], worker_id: str, approve_irreversible: bool = True
    ) -> None:
        self.run_id = run.id
        self.workflow_name = run.workflow_name
        self.version = run.version
        self.tenant = run.tenant
        self.business_key = run.business_key
        self.attempt = run.attempts
        self.input = run.input
        self._run = run
        self._worker = worker_id
        self._approve_irreversible = approve_irreversible
        self._calls = [e for e in journal if e.kind in CALL_KINDS]
        self._events = {(e.kind, e.name): e for e in journal if e.kind not in CALL_KINDS}
        self._signals: dict[str, list[Entry]] = {}
        for e in journal:
            if e.kind == K.SIGNAL_RECEIVED:
                self._signals.setdefault(e.name, []).append(e)
        # The newest seq this worker knows of: suspending is refused if anything was
        # appended since (a decision, a signal), and the run is replayed with it instead.
        self.last_seq = journal[-1].seq if journal else 0
        self._pos = 0
        self._names: dict[tuple[str, str], int] = {}
        self._steps_used = run.steps_used
        self._cost_used = float(run.cost_used)
        self._pending_cost = 0.0
        # Monotonic time until which this worker surely holds the lease (the claim's or
        # the last renewal's start + TTL); the heartbeat moves it on. Writes that fail
        # because the database went away are retried until then.
        self.lease_until = math.inf

    # --- public API --------------------------------------------------------

    @property
    def replaying(self) -> bool:
        """True while the code is still inside the recorded journal."""
        return self._pos < len(self._calls)

    @property
    def steps_used(self) -> int:
        return self._steps_used

    @property
    def cost_used(self) -> float:
        return self._cost_used

    @_engine_call
    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once; journal and return its JSON value.

        If ``fn`` raises, the error's type and message are journaled and
        ``StepFailed`` is raised, on this execution and on every replay.
        """
        name = self._unique(name)
        entry = self._replay(K.STEP, name)
        if entry is not None:
            return self._step_outcome(entry)
        self._before_live()
        crash_point("before_step", name)
        self._pending_cost = 0.0
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
        if cost:
            encoded = encoded[:-1] + f',"cost":{cost!r}}}'
        crash_point("after_step", name)
        self._append(K.STEP, name, encoded, steps=1, cost=cost)
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
        from sagas import waits

        return waits.approval(self, name, reason, timeout, on_timeout)

    @_engine_call
    def sleep(self, duration: timedelta) -> None:
        """A journaled timer: the run waits (holding no worker) and the sweeper wakes it."""
        from sagas import waits

        waits.sleep(self, duration)

    @_engine_call
    def wait_for(self, signal_name: str, timeout: timedelta) -> Any:
        """Wait for a signal sent with ``sagas.waits.signal_send``; see ``sagas.waits.wait_for``."""
        from sagas import waits

        return waits.wait_for(self, signal_name, timeout)

    @_engine_call
    def effect(self, name: str, connector_name: str, payload: dict, key: str | None = None) -> Any:
        """A ledgered external effect; see ``sagas.effects.run_effect`` for the contract."""
        from sagas.effects import run_effect

        return run_effect(self, name, connector_name, payload, key)

    def add_cost(self, amount: float, unit: str = "usd") -> None:
        """Charge ``amount`` to the run's budget. Call it inside a step: the cost is
        recorded with that step's journal entry (and not charged again on replay)."""
        if unit != "usd":
            raise ValueError("only unit='usd' is supported")
        if amount < 0:
            raise ValueError("cost cannot be negative")
        if not self.replaying:
            self._pending_cost += float(amount)

    # --- engine internals --------------------------------------------------

    def _unique(self, name: str, space: str = "call") -> str:
        """``name``, or ``name#n`` for its n-th use in this run. Steps and effects share one
        namespace (their names become idempotency keys); approvals, timers, signals and
        recorded values each have their own, so an approval "ship" leaves the effect "ship" alone."""
        if not name or "#" in name:
            raise ValueError(f"step name {name!r} must be non-empty and must not contain '#'")
        count = self._names.get((space, name), 0) + 1
        self._names[(space, name)] = count
        return name if count == 1 else f"{name}#{count}"

    def _replay(self, kind: str, name: str, also: frozenset[str] = frozenset()) -> Entry | None:
        """The recorded entry at the cursor, if any; it must be ``kind`` (or one of ``also``)
        and ``name``, or the run halts with NonDeterminismError."""
        if self._pos >= len(self._calls):
            return None
        entry = self._calls[self._pos]
        if (entry.kind != kind and entry.kind not in also) or entry.name != name:
            raise NonDeterminismError(
                f"the journal has {entry.kind} {entry.name!r} at seq {entry.seq}, "
                f"but the code asked for {kind} {name!r}",
                journal={"seq": entry.seq, "kind": entry.kind, "name": entry.name},
                code_asked={"kind": kind, "name": name},
            )
        self._pos += 1
        return entry

    def _check_finished(self) -> None:
        """The function returned: any recorded call it did not reach is non-determinism."""
        if self._pos < len(self._calls):
            entry = self._calls[self._pos]
            raise NonDeterminismError(
                f"the workflow returned, but the journal has {entry.kind} {entry.name!r} at seq {entry.seq}",
                journal={"seq": entry.seq, "kind": entry.kind, "name": entry.name},
                code_asked={"kind": "return", "name": ""},
            )

    def _before_live(self) -> None:
        if shutdown_requested.is_set():
            raise Yield("worker shutting down")
        run = self._run
        if run.max_steps is not None and self._steps_used >= run.max_steps:
            raise BudgetExceeded(
                f"step budget exhausted: {self._steps_used} of {run.max_steps} steps used",
                budget="steps",
                used=self._steps_used,
                limit=run.max_steps,
            )
        if run.max_cost is not None and self._cost_used >= float(run.max_cost):
            raise BudgetExceeded(
                f"cost budget exhausted: {self._cost_used:.4f} of {float(run.max_cost):.4f} usd used",
                budget="cost",
                used=self._cost_used,
                limit=float(run.max_cost),
            )
        if run.max_duration_seconds is not None:
            elapsed = (timezone.now() - run.started_at).total_seconds()
            if elapsed >= run.max_duration_seconds:
                raise BudgetExceeded(
                    f"duration budget exhausted: {elapsed:.1f}s of {run.max_duration_seconds:.1f}s",
                    budget="duration",
                    used=round(elapsed, 3),
                    limit=run.max_duration_seconds,
                )

    def _append(self, kind: str, name: str, payload: str, *, steps: int = 0, cost: float = 0.0) -> int:
        """Append under the fence. Outside a transaction a write the database failed is
        retried (see ``_durably``): a step's result survives a PostgreSQL restart."""

        def write() -> int:
            return systemdb.append(
                self.run_id,
                fence=self._run.fence,
                kind=kind,
                name=name,
                payload=payload,
                worker=self._worker,
                steps=steps,
                cost=cost,
            )

        seq = write() if connection.in_atomic_block else self._durably(write, kind=kind, name=name, recorded=int)
        self._steps_used += steps
        self._cost_used += cost
        self.last_seq = seq
        return seq

    def _durably(self, write: Callable[[], T], *, kind: str, name: str, recorded: Callable[[int], T]) -> T:
        """``write()`` (one commit that appends the journal entry ``kind``/``name``), retried
        with back-off while the database is unreachable and this worker holds the lease.

        A failed commit is ambiguous: it may have gone through before the connection
        died. Before each retry the journal is asked whether this worker's entry is there;
        if it is, ``recorded(seq)`` is returned and nothing is written twice. Past the
        lease, ``StorageUnavailable``: recovery takes over (a step runs again; an effect
        follows the ledger's rules). The fence makes a late write safe either way.
        """
        backoff = Backoff()
        retrying = False
        while True:
            try:
                if retrying:
                    seq = systemdb.find_own_entry(
                        self.run_id, after_seq=self.last_seq, kind=kind, name=name, worker=self._worker
                    )
                    if seq is not None:
                        note_success()
                        return recorded(seq)
                value = write()
                note_success()
                return value
            except Exception as exc:
                if not is_database_error(exc):
                    raise
                note_failure(exc, doing=f"recording {kind} {name!r} of run {self.run_id}")
                if time.monotonic() >= self.lease_until:
                    raise StorageUnavailable(
                        f"could not record {kind} {name!r} before the lease ran out: {type(exc).__name__}: {exc}"
                    ) from exc
                retrying = True
                backoff.sleep(until=self.lease_until)

    def _check_fence(self) -> None:
        """Inside a transaction: hold the run's row (FOR SHARE) if our fence is current, else LeaseLost."""
        systemdb.check_fence(self.run_id, fence=self._run.fence)

    def _recorded(self, kind: str, make: Callable[[], Any]) -> Any:
        name = self._unique(str(kind), space=str(kind))
        entry = self._replay(kind, name)
        if entry is not None:
            return entry.payload["value"]
        self._before_live()
        value = make()
        self._append(kind, name, dumps({"value": value}))
        return value

    def _step_outcome(self, entry: Entry) -> Any:
        payload = entry.payload
        if "error" in payload:
            err = payload["error"]
            raise StepFailed(entry.name, err.get("type", "Exception"), err.get("message", ""))
        return payload["value"]
