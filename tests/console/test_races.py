"""Two people acting on one run at once (issue 10, point 3): real concurrent POSTs, each from
its own thread with its own Django test client and its own PostgreSQL connection, released
together by a barrier, against committed data (transactional_db).

Every pair here conflicts: whichever goes first changes the state the other one saw, so exactly
one wins (200/302) and the other is refused (409) with a message saying what the state is now.
Both are audited, the loser with the state it really found under the run's lock, never the
stale state from its page. No pair may end in a 500 (PostgreSQL "deadlock detected").
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.models import AuditEntry, AuditOutcome
from ledger import Connector, Timeout, connector
from ledger.models import EffectRecord, EffectStatus
from sagas import Context, start, workflow
from sagas.engine import advance
from sagas.models import (
    ApprovalRequest,
    ApprovalState,
    CompensationPlan,
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from tests.console.conftest import client_for

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 20


# --- workflows and connectors of this module ---------------------------------------------------


@connector("race.charge")
class RaceCharge(Connector):
    def execute(self, payload, *, key):
        return {"transaction_id": f"tx-{payload['order']}"}

    def compensate(self, payload, result, *, key):
        return {"refund_id": f"rf-{payload['order']}"}


@connector("race.blind")
class RaceBlind(Connector):
    """No lookup, not idempotent: a timeout leaves the effect UNKNOWN for a person."""

    def execute(self, payload, *, key):
        raise Timeout("no answer within 2.0 s")


@workflow("race_charge_wait", version=1)
def race_charge_wait(ctx: Context, order: dict) -> dict:
    ctx.effect("charge", "race.charge", {"order": order["id"], "amount_cents": 900})
    ctx.approval("ship", reason=f"Ship order {order['id']}?", timeout=timedelta(hours=1))
    return {"shipped": order["id"]}


@workflow("race_expiring", version=1)
def race_expiring(ctx: Context, order: dict) -> dict:
    ctx.approval("ship", reason=f"Ship order {order['id']}?", timeout=timedelta(milliseconds=1))
    return {"shipped": order["id"]}


@workflow("race_unknown", version=1)
def race_unknown(ctx: Context, order: dict) -> dict:
    ctx.effect("capture", "race.blind", {"order": order["id"]})
    return {"captured": order["id"]}


# --- data ---------------------------------------------------------------------------------------


def waiting_run(key: str) -> tuple[WorkflowRun, ApprovalRequest]:
    """A WAITING run with a SUCCEEDED charge (something to compensate) and a PENDING approval."""
    run = start("race_charge_wait", {"id": key}, business_key=key)
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    return run, ApprovalRequest.objects.get(run=run)


def unknown_effect(key: str) -> EffectRecord:
    run = start("race_unknown", {"id": key}, business_key=key)
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "effect_unknown")
    return EffectRecord.objects.get(run_id=run.id)


# --- one move of one person ---------------------------------------------------------------------


@dataclass
class Move:
    """One POST: who, where, what they saw (``expected``) and which audit entry it leaves."""

    who: str
    kind: str
    url: str
    form: dict[str, str]
    action: str
    object_type: str
    object_id: str
    expected: str
    response: Any = field(default=None, repr=False)

    def current_state(self) -> str:
        if self.object_type == "run":
            return WorkflowRun.objects.get(id=self.object_id).status
        if self.object_type == "approval":
            return ApprovalRequest.objects.get(id=self.object_id).state
        return EffectRecord.objects.get(id=int(self.object_id)).status

    def audit(self) -> list[AuditEntry]:
        return list(AuditEntry.objects.filter(action=self.action, object_type=self.object_type,
                                              object_id=self.object_id).order_by("id"))


def run_move(who: str, kind: str, run: WorkflowRun) -> Move:
    reason = f"{kind} by {who}: customer asked on ticket 4411"
    if kind == "cancel":
        return Move(who, kind, reverse("console:run_cancel", args=[run.id]),
                    {"reason": reason, "expected": run.status}, "run.cancel", "run", str(run.id), run.status)
    if kind == "cancel_compensate":
        return Move(who, kind, reverse("console:run_cancel", args=[run.id]),
                    {"reason": reason, "expected": run.status, "compensate": "on"}, "run.cancel", "run",
                    str(run.id), run.status)
    assert kind == "compensate"
    return Move(who, kind, reverse("console:run_compensate", args=[run.id]),
                {"reason": reason, "expected": run.status}, "run.compensate", "run", str(run.id), run.status)


def decide_move(who: str, kind: str, approval: ApprovalRequest) -> Move:
    return Move(who, kind, reverse("console:approval_decide", args=[approval.id]),
                {"decision": kind, "comment": f"{kind} by {who}", "expected": approval.state},
                f"approval.{kind}", "approval", str(approval.id), approval.state)


def resolve_move(who: str, outcome: str, effect: EffectRecord) -> Move:
    form = {"outcome": outcome, "note": f"{who} checked the provider dashboard", "expected": effect.status}
    if outcome == "succeeded":
        form["downstream_ref"] = f"ch-{who}"
    return Move(who, f"resolve_{outcome}", reverse("console:effect_resolve", args=[effect.id]), form,
                "effect.resolve", "effect", str(effect.id), effect.status)


def race(clients: dict[str, Client], *moves: Move) -> None:
    """Send the moves' POSTs at the same moment, one thread (and DB connection) each."""
    barrier = threading.Barrier(len(moves))
    errors: list[BaseException] = []

    def go(move: Move) -> None:
        try:
            barrier.wait(timeout=60)
            move.response = clients[move.who].post(move.url, move.form)
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(m,), name=f"race-{m.who}") for m in moves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racing request hung"
    assert not errors, errors


