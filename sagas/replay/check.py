"""The replay check: would this code resume these runs?

Each run's recorded journal is replayed against a workflow definition (a registered version,
or code not deployed yet, loaded from a module) in a sandbox that executes nothing and writes
nothing: a step, an effect, a wait or a recorded value returns what the journal holds, and the
first call the journal has no answer for ends the replay, "compatible so far". Each replay
runs in a READ ONLY transaction that is rolled back, so not even workflow code that reaches
for the database behind the engine's back can change anything.

A run is:

* ``compatible``: the code replays to the run's current position (and returns there, waits,
  or asks for the next call); moving the run to this code is safe as far as its history goes;
* ``diverges``: the code asks for something else than the journal holds at some position: the
  position (seq), what the journal holds, what the code asked for, and the source line;
* ``error``: the code raised while replaying (what, and where).

Used by ``manage.py sagas_replay_check``, the public ``sagas.replay_check`` and the console's
versions page; moving a run to another version re-checks it under the run's lock.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import linecache
import sys
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection, transaction

from ledger.journal import COMPENSATION_KINDS, EFFECT_KINDS
from sagas.errors import (
    ApprovalRejected,
    ContinueAsNew,
    InvalidArgument,
    NonDeterminismError,
    RunHalted,
    Suspend,
    WorkflowNotRegistered,
)
from sagas.models import TERMINAL_STATUSES, RunStatus, WorkflowRun
from sagas.replay.context import Context
from sagas.store import systemdb
from sagas.store.systemdb import ClaimedRun, Entry
from sagas.versions import registry

COMPATIBLE, DIVERGES, ERROR = "compatible", "diverges", "error"
IN_FLIGHT = sorted({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION})
FINISHED_SAMPLE = (RunStatus.FAILED, RunStatus.COMPLETED, RunStatus.COMPENSATED, RunStatus.CANCELLED)
_OUTCOME_KINDS = frozenset({EFFECT_KINDS.result, COMPENSATION_KINDS.result})


class _JournalEnds(BaseException):
    """The code asked for something the journal has no answer for: the replay is over."""


@dataclass
class RunCheck:
    run_id: str
    status: str
    outcome: str  # COMPATIBLE, DIVERGES or ERROR
    position: int | None = None  # the journal's seq where it diverged (or the last one replayed)
    journal: dict[str, Any] | None = None  # what the journal holds there
    code_asked: dict[str, Any] | None = None  # what the code asked for there
    source: dict[str, Any] | None = None  # {"file", "line", "text"} in the workflow's code
    message: str = ""
    ended: str = ""  # how a compatible replay ended: "journal end", "returned", "waits", "raised ..."


@dataclass
class CheckReport:
    workflow: str
    version: int
    definition_hash: str
    module: str
    runs: list[RunCheck] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def counts(self) -> dict[str, int]:
        counted = {COMPATIBLE: 0, DIVERGES: 0, ERROR: 0}
        for run in self.runs:
            counted[run.outcome] += 1
        return counted

    @property
    def ok(self) -> bool:
        return not any(run.outcome != COMPATIBLE for run in self.runs)

    def as_dict(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "version": self.version, "definition_hash": self.definition_hash,
                "module": self.module, "counts": self.counts, "seconds": round(self.seconds, 3),
                "runs": [asdict(run) for run in self.runs]}


class _CheckContext(Context):
    """A ``Context`` that only replays: every way to act for real ends the replay instead."""

    def before_live(self) -> None:
        raise _JournalEnds

    def before_retry(self) -> None:
        raise _JournalEnds

    def append(self, kind: str, name: str, payload: str, *, steps: int = 0, cost: float = 0.0,
               spend: dict[str, float] | None = None) -> int:
        raise _JournalEnds

    def check_spend(self, connector: str) -> None:
        raise _JournalEnds  # past the journal: a call would go out for real here

    def check_fence(self) -> None:
        raise _JournalEnds

    def crash_point(self, point: str, name: str) -> None:
        return None

    def recorded_event(self, kind: str, name: str) -> Entry | None:
        entry = super().recorded_event(kind, name)
        if entry is None and kind in _OUTCOME_KINDS:
            raise _JournalEnds  # an effect with an intent and no outcome: recovery's, not a replay's
        return entry


def _claimed(run: WorkflowRun) -> ClaimedRun:
    return ClaimedRun(
        id=str(run.id), workflow_name=run.workflow_name, version=run.version, definition_hash=run.definition_hash,
        input=run.input, tenant=run.tenant, business_key=run.business_key, fence=run.fence, attempts=run.attempts,
        steps_used=run.steps_used, cost_used=run.cost_used, max_steps=run.max_steps, max_cost=run.max_cost,
        max_duration_seconds=run.max_duration.total_seconds() if run.max_duration else None,
        started_at=run.started_at or run.created_at, status=run.status, last_seq=run.last_seq,
    )


def _source_line(exc: BaseException, definition: registry.WorkflowDefinition) -> dict[str, Any] | None:
    """The innermost frame of ``exc``'s traceback in the workflow's own file."""
    filename = definition.fn.__code__.co_filename
    found = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == filename:
            found = line
    if found is None:
        return None
    return {"file": filename, "line": found, "text": linecache.getline(filename, found).strip()}


@contextmanager
def _sandbox() -> Iterator[None]:
    """A READ ONLY transaction, rolled back at the end whatever happened in it."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
        try:
            yield
        finally:
            transaction.set_rollback(True)


