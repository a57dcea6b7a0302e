"""``make demo``: the product demo. ``manage.py demo --quick``: the 20-run crash demo (make demo v1).

The product demo starts, each in its own process group with its log in the run
directory (``.run/`` by default): daphne serving the console, the simulated providers,
two workers, the sweeper and the reconciler. Its main loop then plays the world
(``demo.loadgen``): an order agent every second, faults at a steady rate, an approver
bot for most shipments, and a SIGKILL of a worker every ``--kill-every`` seconds
(restarted at once). It prints the console's URL and three logins, then a status line
every 10 s. SIGINT or SIGTERM (or ``--duration``) stops every process it started,
the embedded servers last, and exits 0.

One demo per run directory: a demo holds ``<run dir>/demo.lock`` for its whole life
(``demo.supervisor.RunDirLock``). A second one started beside it exits 1 at once,
naming the running demo's URL and pid, and touches none of its processes. Processes
left running by a demo that was SIGKILLed are stopped by the next demo, as before.

The simulated providers keep one address for the demo's whole life: the workers are
given it at start, so a providers process that exits is restarted on the same port.
The load generator pauses (with backoff) while PostgreSQL or Redis is unreachable and
resumes when they answer; so does a child that keeps exiting meanwhile.

Which PostgreSQL and Redis: see ``demo.embedded``. When an embedded server is needed,
this command starts it, then runs itself again as a child pointed at it
(``DATABASE_URL``/``REDIS_URL``), since this process's settings are already loaded.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from core.storage import is_storage_error
from demo import embedded
from demo.quick import run_quick
from demo.supervisor import LEASE_TTL, ROOT, DemoRunning, RunDirLock, Supervisor, forget_rq_worker, shown

if TYPE_CHECKING:
    from demo.loadgen import LoadGenerator

STATUS_EVERY = 10.0
# (username, role, staff); the passwords are random, kept in <run dir>/demo-users.txt. The auditor
# is staff: the Django admin, read-only (createuser --staff).
USERS = (("operator", "operator", False), ("approver", "approver", False), ("auditor", "viewer", True))
ROLE_HINTS = {"operator": "reconcile, retry, cancel, compensate", "approver": "approve or reject shipments",
              "viewer": "reads everything, changes nothing"}


def ensure_demo_users(path: Path) -> list[tuple[str, str, str]]:
    """The three demo logins ``(username, role, password)``, created or updated; the passwords
    are kept in ``path`` so a restarted demo prints the same ones."""
    stored: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and not line.startswith("#"):
                stored[parts[0]] = parts[2]
    users = []
    for username, role, staff in USERS:
        password = stored.get(username) or secrets.token_urlsafe(12)
        call_command("createuser", username, role=[role], password=password, staff=staff, stdout=io.StringIO())
        users.append((username, role, password))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("# Saga Console demo logins: username role password\n")
        handle.writelines(f"{u} {r} {p}\n" for u, r, p in users)
    return users


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as daphne (Twisted) binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Command(BaseCommand):
    help = ("Run the product demo: the console, providers, workers, sweeper and reconciler under a steady "
            "load with faults. --quick: two workers complete 20 runs, surviving a SIGKILL.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--quick", action="store_true", help="the short crash demo: --runs runs, then exit")
        parser.add_argument("--runs", type=int, default=20, help="--quick: how many runs")
        parser.add_argument("--no-kill", action="store_true", help="--quick: do not kill a worker mid-way")
        parser.add_argument("--timeout", type=float, default=180.0, help="--quick: give up after this many seconds")
        parser.add_argument("--port", type=int, default=8000, help="console port (0: a free one; taken: a free one)")
        parser.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: at Ctrl-C)")
        parser.add_argument("--kill-every", type=float, default=45.0,
                            help="SIGKILL a worker every this many seconds (0: never)")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between two new orders")
        parser.add_argument("--run-dir", default=str(ROOT / ".run"), help="logs, user list, embedded servers' data")
        parser.add_argument("--embedded", action="store_true",
                            help="use embedded PostgreSQL and Redis even if local servers answer")
        parser.add_argument("--embedded-child", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--lock-fd", type=int, default=None, help=argparse.SUPPRESS)  # the parent's lock

    def handle(self, *args: Any, **options: Any) -> None:
        if options["interval"] <= 0 or options["kill_every"] < 0 or options["duration"] < 0:
            raise CommandError("--interval must be positive; --kill-every and --duration cannot be negative")
        self.options = options
        self.run_dir = Path(options["run_dir"]).resolve()
        try:
            if options["lock_fd"] is not None:
                self.lock = RunDirLock.inherited(self.run_dir, options["lock_fd"])
            else:
                self.lock = RunDirLock.acquire(self.run_dir, mode="quick" if options["quick"] else "product")
        except DemoRunning as exc:
            raise CommandError(str(exc)) from None
        try:
            self._handle_locked(options)
        finally:
            self.lock.release(forget=options["lock_fd"] is None)  # the parent removes what it wrote

    def _handle_locked(self, options: dict) -> None:
        self.stop = threading.Event()
        self.stop_signal = 0
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        if not options["embedded_child"]:
            try:
                servers = embedded.choose(self.run_dir, force_embedded=options["embedded"])
            except embedded.EmbeddedUnavailable as exc:
                raise CommandError(str(exc)) from None
            for note in servers.notes:
                self.say(note)
            if servers.embedded and self.stop.is_set():  # interrupted while they started
                for line in servers.stop():
                    self.say(line)
                return
            if servers.embedded:
                return self._run_as_child(servers)
        self.sup = Supervisor(
            self.run_dir,
            dict(os.environ, SAGAS_LEASE_TTL=LEASE_TTL, SAGAS_SWEEP_INTERVAL="1", PYTHONUNBUFFERED="1"),
            self.say,
        )
        self.sup.reap_leftovers()
        try:
            self._setup()
            if options["quick"]:
                run_quick(self)
            elif not self.stop.is_set():
                self._product()
        finally:
            stopped = self.sup.stop_all(last=("providers", "daphne"))
            if not options["quick"]:
                self.say(f"stopped {stopped} process(es); logs in {shown(self.run_dir)}/")

    # --- plumbing ---------------------------------------------------------------

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_signal = signum
        self.stop.set()

    def _run_as_child(self, servers: embedded.Servers) -> None:
        """Run this command again pointed at the embedded servers; stop them when it ends."""
        o = self.options
        argv = [sys.executable, "manage.py", "demo", "--embedded-child", "--run-dir", str(self.run_dir),
                "--port", str(o["port"]), "--duration", str(o["duration"]), "--kill-every", str(o["kill_every"]),
                "--interval", str(o["interval"]), "--runs", str(o["runs"]), "--timeout", str(o["timeout"])]
        argv += ["--quick"] * o["quick"] + ["--no-kill"] * o["no_kill"] + ["--lock-fd", str(self.lock.fd)]
        env = dict(os.environ, DATABASE_URL=servers.database_url, REDIS_URL=servers.redis_url)
        # Same process group: a Ctrl-C in the terminal reaches it directly; SIGTERM is passed on.
        # It holds the run directory's lock too, so the lock outlasts this process if it is killed.
        child = subprocess.Popen(argv, cwd=ROOT, env=env, pass_fds=(self.lock.fd,))

        def forward(signum: int, frame: FrameType | None) -> None:
            if child.poll() is None:
                child.send_signal(signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, forward)
        try:
            code = child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            for line in servers.stop():
                self.say(line)
        if code:
            raise SystemExit(code)

    def _setup(self) -> None:
        call_command("sagas_ensuredb")
        call_command("migrate", verbosity=0)
        db = settings.DATABASES["default"]
        where = db["HOST"] or db["OPTIONS"].get("host", "local socket")
        self.say(f"database {db['NAME']} on {where}{':' + db['PORT'] if db['PORT'] else ''}, "
                 f"Redis {re.sub(r'//[^@/]*@', '//***@', settings.REDIS_URL)}: migrated")

    # --- the product demo ---------------------------------------------------------

    def _product(self) -> None:
        from demo.loadgen import LoadGenerator
        from demo.notify import demo_endpoint_configure
        from demo.providers import faults

        o = self.options
        users = self._users()
        call_command("collectstatic", interactive=False, verbosity=0)
        faults.clear()  # faults left by an earlier demo would hit at random
        self.say("starting processes (each in its own process group):")
        providers_url = self._start_providers()
        if providers_url is None:
            return
        self.sup.env["DEMO_PROVIDERS_URL"] = providers_url
        demo_endpoint_configure(providers_url=providers_url)  # notifications go to the providers' receiver
        url = self._start_console(o["port"])
        if url is None:
            return
        self.lock.publish(url=url)  # what a second demo started in this run directory is told
        self.sup.env["CONSOLE_URL"] = url  # the links in notifications
        self.workers = ("worker-1", "worker-2")
        for name in self.workers:
            forget_rq_worker(name)  # a registration left by a demo that was SIGKILLed
            self.sup.spawn(name, "manage.py", "sagas_worker", "--name", name, "--no-sweep")
        self.sup.spawn("sweeper", "manage.py", "sagas_sweep", "--loop")
        self.sup.spawn("reconciler", "manage.py", "ledger_reconcile", "--loop")
        load = LoadGenerator(interval=o["interval"], log=self.say)
        self._banner(url, users, o)
        self.say(f"Notifications (UNKNOWN effects, approvals, failures) arrive at {providers_url}/webhook/\n")
        self._loop(load, o)

    def _users(self) -> list[tuple[str, str, str]]:
        return ensure_demo_users(self.run_dir / "demo-users.txt")

    def _start_providers(self) -> str | None:
        log = self.run_dir / "providers.log"
        offset = log.stat().st_size if log.exists() else 0  # the log is appended to: skip earlier demos' lines
        child = self.sup.spawn("providers", "manage.py", "demo_providers", "--port", "0")
        deadline = time.monotonic() + 30
        while not self.stop.is_set():
            with open(log, "rb") as handle:
                handle.seek(offset)
                found = re.search(r"listening on (http://\S+)", handle.read().decode(errors="replace"))
            if found:
                # The workers are told this address once: a restart must listen on the same port.
                child.argv = ["manage.py", "demo_providers", "--port", found.group(1).rsplit(":", 1)[1]]
                return found.group(1)
            if child.popen.poll() is not None or time.monotonic() > deadline:
                raise CommandError(f"the simulated providers did not start:\n{self.sup.tail('providers')}")
            self.stop.wait(0.1)
        return None

    def _start_console(self, wanted: int) -> str | None:
        port = wanted if wanted and _port_free(wanted) else embedded.free_port()
        if wanted and port != wanted:
            self.say(f"  port {wanted} is taken: the console uses port {port}")
        child = self.sup.spawn("daphne", "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application")
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while not self.stop.is_set():
            try:
                urllib.request.urlopen(url + "login/", timeout=2).close()
                return url
            except urllib.error.HTTPError:
                return url  # it answers; what the page says is the console's business
            except OSError:
                pass
            if child.popen.poll() is not None or time.monotonic() > deadline:
                raise CommandError(f"daphne did not start serving {url}:\n{self.sup.tail('daphne')}")
            self.stop.wait(0.2)
        return None

    def _banner(self, url: str, users: list[tuple[str, str, str]], o: dict) -> None:
        from demo.loadgen import BOT_USERNAME, HUMAN_APPROVAL_CAP

        width = max(len(u) for u, _, _ in users)
        self.say(f"\nSaga Console: {url}")
        for username, role, password in users:
            self.say(f"  log in as {username:<{width}}  password {password}   ({role}: {ROLE_HINTS[role]})")
        self.say(f"  (the logins are kept in {shown(self.run_dir / 'demo-users.txt')}; auditor also opens "
                 f"the Django admin, read-only: {url}admin/)")
        kills = f"a worker is SIGKILLed every {o['kill_every']:g}s" if o["kill_every"] else "no worker kills"
        self.say(
            f"load: an order agent every {o['interval']:g}s (model steps, capture, reserve, approval, ship, email); "
            f"faults: email and capture timeouts (UNKNOWN), refused reservations (compensation); {kills}.\n"
            f"Every 3rd shipment (up to {HUMAN_APPROVAL_CAP} open at once) waits for a person; "
            f"the bot '{BOT_USERNAME}' approves the rest. "
            + ("Ctrl-C stops everything." if not o["duration"] else f"Stops after {o['duration']:g}s or at Ctrl-C.")
            + "\n"
        )

    def _loop(self, load: LoadGenerator, o: dict) -> None:
        from demo.loadgen import status

        t0 = time.monotonic()
        next_status, kills = t0 + STATUS_EVERY, 0
        next_kill = t0 + o["kill_every"] if o["kill_every"] else float("inf")
        rng = random.Random()
        while not self.stop.is_set():
            now = time.monotonic()
            if o["duration"] and now - t0 >= o["duration"]:
                self.say(f"{now - t0:6.0f}s  --duration {o['duration']:g}s reached")
                break
            # While PostgreSQL or Redis is away, tick() backs off; the outage's start and end are
            # logged once each (core.storage.OUTAGES).
            if load.tick(now):
                try:
                    if now >= next_kill:
                        self.kill_worker(rng.choice(self.workers), f"{now - t0:6.0f}s")
                        kills += 1
                        next_kill = now + o["kill_every"]
                    if now >= next_status:
                        self.say(f"{now - t0:6.0f}s  {status().line()} | orders started: {load.started}, "
                                 f"worker kills: {kills}")
                        next_status = now + STATUS_EVERY
                except Exception as exc:
                    if not is_storage_error(exc):
                        raise
                    load.outage.failed(exc, now)
            self._restart_exited(now - t0, outage=load.outage.recent(now, within=60.0))
            self.stop.wait(0.25)
        if self.stop.is_set():
            name = signal.Signals(self.stop_signal).name if self.stop_signal else "stop"
            self.say(f"\n{time.monotonic() - t0:6.0f}s  {name}: stopping every process the demo started")
        try:
            self.say(f"final: {status().line()} | orders started: {load.started}, worker kills: {kills}, "
                     f"approved by the bot: {load.bot_approvals}, faults injected: {dict(load.injected)}")
        except DatabaseError:
            pass

    def kill_worker(self, name: str, elapsed: str) -> None:
        from sagas.models import RunStatus, WorkflowRun

        held = list(WorkflowRun.objects.filter(lease_owner__startswith=name, status=RunStatus.RUNNING)
                    .values_list("business_key", flat=True)[:3])
        pid = self.sup.kill(name)
        child = self.sup.restart(name)
        note = f" while it held {', '.join(held)}" if held else ""
        self.say(f"{elapsed}  ** SIGKILL {name} (pid {pid}){note}; restarted as pid {child.popen.pid}; "
                 f"its runs resume on a worker once the {LEASE_TTL}s lease expires **")

    def _restart_exited(self, elapsed: float, *, outage: bool = False) -> None:
        """Restart the children that exited: at once the first time in a minute, then after 1, 2, 4... s.

        A child exiting more than 5 times in a minute ends the demo with its log (a bug, a
        port taken), unless PostgreSQL or Redis is away or was within the last minute
        (``outage``): then it is restarted, with that backoff, until they are back.
        """
        now = time.monotonic()
        for child in self.sup.exited():
            if child.restart_at is None:  # an exit not seen before
                child.exits[:] = [t for t in child.exits if now - t < 60] + [now]
                if len(child.exits) > 5 and not outage:
                    raise CommandError(f"{child.name} keeps exiting (status {child.popen.returncode}); "
                                       f"its log:\n{self.sup.tail(child.name)}")
                recent = min(len(child.exits), 6)
                child.restart_at = now + (0.0 if recent == 1 else 2.0 ** (recent - 2))
            if now < child.restart_at:
                continue
            new = self.sup.restart(child.name)
            self.say(f"{elapsed:6.0f}s  {child.name} exited with status {child.popen.returncode}; "
                     f"restarted as pid {new.popen.pid} (log {shown(child.log)})")
