"""Repair a run: move it to another version of its code, redrive it from where it failed, or
re-run it from a step as a new run (a fork).

Both keep the run's id and its whole history, and edit nothing in it: each is one journal entry
(``moved``, ``redriven``) written in the transaction that changes the run, under the run's row
lock, after the checks below. The console and the HTTP API audit them (``operators.services``).

**Move** (``run_move``): the run's version and definition hash become the target's, so its next
claim replays on that code. Only if the run replays cleanly on the target code at that moment:
the replay check (``sagas.replay.check``) is run again under the lock, whatever a page showed
before. The target must be registered in this process, and a worker that has it must exist for
the run to go on. A run a worker is advancing right now is refused: pause it first
(``sagas.pausing``), and it is handed back at its next step boundary. A run parked because no
worker had its code (``version_mismatch``) or because its code diverged from its history
(``non_determinism``) goes on at once on the new code: the reason it was parked is gone.

**Redrive** (``run_redrive``): a FAILED run (its effects still in place) or one parked in
NEEDS_ATTENTION for its code (``non_determinism``, ``workflow_error``) continues from its
failing step: a step that failed is asked again (its recorded failure stays in the history but
no longer answers), then the workflow goes on. Optionally onto another version first, checked
as a move is. Its budgets are as they were (a run out of budget is retried, not redriven).
What a redrive does not undo: an effect whose outcome is final in the ledger (FAILED_FINAL)
answers the same under its key; start a new run for that.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from ledger.connectors import get_connector
from ledger.errors import ConnectorNotRegistered
from ledger.models import EffectKind, EffectRecord, EffectStatus
from sagas.errors import ActionNotAllowed, RunFinished
from sagas.events import send_run_changed
from sagas.models import (
    LEASED_STATUSES,
    CompensationPlan,
    JournalEntry,
    JournalKind,
    RunStatus,
    WorkflowRun,
    check_transition,
)
from sagas.replay.check import COMPATIBLE, check_run
from sagas.runtime import queue
from sagas.store import systemdb
from sagas.store.locks import run_lock
from sagas.store.systemdb import Entry, dumps
from sagas.validation import actor_label, required_reason
from sagas.versions import registry

MOVABLE = frozenset({RunStatus.PENDING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION, RunStatus.FAILED})
# Parked for its code: a move to code that replays its history cleanly takes the reason away.
CODE_REASONS = frozenset({"version_mismatch", "non_determinism"})
REDRIVABLE_REASONS = frozenset({"non_determinism", "workflow_error", "step_failed"})


def movable_versions(run: WorkflowRun) -> list[int]:
    """The versions of ``run``'s workflow registered in this process whose code is not the run's
    (where a move or a redrive could take it; each is still checked when it is asked for)."""
    return sorted(d.version for d in registry.all_definitions()
                  if d.name == run.workflow_name and d.definition_hash != run.definition_hash)


def _not_advanced_now(run: WorkflowRun, what: str) -> None:
    if run.status in LEASED_STATUSES and run.lease_expires_at and run.lease_expires_at > timezone.now():
        raise ActionNotAllowed(
            f"run {run.id} is being advanced by {run.lease_owner} right now; pause it first (it is handed "
            f"back at its next step boundary), then {what} it")


def _target(run: WorkflowRun, version: int) -> registry.WorkflowDefinition:
    definition = registry.find(run.workflow_name, version)
    if definition is None:
        raise ActionNotAllowed(
            f"{run.workflow_name} version {version} is not registered in this process; deploy it (SAGAS_MODULES) "
            f"here and on a worker first")
    return definition


def _checked_move(run: WorkflowRun, definition: registry.WorkflowDefinition) -> dict[str, Any]:
    """Under the run's lock: refuse unless ``run`` replays cleanly on ``definition``; the journal
    entry's payload otherwise."""
    checked = check_run(run, definition)
    if checked.outcome != COMPATIBLE:
        where = f" ({checked.source['file']}:{checked.source['line']})" if checked.source else ""
        raise ActionNotAllowed(
            f"run {run.id} does not replay on {definition.name} version {definition.version}: "
            f"{checked.message}{where}; nothing was changed")
    return {"from_version": run.version, "from_hash": run.definition_hash, "to_version": definition.version,
            "to_hash": definition.definition_hash, "checked_to_seq": checked.position}


