"""Shared set-up for the benchmark scripts: their own database and Redis db, real workers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/saga_bench")
BENCH_REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")


def bench_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DEBUG", "1")  # as the figures were measured; bench/console.py runs with DEBUG off
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings_demo",
        DATABASE_URL=BENCH_DB,
        REDIS_URL=BENCH_REDIS,
        SAGAS_MODULES="bench.workflows",
        SAGAS_LOG_LEVEL="WARNING",
    )
    env.update(extra)
    return env


def setup_django(**extra: str) -> None:
    os.environ.update(bench_env(**extra))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    with _database(_server_params(), connection.settings_dict["NAME"]) as fresh:
        call_command("migrate", verbosity=0)
        if fresh:
            _keep_as_template()


# A database just migrated from nothing is copied (CREATE DATABASE ... TEMPLATE, a fraction of a
# second) under this name, which changes with the project's migration files; a bench database
# made later on the same server starts as a copy of it, and migrate has nothing left to do. The
# smoke runs of `make test` make a dozen databases on a fresh server, each a migration from
# nothing before this (99 migrations: 3 CPU-s of Python here, and PostgreSQL's share).
TEMPLATE_PREFIX = "saga_bench_template_"


def _template_name() -> str:
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return TEMPLATE_PREFIX + digest.hexdigest()[:12]


def _server_params() -> dict:
    from django.db import connection

    params = connection.get_connection_params()
    return {k: v for k, v in params.items() if k in {"host", "port", "user", "password"}}


def ensure_database(url: str) -> None:
    """For a database a script migrates in another process (``manage.py migrate``): create it
    if it does not exist, a copy of the template where the server has one."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    name = params.pop("dbname")
    with _database({k: v for k, v in params.items() if k in {"host", "port", "user", "password"}}, name):
        pass


@contextmanager
def _database(params: dict, name: str) -> Iterator[bool]:
    """Create database ``name`` if it does not exist, as a copy of this migration set's template
    when the server has one; yields whether it was created empty (migrate makes it all). While
    one made empty is being migrated (inside), the server's other benches wait to make theirs:
    then they copy the template the first one leaves (``_keep_as_template``) instead of migrating
    from nothing too (the smokes' first two, on two xdist workers, started together)."""
    import psycopg

    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        exists = "SELECT 1 FROM pg_database WHERE datname = %s"
        if conn.execute(exists, [name]).fetchone():
            yield False
            return
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", [TEMPLATE_PREFIX])  # until this session ends
        template, copied = _template_name(), False
        if conn.execute(exists, [template]).fetchone():
            try:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
                copied = True
            except psycopg.errors.ObjectInUse:  # a session on the template (by hand?): made empty instead
                pass
        if copied:
            conn.execute("SELECT pg_advisory_unlock_all()")
            yield False
            return
        conn.execute(f'CREATE DATABASE "{name}"')
        yield True


def _keep_as_template() -> None:
    """Copy the database just migrated from nothing as this migration set's template (and drop
    the templates of other migration sets). Best effort: a copy that cannot be made now (a
    session on either database) is simply not made."""
    import psycopg
    from django.db import connection

    name, template = connection.settings_dict["NAME"], _template_name()
    connection.close()  # a database is copied only with no session on it
    with psycopg.connect(dbname="postgres", autocommit=True, **_server_params()) as conn:
        try:
            conn.execute(f'CREATE DATABASE "{template}" TEMPLATE "{name}"')
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.ObjectInUse):
            return
        stale = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
                             [TEMPLATE_PREFIX.replace("_", r"\_") + "%", template]).fetchall()
        for (old,) in stale:
            try:
                conn.execute(f'DROP DATABASE "{old}"')
            except psycopg.errors.ObjectInUse:
                pass


def reset_state() -> None:
    """Empty the bench database's engine tables and the bench Redis db."""
    from django.db import connection

    from core.append_only import TRUNCATE_ESCAPE_GUC
    from sagas.runtime.queue import redis_connection

    with connection.cursor() as cur:
        # The journal refuses TRUNCATE unless the session says it is a harness emptying its own database.
        cur.execute(f"SET {TRUNCATE_ESCAPE_GUC} = on")
        cur.execute("TRUNCATE sagas_journalentry, sagas_workflowrun CASCADE")
        cur.execute(f"RESET {TRUNCATE_ESCAPE_GUC}")
    redis_connection().flushdb()


