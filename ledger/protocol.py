"""The effect protocol: intent, dispatch, settle, recover.

Written against a ``ledger.journal.Journal`` (the caller's history: a workflow run's, in
the engine), so it can be read, tested and reused without a workflow.

Order is always check, then run, then record:

1. No record for (tenant, key): record the intent with the journal's
   ``effect_intent`` in one commit, then dispatch with the key. Success ->
   SUCCEEDED with the ``effect_result`` journal entry in one commit. ``Final`` ->
   FAILED_FINAL (never retried). ``Retryable`` -> retried with back-off within the
   connector's attempts and deadline. ``Timeout`` or any other error after
   dispatch -> UNKNOWN, and ``OutcomeUnknown`` is raised (the engine halts the run:
   NEEDS_ATTENTION, ``effect_unknown``).
2. A record without an outcome (IN_PROGRESS or UNKNOWN, found on recovery) is
   never called blindly: ``lookup`` if the connector has it; a retry with the
   same key if it is ``idempotent``; otherwise UNKNOWN, for a person.
3. A SUCCEEDED record returns its recorded result; the connector is not called.

The same key with a different payload hash is refused (``KeyConflict``), the
refusal is journaled, and nothing is executed.

Commits per effect: 2 (intent, outcome) for connectors with lookup or
idempotency. Connectors with neither pay a third commit, PENDING -> IN_PROGRESS
right before the call, because for them only that mark tells "never
dispatched" (safe to send) from "maybe dispatched" (UNKNOWN) after a crash.
An outcome the provider gave is retried into the database while the journal's
owner holds it (``Journal.durably``): it exists only in memory until it commits.

Guarantee: for a given tenant and key, a connector with lookup or idempotency
executes the business action at most once, given the downstream honours its
contract; for one with neither, at most once unless a person resolves an
UNKNOWN as "not executed" when it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.connectors import Operation, get_connector
from ledger.errors import (
    EffectFailed,
    Final,
    KeyConflict,
    LedgerError,
    OutcomeUnknown,
    PayloadNotJSON,
    ReplayDiverged,
    Retryable,
    Throttled,
)
from ledger.flow import gate, spend
from ledger.flow.gate import Hold
from ledger.journal import EFFECT_KINDS, KINDS, FenceLost, Journal
from ledger.keyindex import archived_effect
from ledger.models import EffectRecord, EffectStatus
from ledger.outcomes import NotExecuted, Succeeded, Unknown
from ledger.reconcile import BASE_SECONDS, lookup
from ledger.services import canonical_json, effect_resolve, effect_transition, payload_hash

# Kinds that may take a forward effect's position in the journal besides its intent.
_AT_INTENT = frozenset({EFFECT_KINDS.refused})


def journal_json(value: Any) -> str:
    """A journal entry's JSON text: compact, as the journal stores every payload."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def run_effect(journal: Journal, *, name: str, connector_name: str, payload: dict, key: str | None = None) -> Any:
    """Run a forward effect at the journal's next position; return its result (JSON).

    ``name`` is made unique in the journal (``name#2`` on its second use); ``key`` defaults
    to ``journal.effect_key(name)`` (``"{run_id}:{name}"``). Raises ``EffectFailed`` (FAILED_FINAL, on replay too),
    ``KeyConflict`` (key reused with another payload; journaled), ``OutcomeUnknown``,
    ``ReplayDiverged`` (replay asks for another key or payload) or ``PayloadNotJSON``.
    """
    op = Operation(get_connector(connector_name), "effect")
    name = journal.unique_name(name)
    try:
        payload = json.loads(canonical_json(payload))
    except (TypeError, ValueError) as exc:
        raise PayloadNotJSON(f"effect {name!r}: payload is not JSON: {exc}") from None
    digest = payload_hash(payload)
    key = key or journal.effect_key(name)

    entry = journal.replay_next(EFFECT_KINDS.intent, name, also=_AT_INTENT)
    if entry is not None:
        if entry.kind == EFFECT_KINDS.refused:
            raise KeyConflict(entry.payload["message"])
        if entry.payload["key"] != key or entry.payload["payload_hash"] != digest:
            raise ReplayDiverged(
                f"effect {name!r} was recorded with key {entry.payload['key']!r} and payload "
                f"{entry.payload['payload_hash'][:12]}, but the code now asks for key {key!r} "
                f"and payload {digest[:12]}",
                recorded={"seq": entry.seq, "kind": entry.kind, "name": name, "key": entry.payload["key"]},
                asked={"kind": "effect", "name": name, "key": key},
            )
        recorded = journal.recorded_event(EFFECT_KINDS.result, name)
        if recorded is not None:
            return _recorded_outcome(recorded.payload, key)
        return _recover(journal, op, name, _existing(journal.tenant, key), payload)

    journal.before_live()
    journal.crash_point("before_intent", name)
    try:
        effect, created, refusal = _record_intent(journal, op, name, connector_name, key, payload, digest)
    except IntegrityError:  # another run inserted the same key at the same moment: read theirs
        effect, created, refusal = _record_intent(journal, op, name, connector_name, key, payload, digest)
    if refusal is not None:
        raise KeyConflict(refusal)
    if created:
        return _dispatch(journal, op, name, effect, payload, premarked=effect.status == EffectStatus.IN_PROGRESS)
    return _recover(journal, op, name, effect, payload)


