"""The ledger's effect protocol on its own, without a workflow.

``ListJournal`` is a journal kept in a Python list: the smallest thing that keeps
``ledger.journal.Journal``'s promises (entries appear when their transaction commits;
positions replay in order; a lost fence refuses every write). Everything else is real:
the ``EffectRecord`` table in PostgreSQL, the demo connectors, and the simulated
providers in their own process, whose books count what really executed downstream.
A worker's death at a crash point is ``Died`` (a ``BaseException``): nothing after that
point runs, and a second ``ListJournal`` loaded from the first one's entries recovers.
"""

from __future__ import annotations

import json
import typing
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import transaction

import demo.connectors  # noqa: F401  (registers the connectors)
from demo.providers.faults import inject
from demo.providers.selectors import executions, replays
from ledger.connectors import Operation, get_connector
from ledger.errors import EffectFailed, KeyConflict, OutcomeUnknown, ReplayDiverged
from ledger.journal import COMPENSATION_KINDS, EFFECT_KINDS, FenceLost, Journal
from ledger.models import EffectRecord, EffectStatus
from ledger.protocol import run_effect, run_operation
from sagas.replay.cursor import JournalCursor

pytestmark = pytest.mark.django_db(transaction=True)

POSITIONS = frozenset({EFFECT_KINDS.intent, EFFECT_KINDS.refused})
CAPTURE = {"order": "o-1", "amount_cents": 4999, "currency": "EUR"}
RESERVE = {"sku": "sku-1", "qty": 2}
EMAIL = {"to": "ada@example.com", "subject": "Your order", "body": "Shipped."}
COMPLETE = {"prompt": "plan the order", "price": 0.02}


class Died(BaseException):
    """A worker killed at a crash point: nothing after the point runs or commits."""


class Held(BaseException):
    """Flow control held a call back (``Journal.hold``): the caller stops, nothing was sent."""

    def __init__(self, hold: Any) -> None:
        super().__init__(hold.describe())
        self.hold = hold


class Replaced(FenceLost):
    """This journal's owner was replaced by another (its fence moved on)."""


@dataclass(frozen=True)
class Row:
    seq: int
    kind: str
    name: str
    payload: Any


class ListJournal:
    """A ``Journal`` in a list. ``recorded``: the entries a previous owner left (a recovery)."""

    def __init__(self, *, recorded: list[Row] | None = None, run_id: str = "", die_at: str = "") -> None:
        self.run_id = run_id or str(uuid.uuid4())
        self.tenant = "t-protocol"
        self.entries: list[Row] = list(recorded or [])
        self._positions = [e for e in self.entries if e.kind in POSITIONS]
        self._events = {(e.kind, e.name): e for e in self.entries if e.kind not in POSITIONS}
        self._pos = 0
        self._names: dict[tuple[str, str], int] = {}
        self.die_at = die_at
        self.owner = True
        self.points: list[str] = []
        self.seen_at: dict[str, tuple[list[str], str | None, int]] = {}

    def recover(self, **kwargs: Any) -> ListJournal:
        """The journal a new owner loads after this one died."""
        return ListJournal(recorded=self.entries, run_id=self.run_id, **kwargs)

    def unique_name(self, name: str, space: str = "call") -> str:
        count = self._names[(space, name)] = self._names.get((space, name), 0) + 1
        return name if count == 1 else f"{name}#{count}"

    def effect_key(self, name: str) -> str:
        return f"{self.run_id}:{name}"

    def replay_next(self, kind: str, name: str, also: frozenset[str] = frozenset()) -> Row | None:
        if self._pos >= len(self._positions):
            return None
        entry = self._positions[self._pos]
        assert (entry.kind == kind or entry.kind in also) and entry.name == name, f"diverged at {entry}"
        self._pos += 1
        return entry

    def recorded_event(self, kind: str, name: str) -> Row | None:
        return self._events.get((kind, name))

    def before_live(self) -> None:
        self.points.append("before_live")

    def before_retry(self) -> None:
        self.points.append("before_retry")

    def append(self, kind: str, name: str, payload: str, *, steps: int = 0, cost: float = 0.0) -> int:
        self.check_fence()

        def add() -> None:
            self.entries.append(Row(len(self.entries) + 1, kind, name, json.loads(payload)))

        transaction.on_commit(add)  # at once outside a transaction
        return len(self.entries) + 1

    def check_fence(self) -> None:
        if not self.owner:
            raise Replaced("another owner took this journal over")

    def durably(self, write, *, kind, name, recorded):  # type: ignore[no-untyped-def]
        return write()

    def intent_recorded(self, effect: Any) -> None:
        pass

    def hold(self, hold: Any) -> typing.NoReturn:
        raise Held(hold)

    def crash_point(self, point: str, name: str) -> None:
        self.points.append(point)
        record = EffectRecord.objects.filter(tenant=self.tenant, step_name=name).first()
        self.seen_at[point] = ([e.kind for e in self.entries], record and record.status, record and record.attempts)
        if point == self.die_at:
            raise Died(point)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.entries]


