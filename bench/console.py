"""Console page times on a large database, and live-update latency in a real browser.

    .venv/bin/python bench/console.py            # 1,000,000 runs, 10,000,000 journal entries
    .venv/bin/python bench/console.py --fresh    # regenerate the data even if it is there
    .venv/bin/python bench/console.py --smoke    # 2,000 runs, 20,000 entries (run by the test suite)
    .venv/bin/python bench/console.py --size 10m # 10,000,000 runs, 100,000,000 journal entries

Uses its own database (``saga_bench_console``, ``saga_bench_console_10m`` with ``--size 10m``,
``saga_bench_console_smoke`` with ``--smoke``)
and Redis db 14. The data is generated with set-based SQL (``INSERT ... SELECT FROM
generate_series``) and kept: a marker table records the sizes, so a rerun only measures
(``--smoke`` regenerates its tiny data every time).

Prints one table. Figures:

* per page, the medians of where the time goes (``Breakdown``): SQL statements and their
  time, template rendering (less the SQL a template runs), redaction, and the rest (view
  code, serialisation, middleware), in ms, from a second series of as many requests;
* server time of console pages, in-process with ``django.test.Client`` logged in as an
  operator (``force_login``), DEBUG off: 3 warm-ups, then p50 and p95 of N requests, taken in
  rounds of one request per page (a slow minute slows every page alike);
* at 10M runs, each page's p95 against its p95 in the last 1M run (kept in
  ``.bench/console-p95-1m.json``), target at most 1.5;
* live update: a run detail page of a WAITING run open in Chromium against daphne (on the
  bench database), its socket open ("live"); the bench cancels the run through
  ``sagas.services.run_cancel`` and measures from just before the commit (``Date.now()``
  clock of this machine) to when a MutationObserver in the page sees the header's status
  badge read CANCELLED. One fresh page and one fresh WAITING run per sample.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

SIZES = {
    # runs, total journal entries (approximate), entries of the long run, requests, live updates
    "full": dict(runs=1_000_000, entries=10_000_000, long=20_000, requests=60, live=20, effects_unknown=2_000,
                 audit=200_000, db="saga_bench_console"),
    # Ten times the full size (the long run stays 20,000 entries): --size 10m.
    "10m": dict(runs=10_000_000, entries=100_000_000, long=20_000, requests=60, live=20, effects_unknown=20_000,
                audit=2_000_000, db="saga_bench_console_10m"),
    # The suite's run only has to show that every page answers and every row prints: one warm-up.
    "smoke": dict(runs=2_000, entries=20_000, long=2_000, requests=3, warmups=1, live=3, effects_unknown=50,
                  audit=2_000, db="saga_bench_console_smoke"),
}
WARMUPS = 3  # a size's "warmups" when it names none
KEPT_INDEXES = "bench_console_kept_indexes"  # the runs indexes dropped during a load
RATIO = 2.0  # every page's p95 against the unfiltered run list's, in the same run
GROWTH = 1.5  # at 10M runs, every page's p95 against its own at 1M (the last 1M run's figures)
# The p95 of each page in the last full run of each size, for the 10M run's comparison.
FIGURES = Path(__file__).resolve().parent.parent / ".bench" / "console-p95-{size}.json"
WORKFLOWS = ["order_fulfilment", "payment_refund", "kyc_check", "invoice_sync", "shipment_track",
             "subscription_renew", "loan_origination", "data_export"]
TENANTS = 40
ACTORS = ["olga", "sam", "ann", "vic", "ops-bot", "maria", "li", "kwame", "jon", "eve"]
OPERATOR = "bench-operator"
CHROMIUM = "/usr/bin/chromium"
# As tests/browser/conftest.py.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def django_env(db: str) -> dict[str, str]:
    base = common.BENCH_DB.rsplit("/", 1)[0]
    return dict(
        BENCH_DB_URL=f"{base}/{db}",
        DEBUG="false",
        SECRET_KEY="bench-console-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
        ALLOWED_HOSTS="testserver,127.0.0.1,localhost",
    )


# --- data ---------------------------------------------------------------------------------------

MARKER = "bench_console_marker"


def data_present(size: dict) -> bool:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", [MARKER])
        if cur.fetchone()[0] is None:
            return False
        cur.execute(f"SELECT runs, long_entries, audit FROM {MARKER}")
        row = cur.fetchone()
    return row == (size["runs"], size["long"], size["audit"])


def generate(size: dict) -> dict[str, float]:
    """Fill the bench database; returns seconds per phase."""
    from django.db import connection

    from core.append_only import TRUNCATE_ESCAPE_GUC

    runs, long_entries = size["runs"], size["long"]
    # Entries per ordinary run: 5 + n % k, averaging (entries - long) / (runs - 1).
    avg = (size["entries"] - long_entries) / max(runs - 1, 1)
    spread = max(1, int(round(2 * (avg - 5))) + 1)  # 5 + n % spread averages 5 + (spread - 1) / 2
    timings: dict[str, float] = {}

    def phase(name: str, sql: str, params: list | None = None) -> None:
        t0 = time.perf_counter()
        with connection.cursor() as cur:
            # Modulo is %% to the driver; %s stays a placeholder.
            cur.execute(sql.replace("%", "%%").replace("%%s", "%s"), params or [])
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {MARKER}")
        # The journal and the audit log refuse TRUNCATE too, unless the session says it is a
        # harness emptying its own database (core.append_only).
        cur.execute(f"SET {TRUNCATE_ESCAPE_GUC} = on")
        cur.execute("""TRUNCATE sagas_journalentry, sagas_approvalrequest, sagas_compensationitem,
                       sagas_compensationplan, sagas_workflowrun, ledger_effectrecord, console_auditentry,
                       sagas_workflowversion CASCADE""")
        # This session only: no per-row FK triggers during the bulk load (the data is consistent
        # by construction, and the constraints are not dropped).
        cur.execute("SET session_replication_role = replica")
        # The unique (run_id, seq) index of 100M entries sorts in memory rather than in 64 MB runs.
        cur.execute("SET maintenance_work_mem = '2GB'")
        cur.execute("SET work_mem = '256MB'")
        # Built again after the load, from sorted input: much cheaper than 10M random inserts.
        cur.execute("ALTER TABLE sagas_journalentry DROP CONSTRAINT IF EXISTS journal_unique_run_seq")

    # The runs table's secondary indexes (trigram, prefix, status, tenant...) are dropped for the
    # load and built again after it from one sorted pass each: maintaining them through 10M random
    # inserts took most of the 10M generation. Their definitions are kept in a table first, so an
    # interrupted load still gets them back on the next run.
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {KEPT_INDEXES} (name text PRIMARY KEY, def text NOT NULL)")
        cur.execute(f"""INSERT INTO {KEPT_INDEXES}
            SELECT i.indexname, i.indexdef FROM pg_indexes i
             WHERE i.schemaname = current_schema() AND i.tablename = 'sagas_workflowrun'
               AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = (quote_ident(i.indexname))::regclass)
            ON CONFLICT (name) DO NOTHING""")
        cur.execute(f"SELECT name, def FROM {KEPT_INDEXES} ORDER BY name")
        kept = cur.fetchall()
        for name, _ in kept:
            cur.execute(f"DROP INDEX IF EXISTS {connection.ops.quote_name(name)}")

    phase("versions", """
        INSERT INTO sagas_workflowversion (name, version, definition_hash, source, module,
                                           first_registered_at, last_registered_at)
        SELECT w, v, md5(w || v), 'def ' || w || '(ctx, data):\n    return ' || v || '\n', 'bench.fake',
               now() - interval '60 days', now()
          FROM unnest(%s::text[]) AS w, generate_series(1, 3) AS v""", [WORKFLOWS])

    # Runs. n = 1 is the long run. Status mix (per mille): 940 COMPLETED, 20 WAITING,
    # 10 NEEDS_ATTENTION, 15 FAILED, 10 CANCELLED, 5 COMPENSATED.
    phase("runs", f"""
        INSERT INTO sagas_workflowrun (id, workflow_name, version, definition_hash, input, business_key, tenant,
            status, status_reason, result, error, lease_owner, fence, attempts, last_seq, steps_used, cost_used,
            created_at, updated_at, started_at, finished_at, started_via, summary)
        SELECT id, wf, ver, md5(wf || ver), jsonb_build_object('n', n, 'amount', n % 997), bk, tenant,
               st, CASE st WHEN 'NEEDS_ATTENTION' THEN (ARRAY['effect_unknown','budget_exceeded','version_mismatch'])[1 + n % 3]
                           WHEN 'FAILED' THEN 'workflow_error' WHEN 'CANCELLED' THEN 'cancelled' ELSE '' END,
               CASE WHEN st = 'COMPLETED' THEN jsonb_build_object('ok', true) END,
               CASE WHEN st = 'FAILED' THEN jsonb_build_object('code', 'workflow_error', 'message', 'boom') END,
               '', 1 + n % 3, 1 + n % 3, entries, greatest(entries - 3, 0), (n % 50) * 0.01,
               created, created + entries * interval '50 ms', created + interval '20 ms',
               CASE WHEN st IN ('COMPLETED','FAILED','CANCELLED','COMPENSATED') THEN created + entries * interval '50 ms' END,
               'api', jsonb_build_object('order', bk, 'customer', 'customer-' || (n % 5000),
                                         'amount', (n % 997) || '.00 EUR')
          FROM (
            SELECT n,
                   md5('run' || n)::uuid AS id,
                   ('{{{",".join(WORKFLOWS)}}}'::text[])[1 + (n * 7) % {len(WORKFLOWS)}] AS wf,
                   CASE WHEN n % 10 < 6 THEN 3 WHEN n % 10 < 9 THEN 2 ELSE 1 END AS ver,
                   -- skewed tenants: tenant-01 has the most runs
                   'tenant-' || lpad((1 + floor({TENANTS} * power(((n * 2654435761) % 1000003) / 1000003.0, 2)))::int::text, 2, '0') AS tenant,
                   (ARRAY['ORD','PAY','KYC','INV','SHP','SUB','LOAN','EXP'])[1 + (n * 7) % {len(WORKFLOWS)}]
                       || '-' || lpad(n::text, 8, '0') AS bk,
                   CASE WHEN n = 1 THEN 'WAITING'
                        WHEN n % 1000 < 940 THEN 'COMPLETED' WHEN n % 1000 < 960 THEN 'WAITING'
                        WHEN n % 1000 < 970 THEN 'NEEDS_ATTENTION' WHEN n % 1000 < 985 THEN 'FAILED'
                        WHEN n % 1000 < 995 THEN 'CANCELLED' ELSE 'COMPENSATED' END AS st,
                   CASE WHEN n = 1 THEN {long_entries} ELSE 5 + n % {spread} END AS entries,
                   now() - interval '30 days' * (((n * 40503) % 1000033) / 1000033.0) AS created
              FROM generate_series(1::bigint, %s) AS n
          ) AS g""", [runs])

    # Journal: started, claimed, steps..., and the outcome. One run's seqs are 1..last_seq. The
    # long run (the only one over 100 entries) has an effect every 10 entries, its intent and then
    # its result, for the history timeline's pairs and kind filter.
    for _, definition in kept:
        phase("runs index", definition)
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE {KEPT_INDEXES}")

    phase("journal", common.CONSOLE_JOURNAL_SQL.format(schema="public", extra="", extra_value=""))
    phase("journal index", "ALTER TABLE sagas_journalentry ADD CONSTRAINT journal_unique_run_seq UNIQUE (run_id, seq)")

    # Ledger: effect records of completed runs (settled), UNKNOWN ones on runs needing attention.
    phase("effects", """
        INSERT INTO ledger_effectrecord (tenant, idempotency_key, kind, run_id, workflow_name, business_key,
            step_name, connector, request_payload,
            payload_hash, status, result, downstream_ref, attempts, error_class, error_message, intent_at,
            dispatched_at, completed_at, updated_at, checks, next_check_at, resolved_by_label, resolution,
            resolution_note)
        SELECT r.tenant, r.id || ':charge', 'effect', r.id, r.workflow_name, r.business_key, 'charge', 'payments.capture',
               jsonb_build_object('amount', 10), md5(r.id::text), 'SUCCEEDED', jsonb_build_object('ok', true),
               'ch_' || left(md5(r.id::text), 12), 1, '', '', r.created_at + interval '100 ms',
               r.created_at + interval '110 ms', r.created_at + interval '300 ms', r.created_at + interval '300 ms',
               0, NULL, '', '', ''
          FROM sagas_workflowrun r WHERE r.status = 'COMPLETED' AND hashtext(r.id::text) % 10 = 0""")
    phase("effects", """
        INSERT INTO ledger_effectrecord (tenant, idempotency_key, kind, run_id, workflow_name, business_key,
            step_name, connector, request_payload,
            payload_hash, status, result, downstream_ref, attempts, error_class, error_message, intent_at,
            dispatched_at, completed_at, updated_at, checks, next_check_at, resolved_by_label, resolution,
            resolution_note)
        SELECT r.tenant, r.id || ':ship', 'effect', r.id, r.workflow_name, r.business_key, 'ship', 'shipping.create',
               jsonb_build_object('parcel', 1), md5(r.id::text || 'ship'), 'UNKNOWN', NULL, '', 1, 'Timeout',
               'no answer within 10 s', r.created_at + interval '100 ms', r.created_at + interval '110 ms', NULL,
               r.updated_at, 1, now() + interval '1 hour', '', '', ''
          FROM sagas_workflowrun r WHERE r.status = 'NEEDS_ATTENTION'
         ORDER BY r.created_at LIMIT %s""", [size["effects_unknown"]])

    # Approvals: open ones on some waiting runs, decided ones on completed runs.
    phase("approvals", """
        INSERT INTO sagas_approvalrequest (run_id, step, reason, on_timeout, requested_at, deadline, state,
                                           decided_by_label, decided_at, comment, run_waits)
        SELECT r.id, 'approve_refund', 'amount over the limit', 'escalate', r.created_at,
               r.created_at + interval '3 days',
               CASE WHEN r.status = 'WAITING' THEN 'PENDING' ELSE 'APPROVED' END,
               CASE WHEN r.status = 'WAITING' THEN '' ELSE 'ann' END,
               CASE WHEN r.status = 'WAITING' THEN NULL ELSE r.created_at + interval '1 hour' END, '',
               r.status = 'WAITING' -- what the triggers would keep (sagas.store.approval_waits)
          FROM sagas_workflowrun r
         WHERE r.workflow_name = 'payment_refund' AND r.id <> md5('run1')::uuid
           AND (r.status = 'WAITING' OR (r.status = 'COMPLETED' AND hashtext(r.id::text) % 4 = 0))""")

    phase("audit", f"""
        INSERT INTO console_auditentry (actor_id, actor_label, action, object_type, object_id, before, after,
                                        reason, ip, outcome, message, created_at, tenant)
        SELECT NULL, (%s::text[])[1 + (n * 13) % {len(ACTORS)}], a, split_part(a, '.', 1),
               md5('run' || (1 + n % %s))::uuid::text,
               jsonb_build_object('status', 'NEEDS_ATTENTION'), jsonb_build_object('status', 'PENDING'),
               'ticket OPS-' || n, ('10.0.0.' || (n % 250))::inet, CASE WHEN n % 50 = 0 THEN 'denied' ELSE 'ok' END, '',
               now() - interval '30 days' * (((n * 7919) % 100003) / 100003.0),
               'tenant-' || lpad((1 + floor({TENANTS} * power((((1 + n % %s) * 2654435761) % 1000003) / 1000003.0, 2)))::int::text, 2, '0')
          FROM generate_series(1::bigint, %s) AS n,
               LATERAL (SELECT (ARRAY['run.retry','run.cancel','run.compensate','effect.resolve','effect.query',
                                      'approval.approve','approval.reject'])[1 + (n * 3) % 7] AS a) AS x""",
          [ACTORS, runs, runs, size["audit"]])

    with connection.cursor() as cur:
        cur.execute("SET session_replication_role = DEFAULT")
        for seq_table in ("sagas_journalentry", "ledger_effectrecord", "sagas_approvalrequest", "console_auditentry"):
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{seq_table}', 'id'), "
                        f"(SELECT coalesce(max(id), 0) + 1 FROM {seq_table}), false)")
    # The load bypassed the runs table's triggers (replica mode): count the runs once, as
    # ``manage.py sagas_recount`` does (sagas.store.counts).
    t0 = time.perf_counter()
    from sagas.store import counts
    counts.rebuild()
    timings["run counts"] = time.perf_counter() - t0
    # VACUUM cannot run in a transaction block: a connection of its own, in autocommit.
    t0 = time.perf_counter()
    _autocommit("VACUUM ANALYZE")
    timings["vacuum analyze"] = time.perf_counter() - t0
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {MARKER} (runs int, long_entries int, audit int, made_at timestamptz)")
        cur.execute(f"INSERT INTO {MARKER} VALUES (%s, %s, %s, now())", [runs, long_entries, size["audit"]])
    return timings


def _autocommit(sql: str) -> None:
    import psycopg
    from django.db import connection

    params = {k: v for k, v in connection.get_connection_params().items()
              if k in {"host", "port", "user", "password", "dbname"}}
    with psycopg.connect(autocommit=True, **params) as conn:
        conn.execute(sql)


def counts() -> dict[str, int]:
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        for label, sql in [
            ("runs", "SELECT count(*) FROM sagas_workflowrun"),
            ("journal entries", "SELECT count(*) FROM sagas_journalentry"),
            ("UNKNOWN effects", "SELECT count(*) FROM ledger_effectrecord WHERE status = 'UNKNOWN'"),
            ("effect records", "SELECT count(*) FROM ledger_effectrecord"),
            ("open approvals", "SELECT count(*) FROM sagas_approvalrequest WHERE state = 'PENDING'"),
            ("audit entries", "SELECT count(*) FROM console_auditentry"),
            ("runs whose last_seq != their entries",
             """SELECT count(*) FROM sagas_workflowrun r
                 WHERE r.last_seq <> (SELECT coalesce(max(seq), 0) FROM sagas_journalentry j WHERE j.run_id = r.id)
                   AND r.id IN (SELECT id FROM sagas_workflowrun ORDER BY id LIMIT 1000)"""),
        ]:
            cur.execute(sql)
            out[label] = cur.fetchone()[0]
    return out


# --- page timings -------------------------------------------------------------------------------


def operator_user():  # type: ignore[no-untyped-def]
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from operators import roles

    roles.ensure_groups()
    user, _ = get_user_model().objects.get_or_create(username=OPERATOR)
    user.groups.add(Group.objects.get(name=roles.OPERATOR))
    return user


class Breakdown:
    """Where one request's server time goes: SQL (time and statements, from the connection's
    execute wrapper), template rendering (outermost ``Template.render`` calls, less the SQL run
    inside them: querysets a template evaluates), redaction (outermost calls of
    ``core.redaction``'s workers) and the rest (view code, serialisation, middleware). Wraps
    for the bench only; the product is not changed."""

    def __init__(self) -> None:
        self.sql = self.sql_in_render = self.render = self.redaction = 0.0
        self.queries = 0
        self._rendering = self._redacting = 0

    def _execute(self, execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent = time.perf_counter() - t0
            self.sql += spent
            self.queries += 1
            if self._rendering:
                self.sql_in_render += spent

    def _timed(self, fn, attr: str, depth: str):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            setattr(self, depth, getattr(self, depth) + 1)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, depth, getattr(self, depth) - 1)
                if not getattr(self, depth):
                    setattr(self, attr, getattr(self, attr) + time.perf_counter() - t0)
        return wrapper

    def __enter__(self) -> Breakdown:
        from django.db import connection
        from django.template import base

        from core import redaction

        self._saved = [(base.Template, "render", base.Template.render),
                       (redaction, "_redact", redaction._redact), (redaction, "_redact_text", redaction._redact_text)]
        base.Template.render = self._timed(base.Template.render, "render", "_rendering")  # type: ignore[method-assign]
        redaction._redact = self._timed(redaction._redact, "redaction", "_redacting")
        redaction._redact_text = self._timed(redaction._redact_text, "redaction", "_redacting")
        self._wrapper = connection.execute_wrapper(self._execute)
        self._wrapper.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._wrapper.__exit__(*exc)
        for owner, name, value in self._saved:
            setattr(owner, name, value)


def time_pages(client, urls: list[str], requests: int,  # type: ignore[no-untyped-def]
               warmups: int = WARMUPS) -> list[tuple[float, float, dict[str, float]]]:
    """Per URL, the p50 and p95 of ``requests`` timed GETs after ``warmups`` untimed ones, then
    the medians of a breakdown of as many more (the wrappers cost a little: they are off while
    the first ones are timed).

    The samples are taken in rounds, one GET of every page per round, so that a slow minute of
    a noisy machine falls on every page alike and the ratios between pages hold (timed page by
    page, the run list's figure and another page's came from different minutes: a ratio moved
    by half from run to run)."""
    for url in urls:
        for _ in range(warmups):
            response = client.get(url)
            if response.status_code != 200:
                raise SystemExit(f"GET {url}: {response.status_code}\n{response.content[:2000]!r}")
    times: list[list[float]] = [[] for _ in urls]
    for _ in range(requests):
        for i, url in enumerate(urls):
            t0 = time.perf_counter()
            response = client.get(url)
            times[i].append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, url
    parts = [{"queries": [], "sql": [], "render": [], "redaction": [], "other": []} for _ in urls]
    for _ in range(requests):
        for i, url in enumerate(urls):
            with Breakdown() as b:
                t0 = time.perf_counter()
                client.get(url)
                total = time.perf_counter() - t0
            render = b.render - b.sql_in_render
            parts[i]["queries"].append(b.queries)
            parts[i]["sql"].append(b.sql * 1000)
            parts[i]["render"].append(render * 1000)
            parts[i]["redaction"].append(b.redaction * 1000)
            parts[i]["other"].append((total - b.sql - render) * 1000)
    return [(common.percentile(t, 50), common.percentile(t, 95),
             {k: common.percentile(v, 50) for k, v in part.items()}) for t, part in zip(times, parts)]


def page_figures(size: dict) -> list[tuple[str, str, float, float, str, dict[str, float]]]:
    from django.db import connection
    from django.test import Client

    from operators.selectors.paging import encode_cursor

    client = Client()
    client.force_login(operator_user())
    with connection.cursor() as cur:
        cur.execute("SELECT id, created_at FROM sagas_workflowrun ORDER BY created_at DESC, id DESC OFFSET %s LIMIT 1",
                    [size["runs"] // 2])
        mid_id, mid_at = cur.fetchone()
        cur.execute("SELECT tenant FROM sagas_workflowrun GROUP BY tenant ORDER BY count(*) LIMIT 1")
        small_tenant = cur.fetchone()[0]
    with connection.cursor() as cur:
        cur.execute("SELECT md5('run1')::uuid")  # the long run (n = 1)
        long_run = str(cur.fetchone()[0])

    first = client.get("/runs/")
    found = re.search(r"after=([0-9]+_[0-9a-f]{32})", first.content.decode())
    if not found:
        raise SystemExit("page 1 of /runs/ has no next link")
    page2 = found.group(1)
    deep = encode_cursor(mid_at, mid_id)
    # The history's "go to entry" answers with a redirect to the page holding it: time that page.
    jump = client.get(f"/runs/{long_run}/history/?seq={size['long'] // 2}")
    middle = (jump["Location"].split("#")[0] if jump.status_code == 302
              else f"/runs/{long_run}/history/?before={size['long'] // 2 + 1}")

    n = size["requests"]
    pages = [
        ("run list, unfiltered", "/runs/", "< 100 ms"),
        ("run list, status=NEEDS_ATTENTION", "/runs/?status=NEEDS_ATTENTION", "< 100 ms"),
        ("run list, workflow + version", "/runs/?workflow=kyc_check&version=1", "< 100 ms"),
        ("run list, tenant (busiest)", "/runs/?tenant=tenant-01", "< 100 ms"),
        (f"run list, tenant (quietest: {small_tenant})", f"/runs/?tenant={small_tenant}", "< 100 ms"),
        ("run list, business-key prefix (q=KYC-0001*)", "/runs/?q=KYC-0001*", "< 100 ms"),
        ("run list, business-key substring, a key's start (q=KYC-0001)", "/runs/?q=KYC-0001", "< 100 ms"),
        ("run list, business-key substring (q=0012: 11,299 keys match)", "/runs/?q=0012", "< 100 ms"),
        ("run list, business-key substring, one key (q=00987654)", "/runs/?q=00987654", "< 100 ms"),
        ("run list, business-key substring, no key (q=nomatch-7)", "/runs/?q=nomatch-7", "< 100 ms"),
        ("run list, two characters, no key starts so (q=zq)", "/runs/?q=zq", "< 100 ms"),
        ("run list, page 2 (cursor of page 1's next link)", f"/runs/?after={page2}", "< 100 ms"),
        (f"run list, deep keyset page (after run {size['runs'] // 2:,})", f"/runs/?after={deep}", "< 100 ms"),
        (f"run detail, {size['long']:,}-entry run, first page", f"/runs/{long_run}/", "< 200 ms"),
        (f"history, {size['long']:,}-entry run, first page", f"/runs/{long_run}/history/", "< 200 ms"),
        (f"history, {size['long']:,}-entry run, middle page (go to #{size['long'] // 2:,})", middle, "< 200 ms"),
        ("history, filtered by kind: effects (1 entry in 5)", f"/runs/{long_run}/history/?kind=effects", "< 200 ms"),
        ("history, filtered by kind: yielded (1 entry)", f"/runs/{long_run}/history/?kind=yielded", "< 200 ms"),
        ("ambiguous-effects queue", "/effects/", "< 100 ms"),
        ("ambiguous-effects queue, connector + age filters", "/effects/?connector=shipping.create&age=1d", "< 100 ms"),
        ("ambiguous-effects queue, workflow + tenant filters", "/effects/?workflow=kyc_check&tenant=tenant-01",
         "< 100 ms"),
        ("ambiguous-effects queue, business-key search (q=0012)", "/effects/?q=0012", "< 100 ms"),
        ("approvals inbox", "/approvals/", "-"),
        ("audit log, unfiltered", "/audit/", "< 100 ms"),
        ("audit log, actor=olga", "/audit/?actor=olga", "< 100 ms"),
        # The overview, workers and notifications pages.
        ("overview", "/", "-"),
        ("workers", "/workers/", "< 100 ms"),
        ("notification deliveries", "/notifications/", "< 100 ms"),
        ("bulk batches", "/bulk/", "< 100 ms"),
    ]
    figures = time_pages(client, [url for _label, url, _target in pages], n, size.get("warmups", WARMUPS))
    return [(label, url, p50, p95, target, parts)
            for (label, url, target), (p50, p95, parts) in zip(pages, figures)]


# --- live update latency ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


OBSERVER_JS = """() => {
  window.__seenAt = null;
  const done = () => {
    const badge = document.querySelector('#live-run_header .badge');
    if (badge && badge.textContent.trim() === 'CANCELLED' && window.__seenAt === null) window.__seenAt = Date.now();
  };
  new MutationObserver(done).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def live_figure(size: dict, env: dict[str, str]) -> list[float]:
    from django.conf import settings
    from django.test import Client

    from sagas import services
    from sagas.models import WorkflowRun

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    user = operator_user()
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    port = _free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-console-daphne-{os.getpid()}.log", "w+")
    daphne = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    latencies: list[float] = []
    try:
        def listening() -> bool:
            log.seek(0)
            return "Listening on TCP address" in log.read() or daphne.poll() is not None

        common.wait_for(listening, 30)
        if daphne.poll() is not None:
            log.seek(0)
            raise SystemExit("daphne did not start:\n" + log.read()[-3000:])
        targets = list(
            WorkflowRun.objects.filter(status="WAITING")
            .exclude(id__in=WorkflowRun.objects.filter(approvals__isnull=False).values("id"))
            .order_by("-created_at").values_list("id", flat=True)[1: size["live"] + 1]
        )
        if len(targets) < size["live"]:
            raise SystemExit(f"only {len(targets)} WAITING runs to cancel; run with --fresh")
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(base_url=base)
                context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": base}])
                for run_id in targets:
                    page = context.new_page()
                    page.goto(f"/runs/{run_id}/")
                    page.wait_for_function(
                        "() => document.getElementById('live-status')?.textContent.trim() === 'live'", timeout=20_000
                    )
                    page.evaluate(OBSERVER_JS)
                    t0 = time.time() * 1000
                    services.run_cancel(run_id=str(run_id), user=user, reason="bench: live latency", compensate=False)
                    page.wait_for_function("() => window.__seenAt !== null", timeout=20_000)
                    seen = page.evaluate("() => window.__seenAt")
                    latencies.append(seen - t0)
                    page.close()
            finally:
                browser.close()
    finally:
        os.killpg(daphne.pid, 15)
        daphne.wait(timeout=10)
        log.close()
    return latencies


def disk_size() -> str:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        return cur.fetchone()[0]


def _read_figures(size: str) -> dict[str, float]:
    path = Path(str(FIGURES).format(size=size))
    return json.loads(path.read_text()) if path.exists() else {}


def _save_figures(size: str, figures: dict[str, float]) -> None:
    path = Path(str(FIGURES).format(size=size))
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(figures, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--fresh", action="store_true", help="regenerate the data even if it is there")
    parser.add_argument("--no-live", action="store_true", help="skip the browser measurement")
    parser.add_argument("--size", choices=("1m", "10m"), default="1m",
                        help="1m: 1,000,000 runs (the default); 10m: 10,000,000 runs and 100,000,000 journal "
                             "entries in saga_bench_console_10m (28 GB, generated once, about 17 minutes)")
    args = parser.parse_args()
    size = SIZES["smoke" if args.smoke else ("full" if args.size == "1m" else "10m")]
    extra = django_env(size["db"])
    db_url = extra.pop("BENCH_DB_URL")
    common.BENCH_DB = db_url
    common.setup_django(**extra)
    env = common.bench_env(**extra)

    made: dict[str, float] = {}
    # --smoke regenerates every time (under a second): each run cancels some WAITING runs.
    if args.fresh or args.smoke or not data_present(size):
        t0 = time.perf_counter()
        made = generate(size)
        made["total"] = time.perf_counter() - t0
        print("generated in " + ", ".join(f"{k} {v:.1f} s" for k, v in made.items()))
    else:
        print(f"data already in {size['db']} (use --fresh to regenerate)")
    _autocommit("ANALYZE")
    have = counts()
    print("data: " + ", ".join(f"{k} {v:,}" for k, v in have.items()) + f"; database size {disk_size()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    rows = page_figures(size)
    live = [] if args.no_live else live_figure(size, env)

    # Targets as ratios that hold on a noisy machine: each page's p95 at most RATIO x the
    # unfiltered run list's p95 measured in the same run.
    base = next(p95 for label, _url, _p50, p95, _t, _parts in rows if label == "run list, unfiltered")
    # At 10M runs, also each page against its own p95 in the last 1M run (GROWTH).
    earlier = _read_figures("1m") if size is SIZES["10m"] else {}
    grown = [f"× 1M p95 (≤ {GROWTH:g})"] if earlier else []
    table = [("figure", "p50", "p95", f"× list p95 (≤ {RATIO:g})", *grown, "queries", "SQL", "template",
              "redaction", "rest")]
    for label, _url, p50, p95, _target, parts in rows:
        ratio = p95 / base
        growth = []
        if earlier:
            before = earlier.get(label)
            growth = [f"{p95 / before:.2f}{'' if p95 / before <= GROWTH else ' MISSED'}" if before else "-"]
        table.append((label, f"{p50:.1f} ms", f"{p95:.1f} ms", f"{ratio:.2f}{'' if ratio <= RATIO else ' MISSED'}",
                      *growth, f"{parts['queries']:.0f}",
                      f"{parts['sql']:.1f}", f"{parts['render']:.1f}", f"{parts['redaction']:.1f}",
                      f"{parts['other']:.1f}"))
    if live:
        table.append((f"live update, commit to DOM ({len(live)} cancels)",
                      f"{common.percentile(live, 50):.0f} ms", f"{common.percentile(live, 95):.0f} ms", "< 1000 ms",
                      *(["-"] if earlier else []), "", "", "", "", ""))
    if not args.smoke:
        _save_figures(args.size, {label: p95 for label, _url, _p50, p95, _t, _parts in rows})
    common.print_table(
        f"Console ({have['runs']:,} runs, {have['journal entries']:,} journal entries; server time in-process, "
        f"{size['requests']} requests after {size.get('warmups', WARMUPS)} warm-up(s))", table)
    if live:
        print("live update per sample (ms): " + ", ".join(f"{v:.0f}" for v in live))


if __name__ == "__main__":
    main()
