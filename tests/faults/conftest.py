"""Private PostgreSQL and Redis servers that these tests stop, crash and restart.

Per module: one ``PostgresServer`` and one ``RedisServer`` (bench/servers.py), a
template database migrated once on that server, and the simulated providers. The
providers keep their books in the shared test database, which nobody restarts:
their execution table is the proof that nothing ran twice.

Per test: a fresh copy of the template database, an empty Redis, worker processes
and a driver process pointed at both (``FaultEnv``), and a psycopg connection of
the test's own to that database (``PrivateDB``) that reconnects after a restart.
Django's connection in the test process stays on the shared test database.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.servers import PostgresServer, RedisServer
from tests.procs import ROOT, Proc, Procs, run_python, start_providers, wait_until, worker_env

MODULES = "tests.faults.wf_faults"
TEMPLATE = "faults_template"
# Longer than any outage these tests cause: a worker that kept a step's result or an
# effect's outcome in memory still holds the run when the database comes back.
LEASE_TTL = "15"  # the production default
_databases = itertools.count(1)
# Where an outage of our own storage must never put a run.
WRONG_STATUSES = frozenset({"FAILED", "NEEDS_ATTENTION", "COMPENSATING", "COMPENSATED", "CANCELLED"})


@dataclass
class Servers:
    pg: PostgresServer
    redis: RedisServer
    providers_url: str


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    """A private PostgreSQL (with a migrated template database) and Redis, plus the
    providers on the shared test database, for every test of a module."""
    yield from private_servers(tmp_path_factory)


def private_servers(tmp_path_factory, *, listen: tuple[str, ...] = (), trust: tuple[str, ...] = (),
                    providers_host: str = "127.0.0.1"):
    """What ``servers`` yields; ``listen``/``trust``/``providers_host``: also reachable on a
    bridge's address (tests.faults.netns)."""
    pg, redis_server = PostgresServer(listen=listen, trust=trust), RedisServer(listen=listen)
    providers = Procs(tmp_path_factory.mktemp("providers"))
    try:
        pg.start()
        redis_server.start()
        pg.create_database(TEMPLATE)
        env = worker_env(MODULES, DATABASE_URL=pg.url(TEMPLATE), REDIS_URL=redis_server.url())
        done = run_python(["manage.py", "migrate", "--noinput", "-v", "0"], env=env, timeout=180)
        assert done.returncode == 0, f"migrate on the private server failed:\n{done.stdout}{done.stderr}"
        yield Servers(pg, redis_server, start_providers(providers, host=providers_host))
    finally:
        providers.stop_all()
        pg.cleanup()
        redis_server.cleanup()


def expected_executions(runs: list[str]) -> set[tuple[str, str, str]]:
    """The provider executions ``fault_order`` runs make: (provider, operation, idempotency key)."""
    return {
        (provider, operation, f"{run}:{step}")
        for run in runs
        for provider, operation, step in [
            ("payments", "capture", "capture"), ("inventory", "reserve", "reserve"), ("email", "send", "email"),
        ]
    }