def check_run(run: WorkflowRun, definition: registry.WorkflowDefinition,
              journal: list[Entry] | None = None, *, sandboxed: bool = False) -> RunCheck:
    """Replay ``run``'s journal (loaded here unless given) against ``definition``; nothing is
    executed or written. ``sandboxed``: the caller holds the read-only transaction (a batch)."""
    entries = systemdb.load_journal(str(run.id)) if journal is None else journal
    ctx = _CheckContext(run=_claimed(run), journal=entries, worker_id="replay-check",
                        approve_irreversible=definition.approve_irreversible)
    result = RunCheck(run_id=str(run.id), status=run.status, outcome=COMPATIBLE)
    try:
        if sandboxed:
            definition.fn(ctx, run.input)
            ctx.check_finished()
        else:
            with _sandbox():
                definition.fn(ctx, run.input)
                ctx.check_finished()
        result.ended = "returned"
    except _JournalEnds:
        result.ended = "journal end"
    except (Suspend, ContinueAsNew):
        result.ended = "waits"
    except NonDeterminismError as exc:
        result.outcome = DIVERGES
        result.journal = exc.details.get("journal")
        result.code_asked = exc.details.get("code_asked")
        result.position = (result.journal or {}).get("seq")
        result.source = _source_line(exc, definition)
        result.message = str(exc)
    except (RunHalted, ApprovalRejected) as exc:  # as recorded: an escalation, a budget, a rejection
        result.ended = f"raised {type(exc).__name__}"
    except DatabaseError:
        raise  # the transaction is aborted: not the code's answer (replay_check checks the run again alone)
    except Exception as exc:  # noqa: BLE001 -- the workflow's code raised: reported, not raised
        if ctx.replaying:
            result.outcome = ERROR
            result.message = f"{type(exc).__name__}: {exc}"
            result.source = _source_line(exc, definition)
        else:  # raised past the journal's end, as the recorded run did (a failed run): its history replays
            result.ended = f"raised {type(exc).__name__}"
    if result.position is None and entries:
        result.position = entries[-1].seq
    return result


def runs_to_check(name: str, *, version: int | None = None, sample: int = 100,
                  run_ids: Iterable[Any] | None = None) -> list[WorkflowRun]:
    """The runs a check looks at: every run in flight of ``name`` (``version``: only its runs),
    plus the ``sample`` most recently finished ones; or exactly ``run_ids``."""
    runs = WorkflowRun.objects.filter(workflow_name=name)
    if run_ids is not None:
        return list(runs.filter(id__in=list(run_ids)).order_by("created_at"))
    if version is not None:
        runs = runs.filter(version=version)
    in_flight = list(runs.exclude(status__in=TERMINAL_STATUSES).order_by("created_at"))
    finished = list(runs.filter(status__in=FINISHED_SAMPLE).order_by("-finished_at")[:max(0, sample)])
    return in_flight + finished


