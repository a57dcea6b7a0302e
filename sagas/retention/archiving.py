"""Retention: finished runs older than their workflow's retention are archived, then deleted.

A run is *due* when it is terminal (COMPLETED, FAILED, CANCELLED, COMPENSATED), finished
longer ago than its retention (``@workflow(retention=...)`` of the newest registered version
of its name, else the ``SAGAS_RETENTION_DAYS`` setting; an unregistered workflow gets the
setting), and none of its effects has an open outcome (IN_PROGRESS, UNKNOWN: those still
need the reconciler or a person, so the run waits until they are settled).

``archive_due`` archives every due run, batch by batch. One batch is one transaction:

1. select up to ``batch_size`` due runs, oldest finish first, ``FOR UPDATE SKIP LOCKED`` (two
   archivers never take the same run, and neither waits for the other);
2. write their lines (run, journal, effects, approvals, compensation plan and items:
   ``sagas.retention.store``) as one gzip member per UTC day of their finish, durably
   (``ArchiveStore.append`` returns after fsync);
3. record an ``ArchivedRun`` per run (file, member offset and length), index their settled
   effect keys for ``SAGAS_EFFECT_KEY_DAYS`` (``ledger.keyindex``), delete the runs through
   ``sagas_archive_delete`` (the one path the journal's trigger lets delete: migration 0012),
   and send ``runs_archived`` (the console writes the batch's audit entry in it);
4. commit.

So a failure anywhere before the commit (disk full, PostgreSQL gone, a crash) deletes
nothing: the runs stay and the next pass archives them again. A member written by a batch
that then failed stays in the file as duplicate lines; ``ArchivedRun`` says which member is a
run's. Not guaranteed: that a file is never written twice for one run.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.dispatch import Signal
from django.utils import timezone

from core.direct import session_advisory_lock
from ledger.keyindex import keys_keep, keys_purge
from sagas.models import TERMINAL_STATUSES, ArchivedRun
from sagas.retention.store import ArchiveStore, member_bytes, store_for
from sagas.versions import registry

log = logging.getLogger("sagas.retention.archiving")

# Sent inside each batch's transaction, after its runs are deleted: ``batch`` (an
# ``ArchivedBatch``). A receiver that raises rolls the batch back (nothing is deleted):
# the console's audit entry of the batch is written here, so it commits with the delete.
runs_archived = Signal()

ARCHIVE_LOCK_ID = 7_246_551_002  # session advisory lock: one scheduled archiver at a time
_OPEN_EFFECTS = ["IN_PROGRESS", "UNKNOWN"]


@dataclass
class ArchiveReport:
    runs: int = 0
    journal_entries: int = 0
    effects: int = 0
    batches: int = 0
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        return (f"archived {self.runs} run(s), {self.journal_entries} journal entries, {self.effects} effect(s) "
                f"in {self.batches} batch(es), {self.seconds:.1f}s; files: {', '.join(self.files) or 'none'}")

    def add(self, other: ArchiveReport) -> None:
        """Count ``other``'s pass in this one (a caller archiving in several passes)."""
        self.runs += other.runs
        self.journal_entries += other.journal_entries
        self.effects += other.effects
        self.batches += other.batches
        self.files += [f for f in other.files if f not in self.files]
        self.seconds += other.seconds


@dataclass(frozen=True)
class ArchivedBatch:
    """What one batch archived (the audit entry's content)."""

    id: uuid.UUID
    run_ids: list[str]
    tenants: list[str]
    journal_entries: int
    effects: int
    files: list[str]
    first_finished_at: datetime | None
    last_finished_at: datetime | None


@dataclass(frozen=True)
class _Group:
    """Runs due under one age: ``names`` only, or every name but ``excluded``."""

    age: timedelta
    names: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()


def default_retention() -> timedelta:
    return timedelta(days=settings.SAGAS_RETENTION_DAYS)