def _move_locked(run: WorkflowRun, definition: registry.WorkflowDefinition, *, actor: str, reason: str) -> None:
    moved = _checked_move(run, definition)
    systemdb.append_event(str(run.id), kind=JournalKind.MOVED, name="", worker=actor,
                          payload=dumps({**moved, "by": actor, "reason": reason}))
    run.version, run.definition_hash = definition.version, definition.definition_hash
    WorkflowRun.objects.filter(id=run.id).update(version=run.version, definition_hash=run.definition_hash,
                                                 updated_at=timezone.now())


def run_move(*, run_id: Any, version: int, user: User | None, reason: str) -> WorkflowRun:
    """Move the run to ``version`` of its workflow, if its history replays cleanly on that code
    (checked under the run's lock). See the module's docstring. ``ActionNotAllowed`` with the
    divergence otherwise; ``RunFinished`` for a finished run (a FAILED one may be redriven)."""
    actor, reason = actor_label(user), required_reason(reason, "move a run")
    with transaction.atomic():
        run = run_lock(run_id=str(run_id))
        if run.status in LEASED_STATUSES:
            _not_advanced_now(run, "move")
            if run.status == RunStatus.COMPENSATING:
                raise ActionNotAllowed(f"run {run.id} is compensating: its workflow code is not run any more")
            if run.paused_at is None:  # its worker stopped: any worker may take it up at any moment
                raise ActionNotAllowed(f"run {run.id} is about to be taken up again; pause it, then move it")
        elif run.status not in MOVABLE:
            raise RunFinished(f"run {run.id} is {run.status}; only a run that has not finished can be moved")
        definition = _target(run, version)
        if run.definition_hash == definition.definition_hash:
            raise ActionNotAllowed(f"run {run.id} already runs {run.workflow_name} version {definition.version}'s code")
        if run.status == RunStatus.FAILED:
            raise ActionNotAllowed(f"run {run.id} FAILED: redrive it onto version {version} (it is moved, then "
                                   f"continued from where it failed)")
        _move_locked(run, definition, actor=actor, reason=reason)
        if run.status == RunStatus.NEEDS_ATTENTION and run.status_reason in CODE_REASONS:
            check_transition(run.status, RunStatus.PENDING)
            WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.PENDING, status_reason="", error=None)
            run.status = RunStatus.PENDING
        if run.status == RunStatus.PENDING and run.paused_at is None:
            queue.enqueue_after_commit(run.id, run.definition_hash, priority=run.priority)
        send_run_changed(run.id, run.status, cause=JournalKind.MOVED)
    run.refresh_from_db()
    return run


def run_redrive(*, run_id: Any, user: User | None, reason: str, version: int | None = None) -> WorkflowRun:
    """Continue a FAILED run, or one parked for its code, from its failing step, keeping its id
    and history; onto ``version`` first if given (checked as ``run_move`` checks). See the
    module's docstring."""
    actor, reason = actor_label(user), required_reason(reason, "redrive a run")
    with transaction.atomic():
        run = run_lock(run_id=str(run_id))
        parked = run.status == RunStatus.NEEDS_ATTENTION and run.status_reason in REDRIVABLE_REASONS
        if run.status != RunStatus.FAILED and not parked:
            raise ActionNotAllowed(
                f"run {run.id} is {run.status}{' (' + run.status_reason + ')' if run.status_reason else ''}; only a "
                f"FAILED run, or one parked for its code (non_determinism), can be redriven")
        if CompensationPlan.objects.filter(run=run).exists():
            raise ActionNotAllowed(f"run {run.id} has a compensation plan: its effects are being or were undone")
        was = {"status": run.status, "reason": run.status_reason}
        if version is not None:
            target = _target(run, version)  # refused if that version is not registered here
            if target.definition_hash != run.definition_hash:
                _move_locked(run, target, actor=actor, reason=reason)
        failed_step = (run.error or {}).get("step") if run.status_reason == "step_failed" else None
        retry_seqs = []
        if failed_step:
            entry = JournalEntry.objects.filter(run=run, kind=JournalKind.STEP, name=failed_step) \
                .order_by("-seq").first()
            if entry is not None and "error" in (entry.payload or {}):
                retry_seqs.append(entry.seq)
        systemdb.append_event(
            str(run.id), kind=JournalKind.REDRIVEN, name=failed_step or "", worker=actor,
            payload=dumps({"by": actor, "reason": reason, "was": was, "version": run.version,
                           "retry_seqs": retry_seqs}),
        )
        check_transition(run.status, RunStatus.PENDING)
        WorkflowRun.objects.filter(id=run.id).update(
            status=RunStatus.PENDING, status_reason="", error=None, result=None, finished_at=None,
            updated_at=timezone.now())
        if run.paused_at is None:
            queue.enqueue_after_commit(run.id, run.definition_hash, priority=run.priority)
        send_run_changed(run.id, RunStatus.PENDING, cause=JournalKind.REDRIVEN)
    run.refresh_from_db()
    return run


