"""Private PostgreSQL and Redis servers that tests and bench scripts may stop, crash and restart.

Never the shared servers (127.0.0.1:5432 and :6379): each object here owns a
temp directory and a free port on 127.0.0.1 (and, with ``listen``, on other local
addresses too: a bridge's, for clients in network namespaces), and only ever
signals the processes it started. No Django import: the test process, bench scripts and
fixtures all use it before (or without) configuring Django.

Contracts:

* The port is chosen once, in ``__init__``, and kept across ``stop``/``start``,
  so processes pointed at ``url()`` reach the same address after a restart.
* ``start()`` returns once the server accepts connections; ``stop()`` once the
  server process has exited and the port is closed. Both are idempotent.
* ``PostgresServer.restart("immediate")`` is a crash (no checkpoint, every
  backend killed, WAL recovery on the next start); "fast" is a clean restart
  that still drops every connection.
* ``RedisServer`` persists nothing: a restart is an outage plus a FLUSHALL.
* ``cleanup()`` stops what is running (PostgreSQL immediately) and deletes the
  directory. Every server started here is also cleaned up at interpreter exit,
  as a safety net for a test process that dies without running its fixtures'
  teardown (a SIGKILL still leaks it: the directory names it).

As root, PostgreSQL is initialised and run as the ``postgres`` system user
(``initdb`` refuses root) through ``runuser``; the directory is then that user's.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import redis

HOST = "127.0.0.1"
PG_USER = "postgres"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def port_open(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def pg_bindir() -> Path:
    """The newest Debian PostgreSQL binaries (``/usr/lib/postgresql/<major>/bin``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        return Path(pg_ctl).parent
    raise RuntimeError("no PostgreSQL server binaries: install postgresql (Debian: /usr/lib/postgresql/*/bin)")


class PostgresServer:
    """A private PostgreSQL cluster: temp data dir, free port on 127.0.0.1, trust auth.

    Tuned for tests, not for surviving an OS crash: fsync and full_page_writes are
    off. ``synchronous_commit`` stays on: with it off, an immediate stop loses
    commits already acknowledged (still in WAL buffers), which no real crash of
    the server process does, and every "ran twice" it caused would be ours. A
    crash (``stop("immediate")``) recovers from WAL on the next start.
    """

    def __init__(self, base_dir: Path | None = None, *, max_connections: int = 200,
                 listen: tuple[str, ...] = (), trust: tuple[str, ...] = ()) -> None:
        """``listen``: addresses to listen on besides 127.0.0.1 (a bridge's, for clients in other
        network namespaces); ``trust``: client subnets (CIDR) let in without a password."""
        self.dir = Path(tempfile.mkdtemp(prefix="saga-pg-", dir=base_dir))
        self.data = self.dir / "data"
        self.sockets = self.dir / "sock"
        self.log_path = self.dir / "postgres.log"
        self.port = free_port()
        self.max_connections = max_connections
        self.listen, self.trust = tuple(listen), tuple(trust)
        self.bindir = pg_bindir()
        self._as_postgres = os.geteuid() == 0
        self._initialised = False
        self._cleaned = False
        atexit.register(self.cleanup)

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Start the server (initdb on the first start); returns once it accepts connections."""
        if not self._initialised:
            self._initdb()
        if self.running():
            return
        self._run(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log_path),
            "-o", f"-p {self.port}",
        )
        _wait(self._ready, 60, f"PostgreSQL on port {self.port} to accept connections")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast|immediate|smart``; returns once the postmaster is gone and the port closed."""
        if mode not in {"fast", "immediate", "smart"}:
            raise ValueError(f"mode must be fast, immediate or smart, not {mode!r}")
        if self._initialised and self.running():
            self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data), check=False)
            pid = self._postmaster_pid()
            if pid is not None:  # pg_ctl gave up (a hung smart stop): no server outlives stop()
                _signal(pid, signal.SIGQUIT)
                _wait(lambda: not pid_alive(pid), 30, f"postmaster {pid} to exit")
        _wait(lambda: not port_open(self.port), 30, f"port {self.port} to close")

    def start_standby_of(self, primary: PostgresServer) -> None:
        """Start this server as a streaming hot standby of ``primary`` (``pg_basebackup -R``
        instead of initdb: initdb's defaults already give the primary wal_level=replica and trust
        for replication from 127.0.0.1). Returns once it accepts connections."""
        if self._initialised:
            raise RuntimeError("start_standby_of() makes a new server; this one is already initialised")
        if self._as_postgres:
            shutil.chown(self.dir, PG_USER, PG_USER)
        self._run("pg_basebackup", "-h", HOST, "-p", str(primary.port), "-U", PG_USER, "-D", str(self.data),
                  "-R", "-X", "stream", "--no-sync", "-c", "fast")
        self._initialised = True
        self.start()

    def restart(self, mode: str = "fast") -> None:
        """``stop(mode)`` then ``start()``; ``mode="immediate"`` is a crash followed by recovery."""
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        pid = self._postmaster_pid()
        return pid is not None and pid_alive(pid)

    def cleanup(self) -> None:
        """Stop immediately (if running) and delete the directory. Safe to call twice."""
        if self._cleaned:
            return
        self._cleaned = True
        try:
            if self._initialised:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- clients --------------------------------------------------------------

    def url(self, dbname: str, *, host: str = HOST) -> str:
        """``host``: 127.0.0.1, or one of the ``listen`` addresses."""
        return f"postgres://{PG_USER}@{host}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection:
        kwargs.setdefault("connect_timeout", 5)
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(host=HOST, port=self.port, user=PG_USER, dbname=dbname, **kwargs)

    def create_database(self, name: str, *, template: str | None = None) -> None:
        """CREATE DATABASE ``name`` (a copy of ``template`` when given; nobody may be connected to it)."""
        query = psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
        if template:
            query += psycopg.sql.SQL(" TEMPLATE {}").format(psycopg.sql.Identifier(template))
        with self.connect() as conn:
            conn.execute(query)

    def drop_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
            )

    def backends(self, dbname: str | None = None) -> list[dict[str, Any]]:
        """Client sessions other than the caller's: pid, datname, application_name, client_port, state."""
        query = (
            "SELECT pid, datname, application_name, client_port, state FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        params: list[Any] = []
        if dbname is not None:
            query += " AND datname = %s"
            params.append(dbname)
        with self.connect() as conn:
            rows = conn.execute(query + " ORDER BY pid", params).fetchall()
        keys = ("pid", "datname", "application_name", "client_port", "state")
        return [dict(zip(keys, row)) for row in rows]

    def terminate_backends(
        self, dbname: str | None = None, *, application_name: str | None = None, pids: list[int] | None = None
    ) -> int:
        """``pg_terminate_backend`` every client session matching all the filters given
        (never the caller's own); how many were ended."""
        query = (
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        params: list[Any] = []
        if dbname is not None:
            query += " AND datname = %s"
            params.append(dbname)
        if application_name is not None:
            query += " AND application_name = %s"
            params.append(application_name)
        if pids is not None:
            query += " AND pid = ANY(%s)"
            params.append(list(pids))
        with self.connect() as conn:
            return conn.execute(query, params).fetchone()[0]

    # --- internals ------------------------------------------------------------

    def _initdb(self) -> None:
        self.sockets.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            # The postgres user must reach the directory; tempfile makes it 0700 and root's.
            shutil.chown(self.dir, PG_USER, PG_USER)
            shutil.chown(self.sockets, PG_USER, PG_USER)
        self._run(
            "initdb", "-D", str(self.data), "-U", PG_USER, "--auth=trust", "--no-sync",
            "-E", "UTF8", "--locale=C.UTF-8",
        )
        settings = {
            "listen_addresses": "'" + ",".join((HOST, *self.listen)) + "'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.sockets}'",
            "max_connections": str(self.max_connections),
            "shared_buffers": "'32MB'",
            "fsync": "off",
            "full_page_writes": "off",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# bench/servers.py\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        if self.trust:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.writelines(f"host all all {subnet} trust\n" for subnet in self.trust)
        self._initialised = True

    def _run(self, binary: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / binary), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", PG_USER, "--", *cmd]
        done = subprocess.run(
            cmd, cwd=self.dir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{binary} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}\n"
                f"{self._log_tail()}"
            )
        return done

    def _ready(self) -> bool:
        return self._run("pg_isready", "-q", "-h", HOST, "-p", str(self.port), "-t", "2", check=False).returncode == 0

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0].strip()
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.isdigit() else None

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class RedisServer:
    """A private ``redis-server`` on a free port of 127.0.0.1, persisting nothing."""

    def __init__(self, base_dir: Path | None = None, *, listen: tuple[str, ...] = ()) -> None:
        """``listen``: addresses to listen on besides 127.0.0.1."""
        self.dir = Path(tempfile.mkdtemp(prefix="saga-redis-", dir=base_dir))
        self.listen = tuple(listen)
        self.log_path = self.dir / "redis.log"
        self.port = free_port()
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc: subprocess.Popen | None = None
        self._cleaned = False
        atexit.register(self.cleanup)

    def start(self) -> None:
        """Start the server; returns once it answers PING."""
        if self.running():
            return
        self.proc = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", HOST, *self.listen, "--dir", str(self.dir),
                "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", str(self.log_path),
                "--protected-mode", "no",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait(self._pings, 30, f"Redis on port {self.port} to answer PING")

    def stop(self) -> None:
        """SIGTERM (it persists nothing, so it exits at once; SIGKILL if it does not); returns
        once the process is gone and the port closed."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        _wait(lambda: not port_open(self.port), 10, f"port {self.port} to close")

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def flushall(self) -> None:
        self._client().flushall()

    def url(self, db: int = 0, *, host: str = HOST) -> str:
        return f"redis://{host}:{self.port}/{db}"

    def cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _client(self) -> redis.Redis:
        # No retries: redis-py's default backs off for seconds against a port that refuses.
        return redis.Redis(host=HOST, port=self.port, socket_timeout=5, socket_connect_timeout=2, retry=None)

    def _pings(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
        if not port_open(self.port):
            return False
        try:
            return bool(self._client().ping())
        except redis.RedisError:
            return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