def retention_for(workflow_name: str) -> timedelta:
    """A workflow's retention: its newest registered version's ``retention``, else the setting."""
    versions = [d for d in registry.all_definitions() if d.name == workflow_name]
    if versions and versions[-1].retention is not None:
        return versions[-1].retention
    return default_retention()


def _groups(older_than: timedelta | None) -> list[_Group]:
    if older_than is not None:
        return [_Group(age=older_than)]
    ages: dict[timedelta, list[str]] = defaultdict(list)
    names = sorted({d.name for d in registry.all_definitions()})
    explicit = []
    for name in names:
        age = retention_for(name)
        if age != default_retention():
            ages[age].append(name)
            explicit.append(name)
    return [_Group(age=age, names=tuple(n)) for age, n in sorted(ages.items())] + [
        _Group(age=default_retention(), excluded=tuple(explicit))
    ]


_DUE_SQL = """
SELECT r.id, r.workflow_name, r.version, r.tenant, r.business_key, r.status, r.created_at, r.finished_at
  FROM sagas_workflowrun r
 WHERE r.status = ANY(%(terminal)s)
   AND r.finished_at < %(cutoff)s
   AND {names}
   AND NOT EXISTS (SELECT 1 FROM ledger_effectrecord e WHERE e.run_id = r.id AND e.status = ANY(%(open)s))
   AND (r.parent_run IS NULL OR r.detached OR NOT EXISTS ({ancestor_in_flight}))
 ORDER BY r.finished_at
 LIMIT %(limit)s
   FOR UPDATE OF r SKIP LOCKED
"""


# A child run (sagas.children) is kept while a run above it is in flight: that run's compensation
# may still have to undo it. Its parents are followed up the tree (a few levels in practice).
_ANCESTOR_IN_FLIGHT = """
WITH RECURSIVE up(id, depth) AS (
    SELECT r.parent_run, 1
    UNION ALL
    SELECT p.parent_run, up.depth + 1 FROM sagas_workflowrun p JOIN up ON p.id = up.id
     WHERE p.parent_run IS NOT NULL AND NOT p.detached AND up.depth < 100
)
SELECT 1 FROM up JOIN sagas_workflowrun a ON a.id = up.id WHERE NOT a.status = ANY(%(terminal)s)
"""


def _due(group: _Group, *, now: datetime, limit: int) -> list[tuple[Any, ...]]:
    if group.names:
        names = "r.workflow_name = ANY(%(names)s)"
    elif group.excluded:
        names = "NOT (r.workflow_name = ANY(%(names)s))"
    else:
        names = "true"
    with connection.cursor() as cur:
        cur.execute(_DUE_SQL.format(names=names, ancestor_in_flight=_ANCESTOR_IN_FLIGHT), {
            "terminal": sorted(TERMINAL_STATUSES), "cutoff": now - group.age, "open": _OPEN_EFFECTS,
            "names": list(group.names or group.excluded), "limit": limit,
        })
        return cur.fetchall()


def due_count(*, now: datetime | None = None, older_than: timedelta | None = None) -> int:
    """How many runs are due now (for ``sagas_archive --dry-run``); locks nothing."""
    now = now or timezone.now()
    total = 0
    with connection.cursor() as cur:
        for group in _groups(older_than):
            names = ("r.workflow_name = ANY(%(names)s)" if group.names else
                     "NOT (r.workflow_name = ANY(%(names)s))" if group.excluded else "true")
            sql = _DUE_SQL.format(names=names, ancestor_in_flight=_ANCESTOR_IN_FLIGHT).split(" ORDER BY")[0]
            cur.execute(f"SELECT count(*) FROM ({sql}) AS due", {
                "terminal": sorted(TERMINAL_STATUSES), "cutoff": now - group.age, "open": _OPEN_EFFECTS,
                "names": list(group.names or group.excluded),
            })
            total += cur.fetchone()[0]
    return total


