"""The sweeper: finds work that no worker will otherwise pick up, from PostgreSQL.

PostgreSQL is the truth; Redis only carries wake-ups. One pass enqueues:

* runs whose lease expired (their worker died or hung): ``expired``;
* PENDING runs with no queued wake-up (lost to a Redis flush or restart, or a
  crash between commit and enqueue): ``orphaned``.

Enqueueing twice is harmless (claims are atomic), so the sweeper needs no lock
for correctness; workers take a PostgreSQL advisory lock only to avoid sweeping
in parallel for nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from sagas import queue
from sagas.models import LEASED_STATUSES, RunStatus

log = logging.getLogger("sagas.recovery")

SWEEP_LOCK_ID = 0x5A6A_0001
BATCH = 1000


@dataclass
class SweepReport:
    expired: int = 0
    orphaned: int = 0

    def __str__(self) -> str:
        return f"expired={self.expired} orphaned={self.orphaned}"

    @property
    def total(self) -> int:
        return self.expired + self.orphaned


def _ids(sql: str, params: list) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [str(row[0]) for row in cur.fetchall()]


def _enqueue_unqueued(run_ids: list[str]) -> int:
    """Enqueue each run that has no wake-up marker in Redis."""
    if not run_ids:
        return 0
    held = queue.queued_markers(run_ids)
    count = 0
    for run_id in run_ids:
        if run_id not in held and queue.enqueue_advance(run_id):
            count += 1
    return count


def sweep() -> SweepReport:
    report = SweepReport()
    grace = max(1.0, 2 * settings.SAGAS_SWEEP_INTERVAL)
    expired = _ids(
        """SELECT id FROM sagas_workflowrun
            WHERE status = ANY(%s) AND lease_expires_at < now()
            ORDER BY lease_expires_at LIMIT %s""",
        [sorted(LEASED_STATUSES), BATCH],
    )
    report.expired = _enqueue_unqueued(expired)
    orphaned = _ids(
        """SELECT id FROM sagas_workflowrun
            WHERE status = %s AND updated_at < now() - make_interval(secs => %s::float8)
            ORDER BY updated_at LIMIT %s""",
        [RunStatus.PENDING, grace, BATCH],
    )
    report.orphaned = _enqueue_unqueued(orphaned)
    return report


def try_sweep_locked() -> SweepReport | None:
    """Sweep unless another process is sweeping right now (session advisory lock)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [SWEEP_LOCK_ID])
        if not cur.fetchone()[0]:
            return None
        try:
            return sweep()
        finally:
            cur.execute("SELECT pg_advisory_unlock(%s)", [SWEEP_LOCK_ID])
