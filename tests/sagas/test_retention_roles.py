"""Retention as deployed: on a private PostgreSQL server migrated by the owner, a worker that
connects as the least-privilege runtime role (``manage.py db_roles --apply``) archives
finished runs on its own schedule, through ``sagas_archive_delete``; the same role still
cannot delete from the journal any other way."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from bench.servers import HOST, PostgresServer, RedisServer
from tests.procs import Procs, run_python, wait_until, worker_env

DB = "app"
RUNTIME = "saga_app"
MODULES = "tests.sagas.wf_retention"

START = """
from sagas import start
print(",".join(str(start("ret_quick", {"note": f"n{i}"}).id) for i in range(3)))
"""


@pytest.fixture
def deployed(tmp_path):
    pg, redis_server = PostgresServer(), RedisServer()
    procs = Procs(tmp_path)
    try:
        pg.start()
        redis_server.start()
        pg.create_database(DB)
        common = {"REDIS_URL": redis_server.url(), "DEBUG": "1", "SAGAS_RETENTION_DAYS": "0",
                  "SAGAS_ARCHIVE_INTERVAL": "0.5", "SAGAS_ARCHIVE_URL": (tmp_path / "archive").as_uri()}
        owner = worker_env(MODULES, DATABASE_URL=pg.url(DB), **common)
        runtime = worker_env(MODULES, DATABASE_URL=f"postgres://{RUNTIME}@{HOST}:{pg.port}/{DB}", **common)

        def manage(*args: str, env: dict) -> str:
            done = run_python(["manage.py", *args], env=env, timeout=180)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        manage("migrate", "--noinput", "-v", "0", env=owner)
        with pg.connect() as conn:
            conn.execute(f"CREATE ROLE {RUNTIME} LOGIN")
        manage("db_roles", "--runtime-role", RUNTIME, "--apply", env=owner)
        yield {"pg": pg, "procs": procs, "runtime": runtime, "manage": manage, "archive": tmp_path / "archive"}
    finally:
        procs.stop_all()
        pg.cleanup()
        redis_server.cleanup()


def test_a_runtime_role_worker_archives_on_schedule_and_still_cannot_delete_history(deployed):
    pg, manage = deployed["pg"], deployed["manage"]
    run_ids = manage("shell", "-c", START, env=deployed["runtime"]).strip().splitlines()[-1].split(",")
    deployed["procs"].start("worker", ["manage.py", "sagas_worker", "--name", "archiver"], deployed["runtime"])

    def one(sql: str, params: tuple = ()) -> tuple:
        with pg.connect(DB) as conn:
            return conn.execute(sql, params).fetchone()

    wait_until(lambda: one("SELECT count(*) FROM sagas_archivedrun")[0] == 3, 60, what="the worker to archive")
    assert one("SELECT count(*) FROM sagas_workflowrun WHERE id = ANY(%s::uuid[])", (run_ids,))[0] == 0
    assert one("SELECT count(*) FROM sagas_journalentry WHERE run_id = ANY(%s::uuid[])", (run_ids,))[0] == 0
    action, actor, after = one("SELECT action, actor_label, after FROM console_auditentry WHERE action = 'runs.archived'")
    assert (action, actor) == ("runs.archived", "system: retention")
    assert after["count"] == 3
    files = sorted(p.name for p in deployed["archive"].glob("*.jsonl.gz"))
    assert len(files) == 1
    lines = subprocess.run(f"zcat {deployed['archive'] / files[0]}", shell=True, capture_output=True, text=True).stdout
    assert sorted(json.loads(line)["run_id"] for line in lines.splitlines() if '"type":"run"' in line) == sorted(run_ids)

    # A run that is not finished, even with an archive row, keeps its history; and the runtime
    # role cannot delete from the journal any other way.
    deployed["procs"].stop_all()
    kept = manage("shell", "-c", START.replace("range(3)", "range(1)"), env=deployed["runtime"]).strip().splitlines()[-1]
    with pg.connect(DB) as conn:
        conn.execute("""INSERT INTO sagas_archivedrun (run_id, workflow_name, version, tenant, business_key, status,
                            created_at, archived_at, location, "offset", length, batch)
                        VALUES (%s, 'ret_quick', 1, 'default', '', 'PENDING', now(), now(), 'file:///x', 0, 0, %s)""",
                     (kept, kept))
    with psycopg.connect(host=HOST, port=pg.port, user=RUNTIME, dbname=DB, autocommit=True) as conn:
        for statement in ["DELETE FROM sagas_journalentry",
                          "SET saga_console.archive_delete = on; DELETE FROM sagas_journalentry"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(statement)
        assert conn.execute("SELECT * FROM sagas_archive_delete(%s::uuid[])", ([kept],)).fetchone() == (0, 0, 0)
    assert one("SELECT count(*) FROM sagas_journalentry WHERE run_id = %s", (kept,))[0] == 1  # its 'started'
    assert one("SELECT status FROM sagas_workflowrun WHERE id = %s", (kept,))[0] == "PENDING"