# --- fork: re-run from a step as a new run ----------------------------------------------------

# Entries of the source that are not copied into a fork: the source's own life, not its history.
_NOT_COPIED = frozenset({
    JournalKind.STARTED, JournalKind.CLAIMED, JournalKind.YIELDED, JournalKind.SUSPENDED, JournalKind.HALTED,
    JournalKind.RESUMED, JournalKind.OPERATOR_ACTION, JournalKind.MOVED, JournalKind.REDRIVEN, JournalKind.FAILED,
    JournalKind.COMPLETED, JournalKind.CANCELLED, JournalKind.FORKED, JournalKind.COMPENSATION_STARTED,
    JournalKind.COMPENSATION_ITEM, JournalKind.COMPENSATION_INTENT, JournalKind.COMPENSATION_RESULT,
    JournalKind.COMPENSATION_REFUSED, JournalKind.COMPENSATION_FINISHED,
})
FORKABLE_KINDS = frozenset({JournalKind.STEP, JournalKind.EFFECT_INTENT})


@dataclass
class ForkEffect:
    """One effect of the source run, and what a fork from the chosen step does with it."""

    name: str
    connector: str
    key: str
    status: str
    seq: int  # its intent's position in the source's journal
    irreversible: bool
    # "kept" (before the step: its recorded outcome), "reused" (the new run gets its outcome),
    # "undone" (compensated first, then asked again), "again" (executed again if asked), "blocks"
    fate: str
    note: str
    effect_id: int = 0


@dataclass
class ForkPlan:
    source: WorkflowRun
    at_seq: int
    at_name: str
    effects: list[ForkEffect]
    copied: int  # journal entries copied into the new run
    steps_copied: int  # of which steps and effect intents: what the new run's budget starts with
    blockers: list[str]
    compensate_first: bool = False

    @property
    def possible(self) -> bool:
        return not self.blockers

    def undo(self) -> list[dict[str, Any]]:
        """The effects the new run compensates before it runs, newest first: the ``forked``
        entry's ``undo`` (``sagas.compensation.undo_before_fork``)."""
        return [{"name": e.name, "connector": e.connector, "effect_id": e.effect_id, "key": f"{e.key}:compensate"}
                for e in sorted(self.effects, key=lambda e: -e.seq) if e.fate == "undone"]


def _undoable(connector: str) -> tuple[bool, bool | None]:
    """(irreversible, can be compensated) for a connector; None: not registered here."""
    try:
        conn = get_connector(connector)
    except ConnectorNotRegistered:
        return False, None
    return conn.irreversible, (not conn.irreversible and conn.can_compensate())


def _earlier_forks(run: WorkflowRun) -> tuple[dict[str, str], dict[str, str]]:
    """The source's keys that earlier re-runs of it reuse, and those they compensate (done or
    still to do): key -> the re-run's id."""
    reused_by: dict[str, str] = {}
    undone_by: dict[str, str] = {}
    for fork_id, payload in JournalEntry.objects.filter(
            run__in=WorkflowRun.objects.filter(forked_from=run.id).values("id"), kind=JournalKind.FORKED,
    ).values_list("run_id", "payload"):
        for key in (payload or {}).get("reuse", {}).values():
            reused_by[key] = str(fork_id)
        for item in (payload or {}).get("undo", []):
            undone_by[item["key"].removesuffix(":compensate")] = str(fork_id)
    return reused_by, undone_by


