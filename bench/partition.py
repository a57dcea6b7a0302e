"""Journal partitioning: the journal as today (one table) against one partitioned by the month of
its run's creation, at bench/console.py's full size, to decide whether retention should drop
partitions instead of deleting rows.

    .venv/bin/python bench/partition.py            # 1,000,000 runs, 10,000,000 journal entries (both copies)
    .venv/bin/python bench/partition.py --smoke    # 2,000 runs, 20,000 entries (run by the test suite)

Its own database, ``saga_bench_partition`` (``saga_bench_partition_smoke`` with ``--smoke``) on
the bench server, migrated with the project's migrations; the data lives in two schemas of it,
seeded fresh on every run (retention deletes a month of it):

* ``flat``: ``sagas_workflowrun`` and ``sagas_journalentry`` as the migrations make them today
  (``CREATE TABLE ... (LIKE public.<table> INCLUDING ALL)``: every index of the run row, the
  journal's primary key and unique ``(run_id, seq)``, the deferred foreign key to the run);
* ``part``: the same run table, and a journal ``PARTITION BY RANGE (run_created_on)``, one
  partition per calendar month, with what partitioning costs: the partition key as a column of
  every entry (``run_created_on date``, the run's creation day in UTC), in the primary key
  ``(id, run_created_on)`` and in the unique key ``(run_id, seq, run_created_on)``; ``id`` from a
  plain sequence (PostgreSQL 15 has no identity column on a partitioned table).

Both journals carry an append-only row trigger that lets a session delete only after
``SET bench.allow_delete = on`` (the shape of the path retention opens in sagas 0012). Runs are
created over four calendar months before the bench's "now" (2026-08-01 to 2026-12-01), entries
per run and kinds as in bench/console.py (one 20,000-entry run with effect pairs); runs created
in the oldest month are all finished, so that month can be dropped whole.

The engine's own code runs on both: queries go through Django's connection with ``search_path``
set to the schema, so ``sagas.store.systemdb.append``/``load_journal``/``find_own_entry`` and the
console's ``history_timeline`` run unchanged on ``flat``. On ``part`` the append must write the
partition key: it is ``systemdb._APPEND_SQL`` with the run's ``created_at`` (read from its
row) written as ``run_created_on`` (derived from the real text; the bench stops if that
text changed shape). Reads run as today (no key: every partition is probed) and, for
``load_journal``, also with the key (what the engine would send if it knew the run's month).

Retention removes the oldest month's runs and their journal while one appender keeps writing
steps on other runs: on ``flat`` in batches of 500 runs (journal rows then run rows, one
transaction per batch, as ``sagas.retention.archiving.archive_due`` does by default); on ``part`` by
``DETACH PARTITION ... CONCURRENTLY`` and ``DROP TABLE`` of the month's journal partition, then
the same batches for the run rows (the run table is not partitioned). Autovacuum is off on
these tables (and on the shared server): dead tuples are counted after the deletes and a
``VACUUM`` of the touched tables is timed, which is the work autovacuum would do afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

SIZES = {
    "full": dict(runs=1_000_000, entries=10_000_000, long=20_000, appends=5_000, rounds=3, samples=400,
                 long_samples=20, pages=20, window=10.0, db="saga_bench_partition"),
    "smoke": dict(runs=2_000, entries=20_000, long=2_000, appends=300, rounds=1, samples=20,
                  long_samples=3, pages=3, window=1.0, db="saga_bench_partition_smoke"),
}
START = datetime(2026, 8, 1, tzinfo=UTC)  # runs are created from here ...
END = datetime(2026, 12, 1, tzinfo=UTC)  # ... to here; "now" is after it
MONTHS = ["2026-08-01", "2026-09-01", "2026-10-01", "2026-11-01", "2026-12-01", "2027-01-01", "2027-02-01"]
DROPPED = ("2026-08-01", "2026-09-01")  # the month retention removes
BATCH = 500  # runs per retention batch (archive_due's default)
LIVE_RUNS = 1_000  # RUNNING runs created "now" that the appender advances
WORKFLOWS = ["order_fulfilment", "payment_refund", "kyc_check", "invoice_sync", "shipment_track",
             "subscription_renew", "loan_origination", "data_export"]
VARIANTS = ("flat", "part")
GUC = "bench.allow_delete"


def conninfo(db: str) -> str:
    return f"{common.BENCH_DB.rsplit('/', 1)[0]}/{db}"


def pg(db: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(conninfo(db), autocommit=True)


# --- data ---------------------------------------------------------------------------------------


def partition_name(month: str) -> str:
    return "sagas_journalentry_" + month[:7].replace("-", "_")


def entry_spread(size: dict) -> int:
    """An ordinary run has 5 + n % spread entries, averaging (entries - long) / (runs - 1)."""
    avg = (size["entries"] - size["long"]) / max(size["runs"] - 1, 1)
    return max(1, int(round(2 * (avg - 5))) + 1)


def seed(conn, size: dict) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Both schemas, fresh; returns seconds per phase."""
    timings: dict[str, float] = {}

    def phase(name: str, sql: str, params: list | None = None) -> None:
        t0 = time.perf_counter()
        if params:  # modulo is %% to the driver once there are parameters
            sql = sql.replace("%", "%%").replace("%%s", "%s")
        conn.execute(sql, params)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    conn.execute("SET maintenance_work_mem = '512MB'")
    conn.execute("SET work_mem = '256MB'")
    conn.execute("DROP SCHEMA IF EXISTS flat CASCADE")
    conn.execute("DROP SCHEMA IF EXISTS part CASCADE")
    conn.execute(f"""
        CREATE OR REPLACE FUNCTION public.bench_journal_append_only() RETURNS trigger AS $$
        BEGIN
            IF TG_OP = 'DELETE' AND current_setting('{GUC}', true) = 'on' THEN
                RETURN OLD;
            END IF;
            RAISE EXCEPTION 'the journal is append-only: % refused', TG_OP;
        END;
        $$ LANGUAGE plpgsql""")
    for schema in VARIANTS:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.sagas_workflowrun (LIKE public.sagas_workflowrun INCLUDING ALL)"
                     " WITH (autovacuum_enabled = false)")
    # The journals without their keys for the load (built afterwards from sorted input, as
    # bench/console.py does).
    conn.execute("CREATE TABLE flat.sagas_journalentry (LIKE public.sagas_journalentry INCLUDING DEFAULTS "
                 "INCLUDING IDENTITY INCLUDING CONSTRAINTS) WITH (autovacuum_enabled = false)")
    conn.execute("CREATE SEQUENCE part.sagas_journalentry_id_seq")
    conn.execute("""CREATE TABLE part.sagas_journalentry (LIKE public.sagas_journalentry INCLUDING CONSTRAINTS,
                        run_created_on date NOT NULL) PARTITION BY RANGE (run_created_on)""")
    conn.execute("ALTER TABLE part.sagas_journalentry ALTER id SET DEFAULT nextval('part.sagas_journalentry_id_seq')")
    for low, high in zip(MONTHS, MONTHS[1:]):
        conn.execute(f"""CREATE TABLE part.{partition_name(low)} PARTITION OF part.sagas_journalentry
                         FOR VALUES FROM ('{low}') TO ('{high}') WITH (autovacuum_enabled = false)""")

    runs, long_entries = size["runs"], size["long"]
    spread = entry_spread(size)
    span = (END - START).total_seconds()
    # As bench/console.py's runs (status mix per mille: 940 COMPLETED, 20 WAITING, 10
    # NEEDS_ATTENTION, 15 FAILED, 10 CANCELLED, 5 COMPENSATED), except that a run created in
    # the oldest month has finished (COMPLETED instead of an open status). n = 1 is the long run.
    phase("runs (flat)", f"""
        INSERT INTO flat.sagas_workflowrun (id, workflow_name, version, definition_hash, input, business_key, tenant,
            status, status_reason, result, error, lease_owner, fence, attempts, last_seq, steps_used, cost_used,
            created_at, updated_at, started_at, finished_at, started_via, summary)
        SELECT id, wf, ver, md5(wf || ver), jsonb_build_object('n', n, 'amount', n % 997), bk,
               'tenant-' || lpad((1 + n % 40)::text, 2, '0'), st,
               CASE st WHEN 'NEEDS_ATTENTION' THEN 'effect_unknown' WHEN 'FAILED' THEN 'workflow_error'
                       WHEN 'CANCELLED' THEN 'cancelled' ELSE '' END,
               CASE WHEN st = 'COMPLETED' THEN jsonb_build_object('ok', true) END,
               CASE WHEN st = 'FAILED' THEN jsonb_build_object('code', 'workflow_error', 'message', 'boom') END,
               '', 1 + n % 3, 1 + n % 3, entries, greatest(entries - 3, 0), (n % 50) * 0.01,
               created, created + entries * interval '50 ms', created + interval '20 ms',
               CASE WHEN st IN ('COMPLETED', 'FAILED', 'CANCELLED', 'COMPENSATED')
                    THEN created + entries * interval '50 ms' END,
               'api', jsonb_build_object('order', bk, 'customer', 'customer-' || (n % 5000))
          FROM (
            SELECT n, id, wf, ver, bk, entries, created,
                   CASE WHEN n = 1 THEN 'WAITING'
                        WHEN st0 IN ('WAITING', 'NEEDS_ATTENTION') AND created < %s THEN 'COMPLETED'
                        ELSE st0 END AS st
              FROM (
                SELECT n, md5('run' || n)::uuid AS id,
                       ('{{{",".join(WORKFLOWS)}}}'::text[])[1 + (n * 7) % {len(WORKFLOWS)}] AS wf,
                       CASE WHEN n % 10 < 6 THEN 3 WHEN n % 10 < 9 THEN 2 ELSE 1 END AS ver,
                       'ORD-' || lpad(n::text, 8, '0') AS bk,
                       CASE WHEN n % 1000 < 940 THEN 'COMPLETED' WHEN n % 1000 < 960 THEN 'WAITING'
                            WHEN n % 1000 < 970 THEN 'NEEDS_ATTENTION' WHEN n % 1000 < 985 THEN 'FAILED'
                            WHEN n % 1000 < 995 THEN 'CANCELLED' ELSE 'COMPENSATED' END AS st0,
                       CASE WHEN n = 1 THEN {long_entries} ELSE 5 + n % {spread} END AS entries,
                       CASE WHEN n = 1 THEN timestamptz '2026-11-15 12:00+00'
                            ELSE %s::timestamptz + make_interval(secs => {span} * (((n * 40503) % 1000033) / 1000033.0))
                       END AS created
                  FROM generate_series(1::bigint, %s) AS n
              ) AS g0
          ) AS g""", [DROPPED[1], START, runs])
    phase("runs (part)", "INSERT INTO part.sagas_workflowrun SELECT * FROM flat.sagas_workflowrun")

    # As bench/console.py's journal: started, claimed, steps..., the outcome; the long run has an
    # effect intent and result every 10 entries.
    journal = common.CONSOLE_JOURNAL_SQL
    phase("journal (flat)", journal.format(schema="flat", extra="", extra_value=""))
    phase("journal (part)", journal.format(schema="part", extra=", run_created_on",
                                           extra_value=", (r.created_at AT TIME ZONE 'UTC')::date"))
    phase("journal keys (flat)", "ALTER TABLE flat.sagas_journalentry ADD PRIMARY KEY (id)")
    phase("journal keys (flat)", "ALTER TABLE flat.sagas_journalentry ADD CONSTRAINT journal_unique_run_seq "
                                 "UNIQUE (run_id, seq)")
    phase("journal keys (part)", "ALTER TABLE part.sagas_journalentry ADD PRIMARY KEY (id, run_created_on)")
    phase("journal keys (part)", "ALTER TABLE part.sagas_journalentry ADD CONSTRAINT journal_unique_run_seq "
                                 "UNIQUE (run_id, seq, run_created_on)")
    conn.execute("SELECT setval('part.sagas_journalentry_id_seq', (SELECT max(id) FROM part.sagas_journalentry))")
    conn.execute("SELECT setval(pg_get_serial_sequence('flat.sagas_journalentry', 'id'), "
                 "(SELECT max(id) FROM flat.sagas_journalentry))")
    for schema in VARIANTS:
        phase(f"journal foreign key ({schema})", f"""
            ALTER TABLE {schema}.sagas_journalentry ADD CONSTRAINT journal_run_fk FOREIGN KEY (run_id)
                  REFERENCES {schema}.sagas_workflowrun (id) DEFERRABLE INITIALLY DEFERRED""")
        conn.execute(f"""CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE ON {schema}.sagas_journalentry
                         FOR EACH ROW EXECUTE FUNCTION public.bench_journal_append_only()""")
    # The runs the appender advances: created now (the newest partition), RUNNING under fence 1.
    for schema in VARIANTS:
        conn.execute(f"""
            INSERT INTO {schema}.sagas_workflowrun (id, workflow_name, version, definition_hash, input, business_key,
                tenant, status, status_reason, lease_owner, lease_expires_at, fence, attempts, last_seq, steps_used,
                cost_used, created_at, updated_at, started_at, started_via)
            SELECT md5('live' || n)::uuid, 'order_fulfilment', 3, md5('order_fulfilment3'), '{{}}'::jsonb, '',
                   'tenant-01', 'RUNNING', '', 'bench-partition', now() + interval '1 day', 1, 1, 0, 0, 0,
                   now(), now(), now(), 'api'
              FROM generate_series(1, {LIVE_RUNS}) AS n""")
    for schema in VARIANTS:
        t0 = time.perf_counter()
        conn.execute(f"VACUUM ANALYZE {schema}.sagas_workflowrun")
        conn.execute(f"VACUUM ANALYZE {schema}.sagas_journalentry")
        timings[f"vacuum analyze ({schema})"] = time.perf_counter() - t0
    return timings


