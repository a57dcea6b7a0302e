"""Starts the suite's Python processes by fork from one that has already imported Django.

Every worker, sweeper, provider and console server a test starts is a real process: its own
pid, session and PostgreSQL connections, killed with a real SIGKILL. What is shared is the
work of importing Django, psycopg, redis and rq: a worker started with Popen spent a median
1.03 CPU-s until its ready file, one forked from here 0.41 (8 starts each, an idle machine,
2026-12-06). The suite starts a few hundred such processes on a 2-core machine.

The server (``python -m tests.forkserver``) imports the modules in ``PRELOAD`` and nothing
that reads settings, opens a connection, starts a thread or an event loop. A request on its
Unix socket is one JSON line (argv, env, cwd, log files); the server forks, and the child
becomes what ``subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd,
start_new_session=True, stdout=log, stderr=STDOUT)`` would have started: a new session, the
log as stdout and stderr (or a second file as stderr), stdin from /dev/null, the environment replaced, ``sys.argv`` and
``sys.path`` as the interpreter sets them, then the script or module run as ``__main__``.
The server answers with the pid, and later with the child's exit status on the same
connection, which ``ForkedPopen`` turns into ``returncode`` (negative for a signal, as
Popen's). The server exits when the process that started it closes its stdin.
"""

from __future__ import annotations

import gc
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import time

# Imported before the fork: none reads Django settings, connects, or starts a thread or loop
# (daphne is left out: it installs Twisted's asyncio reactor, an epoll a child must own).
PRELOAD = (
    "django.db.models", "django.urls", "django.http", "django.forms", "django.template", "django.core.management",
    "django.contrib.admin", "django.contrib.admin.apps", "django.contrib.admin.views.decorators",
    "django.contrib.auth.apps", "django.contrib.auth.checks", "django.contrib.auth.hashers",
    "django.contrib.auth.management", "django.contrib.auth.password_validation", "django.contrib.auth.tokens",
    "django.contrib.contenttypes.apps", "django.contrib.contenttypes.management", "django.contrib.messages.apps",
    "django.contrib.sessions.apps", "django.contrib.sites.shortcuts", "django.contrib.staticfiles.apps",
    "django.contrib.staticfiles.finders", "django.contrib.postgres.fields", "django.contrib.postgres.indexes",
    "django.contrib.postgres.search", "django.db.backends.postgresql.base", "django.db.backends.postgresql.schema",
    "django.db.backends.postgresql.introspection", "django.db.backends.postgresql.creation",
    "django.db.migrations", "django.db.migrations.state", "django.db.migrations.operations",
    "django.template.defaulttags", "django.template.loader_tags", "django.templatetags.i18n", "django.views.debug",
    "django.views.decorators.http", "django.middleware.http",
    "psycopg", "psycopg_pool", "redis", "redis.asyncio", "rq", "rq.cron", "rq.decorators", "channels",
    "channels.apps", "channels.layers", "prometheus_client", "prometheus_client.core", "requests", "dateutil.tz",
    "dateutil.relativedelta", "croniter", "whitenoise.base", "whitenoise.responders", "csp.apps", "csp.constants",
    "axes.apps", "axes.handlers", "django_htmx", "packaging.version", "getpass",
)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional part: the child imports it itself, as a fresh process would
    from django.conf import settings

    # Started without DJANGO_SETTINGS_MODULE: a module that read settings at import would have
    # raised above, and none may have configured them for every child.
    assert not settings.configured, "a preloaded module configured Django settings"
    # What was imported here moves out of the collector's reach: a child's collections would
    # otherwise walk (and so copy, page by page) the whole inherited heap.
    gc.collect()
    gc.freeze()


def _child(request: dict, listener: socket.socket, connections: list[socket.socket]) -> dict:
    """In the forked child: become the process ``request`` describes."""
    for sock in (listener, *connections):
        sock.close()
    signal.set_wakeup_fd(-1)
    # As a fresh interpreter has them: SIGINT raises KeyboardInterrupt, SIGPIPE stays ignored
    # (a write to a closed socket raises BrokenPipeError), the rest are the defaults.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if request.get("err") else out
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err, null}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    return request


def _become(request: dict) -> None:
    """Runs the child's program as ``python *argv`` would, and exits as it would."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in extra]
    argv = request["argv"]
    if argv[0] == "-m":
        sys.path[:] = [os.getcwd(), *extra, *base]
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.path[:] = ["", *extra, *base]
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        script = os.path.abspath(argv[0])
        sys.path[:] = [os.path.dirname(script), *extra, *base]
        sys.argv = list(argv)
        runpy.run_path(script, run_name="__main__")


def serve(path: str) -> dict | None:
    """The server's loop; returns only in a forked child, with the request it is to become."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    connections: list[socket.socket] = []
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([listener, wake_r, sys.stdin, *connections], [], [])
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            return None  # the pytest process that started the server is gone
        if wake_r in readable:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = waiting.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                    except OSError:
                        pass
        if listener in readable:
            conn, _ = listener.accept()
            connections.append(conn)
        for conn in [c for c in connections if c in readable]:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
            connections.remove(conn)
            if not data:
                conn.close()
                continue
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                conn.close()
                return _child(request, listener, [*connections, *waiting.values()])
            waiting[pid] = conn
            conn.sendall(f"{pid}\n".encode())


class ForkServer:
    """One server per pytest process, started on first use."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "forkserver.sock")
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", self.path], cwd=os.path.dirname(os.path.dirname(__file__)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )
        line = self.server.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the fork server did not start: {line!r}")

    def popen(self, argv: list[str], env: dict[str, str], cwd: str, log: str, err: str = "") -> ForkedPopen:
        """``argv`` started as ``python *argv``, its stdout to ``log`` and its stderr to ``err``
        (empty: to ``log`` as well)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        request = {"argv": argv, "env": env, "cwd": str(cwd), "log": str(log), "err": str(err)}
        conn.sendall(json.dumps(request).encode() + b"\n")
        reader = conn.makefile("rb")
        return ForkedPopen(int(reader.readline()), conn, reader)

    def stop(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=10)


class ForkedPopen:
    """The parts of ``subprocess.Popen`` the tests use, for a child of the fork server."""

    def __init__(self, pid: int, conn: socket.socket, reader) -> None:
        self.pid, self.returncode = pid, None
        self._conn, self._reader = conn, reader

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if ready:
            line = self._reader.readline()
            # The server gone before its child: the child is gone with its session's SIGKILL.
            self.returncode = int(line) if line.strip() else -signal.SIGKILL
            self._reader.close()
            self._conn.close()

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    _preload()
    child = serve(sys.argv[1])
    if child is not None:
        _become(child)