def _fate(record: EffectRecord, seq: int, at_seq: int, *, own_key: bool, undone: str | None,
          compensate_first: bool, irreversible: bool, compensable: bool | None,
          reused_by: str | None) -> tuple[str, str]:
    """What a fork from ``at_seq`` does with one effect of the source (see ``ForkEffect``).
    ``undone``: the state of its compensation, if the source's compensation or an earlier
    re-run asked for one; ``reused_by``: an earlier re-run that reuses its outcome."""
    if record.status in (EffectStatus.UNKNOWN, EffectStatus.IN_PROGRESS, EffectStatus.PENDING):
        return "blocks", ("its outcome is not recorded yet: resolve it first" if seq < at_seq
                          else "its outcome is unknown: resolve it first")
    if undone is not None and undone != EffectStatus.SUCCEEDED:
        return "blocks", f"its compensation is {undone}: resolve it first"
    if seq < at_seq:
        if undone:
            return "blocks", ("before the step, but undone since by a compensation: the new run would believe it "
                              "done; re-run from a step before it")
        return "kept", "before the step: its recorded outcome stands, it is never executed again"
    if record.status != EffectStatus.SUCCEEDED:
        return "again", f"{record.status} after the step: the new run executes it again if it asks"
    if undone:
        if not own_key:
            return "blocks", (f"undone since by a compensation, and its key ({record.idempotency_key}) is the "
                              f"workflow's own: the new run would ask for that key and be answered with the undone "
                              f"outcome")
        return "again", "undone since by a compensation: the new run executes it again under its own key if it asks"
    if not compensate_first:
        return "reused", ("done after the step: if the new run asks for it with the same payload, it gets this "
                          "outcome and nothing is executed; another payload is refused")
    if compensable is None:
        return "blocks", "its connector is not registered here, so nothing can say how to compensate it"
    if not compensable:
        why = "irreversible" if irreversible else "its connector has no compensation"
        return "reused", (f"{why}, so it cannot be compensated (as a compensation lists it): the new run reuses its "
                          f"outcome if it asks with the same payload; another payload is refused")
    if reused_by:
        return "blocks", (f"the re-run {reused_by} reuses its outcome: compensating it would undo that run's; "
                          f"re-run reusing outcomes instead")
    if not own_key:
        return "blocks", (f"its key ({record.idempotency_key}) is the workflow's own: after the compensation the new "
                          f"run would ask for that key and be answered with the undone outcome; re-run reusing "
                          f"outcomes instead")
    return "undone", ("compensated first (ledgered, newest first, before the new run goes on); the new run then "
                      "executes it again under its own key if it asks")


