"""The bug-fix story, from the outside, with real workers and the demo providers: runs of
version 1 fail on a bug after capturing the card; the replay check says version 2 (the fix)
replays every one of them; each is redriven onto version 2 and completes; the provider's books
show every card captured once and every email sent once."""

from __future__ import annotations

from collections import Counter

import pytest

from demo.models import ProviderExecution
from sagas import redrive, replay_check, start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.ledger import wf_repair_story  # noqa: F401  (registers both versions in this process)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.ledger.wf_repair_story"


def statuses(runs) -> Counter:
    return Counter(WorkflowRun.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True))


def test_runs_failed_by_a_bug_are_checked_redriven_onto_the_fix_and_charge_nobody_twice(stack):
    runs = [start("fix_order", {"id": f"fx-{i}", "amount_cents": 1000 + i}, version=1, business_key=f"fx-{i}")
            for i in range(4)]
    worker = stack.procs.worker("w1", MODULES, DEMO_PROVIDERS_URL=stack.url)
    wait_until(lambda: statuses(runs) == {RunStatus.FAILED: 4}, 60, what="the runs to fail on the bug")
    assert {WorkflowRun.objects.get(id=r.id).status_reason for r in runs} == {"workflow_error"}

    report = replay_check("fix_order", version=2, runs=[r.id for r in runs])
    assert report.counts == {"compatible": 4, "diverges": 0, "error": 0}, report.as_dict()

    for run in runs:
        redriven = redrive(run_id=run.id, version=2, reason="fix for the loyalty tier (ticket OPS-31)")
        assert redriven.version == 2 and redriven.status != RunStatus.FAILED  # a worker may have it already
    wait_until(lambda: statuses(runs) == {RunStatus.COMPLETED: 4}, 60, what="the redriven runs to complete")

    books = Counter(ProviderExecution.objects.values_list("provider", "operation", "idempotency_key"))
    assert books == Counter({("payments", "capture", f"{r.id}:capture"): 1 for r in runs}
                            | {("email", "send", f"{r.id}:email"): 1 for r in runs})
    for run in runs:
        done = WorkflowRun.objects.get(id=run.id)
        assert done.result["loyalty"] == "none" and done.result["message_id"]
        moved = JournalEntry.objects.get(run=run, kind="moved")
        assert (moved.payload["from_version"], moved.payload["to_version"]) == (1, 2)
        assert JournalEntry.objects.filter(run=run, kind="redriven").count() == 1
    assert worker.alive()


def test_a_run_re_run_from_a_step_before_its_capture_reuses_the_capture_and_charges_nobody_twice(stack):
    from sagas import fork, fork_preview

    run = start("fork_order", {"id": "fk-1", "amount_cents": 4200}, business_key="fk-1")
    stack.procs.worker("w1", MODULES, DEMO_PROVIDERS_URL=stack.url)
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 60,
               what="the source run to complete")
    quote_seq = JournalEntry.objects.get(run=run, kind="step", name="quote").seq
    pack_seq = JournalEntry.objects.get(run=run, kind="step", name="pack").seq

    plan = fork_preview(run_id=run.id, at_seq=quote_seq)
    assert plan.possible and {e.name: e.fate for e in plan.effects} == {"capture": "reused", "email": "reused"}
    late = fork_preview(run_id=run.id, at_seq=pack_seq)
    assert {e.name: e.fate for e in late.effects} == {"capture": "kept", "email": "reused"}

    forks = [fork(run_id=run.id, at_seq=quote_seq, reason="re-quote after the price fix"),
             fork(run_id=run.id, at_seq=pack_seq, reason="pack again")]
    wait_until(lambda: {WorkflowRun.objects.get(id=f.id).status for f in forks} == {RunStatus.COMPLETED}, 60,
               what="both forks to complete")

    books = Counter(ProviderExecution.objects.values_list("provider", "operation", "idempotency_key"))
    assert books == Counter({("payments", "capture", f"{run.id}:capture"): 1, ("email", "send", f"{run.id}:email"): 1})
    source = WorkflowRun.objects.get(id=run.id)
    for f in forks:
        done = WorkflowRun.objects.get(id=f.id)
        assert done.result == source.result  # the same capture and email, not new ones
        assert (done.forked_from, done.started_via) == (run.id, "fork")
    assert list(JournalEntry.objects.filter(run=run, kind="operator_action", name="fork")
                .values_list("payload__to", flat=True)) == [str(f.id) for f in forks]
    first_fork_steps = list(JournalEntry.objects.filter(run_id=forks[0].id, kind="step").values_list("name", flat=True))
    assert first_fork_steps == ["quote", "pack"]  # executed again from the step on
