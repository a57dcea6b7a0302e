"""Testing your workflows: crashes, recovery and time, in the test's own process.

Everything here drives the engine's real code path against the real PostgreSQL journal and
ledger: a run is claimed and advanced exactly as a worker does it (``sagas.replay.engine.advance``),
the sweeper's real pass wakes timers and finds expired leases. Only three things are
simulated: where the process dies (``crash_at``), which worker is "next"
(``run_until_idle``'s owner), and what time it is (``frozen_clock``, ``expire_lease``).

Use a transactional database in tests (pytest-django: ``@pytest.mark.django_db(transaction=True)``):
the engine commits, and a heartbeat renews leases on a connection of its own.

A crash test, start to finish::

    from sagas import start
    from sagas.testing import crash_at, expire_lease, run_until_idle

    run = start("checkout", {"order": "o-1"})
    with crash_at("after_dispatch", "charge"):  # the provider was called; nothing recorded
        run_until_idle(run.id)                   # dies at that point, as a worker would
    expire_lease(run.id)                          # the dead worker's lease runs out
    run = run_until_idle(run.id)                  # another worker takes over
    assert provider_calls == 1                    # looked up or UNKNOWN, never charged twice

Crash points (``crash_at``), by where they are:

* ``ctx.step(name)``: ``before_step`` (nothing done), ``after_step`` (the function returned,
  its result not journaled: the step runs again on recovery), ``after_step_record``;
* ``ctx.effect(name)``: ``before_intent``, ``after_intent`` (intent committed, not dispatched),
  ``after_dispatch`` (the connector returned, its outcome not recorded), ``after_outcome``
  (inside the outcome's transaction: it is rolled back);
* the run: ``before_complete``, ``before_continue_as_new``, ``continue_as_new_uncommitted``,
  ``after_continue_as_new`` (name: the workflow's name); ``before_compensation`` (name: the
  compensated step's).

A step's or effect's name is the one the journal shows: ``"charge"``, then ``"charge#2"`` for
its second use in a run.

Time. The engine reads two clocks, so there are two tools:

* Timers (``ctx.sleep``), signal timeouts (``ctx.wait_for``), approval deadlines and the
  sweeper's "is it due" are decided by Django's clock, ``django.utils.timezone.now()``, in the
  process that runs them. ``frozen_clock()`` stops that clock in this process and
  ``advance_clock(delta)`` moves it: no waiting, and every comparison the engine makes sees
  the new time. Moving recorded deadlines instead is not possible: they are in the journal,
  which is append-only.
* Leases are decided by PostgreSQL's clock (``now()`` in the claim), which a test cannot move.
  ``expire_lease(run_id)`` moves the lease's expiry into the past instead: what the database
  would see once the lease ran out.

Caveats: the clock is frozen for the whole process (other threads too), not for worker
processes; rows written while it is frozen carry its time where the engine takes the time from
Python (``updated_at`` of a woken run, for example). ``SimulatedCrash`` is a ``BaseException``
so that workflow code's ``except Exception`` does not swallow it, as nothing swallows a real
crash; code that catches ``BaseException`` would.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from django.db import connection
from django.utils import timezone

from sagas.models import LEASED_STATUSES, RunStatus, WorkflowRun
from sagas.replay import engine
from sagas.runtime import crashpoints, queue, recovery

__all__ = [
    "Clock",
    "Crash",
    "CrashPointNotReached",
    "RunLeased",
    "SimulatedCrash",
    "advance",
    "advance_clock",
    "crash_at",
    "expire_lease",
    "frozen_clock",
    "run_until_idle",
    "sweep_once",
]

POINTS = crashpoints.POINTS
# Statuses a run leaves only by a worker advancing it.
_ADVANCING = frozenset({RunStatus.PENDING, RunStatus.COMPENSATING})
_owners = itertools.count(1)


class SimulatedCrash(BaseException):
    """The engine reached the crash point ``crash_at`` armed: the advance ends here, with
    nothing after the point written and the transaction in flight rolled back."""

    def __init__(self, point: str, name: str) -> None:
        super().__init__(f"simulated crash at {point}:{name}")
        self.point, self.name = point, name


class CrashPointNotReached(AssertionError):
    """A ``crash_at`` block ended without the engine reaching its point: the test did not
    test the crash it names."""


class RunLeased(AssertionError):
    """``run_until_idle`` found the run held by another worker's live lease (after a crash:
    call ``expire_lease`` first, as the real recovery waits for the lease to run out)."""


# --- crashes ------------------------------------------------------------------------------


@dataclass
class Crash:
    """What a ``crash_at`` block saw: ``happened``, and where (``point``, ``name``)."""

    point: str
    name: str | None
    happened: bool = False
    reached: list[tuple[str, str]] = field(default_factory=list)
    exception: SimulatedCrash | None = None


@contextlib.contextmanager
def crash_at(point: str, name: str | None = None, *, required: bool = True) -> Iterator[Crash]:
    """In this block, the first time the engine reaches ``point`` (for ``name``, if given; or
    ``"point:name"`` in one string, as ``SAGAS_CRASH_AT`` takes it) it raises
    ``SimulatedCrash`` instead of going on, which ends the advance the way ``os._exit`` ends a
    worker: the transaction in flight is rolled back and nothing after the point is written.
    The run stays RUNNING under the dead worker's lease (see ``expire_lease``).

    The block swallows that ``SimulatedCrash``, so the code after the crashing call does not
    run, as it would not after a real crash. Leaving the block without a crash raises
    ``CrashPointNotReached`` unless ``required=False``. ``ValueError`` for an unknown point.
    Yields a ``Crash`` (``.happened``, ``.reached``: every point reached, in order)."""
    if name is None and ":" in point:
        point, name = point.split(":", 1)
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; the engine's points are {', '.join(sorted(POINTS))}")
    if crashpoints.in_process_hook is not None:
        raise RuntimeError("crash_at blocks do not nest: one crash per process at a time")
    crash = Crash(point, name)

    def hook(reached: str, reached_name: str) -> None:
        crash.reached.append((reached, reached_name))
        if not crash.happened and reached == point and (name is None or reached_name == name):
            crash.happened, crash.exception = True, SimulatedCrash(reached, reached_name)
            raise crash.exception

    crashpoints.in_process_hook = hook
    try:
        yield crash
    except SimulatedCrash as exc:
        if exc is not crash.exception:
            raise
    finally:
        crashpoints.in_process_hook = None
    if required and not crash.happened:
        raise CrashPointNotReached(
            f"the engine never reached {point}{':' + name if name else ''}; it reached {crash.reached or 'no point'}"
        )


# --- advancing a run ----------------------------------------------------------------------


def _owner(owner: str | None) -> str:
    return owner or f"test-worker-{next(_owners)}"


def advance(run_id: UUID | str, *, owner: str | None = None) -> WorkflowRun:
    """One claim and advance of the run, as one worker's job does it (``sagas.runtime.jobs.advance``:
    the run's wake-up marker in Redis is cleared, then ``sagas.replay.engine.advance``), under ``owner``
    (default: a new name each call, so each call is "another worker"). The job ``start`` put
    in the queue stays there; a worker that takes it later finds nothing to claim.
    Returns the run as stored afterwards; ``run.outcome`` is the engine's ``Outcome``."""
    run, outcome = _advance(run_id, owner)
    run.outcome = outcome  # type: ignore[attr-defined]  # documented: the caller reads it
    return run


