"""Real worker processes for tests: spawn, SIGKILL, SIGSTOP, and always clean up.

Each worker runs in its own session (process group), so a kill takes every
process it started. Output goes to a log file per worker, printed when a test
fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
# The two xdist groups of the benchmark smokes (tests/bench), which share no database, Redis
# db or virtualenv: see pytest_collection_modifyitems in tests/conftest.py.
BENCH_SHARED, BENCH_OWN = "bench-shared", "bench-own-servers"


_FORK_SERVER: list = []


def fork_server():
    """This pytest process's ``tests.forkserver.ForkServer``, started on first use; None with
    SAGA_TEST_FORKSERVER=0, which starts every process with ``subprocess.Popen`` instead."""
    if os.environ.get("SAGA_TEST_FORKSERVER", "1") == "0":
        return None
    if not _FORK_SERVER:
        import atexit
        import tempfile

        from tests.forkserver import ForkServer

        server = ForkServer(tempfile.mkdtemp(prefix="saga-forks-"))
        atexit.register(server.stop)
        _FORK_SERVER.append(server)
    return _FORK_SERVER[0]


def test_database_url() -> str:
    """The URL of the database pytest-django created, for worker processes."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    host = s["HOST"] or "127.0.0.1"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgres://{auth}@{host}{port}/{s['NAME']}"


def worker_env(modules: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGAS_")}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings_demo",
        DATABASE_URL=test_database_url(),
        REDIS_URL=settings.REDIS_URL,
        SAGAS_MODULES=modules,
        SAGAS_LEASE_TTL=str(settings.SAGAS_LEASE_TTL),
        SAGAS_SWEEP_INTERVAL=str(settings.SAGAS_SWEEP_INTERVAL),
        SAGAS_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def run_python(args: list[str], *, env: dict[str, str] | None = None, timeout: float,
               cwd: Path | str = ROOT) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)``, started
    by the fork server (``fork_server``) when there is one."""
    server = fork_server()
    if server is None:
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="saga-run-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        popen = server.popen(args, dict(os.environ if env is None else env), str(cwd), str(out), str(err))
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            raise
        return subprocess.CompletedProcess([sys.executable, *args], popen.returncode,
                                           out.read_text(errors="replace"), err.read_text(errors="replace"))


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen, log_path: Path) -> None:
        self.name, self.popen, self.log_path = name, popen, log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole process group: the process running workflow code dies."""
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None


class Procs:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        server = fork_server()
        if server is not None:
            popen = server.popen(args, env, str(ROOT), str(log_path))
        else:
            handle = open(log_path, "ab")
            popen = subprocess.Popen(
                [sys.executable, *args], cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            handle.close()
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, modules: str, *args: str, **extra_env: str) -> Proc:
        return self.start(name, ["manage.py", "sagas_worker", "--name", name, *args], worker_env(modules, **extra_env))

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def logs(self) -> str:
        return "\n".join(f"----- {p.name} (pid {p.pid}) -----\n{p.log()[-6000:]}" for p in self.procs)


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def wait_sessions_gone(application_name: str, timeout: float = 60) -> None:
    """Wait until PostgreSQL has no session named ``application_name`` left (a killed worker's
    backends finish what the server had already received, a COMMIT included, then go)."""
    from django.db import connection

    def gone() -> bool:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name])
            return cur.fetchone()[0] == 0
    wait_until(gone, timeout, what=f"the sessions of {application_name!r} to end")


def listening_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """Process ``pid``'s TCP sockets as ``(local port, remote port, state)``, read from /proc
    (state ``0A`` is LISTEN); empty when the process is gone."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                found.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16), fields[3]))
    return found


def open_connections(pid: int, port: int) -> int:
    """How many TCP connections process ``pid`` holds on its local ``port``, listening socket
    not counted: the requests an HTTP/1.0 server is still working on (each handler closes its
    connection when it is done, also when its caller died meanwhile)."""
    return sum(1 for local, _, state in tcp_sockets(pid) if local == port and state != "0A")


class SharedProviders:
    """One ``demo_providers`` process for a whole test session (each xdist worker has its own,
    on its own test database), for the tests in which the providers are a real HTTP process
    to call and not the process under test (none of them kills or stops it).

    What a test sees of it is its books, which live in the test database: the tests using it
    are transactional, so pytest-django empties those tables after each test, as it did when
    each test had a process of its own. What could still leak from one test into the next is a
    request the providers are still working on (a ``latency`` fault sleeps before the work
    and then executes it, after its caller was killed): ``for_a_test`` waits for the process
    to have no request in flight, and starts a new one if it keeps one longer than a moment.
    A test that needs other settings of the providers (an environment variable) or stops them
    starts its own with ``start_providers``."""

    IDLE_WAIT = 3.0

    def __init__(self, log_dir: Path) -> None:
        self.procs = Procs(log_dir)
        self.proc: Proc | None = None
        self.url = ""
        self.started = 0

    def for_a_test(self) -> str:
        """The URL of a live providers process with nothing in flight."""
        if self.proc is not None and self.proc.alive() and self._idle():
            return self.url
        if self.proc is not None:
            self.proc.kill()
        self.url = start_providers(self.procs, name=f"providers-{self.started + 1}")
        self.proc, self.started = self.procs.procs[-1], self.started + 1
        return self.url

    def _idle(self) -> bool:
        port = listening_port(self.url)
        deadline = time.monotonic() + self.IDLE_WAIT
        while open_connections(self.proc.pid, port):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def log_offset(self) -> int:
        return self.proc.log_path.stat().st_size if self.proc is not None and self.proc.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        if self.proc is None:
            return ""
        with open(self.proc.log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")

    def stop(self) -> None:
        self.procs.stop_all()


def start_providers(procs, name: str = "providers", *, host: str = "127.0.0.1", **env: str) -> str:
    """The demo providers as a real ``demo_providers`` process on a port it picks itself (no race
    with another suite), started by ``procs``; its URL once it listens (on ``host``: 127.0.0.1, or
    a bridge's address for workers in network namespaces, ``tests.faults.netns``)."""
    import re

    server = procs.start(name, ["manage.py", "demo_providers", "--host", host, "--port", "0"], worker_env("", **env))
    found = wait_until(lambda: re.search(r"listening on (http://\S+)", server.log()) or not server.alive(), 30,
                       what="the provider server to listen")
    assert server.alive(), server.log()
    return found.group(1)
