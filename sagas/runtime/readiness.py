"""Whether workers are ready, readable without their logs.

Two views of the same fact:

* ``sagas_worker --ready-file PATH``: the worker writes ``PATH`` (JSON) once it is
  registered in PostgreSQL (so runs of its versions are routed to it) and about to take
  jobs, and removes it when it exits cleanly (SIGTERM, ``--burst`` drained, an error).
  The file is written whole (a temporary file renamed over it), so a reader never sees
  half of it. A worker killed with SIGKILL cannot remove it: a supervisor that needs
  more than "it started once" checks that ``pid`` is alive, or reads ``workers_status()``.
* ``workers_status()`` (``sagas.workers()``): the worker registry in PostgreSQL, with
  each worker's versions and whether it beat recently (``live``).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sagas.versions.registry import WorkflowDefinition


def ready_file_write(
    path: str | os.PathLike[str],
    *,
    name: str,
    started_at: datetime,
    definitions: Iterable[WorkflowDefinition],
    concurrency: int = 1,
) -> dict[str, Any]:
    """Write the ready file atomically and return what was written:
    ``{name, pid, hostname, concurrency, versions: [{name, version, hash}], started_at}``."""
    target = Path(path)
    content = {
        "name": name,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "concurrency": concurrency,
        "versions": [{"name": d.name, "version": d.version, "hash": d.definition_hash} for d in definitions],
        "started_at": started_at.isoformat(),
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(content, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return content


def ready_file_remove(path: str | os.PathLike[str]) -> None:
    """Remove the ready file if it is still this process's (another worker may have taken
    the path over since); a missing file is not an error."""
    target = Path(path)
    try:
        owner = json.loads(target.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return
    if owner == os.getpid():
        target.unlink(missing_ok=True)


@dataclass(frozen=True)
class WorkerStatus:
    """One worker as the registry knows it. ``live``: it beat within the liveness window
    (``sagas.selectors.worker_liveness``) and did not stop; only live workers receive runs."""

    name: str
    hostname: str
    pid: int
    versions: list[dict[str, Any]]
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    live: bool


def workers_status(*, include_stopped: bool = False) -> list[WorkerStatus]:
    """Workers in the registry, by name: the live ones, and with ``include_stopped`` also
    those that stopped or stopped beating (a SIGKILLed worker stays there until it is
    restarted under the same name)."""
    from django.utils import timezone

    from sagas.models import WorkerProcess
    from sagas.selectors import worker_liveness

    cutoff = timezone.now() - worker_liveness()
    statuses = []
    for row in WorkerProcess.objects.order_by("name"):
        live = row.stopped_at is None and row.last_seen_at >= cutoff
        if live or include_stopped:
            statuses.append(WorkerStatus(
                name=row.name, hostname=row.hostname, pid=row.pid, versions=list(row.definitions),
                started_at=row.started_at, last_seen_at=row.last_seen_at, stopped_at=row.stopped_at, live=live,
            ))
    return statuses
