"""The engine's hot-path SQL on its system tables (runs and journal).

Every write a worker makes is one statement that checks the run's ``fence`` in its WHERE
clause, and every entry is numbered as ``sagas.store.numbering`` says (the newest seq plus one,
the unique ``(run_id, seq)`` index deciding between writers), so that:

* a pure step costs exactly one commit of one row, its journal entry (autocommit, one
  statement: the run's row is not updated), and the three statements every run makes (the
  claim, a step's append, the finish) go straight through libpq, prepared once per
  connection (``Statement``);
* a worker whose lease was taken over (fence moved on) writes nothing: the INSERT selects
  from nothing, the UPDATE matches no row, and the caller gets ``LeaseLost``;
* the run's counters (``steps_used``, ``cost_used``) and ``last_seq`` catch up with the
  journal at the claim, each lease renewal, the finish or suspend, and each event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from sagas.errors import LeaseLost
from sagas.models import LEASED_STATUSES, RunStatus, sources
from sagas.store.libpq import Statement
from sagas.store.numbering import COUNTED_AND_NEXT, COUNTED_TO_NEWEST, NEXT_SEQ, numbered


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: str
    name: str
    payload: Any


@dataclass(frozen=True)
class ClaimedRun:
    id: str
    workflow_name: str
    version: int
    definition_hash: str
    input: Any
    tenant: str
    business_key: str
    fence: int
    attempts: int
    steps_used: int
    cost_used: Decimal
    max_steps: int | None
    max_cost: Decimal | None
    max_duration_seconds: float | None
    started_at: datetime
    status: str = RunStatus.RUNNING
    last_seq: int = 0  # of the claim's own entry: 2 on a first claim with nothing else journaled
    priority: int = 3


FIRST_CLAIM_SEQ = 2  # a claim numbered 2: the journal is ``started`` and it (``initial_journal``)
PREPARE_AFTER = 5  # psycopg's default


@contextmanager
def cursor() -> Iterator[psycopg.Cursor]:
    """A server-side-binding cursor on Django's connection (same transaction state).

    Django's default psycopg cursor binds parameters client-side and never
    prepares; the hot-path statements here run thousands of times per second,
    so they use server-side binding and are prepared on their ``PREPARE_AFTER``-th use
    on a connection. Django opens connections with psycopg's ``prepare_threshold`` off
    (None: nothing prepared); it is set here, for these cursors (Django's never prepare).

    Errors go through Django's error wrapper: a psycopg error comes out as
    ``django.db.OperationalError`` (etc.), and the connection is flagged so that
    ``close_old_connections()`` drops it if it is dead (without it, workers failed
    every job for minutes after a PostgreSQL restart, until ``CONN_MAX_AGE``).
    """
    db = connections[DEFAULT_DB_ALIAS]  # one thread-local lookup (``connection`` makes one per attribute)
    db.ensure_connection()
    conn = db.connection
    # Behind a transaction pooler nothing is prepared: the next transaction may run on another
    # server connection, where the statement does not exist (PgBouncer 1.18).
    threshold = PREPARE_AFTER if settings.SAGAS_PREPARED_STATEMENTS else None
    if conn.prepare_threshold != threshold:
        conn.prepare_threshold = threshold
    with db.wrap_database_errors, psycopg.Cursor(conn) as cur:
        yield cur


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


_CLAIMABLE = sorted({RunStatus.PENDING, *LEASED_STATUSES})

# Whether the run ``r`` is paused by an operator: its own flag, or a pause of its workflow
# (every version, or its own). Checked at the claim, and returned by every journal append and
# lease renewal, so a worker stops at the next step boundary (``sagas.pausing``).
PAUSED = """(r.paused_at IS NOT NULL OR EXISTS (
    SELECT 1 FROM sagas_workflowpause p
     WHERE p.workflow_name = r.workflow_name AND (p.version IS NULL OR p.version = r.version)))"""

_CLAIM_SQL = f"""
WITH claimed AS (
    UPDATE sagas_workflowrun r
       SET status = CASE WHEN r.status = 'COMPENSATING' THEN 'COMPENSATING' ELSE 'RUNNING' END,
           lease_owner = $2,
           lease_expires_at = now() + make_interval(secs => $3::float8),
           fence = r.fence + 1,
           attempts = r.attempts + 1,
           {COUNTED_AND_NEXT},
           started_at = coalesce(r.started_at, now()),
           updated_at = now()
     WHERE r.id = $1
       AND r.status = ANY($4::text[])
       AND (r.lease_expires_at IS NULL OR r.lease_expires_at < now())
       AND NOT {PAUSED}
 RETURNING r.id, r.workflow_name, r.version, r.definition_hash, r.input, r.tenant, r.business_key, r.fence,
           r.attempts, r.steps_used, r.cost_used, r.max_steps, r.max_cost,
           extract(epoch FROM r.max_duration)::float8, r.started_at, r.last_seq, r.status, r.priority
), entry AS (
    INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
    SELECT id, last_seq, 'claimed', '',
           jsonb_build_object('attempt', attempts, 'fence', fence, 'lease_ttl', $3::float8),
           $2, now()
      FROM claimed
)
SELECT * FROM claimed
"""


def claim(run_id: str, *, owner: str, ttl: float) -> ClaimedRun | None:
    """Atomically take the run if it is claimable and no live lease holds it.

    Returns None when another worker holds it, or it is waiting or finished:
    the caller returns quietly. The claim counts the steps its predecessor journaled past
    ``last_seq`` (a worker that died between renewals), so budgets hold across crashes.
    """
    row = numbered(lambda: _CLAIM.first_row([run_id, owner, repr(float(ttl)), _CLAIMABLE]))
    if row is None:
        return None
    (id_, workflow_name, version, definition_hash, raw_input, tenant, business_key, fence, attempts,
     steps_used, cost_used, max_steps, max_cost, max_duration, started_at, last_seq, status, priority) = row
    return ClaimedRun(
        id=id_,
        workflow_name=workflow_name,
        version=int(version),
        definition_hash=definition_hash,
        input=None if raw_input is None else json.loads(raw_input),
        tenant=tenant,
        business_key=business_key,
        fence=int(fence),
        attempts=int(attempts),
        steps_used=int(steps_used),
        cost_used=Decimal(cost_used),
        max_steps=None if max_steps is None else int(max_steps),
        max_cost=None if max_cost is None else Decimal(max_cost),
        max_duration_seconds=None if max_duration is None else float(max_duration),
        started_at=datetime.fromisoformat(started_at),  # PostgreSQL's ISO text, in the session's UTC
        last_seq=int(last_seq),
        status=status,
        priority=int(priority),
    )


def initial_journal(run: ClaimedRun) -> list[Entry] | None:
    """The journal of a claim numbered ``FIRST_CLAIM_SEQ`` (``started`` and that claim, payloads
    left out: replay reads neither), known without a query; None: the caller loads it."""
    if run.last_seq != FIRST_CLAIM_SEQ:
        return None
    return [Entry(1, "started", "", None), Entry(FIRST_CLAIM_SEQ, "claimed", "", None)]


def load_journal(run_id: str) -> list[Entry]:
    """The whole journal of a run, in one query, oldest first."""
    with cursor() as cur:
        cur.execute(
            "SELECT seq, kind, name, payload FROM sagas_journalentry WHERE run_id = %s ORDER BY seq",
            [run_id],
        )
        rows = cur.fetchall()
    loads = json.loads
    return [Entry(seq, kind, name, loads(p) if isinstance(p, str) else p) for seq, kind, name, p in rows]


def find_own_entry(run_id: str, *, after_seq: int, kind: str, name: str, worker: str) -> int | None:
    """The seq of an entry ``worker`` appended after ``after_seq`` with this kind and name.

    For a write whose commit was ambiguous (the connection died after the statement
    was sent): it may have committed. Appending again would record the step twice.
    """
    with cursor() as cur:
        cur.execute(
            """SELECT seq FROM sagas_journalentry
                WHERE run_id = %s AND seq > %s AND kind = %s AND name = %s AND worker_id = %s
                ORDER BY seq LIMIT 1""",
            [run_id, after_seq, kind, name, worker],
        )
        row = cur.fetchone()
    return row[0] if row else None


_APPEND_SQL = f"""
INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
SELECT r.id, {NEXT_SEQ}, $3, $4, $5::jsonb, $6, now()
  FROM sagas_workflowrun r
 WHERE r.id = $1 AND r.fence = $2
RETURNING seq, (SELECT {PAUSED} FROM sagas_workflowrun r WHERE r.id = $1)
"""


_APPEND = Statement("sagas_append", _APPEND_SQL)
_CLAIM = Statement("sagas_claim", _CLAIM_SQL)


@dataclass(frozen=True)
class Appended:
    """A journal entry written: its ``seq``, and whether the run is paused (``PAUSED``) as of
    that write, so the worker stops at the next step boundary."""

    seq: int
    paused: bool = False


def append(run_id: str, *, fence: int, kind: str, name: str, payload: str, worker: str) -> Appended:
    """Append one journal entry under the caller's fence; one statement, one commit of one row.

    ``payload`` is JSON text. Raises ``LeaseLost`` when the fence moved on. The run's row is
    left alone: its counters catch up at the next renewal, suspend, finish or claim
    (``sagas.store.numbering``). Inside a transaction the run's row is held FOR SHARE first, so the
    entry cannot lose its seq to a claim or an event and abort the caller's transaction.
    """
    params = [run_id, fence, kind, name, payload, worker]
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        check_fence(run_id, fence=fence)
        row = _APPEND.first_row(params)
    else:
        row = numbered(lambda: _APPEND.first_row(params))
    if row is None:
        raise LeaseLost(f"run {run_id}: fence {fence} is stale, {kind} {name!r} not recorded")
    return Appended(int(row[0]), row[1] in (True, "t"))  # PostgreSQL's text on the libpq path, a bool otherwise


_APPEND_EVENT_SQL = f"""
WITH w AS (
    UPDATE sagas_workflowrun r SET updated_at = now(), {COUNTED_AND_NEXT}
     WHERE r.id = %(run)s
 RETURNING r.id, r.last_seq
)
INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
SELECT id, last_seq, %(kind)s, %(name)s, %(payload)s::jsonb, %(worker)s, now() FROM w
RETURNING seq
"""


def append_event(run_id: str, *, kind: str, name: str, payload: str, worker: str) -> int:
    """Append an event written outside a worker's claim (operators, reconciler, sweeper).

    Not fenced: these writers do not hold the run. The UPDATE takes the run's row lock, so
    it serializes with claims, finishes and appends inside a worker's transaction; a lease
    holder's autocommit step may take the seq first, and then it is numbered again
    (``sagas.store.numbering``). It counts the lease holder's steps so far and moves ``last_seq``
    to its own entry. Joins the caller's transaction, if any.
    """
    params = {"run": run_id, "kind": kind, "name": name, "payload": payload, "worker": worker}

    def write() -> tuple[Any, ...] | None:
        with cursor() as cur:
            cur.execute(_APPEND_EVENT_SQL, params)
            return cur.fetchone()

    row = numbered(write)
    if row is None:
        raise LookupError(f"run {run_id} does not exist")
    return row[0]


_HALT_BEHIND_SQL = f"""
WITH w AS (
    UPDATE sagas_workflowrun r
       SET status = 'NEEDS_ATTENTION', status_reason = %(reason)s, error = %(payload)s::jsonb,
           lease_owner = '', lease_expires_at = NULL, wake_at = NULL, fence = %(fence)s + 1,
           updated_at = now(), {COUNTED_AND_NEXT}
     WHERE r.id = %(run)s AND r.fence < %(fence)s AND r.status = ANY(%(statuses)s::text[])
 RETURNING r.id, r.last_seq
)
INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
SELECT id, last_seq, 'halted', '', %(payload)s::jsonb, %(worker)s, now() FROM w
RETURNING seq
"""


def fence_behind(run_id: str, *, fence: int) -> bool:
    """True if the run's fence is below ``fence``, which this worker claimed it with: the claim
    is gone from the database (a failover lost it), not taken over (a takeover moves it on)."""
    with cursor() as cur:
        cur.execute("SELECT fence FROM sagas_workflowrun WHERE id = %s", [run_id])
        row = cur.fetchone()
    return row is not None and int(row[0]) < fence


def halt_behind(run_id: str, *, fence: int, worker: str, reason: str, payload: dict[str, Any]) -> int | None:
    """NEEDS_ATTENTION (``reason``, ``payload`` as the run's error and its ``halted`` entry) for a
    run whose fence is still below ``fence`` (``fence_behind``), fencing out every older claim
    (the fence moves past ``fence``). The entry's seq, or None if the run moved on meanwhile."""
    params = {"run": run_id, "fence": fence, "worker": worker, "reason": reason, "payload": dumps(payload),
              "statuses": sources(RunStatus.NEEDS_ATTENTION)}

    def write() -> tuple[Any, ...] | None:
        with cursor() as cur:
            cur.execute(_HALT_BEHIND_SQL, params)
            return cur.fetchone()

    row = numbered(write)
    return None if row is None else int(row[0])


def check_fence(run_id: str, *, fence: int) -> None:
    """Lock the run row FOR SHARE if ``fence`` is current (a concurrent claim waits for our
    commit); raise ``LeaseLost`` otherwise. Meant to be called inside a transaction."""
    with cursor() as cur:
        cur.execute("SELECT 1 FROM sagas_workflowrun WHERE id = %s AND fence = %s FOR SHARE", [run_id, fence])
        if cur.fetchone() is None:
            raise LeaseLost(f"run {run_id}: fence {fence} is stale")


_RENEW_SQL = f"""
UPDATE sagas_workflowrun r
   SET lease_expires_at = now() + make_interval(secs => %s::float8), {COUNTED_TO_NEWEST}
 WHERE r.id = %s AND r.fence = %s AND r.status IN ('RUNNING', 'COMPENSATING') AND r.lease_owner <> ''
RETURNING {PAUSED}
"""


@dataclass(frozen=True)
class Renewal:
    """A lease renewal: ``held`` (false: the lease was taken over; the renewal is falsy then)
    and whether the run is paused (``PAUSED``) as of the renewal."""

    held: bool
    paused: bool = False

    def __bool__(self) -> bool:
        return self.held


def renew_lease(run_id: str, *, fence: int, ttl: float) -> Renewal:
    """Extend the lease if ``fence`` is current and the run still leased, and count the steps
    journaled since the last count (the console's ``steps_used`` and ``cost_used`` of a running
    run trail by at most this interval). Falsy: the lease was taken over, or the run was
    released (suspended, finished, yielded) under this fence; a renewal that commits just
    after the release leases nothing again, so a woken run is claimable at once."""
    with cursor() as cur:
        cur.execute(_RENEW_SQL, [ttl, run_id, fence])
        row = cur.fetchone()
    return Renewal(held=row is not None, paused=bool(row and row[0]))


# "Nothing journaled since the caller's view" is checked on the row (``last_seq``, which every
# event writer moves under the row lock, and which PostgreSQL re-checks after waiting for one)
# and on the journal (in the statement's snapshot: a writer that forgot to move last_seq).
_UNSEEN = "r.last_seq <= {v} AND NOT EXISTS (SELECT 1 FROM sagas_journalentry x WHERE x.run_id = r.id AND x.seq > {v})"
_UNSEEN_FINISH = _UNSEEN.format(v="$10::bigint")
_UNSEEN_SUSPEND = _UNSEEN.format(v="%(expect)s")

_FINISH_SQL = f"""
WITH w AS (
    UPDATE sagas_workflowrun r
       SET status = $3,
           status_reason = $4,
           result = $5::jsonb,
           error = $6::jsonb,
           wake_at = $7::timestamptz,
           lease_owner = '',
           lease_expires_at = NULL,
           finished_at = CASE WHEN $8::boolean THEN now() ELSE NULL END,
           updated_at = now(),
           {COUNTED_AND_NEXT}
     WHERE r.id = $1 AND r.fence = $2 AND r.status = ANY($9::text[])
       AND ($10::bigint IS NULL OR ({_UNSEEN_FINISH}))
 RETURNING r.id, r.last_seq
)
INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
SELECT id, last_seq, $11, '', $12::jsonb, $13, now() FROM w
RETURNING seq
"""
_FINISH = Statement("sagas_finish", _FINISH_SQL)


def finish(
    run_id: str,
    *,
    fence: int,
    status: str,
    kind: str,
    worker: str,
    payload: dict[str, Any],
    reason: str = "",
    result: Any = None,
    error: dict[str, Any] | None = None,
    wake_at: datetime | None = None,
    terminal: bool = False,
    expect_last_seq: int | None = None,
) -> int | None:
    """Release the lease and move the run to ``status``, journaling ``kind``; one commit.

    The status guard comes from the transition table. Raises ``LeaseLost`` when
    the fence moved on (another worker or an operator took the run). With
    ``expect_last_seq``, only if nothing was journaled since the caller's view;
    otherwise (fence still current) None: a decision or resolution arrived, and the
    caller replays with it instead of parking the run on stale knowledge.
    """
    params = [
        run_id, fence, status, reason,
        dumps(result) if result is not None else None,
        dumps(error) if error is not None else None,
        wake_at, terminal, sources(status),
        expect_last_seq, kind, dumps(payload), worker,
    ]
    row = numbered(lambda: _FINISH.first_row(params))
    if row is None and expect_last_seq is not None:
        with cursor() as cur:
            cur.execute("SELECT fence FROM sagas_workflowrun WHERE id = %s", [run_id])
            current = cur.fetchone()
        if current is not None and current[0] == fence:
            return None  # something was journaled since the caller's view: it replays
    if row is None:
        raise LeaseLost(f"run {run_id}: fence {fence} is stale, could not move it to {status}")
    return int(row[0])


_SUSPEND_SQL = f"""
WITH w AS (
    UPDATE sagas_workflowrun r
       SET status = 'WAITING', status_reason = %(reason)s, wake_at = %(wake_at)s, lease_owner = '',
           lease_expires_at = NULL, updated_at = now(), {COUNTED_AND_NEXT}
     WHERE r.id = %(run)s AND r.fence = %(fence)s AND r.status = 'RUNNING'
       AND {_UNSEEN_SUSPEND}
 RETURNING r.id, r.last_seq
)
INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
SELECT id, last_seq, 'suspended', '', %(payload)s::jsonb, %(worker)s, now() FROM w
RETURNING seq
"""


def suspend(
    run_id: str, *, fence: int, worker: str, expect_last_seq: int, wake_at: datetime | None, payload: dict[str, Any],
    reason: str = "",
) -> bool:
    """RUNNING -> WAITING (``status_reason`` ``reason``), releasing the lease, only if nothing was
    journaled since the worker's view (``expect_last_seq``). False: something arrived (a decision,
    a signal); the caller replays with it. Raises ``LeaseLost`` if the fence moved on."""
    params = {"run": run_id, "fence": fence, "expect": expect_last_seq, "wake_at": wake_at,
              "payload": dumps(payload), "worker": worker, "reason": reason}

    def write() -> tuple[Any, ...] | None:
        with cursor() as cur:
            cur.execute(_SUSPEND_SQL, params)
            return cur.fetchone()

    if numbered(write) is not None:
        return True
    with cursor() as cur:
        cur.execute("SELECT fence FROM sagas_workflowrun WHERE id = %s", [run_id])
        row = cur.fetchone()
    if row is None or row[0] != fence:
        raise LeaseLost(f"run {run_id}: fence {fence} is stale, could not suspend")
    return False


def entries_after(run_id: str, *, after_seq: int, limit: int = 1000) -> list[tuple[int, str, str, str | None]]:
    """``(seq, kind, name, payload's "status")`` of the run's entries after ``after_seq``, oldest
    first: what arrived while a worker was suspending the run (``sagas.replay.engine``)."""
    with cursor() as cur:
        cur.execute(
            "SELECT seq, kind, name, payload ->> 'status' FROM sagas_journalentry WHERE run_id = %s AND seq > %s "
            "ORDER BY seq LIMIT %s", [run_id, after_seq, limit])
        return [(int(seq), kind, name, status) for seq, kind, name, status in cur.fetchall()]