def journal_size(conn, schema: str) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """(table MB incl. TOAST, indexes MB, partitions) of a schema's journal."""
    row = conn.execute(f"""
        SELECT sum(pg_table_size(c.oid)), sum(pg_indexes_size(c.oid)), count(*) FROM pg_class c
         WHERE c.relkind = 'r' AND (c.oid = '{schema}.sagas_journalentry'::regclass
                                    OR c.oid IN (SELECT relid FROM pg_partition_tree('{schema}.sagas_journalentry')))
        """).fetchone()
    return row[0] / 2**20, row[1] / 2**20, row[2]


def dead_tuples(conn, schema: str, table: str) -> int:  # type: ignore[no-untyped-def]
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute(f"""SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
                             WHERE schemaname = '{schema}' AND relname LIKE '{table}%'""").fetchone()[0]


# --- the engine's statements --------------------------------------------------------------------


def use(schema: str) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"SET search_path TO {schema}, public")


def partitioned_append_sql() -> str:
    """``systemdb._APPEND_SQL`` writing the partition key too (the run's creation day)."""
    from sagas.store import systemdb

    sql = systemdb._APPEND_SQL
    for old, new in [
        ("worker_id, created_at)", "worker_id, created_at, run_created_on)"),
        ("$6, now()\n", "$6, now(), (r.created_at AT TIME ZONE 'UTC')::date\n"),
    ]:
        if sql.count(old) != 1:
            raise SystemExit(f"sagas.store.systemdb._APPEND_SQL changed shape ({old!r} not found once): update "
                             "bench/partition.py's partitioned_append_sql()")
        sql = sql.replace(old, new)
    return sql


