"""The statement that starts a run: the run row and its ``started`` journal entry at once.

Written as ``sagas.store.systemdb``'s statements are (raw SQL, server-side binding, prepared
after a few uses): ``run_start`` is the path every start takes, from the API, the console
and ``sagas.start``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection

from sagas.store.systemdb import cursor

# ``created_at`` is the statement's clock, not the transaction's (``now()``): runs started one after
# another in one transaction keep the order they were started in, newest first in every list, as
# when the ORM stamped them in Python.
# A new run and its ``started`` entry (seq 1) in one statement: one round trip and, outside a
# transaction, one commit. With a business key already taken in the tenant for the workflow, it
# inserts nothing and returns no row (ON CONFLICT names the partial unique index
# ``run_unique_business_key`` by its columns and predicate); the caller then looks at that run.
_INSERT_RUN_SQL = """
WITH run AS (
    INSERT INTO sagas_workflowrun (
        id, workflow_name, version, definition_hash, input, summary, business_key, tenant,
        status, status_reason, lease_owner, fence, attempts, last_seq, steps_used, cost_used,
        max_steps, max_cost, max_duration, created_at, updated_at, started_by_id, started_via, priority)
    VALUES (%(id)s, %(name)s, %(version)s, %(hash)s, %(input)s::jsonb, %(summary)s::jsonb, %(key)s, %(tenant)s,
            'PENDING', '', '', 0, 0, 1, 0, 0,
            %(max_steps)s, %(max_cost)s::numeric, %(max_duration)s::interval,
            clock_timestamp(), clock_timestamp(), %(by_id)s, %(via)s, %(priority)s)
    ON CONFLICT (tenant, workflow_name, business_key) WHERE NOT business_key = '' DO NOTHING
    RETURNING id, created_at
), entry AS (
    INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
    SELECT id, 1, 'started', '',
           jsonb_build_object('input', %(input)s::jsonb, 'version', %(version)s::integer,
                              'definition_hash', %(hash)s::text, 'business_key', %(key)s::text,
                              'tenant', %(tenant)s::text, 'started_by', %(by_name)s::text,
                              'started_via', %(via)s::text),
           '', created_at
      FROM run
)
SELECT created_at FROM run
"""


def insert_run(
    run_id: str,
    *,
    workflow_name: str,
    version: int,
    definition_hash: str,
    input: str | None,
    summary: str | None,
    business_key: str,
    tenant: str,
    max_steps: int | None,
    max_cost: Decimal | None,
    max_duration: timedelta | None,
    started_by_id: int | None,
    started_by_name: str | None,
    started_via: str,
    priority: int = 3,
) -> datetime | None:
    """Insert a PENDING run and its ``started`` journal entry in one statement; its
    ``created_at``, or None (nothing written) when ``business_key`` is already taken for
    ``(tenant, workflow_name)``. ``input`` and ``summary`` are JSON text (None: SQL NULL).

    A concurrent start with the same key that has not committed yet makes this wait for it
    (PostgreSQL's speculative insertion): either it commits and this returns None, or it
    rolls back and this inserts."""
    # What the ORM's first query of a request does (CONN_HEALTH_CHECKS): a connection the server
    # dropped since the last one (a restart) is replaced instead of failing this start.
    connection.close_if_health_check_failed()
    with cursor() as cur:
        cur.execute(
            _INSERT_RUN_SQL,
            {
                "id": run_id, "name": workflow_name, "version": version, "hash": definition_hash,
                "input": input, "summary": summary, "key": business_key, "tenant": tenant,
                "max_steps": max_steps, "max_cost": str(max_cost) if max_cost is not None else None,
                "max_duration": max_duration, "by_id": started_by_id, "by_name": started_by_name,
                "via": started_via, "priority": priority,
            },
        )
        row = cur.fetchone()
    return row[0] if row else None
