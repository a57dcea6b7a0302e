"""Retention under load: archive and delete old runs while a worker keeps advancing runs.

    .venv/bin/python bench/retention.py                  # 1,000,000 runs to archive, 10,000,000 journal entries
    .venv/bin/python bench/retention.py --runs 200000    # another size
    .venv/bin/python bench/retention.py --smoke          # 2,000 runs (run by the test suite)

Everything runs on a private PostgreSQL server (bench/servers.py, its own temp directory, a
free port, removed at exit) holding one database, ``saga_bench_retention``, and Redis db 11 of
the shared Redis. The private server is seeded with fsync and full_page_writes off, then
both are turned on (and checked) before anything is measured; shared_buffers is 128MB as on
the shared server.

1. **Seed** (set-based SQL, ``INSERT ... SELECT FROM generate_series``, the append-only
   triggers in place): ``--runs`` terminal runs 35 to 395 days old (COMPLETED, FAILED,
   CANCELLED, COMPENSATED; 8 workflows; 10 journal entries each with the kinds and payload
   sizes a real run writes: started, claimed, steps, one in five an effect's intent and
   result, one in three a model turn of about 1.2 kB, the outcome), an effect record for one
   run in five and an approval for one in a hundred; plus young terminal runs (under 25
   days) and old live runs (WAITING, NEEDS_ATTENTION, PENDING) that must not be archived.
2. **Load**: one real ``sagas_worker`` process (concurrency 1, no sweeper) advancing 20-step
   pure runs, kept fed by a starter process; its steps/s come from the runs' ``finished_at``
   in fixed windows.
3. **Run list**: a process GETs the console's ``/runs/`` (django.test.Client, a logged-in
   viewer, DEBUG off) every 0.5 s throughout.
4. **Archive**: ``sagas.retention.archiving.archive_due`` in this process (batch size and pause of the
   scheduled pass, SAGAS_ARCHIVE_BATCH and SAGAS_ARCHIVE_PAUSE), after a baseline window, one
   batch per call in slices of 50 s with a quiet window of 10 s after each; then the figures
   per phase against the targets (worker throughput drop < 20 % against the baseline before
   and against the quiet windows, which share the archiving's minutes of a busy machine; run
   list p95 < 100 ms), the archive's files, table sizes before and after, and a check that every
   archived run has an ``ArchivedRun`` row and no journal left, and that young and live runs
   are untouched (exit 1 otherwise).
5. **Partitioning input**: on copies of part of the seeded journal, the batched DELETE of one
   month's runs (what archive_due does) against DETACH + DROP of a monthly partition holding
   the same rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, servers

DB = "saga_bench_retention"
REDIS_URL = "redis://127.0.0.1:6379/11"
WORKFLOWS = ["order_fulfilment", "payment_refund", "kyc_check", "invoice_sync", "shipment_track",
             "subscription_renew", "loan_origination", "data_export"]
TENANTS = 20
VIEWER = "bench-retention-viewer"
LIVE_WORKFLOW = "bench_pure20"
ARCHIVE_GUC = "saga_console.archive_delete"  # sagas/migrations/0012_retention.py
STEPS_PER_RUN = 20
SAMPLE_EVERY = 0.5  # seconds between two run list requests
TARGET_DROP = 20.0  # % of the worker's baseline throughput
TARGET_LIST_P95 = 100.0  # ms
# A model turn's text: prose compresses as real model output does (about 3x), not as random hex.
PROSE = ("The customer asked whether the parcel could be delivered to the neighbour instead; the "
         "carrier's terms allow it when the recipient confirms in writing. I checked the order, the "
         "address history and the last three shipments, and none of them was refused. ") * 6


# --- the private server and Django ---------------------------------------------------------------


def start_server(base_dir: Path | None) -> servers.PostgresServer:
    server = servers.PostgresServer(base_dir)
    server.start()
    with server.connect() as conn:
        conn.execute("ALTER SYSTEM SET shared_buffers = '128MB'")  # as the shared server
        conn.execute("ALTER SYSTEM SET max_wal_size = '8GB'")  # seeding only: fewer checkpoints
    server.restart()
    server.create_database(DB)
    return server


def durable(server: servers.PostgresServer) -> dict[str, str]:
    """fsync and full_page_writes on, max_wal_size back to its default, as the shared server."""
    with server.connect() as conn:
        conn.execute("ALTER SYSTEM SET fsync = on")
        conn.execute("ALTER SYSTEM SET full_page_writes = on")
        conn.execute("ALTER SYSTEM RESET max_wal_size")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)
    with server.connect() as conn:
        conn.execute("CHECKPOINT")
        shown = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                 for name in ("fsync", "full_page_writes", "synchronous_commit", "shared_buffers", "max_wal_size")}
    if shown["fsync"] != "on" or shown["full_page_writes"] != "on":
        raise SystemExit(f"the private server did not turn fsync on: {shown}")
    return shown


def django_env() -> dict[str, str]:
    return dict(
        DEBUG="false",
        SECRET_KEY="bench-retention-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
        ALLOWED_HOSTS="testserver,127.0.0.1,localhost",
        SAGAS_MODULES="bench.workflows",
    )


def sql(statement: str, params: list | None = None, *, fetch: bool = False) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cur:
        # Modulo is %% to the driver; %s stays a placeholder.
        cur.execute(statement.replace("%", "%%").replace("%%s", "%s"), params or [])
        return cur.fetchall() if fetch else []


def autocommit(statement: str) -> None:
    import psycopg
    from django.db import connection

    params = {k: v for k, v in connection.get_connection_params().items()
              if k in {"host", "port", "user", "password", "dbname"}}
    with psycopg.connect(autocommit=True, **params) as conn:
        conn.execute(statement)


# --- seeding ------------------------------------------------------------------------------------


@dataclass
class Sizes:
    old: int  # terminal runs past the retention age: archived
    young: int  # terminal runs under it: kept
    live: int  # old runs still live: kept

    @property
    def total(self) -> int:
        return self.old + self.young + self.live


def seed(sizes: Sizes) -> dict[str, float]:
    """Fill the database; returns seconds per phase. Run n's category: 1..old archived,
    then young, then live (table ``bench_expect``)."""
    from django.db import connection

    timings: dict[str, float] = {}

    def phase(name: str, statement: str, params: list | None = None) -> None:
        t0 = time.perf_counter()
        sql(statement, params)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    with connection.cursor() as cur:
        # This session only: no per-row FK checks during the bulk load (consistent by
        # construction; constraints and the append-only triggers stay in place).
        cur.execute("SET session_replication_role = replica")
        cur.execute("SET maintenance_work_mem = '512MB'")
        cur.execute("SET work_mem = '256MB'")
        # Built again after the load, from sorted input: much cheaper than 10M random inserts.
        cur.execute("ALTER TABLE sagas_journalentry DROP CONSTRAINT journal_unique_run_seq")
    old, young = sizes.old, sizes.young
    phase("expect", f"""
        CREATE TABLE bench_expect AS
        SELECT n, md5('retention' || n)::uuid AS id,
               CASE WHEN n <= {old} THEN 'old' WHEN n <= {old + young} THEN 'young' ELSE 'live' END AS category
          FROM generate_series(1::bigint, %s) AS n""", [sizes.total])
    phase("expect", "ALTER TABLE bench_expect ADD PRIMARY KEY (id)")

    # Terminal status mix (per mille): 900 COMPLETED, 40 FAILED, 40 CANCELLED, 20 COMPENSATED.
    phase("runs", f"""
        INSERT INTO sagas_workflowrun (id, workflow_name, version, definition_hash, input, summary, business_key,
            tenant, status, status_reason, result, error, lease_owner, fence, attempts, last_seq, steps_used,
            cost_used, created_at, updated_at, started_at, finished_at, started_via)
        SELECT id, wf, ver, md5(wf || ver), jsonb_build_object('order', bk, 'amount_cents', n % 99991, 'currency', 'EUR'),
               jsonb_build_object('order', bk, 'customer', 'customer-' || (n % 5000)), bk, tenant, st,
               CASE st WHEN 'FAILED' THEN 'workflow_error' WHEN 'CANCELLED' THEN 'cancelled'
                       WHEN 'NEEDS_ATTENTION' THEN 'effect_unknown' ELSE '' END,
               CASE WHEN st = 'COMPLETED' THEN jsonb_build_object('ok', true, 'order', bk) END,
               CASE WHEN st = 'FAILED' THEN jsonb_build_object('code', 'workflow_error', 'message', 'card declined') END,
               '', 1, 1, 10, CASE WHEN st = 'COMPENSATED' THEN 5 ELSE 6 END, (n % 50) * 0.001,
               created, created + interval '500 ms', created + interval '20 ms',
               CASE WHEN category <> 'live' THEN created + interval '500 ms' END, 'api'
          FROM (
            SELECT e.n, e.id, e.category,
                   ('{{{",".join(WORKFLOWS)}}}'::text[])[1 + (e.n * 7) % {len(WORKFLOWS)}] AS wf,
                   1 + e.n % 3 AS ver,
                   'tenant-' || lpad((1 + e.n % {TENANTS})::text, 2, '0') AS tenant,
                   'RET-' || lpad(e.n::text, 9, '0') AS bk,
                   CASE WHEN e.category = 'live' THEN (ARRAY['WAITING','NEEDS_ATTENTION','PENDING'])[1 + e.n % 3]
                        WHEN e.n % 1000 < 900 THEN 'COMPLETED' WHEN e.n % 1000 < 940 THEN 'FAILED'
                        WHEN e.n % 1000 < 980 THEN 'CANCELLED' ELSE 'COMPENSATED' END AS st,
                   CASE WHEN e.category = 'young' THEN now() - interval '25 days' * (((e.n * 40503) % 1000033) / 1000033.0)
                        ELSE now() - interval '35 days' - interval '360 days' * (((e.n * 40503) % 1000033) / 1000033.0)
                   END AS created
              FROM bench_expect e
          ) AS g
         ORDER BY created""")  # a real table holds its runs roughly in creation order, and so the journal below

    # Ten entries a run: started, claimed, steps (one in five runs an effect's intent and result
    # at 5 and 6; one in three a model turn at 4), the end (compensated runs: compensation
    # started at 9 and finished at 10).
    phase("journal", """
        INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
        SELECT r.id, s, k.kind,
               CASE WHEN k.kind IN ('step', 'effect_intent', 'effect_result') THEN k.name ELSE '' END,
               CASE k.kind
                 WHEN 'started' THEN jsonb_build_object('input', r.input, 'version', r.version)
                 WHEN 'claimed' THEN jsonb_build_object('fence', 1, 'attempt', 1)
                 WHEN 'effect_intent' THEN jsonb_build_object('connector', 'payments.capture', 'key', r.id || ':charge',
                                                              'payload_hash', md5(r.id::text), 'reused', false)
                 WHEN 'effect_result' THEN jsonb_build_object('status', 'SUCCEEDED', 'downstream_ref',
                        'ch_' || left(md5(r.id::text), 14), 'result', jsonb_build_object('id', 'ch_' ||
                        left(md5(r.id::text), 14), 'amount', r.input->'amount_cents', 'currency', 'EUR', 'captured', true))
                 WHEN 'completed' THEN jsonb_build_object('value', r.result)
                 WHEN 'failed' THEN jsonb_build_object('error', jsonb_build_object('type', 'StepFailed',
                        'message', 'payments.capture refused: card declined (do_not_honor)'))
                 WHEN 'cancelled' THEN jsonb_build_object('reason', 'customer withdrew the order', 'by', 'ann')
                 WHEN 'step' THEN
                   CASE WHEN s = 4 AND r.model_turn
                        THEN jsonb_build_object('value', jsonb_build_object('text',
                               substr(%s, 1 + (r.n % 200), 1100) || ' ' || md5(r.id::text || s),
                               'tokens', jsonb_build_object('in', 812 + r.n % 300, 'out', 240 + r.n % 90),
                               'model', 'gpt-4o-mini'), 'cost', 0.00021)
                        ELSE jsonb_build_object('value', jsonb_build_object('sku', 'SKU-' || (r.n % 9973), 'qty', 1 + s % 3,
                               'ok', true, 'warehouse', 'eu-west-' || (s % 3))) END
                 ELSE jsonb_build_object('note', k.kind) END,
               CASE WHEN s = 1 THEN '' ELSE 'worker-' || (r.n % 4) || '/1' END,
               r.created_at + s * interval '50 ms'
          FROM (SELECT w.*, hashtext(w.id::text) & 65535 AS n, (hashtext(w.id::text) & 7) < 3 AS model_turn,
                       hashtext(w.id::text || 'e') % 5 = 0 AS effect
                  FROM sagas_workflowrun w) AS r,
               generate_series(1, 10) AS s,
               LATERAL (SELECT CASE
                 WHEN s = 1 THEN 'started' WHEN s = 2 THEN 'claimed'
                 WHEN s = 10 THEN CASE r.status WHEN 'COMPLETED' THEN 'completed' WHEN 'FAILED' THEN 'failed'
                                      WHEN 'CANCELLED' THEN 'cancelled' WHEN 'COMPENSATED' THEN 'compensation_finished'
                                      WHEN 'WAITING' THEN 'yielded' WHEN 'NEEDS_ATTENTION' THEN 'halted'
                                      ELSE 'resumed' END
                 WHEN s = 9 AND r.status = 'COMPENSATED' THEN 'compensation_started'
                 WHEN s = 5 AND r.effect THEN 'effect_intent'
                 WHEN s = 6 AND r.effect THEN 'effect_result'
                 ELSE 'step' END AS kind,
                 CASE WHEN s IN (5, 6) AND r.effect THEN 'charge' ELSE 'step_' || (s - 2) END AS name) AS k""",
          [PROSE])
    phase("journal index", "ALTER TABLE sagas_journalentry ADD CONSTRAINT journal_unique_run_seq UNIQUE (run_id, seq)")

    phase("effects", """
        INSERT INTO ledger_effectrecord (tenant, idempotency_key, kind, run_id, step_name, connector, request_payload,
            payload_hash, status, result, downstream_ref, attempts, error_class, error_message, intent_at,
            dispatched_at, completed_at, updated_at, checks, next_check_at, resolved_by_label, resolution,
            resolution_note)
        SELECT r.tenant, r.id || ':charge', 'effect', r.id, 'charge', 'payments.capture',
               jsonb_build_object('order', r.business_key, 'amount_cents', r.input->'amount_cents', 'currency', 'EUR'),
               md5(r.id::text), 'SUCCEEDED', jsonb_build_object('id', 'ch_' || left(md5(r.id::text), 14), 'captured', true),
               'ch_' || left(md5(r.id::text), 14), 1, '', '', r.created_at + interval '250 ms',
               r.created_at + interval '260 ms', r.created_at + interval '300 ms', r.created_at + interval '300 ms',
               0, NULL, '', '', ''
          FROM sagas_workflowrun r WHERE hashtext(r.id::text || 'e') % 5 = 0""")
    phase("approvals", """
        INSERT INTO sagas_approvalrequest (run_id, step, reason, on_timeout, requested_at, deadline, state,
                                           decided_by_label, decided_at, comment)
        SELECT r.id, 'approve_refund', 'amount over the limit', 'escalate', r.created_at + interval '100 ms',
               r.created_at + interval '3 days', 'APPROVED', 'ann', r.created_at + interval '1 hour', 'ok'
          FROM sagas_workflowrun r WHERE r.status <> 'PENDING' AND hashtext(r.id::text || 'a') % 100 = 0""")
    with connection.cursor() as cur:
        cur.execute("SET session_replication_role = DEFAULT")
    t0 = time.perf_counter()
    autocommit("VACUUM ANALYZE")
    timings["vacuum analyze"] = time.perf_counter() - t0
    return timings


def counts() -> dict[str, int]:
    rows = sql("""
        SELECT (SELECT count(*) FROM sagas_workflowrun), (SELECT count(*) FROM sagas_journalentry),
               (SELECT count(*) FROM ledger_effectrecord), (SELECT count(*) FROM sagas_approvalrequest),
               (SELECT count(*) FROM bench_expect WHERE category = 'old'),
               (SELECT count(*) FROM sagas_journalentry j JOIN bench_expect e ON e.id = j.run_id AND e.category = 'old')
    """, fetch=True)[0]
    return dict(zip(["runs", "journal entries", "effect records", "approvals", "runs due", "journal entries due"], rows))


def kept_fingerprint() -> tuple:
    """Young and live runs, their journals, effects and approvals, as a checksum: unchanged by archiving."""
    return tuple(sql("""
        SELECT (SELECT count(*) || ':' || md5(string_agg(r::text, ',' ORDER BY r.id))
                  FROM sagas_workflowrun r JOIN bench_expect e ON e.id = r.id AND e.category <> 'old'),
               (SELECT count(*) || ':' || md5(string_agg(j::text, ',' ORDER BY j.run_id, j.seq))
                  FROM sagas_journalentry j JOIN bench_expect e ON e.id = j.run_id AND e.category <> 'old'),
               (SELECT count(*) || ':' || md5(string_agg(f::text, ',' ORDER BY f.id))
                  FROM ledger_effectrecord f JOIN bench_expect e ON e.id = f.run_id AND e.category <> 'old'),
               (SELECT count(*) || ':' || md5(string_agg(a::text, ',' ORDER BY a.id))
                  FROM sagas_approvalrequest a JOIN bench_expect e ON e.id = a.run_id AND e.category <> 'old')
    """, fetch=True)[0])


TABLES = ("sagas_journalentry", "sagas_workflowrun", "ledger_effectrecord")


def table_sizes() -> dict[str, int]:
    return {t: sql("SELECT pg_total_relation_size(%s)", [t], fetch=True)[0][0] for t in TABLES}


# --- the load: a worker, its starter, the run list sampler ----------------------------------------


def fork(target: Callable[[], None], log_path: Path) -> int:
    """A child running ``target()`` until it returns or is sent SIGTERM; its output goes to ``log_path``."""
    from django.db import connections

    connections.close_all()  # a child must not share this process's database socket
    pid = os.fork()
    if pid == 0:
        code = 1
        common.forget_inherited_connections()
        try:
            log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            target()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        except BaseException:  # noqa: BLE001  (the parent reports the exit; the log has the trace)
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code)
    return pid


def starter(backlog: int) -> None:
    """Keeps ``backlog`` runs of the live workflow PENDING or RUNNING, so the worker never waits for work."""
    from sagas import start
    from sagas.models import WorkflowRun

    while True:
        waiting = WorkflowRun.objects.filter(workflow_name=LIVE_WORKFLOW, status__in=["PENDING", "RUNNING"]).count()
        for _ in range(max(0, backlog - waiting)):
            start(LIVE_WORKFLOW, {})
        time.sleep(0.05)


def viewer_user():  # type: ignore[no-untyped-def]
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from operators import roles

    roles.ensure_groups()
    user, _ = get_user_model().objects.get_or_create(username=VIEWER)
    user.groups.add(Group.objects.get(name=roles.VIEWER))
    return user


def sampler(out: Path) -> None:
    """GET /runs/ as a logged-in viewer every SAMPLE_EVERY seconds; one line per request: unix
    time, ms, status, the machine's 1-minute load average."""
    from django.test import Client

    client = Client()
    client.force_login(viewer_user())
    with open(out, "a", buffering=1) as f:
        while True:
            began = time.time()
            t0 = time.perf_counter()
            response = client.get("/runs/")
            ms = (time.perf_counter() - t0) * 1000
            f.write(f"{began:.3f} {ms:.2f} {response.status_code} {os.getloadavg()[0]:.2f}\n")
            time.sleep(max(0.0, SAMPLE_EVERY - (time.time() - began)))