def spawn_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "sagas_worker", *args],
        cwd=ROOT,
        env=env or bench_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def start_providers(env: dict[str, str], port: int = 0) -> tuple[subprocess.Popen, str]:
    """``manage.py demo_providers`` on ``port`` (0: a free one); the process and its URL.

    The server logs a line per request: it goes to a file, never to a pipe nobody drains
    (a full pipe blocks the server, and every call then times out)."""
    log_path = Path(tempfile.mkstemp(prefix="bench-providers-", suffix=".log")[1])
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "demo_providers", "--port", str(port)], cwd=ROOT, env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def listening() -> re.Match | None:
        return re.search(r"listening on (http://\S+)", log_path.read_text(errors="replace"))

    if not wait_for(lambda: listening() is not None or proc.poll() is not None, 30) or listening() is None:
        proc.kill()
        raise SystemExit(f"the demo providers did not start: {log_path.read_text(errors='replace')[-2000:]}")
    return proc, listening().group(1)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def print_table(title: str, rows: list[tuple[str, ...]]) -> None:
    """A Markdown table; the first row is the header, every row has as many cells."""
    columns = len(rows[0])
    width = [max(len(r[i]) for r in rows) for i in range(columns)]
    print(f"\n{title}")
    for i, row in enumerate(rows):
        print("| " + " | ".join(cell.ljust(width[j]) for j, cell in enumerate(row)) + " |")
        if i == 0:
            print("| " + " | ".join("-" * width[j] for j in range(columns)) + " |")


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


_inherited: list = []  # the parent's connections a forked child must neither use nor close


def forget_inherited_connections() -> None:
    """In a child just forked from a bench process: let Django open its own connections.

    The parent closes its connections before forking, but one that ``close_all()`` does not close
    (inside a transaction; or a pooled one, which goes back to its pool open: a pool leaked into a
    bench through the environment once, config/asgi.py) would come along with the fork, and the
    child would run its queries on the parent's socket, inside the parent's transaction (seen as
    "connection in transaction status INTRANS", a hung smoke run, and a parent reading a child's
    INSERT). Here the child drops Django's state for them and keeps the psycopg objects
    referenced for good, so that garbage collection never sends a Terminate down the socket the
    parent still uses."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _inherited.append(conn.connection)
        conn.connection = None
        conn.in_atomic_block = False
        conn.savepoint_ids = []
        conn.needs_rollback = False
        conn.closed_in_transaction = False
        conn.run_on_commit = []


def provider_books() -> tuple[float, int, int]:
    """(model cost billed, model turns billed more than once, tool executions beyond one per call)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """SELECT coalesce(sum((response->>'cost')::float8), 0), count(*) - count(DISTINCT request->>'ref')
                 FROM demo_providerexecution WHERE provider = 'model'"""
        )
        cost, model_repeats = cur.fetchone()
        cur.execute(
            """SELECT count(*) - count(DISTINCT request->>'ref') FROM demo_providerexecution
                WHERE (provider, operation) IN (('payments', 'capture'), ('inventory', 'reserve'),
                                                ('shipping', 'create'))"""
        )
        (duplicates,) = cur.fetchone()
    return float(cost), int(model_repeats), int(duplicates)


# bench/console.py's journal, which bench/partition.py seeds too (once per schema): started,
# claimed, steps..., and the outcome; one run's seqs are 1..last_seq. The long run (the only one
# over 100 entries) has an effect every 10 entries, its intent and then its result, for the
# history timeline's pairs and kind filter. ``{extra}``/``{extra_value}``: more columns.
CONSOLE_JOURNAL_SQL = """
    INSERT INTO {schema}.sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at{extra})
    SELECT r.id, s,
           CASE WHEN s = 1 THEN 'started' WHEN s = 2 THEN 'claimed'
                WHEN s = r.last_seq AND r.status = 'COMPLETED' THEN 'completed'
                WHEN s = r.last_seq AND r.status = 'FAILED' THEN 'failed'
                WHEN s = r.last_seq AND r.status IN ('CANCELLED', 'COMPENSATED') THEN 'cancelled'
                WHEN s = r.last_seq AND r.status = 'WAITING' THEN 'yielded'
                WHEN s = r.last_seq THEN 'halted'
                WHEN r.last_seq > 100 AND s % 10 = 4 THEN 'effect_intent'
                WHEN r.last_seq > 100 AND s % 10 = 5 THEN 'effect_result'
                ELSE 'step' END,
           CASE WHEN s = r.last_seq OR s < 3 THEN ''
                WHEN r.last_seq > 100 AND s % 10 IN (4, 5) THEN 'charge_' || (s - s % 10)
                ELSE 'step_' || (s - 2) END,
           CASE WHEN r.last_seq > 100 AND s % 10 = 5 AND s < r.last_seq
                THEN jsonb_build_object('status', 'SUCCEEDED', 'result', jsonb_build_object('ok', true),
                                        'downstream_ref', 'ch_' || s)
                ELSE jsonb_build_object('value', s, 'ok', true) END,
           CASE WHEN s = 1 THEN '' ELSE 'worker-' || (s % 4) END,
           r.created_at + s * interval '50 ms'{extra_value}
      FROM {schema}.sagas_workflowrun r, generate_series(1, r.last_seq) AS s"""