def record(journal: ListJournal, name: str = "pay") -> EffectRecord:
    return EffectRecord.objects.get(tenant=journal.tenant, idempotency_key=f"{journal.run_id}:{name}")


def test_it_describes_a_journal_that_the_engines_cursor_and_the_test_journal_both_implement():
    members = {m for m in dir(Journal) if not m.startswith("_")} - set(dir(typing.Protocol))
    assert {"append", "replay_next", "check_fence", "durably", "unique_name", "run_id", "tenant"} <= members
    cursor_members = set(dir(JournalCursor)) | {"run_id", "tenant"}  # instance attributes
    assert members - cursor_members == set()
    assert members - set(dir(ListJournal)) - {"run_id", "tenant"} == set()


def test_it_records_the_intent_before_the_call_and_the_outcome_after_it(stack):
    journal = ListJournal()
    result = run_effect(journal, name="pay", connector_name="payments.capture", payload=CAPTURE)

    [execution] = executions("payments", "capture")
    assert result["transaction_id"] == execution.response["transaction_id"]
    assert execution.idempotency_key == f"{journal.run_id}:pay"
    assert journal.points == ["before_live", "before_intent", "after_intent", "after_dispatch", "after_outcome"]
    # At dispatch, the intent was already committed with its record (marked dispatched: a
    # connector with lookup needs no separate mark) and nothing had executed yet.
    assert journal.seen_at["after_intent"] == ([EFFECT_KINDS.intent], EffectStatus.IN_PROGRESS, 1)
    assert journal.kinds() == [EFFECT_KINDS.intent, EFFECT_KINDS.result]
    assert journal.entries[0].payload["key"] == f"{journal.run_id}:pay"
    assert journal.entries[1].payload == {
        "status": "SUCCEEDED", "result": result, "downstream_ref": execution.response["transaction_id"],
    }
    effect = record(journal)
    assert (effect.status, effect.attempts, effect.result) == (EffectStatus.SUCCEEDED, 1, result)


def test_it_marks_a_blind_connector_dispatched_in_a_commit_of_its_own(stack):
    journal = ListJournal()
    run_effect(journal, name="pay", connector_name="email.send", payload=EMAIL)
    # Neither lookup nor idempotency: only the PENDING -> IN_PROGRESS mark tells "never sent"
    # from "maybe sent", so the intent is committed PENDING and the mark comes before the call.
    assert journal.seen_at["after_intent"] == ([EFFECT_KINDS.intent], EffectStatus.PENDING, 0)
    assert record(journal).status == EffectStatus.SUCCEEDED and record(journal).attempts == 1
    assert executions("email", "send").count() == 1