def _flow_payload(op: Operation, payload: Any) -> Any:
    """The payload a flow-control key is read from: a compensation's is its effect's."""
    return payload.get("payload") if op.kind == "compensation" and isinstance(payload, dict) else payload


def run_operation(
    journal: Journal, op: Operation, *, name: str, key: str, payload: dict, connector_name: str
) -> EffectRecord:
    """Run one ledgered call that is not a position in the journal (a compensation): the
    same intent/dispatch/recovery rules, with event journal kinds (``KINDS[op.kind]``).
    Returns the SUCCEEDED record; raises ``EffectFailed``, ``OutcomeUnknown`` or ``KeyConflict``."""
    payload = json.loads(canonical_json(payload))
    digest = payload_hash(payload)
    effect = EffectRecord.objects.filter(tenant=journal.tenant, idempotency_key=key).first()
    if effect is None:
        effect = archived_effect(tenant=journal.tenant, key=key)
    if effect is None:
        try:
            effect, created, refusal = _record_intent(journal, op, name, connector_name, key, payload, digest)
        except IntegrityError:
            effect, created, refusal = _record_intent(journal, op, name, connector_name, key, payload, digest)
        if refusal is not None:
            raise KeyConflict(refusal)
        if created:
            _dispatch(journal, op, name, effect, payload, premarked=effect.status == EffectStatus.IN_PROGRESS)
        else:
            _recover(journal, op, name, effect, payload)
    elif effect.payload_hash != digest:
        raise KeyConflict(f"key {key!r} is already used with a different payload; nothing was executed")
    elif effect.status != EffectStatus.SUCCEEDED:
        _recover(journal, op, name, effect, payload)
    return EffectRecord.objects.get(id=effect.id) if effect.pk is not None else effect


def _existing(tenant: str, key: str) -> EffectRecord:
    """The record of a key whose intent is journaled: live, or (its run archived since) from
    the key index as an unsaved settled record."""
    effect = EffectRecord.objects.filter(tenant=tenant, idempotency_key=key).first()
    if effect is None:
        effect = archived_effect(tenant=tenant, key=key)
    if effect is None:
        raise EffectRecord.DoesNotExist(f"no effect record and no archived key for {key!r}")
    return effect


