"""Append-only for real: on a private PostgreSQL server, migrated by the owner, with the
grants of ``manage.py db_roles --apply`` for a runtime role.

The runtime role (what web, workers and sweeper connect as) can do the product's work, a
run through a real worker and an audited console action, but cannot ALTER, disable the
triggers of, TRUNCATE, UPDATE or DELETE the journal and the audit log; the owner's TRUNCATE
and ``manage.py flush`` are refused by the tables' triggers.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

import psycopg
import pytest

from bench.servers import HOST, PostgresServer, RedisServer
from tests.procs import Procs, run_python, wait_until, worker_env

MODULES = "tests.security.wf_privileges"
DB = "app"
RUNTIME = "saga_app"
APPEND_ONLY = {"sagas_journalentry": "sagas_journal_append_only", "console_auditentry": "console_audit_append_only"}


@dataclass
class Deployment:
    pg: PostgresServer
    owner_env: dict[str, str]
    runtime_env: dict[str, str]
    procs: Procs

    def manage(self, *args: str, env: dict[str, str], script: str = "") -> subprocess.CompletedProcess:
        return run_python(["manage.py", *args, *(["-c", script] if script else [])], env=env, timeout=180)

    def as_owner(self) -> psycopg.Connection:
        return self.pg.connect(DB)

    def as_runtime(self) -> psycopg.Connection:
        return psycopg.connect(host=HOST, port=self.pg.port, user=RUNTIME, dbname=DB, autocommit=True)

    def one(self, sql: str, params: tuple = ()) -> tuple:
        with self.as_owner() as conn:
            return conn.execute(sql, params).fetchone()

    def counts(self) -> dict[str, int]:
        return {table: self.one(f"SELECT count(*) FROM {table}")[0] for table in APPEND_ONLY}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """Migrated by the owner (the server's superuser), then ``db_roles --apply`` for a
    runtime role; every process of the product below connects as that role."""
    pg, redis_server = PostgresServer(), RedisServer()
    procs = Procs(tmp_path_factory.mktemp("workers"))
    try:
        pg.start()
        redis_server.start()
        pg.create_database(DB)
        common = {"REDIS_URL": redis_server.url(), "DEBUG": "1", "ALLOWED_HOSTS": "localhost"}
        owner_env = worker_env(MODULES, DATABASE_URL=pg.url(DB), **common)
        runtime_env = worker_env(MODULES, DATABASE_URL=f"postgres://{RUNTIME}@{HOST}:{pg.port}/{DB}", **common)
        deployed = Deployment(pg, owner_env, runtime_env, procs)
        done = deployed.manage("migrate", "--noinput", "-v", "0", env=owner_env)
        assert done.returncode == 0, done.stdout + done.stderr
        with pg.connect() as conn:
            conn.execute(f"CREATE ROLE {RUNTIME} LOGIN")
        done = deployed.manage("db_roles", "--runtime-role", RUNTIME, "--apply", env=owner_env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SELECT and INSERT only on console_auditentry, sagas_journalentry" in done.stdout
        yield deployed
    finally:
        procs.stop_all()
        pg.cleanup()
        redis_server.cleanup()


START = """
from sagas import start
run = start("privileged_order", {"id": "o-1"}, business_key="o-1", tenant="acme")
print(run.id)
"""

APPROVE = """
import json
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from operators.models import AuditEntry
from sagas import approvals

user = get_user_model().objects.create(username="ann")
user.groups.add(Group.objects.get(name="approver"))
client = Client(HTTP_HOST="localhost")
client.force_login(user)
approval = approvals("{run_id}")[0]
response = client.post(f"/approvals/{{approval.id}}/decide/", {{"decision": "approve", "comment": "checked",
                                                                    "expected": "PENDING"}})
entry = AuditEntry.objects.order_by("-id").first()
print(json.dumps({{"status": response.status_code, "action": entry.action, "actor": entry.actor_label,
                  "outcome": entry.outcome}}))
"""


@pytest.fixture(scope="module")
def finished_run(deployment) -> dict:
    """A run started, advanced by a worker, approved in the console and finished, all as the
    runtime role. Leaves rows in the journal and the audit log for the refusal tests."""
    done = deployment.manage("shell", env=deployment.runtime_env, script=START)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.strip().splitlines()[-1]
    worker = deployment.procs.start(
        "worker", ["manage.py", "sagas_worker", "--name", "runtime-worker"], deployment.runtime_env
    )

    def status() -> str:
        assert worker.alive(), deployment.procs.logs()
        return deployment.one("SELECT status FROM sagas_workflowrun WHERE id = %s", (run_id,))[0]

    wait_until(lambda: status() == "WAITING", 60, what="the run to wait for its approval")
    done = deployment.manage("shell", env=deployment.runtime_env, script=APPROVE.format(run_id=run_id))
    assert done.returncode == 0, done.stdout + done.stderr
    approved = json.loads(done.stdout.strip().splitlines()[-1])
    wait_until(lambda: status() in ("COMPLETED", "FAILED", "NEEDS_ATTENTION"), 60, what="the run to finish")
    result = deployment.one("SELECT status, result FROM sagas_workflowrun WHERE id = %s", (run_id,))
    return {"run_id": run_id, "approved": approved, "status": result[0], "result": result[1]}


def test_it_lets_the_runtime_role_run_a_workflow_and_audit_a_console_action(deployment, finished_run):
    assert finished_run["status"] == "COMPLETED", deployment.procs.logs()
    assert finished_run["result"] == {"total": 42, "note": finished_run["result"]["note"], "approved_by": "ann"}
    assert finished_run["approved"] == {"status": 302, "action": "approval.approve", "actor": "ann", "outcome": "ok"}
    assert deployment.one("SELECT count(*) FROM ledger_effectrecord WHERE status = 'SUCCEEDED'")[0] == 1


REWRITES = [
    ("ALTER TABLE {t} ADD COLUMN tampered int", "must be owner"),
    ("ALTER TABLE {t} DISABLE TRIGGER ALL", "must be owner"),
    ("ALTER TABLE {t} DISABLE TRIGGER {trigger}", "must be owner"),
    ("DROP TRIGGER {trigger} ON {t}", "must be owner"),
    ("DROP TABLE {t}", "must be owner"),
    ("TRUNCATE {t}", "permission denied"),
    ("SET saga_console.allow_truncate = on; TRUNCATE {t}", "permission denied"),
    ("UPDATE {t} SET id = id", "permission denied"),
    ("DELETE FROM {t}", "permission denied"),
]


@pytest.mark.parametrize("table", sorted(APPEND_ONLY))
@pytest.mark.parametrize("statement,refusal", REWRITES, ids=[s.split(" {")[0] for s, _ in REWRITES])
def test_it_refuses_the_runtime_role_every_way_to_rewrite_history(deployment, finished_run, table, statement,
                                                                    refusal):
    before = deployment.counts()
    assert before[table] > 0
    with deployment.as_runtime() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege, match=refusal):
        conn.execute(statement.format(t=table, trigger=APPEND_ONLY[table]))
    assert deployment.counts() == before
    enabled = deployment.one(
        "SELECT array_agg(tgenabled::text) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
        (table,),
    )[0]
    assert enabled == ["O", "O"]  # the row trigger and the TRUNCATE trigger, both still enabled


@pytest.mark.parametrize("table", sorted(APPEND_ONLY))
def test_it_refuses_the_owner_truncate(deployment, finished_run, table):
    before = deployment.counts()
    with deployment.as_owner() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"{table} is append-only: TRUNCATE refused"):
            conn.execute(f"TRUNCATE {table}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only: TRUNCATE refused"):
            conn.execute("TRUNCATE sagas_workflowrun, console_auditentry CASCADE")
    assert deployment.counts() == before


@pytest.mark.parametrize("who", ["owner", "runtime"])
def test_it_refuses_manage_py_flush(deployment, finished_run, who):
    before = deployment.counts()
    runs = deployment.one("SELECT count(*) FROM sagas_workflowrun")[0]
    env = deployment.owner_env if who == "owner" else deployment.runtime_env
    done = deployment.manage("flush", "--no-input", env=env)
    assert done.returncode != 0
    assert "couldn't be flushed" in done.stderr
    assert deployment.counts() == before
    assert deployment.one("SELECT count(*) FROM sagas_workflowrun")[0] == runs


def test_it_prints_the_grants_for_review_and_refuses_a_role_that_could_rewrite_history(deployment):
    printed = deployment.manage("db_roles", "--runtime-role", RUNTIME, env=deployment.owner_env)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert lines[1] == "-- append-only (SELECT, INSERT only): console_auditentry, sagas_journalentry"
    assert 'REVOKE UPDATE, DELETE ON "public"."console_auditentry", "public"."sagas_journalentry" FROM "saga_app";' in lines
    assert lines[-1] == "COMMIT;" and not any("WARNING" in line for line in lines)
    with deployment.as_owner() as conn:
        conn.execute("CREATE ROLE saga_super LOGIN SUPERUSER")
        conn.execute("CREATE ROLE saga_member LOGIN IN ROLE postgres")
    for role, why in [("saga_super", "saga_super is a superuser"), ("saga_member", "member of postgres"),
                      ("postgres", "the owner that migrates"), ("nobody", "role nobody does not exist")]:
        refused = deployment.manage("db_roles", "--runtime-role", role, "--apply", env=deployment.owner_env)
        assert refused.returncode != 0 and why in refused.stderr, refused.stderr
