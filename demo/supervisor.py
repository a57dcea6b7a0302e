"""Child processes of ``make demo``: each in its own session, stopped as whole process groups.

A demo is stopped with SIGINT, killed with SIGKILL, or crashes; whichever way, the
next one must not find a worker, daphne or provider of the last one still running
(ports taken, RQ worker names registered). So every child gets its own process group
(a SIGKILL of the group takes whatever it started), and their group ids are written
to ``<run dir>/demo-children.pids`` for the next demo to clean up.

"The next demo" is one started after this one has ended: a run directory belongs to
one live demo at a time (``RunDirLock``), so a second demo started beside a live one
refuses to start and touches none of its processes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from redis import RedisError

ROOT = Path(settings.BASE_DIR)
# The demo's workers run with a short lease, so a killed worker's runs move on visibly soon.
LEASE_TTL = "5"
STOP_GRACE = 10.0
LOCK_FILE = "demo.lock"
STATE_FILE = "demo-state.json"


class DemoRunning(Exception):
    """The run directory belongs to a live demo; the message names it (console URL, pid)."""


class RunDirLock:
    """One live demo per run directory: ``<run dir>/demo.lock``, ``flock``ed for the demo's whole life.

    The lock belongs to the open file, so the kernel drops it when the last process
    holding that file exits, however it exits (SIGKILL included): a lock file left by a
    dead demo never blocks the next one, and of two demos started at the same moment
    exactly one gets it. Nothing else decides: no pid is read and then checked.
    ``<run dir>/demo-state.json`` says who holds it (pid, console URL), for the message
    a refused demo prints; it is written by the holder only, replaced atomically, and
    removed when the holder releases the lock.

    The file is opened close-on-exec, so the processes a demo starts do not hold it;
    the demo run again against embedded servers is given ``fd`` on purpose and takes
    it over with ``inherited()``, so the lock lasts until both have exited.
    """

    def __init__(self, run_dir: Path, fd: int, state: dict) -> None:
        self.run_dir, self.fd, self.state = run_dir, fd, state
        self.state_path = run_dir / STATE_FILE

    @classmethod
    def acquire(cls, run_dir: Path, *, mode: str) -> RunDirLock:
        """Take the lock and write the state file, or raise ``DemoRunning`` having changed nothing."""
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise DemoRunning(_running_message(run_dir)) from None
            raise
        lock = cls(run_dir, fd, {"pid": os.getpid(), "mode": mode, "url": None,
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")})
        lock._write()
        return lock

    @classmethod
    def inherited(cls, run_dir: Path, fd: int) -> RunDirLock:
        """The lock a parent demo holds and passed on as ``fd``; raises ``DemoRunning`` if it is not that."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the same open file: granted to it again at once
            same = os.fstat(fd).st_ino == os.stat(run_dir / LOCK_FILE).st_ino
        except OSError:
            same = False
        if not same:
            raise DemoRunning(_running_message(run_dir))
        return cls(run_dir, fd, _read_state(run_dir) or {})

    def publish(self, **fields: object) -> None:
        """Add ``fields`` (the console's URL, say) to what a refused demo is told."""
        self.state = {**(_read_state(self.run_dir) or self.state), **fields}
        self._write()

    def release(self, *, forget: bool = True) -> None:
        """Drop the lock; ``forget``: remove the state file first (the holder that wrote it)."""
        if self.fd < 0:
            return
        if forget:
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()
        os.close(self.fd)
        self.fd = -1

    def _write(self) -> None:
        tmp = self.state_path.with_name(f".{STATE_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(self.state) + "\n")
        os.replace(tmp, self.state_path)


def _read_state(run_dir: Path) -> dict | None:
    try:
        state = json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _running_message(run_dir: Path) -> str:
    state = _read_state(run_dir) or {}
    pid = state.get("pid") if isinstance(state.get("pid"), int) and _alive(state["pid"]) else None
    parts = []
    if state.get("url"):
        parts.append(f"console {state['url']}")
    elif state.get("mode") == "quick":
        parts.append("manage.py demo --quick")
    elif pid:
        parts.append("still starting")
    if pid:
        parts.append(f"pid {pid}")
    if parts and state.get("started"):
        parts.append(f"started {state['started']}")
    who = ", ".join(parts) or "it is just starting"
    stop = f"stop it first (Ctrl-C in its terminal, or kill {pid})" if pid else "stop it first"
    return (f"a demo is already running in {shown(run_dir)}: {who}. It keeps running untouched; "
            f"{stop}, or start this one with another --run-dir.")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Child:
    name: str
    argv: list[str]
    popen: subprocess.Popen
    log: Path
    exits: list[float] = field(default_factory=list)  # when it exited unasked (monotonic)
    restart_at: float | None = None  # set once its exit is seen: when to restart it (monotonic)


class Supervisor:
    """Starts children each in a new session (process group == pid) and stops whole groups."""

    def __init__(self, run_dir: Path, env: dict[str, str], say: Callable[[str], None]) -> None:
        self.run_dir, self.env, self.say = run_dir, env, say
        self.children: dict[str, Child] = {}
        self.groups: list[int] = []  # every group ever started: a leader's children may outlive it
        self.pid_file = run_dir / "demo-children.pids"

    def reap_leftovers(self) -> None:
        """Kill the process groups an earlier demo started and left running (it was SIGKILLed)."""
        if self.pid_file.exists():
            for line in self.pid_file.read_text().splitlines():
                pgid, _, name = line.partition(" ")
                if pgid.isdigit() and _started_here(int(pgid)):
                    _killpg(int(pgid), signal.SIGKILL)
                    self.say(f"killed {name} (pid {pgid}), left running by an earlier demo")
        self.pid_file.write_text("")

    def spawn(self, name: str, *argv: str, quiet: bool = False) -> Child:
        log = self.run_dir / f"{name}.log"
        with open(log, "ab") as handle:
            popen = subprocess.Popen(
                [sys.executable, *argv], cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups.append(popen.pid)
        with open(self.pid_file, "a") as handle:
            handle.write(f"{popen.pid} {name}\n")
        exits = self.children[name].exits if name in self.children else []
        self.children[name] = Child(name, list(argv), popen, log, exits)
        if not quiet:
            self.say(f"  started {name:<10} pid {popen.pid:<7} log {shown(log)}")
        return self.children[name]

    def kill(self, name: str) -> int:
        """SIGKILL ``name``'s whole process group; its pid."""
        child = self.children[name]
        _killpg(child.popen.pid, signal.SIGKILL)
        child.popen.wait()
        return child.popen.pid

    def restart(self, name: str) -> Child:
        """Start ``name`` again with the same arguments (``Child.argv`` as it is now)."""
        if "sagas_worker" in self.children[name].argv:
            forget_rq_worker(name)
        return self.spawn(name, *self.children[name].argv, quiet=True)

    def exited(self) -> list[Child]:
        return [c for c in self.children.values() if c.popen.poll() is not None]

    def stop_all(self, last: tuple[str, ...] = ()) -> int:
        """SIGTERM every group, SIGKILL what is left after ``STOP_GRACE`` s; the number stopped.

        The children named in ``last`` are stopped after the others have exited (the
        providers outlive the workers, so no call in flight is cut off at shutdown).
        """
        running = [c for c in self.children.values() if c.popen.poll() is None]
        first = [c for c in running if c.name not in last]
        for wave in (first, [c for c in running if c.name in last]):
            for child in wave:
                _killpg(child.popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            for child in wave:
                try:
                    child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.say(f"  {child.name} did not stop within {STOP_GRACE:g}s: SIGKILL")
                    _killpg(child.popen.pid, signal.SIGKILL)
                    child.popen.wait()
        for pgid in self.groups:  # anything a leader left behind in its group
            _killpg(pgid, signal.SIGKILL)
        self.pid_file.write_text("")
        return len(running)

    def tail(self, name: str, lines: int = 15) -> str:
        text = self.children[name].log.read_text(errors="replace") if self.children[name].log.exists() else ""
        return "\n".join(text.strip().splitlines()[-lines:])


def shown(path: Path) -> str:
    """``path`` relative to the working directory where it is inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _started_here(pid: int) -> bool:
    """Whether ``pid`` is a process a demo in this checkout starts (manage.py or daphne, cwd ROOT)."""
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cwd == ROOT.resolve() and (b"manage.py" in cmdline or b"daphne" in cmdline)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def forget_rq_worker(name: str) -> None:
    """Record the death of RQ worker ``name``, as RQ does itself on a clean exit.

    A SIGKILLed worker leaves its registration in Redis until its TTL runs out
    (minutes), and RQ refuses to start another worker of the same name until then.
    Call it only when no live process has that name.
    """
    from rq.worker import Worker

    from sagas.integration import redis_connection

    try:
        worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=redis_connection())
        if worker is not None:
            worker.register_death()
    except RedisError:
        pass  # the restarted worker will say what is wrong with Redis
