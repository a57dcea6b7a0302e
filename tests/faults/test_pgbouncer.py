"""Workers behind PgBouncer 1.18 (Debian's) in transaction pooling mode, restarted in the middle.

``DATABASE_POOLER=transaction`` with ``DATABASE_DIRECT_URL``: every statement of the workers
and of the driver that starts the runs goes through the pooler, unprepared; the workers'
``LISTEN`` connections and the sweeper's session lock go to the database itself. Every run
of 1,000 (each a step and two provider effects, started through the pooler while it restarts)
completes, nothing runs twice at the providers, no step is journaled twice, and no statement
fails for a prepared statement the next transaction's server connection does not have.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.servers import HOST, PG_USER
from tests.faults.conftest import Driver, tcp_client_ports
from tests.faults.test_postgres_outages import provider_executions
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
RUNS = 1000  # the failover test's load: each run a step, a capture and an email
DURING = 20  # of them started one by one across the restart
SESSION_RUNS = 40  # session mode: what changes is only where the connections come from


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class PgBouncer:
    """Debian's pgbouncer in front of one PostgreSQL server, in ``pool_mode`` (transaction by
    default), run as the ``postgres`` user (it refuses root)."""

    def __init__(self, pg_port: int, pool_mode: str = "transaction", pool_size: int = 4) -> None:
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.dir.chmod(0o755)
        (self.dir / "users.txt").write_text(f'"{PG_USER}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""[databases]
* = host={HOST} port={pg_port}
[pgbouncer]
listen_addr = {HOST}
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/users.txt
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 200
ignore_startup_parameters = options,extra_float_digits
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
""")
        if os.geteuid() == 0:
            shutil.chown(self.dir, PG_USER)
            for path in self.dir.iterdir():
                shutil.chown(path, PG_USER)
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        (self.dir / "pgbouncer.pid").unlink(missing_ok=True)  # left by a kill -9
        cmd = [PGBOUNCER, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", PG_USER, "--", *cmd]
        self.popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
        wait_until(self._listening, 15, interval=0.05, what="pgbouncer to listen")

    def _listening(self) -> bool:
        assert self.popen is not None and self.popen.poll() is None, self.log()
        with socket.socket() as s:
            return s.connect_ex((HOST, self.port)) == 0

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def url(self, dbname: str) -> str:
        return f"postgres://{PG_USER}@{HOST}:{self.port}/{dbname}"

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_workers_behind_pgbouncer_in_transaction_mode_lose_and_repeat_nothing_across_its_restart(faults):
    bouncer = PgBouncer(faults.pg.port)
    try:
        bouncer.start()
        through = {"DATABASE_URL": bouncer.url(faults.dbname), "DATABASE_POOLER": "transaction",
                   "DATABASE_DIRECT_URL": faults.pg.url(faults.dbname)}
        w1 = faults.worker("w1", "--concurrency", "2", **through)
        w2 = faults.worker("w2", "--concurrency", "2", **through)
        faults.workers_ready(w1, w2)
        driver = Driver(faults.procs, faults.env(**through))  # starts the runs through the pooler too
        keys = [f"pgb-{i}" for i in range(RUNS - DURING)]
        started: dict = {}
        client = threading.Thread(target=lambda: started.update(driver.start_many(
            "failover_order", [{"id": key} for key in keys], keys, retry_for=60, timeout=300)), daemon=True)
        client.start()
        wait_until(lambda: faults.db.rows("SELECT count(*) FROM sagas_workflowrun WHERE status = 'COMPLETED'")[0][0]
                   >= RUNS * 2 // 5, 240, interval=0.2, what="the first runs to complete")
        in_flight = Counter(dict(faults.db.rows("SELECT status, count(*) FROM sagas_workflowrun GROUP BY status")))

        second, during = Driver(faults.procs, faults.env(**through), name="driver-during"), []

        def start_during() -> None:  # a client starting runs one by one while the pooler restarts
            for j in range(DURING):
                during.append(second.start_many("failover_order", [{"id": f"pgd-{j}"}], [f"pgd-{j}"], retry_for=60))
                time.sleep(0.05)
        trickle = threading.Thread(target=start_during, daemon=True)
        trickle.start()
        time.sleep(0.1)
        bouncer.kill()  # every client connection is dropped at once
        time.sleep(0.5)
        bouncer.start()
        back = time.time()
        client.join(300)
        trickle.join(120)
        assert started.get("ok") and all(a["ok"] for a in during), (
            f"the clients could not start every run: {started.get('errors', [])[-5:]} {during[-3:]}")
        runs = started["run_ids"] + [rid for a in during for rid in a["run_ids"]]
        retried = len(started["errors"]) + sum(len(a["errors"]) for a in during)
        assert len(set(runs)) == RUNS
        after = faults.wait_completed(runs, 240, since=back)
        print(f"\npgbouncer (transaction mode) restarted with {dict(in_flight)}: the last of {RUNS} runs completed "
              f"{after:.2f}s after it was back; {retried} start attempts failed and were sent again")

        assert in_flight.get("COMPLETED", 0) < len(runs), "the restart hit no run in flight; nothing was tested"
        assert retried > 0, "no start met the restart: the clients' retry was not exercised"
        executions = provider_executions()
        assert {key: n for key, n in executions.items() if n != 1} == {}, "a provider executed something twice"
        assert len(executions) == 2 * len(runs)
        assert faults.repeated_steps() == {}, "a journaled step ran again"
        logs = w1.log() + w2.log()
        assert "prepared statement" not in logs, logs[-3000:]
        # What needs a session went to the database itself, and nothing else did: each worker's own
        # connections to PostgreSQL (its sockets' ports) are its LISTEN connection alone, which
        # checks itself with SELECT 1; every other session of the database is the pooler's.
        sessions = faults.db.rows("SELECT client_port, query FROM pg_stat_activity WHERE datname = %s",
                                  [faults.dbname])
        for worker in (w1, w2):
            own = [query for port, query in sessions if port in tcp_client_ports(worker.pid)]
            assert len(own) == 1 and own[0].strip().upper() in ("LISTEN SAGAS_DISPATCH", "SELECT 1"), (worker.name, own)
        assert w1.alive() and w2.alive()
    finally:
        bouncer.cleanup()


def test_in_session_mode_the_workers_need_no_setting_and_lose_nothing_across_its_restart(faults):
    """Session pooling: a client keeps its server connection, so everything works as against the
    database itself, prepared statements and LISTEN included, with no DATABASE_POOLER."""
    # In session mode each client connection keeps a server connection for its whole life: the
    # pool must hold them all (a worker's threads, its LISTEN and sweeper connections, the
    # client), or a newcomer waits for one and fails with query_wait_timeout.
    bouncer = PgBouncer(faults.pg.port, pool_mode="session", pool_size=30)
    try:
        bouncer.start()
        through = {"DATABASE_URL": bouncer.url(faults.dbname)}
        w1 = faults.worker("w1", "--concurrency", "2", **through)
        faults.workers_ready(w1)
        driver = Driver(faults.procs, faults.env(**through))
        keys = [f"pgs-{i}" for i in range(SESSION_RUNS)]
        answer = driver.start_many("failover_order", [{"id": key} for key in keys], keys, retry_for=60)
        assert answer["ok"], answer["errors"][-3:]
        wait_until(lambda: faults.db.statuses(answer["run_ids"]).get("COMPLETED", 0) >= SESSION_RUNS // 3, 120,
                   interval=0.1,
                   what="the first runs to complete")
        in_flight = faults.db.statuses(answer["run_ids"])
        bouncer.kill()
        time.sleep(0.5)
        bouncer.start()
        faults.wait_completed(answer["run_ids"], 120)

        assert in_flight.get("COMPLETED", 0) < SESSION_RUNS, "the restart hit no run in flight"
        executions = provider_executions()
        assert {key: n for key, n in executions.items() if n != 1} == {} and len(executions) == 2 * SESSION_RUNS
        assert faults.repeated_steps() == {}
        assert "prepared statement" not in w1.log() and w1.alive()
    finally:
        bouncer.cleanup()
