"""Reads for the workers page: the engine's worker registry (``sagas_workerprocess``, the table
``sagas.workers()`` reads), what each worker carries and holds now, and the workflow versions
that runs wait on but no live worker carries (stranded).

Workers, and the versions they carry, are processes and code, the same for every tenant, and
shown to everyone; the runs (held now, waiting on a stranded version) are listed and counted
within the user's tenants (operators/selectors/tenancy.py).

Bounded whatever the registry holds: every live worker, the silent ones (no beat for the
liveness window, never stopped: killed, hung or cut off) of the last ``SILENT_WINDOW``, and the
ones that stopped cleanly in the last ``STOPPED_WINDOW``. The registry keeps a row per worker
name forever (``host:pid`` unless named), so older ones are only counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from core.storage import is_redis_error
from operators.selectors.tenancy import User, scope_runs, tenants_of
from sagas.integration import in_flight_counts, redis_connection
from sagas.models import LEASED_STATUSES, RunStatus, WorkerProcess, WorkflowRun, WorkflowVersion
from sagas.selectors import worker_liveness

SILENT_WINDOW = timedelta(days=1)
STOPPED_WINDOW = timedelta(hours=1)
SHOWN_PER_STATE = 50
HELD_SHOWN = 20  # runs listed under one worker; the rest are counted
HELD_SCANNED = 2000  # leased runs read at most (each worker holds at most its concurrency)
# Statuses whose runs need their workflow's code on a live worker. COMPENSATING needs none:
# compensations go to the one queue every worker reads.
NEEDS_CODE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION)

LIVE, SILENT, STOPPED = "live", "silent", "stopped"


@dataclass
class CarriedVersion:
    name: str
    version: int
    hashes: list[str] = field(default_factory=list)  # every hash it accepts: its own, and a legacy one
    current: str = ""  # its own (the one registered in WorkflowVersion); the first, if none is


@dataclass
class HeldRun:
    run: WorkflowRun
    lease_expired: bool  # the worker went away holding it; the sweeper hands it to another worker


@dataclass
class WorkerRow:
    name: str
    hostname: str
    pid: int
    state: str  # LIVE, SILENT, STOPPED
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    versions: list[CarriedVersion]
    concurrency: int | None  # threads taking jobs, from RQ's registry; None: not known (Redis away, none left)
    held: list[HeldRun] = field(default_factory=list)
    held_count: int = 0

    @property
    def held_more(self) -> int:
        return self.held_count - len(self.held)


@dataclass
class StrandedVersion:
    """A (workflow, version, hash) with runs that need its code while no live worker carries it."""

    name: str
    version: int
    definition_hash: str
    runs: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    oldest: datetime | None = None  # when the oldest of these runs was created


@dataclass
class WorkersPage:
    live: list[WorkerRow]
    silent: list[WorkerRow]
    stopped: list[WorkerRow]
    not_listed: int  # registry rows older than the windows
    stranded: list[StrandedVersion]
    liveness_seconds: int


def _versions(definitions: Iterable[Any]) -> list[CarriedVersion]:
    """The registry's ``[{name, version, hash}]`` (a version that also accepts its runs' legacy
    hash is listed twice) grouped by (name, version); malformed items are skipped, not fatal."""
    found: dict[tuple[str, int], CarriedVersion] = {}
    for d in definitions:
        try:
            name, version, h = str(d["name"]), int(d["version"]), str(d["hash"])
        except (KeyError, TypeError, ValueError):
            continue
        found.setdefault((name, version), CarriedVersion(name=name, version=version)).hashes.append(h)
    return sorted(found.values(), key=lambda v: (v.name, -v.version))


def _mark_current(rows: list[WorkerRow]) -> None:
    """Each carried version's own hash: the one a worker registered in ``WorkflowVersion`` (a
    legacy hash is accepted, never registered)."""
    carried = [v for row in rows for v in row.versions]
    registered = set(WorkflowVersion.objects.filter(definition_hash__in={h for v in carried for h in v.hashes})
                     .values_list("definition_hash", flat=True))
    for v in carried:
        v.current = next((h for h in v.hashes if h in registered), v.hashes[0])


def rq_threads() -> dict[str, int] | None:
    """How many RQ workers each worker process runs (its ``--concurrency``: one per thread, named
    ``<name>/<i>``, or one named ``<name>``), from RQ's own registry in Redis; None when Redis
    does not answer. RQ drops a registration some minutes after its last heartbeat."""
    from rq import Worker

    try:
        names = [w.name for w in Worker.all(connection=redis_connection())]
    except Exception as exc:
        if is_redis_error(exc):
            return None
        raise
    counts: dict[str, int] = {}
    for name in names:
        base, _, index = name.rpartition("/")
        key = base if base and index.isdigit() else name
        counts[key] = counts.get(key, 0) + 1
    return counts


def _owner(lease_owner: str, names: set[str]) -> str | None:
    """The worker a lease names: the process's own name, or one of its threads' (``<name>/<i>``)."""
    if lease_owner in names:
        return lease_owner
    base, _, index = lease_owner.rpartition("/")
    return base if base in names and index.isdigit() else None


def _attach_held(rows: list[WorkerRow], user: User, now: datetime) -> None:
    by_name = {row.name: row for row in rows}
    leased = (
        scope_runs(WorkflowRun.objects.filter(status__in=LEASED_STATUSES).exclude(lease_owner=""), user)
        .order_by("-lease_expires_at", "id")[:HELD_SCANNED]
    )
    names = set(by_name)
    for run in leased:
        owner = _owner(run.lease_owner, names)
        if owner is None:
            continue
        row = by_name[owner]
        expired = run.lease_expires_at is None or run.lease_expires_at < now
        if expired and row.state == LIVE:
            continue  # a live worker no longer holds it (it lost the lease; another claim will follow)
        row.held_count += 1
        if len(row.held) < HELD_SHOWN:
            row.held.append(HeldRun(run=run, lease_expired=expired))


def _row(process: WorkerProcess, state: str, threads: dict[str, int] | None) -> WorkerRow:
    return WorkerRow(
        name=process.name, hostname=process.hostname, pid=process.pid, state=state,
        started_at=process.started_at, last_seen_at=process.last_seen_at, stopped_at=process.stopped_at,
        versions=_versions(process.definitions or []),
        concurrency=None if threads is None or state != LIVE else threads.get(process.name),
    )


def versions_stranded(*, user: User, live_hashes: set[str]) -> list[StrandedVersion]:
    """Every (workflow, version, hash) with runs of ``user``'s tenants that need its code
    (PENDING, RUNNING, WAITING, NEEDS_ATTENTION) while no live worker carries that hash, most
    runs first. The numbers come from the counts kept as runs change (``in_flight_counts``:
    nothing is grouped here), the oldest run of each from one probe of the ``run_in_flight_hash``
    index per stranded version."""
    tenants = tenants_of(user)
    groups: dict[tuple[str, int, str], StrandedVersion] = {}
    for (name, version, h, status), n in in_flight_counts(tenants=tenants).items():
        if h in live_hashes:
            continue
        group = groups.setdefault((name, version, h), StrandedVersion(name=name, version=version, definition_hash=h))
        group.runs += n
        group.by_status[status] = group.by_status.get(status, 0) + n
    if groups:
        keys = list(groups)
        table = connection.ops.quote_name(WorkflowRun._meta.db_table)
        in_tenants = "" if tenants is None else "AND r.tenant = ANY(%s::varchar[])"
        with connection.cursor() as cur:
            cur.execute(
                f"""SELECT k.name, k.version, k.hash,
                           (SELECT min(r.created_at) FROM {table} r
                             WHERE r.definition_hash = k.hash AND r.status = ANY(%s::varchar[])
                               AND r.workflow_name = k.name AND r.version = k.version {in_tenants})
                      FROM unnest(%s::varchar[], %s::int[], %s::varchar[]) AS k(name, version, hash)""",
                [list(NEEDS_CODE), *([] if tenants is None else [tenants]),
                 [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]],
            )
            for name, version, h, oldest in cur.fetchall():
                groups[(name, version, h)].oldest = oldest
    return sorted(groups.values(), key=lambda g: (-g.runs, g.name, -g.version))


def workers_page(*, user: User) -> WorkersPage:
    """Everything the workers page shows (see the module's docstring for what is listed)."""
    now = timezone.now()
    liveness = worker_liveness()
    cutoff = now - liveness
    live_q = Q(stopped_at__isnull=True, last_seen_at__gte=cutoff)
    silent_q = Q(stopped_at__isnull=True, last_seen_at__lt=cutoff, last_seen_at__gte=now - SILENT_WINDOW)
    stopped_q = Q(stopped_at__gte=now - STOPPED_WINDOW)
    threads = rq_threads()
    live = [_row(p, LIVE, threads) for p in WorkerProcess.objects.filter(live_q).order_by("name")]
    silent = [_row(p, SILENT, threads)
              for p in WorkerProcess.objects.filter(silent_q).order_by("-last_seen_at", "name")[:SHOWN_PER_STATE]]
    stopped = [_row(p, STOPPED, threads)
               for p in WorkerProcess.objects.filter(stopped_q).order_by("-stopped_at", "name")[:SHOWN_PER_STATE]]
    not_listed = WorkerProcess.objects.exclude(live_q | silent_q | stopped_q).count()
    _attach_held(live + silent + stopped, user, now)
    _mark_current(live + silent + stopped)
    live_hashes = {h for row in live for v in row.versions for h in v.hashes}
    return WorkersPage(
        live=live, silent=silent, stopped=stopped, not_listed=not_listed,
        stranded=versions_stranded(user=user, live_hashes=live_hashes),
        liveness_seconds=int(liveness.total_seconds()),
    )
