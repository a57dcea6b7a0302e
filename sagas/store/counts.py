"""Runs per (tenant, status, status_reason), kept exact as runs change, so that the overview
never counts a million runs; and the runs in flight per version (``in_flight_counts``), so that
the workers page never groups every run in flight.

Triggers on the runs table write each change as a delta row (``sagas_runcountdelta``): a
run created, deleted, or whose status, reason or tenant changed adds +1 under its new key and
-1 under its old one, in the transaction that changed it. Deltas are only ever inserted, so
no two transactions wait on one another for them. The sweeper folds them into the totals
(``sagas_runcount``, ``fold``) in one statement. A count is its total plus its deltas, read in
one statement (one snapshot: a delta is either still a delta or already in its total), so it
is exact at the moment it is read, whatever the sweeper did.

Row-level on UPDATE, and only when one of the three columns is a target of the statement and
changed: the engine's per-step updates (``last_seq``, budgets, leases) never fire it.
Statement-level on INSERT and DELETE (transition tables): a bulk load or a retention batch
writes one delta per key, not one per run.

Loads that bypass triggers (``session_replication_role = replica``, as ``bench/console.py``
does) leave the counts behind: ``rebuild`` counts again (``manage.py sagas_recount``).
"""

from __future__ import annotations

from django.db import connection, transaction

RUNS = "sagas_workflowrun"
TOTALS = "sagas_runcount"
DELTAS = "sagas_runcountdelta"

INSTALL = f"""
CREATE OR REPLACE FUNCTION sagas_run_count_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {DELTAS} (tenant, status, status_reason, n)
    VALUES (OLD.tenant, OLD.status, OLD.status_reason, -1), (NEW.tenant, NEW.status, NEW.status_reason, 1);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION sagas_run_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {DELTAS} (tenant, status, status_reason, n)
    SELECT tenant, status, status_reason, count(*) FROM added GROUP BY 1, 2, 3;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION sagas_run_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {DELTAS} (tenant, status, status_reason, n)
    SELECT tenant, status, status_reason, -count(*) FROM gone GROUP BY 1, 2, 3;
    RETURN NULL;
END $$;

CREATE TRIGGER sagas_run_count_update AFTER UPDATE OF status, status_reason, tenant ON {RUNS}
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.status_reason IS DISTINCT FROM NEW.status_reason
                       OR OLD.tenant IS DISTINCT FROM NEW.tenant)
    EXECUTE FUNCTION sagas_run_count_row();
CREATE TRIGGER sagas_run_count_insert AFTER INSERT ON {RUNS} REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION sagas_run_count_inserted();
CREATE TRIGGER sagas_run_count_delete AFTER DELETE ON {RUNS} REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION sagas_run_count_deleted();
"""

UNINSTALL = f"""
DROP TRIGGER IF EXISTS sagas_run_count_update ON {RUNS};
DROP TRIGGER IF EXISTS sagas_run_count_insert ON {RUNS};
DROP TRIGGER IF EXISTS sagas_run_count_delete ON {RUNS};
DROP FUNCTION IF EXISTS sagas_run_count_row();
DROP FUNCTION IF EXISTS sagas_run_count_inserted();
DROP FUNCTION IF EXISTS sagas_run_count_deleted();
"""

# Recount from the runs themselves. The lock keeps writers out for the count's duration (they
# wait; nothing fails), so no change falls between the count and the triggers' deltas.
REBUILD = f"""
LOCK TABLE {RUNS} IN SHARE ROW EXCLUSIVE MODE;
DELETE FROM {DELTAS};
DELETE FROM {TOTALS};
INSERT INTO {TOTALS} (tenant, status, status_reason, n)
SELECT tenant, status, status_reason, count(*) FROM {RUNS} GROUP BY 1, 2, 3;
"""

FOLD = f"""
WITH folded AS (DELETE FROM {DELTAS} RETURNING tenant, status, status_reason, n)
INSERT INTO {TOTALS} (tenant, status, status_reason, n)
SELECT tenant, status, status_reason, sum(n) FROM folded GROUP BY 1, 2, 3
ON CONFLICT (tenant, status, status_reason) DO UPDATE SET n = {TOTALS}.n + excluded.n
"""


# --- runs in flight per version --------------------------------------------------------------
# The same scheme for the runs that still need their code (PENDING, RUNNING, WAITING,
# NEEDS_ATTENTION) per (tenant, workflow, version, definition hash, status): the workers page
# lists the versions no live worker carries with how many runs wait for each, without grouping
# every run in flight (300,000 of them at 10M runs in bench/console.py: 186 ms).

IN_FLIGHT = ("PENDING", "RUNNING", "WAITING", "NEEDS_ATTENTION")
FLIGHT_TOTALS = "sagas_inflightcount"
FLIGHT_DELTAS = "sagas_inflightcountdelta"
_FLYING = ", ".join(f"'{s}'" for s in IN_FLIGHT)
_KEY = "tenant, workflow_name, version, definition_hash, status"