def _advance(run_id: UUID | str, owner: str | None) -> tuple[WorkflowRun, engine.Outcome]:
    queue.clear_marker(str(run_id))
    outcome = engine.advance(str(run_id), owner=_owner(owner))
    return WorkflowRun.objects.get(id=run_id), outcome


def run_until_idle(run_id: UUID | str, *, owner: str | None = None, max_advances: int = 100) -> WorkflowRun:
    """Advance the run until no worker has anything to do with it: finished (COMPLETED,
    FAILED, CANCELLED, COMPENSATED), WAITING, or parked for a person (NEEDS_ATTENTION).
    A run handed back PENDING is advanced again, each time as another worker.

    ``RunLeased`` if another worker's lease holds it (after a simulated crash, call
    ``expire_lease`` first). Returns the run as stored (``run.outcome``: the last advance's)."""
    for _ in range(max_advances):
        run, outcome = _advance(run_id, owner)
        run.outcome = outcome  # type: ignore[attr-defined]  # documented: the caller reads it
        if outcome == engine.Outcome.NOT_CLAIMED:
            if run.status in LEASED_STATUSES and run.lease_expires_at is not None:
                raise RunLeased(f"run {run_id} is {run.status}, leased by {run.lease_owner!r} until "
                                f"{run.lease_expires_at:%H:%M:%S}; after a crash, call expire_lease first")
            return run
        if run.status not in _ADVANCING:
            return run
    raise AssertionError(f"run {run_id} is still {run.status} after {max_advances} advances")