def describe(move: Move) -> str:
    response = move.response
    detail = ""
    if response.status_code >= 500 and getattr(response, "exc_info", None):
        detail = f": {response.exc_info[1]!r}"
    return f"{move.who} {move.kind} -> {response.status_code}{detail}"


# --- what must hold after each round ------------------------------------------------------------


def check_round(a: Move, b: Move, run: WorkflowRun, approval: ApprovalRequest | None) -> Move:
    """Exactly one winner, a 409 with the present state for the loser, both audited with the
    state each really found, and a final state that is the winner's. Returns the winner."""
    codes = [a.response.status_code, b.response.status_code]
    assert not any(c >= 500 for c in codes), f"{describe(a)}; {describe(b)}"
    won = [m for m in (a, b) if m.response.status_code in (200, 302)]
    lost = [m for m in (a, b) if m.response.status_code == 409]
    assert len(won) == 1 and len(lost) == 1, f"{describe(a)}; {describe(b)}"
    winner, loser = won[0], lost[0]

    now_state = loser.current_state()
    body = loser.response.content.decode()
    assert f"now {now_state}" in body and "nothing was changed" in body, body[-2000:]
    assert now_state != loser.expected

    [win_entry] = [e for e in winner.audit() if e.actor_label == winner.who]
    assert win_entry.outcome == AuditOutcome.OK
    assert win_entry.before["state"] == winner.expected
    assert win_entry.after["state"] == winner.current_state()
    [lose_entry] = [e for e in loser.audit() if e.actor_label == loser.who]
    assert lose_entry.outcome == AuditOutcome.REFUSED, (lose_entry.outcome, lose_entry.message)
    assert lose_entry.before is not None and lose_entry.before["state"] == now_state, (
        f"the loser's audit entry says {lose_entry.before} but it found {now_state} under the lock")
    assert f"now {now_state}" in lose_entry.message

    run.refresh_from_db()
    journal = Counter(JournalEntry.objects.filter(run=run).values_list("kind", flat=True))
    if approval is not None:
        approval.refresh_from_db()
    kind = winner.kind
    if kind in ("approve", "reject"):
        assert approval.state == (ApprovalState.APPROVED if kind == "approve" else ApprovalState.REJECTED)
        assert approval.decided_by_label == winner.who
        assert run.status == RunStatus.PENDING
        assert journal["approval_decided"] == 1 and journal["cancelled"] == 0
        assert not CompensationPlan.objects.filter(run=run).exists()
    elif kind in ("cancel", "cancel_compensate", "compensate"):
        assert approval.state == ApprovalState.EXPIRED and journal["approval_decided"] == 0
        if kind == "cancel":
            assert run.status == RunStatus.CANCELLED and journal["cancelled"] == 1
            assert not CompensationPlan.objects.filter(run=run).exists()
        else:
            assert run.status == RunStatus.COMPENSATING
            plan = CompensationPlan.objects.get(run=run)
            assert plan.trigger == ("cancel" if kind == "cancel_compensate" else "operator")
            assert journal["compensation_started"] == 1
            assert journal["cancelled"] == (1 if kind == "cancel_compensate" else 0)
    else:
        effect = EffectRecord.objects.get(id=int(winner.object_id))
        assert effect.resolved_by_label == winner.who
        if kind == "resolve_succeeded":
            assert effect.status == EffectStatus.SUCCEEDED and effect.downstream_ref == f"ch-{winner.who}"
        else:
            assert effect.status == EffectStatus.PENDING
        assert run.status == RunStatus.PENDING and journal["effect_resolved"] == 1
    return winner