def _record_intent(
    journal: Journal, op: Operation, name: str, connector_name: str, key: str, payload: Any, digest: str
) -> tuple[EffectRecord, bool, str | None]:
    """Commit 1: the journal's effect_intent and the ledger's record, together.

    For connectors that do not need a separate dispatch mark the record is
    created IN_PROGRESS right away: recovery treats both alike for them.

    A key not in the ledger is looked up in the key index of archived effects
    (``ledger.keyindex``): found, it counts as an existing settled record (returned unsaved,
    not created), so an archived key is never executed again.
    """
    kinds = KINDS[op.kind]
    with transaction.atomic():
        effect = EffectRecord.objects.select_for_update().filter(tenant=journal.tenant, idempotency_key=key).first()
        if effect is None:
            effect = archived_effect(tenant=journal.tenant, key=key)
        if effect is not None and effect.payload_hash != digest:
            message = (
                f"idempotency key {key!r} was already used by run {effect.run_id} (step {effect.step_name!r}) "
                f"with a different payload ({effect.payload_hash[:12]}, now {digest[:12]}); nothing was executed"
            )
            journal.append(
                kinds.refused, name,
                journal_json(
                    {"key": key, "message": message, "payload_hash": digest, "existing_hash": effect.payload_hash}
                ),
            )
            return effect, False, message
        journal.append(
            kinds.intent, name,
            journal_json(
                {"connector": connector_name, "key": key, "payload_hash": digest, "reused": effect is not None}
            ),
            steps=1 if op.kind == "effect" else 0,
        )
        if effect is not None:
            return effect, False, None
        now = timezone.now()
        effect = EffectRecord(
            tenant=journal.tenant, idempotency_key=key, run_id=journal.run_id, step_name=name, kind=op.kind,
            connector=connector_name, request_payload=payload, payload_hash=digest, intent_at=now,
            flow_key=gate.flow_key_of(gate.key_field_of(connector_name), tenant=journal.tenant,
                                      payload=_flow_payload(op, payload)),
        )
        # Connectors that need no separate dispatch mark are marked sent in this commit, when
        # flow control lets the call go now (``ledger.flow.gate``); otherwise PENDING, as ever.
        decision = gate.admit(effect, deadline_seconds=op.deadline_seconds, new=True) \
            if not op.needs_dispatch_mark else None
        mark_now = decision is not None and decision.go
        effect.status = EffectStatus.IN_PROGRESS if mark_now else EffectStatus.PENDING
        effect.attempts, effect.dispatched_at = (1, now) if mark_now else (0, None)
        effect.save(force_insert=True)  # held: PENDING, and the dispatch mark asks the gate again
        journal.intent_recorded(effect)
    return effect, True, None


def _dispatch(
    journal: Journal, op: Operation, name: str, effect: EffectRecord, payload: Any, *, premarked: bool = False
) -> Any:
    """Call the connector with the effect's key, retrying ``Retryable`` within policy.

    ``premarked``: the intent commit already recorded this dispatch (IN_PROGRESS).
    """
    key = effect.idempotency_key
    started = time.monotonic()
    delay = op.backoff_seconds
    while True:
        journal.crash_point("after_intent", name)
        if not premarked:
            _mark_dispatched(journal, op, effect)
        premarked = False
        try:
            result = op.execute(payload, key)
        except Retryable as exc:
            throttled = isinstance(exc, Throttled)
            wait = max(delay, exc.retry_after or 0.0) if isinstance(exc, Throttled) else delay
            used = effect.attempts - effect.throttled - throttled  # a 429 uses up no attempt
            if used >= op.max_attempts or time.monotonic() - started + wait > op.deadline_seconds:
                with transaction.atomic():
                    gate.record_failure(effect)
                return _settle_failed(journal, name, effect, exc, note=f"gave up after {effect.attempts} attempt(s)")
            with transaction.atomic():
                effect_transition(effect, EffectStatus.PENDING, error=exc, throttled=throttled)
                gate.record_failure(effect)  # may open the circuit: the next attempt then waits, unsent
            time.sleep(wait)
            delay = min(delay * op.backoff_factor, op.backoff_max_seconds)
            journal.before_retry()  # may stop here: PENDING again, the next owner retries it safely
            continue
        except Final as exc:
            return _settle_failed(journal, name, effect, exc)
        except Exception as exc:  # Timeout, a dropped connection, a bug after sending: nobody knows
            _settle_unknown(journal, op, name, effect, exc, failure=True)
        journal.crash_point("after_dispatch", name)
        return _settle_succeeded(journal, op, name, effect, result, op.downstream_ref(result))


def _mark_dispatched(journal: Journal, op: Operation, effect: EffectRecord) -> None:
    """PENDING/UNKNOWN/IN_PROGRESS -> IN_PROGRESS (attempt +1) under the run's fence, once flow
    control lets the call go (``ledger.flow.gate``). A call it holds back stays as it is (never
    sent) with a ticket in the queue, and the caller stops: ``journal.hold`` does not return.
    A short wait for a token is spent here, in the thread."""
    while True:
        hold: Hold | None = None
        with transaction.atomic():
            journal.check_fence()
            decision = gate.admit(effect, deadline_seconds=op.deadline_seconds)
            if decision.go:
                effect_transition(effect, EffectStatus.IN_PROGRESS, dispatched=True)
                return
            if decision.retry_in is None:
                hold = gate.hold(effect, decision.reason)
        if hold is not None:
            journal.hold(hold)
            raise AssertionError("Journal.hold returned")  # its contract: it stops the caller
        time.sleep(min(decision.retry_in or 0.0, gate.IN_THREAD_SECONDS))


