"""The sweeper: finds work that no worker will otherwise pick up, from PostgreSQL.

PostgreSQL is the truth; Redis only carries wake-ups. One pass:

* enqueues runs whose lease expired (their worker died or hung): ``expired``;
* enqueues PENDING runs, and COMPENSATING runs that no worker holds, with no
  queued wake-up (lost to a Redis flush or restart, or a crash between commit
  and enqueue): ``orphaned``;
* parks runs that no live worker has the code for, so they are never silently
  stuck in a queue nobody reads (NEEDS_ATTENTION, ``version_mismatch``):
  ``parked``. Never a COMPENSATING run: it needs connectors, not workflow code,
  and goes to the compensation queue that every worker reads;
* resumes runs parked that way once a live worker has their code again, runs parked
  for UNKNOWN effects that have all been settled since (an answer that reached a worker
  after it lost the run), for an escalated approval no longer open, or for a budget that
  has room again: ``resumed``. No run stays parked for a reason that no longer holds;
* wakes WAITING runs whose timer or deadline is due: ``woken``;
* fires the schedules' ticks that are due, and the buffered ones whose previous run finished
  (``sagas.schedules.firing``): ``scheduled`` (runs started);
* lets calls held by flow control go where there is capacity (``ledger.flow.pump``, which the
  workers also run more often): ``released``;
* reports child runs that ended to parents that did not hear of it, and cancels attached
  children still in flight under a parent that ended (a process died between the two;
  ``sagas.children``): ``children``;
* leaves paused runs alone (``sagas.pausing``): resuming them wakes them;
* re-queries UNKNOWN effects that have a lookup (the ledger's reconciler) and
  wakes their runs when the answer is conclusive: ``reconciled``;
* folds the runs' count deltas into their totals (``sagas.store.counts``).

Then it sends ``events.swept`` with its report, for listeners that catch up from PostgreSQL
(the console's notifications).

Enqueueing twice is harmless (claims are atomic), so the sweeper needs no lock
for correctness; workers take a PostgreSQL advisory lock only to avoid sweeping
in parallel for nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from core.direct import session_advisory_lock
from ledger.flow import pump
from ledger.reconcile import reconcile_due
from sagas import events, resolutions, selectors, services, waits
from sagas.models import LEASED_STATUSES, RunStatus
from sagas.runtime import queue
from sagas.schedules import firing
from sagas.store import counts
from sagas.store.systemdb import PAUSED

log = logging.getLogger("sagas.runtime.recovery")

SWEEP_LOCK_ID = 0x5A6A_0001
BATCH = 1000


@dataclass
class SweepReport:
    expired: int = 0
    orphaned: int = 0
    parked: int = 0
    resumed: int = 0
    reconciled: int = 0
    woken: int = 0
    released: int = 0
    scheduled: int = 0
    children: int = 0

    def __str__(self) -> str:
        return (
            f"expired={self.expired} orphaned={self.orphaned} parked={self.parked} resumed={self.resumed} "
            f"reconciled={self.reconciled} woken={self.woken} released={self.released} "
            f"scheduled={self.scheduled} children={self.children}"
        )

    @property
    def total(self) -> int:
        return (self.expired + self.orphaned + self.parked + self.resumed + self.reconciled + self.woken
                + self.released + self.scheduled + self.children)


def _rows(sql: str, params: list) -> list[tuple[str, str, str, int, int]]:
    """(run id, definition hash, status, priority, fence) of each run the query finds."""
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [(str(run_id), definition_hash, status, priority, fence)
                for run_id, definition_hash, status, priority, fence in cur.fetchall()]


def _route(rows: list[tuple[str, str, str, int, int]], live: set[str] | None, report: SweepReport, *,
           expired: bool = False) -> int:
    """Enqueue each run that has no wake-up marker; park those no live worker can run.

    ``expired``: the runs' leases expired. Such a run is enqueued again unless a sweep already
    did so for this very lease (its marker is ``lease:<fence>``): a wake-up sent before may
    have gone to the worker that lost the run. A host cut off from the network takes the jobs
    Redis was handing it down with it, their markers stay, and trusting them held the run for
    the markers' ``MARKER_TTL_SECONDS`` rather than its lease. At most one extra job per
    expiry; a duplicate is harmless (claims are atomic)."""
    if not rows:
        return 0
    held = queue.queued_markers([run_id for run_id, _, _, _, _ in rows])
    count = 0
    for run_id, definition_hash, status, priority, fence in rows:
        compensating = status == RunStatus.COMPENSATING
        # Redis away (None): nothing can be enqueued now; a later pass finds the run again.
        queued = held is None or (run_id in held and (not expired or held[run_id] == f"lease:{fence}"))
        if live is not None and definition_hash not in live and not compensating:
            if services.run_park_unroutable(run_id=run_id, live_hashes=live):
                report.parked += 1
        elif not queued and queue.enqueue_advance(run_id, definition_hash, compensating=compensating,
                                                  priority=priority, marker=f"lease:{fence}" if expired else "1"):
            count += 1
    return count


def sweep() -> SweepReport:
    report = SweepReport()
    live = selectors.live_definition_hashes()
    grace = max(1.0, 2 * settings.SAGAS_SWEEP_INTERVAL)
    expired = _rows(
        f"""SELECT id, definition_hash, status, priority, fence FROM sagas_workflowrun r
            WHERE status = ANY(%s) AND lease_expires_at < now() AND NOT {PAUSED}
            ORDER BY lease_expires_at LIMIT %s""",
        [sorted(LEASED_STATUSES), BATCH],
    )
    report.expired = _route(expired, live, report, expired=True)
    orphaned = _rows(
        f"""SELECT id, definition_hash, status, priority, fence FROM sagas_workflowrun r
            WHERE (status = %s OR (status = %s AND lease_expires_at IS NULL))
              AND updated_at < now() - make_interval(secs => %s::float8) AND NOT {PAUSED}
            ORDER BY updated_at LIMIT %s""",
        [RunStatus.PENDING, RunStatus.COMPENSATING, grace, BATCH],
    )
    report.orphaned = _route(orphaned, live, report)
    if live:
        report.resumed = len(services.runs_resume_stranded(hashes=live))
    report.resumed += len(resolutions.runs_resume_settled(limit=BATCH))
    report.resumed += len(resolutions.runs_resume_cleared(limit=BATCH))
    report.woken = waits.runs_wake_due()
    report.scheduled = firing.fire_due().started
    report.children = services.children_catch_up(limit=BATCH)
    report.released = pump.pump()  # the worker processes' pump threads do this more often
    reconciled = reconcile_due()
    report.reconciled = reconciled.succeeded + reconciled.not_executed
    counts.fold()
    events.send_swept(report)
    return report


def try_sweep_locked() -> SweepReport | None:
    """A worker's sweep: only if no process is sweeping right now (session advisory lock) and
    none swept within the last sweep interval (``SweepTurn``, taken by one conditional UPDATE),
    so N workers make about one sweep per interval between them instead of N. None when it was
    another's turn. (``sagas_sweep`` sweeps every pass regardless.)"""
    # The lock is a session's: behind a transaction pooler, on a direct connection (core.direct).
    with session_advisory_lock(SWEEP_LOCK_ID) as taken:
        if not taken:
            return None
        with connection.cursor() as cur:
            cur.execute(  # the row is made by the first sweep (and again after a test empties the table)
                """INSERT INTO sagas_sweepturn (id, swept_at) VALUES (1, clock_timestamp())
                   ON CONFLICT (id) DO UPDATE SET swept_at = EXCLUDED.swept_at
                   WHERE sagas_sweepturn.swept_at <= EXCLUDED.swept_at - make_interval(secs => %s::float8)
                   RETURNING 1""",
                [0.9 * settings.SAGAS_SWEEP_INTERVAL],
            )
            if cur.fetchone() is None:
                return None
        return sweep()
