"""Reads for the versions page: definitions, their hashes, runs in flight per hash, the live
workers that run each, stranded runs, and the source diff between two versions.

Definitions, hashes, sources and workers are code, the same for every tenant, and shown to
everyone; the runs (in flight, stranded) are counted and listed within the user's tenants.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from django.db.models import Count, QuerySet

from operators.selectors.tenancy import User, scope_runs
from sagas.models import TERMINAL_STATUSES, RunStatus, WorkflowPause, WorkflowRun, WorkflowVersion
from sagas.selectors import workers_live


@dataclass
class HashRow:
    definition_hash: str
    record: WorkflowVersion | None  # None: runs use a hash no process has registered here
    in_flight: int = 0
    workers: list[str] = field(default_factory=list)


@dataclass
class VersionRow:
    version: int
    hashes: list[HashRow] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return sum(h.in_flight for h in self.hashes)


@dataclass
class WorkflowRow:
    name: str
    versions: list[VersionRow] = field(default_factory=list)
    records: list[WorkflowVersion] = field(default_factory=list)  # for the diff pickers, newest first
    pauses: list[WorkflowPause] = field(default_factory=list)  # what holds its runs (sagas.pausing)

    @property
    def version_numbers(self) -> list[int]:
        return [v.version for v in self.versions]


def versions_overview(*, user: User) -> list[WorkflowRow]:
    """Every workflow, its versions and their hashes, with runs in flight per (version, hash)
    (of ``user``'s tenants) and the live workers that run each hash. Runs on a hash with no WorkflowVersion row are
    listed too (record None), so nothing in flight is invisible."""
    in_flight: dict[tuple[str, int, str], int] = {
        (name, version, h): n
        for name, version, h, n in scope_runs(WorkflowRun.objects.all(), user).exclude(status__in=TERMINAL_STATUSES)
        .values_list("workflow_name", "version", "definition_hash")
        .annotate(n=Count("id"))
        .values_list("workflow_name", "version", "definition_hash", "n")
    }
    workers: dict[tuple[str, int, str], list[str]] = {}
    for name, definitions in workers_live().values_list("name", "definitions"):
        for d in definitions or []:
            try:
                key = (d["name"], int(d["version"]), d["hash"])
            except (KeyError, TypeError, ValueError):
                continue
            workers.setdefault(key, []).append(name)

    hashes: dict[tuple[str, int, str], HashRow] = {}
    records: dict[str, list[WorkflowVersion]] = {}
    for record in WorkflowVersion.objects.order_by("name", "-version", "-last_registered_at", "id"):
        key = (record.name, record.version, record.definition_hash)
        hashes[key] = HashRow(definition_hash=record.definition_hash, record=record)
        records.setdefault(record.name, []).append(record)
    for key in in_flight:
        hashes.setdefault(key, HashRow(definition_hash=key[2], record=None))
    for key, row in hashes.items():
        row.in_flight = in_flight.get(key, 0)
        row.workers = sorted(workers.get(key, []))

    workflows: dict[str, WorkflowRow] = {}
    for (name, version, _h), row in sorted(hashes.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        wf = workflows.setdefault(name, WorkflowRow(name=name, records=records.get(name, [])))
        if not wf.versions or wf.versions[-1].version != version:
            wf.versions.append(VersionRow(version=version))
        wf.versions[-1].hashes.append(row)
    for pause in WorkflowPause.objects.order_by("workflow_name", "version"):
        if pause.workflow_name in workflows:
            workflows[pause.workflow_name].pauses.append(pause)
    return list(workflows.values())


def _stranded(user: User) -> QuerySet[WorkflowRun]:
    return scope_runs(WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION, status_reason="version_mismatch"),
                      user)


def runs_stranded(*, user: User, limit: int = 200) -> QuerySet[WorkflowRun]:
    """Runs of ``user``'s tenants parked because no live worker has their code
    (version_mismatch), oldest first."""
    return _stranded(user).order_by("updated_at", "id")[:limit]


def runs_stranded_count(*, user: User) -> int:
    return _stranded(user).count()


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "file", "hunk", "added", "removed", "context"
    text: str


def version_diff(a: WorkflowVersion, b: WorkflowVersion, *, context: int = 3) -> list[DiffLine]:
    """Unified diff of two registered sources (a -> b), line by line with its kind. Plain text:
    the template escapes it."""
    def label(v: WorkflowVersion) -> str:
        return f"{v.name} v{v.version} {v.definition_hash[:12]}"

    lines = []
    for text in difflib.unified_diff(
        a.source.splitlines(), b.source.splitlines(), fromfile=label(a), tofile=label(b), lineterm="", n=context
    ):
        if text.startswith(("+++", "---")):
            kind = "file"
        elif text.startswith("@@"):
            kind = "hunk"
        elif text.startswith("+"):
            kind = "added"
        elif text.startswith("-"):
            kind = "removed"
        else:
            kind = "context"
        lines.append(DiffLine(kind=kind, text=text))
    return lines


def version_get(version_id: str | int | None) -> WorkflowVersion | None:
    """A registered version by its id, or None for an unknown or malformed id."""
    try:
        return WorkflowVersion.objects.filter(id=int(version_id or "")).first()
    except (TypeError, ValueError):
        return None


def versions_of(name: str) -> list[WorkflowVersion]:
    """Every registered version of a workflow, newest first (the diff page's pickers)."""
    return list(WorkflowVersion.objects.filter(name=name).order_by("-version", "-last_registered_at"))