def _recover(journal: Journal, op: Operation, name: str, effect: EffectRecord, payload: Any) -> Any:
    """A record exists: use what it says, never call blindly (state 2 and 3 of the ledger)."""
    status = effect.status
    if status == EffectStatus.SUCCEEDED:
        return _settle_succeeded(journal, op, name, effect, effect.result, effect.downstream_ref, already=True)
    if status == EffectStatus.FAILED_FINAL:
        _journal_result(journal, name, effect)
        return _recorded_outcome(result_payload(effect), effect.idempotency_key)
    if status == EffectStatus.PENDING:
        return _dispatch(journal, op, name, effect, payload)
    # IN_PROGRESS or UNKNOWN: the call may have happened.
    if op.can_lookup:
        outcome = lookup(effect)
        if isinstance(outcome, Succeeded):
            return _settle_succeeded(
                journal, op, name, effect, outcome.result, outcome.downstream_ref, resolution="lookup"
            )
        if isinstance(outcome, NotExecuted):
            return _dispatch(journal, op, name, effect, payload)
        reason = outcome.reason if isinstance(outcome, Unknown) else type(outcome).__name__.lower()
        _settle_unknown(journal, op, name, effect, RuntimeError(f"lookup was inconclusive: {reason}"))
    if op.idempotent:
        return _dispatch(journal, op, name, effect, payload)
    _settle_unknown(
        journal, op, name, effect,
        RuntimeError("the call may have reached the provider, which offers neither a status lookup nor idempotency"),
    )


def result_payload(effect: EffectRecord) -> dict[str, Any]:
    """The payload of a settled effect's result entry in the journal (``KINDS[kind].result``)."""
    if effect.status == EffectStatus.SUCCEEDED:
        return {"status": "SUCCEEDED", "result": effect.result, "downstream_ref": effect.downstream_ref}
    return {"status": "FAILED_FINAL", "error_class": effect.error_class, "message": effect.error_message}


def _journal_result(journal: Journal, name: str, effect: EffectRecord, *, cost: float = 0.0) -> None:
    """The outcome's journal entry; a call's ``cost`` goes in its payload, where the run's
    budget counts it (as a step's)."""
    payload = result_payload(effect)
    if cost:
        payload["cost"] = cost
    journal.append(KINDS[effect.kind].result, name, journal_json(payload), cost=cost)


def _settle(journal: Journal, name: str, effect: EffectRecord, write: Callable[[EffectRecord], None]) -> EffectRecord:
    """Commit an outcome: ``write(record)`` in one transaction with its journal entry.

    The outcome came from the provider and exists only in this worker's memory until
    it commits, so a database that went away does not lose it: the commit is retried
    with back-off while the journal's owner holds it (``Journal.durably``), each time on a fresh
    copy of the record, and not at all once the lost commit turns out to have gone
    through. Returns the record as committed.
    """
    state: dict[str, Any] = {"record": effect, "tries": 0}

    def attempt() -> EffectRecord:
        if state["tries"] and effect.pk is not None:  # a failed attempt may have changed the copy in memory
            state["record"] = EffectRecord.objects.get(id=effect.id)
        state["tries"] += 1
        record = state["record"]
        with transaction.atomic():
            write(record)
        return record

    return journal.durably(
        attempt, kind=KINDS[effect.kind].result, name=name,
        recorded=lambda _seq: EffectRecord.objects.get(id=effect.id) if effect.pk is not None else effect,
    )