# Each table's rows as JSON lines, PostgreSQL's own rendering of the row (row_to_json), typed.
_LINES_SQL = [
    """SELECT id, '{"type":"run","run_id":"' || id || '",' || substr(row_to_json(t)::text, 2)
         FROM sagas_workflowrun t WHERE id = ANY(%s::uuid[])""",
    """SELECT run_id, '{"type":"journal",' || substr(row_to_json(t)::text, 2)
         FROM sagas_journalentry t WHERE run_id = ANY(%s::uuid[]) ORDER BY run_id, seq""",
    """SELECT run_id, '{"type":"effect",' || substr(row_to_json(t)::text, 2)
         FROM ledger_effectrecord t WHERE run_id = ANY(%s::uuid[]) ORDER BY run_id, id""",
    """SELECT run_id, '{"type":"approval",' || substr(row_to_json(t)::text, 2)
         FROM sagas_approvalrequest t WHERE run_id = ANY(%s::uuid[]) ORDER BY run_id, id""",
    """SELECT run_id, '{"type":"compensation_plan",' || substr(row_to_json(t)::text, 2)
         FROM sagas_compensationplan t WHERE run_id = ANY(%s::uuid[])""",
    """SELECT p.run_id, '{"type":"compensation_item","run_id":"' || p.run_id || '",' || substr(row_to_json(t)::text, 2)
         FROM sagas_compensationitem t JOIN sagas_compensationplan p ON p.id = t.plan_id
        WHERE p.run_id = ANY(%s::uuid[]) ORDER BY p.run_id, t.position""",
]


# The ArchivedRun rows of one member's runs, from the runs themselves (one statement).
_INDEX_SQL = """
INSERT INTO sagas_archivedrun (run_id, workflow_name, version, tenant, business_key, status, created_at, finished_at,
                               archived_at, location, "offset", length, batch)
SELECT id, workflow_name, version, tenant, business_key, status, created_at, finished_at, %s, %s, %s, %s, %s
  FROM sagas_workflowrun WHERE id = ANY(%s::uuid[])
"""


def _lines(run_ids: list[str]) -> dict[str, list[str]]:
    """Every archived line of ``run_ids``, by run, in file order."""
    lines: dict[str, list[str]] = defaultdict(list)
    with connection.cursor() as cur:
        for sql in _LINES_SQL:
            cur.execute(sql, [run_ids])
            for run_id, line in cur.fetchall():
                lines[str(run_id)].append(line)
    return lines


def _day(finished_at: datetime | None) -> date:
    return (finished_at or timezone.now()).astimezone(UTC).date()


def archive_batch(*, store: ArchiveStore, now: datetime, batch_size: int, groups: list[_Group]) -> ArchivedBatch | None:
    """Archive and delete one batch of due runs in one transaction; None when none is due."""
    with transaction.atomic():
        rows: list[tuple[Any, ...]] = []
        while groups and not rows:
            rows = _due(groups[0], now=now, limit=batch_size)
            if not rows:
                groups.pop(0)  # this age has nothing left; the caller's list shrinks with it
        if not rows:
            return None
        batch_id, archived_at = uuid.uuid4(), timezone.now()
        run_ids = [str(row[0]) for row in rows]
        lines = _lines(run_ids)
        by_day: dict[date, list[tuple[Any, ...]]] = defaultdict(list)
        for row in rows:
            by_day[_day(row[7])].append(row)
        files = []
        for day, day_rows in sorted(by_day.items()):
            member = member_bytes(line for row in day_rows for line in lines[str(row[0])])
            location, offset = store.append(day, member)
            files.append(location)
            with connection.cursor() as cur:
                cur.execute(_INDEX_SQL, [archived_at, location, offset, len(member), batch_id,
                                         [str(row[0]) for row in day_rows]])
        keys_keep(run_ids=run_ids, expires_at=archived_at + timedelta(days=settings.SAGAS_EFFECT_KEY_DAYS))
        with connection.cursor() as cur:
            cur.execute("SELECT runs, journal_entries, effects FROM sagas_archive_delete(%s::uuid[])", [run_ids])
            deleted, entries, effects = cur.fetchone()
        if deleted != len(run_ids):  # the rows are locked: only a bug gets here
            raise RuntimeError(f"archive batch {batch_id}: deleted {deleted} of {len(run_ids)} runs; rolled back")
        finished = [row[7] for row in rows if row[7] is not None]
        batch = ArchivedBatch(
            id=batch_id, run_ids=sorted(run_ids), tenants=sorted({row[3] for row in rows}), journal_entries=entries,
            effects=effects, files=files, first_finished_at=min(finished, default=None),
            last_finished_at=max(finished, default=None),
        )
        runs_archived.send(sender=ArchivedRun, batch=batch)
    return batch