def fork_plan(run: WorkflowRun, at_seq: int, *, compensate_first: bool = False) -> ForkPlan:
    """What re-running ``run`` from the step at ``at_seq`` of its journal would do, effect by
    effect; ``blockers`` says why it cannot be done now (an unknown outcome anywhere, a worker
    advancing it, a position that is not a step, an effect undone since before the step).
    With ``compensate_first`` the effects the source did after the step are compensated by
    the new run before it goes on, instead of reused. Reads only."""
    entries = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "name", "payload"))
    at = next(((seq, kind, name) for seq, kind, name, _ in entries if seq == at_seq), None)
    blockers: list[str] = []
    if at is None or at[1] not in FORKABLE_KINDS:
        blockers.append(f"seq {at_seq} of run {run.id} is not a step or an effect of its history")
    if run.status in LEASED_STATUSES and run.lease_expires_at and run.lease_expires_at > timezone.now():
        blockers.append(f"a worker ({run.lease_owner}) is advancing the run right now: pause it first")
    intents = {name: seq for seq, kind, name, _ in entries if kind == JournalKind.EFFECT_INTENT}
    records = [r for r in EffectRecord.objects.filter(run_id=run.id, kind=EffectKind.EFFECT).order_by("intent_at", "id")
               if r.step_name in intents]
    undone = dict(EffectRecord.objects.filter(
        tenant=run.tenant, kind=EffectKind.COMPENSATION,
        idempotency_key__in=[f"{r.idempotency_key}:compensate" for r in records],
    ).values_list("idempotency_key", "status"))
    reused_by, undone_by = _earlier_forks(run)
    for key in undone_by:  # an earlier re-run compensates it (or is about to): as good as undone
        undone.setdefault(f"{key}:compensate", EffectStatus.SUCCEEDED)
    effects: list[ForkEffect] = []
    for record in records:
        seq = intents[record.step_name]
        irreversible, compensable = _undoable(record.connector)
        fate, note = _fate(record, seq, at_seq, own_key=record.idempotency_key == f"{run.id}:{record.step_name}",
                           undone=undone.get(f"{record.idempotency_key}:compensate"),
                           compensate_first=compensate_first, irreversible=irreversible, compensable=compensable,
                           reused_by=reused_by.get(record.idempotency_key))
        if fate == "blocks":
            blockers.append(f"effect {record.step_name!r} ({record.connector}): {note}")
        effects.append(ForkEffect(name=record.step_name, connector=record.connector, key=record.idempotency_key,
                                  status=record.status, seq=seq, irreversible=irreversible, fate=fate, note=note,
                                  effect_id=record.id))
    copied = [e for e in entries if e[0] < at_seq and e[1] not in _NOT_COPIED]
    steps = sum(1 for e in copied if e[1] in (JournalKind.STEP, JournalKind.EFFECT_INTENT))
    return ForkPlan(source=run, at_seq=at_seq, at_name=at[2] if at else "", effects=effects, copied=len(copied),
                    steps_copied=steps, blockers=blockers, compensate_first=compensate_first)