def expire_lease(run_id: UUID | str) -> WorkflowRun:
    """Move the run's lease expiry into the past on PostgreSQL's clock: what the database sees
    once a dead worker's lease ran out. The next claim (``run_until_idle``) and the sweeper's
    ``expired`` count then treat it as a worker that died. Returns the run."""
    updated = WorkflowRun.objects.filter(id=run_id, lease_expires_at__isnull=False).update(
        lease_expires_at=_database_now() - timedelta(seconds=1)
    )
    if updated != 1:
        raise AssertionError(f"run {run_id} holds no lease")
    return WorkflowRun.objects.get(id=run_id)


def _database_now() -> datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def sweep_once() -> recovery.SweepReport:
    """One pass of the real sweeper (``sagas.runtime.recovery.sweep``, what ``sagas_sweep`` and every
    worker's background thread run): wakes runs whose timer or deadline is due by Django's clock
    (see ``frozen_clock``), queues runs whose lease expired or whose wake-up was lost, re-asks
    lookups of UNKNOWN effects. Returns its ``SweepReport`` (``.woken``, ``.expired``...)."""
    return recovery.sweep()


# --- time ---------------------------------------------------------------------------------


class Clock:
    """Django's clock in this process while a ``frozen_clock`` block runs: ``now()`` stands
    still until ``advance(delta)`` moves it."""

    def __init__(self, start: datetime) -> None:
        self._now = start

    def now(self) -> datetime:
        """The frozen time (aware, UTC)."""
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock forward by ``delta``; returns the new time."""
        if delta < timedelta(0):
            raise ValueError("the clock only moves forward")
        self._now += delta
        return self._now


_clock: Clock | None = None


@contextlib.contextmanager
def frozen_clock(at: datetime | None = None) -> Iterator[Clock]:
    """Freeze ``django.utils.timezone.now()`` in this process at ``at`` (default: the real
    time now) for the block; ``advance_clock`` (or the yielded ``Clock``'s ``advance``) moves
    it. Timers, signal timeouts, approval deadlines and the sweeper's wake-ups follow it; leases
    do not (PostgreSQL's clock: ``expire_lease``). Restores the real clock on exit."""
    global _clock
    if _clock is not None:
        raise RuntimeError("frozen_clock blocks do not nest")
    start = at or timezone.now()
    if timezone.is_naive(start):
        raise ValueError("frozen_clock needs an aware datetime")
    clock, real = Clock(start), timezone.now
    _clock, timezone.now = clock, clock.now
    try:
        yield clock
    finally:
        _clock, timezone.now = None, real


def advance_clock(delta: timedelta) -> datetime:
    """Move the frozen clock (``frozen_clock``) forward by ``delta``: a timer, a signal's timeout
    or an approval's deadline that falls within it is due at once. Returns the new time."""
    if _clock is None:
        raise RuntimeError("advance_clock needs a frozen_clock block")
    return _clock.advance(delta)