def archive_due(
    *,
    now: datetime | None = None,
    batch_size: int = 500,
    max_batches: int | None = None,
    pause: float = 0.0,
    writer: ArchiveStore | None = None,
    older_than: timedelta | None = None,
    stop: threading.Event | None = None,
) -> ArchiveReport:
    """Archive and delete every due run (see the module docstring), ``batch_size`` runs per
    transaction, at most ``max_batches`` batches, sleeping ``pause`` seconds between two
    batches (so a busy worker keeps its throughput). ``now``: the time ages are counted to
    (default: now). ``writer``: the store (default: ``SAGAS_ARCHIVE_URL``'s). ``older_than``:
    one age for every workflow instead of their retention. ``stop``: set, it ends the pass
    after the current batch. Raises what a batch raised; earlier batches stay committed."""
    started = time.monotonic()
    now = now or timezone.now()
    store = writer or store_for()
    groups = _groups(older_than)
    report = ArchiveReport()
    while max_batches is None or report.batches < max_batches:
        if stop is not None and stop.is_set():
            break
        batch = archive_batch(store=store, now=now, batch_size=batch_size, groups=groups)
        if batch is None:
            break
        report.batches += 1
        report.runs += len(batch.run_ids)
        report.journal_entries += batch.journal_entries
        report.effects += batch.effects
        report.files += [f for f in batch.files if f not in report.files]
        if pause:
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)
    report.seconds = time.monotonic() - started
    return report


def try_archive_locked(*, stop: threading.Event | None = None) -> ArchiveReport | None:
    """One scheduled pass unless another process runs one (session advisory lock): archive
    what is due with the settings' batch size and pause, then purge expired effect keys."""
    # The lock is a session's: behind a transaction pooler, on a direct connection (core.direct).
    with session_advisory_lock(ARCHIVE_LOCK_ID) as taken:
        if not taken:
            return None
        report = archive_due(batch_size=settings.SAGAS_ARCHIVE_BATCH, pause=settings.SAGAS_ARCHIVE_PAUSE, stop=stop)
        while keys_purge() and not (stop is not None and stop.is_set()):
            pass
        return report


class ArchiveThread(threading.Thread):
    """A worker's scheduled archiver: a pass every ``SAGAS_ARCHIVE_INTERVAL`` seconds (the
    first one an interval after start), in a thread of its own so that a long pass never
    delays the worker's registry beat and sweep. Ends with ``stop`` (after its batch)."""

    def __init__(self, *, stop: threading.Event) -> None:
        super().__init__(name="sagas-archive", daemon=True)
        self.stop = stop
        self.interval = settings.SAGAS_ARCHIVE_INTERVAL

    def run(self) -> None:
        if not self.interval:
            return
        try:
            while not self.stop.wait(self.interval):
                try:
                    report = try_archive_locked(stop=self.stop)
                    if report is not None and report.runs:
                        log.info("retention: %s", report)
                except Exception:
                    log.exception(
                        "archive pass failed; nothing of its failed batch was deleted; retrying next interval"
                    )
                    connection.close()
        finally:
            connection.close()