# --- the pairs ----------------------------------------------------------------------------------

# (first person, their move), (second person, their move)
PAIRS = {
    "approve_vs_cancel": (("ann", "approve"), ("olga", "cancel")),
    "approve_vs_cancel_compensate": (("ann", "approve"), ("olga", "cancel_compensate")),
    "approve_vs_compensate": (("ann", "approve"), ("olga", "compensate")),
    "reject_vs_cancel": (("abe", "reject"), ("olga", "cancel")),
    "two_cancels": (("olga", "cancel"), ("oscar", "cancel")),
    "two_approvals": (("ann", "approve"), ("abe", "approve")),
}


def _clients(people) -> dict[str, Client]:
    clients = {}
    for user in people.values():
        client = client_for(user)
        client.raise_request_exception = False  # a crash must show as the 500 a browser would get
        clients[user.get_username()] = client
    return clients


def _move(who: str, kind: str, run: WorkflowRun, approval: ApprovalRequest) -> Move:
    if kind in ("approve", "reject"):
        return decide_move(who, kind, approval)
    return run_move(who, kind, run)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_it_lets_exactly_one_of_two_concurrent_actions_on_a_run_win(people, pair):
    (who_a, kind_a), (who_b, kind_b) = PAIRS[pair]
    clients = _clients(people)
    wins: Counter[str] = Counter()
    for i in range(ROUNDS):
        run, approval = waiting_run(f"{pair}-{i}")
        a, b = _move(who_a, kind_a, run, approval), _move(who_b, kind_b, run, approval)
        race(clients, a, b)
        winner = check_round(a, b, run, approval)
        wins[f"{winner.who} {winner.kind}"] += 1
    print(f"{pair}: {dict(wins)} over {ROUNDS} rounds")
    assert sum(wins.values()) == ROUNDS


def test_it_lets_exactly_one_of_two_concurrent_resolutions_of_an_unknown_effect_win(people):
    clients = _clients(people)
    wins: Counter[str] = Counter()
    for i in range(ROUNDS):
        effect = unknown_effect(f"resolve-{i}")
        run = WorkflowRun.objects.get(id=effect.run_id)
        a, b = resolve_move("olga", "succeeded", effect), resolve_move("oscar", "not_executed", effect)
        race(clients, a, b)
        winner = check_round(a, b, run, None)
        wins[f"{winner.who} {winner.kind}"] += 1
    print(f"two resolutions: {dict(wins)} over {ROUNDS} rounds")
    assert sum(wins.values()) == ROUNDS


# --- `expected` is required for effect resolve and approval decide ----------------------------------