def test_it_returns_a_succeeded_record_without_calling_the_connector_again(stack):
    first = ListJournal()
    result = run_effect(first, name="pay", connector_name="payments.capture", payload=CAPTURE)

    replay = first.recover()  # the outcome is in the journal: nothing is asked of anyone
    assert run_effect(replay, name="pay", connector_name="payments.capture", payload=CAPTURE) == result
    assert replay.points == [] and replay.kinds() == first.kinds()

    lost_result = ListJournal(recorded=first.entries[:1], run_id=first.run_id)  # died after the ledger's commit
    assert run_effect(lost_result, name="pay", connector_name="payments.capture", payload=CAPTURE) == result
    assert lost_result.kinds() == [EFFECT_KINDS.intent, EFFECT_KINDS.result]

    other_run = ListJournal()  # another caller with the same key and payload
    key = f"{first.run_id}:pay"
    assert run_effect(other_run, name="again", connector_name="payments.capture", payload=CAPTURE, key=key) == result
    assert other_run.entries[0].payload["reused"] is True
    assert executions("payments", "capture").count() == 1


def test_it_recovers_a_dispatched_effect_by_lookup_without_sending_it_again(stack):
    first = ListJournal(die_at="after_dispatch")
    with pytest.raises(Died):
        run_effect(first, name="pay", connector_name="inventory.reserve", payload=RESERVE)
    assert record(first).status == EffectStatus.IN_PROGRESS  # the owner died holding it

    second = first.recover()
    result = run_effect(second, name="pay", connector_name="inventory.reserve", payload=RESERVE)

    [execution] = executions("inventory", "reserve")  # reserved once, though not idempotent
    assert result["reservation_id"] == execution.response["reservation_id"]
    effect = record(first)
    assert (effect.status, effect.resolution, effect.attempts) == (EffectStatus.SUCCEEDED, "lookup", 1)
    assert "after_intent" not in second.points  # recovered without dispatching


def test_it_dispatches_once_when_lookup_says_the_call_never_arrived(stack):
    first = ListJournal(die_at="after_intent")
    with pytest.raises(Died):
        run_effect(first, name="pay", connector_name="inventory.reserve", payload=RESERVE)
    assert executions("inventory", "reserve").count() == 0

    run_effect(first.recover(), name="pay", connector_name="inventory.reserve", payload=RESERVE)
    assert executions("inventory", "reserve").count() == 1
    assert record(first).status == EffectStatus.SUCCEEDED


def test_it_retries_an_idempotent_connector_with_the_same_key(stack):
    first = ListJournal(die_at="after_dispatch")
    with pytest.raises(Died):
        run_effect(first, name="pay", connector_name="model.complete", payload=COMPLETE)

    result = run_effect(first.recover(), name="pay", connector_name="model.complete", payload=COMPLETE)

    [execution] = executions("model", "complete")  # billed once
    assert replays("model", "complete").count() == 1  # the retry was answered from the first execution
    assert result["completion_id"] == execution.response["completion_id"]
    effect = record(first)
    assert (effect.status, effect.attempts) == (EffectStatus.SUCCEEDED, 2)


def test_it_leaves_an_effect_with_neither_lookup_nor_idempotency_unknown(stack):
    first = ListJournal(die_at="after_dispatch")
    with pytest.raises(Died):
        run_effect(first, name="pay", connector_name="email.send", payload=EMAIL)

    second = first.recover()
    with pytest.raises(OutcomeUnknown) as raised:
        run_effect(second, name="pay", connector_name="email.send", payload=EMAIL)

    assert executions("email", "send").count() == 1  # never sent blindly a second time
    effect = record(first)
    assert effect.status == EffectStatus.UNKNOWN and effect.next_check_at is None  # nothing to look up
    assert raised.value.details["effect_id"] == effect.id and raised.value.details["step"] == "pay"
    assert second.kinds() == [EFFECT_KINDS.intent]  # no outcome journaled: nobody knows it


