"""``JournalCursor``: a run's journal as the worker advancing it sees it.

This is the interface the modules built on ``Context`` are written against:
``sagas.waits``, ``sagas.compensation``, the engine, and the ledger's protocol
(``ledger.protocol``), for which it implements ``ledger.journal.Journal``. ``Context``
is a ``JournalCursor`` with the workflow author's API on top; workflow code calls that
API, never these methods.

Contract: every call in the workflow's own order takes the next position.

* ``replay_next`` returns the recorded entry at that position, which must be of the
  kind and name the code asks for, or the run halts with ``NonDeterminismError`` naming
  both. Past the end of the recorded journal it returns None: the caller checks
  ``before_live`` (shutdown, budgets), acts, and ``append``s the outcome under the
  worker's fence before it returns a value. A value is returned only once it is durable.
* Entries that are not positions (decisions, signals, effect outcomes) are looked up by
  kind and name: ``recorded_event``, ``signals_received``.
* Every write checks the run's fence: a worker whose lease was taken over gets
  ``LeaseLost`` and writes nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from django.db import connection, transaction
from django.utils import timezone

from core.storage import Backoff, is_database_error, note_failure, note_success
from ledger.flow import spend as spending
from sagas.errors import BudgetExceeded, JournalGap, NonDeterminismError, StorageUnavailable, Suspend, Yield
from sagas.models import CALL_KINDS, JournalKind
from sagas.runtime.crashpoints import crash_point
from sagas.store import systemdb
from sagas.store.systemdb import ClaimedRun, Entry

if TYPE_CHECKING:
    from ledger.flow.gate import Hold

T = TypeVar("T")

# Set by the worker on SIGTERM: running workflows hand their run back at the
# next step boundary instead of holding a warm shutdown hostage.
shutdown_requested = threading.Event()

# Why a run is handed back at a step boundary (``Yield``'s message, journaled as ``yielded``).
YIELD_SHUTDOWN = "worker shutting down"
YIELD_PAUSED = "paused by an operator"


class JournalCursor:
    """The replay cursor over one claimed run's journal (see the module's contract)."""

    def __init__(
        self, *, run: ClaimedRun, journal: list[Entry], worker_id: str, approve_irreversible: bool = True
    ) -> None:
        self.run_id = run.id
        self.tenant = run.tenant
        self.worker_id = worker_id
        # Irreversible connectors wait for an approval first (the workflow may opt out).
        self.approve_irreversible = approve_irreversible
        self._run = run
        # A redrive (sagas.repair) asks the failed steps it lists again: their entries stay in the
        # journal, but no longer answer their position.
        retried = {seq for e in journal if e.kind == JournalKind.REDRIVEN for seq in e.payload.get("retry_seqs", ())}
        self._calls = [e for e in journal if e.kind in CALL_KINDS and e.seq not in retried]
        self._events = {(e.kind, e.name): e for e in journal if e.kind not in CALL_KINDS}
        # A run re-run from another one with its effects reused (sagas.repair): effect name -> the
        # source's key, for the effects after the fork point the code may ask for again.
        forked = self._events.get((JournalKind.FORKED, ""))
        self._reuse: dict[str, str] = dict(forked.payload.get("reuse", {})) if forked is not None else {}
        # ... or with them compensated first ("compensate first"): what is still to undo, newest
        # first (``sagas.compensation.undo_before_fork``), each done once it is journaled.
        self.undo_pending: list[dict] = [
            item for item in (forked.payload.get("undo", []) if forked is not None else [])
            if (JournalKind.COMPENSATION_ITEM, f"compensate:{item['name']}") not in self._events
        ]
        self._signals: dict[str, list[Entry]] = {}
        for e in journal:
            if e.kind == JournalKind.SIGNAL_RECEIVED:
                self._signals.setdefault(e.name, []).append(e)
        # The newest seq this worker knows of: suspending is refused if anything was
        # appended since (a decision, a signal), and the run is replayed with it instead.
        self.last_seq = journal[-1].seq if journal else 0
        # What this claim wrote, newest last (seq, kind, name), and the ledger records created with
        # its intents (key -> the record's fields): if the database loses them (a failover with
        # asynchronous replication), the gap is reported and its effects recorded again as
        # UNKNOWN (``sagas.gaps``).
        self.written: list[tuple[int, str, str]] = []
        self.intents: dict[str, dict[str, Any]] = {}
        self._pos = 0
        self._names: dict[tuple[str, str], int] = {}
        self._steps_used = run.steps_used
        self._cost_used = float(run.cost_used)
        # Monotonic time until which this worker surely holds the lease (the claim's or
        # the last renewal's start + TTL); the heartbeat moves it on. Writes that fail
        # because the database went away are retried until then.
        self.lease_until = math.inf
        # Set when a journal write or a lease renewal finds the run paused (``sagas.pausing``):
        # the run stops at its next step boundary, after the step in flight is recorded.
        self.pause_requested = False

    @property
    def replaying(self) -> bool:
        """True while the code is still inside the recorded journal."""
        return self._pos < len(self._calls)

    @property
    def claimed(self) -> ClaimedRun:
        """The run as this worker claimed it (its budgets, fence, priority)."""
        return self._run

    @property
    def steps_used(self) -> int:
        return self._steps_used

    @property
    def cost_used(self) -> float:
        return self._cost_used

    # --- positions -----------------------------------------------------------

    def unique_name(self, name: str, space: str = "call") -> str:
        """``name``, or ``name#n`` for its n-th use in this run. Steps and effects share one
        namespace (their names become idempotency keys); approvals, timers, signals and
        recorded values each have their own, so an approval "ship" leaves the effect "ship" alone."""
        if not name or "#" in name:
            raise ValueError(f"step name {name!r} must be non-empty and must not contain '#'")
        count = self._names.get((space, name), 0) + 1
        self._names[(space, name)] = count
        return name if count == 1 else f"{name}#{count}"

    def next_unique_name(self, name: str, space: str = "call") -> str:
        """What ``unique_name(name, space)`` returns next, without counting the use."""
        count = self._names.get((space, name), 0) + 1
        return name if count == 1 else f"{name}#{count}"

    def peek(self) -> Entry | None:
        """The recorded entry at the cursor, without taking it; None past the recorded journal."""
        return self._calls[self._pos] if self._pos < len(self._calls) else None

    def effect_key(self, name: str) -> str:
        """``"{run_id}:{name}"``; in a run re-run from another with its effects reused, the
        source's key for an effect it had done after the fork point, so the ledger answers with
        that outcome instead of calling again (a changed payload is refused under it)."""
        return self._reuse.get(name) or f"{self.run_id}:{name}"

    def replay_next(self, kind: str, name: str, also: frozenset[str] = frozenset()) -> Entry | None:
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

    def check_finished(self) -> None:
        """The function returned: any recorded call it did not reach is non-determinism."""
        if self._pos < len(self._calls):
            entry = self._calls[self._pos]
            raise NonDeterminismError(
                f"the workflow returned, but the journal has {entry.kind} {entry.name!r} at seq {entry.seq}",
                journal={"seq": entry.seq, "kind": entry.kind, "name": entry.name},
                code_asked={"kind": "return", "name": ""},
            )

    # --- events around the positions -----------------------------------------

    def recorded_event(self, kind: str, name: str) -> Entry | None:
        """The entry ``kind``/``name`` that is not a position (a decision, an outcome), as
        loaded with the journal; None if it was not recorded then."""
        return self._events.get((kind, name))

    def signals_received(self, signal_name: str) -> list[Entry]:
        """The ``signal_received`` entries for ``signal_name``, oldest first, as loaded."""
        return self._signals.get(signal_name, [])

    # --- before acting for real -------------------------------------------------

    def before_live(self) -> None:
        """Past the recorded journal, before acting: ``Yield`` if the worker is shutting down,
        ``BudgetExceeded`` if a budget of the run is used up."""
        self._stop_if_asked()
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

    def before_retry(self) -> None:
        """``Yield`` if the worker is shutting down or an operator paused the run: the run is
        handed back (PENDING)."""
        self._stop_if_asked()

    def _stop_if_asked(self) -> None:
        if shutdown_requested.is_set():
            raise Yield(YIELD_SHUTDOWN)
        if self.pause_requested:
            raise Yield(YIELD_PAUSED)

    def hold(self, hold: Hold) -> NoReturn:
        """Flow control holds an effect back (``ledger.flow``): the run waits, holding no worker,
        until the pump lets its ticket go and wakes it (``sagas.waits.runs_wake_released``), or
        until ``hold.wake_at`` at the latest."""
        raise Suspend(hold.describe(), wake_at=hold.wake_at)

    def crash_point(self, point: str, name: str) -> None:
        """Ends the process here if ``SAGAS_CRASH_AT`` names this point (``sagas.runtime.crashpoints``)."""
        crash_point(point, name)

    # --- writes ------------------------------------------------------------------

    def append(self, kind: str, name: str, payload: str, *, steps: int = 0, cost: float = 0.0,
               spend: dict[str, float] | None = None) -> int:
        """Append an entry (``payload``: its JSON text) under the fence; returns its seq.
        ``spend`` (connector -> amount): added to the tenant's daily spend in the same commit
        (``ledger.flow.spend``).
        ``steps`` and ``cost`` count against the run's budget here at once; the run's row
        counts them from the journal itself (``sagas.store.numbering``), so a step's ``cost`` must
        be in its payload.
        Outside a transaction a write the database failed is retried (see ``durably``): a
        step's result survives a PostgreSQL restart. ``LeaseLost`` if the fence moved on."""

        def append() -> systemdb.Appended:
            return systemdb.append(
                self.run_id,
                fence=self._run.fence,
                kind=kind,
                name=name,
                payload=payload,
                worker=self.worker_id,
            )

        def write() -> systemdb.Appended:
            if not spend:
                return append()
            with transaction.atomic():  # the tenant's daily spend counts it with its entry, once
                appended = append()
                for connector, amount in spend.items():
                    spending.charge(tenant=self.tenant, connector=connector, amount=amount)
                return appended

        if connection.in_atomic_block:
            appended = write()
        else:
            appended = self.durably(write, kind=kind, name=name, recorded=systemdb.Appended)
        if appended.seq <= self.last_seq:
            self._journal_went_back(appended.seq)
        if appended.paused:
            self.pause_requested = True
        self._steps_used += steps
        self._cost_used += cost

        self.last_seq = appended.seq
        self.written.append((appended.seq, kind, name))
        return appended.seq

    def _journal_went_back(self, seq: int) -> NoReturn:
        """Our entry was numbered ``seq``, at or below one the database had acknowledged
        (``last_seq``): what we wrote from ``seq`` on is gone from the database we reach now.
        Stop the run (``JournalGap``); the engine records the gap (``sagas.gaps``)."""
        in_transaction = connection.in_atomic_block  # the entry just written goes with the rollback
        lost = [{"seq": s, "kind": k, "name": n} for s, k, n in self.written if s >= seq]
        acknowledged = self.last_seq
        self.last_seq = seq - 1 if in_transaction else seq
        self.written = [w for w in self.written if w[0] < seq]
        raise JournalGap(
            f"the journal went back in time: this worker's entries {seq} to {acknowledged}, acknowledged by the "
            f"database, are missing from the database it reaches now (a failover to a standby that had not "
            f"received them); every effect in the gap is UNKNOWN until a person settles it",
            lost_from=seq, lost_to=acknowledged, lost=lost, worker=self.worker_id,
        )

    def intent_recorded(self, effect: Any) -> None:
        """Keep what it takes to record ``effect`` again (``ledger.journal.Journal``)."""
        self.intents[effect.idempotency_key] = {
            "kind": effect.kind, "step_name": effect.step_name, "connector": effect.connector,
            "request_payload": effect.request_payload, "payload_hash": effect.payload_hash,
            "flow_key": effect.flow_key,
        }

    def durably(self, write: Callable[[], T], *, kind: str, name: str, recorded: Callable[[int], T]) -> T:
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
        # What the database had acknowledged before the write: entries ``write()`` appends inside
        # its transaction count from the moment they are written, but a commit that fails takes
        # them back. The retry looks for its entry after these, and is numbered again from here
        # (not a journal gone back in time: ``_journal_went_back``).
        acknowledged, written = self.last_seq, len(self.written)
        while True:
            try:
                if retrying:
                    seq = systemdb.find_own_entry(
                        self.run_id, after_seq=self.last_seq, kind=kind, name=name, worker=self.worker_id
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
                self.last_seq = acknowledged
                del self.written[written:]
                note_failure(exc, doing=f"recording {kind} {name!r} of run {self.run_id}")
                if time.monotonic() >= self.lease_until:
                    raise StorageUnavailable(
                        f"could not record {kind} {name!r} before the lease ran out: {type(exc).__name__}: {exc}"
                    ) from exc
                retrying = True
                backoff.sleep(until=self.lease_until)

    def check_fence(self) -> None:
        """Inside a transaction: hold the run's row (FOR SHARE) if our fence is current, else LeaseLost."""
        systemdb.check_fence(self.run_id, fence=self._run.fence)
