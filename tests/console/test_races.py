"""Two people acting on one run at once: real concurrent POSTs, each from
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

import pytest
from django.db import connection
from django.utils import timezone

from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditOutcome
from sagas import start
from sagas.models import (
    ApprovalRequest,
    ApprovalState,
    CompensationPlan,
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from sagas.replay.engine import advance
from tests.console.race_moves import (
    ROUNDS,
    Move,
    clients_for,
    decide_move,
    describe,
    race,
    resolve_move,
    run_move,
    unknown_effect,
    waiting_run,
)

pytestmark = pytest.mark.django_db(transaction=True)


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


# (first person, their move), (second person, their move)
PAIRS = {
    "approve_vs_cancel": (("ann", "approve"), ("olga", "cancel")),
    "approve_vs_cancel_compensate": (("ann", "approve"), ("olga", "cancel_compensate")),
    "approve_vs_compensate": (("ann", "approve"), ("olga", "compensate")),
    "reject_vs_cancel": (("abe", "reject"), ("olga", "cancel")),
    "two_cancels": (("olga", "cancel"), ("oscar", "cancel")),
    "two_approvals": (("ann", "approve"), ("abe", "approve")),
}


def _move(who: str, kind: str, run: WorkflowRun, approval: ApprovalRequest) -> Move:
    if kind in ("approve", "reject"):
        return decide_move(who, kind, approval)
    return run_move(who, kind, run)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_it_lets_exactly_one_of_two_concurrent_actions_on_a_run_win(people, pair):
    (who_a, kind_a), (who_b, kind_b) = PAIRS[pair]
    clients = clients_for(people)
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
    clients = clients_for(people)
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


def test_it_lets_a_worker_expire_an_approval_while_an_approver_decides_it_without_a_deadlock(people):
    """At the deadline the worker escalates the approval and parks the run; an approver deciding
    at that moment locks the run first. Both may legitimately happen one after the other (an
    escalated approval can still be decided); neither may deadlock, and the decision always
    wins over the parking: the run is never left NEEDS_ATTENTION with an approved approval."""
    client = clients_for(people)["ann"]
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
