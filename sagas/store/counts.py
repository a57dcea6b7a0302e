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

from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

RUNS = "sagas_workflowrun"


@dataclass(frozen=True)
class KeptCount:
    """The SQL of one kept count: runs per ``key`` (columns of the runs table, ``tenant``
    first), only those whose status is in ``statuses`` (empty: every run). ``name`` prefixes
    its trigger functions and triggers; ``totals`` and ``deltas`` are its two tables."""

    name: str
    totals: str
    deltas: str
    key: tuple[str, ...]
    statuses: tuple[str, ...] = ()

    @property
    def _cols(self) -> str:
        return ", ".join(self.key)

    @property
    def _groups(self) -> str:
        return ", ".join(str(i) for i in range(1, len(self.key) + 1))

    def _kept(self, row: str) -> str:
        """A condition on ``row`` (OLD, NEW or a table alias): the row is counted here."""
        if not self.statuses:
            return "true"
        listed = ", ".join(f"'{status}'" for status in self.statuses)
        return f"{row}.status IN ({listed})"

    @property
    def install(self) -> str:
        cols, groups, n = self._cols, self._groups, self.name
        old = ", ".join(f"OLD.{c}" for c in self.key)
        new = ", ".join(f"NEW.{c}" for c in self.key)
        changed = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in self.key)
        counted = "" if not self.statuses else f"({self._kept('OLD')} OR {self._kept('NEW')}) AND "
        # Every run counted: one statement for both deltas (this fires on each status change).
        row = f"INSERT INTO {self.deltas} ({cols}, n) VALUES ({old}, -1), ({new}, 1);" if not self.statuses else f"""\
IF {self._kept('OLD')} THEN
        INSERT INTO {self.deltas} ({cols}, n) VALUES ({old}, -1);
    END IF;
    IF {self._kept('NEW')} THEN
        INSERT INTO {self.deltas} ({cols}, n) VALUES ({new}, 1);
    END IF;"""
        return f"""
CREATE OR REPLACE FUNCTION {n}_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {row}
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION {n}_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {self.deltas} ({cols}, n)
    SELECT {cols}, count(*) FROM added WHERE {self._kept('added')} GROUP BY {groups};
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION {n}_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {self.deltas} ({cols}, n)
    SELECT {cols}, -count(*) FROM gone WHERE {self._kept('gone')} GROUP BY {groups};
    RETURN NULL;
END $$;

CREATE TRIGGER {n}_update AFTER UPDATE OF {cols} ON {RUNS}
    FOR EACH ROW WHEN ({counted}({changed}))
    EXECUTE FUNCTION {n}_row();
CREATE TRIGGER {n}_insert AFTER INSERT ON {RUNS} REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION {n}_inserted();
CREATE TRIGGER {n}_delete AFTER DELETE ON {RUNS} REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION {n}_deleted();
"""

    @property
    def uninstall(self) -> str:
        return "".join(f"DROP TRIGGER IF EXISTS {self.name}_{t} ON {RUNS};\n" for t in ("update", "insert", "delete")) \
            + "".join(f"DROP FUNCTION IF EXISTS {self.name}_{f}();\n" for f in ("row", "inserted", "deleted"))

    @property
    def rebuild(self) -> str:
        """Recount from the runs themselves. The lock keeps writers out for the count's duration
        (they wait; nothing fails), so no change falls between the count and the deltas."""
        return f"""
LOCK TABLE {RUNS} IN SHARE ROW EXCLUSIVE MODE;
DELETE FROM {self.deltas};
DELETE FROM {self.totals};
INSERT INTO {self.totals} ({self._cols}, n)
SELECT {self._cols}, count(*) FROM {RUNS} r WHERE {self._kept('r')} GROUP BY {self._groups};
"""

    @property
    def fold(self) -> str:
        return f"""
WITH folded AS (DELETE FROM {self.deltas} RETURNING {self._cols}, n)
INSERT INTO {self.totals} ({self._cols}, n)
SELECT {self._cols}, sum(n) FROM folded GROUP BY {self._groups}
ON CONFLICT ({self._cols}) DO UPDATE SET n = {self.totals}.n + excluded.n
"""

    def read(self, tenants: list[str] | None) -> list[tuple[Any, ...]]:
        """``(key without the tenant..., runs)`` of ``tenants`` (None: every tenant), exact as
        of this statement; keys with no run left out."""
        shown = self.key[1:]
        where = "" if tenants is None else "WHERE c.tenant = ANY(%s::varchar[])"
        with connection.cursor() as cur:
            cur.execute(
                f"""SELECT {', '.join(shown)}, sum(n) FROM (
                        SELECT {self._cols}, n FROM {self.totals}
                        UNION ALL
                        SELECT {self._cols}, n FROM {self.deltas}
                    ) AS c {where} GROUP BY {', '.join(str(i) for i in range(1, len(shown) + 1))}
                    HAVING sum(n) <> 0""",
                [] if tenants is None else [tenants],
            )
            return cur.fetchall()


RUN_COUNTS = KeptCount("sagas_run_count", "sagas_runcount", "sagas_runcountdelta",
                       ("tenant", "status", "status_reason"))

# The runs that still need their code, per version: the workers page lists the versions no live
# worker carries with how many runs wait for each, without grouping every run in flight
# (300,000 of them at 10M runs in bench/console.py: 186 ms).
IN_FLIGHT = ("PENDING", "RUNNING", "WAITING", "NEEDS_ATTENTION")
IN_FLIGHT_COUNTS = KeptCount("sagas_in_flight_count", "sagas_inflightcount", "sagas_inflightcountdelta",
                             ("tenant", "workflow_name", "version", "definition_hash", "status"), IN_FLIGHT)

# What the migrations run (0021, 0026).
INSTALL, UNINSTALL, REBUILD = RUN_COUNTS.install, RUN_COUNTS.uninstall, RUN_COUNTS.rebuild
IN_FLIGHT_INSTALL, IN_FLIGHT_UNINSTALL = IN_FLIGHT_COUNTS.install, IN_FLIGHT_COUNTS.uninstall
IN_FLIGHT_REBUILD = IN_FLIGHT_COUNTS.rebuild
_KEPT = (RUN_COUNTS, IN_FLIGHT_COUNTS)


def fold() -> int:
    """Fold the deltas into the totals (the sweeper, each pass); how many keys changed."""
    changed = 0
    with transaction.atomic(), connection.cursor() as cur:
        for kept in _KEPT:
            cur.execute(kept.fold)
            changed += cur.rowcount
    return changed


def rebuild() -> None:
    """Count every run again (after a load that bypassed the triggers)."""
    with transaction.atomic(), connection.cursor() as cur:
        for kept in _KEPT:
            cur.execute(kept.rebuild)


def in_flight_counts(*, tenants: list[str] | None = None) -> dict[tuple[str, int, str, str], int]:
    """``(workflow, version, definition hash, status) -> runs`` in flight (``IN_FLIGHT``) of
    ``tenants`` (None: every tenant), exact as of this statement; keys with no run left out."""
    return {(name, version, h, status): int(n) for name, version, h, status, n in IN_FLIGHT_COUNTS.read(tenants)}


def run_counts(*, tenants: list[str] | None = None) -> dict[tuple[str, str], int]:
    """``(status, status_reason) -> runs`` of ``tenants`` (None: every tenant), exact as of this
    statement. Keys with no run are left out."""
    return {(status, reason): int(n) for status, reason, n in RUN_COUNTS.read(tenants)}
