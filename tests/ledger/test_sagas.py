"""Compensation (sagas), approvals, timers, signals and cancellation, with real workers,
a real provider process and SIGKILL where a crash is involved."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from demo.providers.faults import inject
from demo.providers.selectors import executions, replays
from ledger.models import EffectRecord
from sagas import start
from sagas.compensation import compensation_preview
from sagas.errors import AlreadyDecided, FourEyesViolation
from sagas.models import (
    ApprovalRequest,
    ApprovalState,
    CompensationItemState,
    CompensationPlan,
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from sagas.runtime.queue import get_queue, queue_name_for, redis_connection
from sagas.services import run_cancel
from sagas.waits import approval_decide, signal_send
from tests.ledger import wf_sagas  # noqa: F401
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.ledger.wf_sagas"


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def wait_status(run, wanted: str, timeout: float = 30) -> None:
    wait_until(lambda: status(run) == wanted, timeout, what=f"run to be {wanted} (is {status(run)})")


def user(name: str):
    return get_user_model().objects.create_user(name, password="pw-" + name)


def worker(stack, name: str, **env: str):
    return stack.procs.worker(name, MODULES, DEMO_PROVIDERS_URL=stack.url, **env)


def test_it_compensates_three_effects_in_exact_reverse_order_after_a_final_failure(stack):
    inject("email", "send", "final")
    run = start("three_then_fail", {"id": "o-100"})
    worker(stack, "w1")
    wait_status(run, RunStatus.COMPENSATED)
    undo = list(
        executions("payments", "refund").values_list("id", "request__transaction_id")
    ) + list(executions("inventory", "release").values_list("id", "request__reservation_id"))
    undo.sort()  # provider execution ids are the order in which they really happened
    captures = {e.idempotency_key.rsplit(":", 1)[1]: e for e in executions("payments", "capture")}
    reservation = executions("inventory", "reserve").get().response["reservation_id"]
    assert [ref for _, ref in undo] == [
        captures["capture2"].response["transaction_id"], reservation, captures["capture"].response["transaction_id"]
    ]
    plan = CompensationPlan.objects.get(run=run)
    assert plan.trigger == "automatic" and plan.state == "COMPLETED"
    assert [i.step_name for i in plan.items.order_by("position")] == ["capture2", "reserve", "capture"]
    assert executions("email", "send").count() == 0


def test_it_repeats_no_compensation_when_workers_are_killed_mid_compensation(stack):
    inject("email", "send", "final")
    run = start("three_then_fail", {"id": "o-101"})
    # w1 dies right after the first refund left (not recorded); w2 recovers it, records the
    # release's intent and dies before sending it; w3 finishes. Nobody has to step in.
    first = worker(stack, "w1", SAGAS_CRASH_AT="after_dispatch:compensate:capture2")
    wait_until(lambda: not first.alive(), 30, what="w1 to die after the first refund")
    second = worker(stack, "w2", SAGAS_CRASH_AT="after_intent:compensate:reserve")
    wait_until(lambda: not second.alive(), 30, what="w2 to die before releasing the reservation")
    worker(stack, "w3")
    wait_status(run, RunStatus.COMPENSATED)
    assert executions("payments", "refund").count() == 2  # one per capture, none twice
    assert replays("payments").filter(execution__operation="refund").count() == 1  # w2's same-key retry
    assert executions("inventory", "release").count() == 1
    items = dict(CompensationPlan.objects.get(run=run).items.values_list("step_name", "state"))
    assert set(items.values()) == {CompensationItemState.SUCCEEDED}
    claims = list(JournalEntry.objects.filter(run=run, kind="claimed").values_list("worker_id", flat=True))
    assert claims == ["w1", "w2", "w3"]


def test_it_leaves_the_run_needing_attention_when_a_compensation_fails(stack):
    inject("email", "send", "final")
    inject("payments", "refund", "final")
    run = start("three_then_fail", {"id": "o-102"})
    worker(stack, "w1")
    wait_status(run, RunStatus.NEEDS_ATTENTION)
    run.refresh_from_db()
    assert run.status_reason == "compensation_failed"
    assert "nothing is skipped" in run.error["message"]
    items = dict(CompensationPlan.objects.get(run=run).items.values_list("step_name", "state"))
    assert items == {"capture2": CompensationItemState.FAILED, "reserve": CompensationItemState.PENDING,
                     "capture": CompensationItemState.PENDING}
    assert executions("inventory", "release").count() == 0  # later items wait, never skipped


def test_it_resumes_an_approved_run_and_enforces_four_eyes(stack):
    starter, approver = user("sam"), user("ann")
    run = start("approve_then_ship", {"id": "o-103"}, started_by=starter)
    worker(stack, "w1")
    wait_status(run, RunStatus.WAITING)
    request = ApprovalRequest.objects.get(run=run, step="ship")
    with pytest.raises(FourEyesViolation, match="sam started this run"):
        approval_decide(approval_id=request.id, user=starter, approve=True, comment="self-approve")
    approval_decide(approval_id=request.id, user=approver, approve=True, comment="ok to ship")
    wait_status(run, RunStatus.COMPLETED)
    run.refresh_from_db()
    assert run.result["approved_by"] == "ann"
    assert executions("shipping", "create").count() == 1
    with pytest.raises(AlreadyDecided, match="already approved by ann at"):
        approval_decide(approval_id=request.id, user=user("bob"), approve=False, comment="too late")


def test_it_compensates_a_rejected_run(stack):
    run = start("approve_then_ship", {"id": "o-104"}, started_by=user("sam"))
    worker(stack, "w1")
    wait_status(run, RunStatus.WAITING)
    approval_decide(approval_id=ApprovalRequest.objects.get(run=run).id, user=user("ann"), approve=False,
                    comment="address looks fraudulent")
    wait_status(run, RunStatus.COMPENSATED)
    assert executions("payments", "refund").count() == 1
    assert executions("shipping", "create").count() == 0
    assert "address looks fraudulent" in JournalEntry.objects.get(run=run, kind="failed").payload["message"]


def test_it_escalates_an_approval_at_its_deadline_and_still_accepts_a_decision(stack):
    run = start("approve_then_ship", {"id": "o-105", "timeout": 1, "on_timeout": "escalate"}, started_by=user("sam"))
    worker(stack, "w1")
    wait_status(run, RunStatus.NEEDS_ATTENTION, timeout=20)
    run.refresh_from_db()
    assert run.status_reason == "approval_escalated"
    request = ApprovalRequest.objects.get(run=run)
    assert request.state == ApprovalState.ESCALATED
    approval_decide(approval_id=request.id, user=user("ann"), approve=True, comment="late but fine")
    wait_status(run, RunStatus.COMPLETED)


def test_it_adds_an_approval_gate_before_an_irreversible_connector(stack):
    run = start("ship_gated", {"id": "o-106"})
    worker(stack, "w1")
    wait_status(run, RunStatus.WAITING)
    request = ApprovalRequest.objects.get(run=run)
    assert request.step == "approve:ship" and "shipping.create" in request.reason
    assert executions("shipping", "create").count() == 0
    approval_decide(approval_id=request.id, user=user("ann"), approve=True)
    wait_status(run, RunStatus.COMPLETED)
    assert executions("shipping", "create").count() == 1


def test_it_holds_no_worker_while_a_run_waits(stack):
    run = start("capture_then_wait", {"id": "o-107"})
    worker(stack, "w1")
    wait_status(run, RunStatus.WAITING)
    run.refresh_from_db()
    assert run.lease_owner == "" and run.lease_expires_at is None
    q = get_queue(queue_name_for(run.definition_hash))
    # No job queued, none in progress (RQ's bookkeeping of the finished one may lag a moment).
    wait_until(lambda: q.count == 0 and q.started_job_registry.count == 0, 30, what="the queue to be empty")
    other = start("capture_then_wait", {"id": "o-108"})  # the same single worker is free for it
    wait_status(other, RunStatus.WAITING)


def test_it_sleeps_through_a_worker_restart_and_wakes_on_time(stack, step_calls):
    run = start("nap", {"seconds": 3})
    first = worker(stack, "w1")
    wait_status(run, RunStatus.WAITING)
    wake_at = WorkflowRun.objects.get(id=run.id).wake_at
    first.kill()
    worker(stack, "w2")
    wait_status(run, RunStatus.COMPLETED, timeout=20)
    fired = JournalEntry.objects.get(run=run, kind="timer_fired")
    from django.conf import settings

    assert fired.created_at >= wake_at  # not early; not late beyond wait_status's patience
    print(f"timer fired {fired.payload['late_by_ms']} ms late (sweep every {settings.SAGAS_SWEEP_INTERVAL}s)")
    assert step_calls.counts(run.id) == {"before": 1, "after": 1}


def test_it_wakes_on_a_signal_and_times_out_without_one(stack):
    waiting = start("await_payment", {"timeout": 60})
    lonely = start("await_payment", {"timeout": 1})
    worker(stack, "w1")
    wait_status(waiting, RunStatus.WAITING)
    signal_send(run_id=str(waiting.id), name="payment_confirmed", payload={"amount_cents": 4999})
    wait_status(waiting, RunStatus.COMPLETED)
    wait_status(lonely, RunStatus.COMPLETED, timeout=20)
    waiting.refresh_from_db()
    lonely.refresh_from_db()
    assert waiting.result == {"confirmed": True, "payload": {"amount_cents": 4999}}
    assert lonely.result == {"confirmed": False}
    assert JournalEntry.objects.filter(run=lonely, kind="signal_timeout").count() == 1


def test_it_cancels_a_waiting_run_with_compensation_and_another_without(stack):
    operator = user("olga")
    undo = start("capture_then_wait", {"id": "o-109"})
    keep = start("capture_then_wait", {"id": "o-110"})
    worker(stack, "w1")
    wait_status(undo, RunStatus.WAITING)
    wait_status(keep, RunStatus.WAITING)
    run_cancel(run_id=str(undo.id), user=operator, reason="customer withdrew", compensate=True)
    run_cancel(run_id=str(keep.id), user=operator, reason="duplicate order; keep the charge", compensate=False)
    wait_status(undo, RunStatus.COMPENSATED)
    assert status(keep) == RunStatus.CANCELLED
    assert executions("payments", "refund").count() == 1
    refunded = executions("payments", "refund").get().request["transaction_id"]
    undo_charge = EffectRecord.objects.get(run_id=undo.id, step_name="capture").result["transaction_id"]
    assert refunded == undo_charge
    assert ApprovalRequest.objects.get(run=keep).state == ApprovalState.EXPIRED
    entry = JournalEntry.objects.get(run=keep, kind="cancelled")
    assert entry.payload["by"] == "olga" and entry.payload["reason"] == "duplicate order; keep the charge"


def test_it_stops_a_running_run_at_its_next_step_when_cancelled(stack, step_calls):
    run = start("long_steps", {"steps": 200, "pause": 0.05})
    worker(stack, "w1")
    wait_until(lambda: len(step_calls.counts(run.id)) >= 5, 20, what="a few steps")
    run_cancel(run_id=str(run.id), user=user("olga"), reason="runaway", compensate=False)
    # One worker, one queue: once it has finished a run started after the cancel, it has let go of this one.
    after = start("long_steps", {"steps": 1})
    wait_status(after, RunStatus.COMPLETED)
    done = len(step_calls.counts(run.id))
    assert done <= JournalEntry.objects.filter(run=run, kind="step").count() + 1  # nothing after the step in flight
    assert status(run) == RunStatus.CANCELLED
    cancel_seq = JournalEntry.objects.get(run=run, kind="cancelled").seq
    assert not JournalEntry.objects.filter(run=run, kind="step", seq__gt=cancel_seq).exists()
    assert done < 200


def test_it_previews_a_plan_with_irreversible_items_listed(stack):
    run = start("approve_then_ship", {"id": "o-111"}, started_by=user("sam"))
    worker(stack, "w1")
    wait_status(run, RunStatus.WAITING)
    approval_decide(approval_id=ApprovalRequest.objects.get(run=run).id, user=user("ann"), approve=True)
    wait_status(run, RunStatus.COMPLETED)
    preview = compensation_preview(run=WorkflowRun.objects.get(id=run.id))
    assert [(p.step_name, p.reversible) for p in preview] == [("ship", False), ("capture", True)]
    assert "irreversible" in preview[0].why_not


def test_a_worker_without_the_workflows_code_still_compensates_it_even_after_its_wakeup_was_lost(stack):
    """Compensation needs connectors, not workflow code: after a deploy that removed a
    workflow, its runs can still be undone. And a COMPENSATING run whose wake-up Redis lost
    is found by the sweeper like any other."""
    run = start("capture_then_wait", {"id": "o-112"})
    first = worker(stack, "w1")
    wait_status(run, RunStatus.WAITING)
    first.kill()
    run_cancel(run_id=str(run.id), user=user("olga"), reason="order withdrawn after the deploy", compensate=True)
    assert status(run) == RunStatus.COMPENSATING
    redis_connection().flushdb()  # the wake-up is lost too

    other_code = stack.procs.worker("w2", "tests.sagas.wf_engine", DEMO_PROVIDERS_URL=stack.url)
    wait_status(run, RunStatus.COMPENSATED)
    assert executions("payments", "refund").count() == 1
    refund = JournalEntry.objects.filter(run=run, kind="compensation_result").get()
    assert refund.worker_id == "w2"
    assert not JournalEntry.objects.filter(run=run, kind="halted").exists()  # never parked as version_mismatch
    assert other_code.alive()