IN_FLIGHT_INSTALL = f"""
CREATE OR REPLACE FUNCTION sagas_in_flight_count_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ({_FLYING}) THEN
        INSERT INTO {FLIGHT_DELTAS} ({_KEY}, n)
        VALUES (OLD.tenant, OLD.workflow_name, OLD.version, OLD.definition_hash, OLD.status, -1);
    END IF;
    IF NEW.status IN ({_FLYING}) THEN
        INSERT INTO {FLIGHT_DELTAS} ({_KEY}, n)
        VALUES (NEW.tenant, NEW.workflow_name, NEW.version, NEW.definition_hash, NEW.status, 1);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION sagas_in_flight_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {FLIGHT_DELTAS} ({_KEY}, n)
    SELECT {_KEY}, count(*) FROM added WHERE status IN ({_FLYING}) GROUP BY 1, 2, 3, 4, 5;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION sagas_in_flight_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {FLIGHT_DELTAS} ({_KEY}, n)
    SELECT {_KEY}, -count(*) FROM gone WHERE status IN ({_FLYING}) GROUP BY 1, 2, 3, 4, 5;
    RETURN NULL;
END $$;

CREATE TRIGGER sagas_in_flight_count_update
    AFTER UPDATE OF status, tenant, workflow_name, version, definition_hash ON {RUNS}
    FOR EACH ROW WHEN ((OLD.status IN ({_FLYING}) OR NEW.status IN ({_FLYING}))
                       AND (OLD.status IS DISTINCT FROM NEW.status OR OLD.tenant IS DISTINCT FROM NEW.tenant
                            OR OLD.workflow_name IS DISTINCT FROM NEW.workflow_name
                            OR OLD.version IS DISTINCT FROM NEW.version
                            OR OLD.definition_hash IS DISTINCT FROM NEW.definition_hash))
    EXECUTE FUNCTION sagas_in_flight_count_row();
CREATE TRIGGER sagas_in_flight_count_insert AFTER INSERT ON {RUNS} REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION sagas_in_flight_count_inserted();
CREATE TRIGGER sagas_in_flight_count_delete AFTER DELETE ON {RUNS} REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION sagas_in_flight_count_deleted();
"""

IN_FLIGHT_UNINSTALL = f"""
DROP TRIGGER IF EXISTS sagas_in_flight_count_update ON {RUNS};
DROP TRIGGER IF EXISTS sagas_in_flight_count_insert ON {RUNS};
DROP TRIGGER IF EXISTS sagas_in_flight_count_delete ON {RUNS};
DROP FUNCTION IF EXISTS sagas_in_flight_count_row();
DROP FUNCTION IF EXISTS sagas_in_flight_count_inserted();
DROP FUNCTION IF EXISTS sagas_in_flight_count_deleted();
"""

IN_FLIGHT_REBUILD = f"""
LOCK TABLE {RUNS} IN SHARE ROW EXCLUSIVE MODE;
DELETE FROM {FLIGHT_DELTAS};
DELETE FROM {FLIGHT_TOTALS};
INSERT INTO {FLIGHT_TOTALS} ({_KEY}, n)
SELECT {_KEY}, count(*) FROM {RUNS} WHERE status IN ({_FLYING}) GROUP BY 1, 2, 3, 4, 5;
"""

IN_FLIGHT_FOLD = f"""
WITH folded AS (DELETE FROM {FLIGHT_DELTAS} RETURNING {_KEY}, n),
     summed AS (SELECT {_KEY}, sum(n) AS n FROM folded GROUP BY 1, 2, 3, 4, 5)
INSERT INTO {FLIGHT_TOTALS} ({_KEY}, n) SELECT {_KEY}, n FROM summed
ON CONFLICT ({_KEY}) DO UPDATE SET n = {FLIGHT_TOTALS}.n + excluded.n
"""


def fold() -> int:
    """Fold the deltas into the totals (the sweeper, each pass); how many keys changed."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(FOLD)
        changed = cur.rowcount
        cur.execute(IN_FLIGHT_FOLD)
        return changed + cur.rowcount


def rebuild() -> None:
    """Count every run again (after a load that bypassed the triggers)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(REBUILD)
        cur.execute(IN_FLIGHT_REBUILD)


def in_flight_counts(*, tenants: list[str] | None = None) -> dict[tuple[str, int, str, str], int]:
    """``(workflow, version, definition hash, status) -> runs`` in flight (``IN_FLIGHT``) of
    ``tenants`` (None: every tenant), exact as of this statement; keys with no run left out."""
    where = "" if tenants is None else "WHERE c.tenant = ANY(%s::varchar[])"
    with connection.cursor() as cur:
        cur.execute(
            f"""SELECT workflow_name, version, definition_hash, status, sum(n) FROM (
                    SELECT {_KEY}, n FROM {FLIGHT_TOTALS}
                    UNION ALL
                    SELECT {_KEY}, n FROM {FLIGHT_DELTAS}
                ) AS c {where} GROUP BY 1, 2, 3, 4 HAVING sum(n) <> 0""",
            [] if tenants is None else [tenants],
        )
        return {(name, version, h, status): int(n) for name, version, h, status, n in cur.fetchall()}


def run_counts(*, tenants: list[str] | None = None) -> dict[tuple[str, str], int]:
    """``(status, status_reason) -> runs`` of ``tenants`` (None: every tenant), exact as of this
    statement. Keys with no run are left out."""
    where = "" if tenants is None else "WHERE c.tenant = ANY(%s::varchar[])"
    params = [] if tenants is None else [tenants]
    with connection.cursor() as cur:
        cur.execute(
            f"""SELECT status, status_reason, sum(n) FROM (
                    SELECT tenant, status, status_reason, n FROM {TOTALS}
                    UNION ALL
                    SELECT tenant, status, status_reason, n FROM {DELTAS}
                ) AS c {where} GROUP BY 1, 2 HAVING sum(n) <> 0""",
            params,
        )
        return {(status, reason): int(n) for status, reason, n in cur.fetchall()}