def spawn_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:  # a file, never a pipe nobody drains
        return subprocess.Popen(
            [sys.executable, "manage.py", "sagas_worker", "--no-sweep", "--concurrency", "1"],
            cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@dataclass
class Phase:
    """A phase of the measurement: one span of time, or several (the archiving slices, the quiet windows)."""

    name: str
    spans: list[tuple[float, float]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(end - start for start, end in self.spans)

    def holds(self, t: float) -> bool:
        return any(start <= t < end for start, end in self.spans)


def steps_in(phases: list[Phase], window: float) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Steps/s of the worker per phase (completed runs x steps, by finished_at) and per window inside its spans."""
    finished = [t for (t,) in sql(
        "SELECT extract(epoch FROM finished_at)::float8 FROM sagas_workflowrun WHERE workflow_name = %s "
        "AND status = 'COMPLETED' AND finished_at IS NOT NULL", [LIVE_WORKFLOW], fetch=True)]
    rates: dict[str, float] = {}
    windows: dict[str, list[float]] = {}
    for p in phases:
        n = sum(1 for t in finished if p.holds(t))
        rates[p.name] = n * STEPS_PER_RUN / p.seconds if p.seconds else float("nan")
        edges = []
        for start, end in p.spans:
            w = start
            while w + window <= end + 1e-9:
                edges.append(w)
                w += window
        windows[p.name] = [sum(1 for t in finished if e <= t < e + window) * STEPS_PER_RUN / window for e in edges]
    return rates, windows


def list_latency(samples: Path, phases: list[Phase]) -> tuple[dict[str, list[float]], dict[str, float], int]:
    """Run list times (ms) per phase, the mean load average per phase, requests not answered 200."""
    rows = [line.split() for line in samples.read_text().splitlines() if line.strip()]
    bad = sum(1 for r in rows if r[2] != "200")
    out = {p.name: [float(ms) for t, ms, _, _ in rows if p.holds(float(t))] for p in phases}
    load = {p.name: [float(la) for t, _, _, la in rows if p.holds(float(t))] for p in phases}
    return out, {name: sum(v) / len(v) if v else float("nan") for name, v in load.items()}, bad


def archive_in_slices(archive_due, *, batch_size: int, pause: float, slice_s: float, quiet_s: float,  # type: ignore[no-untyped-def]
                      archiving: Phase, quiet: Phase):
    """``archive_due`` one batch at a time for ``slice_s`` seconds, then nothing for ``quiet_s``
    seconds, until nothing is due. The quiet windows measure the worker beside the archiving
    slices under the same load from the rest of the machine (which a before/after baseline
    does not: on a shared machine that load changes more in 20 minutes than archiving does)."""
    from sagas.retention.archiving import ArchiveReport

    total = ArchiveReport()
    while True:
        start, done = time.time(), False
        while time.time() - start < slice_s:
            r = archive_due(batch_size=batch_size, pause=pause, max_batches=1)
            if not r.batches:
                done = True
                break
            total.add(r)
        archiving.spans.append((start, time.time()))
        if done or not quiet_s:
            return total
        start = time.time()
        time.sleep(quiet_s)
        quiet.spans.append((start, time.time()))


# --- partitioning input ---------------------------------------------------------------------------


def partition_figures(batch_runs: int) -> list[tuple[str, ...]]:
    """DELETE of one month's runs' journal in batches of ``batch_runs`` runs (a commit each, as
    archive_due deletes) from a plain copy of the journal, against DETACH + DROP of the monthly
    partition holding the same rows in a partitioned copy. Both copies hold the journal of the
    old runs created in three whole months, with the journal's columns and its indexes (the
    partitioned one's unique keys include the partition key, as PostgreSQL requires); the plain
    copy carries the journal's own row triggers, so each deleted row pays what it pays there."""
    import psycopg
    from django.db import connection

    (months,) = sql("""SELECT array_agg(m ORDER BY m) FROM (
                         SELECT date_trunc('month', created_at) AS m FROM sagas_workflowrun r
                           JOIN bench_expect e ON e.id = r.id AND e.category = 'old'
                          GROUP BY 1 ORDER BY count(*) DESC LIMIT 3) x""", fetch=True)[0]
    first, middle, last = months[0], months[1], months[2]
    # The runs of one calendar month whose whole journal (0.5 s) lies inside it.
    runs_in = ("SELECT r.id FROM sagas_workflowrun r JOIN bench_expect e ON e.id = r.id AND e.category = 'old' "
               "WHERE r.created_at >= %s AND r.created_at < %s::timestamptz + interval '1 month' - interval '1 second'")
    sql("DROP TABLE IF EXISTS bench_journal_plain, bench_journal_monthly CASCADE")
    sql("CREATE TABLE bench_journal_plain (LIKE sagas_journalentry INCLUDING ALL)")
    allow = retention_delete_setting()
    triggers = sql("""SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
                       WHERE t.tgrelid = 'sagas_journalentry'::regclass AND NOT t.tgisinternal""", fetch=True)
    for (definition,) in triggers if allow else []:  # without retention's way through, they refuse the DELETE
        sql(definition.replace(" ON public.sagas_journalentry ", " ON public.bench_journal_plain ")
            .replace("CREATE TRIGGER ", "CREATE TRIGGER bench_plain_", 1))
    sql("""CREATE TABLE bench_journal_monthly (LIKE sagas_journalentry INCLUDING DEFAULTS)
           PARTITION BY RANGE (created_at)""")
    sql("ALTER TABLE bench_journal_monthly ADD PRIMARY KEY (id, created_at)")
    sql("ALTER TABLE bench_journal_monthly ADD UNIQUE (run_id, seq, created_at)")
    for i, month in enumerate(months):
        sql(f"CREATE TABLE bench_journal_m{i} PARTITION OF bench_journal_monthly "
            f"FOR VALUES FROM (%s) TO (%s::timestamptz + interval '1 month')", [month, month])
    t0 = time.perf_counter()
    for month in (first, middle, last):
        copy = f"""SELECT j.* FROM sagas_journalentry j WHERE j.run_id IN ({runs_in})"""
        sql(f"INSERT INTO bench_journal_plain {copy}", [month, month])
        sql(f"INSERT INTO bench_journal_monthly {copy}", [month, month])
    copied = time.perf_counter() - t0
    autocommit("VACUUM ANALYZE bench_journal_plain")
    autocommit("VACUUM ANALYZE bench_journal_monthly")
    ids = [str(i) for (i,) in sql(runs_in + " ORDER BY r.id", [middle, middle], fetch=True)]
    (rows,) = sql("SELECT count(*) FROM bench_journal_m1", fetch=True)[0]
    (plain_rows,) = sql("SELECT count(*) FROM bench_journal_plain WHERE run_id = ANY(%s::uuid[])", [ids],
                        fetch=True)[0]
    before_plain = sql("SELECT pg_total_relation_size('bench_journal_plain')", fetch=True)[0][0]
    params = {k: v for k, v in connection.get_connection_params().items()
              if k in {"host", "port", "user", "password", "dbname"}}
    with psycopg.connect(autocommit=True, **params) as conn:
        t0 = time.perf_counter()
        deleted = 0
        for i in range(0, len(ids), batch_runs):
            with conn.transaction():
                if allow:
                    conn.execute(allow)
                deleted += conn.execute("DELETE FROM bench_journal_plain WHERE run_id = ANY(%s::uuid[])",
                                        [ids[i:i + batch_runs]]).rowcount
        delete_s = time.perf_counter() - t0
        after_plain = conn.execute("SELECT pg_total_relation_size('bench_journal_plain')").fetchone()[0]
        t0 = time.perf_counter()
        with conn.transaction():
            conn.execute("ALTER TABLE bench_journal_monthly DETACH PARTITION bench_journal_m1")
            conn.execute("DROP TABLE bench_journal_m1")
        drop_s = time.perf_counter() - t0
    if deleted != plain_rows or rows != plain_rows:
        raise SystemExit(f"partition figures: deleted {deleted}, partition held {rows}, expected {plain_rows}")
    sql("DROP TABLE bench_journal_plain, bench_journal_monthly CASCADE")
    mb = 1024 * 1024
    return [
        ("figure", "plain journal: DELETE in batches", "monthly partitions: DETACH + DROP"),
        ("journal rows removed (one month's runs)", f"{deleted:,}", f"{rows:,}"),
        ("runs", f"{len(ids):,} in {-(-len(ids) // batch_runs)} batches of {batch_runs}", "1 partition"),
        ("time", f"{delete_s:.2f} s", f"{drop_s * 1000:.1f} ms"),
        ("rows/s", f"{deleted / delete_s:,.0f}", f"{rows / max(drop_s, 1e-9):,.0f}"),
        ("disk given back at once", f"{(before_plain - after_plain) / mb:.0f} MB of {before_plain / mb:.0f} MB "
         "(VACUUM makes the space reusable, does not return it)", "the partition's files"),
        ("copies (3 months each, loaded in)", f"{copied:.1f} s", ""),
    ]


def retention_delete_setting() -> str:
    """The statement by which retention's delete (``sagas_archive_delete``, migration 0012) lets
    its transaction through the journal's append-only trigger; "" if the trigger has no such path."""
    (source,) = sql("SELECT coalesce(max(prosrc), '') FROM pg_proc WHERE proname = 'sagas_journal_append_only'",
                    fetch=True)[0]
    if ARCHIVE_GUC not in source:
        return ""
    return f"SELECT set_config('{ARCHIVE_GUC}', 'on', true)"


# --- verification -------------------------------------------------------------------------------


def verify(kept_before: tuple) -> list[tuple[str, str]]:
    """What must hold after archiving: (label, count that must be 0)."""
    from django.apps import apps

    checks = [
        ("archived runs still in the runs table",
         "SELECT count(*) FROM bench_expect e JOIN sagas_workflowrun r ON r.id = e.id WHERE e.category = 'old'"),
        ("archived runs with journal entries left",
         "SELECT count(DISTINCT j.run_id) FROM bench_expect e JOIN sagas_journalentry j ON j.run_id = e.id "
         "WHERE e.category = 'old'"),
        ("archived runs with effect records or approvals left",
         "SELECT (SELECT count(*) FROM bench_expect e JOIN sagas_approvalrequest a ON a.run_id = e.id "
         "WHERE e.category = 'old') + (SELECT count(*) FROM bench_expect e JOIN ledger_effectrecord f "
         "ON f.run_id = e.id WHERE e.category = 'old')"),
    ]
    try:
        model = apps.get_model("sagas", "ArchivedRun")
    except LookupError:
        model = None
    if model is not None:
        table = model._meta.db_table
        column = next((f.column for f in model._meta.fields if f.column in ("run_id", "id") and
                       f.get_internal_type() == "UUIDField"), "run_id")
        checks.append(("archived runs without an ArchivedRun row",
                       f"SELECT count(*) FROM bench_expect e WHERE e.category = 'old' AND NOT EXISTS "
                       f"(SELECT 1 FROM {table} a WHERE a.{column} = e.id)"))
    out = [(label, str(sql(q, fetch=True)[0][0])) for label, q in checks]
    if model is not None:
        out.append(read_back(model))
    if model is None:
        out.append(("archived runs without an ArchivedRun row", "no ArchivedRun model"))
    after = kept_fingerprint()
    changed = [name for name, a, b in zip(("runs", "journal", "effects", "approvals"), kept_before, after) if a != b]
    out.append(("young and live runs changed (runs, journal, effects, approvals)",
                str(len(changed)) + (f" ({', '.join(changed)})" if changed else "")))
    return out


def read_back(model, sample: int = 200) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Open ``sample`` archived runs from their files (sagas.retention.store.run_lines): each must give
    its run line and its 10 journal entries, in order."""
    from sagas.retention.store import run_lines, store_for_location

    rows = sql(f"""SELECT a.run_id::text, a.location, a."offset", a.length FROM {model._meta.db_table} a
                    JOIN bench_expect e ON e.id = a.run_id AND e.category = 'old'
                   ORDER BY md5(a.run_id::text) LIMIT %s""", [sample], fetch=True)
    wrong = 0
    for run_id, location, offset, length in rows:
        lines = run_lines(store_for_location(location), location, offset, length, run_id)
        runs = [line for line in lines if line.get("type") == "run"]
        seqs = [line.get("seq") for line in lines if line.get("type") == "journal"]
        wrong += not (len(runs) == 1 and seqs == list(range(1, 11)))
    return (f"archived runs read back from their file without their run line and 10 entries ({len(rows)} sampled)",
            str(wrong))


# --- main ----------------------------------------------------------------------------------------


def fmt_ms(values: list[float]) -> str:
    if not values:
        return "-"
    return (f"{common.percentile(values, 50):.1f} / {common.percentile(values, 95):.1f} / {max(values):.1f} ms "
            f"({len(values)})")


def main() -> None:  # noqa: PLR0915  (one straight story, printed in order)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="2,000 runs and short windows, for the test suite")
    parser.add_argument("--runs", type=int, default=None, help="runs to archive (default 1,000,000)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="archive_due's batch_size (default: SAGAS_ARCHIVE_BATCH, as the scheduled pass)")
    parser.add_argument("--pause", type=float, default=None,
                        help="archive_due's pause between batches in seconds (default: SAGAS_ARCHIVE_PAUSE)")
    parser.add_argument("--slice", type=float, default=50.0, help="seconds of archiving between quiet windows")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds of each quiet window (0: none)")
    parser.add_argument("--no-partition", action="store_true", help="skip the partitioning figures (step 5)")
    parser.add_argument("--keep-archive", action="store_true", help="keep the archive files (default: deleted)")
    parser.add_argument("--baseline", type=float, default=None, help="seconds of the baseline phase")
    parser.add_argument("--dir", type=Path, default=None, help="where the private server lives (default: TMPDIR)")
    args = parser.parse_args()
    runs = args.runs or (2_000 if args.smoke else 1_000_000)
    sizes = Sizes(old=runs, young=max(100, runs // 50), live=max(60, runs // 100))
    warmup, baseline, after, window = (2, 5, 2, 2.0) if args.smoke else (15, 60, 30, 10.0)
    slice_s, quiet_s = (1.0, 1.0) if args.smoke else (args.slice, args.quiet)
    baseline = args.baseline or baseline
    work = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; logs in {work}", flush=True)

    server = start_server(args.dir)
    common.BENCH_DB = server.url(DB)
    common.BENCH_REDIS = REDIS_URL
    archive_dir = work / "archive"
    # The worker runs --no-sweep, so it never archives on its own; the interval says so twice.
    extra = dict(django_env(), SAGAS_ARCHIVE_URL=f"file://{archive_dir}", SAGAS_ARCHIVE_INTERVAL="0")
    common.setup_django(**extra)
    env = common.bench_env(**extra)
    from django.conf import settings

    from sagas.retention.archiving import archive_due

    # --smoke: batches of 100, so that its 2,000 runs take more than one archiving slice.
    batch_size = args.batch_size or (100 if args.smoke else settings.SAGAS_ARCHIVE_BATCH)
    pause = args.pause if args.pause is not None else settings.SAGAS_ARCHIVE_PAUSE

    from sagas.runtime.queue import redis_connection

    redis_connection().flushdb()  # Redis db 11: this bench's own
    t0 = time.perf_counter()
    made = seed(sizes)
    made["total"] = time.perf_counter() - t0
    print("seeded in " + ", ".join(f"{k} {v:.1f} s" for k, v in made.items()), flush=True)
    shown = durable(server)
    print("measured with " + ", ".join(f"{k}={v}" for k, v in shown.items()), flush=True)
    have = counts()
    print("data: " + ", ".join(f"{k} {v:,}" for k, v in have.items()), flush=True)
    kept_before = kept_fingerprint()
    sizes_before = table_sizes()

    partition_rows: list[tuple[str, ...]] = []
    if not args.no_partition:
        t0 = time.perf_counter()
        partition_rows = partition_figures(batch_size)
        print(f"partitioning figures in {time.perf_counter() - t0:.0f} s", flush=True)
    autocommit("CHECKPOINT")

    viewer_user()
    samples = work / "runlist.txt"
    worker = spawn_worker(env, work / "worker.log")
    feeder = fork(lambda: starter(backlog=40), work / "starter.log")
    watcher = fork(lambda: sampler(samples), work / "sampler.log")
    phases: list[Phase] = []
    report = None
    try:
        # The warm-up counts from the worker's first completed run, not from its start: on a
        # loaded machine (the test suite's smoke run) its start alone took longer than the
        # smoke's whole warm-up, and a baseline without a completed run has no rate.
        def first_run_done() -> bool:
            return worker.poll() is not None or bool(sql(
                "SELECT 1 FROM sagas_workflowrun WHERE workflow_name = %s AND status = 'COMPLETED' LIMIT 1",
                [LIVE_WORKFLOW], fetch=True))

        common.wait_for(first_run_done, timeout=180, interval=0.2)
        time.sleep(warmup)
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited {worker.returncode}: {(work / 'worker.log').read_text()[-2000:]}")
        p0 = time.time()
        time.sleep(baseline)
        phases.append(Phase("baseline", [(p0, time.time())]))
        archiving, quiet = Phase("archiving"), Phase("quiet windows between archiving slices")
        phases += [archiving, quiet]
        cpu0 = time.process_time()
        report = archive_in_slices(archive_due, batch_size=batch_size, pause=pause, slice_s=slice_s,
                                   quiet_s=quiet_s, archiving=archiving, quiet=quiet)
        archive_cpu = time.process_time() - cpu0
        p0 = time.time()
        time.sleep(after)
        phases.append(Phase("after", [(p0, time.time())]))
    finally:
        stop(watcher)
        stop(feeder)
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    time.sleep(0.5)
    sizes_after = table_sizes()
    autocommit("VACUUM sagas_journalentry")
    autocommit("VACUUM sagas_workflowrun")
    autocommit("VACUUM ledger_effectrecord")
    sizes_vacuumed = table_sizes()
    rates, windows = steps_in(phases, window)
    latency, load, bad = list_latency(samples, phases)
    checks = verify(kept_before)

    files = [Path(unquote(urlparse(f).path) if f.startswith("file:") else f) for f in report.files]
    archived_bytes = sum(f.stat().st_size for f in files if f.exists())
    if not args.keep_archive:
        shutil.rmtree(archive_dir, ignore_errors=True)
    mb = 1024 * 1024
    quiet_name = phases[2].name
    drop = 100 * (1 - rates["archiving"] / rates["baseline"]) if rates["baseline"] else float("nan")
    paired = 100 * (1 - rates["archiving"] / rates[quiet_name]) if phases[2].spans else float("nan")
    p95s = {name: common.percentile(values, 95) for name, values in latency.items() if values}
    worst_p95 = max(p95s.values()) if p95s else float("nan")
    rows: list[tuple[str, ...]] = [
        ("figure", "value", "target"),
        ("seeding", f"{made['total']:.0f} s ({have['runs due']:,} runs due, {have['journal entries due']:,} of "
                    f"{have['journal entries']:,} entries; fsync off)", "-"),
        ("runs archived", f"{report.runs:,} in {report.batches:,} batches of {batch_size}, pause {pause:g} s",
         f"{have['runs due']:,}"),
        ("journal entries / effect records archived", f"{report.journal_entries:,} / {report.effects:,}", "-"),
        ("archive time", f"{report.seconds:.1f} s", "-"),
        ("runs archived per second", f"{report.runs / report.seconds:,.0f}" if report.seconds else "-", "-"),
        ("CPU of the archiving process (its PostgreSQL backend not included)",
         f"{archive_cpu:.1f} s, {1e6 * archive_cpu / max(report.runs, 1):.0f} us per run", "-"),
        ("archive files", f"{len(files)} files, {archived_bytes / mb:.1f} MB", "-"),
        ("compressed bytes per archived run", f"{archived_bytes / max(report.runs, 1):,.0f}", "-"),
    ]
    for t in TABLES:
        rows.append((f"{t}: size before / after / after VACUUM",
                     f"{sizes_before[t] / mb:,.0f} / {sizes_after[t] / mb:,.0f} / {sizes_vacuumed[t] / mb:,.0f} MB", "-"))
    for p in phases:
        rows.append((f"worker steps/s, {p.name}",
                     f"{rates[p.name]:.0f} ({p.seconds:.0f} s, load average {load[p.name]:.1f})", "-"))

    def pct(value: float) -> str:
        return f"{value:.1f} %" if not value < 0 else f"0 % (it ran {-value:.1f} % faster)"

    rows.append(("worker throughput drop while archiving, against the baseline before", pct(drop),
                 f"< {TARGET_DROP:g} %"))
    rows.append(("worker throughput drop while archiving, against the quiet windows between slices", pct(paired),
                 f"< {TARGET_DROP:g} %"))
    for p in phases:
        rows.append((f"run list p50 / p95 / max (samples), {p.name}", fmt_ms(latency[p.name]),
                     f"p95 < {TARGET_LIST_P95:g} ms"))
    rows.append(("run list requests not answered 200", str(bad), "0"))
    rows.extend((label, value, "0") for label, value in checks)
    common.print_table(
        f"Retention under load ({have['runs due']:,} runs due; one worker process at concurrency 1, "
        f"run list every {SAMPLE_EVERY:g} s)", rows)
    for p in phases:
        print(f"steps/s per {window:g} s window, {p.name}: " + ", ".join(f"{v:.0f}" for v in windows[p.name]))
    if partition_rows:
        common.print_table("Journal removal of one month: plain table against monthly partitions", partition_rows)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    met = drop < TARGET_DROP and paired < TARGET_DROP and worst_p95 < TARGET_LIST_P95
    print(f"Targets: {'met' if met else 'missed'} (throughput drop {drop:.1f} % against the baseline, {paired:.1f} % "
          f"against the quiet windows; worst phase run list p95 {worst_p95:.1f} ms)")
    broken = [label for label, value in checks if not value.startswith("0")] + (["run list errors"] if bad else [])
    if broken:
        raise SystemExit(f"archiving broke: {'; '.join(broken)} (logs in {work})")
    if args.smoke:  # the test suite runs it: leave nothing behind in TMPDIR
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