def test_it_refuses_an_effect_resolution_that_does_not_say_what_was_seen(people):
    effect = unknown_effect("no-expected-effect")
    move = resolve_move("olga", "succeeded", effect)
    del move.form["expected"]

    response = _clients(people)["olga"].post(move.url, move.form)

    assert response.status_code == 400
    assert "which state you saw" in response.content.decode()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN and effect.resolved_at is None
    assert WorkflowRun.objects.get(id=effect.run_id).status == RunStatus.NEEDS_ATTENTION
    [entry] = move.audit()
    assert entry.outcome == AuditOutcome.REFUSED and entry.actor_label == "olga"
    assert entry.before["state"] == "UNKNOWN" and "which state you saw" in entry.message


def test_it_refuses_an_approval_decision_that_does_not_say_what_was_seen(people):
    run, approval = waiting_run("no-expected-approval")
    move = decide_move("ann", "approve", approval)
    move.form["expected"] = ""

    response = _clients(people)["ann"].post(move.url, move.form)

    assert response.status_code == 400
    assert "which state you saw" in response.content.decode()
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.state == ApprovalState.PENDING and run.status == RunStatus.WAITING
    assert not JournalEntry.objects.filter(run=run, kind="approval_decided").exists()
    [entry] = move.audit()
    assert entry.outcome == AuditOutcome.REFUSED and entry.before["state"] == "PENDING"


def test_it_still_denies_a_viewer_before_looking_at_expected(people):
    run, approval = waiting_run("viewer-no-expected")
    move = decide_move("vera", "approve", approval)
    del move.form["expected"]
    response = _clients(people)["vera"].post(move.url, move.form)
    assert response.status_code == 403
    [entry] = move.audit()
    assert entry.outcome == AuditOutcome.DENIED
    approval.refresh_from_db()
    assert approval.state == ApprovalState.PENDING


# --- a worker expiring an approval at its deadline while an approver decides it ------------------


def test_it_lets_a_worker_expire_an_approval_while_an_approver_decides_it_without_a_deadlock(people):
    """At the deadline the worker escalates the approval and parks the run; an approver deciding
    at that moment locks the run first. Both may legitimately happen one after the other (an
    escalated approval can still be decided); neither may deadlock, and the decision always
    wins over the parking: the run is never left NEEDS_ATTENTION with an approved approval."""
    client = _clients(people)["ann"]
    outcomes: Counter[str] = Counter()
    for i in range(ROUNDS):
        run = start("race_expiring", {"id": f"expiry-{i}"}, business_key=f"expiry-{i}")
        advance(str(run.id), owner="t")
        run.refresh_from_db()
        assert run.status == RunStatus.WAITING and run.wake_at <= timezone.now()
        approval = ApprovalRequest.objects.get(run=run)
        assert approval.state == ApprovalState.PENDING
        # What the sweeper does with a due run: PENDING again, for a worker to claim.
        WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.PENDING, wake_at=None)
        move = decide_move("ann", "approve", approval)
        barrier = threading.Barrier(2)
        worker_error: list[BaseException] = []

        def work() -> None:
            try:
                barrier.wait(timeout=60)
                advance(str(run.id), owner="race-worker")
            except BaseException as exc:
                worker_error.append(exc)
            finally:
                connection.close()

        def decide() -> None:
            try:
                barrier.wait(timeout=60)
                move.response = client.post(move.url, move.form)
            finally:
                connection.close()

        threads = [threading.Thread(target=work), threading.Thread(target=decide)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not worker_error, worker_error
        # An escalated approval can still be decided, even while the worker is parking the run:
        # the worker sees the decision arrive (its halt is refused on last_seq) and replays.
        assert move.response.status_code in (200, 302), describe(move)
        approval.refresh_from_db()
        run.refresh_from_db()
        assert approval.state == ApprovalState.APPROVED and approval.decided_by_label == "ann"
        # Never approved yet parked: the decision either reached the worker's replay or woke the run.
        assert run.status in (RunStatus.COMPLETED, RunStatus.PENDING), (run.status, run.status_reason)
        [entry] = move.audit()
        assert entry.outcome == AuditOutcome.OK
        outcomes[f"{move.response.status_code} {approval.state} run {run.status}"] += 1
    print(f"expiry vs decision: {dict(outcomes)}")