def test_it_refuses_a_key_used_with_another_payload_and_executes_nothing(stack):
    first = ListJournal()
    key = "capture:o-1:v1"
    run_effect(first, name="pay", connector_name="payments.capture", payload=CAPTURE, key=key)

    other = ListJournal()
    changed = {**CAPTURE, "amount_cents": 1}
    with pytest.raises(KeyConflict, match="different payload"):
        run_effect(other, name="pay", connector_name="payments.capture", payload=changed, key=key)
    assert other.kinds() == [EFFECT_KINDS.refused]  # the refusal is journaled
    with pytest.raises(KeyConflict):  # and replayed as a refusal, without asking the ledger
        run_effect(other.recover(), name="pay", connector_name="payments.capture", payload=changed, key=key)

    assert executions("payments", "capture").count() == 1
    assert EffectRecord.objects.get(idempotency_key=key).request_payload == CAPTURE


def test_it_refuses_a_replay_that_asks_for_another_payload(stack):
    first = ListJournal()
    run_effect(first, name="pay", connector_name="payments.capture", payload=CAPTURE)
    with pytest.raises(ReplayDiverged) as raised:
        run_effect(first.recover(), name="pay", connector_name="payments.capture", payload={**CAPTURE, "order": "x"})
    assert raised.value.recorded["key"] == raised.value.asked["key"] == f"{first.run_id}:pay"
    assert executions("payments", "capture").count() == 1


def test_it_never_retries_a_final_error(stack):
    inject("payments", "capture", "final", times=5)
    first = ListJournal()
    with pytest.raises(EffectFailed):
        run_effect(first, name="pay", connector_name="payments.capture", payload=CAPTURE)
    effect = record(first)
    assert (effect.status, effect.attempts) == (EffectStatus.FAILED_FINAL, 1)
    assert first.kinds() == [EFFECT_KINDS.intent, EFFECT_KINDS.result]

    with pytest.raises(EffectFailed):  # on recovery too, from the record, without a call
        run_effect(ListJournal(recorded=first.entries[:1], run_id=first.run_id),
                   name="pay", connector_name="payments.capture", payload=CAPTURE)
    assert record(first).attempts == 1
    assert executions("payments", "capture").count() == 0


def test_it_retries_a_retryable_error_with_the_same_key(stack):
    inject("payments", "capture", "error_before_work", times=1)
    journal = ListJournal()
    run_effect(journal, name="pay", connector_name="payments.capture", payload=CAPTURE)
    assert journal.points.count("before_retry") == 1
    assert record(journal).attempts == 2 and record(journal).status == EffectStatus.SUCCEEDED
    assert executions("payments", "capture").count() == 1


def test_it_keeps_the_providers_answer_when_the_journal_was_taken_over(stack):
    journal = ListJournal()
    original = journal.crash_point

    def taken_over(point: str, name: str) -> None:
        original(point, name)
        if point == "after_dispatch":
            journal.owner = False

    journal.crash_point = taken_over  # type: ignore[method-assign]
    with pytest.raises(Replaced):
        run_effect(journal, name="pay", connector_name="payments.capture", payload=CAPTURE)
    assert journal.kinds() == [EFFECT_KINDS.intent]  # the journal refused the outcome
    [execution] = executions("payments", "capture")
    effect = record(journal)  # but the ledger kept it as evidence, for whoever holds the run now
    assert effect.status == EffectStatus.SUCCEEDED
    assert effect.result["transaction_id"] == execution.response["transaction_id"]


def test_it_compensates_under_the_same_rules_once(stack):
    first = ListJournal()
    result = run_effect(first, name="pay", connector_name="payments.capture", payload=CAPTURE)
    original = record(first)
    op = Operation(get_connector("payments.capture"), "compensation")
    undo = {"effect_id": original.id, "payload": original.request_payload, "result": result}
    key = f"{original.idempotency_key}:compensate"

    refund = run_operation(first, op, name="compensate:pay", key=key, payload=undo, connector_name="payments.capture")
    again = run_operation(first.recover(), op, name="compensate:pay", key=key, payload=undo,
                          connector_name="payments.capture")

    assert refund.status == EffectStatus.SUCCEEDED and again.id == refund.id
    assert executions("payments", "refund").count() == 1
    assert first.kinds()[-2:] == [COMPENSATION_KINDS.intent, COMPENSATION_KINDS.result]
