"""Helpers for running ``manage.py demo`` as a user does: a real subprocess starting real processes,
against the tests' PostgreSQL database and Redis database (never the developer's)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.procs import ROOT, tcp_sockets, worker_env


class Demo:
    """One ``manage.py demo`` process; its output in ``<tmp>/<name>.out``; ``run_dir`` may be shared."""

    def __init__(self, tmp_path: Path, name: str = "demo", run_dir: Path | None = None) -> None:
        self.out_path = tmp_path / f"{name}.out"
        self.run_dir = run_dir or tmp_path / "run"
        self.popen: subprocess.Popen | None = None

    def start(self, *args: str, **env: str) -> subprocess.Popen:
        """Start it with ``args``; ``env`` overrides the tests' servers (``DATABASE_URL=...``)."""
        with open(self.out_path, "wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "manage.py", "demo", "--run-dir", str(self.run_dir), *args],
                cwd=ROOT, env=worker_env("", **env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        return self.popen

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def url(self) -> str | None:
        found = re.search(r"Saga Console: (http://\S+)", self.output())
        return found.group(1) if found else None

    def started(self) -> dict[str, int]:
        """The processes it says it started first, by name: ``{"daphne": pid, ...}``."""
        return {name: int(pid) for name, pid in re.findall(r"^  started (\S+)\s+pid (\d+)", self.output(), re.M)}

    def child_pids(self) -> set[int]:
        """Every process the demo said it started or restarted (each leads its own process group)."""
        out = self.output()
        return {int(pid) for pid in re.findall(r"^  started \S+\s+pid (\d+)", out, re.M)} | {
            int(pid) for pid in re.findall(r"restarted as pid (\d+)", out)}

    def kill_everything(self) -> None:
        for pgid in self.child_pids() | ({self.popen.pid} if self.popen else set()):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.popen is not None:
            self.popen.wait(timeout=10)

    def report(self) -> None:
        print(f"===== {self.out_path.name} =====\n{self.output()[-8000:]}")


def http_status(url: str) -> int:
    """The status of a GET, redirects not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pg_client_ports(pid: int, db_port: int) -> set[int]:
    """The local TCP ports of process ``pid``'s connections to PostgreSQL on port ``db_port``."""
    return {local for local, remote, _ in tcp_sockets(pid) if remote == db_port}


def providers_urls(demo: Demo) -> list[str]:
    """The addresses the demo's providers said they listen on, one line a start."""
    log = demo.run_dir / "providers.log"
    return re.findall(r"listening on (http://\S+)", log.read_text()) if log.exists() else []