def appender(schema: str):  # type: ignore[no-untyped-def]
    """A function appending one step entry to a run, the engine's way, on the current thread's
    connection (whose search_path must be ``schema``)."""
    from sagas.errors import LeaseLost
    from sagas.store import systemdb
    from sagas.store.libpq import Statement

    if schema == "flat":
        def append(run_id: str, i: int) -> None:
            systemdb.append(run_id, fence=1, kind="step", name=f"step_{i}", payload=f'{{"value":{i},"ok":true}}',
                            worker="bench-partition")
        return append

    statement = Statement("bench_partitioned_append", partitioned_append_sql())

    def append_part(run_id: str, i: int) -> None:
        # the parameters of systemdb.append's statement, in its order
        if statement.first_row([run_id, 1, "step", f"step_{i}", f'{{"value":{i},"ok":true}}',
                                "bench-partition"]) is None:
            raise LeaseLost(run_id)
    return append_part


def live_runs(conn, schema: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(r[0]) for r in conn.execute(
        f"SELECT id FROM {schema}.sagas_workflowrun WHERE lease_owner = 'bench-partition' ORDER BY id")]


def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Milliseconds of ``n`` calls of ``fn(i)``."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def append_rounds(conn, size: dict) -> dict[str, dict[str, float]]:  # type: ignore[no-untyped-def]
    """Rounds of ``appends`` statements, the variants alternating; the median round of each."""
    rates: dict[str, list[float]] = {s: [] for s in VARIANTS}
    lat: dict[str, list[list[float]]] = {s: [] for s in VARIANTS}
    runs = {s: live_runs(conn, s) for s in VARIANTS}
    for _ in range(size["rounds"]):
        for schema in VARIANTS:
            use(schema)
            append = appender(schema)
            ids = runs[schema]
            timed(lambda i: append(ids[i % len(ids)], i), 50)  # warm-up (prepares the statement)
            t0 = time.perf_counter()
            ms = timed(lambda i: append(ids[i % len(ids)], i), size["appends"])
            rates[schema].append(size["appends"] / (time.perf_counter() - t0))
            lat[schema].append(ms)
    out = {}
    for schema in VARIANTS:
        k = sorted(range(len(rates[schema])), key=lambda i: rates[schema][i])[len(rates[schema]) // 2]
        ms = lat[schema][k]
        out[schema] = dict(rate=rates[schema][k], p50=common.percentile(ms, 50), p95=common.percentile(ms, 95),
                           all_rates=rates[schema])
    return out


def read_figures(conn, size: dict) -> dict[str, dict[str, tuple[float, float]]]:  # type: ignore[no-untyped-def]
    """p50/p95 ms per read figure and schema."""
    from console.selectors.history import KIND_GROUPS, history_timeline
    from sagas.store import systemdb

    rng = random.Random(16)
    sample = [md5_run(n) for n in rng.sample(range(2, size["runs"] + 1), size["samples"])]
    days = dict(conn.execute("SELECT id::text, (created_at AT TIME ZONE 'UTC')::date FROM flat.sagas_workflowrun "
                             "WHERE id = ANY(%s::uuid[])", [sample]).fetchall())
    long_run = md5_run(1)
    long_day = conn.execute("SELECT (created_at AT TIME ZONE 'UTC')::date FROM flat.sagas_workflowrun WHERE id = %s",
                            [long_run]).fetchone()[0]
    middle = size["long"] // 2
    effects = KIND_GROUPS["effects"][1]

    def keyed_load(run_id: str, day) -> list:  # type: ignore[no-untyped-def]
        """systemdb.load_journal with the partition key in the WHERE clause."""
        with systemdb.cursor() as cur:
            cur.execute("SELECT seq, kind, name, payload FROM sagas_journalentry "
                        "WHERE run_id = %s AND run_created_on = %s ORDER BY seq", [run_id, day])
            rows = cur.fetchall()
        loads = json.loads
        return [systemdb.Entry(seq, kind, name, loads(p) if isinstance(p, str) else p) for seq, kind, name, p in rows]

    figures: dict[str, dict[str, tuple[float, float]]] = {}

    def record(label: str, schema: str, ms: list[float]) -> None:
        figures.setdefault(label, {})[schema] = (common.percentile(ms, 50), common.percentile(ms, 95))

    for schema in VARIANTS:
        use(schema)
        for warm in sample[:20]:
            systemdb.load_journal(warm)
        record(f"load_journal, one run (5 to {4 + entry_spread(size)} entries)", schema,
               timed(lambda i: systemdb.load_journal(sample[i]), len(sample)))
        if schema == "part":
            record("load_journal, one run, with the partition key", schema,
                   timed(lambda i: keyed_load(sample[i], days[sample[i]]), len(sample)))
        record("find_own_entry, one run", schema, timed(lambda i: systemdb.find_own_entry(
            sample[i], after_seq=2, kind="step", name="step_3", worker="worker-1"), len(sample)))
        systemdb.load_journal(long_run)
        record(f"load_journal, the {size['long']:,}-entry run", schema,
               timed(lambda i: systemdb.load_journal(long_run), size["long_samples"]))
        if schema == "part":
            record(f"load_journal, the {size['long']:,}-entry run, with the key", schema,
                   timed(lambda i: keyed_load(long_run, long_day), size["long_samples"]))
        for label, kwargs in [
            ("history page, long run, first page", {}),
            (f"history page, long run, middle (before #{middle:,})", {"before": middle, "newer": True}),
            ("history page, long run, kind = effects", {"kinds": effects}),
            ("history page, one short run", None),
        ]:
            if kwargs is None:
                history_timeline(sample[0])
                ms = timed(lambda i: history_timeline(sample[i % len(sample)]), size["pages"])
            else:
                history_timeline(long_run, **kwargs)
                ms = timed(lambda i, kw=kwargs: history_timeline(long_run, **kw), size["pages"])
            record(label, schema, ms)
    # Every read without the key probes every partition: 12 more (empty) months, as a year's
    # retention would keep.
    extra = [f"{2027 + k // 12}-{k % 12 + 1:02d}-01" for k in range(1, 14)]
    for low, high in zip(extra, extra[1:]):
        conn.execute(f"""CREATE TABLE part.{partition_name(low)} PARTITION OF part.sagas_journalentry
                         FOR VALUES FROM ('{low}') TO ('{high}') WITH (autovacuum_enabled = false)""")
    parts = journal_size(conn, "part")[2]
    use("part")
    for warm in sample[:20]:
        systemdb.load_journal(warm)
    record(f"load_journal, one run, {parts} partitions (12 more, empty)", "part",
           timed(lambda i: systemdb.load_journal(sample[i]), len(sample)))
    history_timeline(sample[0])
    record(f"history page, one short run, {parts} partitions", "part",
           timed(lambda i: history_timeline(sample[i % len(sample)]), size["pages"]))
    for low in extra[:-1]:  # retention then runs with the 6 partitions again
        conn.execute(f"DROP TABLE part.{partition_name(low)}")
    return figures


def md5_run(n: int) -> str:
    import hashlib
    import uuid

    return str(uuid.UUID(hashlib.md5(f"run{n}".encode()).hexdigest()))


# --- retention ----------------------------------------------------------------------------------


class Appender(threading.Thread):
    """Steps appended continuously on a connection of its own, as a busy worker writes them."""

    def __init__(self, schema: str, runs: list[str]) -> None:
        super().__init__(daemon=True)
        self.schema, self.runs = schema, runs
        self.stop = threading.Event()
        self.done: list[tuple[float, float]] = []  # (end time, ms)
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        try:
            use(self.schema)
            append = appender(self.schema)
            i = 0
            while not self.stop.is_set():
                t0 = time.perf_counter()
                append(self.runs[i % len(self.runs)], i)
                t1 = time.perf_counter()
                self.done.append((t1, (t1 - t0) * 1000))
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
        finally:
            connection.close()

    def window(self, t0: float, t1: float) -> tuple[float, float, float]:
        """(statements/s, p95 ms, max ms) of the appends that ended in [t0, t1)."""
        ms = [m for t, m in self.done if t0 <= t < t1]
        return len(ms) / (t1 - t0), common.percentile(ms, 95), max(ms, default=float("nan"))


def delete_runs_in_batches(conn, schema: str, *,  # type: ignore[no-untyped-def]
                           journal: bool) -> tuple[int, int, int, float]:
    """Delete the dropped month's runs (and their entries, with ``journal``) 500 runs a transaction,
    in creation order; (runs, entries, batches, seconds in the journal DELETEs)."""
    low, high = DROPPED
    last = (datetime(1970, 1, 1, tzinfo=UTC), "00000000-0000-0000-0000-000000000000")
    runs = entries = batches = 0
    journal_s = 0.0
    while True:
        with conn.transaction():
            conn.execute(f"SET LOCAL {GUC} = on")
            rows = conn.execute(f"""
                SELECT id, created_at FROM {schema}.sagas_workflowrun
                 WHERE created_at >= %s AND created_at < %s AND (created_at, id) > (%s, %s::uuid)
                 ORDER BY created_at, id LIMIT {BATCH}""", [low, high, *last]).fetchall()
            if not rows:
                break
            ids = [r[0] for r in rows]
            if journal:
                j0 = time.perf_counter()
                entries += conn.execute(f"DELETE FROM {schema}.sagas_journalentry WHERE run_id = ANY(%s)",
                                        [ids]).rowcount
                journal_s += time.perf_counter() - j0
            runs += conn.execute(f"DELETE FROM {schema}.sagas_workflowrun WHERE id = ANY(%s)", [ids]).rowcount
            batches += 1
            last = (rows[-1][1], str(rows[-1][0]))
    return runs, entries, batches, journal_s


def retention(db: str, size: dict) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    out: dict[str, dict] = {}
    with pg(db) as conn:
        for schema in VARIANTS:
            before = journal_size(conn, schema)
            month_entries = conn.execute(f"""
                SELECT count(*) FROM {schema}.sagas_journalentry j JOIN {schema}.sagas_workflowrun r ON r.id = j.run_id
                 WHERE r.created_at >= %s AND r.created_at < %s""", list(DROPPED)).fetchone()[0]
            dead_runs_before = dead_tuples(conn, schema, "sagas_workflowrun")
            worker = Appender(schema, live_runs(conn, schema))
            worker.start()
            time.sleep(1.0)  # connection, prepared statement
            b0 = time.perf_counter()
            time.sleep(size["window"])
            t0 = time.perf_counter()
            detach = drop = 0.0
            if schema == "flat":
                runs, entries, batches, journal_s = delete_runs_in_batches(conn, schema, journal=True)
            else:
                part = partition_name(DROPPED[0])
                conn.execute(f"ALTER TABLE part.sagas_journalentry DETACH PARTITION part.{part} CONCURRENTLY")
                detach = time.perf_counter() - t0
                conn.execute(f"DROP TABLE part.{part}")
                drop = time.perf_counter() - t0 - detach
                runs, entries, batches, _ = delete_runs_in_batches(conn, schema, journal=False)
                journal_s = detach + drop
                entries = month_entries
            t1 = time.perf_counter()
            worker.stop.set()
            worker.join()
            if worker.error:
                raise worker.error
            base = worker.window(b0, t0)
            during = worker.window(t0, t1)
            time.sleep(1.5)  # the statistics of the deleting session reach the views
            dead_journal = dead_tuples(conn, schema, "sagas_journalentry")
            # Less those the appender's updates of its own runs left before.
            dead_runs = dead_tuples(conn, schema, "sagas_workflowrun") - dead_runs_before
            v0 = time.perf_counter()
            if schema == "flat":
                conn.execute("VACUUM flat.sagas_journalentry")
            v1 = time.perf_counter()
            conn.execute(f"VACUUM {schema}.sagas_workflowrun")
            v2 = time.perf_counter()
            out[schema] = dict(seconds=t1 - t0, runs=runs, entries=entries, month_entries=month_entries,
                               batches=batches, journal_s=journal_s, detach=detach, drop=drop, base=base,
                               during=during,
                               dead_journal=dead_journal, dead_runs=dead_runs, vacuum_journal=v1 - v0,
                               vacuum_runs=v2 - v1, before=before, after=journal_size(conn, schema))
    return out


# --- main ---------------------------------------------------------------------------------------


def loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args()
    size = SIZES["smoke" if args.smoke else "full"]
    common.BENCH_DB = conninfo(size["db"])
    common.setup_django(DEBUG="false", SECRET_KEY="bench-partition-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
                        ALLOWED_HOSTS="testserver,127.0.0.1,localhost")
    print(f"load average at start: {loadavg()}")
    t_all = time.perf_counter()
    with pg(size["db"]) as conn:
        made = seed(conn, size)
        print("seeded in " + ", ".join(f"{k} {v:.1f} s" for k, v in made.items()))
        counts = {s: conn.execute(f"SELECT count(*) FROM {s}.sagas_journalentry").fetchone()[0] for s in VARIANTS}
        sizes = {s: journal_size(conn, s) for s in VARIANTS}
        appends = append_rounds(conn, size)
        reads = read_figures(conn, size)
    from django.db import connection

    connection.close()
    kept = retention(size["db"], size)

    flat_n, part_n = counts["flat"], counts["part"]
    rows = [("figure", "one table (today)", f"by month ({sizes['part'][2]} partitions)", "part / flat")]

    def ratio(a: float, b: float) -> str:
        return f"{b / a:.2f}x" if a else "-"

    rows.append(("journal entries seeded", f"{flat_n:,}", f"{part_n:,}", "-"))
    rows.append(("seeding: journal insert / keys / foreign key (s)",
                 f"{made['journal (flat)']:.1f} / {made['journal keys (flat)']:.1f} / "
                 f"{made['journal foreign key (flat)']:.1f}",
                 f"{made['journal (part)']:.1f} / {made['journal keys (part)']:.1f} / "
                 f"{made['journal foreign key (part)']:.1f}", "-"))
    rows.append(("journal table (MB, with TOAST)", f"{sizes['flat'][0]:.0f}", f"{sizes['part'][0]:.0f}",
                 ratio(sizes["flat"][0], sizes["part"][0])))
    rows.append(("journal indexes (MB)", f"{sizes['flat'][1]:.0f}", f"{sizes['part'][1]:.0f}",
                 ratio(sizes["flat"][1], sizes["part"][1])))
    fa, pa = appends["flat"], appends["part"]
    rows.append((f"append statement, 1 client (median of {size['rounds']} rounds x {size['appends']:,})",
                 f"{fa['rate']:.0f}/s", f"{pa['rate']:.0f}/s", ratio(fa["rate"], pa["rate"])))
    rows.append(("append statement p50 / p95 (ms)", f"{fa['p50']:.3f} / {fa['p95']:.3f}",
                 f"{pa['p50']:.3f} / {pa['p95']:.3f}", ratio(fa["p50"], pa["p50"])))
    for label, by in reads.items():
        f = by.get("flat")
        p = by["part"]
        rows.append((label + " p50 / p95 (ms)", f"{f[0]:.3f} / {f[1]:.3f}" if f else "-",
                     f"{p[0]:.3f} / {p[1]:.3f}", ratio(f[0], p[0]) if f else "-"))
    kf, kp = kept["flat"], kept["part"]
    rows.append((f"retention: one month ({kf['runs']:,} runs, {kf['month_entries']:,} entries), seconds",
                 f"{kf['seconds']:.1f}", f"{kp['seconds']:.1f}", ratio(kf["seconds"], kp["seconds"])))
    rows.append(("retention: how",
                 f"{kf['batches']} batches of {BATCH} runs: entries + runs",
                 f"detach {kp['detach'] * 1000:.0f} ms + drop {kp['drop'] * 1000:.0f} ms, "
                 f"then {kp['batches']} batches: runs", "-"))
    rows.append(("retention: of which journal rows / run rows (s)",
                 f"{kf['journal_s']:.1f} / {kf['seconds'] - kf['journal_s']:.1f}",
                 f"{kp['journal_s']:.1f} / {kp['seconds'] - kp['journal_s']:.1f}", "-"))
    rows.append(("retention: journal entries removed per second", f"{kf['entries'] / kf['seconds']:,.0f}",
                 f"{kp['entries'] / kp['seconds']:,.0f}", ratio(kf["entries"] / kf["seconds"],
                                                               kp["entries"] / kp["seconds"])))
    rows.append(("appender before retention: statements/s",
                 f"{kf['base'][0]:.0f}", f"{kp['base'][0]:.0f}", "-"))
    rows.append(("appender during retention: statements/s (change)",
                 f"{kf['during'][0]:.0f} ({(kf['during'][0] / kf['base'][0] - 1) * 100:+.0f} %)",
                 f"{kp['during'][0]:.0f} ({(kp['during'][0] / kp['base'][0] - 1) * 100:+.0f} %)", "-"))
    rows.append(("appender during retention: p95 / max (ms)",
                 f"{kf['during'][1]:.2f} / {kf['during'][2]:.0f}", f"{kp['during'][1]:.2f} / {kp['during'][2]:.0f}",
                 "-"))
    rows.append(("dead tuples left by retention: journal / runs (+ the appender's)",
                 f"{kf['dead_journal']:,} / {kf['dead_runs']:,}",
                 f"{kp['dead_journal']:,} / {kp['dead_runs']:,}", "-"))
    rows.append(("VACUUM after: journal / runs (s)", f"{kf['vacuum_journal']:.1f} / {kf['vacuum_runs']:.1f}",
                 f"- / {kp['vacuum_runs']:.1f}", "-"))
    rows.append(("journal table + indexes after (MB)", f"{kf['after'][0] + kf['after'][1]:.0f}",
                 f"{kp['after'][0] + kp['after'][1]:.0f}", "-"))
    common.print_table(
        f"Journal partitioning ({size['runs']:,} runs created 2026-08-01 to 2026-12-01, {flat_n:,} entries; "
        f"one client; retention removes the runs created in 2026-08)", rows)
    print("append rounds (statements/s): " + "; ".join(
        f"{s} " + ", ".join(f"{r:.0f}" for r in appends[s]["all_rates"]) for s in VARIANTS))
    print(f"load average at end: {loadavg()}; wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