def _settle_succeeded(
    journal: Journal, op: Operation, name: str, effect: EffectRecord, result: Any, ref: str,
    *, already: bool = False, resolution: str = "",
) -> Any:
    """Commit 2: SUCCEEDED in the ledger and effect_result in the journal, together.

    If the run's fence moved on, the ledger still records what the provider said
    (it is evidence, whoever holds the run) and ``FenceLost`` goes on to the caller.
    """

    def write(record: EffectRecord) -> None:
        cost = 0.0
        if not already and record.status != EffectStatus.SUCCEEDED:
            effect_transition(record, EffectStatus.SUCCEEDED, result=result, downstream_ref=ref)
            gate.record_success(record)
            if resolution:
                record.resolution, record.resolved_by_label, record.resolved_at = resolution, "engine", timezone.now()
                record.save(update_fields=["resolution", "resolved_by_label", "resolved_at"])
            cost = op.cost(record.request_payload, result)  # charged here once: with the outcome's commit
            spend.charge(tenant=record.tenant, connector=record.connector, amount=cost)
        journal.crash_point("after_outcome", name)
        _journal_result(journal, name, record, cost=cost)

    try:
        _settle(journal, name, effect, write)
    except FenceLost:
        if not already:
            _record_late_success(effect, result, ref)
        raise
    return json.loads(journal_json(result))


LATE_ANSWER = "late_answer"  # EffectRecord.resolution of an outcome a worker learnt after losing its run


def _record_late_success(effect: EffectRecord, result: Any, ref: str) -> None:
    """The provider answered after this worker lost the run: its lease expired (a process frozen
    past it, a stalled container) and another worker took the run over, which may already have
    found the effect UNKNOWN and parked the run for a person. The answer is still the truth about
    the effect. It is recorded as a resolution (``ledger.services.effect_resolve``), so the run's
    owner journals it and a run parked only for this effect resumes at once. While another
    worker holds the run, only the ledger record is written: that worker's recovery reads it.
    """
    try:
        effect_resolve(
            effect_id=effect.id, outcome="succeeded", user=None, actor="a worker whose lease had expired",
            note="the provider's answer reached a worker after it had lost the run", downstream_ref=ref,
            result=json.loads(journal_json(result)), resolution=LATE_ANSWER,
        )
        return
    except LedgerError:
        pass  # already settled by someone else, or a worker holds the run right now
    with transaction.atomic():
        fresh = EffectRecord.objects.select_for_update().get(id=effect.id)
        if fresh.status in (EffectStatus.IN_PROGRESS, EffectStatus.UNKNOWN):
            effect_transition(fresh, EffectStatus.SUCCEEDED, result=result, downstream_ref=ref)


def _settle_failed(journal: Journal, name: str, effect: EffectRecord, exc: BaseException, note: str = "") -> Any:
    def write(record: EffectRecord) -> None:
        if record.status != EffectStatus.FAILED_FINAL:
            effect_transition(record, EffectStatus.FAILED_FINAL, error=exc)
            if note:
                record.error_message = f"{record.error_message} ({note})"
                record.save(update_fields=["error_message"])
        _journal_result(journal, name, record)

    record = _settle(journal, name, effect, write)
    return _recorded_outcome(result_payload(record), record.idempotency_key)


def _settle_unknown(
    journal: Journal, op: Operation, name: str, effect: EffectRecord, exc: BaseException, *, failure: bool = False
) -> None:
    """Record UNKNOWN (never "failed") and raise ``OutcomeUnknown``: reconciliation or a
    person decides (the engine halts the run for them).

    If the database is unreachable the record stays IN_PROGRESS, which recovery
    treats the same way (lookup, same-key retry, else UNKNOWN). ``failure``: the call just went
    unanswered (not a recovery's verdict), which the circuit breaker counts."""
    with transaction.atomic():
        effect_transition(
            effect, EffectStatus.UNKNOWN, error=exc, next_check_in=BASE_SECONDS if op.can_lookup else None
        )
        if failure:  # a call that got no answer counts towards the circuit breaker
            gate.record_failure(effect)
    raise OutcomeUnknown(
        f"effect {name!r} ({effect.connector}, key {effect.idempotency_key}) has an unknown outcome: "
        f"{type(exc).__name__}: {exc}",
        effect_id=effect.id,
        key=effect.idempotency_key,
        connector=effect.connector,
        step=name,
        error_class=type(exc).__name__,
    )


def _recorded_outcome(payload: dict[str, Any], key: str) -> Any:
    if payload["status"] == "SUCCEEDED":
        return payload["result"]
    raise EffectFailed(
        f"effect failed permanently: {payload.get('error_class')}: {payload.get('message')}",
        key=key, error_class=payload.get("error_class", ""),
    )