class PrivateDB:
    """The test's own connection to the private database. Every query waits out an outage
    (reconnecting) for up to ``timeout`` seconds."""

    def __init__(self, pg: PostgresServer, dbname: str) -> None:
        self.pg, self.dbname = pg, dbname
        self.conn: psycopg.Connection | None = None

    def rows(self, sql: str, params: Any = (), timeout: float = 60) -> list[tuple]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = self.pg.connect(self.dbname, connect_timeout=2)
                return self.conn.execute(sql, params).fetchall()
            except (psycopg.OperationalError, psycopg.InterfaceError):
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
            self.conn = None

    def statuses(self, run_ids: list[str]) -> Counter:
        return Counter(dict(self.rows(
            "SELECT status, count(*) FROM sagas_workflowrun WHERE id = ANY(%s::uuid[]) GROUP BY status", [run_ids]
        )))

    def all_completed(self, run_ids: list[str]) -> bool:
        return self.statuses(run_ids).get("COMPLETED", 0) == len(run_ids)

    def settled(self, run_ids: list[str]) -> bool:
        """Every run COMPLETED, or one of them in a state an infrastructure fault must never cause."""
        statuses = self.statuses(run_ids)
        return statuses.get("COMPLETED", 0) == len(run_ids) or bool(WRONG_STATUSES & set(statuses))

    def not_completed(self, run_ids: list[str]) -> list[dict[str, Any]]:
        rows = self.rows(
            "SELECT id::text, workflow_name, status, status_reason, error, attempts, lease_owner FROM sagas_workflowrun "
            "WHERE id = ANY(%s::uuid[]) AND status <> 'COMPLETED' ORDER BY created_at",
            [run_ids],
        )
        keys = ("id", "workflow", "status", "reason", "error", "attempts", "lease_owner")
        return [dict(zip(keys, row)) for row in rows]

    def run(self, run_id: str) -> dict[str, Any]:
        [row] = self.rows(
            "SELECT status, status_reason, result, error, attempts, lease_owner FROM sagas_workflowrun WHERE id = %s",
            [run_id],
        )
        return dict(zip(("status", "status_reason", "result", "error", "attempts", "lease_owner"), row))

    def last_finished_at(self, run_ids: list[str]) -> float:
        """Wall-clock time (epoch seconds) the last of ``run_ids`` finished."""
        [(at,)] = self.rows(
            "SELECT extract(epoch FROM max(finished_at))::float8 FROM sagas_workflowrun WHERE id = ANY(%s::uuid[])",
            [run_ids],
        )
        return at

    def journal_kinds(self, run_id: str) -> list[str]:
        return [k for (k,) in self.rows("SELECT kind FROM sagas_journalentry WHERE run_id = %s ORDER BY seq", [run_id])]


class Driver:
    """``tests/faults/driver.py`` in its own process: ``start()`` calls ``sagas.start`` there."""

    def __init__(self, procs: Procs, env: dict[str, str], name: str = "driver") -> None:
        log_path = procs.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.driver"], cwd=ROOT, env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
            )
        procs.procs.append(Proc(name, self.popen, log_path))
        self._buffer = b""
        ready = self._answer(60)
        assert ready.get("ready"), ready

    def start(self, workflow: str, input: Any = None, timeout: float = 60) -> dict[str, Any]:
        """``{"ok": True, "run_id": ..., "seconds": ...}`` or ``{"ok": False, "error": ..., ...}``."""
        self.popen.stdin.write((json.dumps({"workflow": workflow, "input": input}) + "\n").encode())
        self.popen.stdin.flush()
        return self._answer(timeout)

    def start_ok(self, workflow: str, input: Any = None) -> str:
        answer = self.start(workflow, input)
        assert answer["ok"], answer
        return answer["run_id"]

    def start_many(self, workflow: str, inputs: list[Any], business_keys: list[str], *, retry_for: float = 60,
                   timeout: float = 300) -> dict[str, Any]:
        """Start one run per input, each retried with its business key while it fails (a client
        retrying through an outage): ``{"ok", "run_ids", "errors"}`` (``errors``: each failed attempt)."""
        request = {"workflow": workflow, "inputs": inputs, "business_keys": business_keys, "retry_for": retry_for}
        self.popen.stdin.write((json.dumps(request) + "\n").encode())
        self.popen.stdin.flush()
        return self._answer(timeout)

    def _answer(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        fd = self.popen.stdout.fileno()
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                if line.startswith(b"@@"):
                    return json.loads(line[2:])
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the driver did not answer within {timeout}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"the driver exited ({self.popen.poll()})")
                self._buffer += chunk


