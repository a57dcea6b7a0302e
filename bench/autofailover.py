"""A private pg_auto_failover formation (Debian's ``postgresql-15-auto-failover``, 2.0): a
monitor, a primary and a synchronous secondary, each a ``pg_autoctl`` keeper supervising its
own PostgreSQL, on free ports of 127.0.0.1. Tests and bench scripts kill its primary and
watch the secondary take over.

Contracts:

* ``start()`` returns once the formation has a primary and a secondary in sync
  (``synchronous_standby_names`` set): a commit it acknowledges is on both nodes.
* ``kill_primary()`` is a host going down: its keeper is SIGKILLed (nothing restarts its
  PostgreSQL) and its PostgreSQL stopped with ``pg_ctl stop -m immediate``. The monitor then
  promotes the secondary (``wait_primary``: it accepts writes alone until the old node is back).
* ``rejoin(node)`` starts the killed node's keeper again; it comes back as the secondary
  (``pg_rewind`` if needed), and the formation is synchronous again.
* ``uri(dbname)`` is the multi-host URL every process uses (``target_session_attrs=read-write``):
  after a failover a new connection finds the new primary.
* The monitor's health checks are tightened for tests (a check a second, a node unhealthy after
  2 s, the demote timeout 3 s, against 5 s / 20 s / 30 s by default): a failover takes seconds,
  not half a minute. ``docs/operations/failover.md`` says what these settings trade.

Run as the ``postgres`` system user through ``runuser`` when we are root (``pg_autoctl`` refuses
root, as ``initdb`` does). No Django import.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.servers import HOST, PG_USER, free_port, pg_bindir

PG_AUTOCTL = shutil.which("pg_autoctl") or "/usr/bin/pg_autoctl"

# The monitor's failure detection, tightened for tests (milliseconds; defaults in brackets).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": 1000,  # [5000] how often the monitor probes each node
    "pgautofailover.health_check_timeout": 1000,  # [5000] a probe's connect timeout
    "pgautofailover.health_check_max_retries": 1,  # [2]
    "pgautofailover.health_check_retry_delay": 500,  # [2000]
    "pgautofailover.node_considered_unhealthy_timeout": 2000,  # [20000] no report from its keeper this long
    "pgautofailover.primary_demote_timeout": 3000,  # [30000] how long the old primary is given to demote itself
}


def installed() -> bool:
    return Path(PG_AUTOCTL).exists()


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    log_path: Path
    popen: subprocess.Popen | None = field(default=None, repr=False)


class AutoFailover:
    """A monitor and ``nodes`` PostgreSQL nodes (see the module's contract)."""

    def __init__(self, dbname: str, base_dir: Path | None = None, *, nodes: int = 2) -> None:
        self.dbname = dbname
        self.dir = Path(tempfile.mkdtemp(prefix="saga-paf-", dir=base_dir))
        self.bindir = pg_bindir()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, PG_USER, PG_USER)
        self.monitor = Node("monitor", free_port(), self.dir / "monitor", self.dir / "monitor.log")
        self.nodes = [Node(f"node{i}", free_port(), self.dir / f"node{i}", self.dir / f"node{i}.log")
                      for i in range(1, nodes + 1)]
        self._cleaned = False
        atexit.register(self.cleanup)

    # --- lifecycle ------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        """Monitor, then the first node (the primary), then the others (secondaries, made by
        ``pg_basebackup`` from it); returns once the formation is synchronous."""
        self._run(PG_AUTOCTL, "create", "monitor", "--pgdata", str(self.monitor.pgdata),
                  "--pgport", str(self.monitor.port), "--hostname", HOST, "--listen", HOST,
                  "--auth", "trust", "--no-ssl", "--pgctl", str(self.bindir / "pg_ctl"))
        self._keeper(self.monitor, ["run", "--pgdata", str(self.monitor.pgdata)])
        _wait(lambda: self._query_monitor("SELECT 1") is not None, timeout, "the monitor to accept connections")
        with self._connect(self.monitor.port, "pg_auto_failover") as conn:
            for name, value in MONITOR_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {int(value)}")
            conn.execute("SELECT pg_reload_conf()")
        for i, node in enumerate(self.nodes):
            self._keeper(node, [
                "create", "postgres", "--pgdata", str(node.pgdata), "--pgport", str(node.port),
                "--hostname", HOST, "--listen", HOST, "--name", node.name, "--dbname", self.dbname,
                "--auth", "trust", "--no-ssl", "--pgctl", str(self.bindir / "pg_ctl"),
                "--monitor", self.monitor_uri(), "--run",
            ])
            if i == 0:
                _wait(lambda: self.states().get(node.name, ("", ""))[0] in ("single", "primary", "wait_primary"),
                      timeout, f"{node.name} to become the primary", what_else=self._logs)
                with self._connect(node.port, self.dbname) as conn:
                    # Tests, not durability against an OS crash: the node's own fsync off (a crash of
                    # the PostgreSQL process loses nothing acknowledged: WAL is written before the
                    # commit returns), synchronous replication to the secondary kept.
                    conn.execute("ALTER SYSTEM SET fsync = off")
                    conn.execute("ALTER SYSTEM SET full_page_writes = off")
                    conn.execute("ALTER SYSTEM SET max_connections = 300")
                    conn.execute("SELECT pg_reload_conf()")
        self.wait_synchronous(timeout)

    def wait_synchronous(self, timeout: float = 120) -> None:
        """Until one node is ``primary`` and every other ``secondary``, with the primary's
        ``synchronous_standby_names`` set. ``pg_basebackup`` waits for a checkpoint: the primary
        is asked for one while a node is catching up, so it does not wait for the timed one."""
        def synchronous() -> bool:
            states = self.states()
            if any(goal == "catchingup" or reported in ("wait_standby", "catchingup")
                   for reported, goal in states.values()):
                primary = self.primary()
                if primary is not None:
                    self._try(primary.port, "CHECKPOINT")
            roles = sorted(reported for reported, goal in states.values() if reported == goal)
            if roles != ["primary"] + ["secondary"] * (len(self.nodes) - 1):
                return False
            primary = self.primary()
            names = self._try(primary.port, "SHOW synchronous_standby_names") if primary else None
            return bool(names and names[0][0] not in ("", "''"))
        _wait(synchronous, timeout, "the formation to be synchronous", interval=0.5, what_else=self._logs)

    def kill_primary(self) -> Node:
        """The primary's host goes down: its keeper SIGKILLed, its PostgreSQL stopped with
        ``-m immediate``. Returns that node."""
        node = self.primary()
        if node is None:
            raise RuntimeError(f"no primary to kill: {self.states()}")
        self.kill(node)
        return node

    def kill(self, node: Node) -> None:
        if node.popen is not None and node.popen.poll() is None:
            # The keeper and its helper processes, not PostgreSQL: that one is stopped in immediate mode.
            # The supervisor too ("/usr/bin/pg_autoctl run ...", by path): left alive, it restarts the
            # services of a keeper started by rejoin() and the node never goes down.
            for pid in _session_pids(node.popen.pid):
                if _comm(pid).split(" ", 1)[0].rsplit("/", 1)[-1].startswith("pg_autoctl"):
                    _signal(pid, signal.SIGKILL)
            node.popen.wait(10)
        self._run(str(self.bindir / "pg_ctl"), "stop", "-D", str(node.pgdata), "-m", "immediate", "-w", check=False)
        for pid in _session_pids(node.popen.pid if node.popen else -1):  # anything left of that host
            _signal(pid, signal.SIGKILL)

    def rejoin(self, node: Node, timeout: float = 120) -> None:
        """Start ``node``'s keeper again; returns once it is the secondary of a synchronous formation."""
        self._keeper(node, ["run", "--pgdata", str(node.pgdata)])
        self.wait_synchronous(timeout)

    def wait_new_primary(self, old: Node, timeout: float = 60) -> Node:
        """Until a node other than ``old`` accepts writes (promoted, and no longer read-only: the
        keeper keeps a promoted node read-only until the old primary's demote timeout passed)."""
        found: list[Node] = []

        def promoted() -> bool:
            for node in self.nodes:
                if node is not old:
                    rows = self._try(node.port, "SELECT NOT pg_is_in_recovery() AND "
                                                "current_setting('transaction_read_only') = 'off'")
                    if rows and rows[0][0]:
                        found.append(node)
                        return True
            return False
        _wait(promoted, timeout, f"a node other than {old.name} to be promoted", interval=0.1, what_else=self._logs)
        return found[0]

    def cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        try:
            for node in [*self.nodes, self.monitor]:
                if node.popen is not None:
                    for pid in _session_pids(node.popen.pid):
                        _signal(pid, signal.SIGKILL)
                if node.pgdata.exists():
                    self._run(str(self.bindir / "pg_ctl"), "stop", "-D", str(node.pgdata), "-m", "immediate",
                              check=False)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- clients --------------------------------------------------------------

    def uri(self, dbname: str | None = None) -> str:
        hosts = ",".join(f"{HOST}:{node.port}" for node in self.nodes)
        return f"postgres://{PG_USER}@{hosts}/{dbname or self.dbname}?target_session_attrs=read-write"

    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@{HOST}:{self.monitor.port}/pg_auto_failover?sslmode=disable"

    def primary(self) -> Node | None:
        states = self.states()
        for node in self.nodes:
            if states.get(node.name, ("", ""))[0] in ("primary", "wait_primary", "single"):
                return node
        return None

    def states(self) -> dict[str, tuple[str, str]]:
        """Node name -> (reported state, assigned state), as the monitor has them."""
        rows = self._query_monitor("SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node")
        return {name: (reported, goal) for name, reported, goal in rows or []}

    def connect(self, dbname: str | None = None, **kwargs: Any) -> psycopg.Connection:
        """A connection to the current primary (libpq's host list, read-write)."""
        kwargs.setdefault("connect_timeout", 2)
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.uri(dbname), **kwargs)

    def logs(self) -> str:
        return self._logs()

    # --- internals ------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bindir}:{os.environ.get('PATH', '')}",
                "XDG_CONFIG_HOME": str(self.dir / "config"), "XDG_DATA_HOME": str(self.dir / "data"),
                "XDG_RUNTIME_DIR": str(self.dir / "run"), "PG_CONFIG": str(self.bindir / "pg_config")}

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", PG_USER, "--", *args] if self._as_postgres else list(args)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        (self.dir / "run").mkdir(exist_ok=True)
        if self._as_postgres:
            shutil.chown(self.dir / "run", PG_USER, PG_USER)
        done = subprocess.run(self._cmd(*args), cwd=self.dir, env=self._env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def _keeper(self, node: Node, args: list[str]) -> None:
        (self.dir / "run").mkdir(exist_ok=True)
        if self._as_postgres:
            shutil.chown(self.dir / "run", PG_USER, PG_USER)
        with open(node.log_path, "ab") as log:
            node.popen = subprocess.Popen(self._cmd(PG_AUTOCTL, *args), cwd=self.dir, env=self._env(),
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)

    def _connect(self, port: int, dbname: str) -> psycopg.Connection:
        return psycopg.connect(host=HOST, port=port, user=PG_USER, dbname=dbname, connect_timeout=2,
                               autocommit=True)

    def _try(self, port: int, sql: str, dbname: str | None = None) -> list[tuple] | None:
        try:
            with self._connect(port, dbname or self.dbname) as conn:
                return conn.execute(sql).fetchall()
        except psycopg.Error:
            return None

    def _query_monitor(self, sql: str) -> list[tuple] | None:
        return self._try(self.monitor.port, sql, "pg_auto_failover")

    def _logs(self, chars: int = 2500) -> str:
        out = []
        for node in [self.monitor, *self.nodes]:
            try:
                out.append(f"--- {node.name} ---\n{node.log_path.read_text(errors='replace')[-chars:]}")
            except OSError:
                pass
        return "\n".join(out)


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.2, what_else: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}"
                               + (f"\n{what_else()}" if what_else else ""))
        time.sleep(interval)


def _session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (a keeper started with ``start_new_session``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # after state, ppid, pgrp: the session id
                pids.append(int(entry))
    return pids


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