def run_fork(*, run_id: Any, at_seq: int, user: User | None, reason: str, version: int | None = None,
             forks_seen: int | None = None, compensate_first: bool = False) -> WorkflowRun:
    """Re-run a run from the step at ``at_seq`` of its journal as a new run, linked both ways:
    the new run's journal starts with a copy of the source's history before that step, and it
    executes from the step on, on the source's code or ``version`` (its copied history must
    replay on that code). Effects before the step keep their recorded outcomes; effects the
    source did after it are reused when the new run asks for them with the same payload (see
    ``fork_plan``); with ``compensate_first`` they are compensated instead, by the new run before
    it goes on (``sagas.compensation.undo_before_fork``), and asked again under its own keys.
    Refused (``ActionNotAllowed``) while an outcome is unknown, or while a worker advances the
    source. The source's status is left as it is. Returns the new run (PENDING).

    ``forks_seen``: how many re-runs of the source the person saw; if there are more now
    (someone else, or the same page submitted twice), ``ActionNotAllowed`` and nothing is made."""
    actor, reason = actor_label(user), required_reason(reason, "re-run a run from a step")
    with transaction.atomic():
        source = run_lock(run_id=str(run_id))
        if forks_seen is not None:
            made = WorkflowRun.objects.filter(forked_from=source.id).count()
            if made != forks_seen:
                raise ActionNotAllowed(
                    f"run {source.id} has been re-run from a step {made} time(s), not {forks_seen} as when you "
                    f"loaded the page; nothing was made (look at its page before making another)")
        plan = fork_plan(source, at_seq, compensate_first=compensate_first)
        if plan.blockers:
            raise ActionNotAllowed("cannot re-run from this step: " + "; ".join(plan.blockers))
        definition = _target(source, version if version is not None else source.version)
        if version is None and source.definition_hash not in definition.accepted_hashes:
            raise ActionNotAllowed(f"run {source.id}'s code ({source.definition_hash[:12]}) is not registered here; "
                                   f"choose a version")
        fork_id = uuid.uuid4()
        copied = _copied_entries(source, at_seq, fork_id)
        reuse = {e.name: e.key for e in plan.effects if e.fate == "reused"}
        probe = WorkflowRun(id=fork_id, workflow_name=source.workflow_name, version=definition.version,
                            definition_hash=definition.definition_hash, input=source.input, tenant=source.tenant,
                            status=RunStatus.PENDING, started_at=timezone.now(), created_at=timezone.now())
        checked = check_run(probe, definition, journal=[Entry(i + 2, e.kind, e.name, e.payload)
                                                        for i, e in enumerate(copied)])
        if checked.outcome != COMPATIBLE:
            raise ActionNotAllowed(f"the history before the step does not replay on {definition.name} version "
                                   f"{definition.version}: {checked.message}")
        fork = WorkflowRun.objects.create(
            id=fork_id, workflow_name=source.workflow_name, version=definition.version,
            definition_hash=definition.definition_hash, input=source.input, summary=source.summary,
            tenant=source.tenant, status=RunStatus.PENDING, last_seq=1, max_steps=source.max_steps,
            max_cost=source.max_cost, max_duration=source.max_duration, started_by=user, started_via="fork",
            forked_from=source.id, forked_at_seq=at_seq, priority=source.priority,
        )
        head = {"input": source.input, "tenant": source.tenant, "version": definition.version,
                "definition_hash": definition.definition_hash, "started_via": "fork", "forked_from": str(source.id),
                "at_seq": at_seq}
        now = timezone.now()
        rows = [JournalEntry(run=fork, seq=1, kind=JournalKind.STARTED, name="", payload=head, worker_id=actor,
                             created_at=now)]
        rows += [JournalEntry(run=fork, seq=i + 2, kind=e.kind, name=e.name, payload=e.payload, created_at=now,
                              worker_id=f"copied from {source.id}"[:200]) for i, e in enumerate(copied)]
        rows.append(JournalEntry(
            run=fork, seq=len(copied) + 2, kind=JournalKind.FORKED, name="", worker_id=actor, created_at=now,
            payload={"from": str(source.id), "at_seq": at_seq, "at": plan.at_name, "by": actor, "reason": reason,
                     "reuse": reuse, "compensate_first": compensate_first, "undo": plan.undo(),
                     "copied": len(copied), "budget": {
                         "steps_copied": plan.steps_copied, "max_steps": source.max_steps,
                         "max_cost": str(source.max_cost) if source.max_cost is not None else None}}))
        JournalEntry.objects.bulk_create(rows)
        systemdb.append_event(
            str(source.id), kind=JournalKind.OPERATOR_ACTION, name="fork", worker=actor,
            payload=dumps({"action": "fork", "by": actor, "reason": reason, "to": str(fork_id), "at_seq": at_seq,
                           "at": plan.at_name, "version": definition.version, "compensate_first": compensate_first,
                           "undo": [u["name"] for u in plan.undo()]}))
        queue.enqueue_after_commit(fork.id, fork.definition_hash, priority=fork.priority)
        send_run_changed(fork.id, RunStatus.PENDING, cause=JournalKind.FORKED)
        send_run_changed(source.id, source.status, cause=JournalKind.OPERATOR_ACTION)
    fork.refresh_from_db()
    return fork


def _copied_entries(source: WorkflowRun, at_seq: int, fork_id: uuid.UUID) -> list[Entry]:
    """The source's history before ``at_seq``, as the fork's: an effect keyed by default on the
    source (``"{source}:{name}"``) is keyed on the fork, so the fork's replay asks for the same
    key; its recorded outcome is copied with it, so the ledger is never asked."""
    prefix, copied = f"{source.id}:", []
    for seq, kind, name, payload in JournalEntry.objects.filter(run=source, seq__lt=at_seq).exclude(
            kind__in=_NOT_COPIED).order_by("seq").values_list("seq", "kind", "name", "payload"):
        if kind in (JournalKind.EFFECT_INTENT, JournalKind.EFFECT_REFUSED) and isinstance(payload, dict) \
                and str(payload.get("key", "")).startswith(prefix):
            payload = {**payload, "key": f"{fork_id}:{payload['key'][len(prefix):]}", "copied_key": payload["key"]}
        copied.append(Entry(seq, kind, name, payload))
    return copied