BATCH = 200  # runs whose journals are read in one query and replayed in one read-only transaction


def _journals(run_ids: list[str]) -> dict[str, list[Entry]]:
    with connection.cursor() as cur:
        cur.execute("SELECT run_id, seq, kind, name, payload FROM sagas_journalentry WHERE run_id = ANY(%s::uuid[]) "
                    "ORDER BY run_id, seq", [run_ids])
        rows = cur.fetchall()
    found: dict[str, list[Entry]] = {run_id: [] for run_id in run_ids}
    for run_id, seq, kind, name, payload in rows:
        found[str(run_id)].append(Entry(seq, kind, name, json.loads(payload) if isinstance(payload, str) else payload))
    return found


def replay_check(definition: registry.WorkflowDefinition, runs: Iterable[WorkflowRun]) -> CheckReport:
    """Check each of ``runs`` against ``definition``: in batches, each batch's journals read in
    one query and replayed in one read-only transaction that is rolled back. A run whose code
    made a query fail (which aborts the transaction) is checked again on its own, and the batch
    goes on in a new transaction."""
    report = CheckReport(workflow=definition.name, version=definition.version,
                         definition_hash=definition.definition_hash, module=definition.module)
    began = time.monotonic()
    pending = list(runs)
    while pending:
        batch, pending = pending[:BATCH], pending[BATCH:]
        journals = _journals([str(run.id) for run in batch])
        done = 0
        try:
            with _sandbox():
                for run in batch:
                    report.runs.append(check_run(run, definition, journals[str(run.id)], sandboxed=True))
                    done += 1
        except DatabaseError:
            failing = batch[done]
            try:
                report.runs.append(check_run(failing, definition, journals[str(failing.id)]))
            except DatabaseError as exc:
                report.runs.append(RunCheck(run_id=str(failing.id), status=failing.status, outcome=ERROR,
                                            message=f"the code made a query fail while replaying: {exc}"))
            pending = batch[done + 1:] + pending
    report.seconds = time.monotonic() - began
    return report


def definition_for(name: str, version: int | None = None, *, module: str | None = None) -> registry.WorkflowDefinition:
    """The code to check against: ``module`` (a dotted name or a ``.py`` path, loaded apart from
    the registry, so code not deployed yet can be checked next to the running one) or the
    registered definitions; ``version`` None: the newest there. ``WorkflowNotRegistered`` /
    ``InvalidArgument`` when there is no such code."""
    if module is None:
        return registry.get(name, version)
    with _loaded_apart(module) as found:
        candidates = [d for d in found if d.name == name and (version is None or d.version == version)]
    if not candidates:
        which = f"{name!r}" + (f" version {version}" if version is not None else "")
        raise WorkflowNotRegistered(f"{module} defines no workflow {which}")
    return max(candidates, key=lambda d: d.version)


@contextmanager
def _loaded_apart(module: str) -> Iterator[list[registry.WorkflowDefinition]]:
    """Import ``module`` under a throwaway name with an empty registry; yield what it defines."""
    path = Path(module)
    if module.endswith(".py") or path.exists():
        if not path.is_file():
            raise InvalidArgument(f"no such file: {module}")
        location = path
    else:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise InvalidArgument(f"no such module: {module}")
        location = Path(spec.origin)
    name = f"_sagas_replay_check_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, location)
    if spec is None or spec.loader is None:
        raise InvalidArgument(f"cannot load {module}")
    loaded = importlib.util.module_from_spec(spec)
    with registry.apart() as found:
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        finally:
            sys.modules.pop(name, None)
    yield [dataclasses.replace(d, module=module) for d in found]