class FaultEnv:
    """One test's database on the private server, and the processes pointed at it."""

    def __init__(self, servers: Servers, procs: Procs, tmp_path: Path) -> None:
        self.pg, self.redis, self.procs = servers.pg, servers.redis, procs
        self.providers_url = servers.providers_url
        self.dbname = f"faults_{os.getpid()}_{next(_databases)}"
        self.pg.create_database(self.dbname, template=TEMPLATE)
        self.redis.flushall()
        self.calls_path = tmp_path / "calls.log"
        self.calls_path.touch()
        self.db = PrivateDB(self.pg, self.dbname)

    def env(self, **extra: str) -> dict[str, str]:
        return worker_env(MODULES, **{
            "DATABASE_URL": self.pg.url(self.dbname), "REDIS_URL": self.redis.url(),
            "DEMO_PROVIDERS_URL": self.providers_url, "SAGAS_LEASE_TTL": LEASE_TTL,
            "FAULTS_CALLS": str(self.calls_path), **extra,
        })

    def worker(self, name: str, *args: str, **env: str) -> Proc:
        return self.procs.start(name, ["manage.py", "sagas_worker", "--name", name, *args], self.env(**env))

    def workers_ready(self, *workers: Proc, timeout: float = 60) -> None:
        """Wait until each worker printed its start-up line (it is then taking jobs)."""
        for w in workers:
            wait_until(lambda w=w: "sagas worker " in w.log() or not w.alive(), timeout, what=f"{w.name} to start")
            assert w.alive(), w.log()

    def driver(self) -> Driver:
        return Driver(self.procs, self.env())

    def wait_completed(self, run_ids: list[str], timeout: float, *, since: float | None = None) -> float:
        """Wait until every run is COMPLETED (fails at once if one lands in a wrong state);
        seconds from ``since`` (epoch) to the last completion."""
        try:
            wait_until(lambda: self.db.settled(run_ids), timeout, interval=0.2,
                       what=f"{len(run_ids)} runs to complete")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; not completed: {self.db.not_completed(run_ids)}") from None
        left = self.db.not_completed(run_ids)
        assert not left, f"runs in a state an outage must never cause: {left}"
        return self.db.last_finished_at(run_ids) - since if since is not None else 0.0

    def calls(self) -> Counter:
        """Real executions per (run_id, step), from the workflows' call file."""
        lines = self.calls_path.read_text().splitlines()
        return Counter(tuple(line.split()[:2]) for line in lines if line.strip())

    def started_at(self, run_id: str, step: str) -> list[float]:
        """When each execution of ``step`` began (epoch seconds)."""
        lines = [line.split() for line in self.calls_path.read_text().splitlines() if line.strip()]
        return [float(f[3]) for f in lines if f[0] == run_id and f[1] == step]

    def repeated_steps(self) -> dict[tuple[str, str], int]:
        return {key: n for key, n in self.calls().items() if n != 1}


@pytest.fixture
def faults(servers, procs, transactional_db, tmp_path, request):
    servers.pg.start()  # a test that failed mid-outage may have left them down
    servers.redis.start()
    env = FaultEnv(servers, procs, tmp_path)
    yield env
    env.db.close()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"----- private PostgreSQL log (port {servers.pg.port}) -----\n{servers.pg._log_tail(4000)}")


def tcp_client_ports(pid: int) -> set[int]:
    """Local ports of the TCP sockets process ``pid`` holds open (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# The engine's wording (sagas.storage): "storage outage: <what> unreachable while ..." when
# an outage starts, "storage outage over: <what> answers again after N s" when it ends.
OUTAGE_LINE = re.compile(r"storage outage\b", re.IGNORECASE)
OUTAGE_OVER = re.compile(r"storage outage over\b", re.IGNORECASE)


def outage_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if OUTAGE_LINE.search(line)]


def assert_one_outage_logged(name: str, log: str) -> None:
    """One line when the outage started, one when it ended, and no flood of tracebacks."""
    lines = outage_lines(log)
    ends = [line for line in lines if OUTAGE_OVER.search(line)]
    print(f"{name}: {len(lines)} outage line(s), {traceback_count(log)} traceback(s), "
          f"{len(log.splitlines())} line(s) in all:\n  " + "\n  ".join(lines))
    assert len(lines) - len(ends) == 1 and len(ends) == 1, (
        f"{name} should log the outage once when it starts and once when it ends:\n{log[-5000:]}"
    )
    assert ends == lines[-1:], f"{name} logged the end of the outage before its start:\n{lines}"
    assert traceback_count(log) < 5, f"{name} logged a traceback flood:\n{log[-5000:]}"


def traceback_count(log: str) -> int:
    return sum(1 for line in log.splitlines() if line.startswith("Traceback"))
