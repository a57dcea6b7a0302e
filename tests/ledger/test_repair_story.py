"""Repair stories, from the outside, with real workers, a worker killed mid-repair and the demo
providers, whose books count every real execution.

The bug-fix story: runs of version 1 fail on a bug after capturing the card; the replay check
says version 2 (the fix) replays every one of them; an operator redrives them onto version 2 in
one bulk action on the console; the worker doing it dies at an exact point (``SAGAS_CRASH_AT``:
``os._exit``, as a SIGKILL there) and another takes over; the provider's books show every card
captured once and every email sent once.

Re-run from a step past a succeeded capture, reusing its outcome and compensating it first, the
worker doing the refund SIGKILLed by the provider right after refunding: the card is captured
exactly once per intent (the source's capture, refunded once, and the re-run's own)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from console.models import BulkBatch
from demo.models import ProviderExecution
from demo.providers.faults import inject
from operators.models import AuditEntry
from operators.roles import OPERATOR, ensure_groups
from sagas import replay_check, start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.ledger import wf_repair_story  # noqa: F401  (registers both versions in this process)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.ledger.wf_repair_story"


def statuses(runs) -> Counter:
    return Counter(WorkflowRun.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True))


def books() -> Counter:
    return Counter(ProviderExecution.objects.values_list("provider", "operation", "idempotency_key"))


def operator_console() -> Client:
    ensure_groups()
    olga = get_user_model().objects.create(username="olga")
    olga.groups.add(Group.objects.get(name=OPERATOR))
    client = Client()
    client.force_login(olga)
    return client


def test_runs_failed_by_a_bug_are_checked_then_bulk_redriven_onto_the_fix_through_a_worker_kill(stack):
    runs = [start("fix_order", {"id": f"fx-{i}", "amount_cents": 1000 + i}, version=1, business_key=f"fx-{i}")
            for i in range(6)]
    # This worker fails them on the bug, then takes the bulk job and dies before its first email.
    first = stack.procs.worker("w1", MODULES, DEMO_PROVIDERS_URL=stack.url, SAGAS_CRASH_AT="before_intent:email")
    wait_until(lambda: statuses(runs) == {RunStatus.FAILED: 6}, 60, what="the runs to fail on the bug")
    assert {WorkflowRun.objects.get(id=r.id).status_reason for r in runs} == {"workflow_error"}

    report = replay_check("fix_order", version=2, runs=[r.id for r in runs])
    assert report.counts == {"compatible": 6, "diverges": 0, "error": 0}, report.as_dict()

    console = operator_console()
    previewed = console.post("/bulk/preview/", {"action": "run.redrive", "scope": "filter", "workflow": "fix_order",
                                        "status": "FAILED"})
    assert previewed.status_code == 302, previewed.content[:2000]
    token = re.search(r"/bulk/([0-9a-f-]{36})/", previewed["Location"]).group(1)
    confirmed = console.post(f"/bulk/{token}/confirm/", {"reason": "fix for the loyalty tier (ticket OPS-31)",
                                                         "confirm": "yes", "version": "2"})
    assert confirmed.status_code == 302, confirmed.content[:2000]

    first.popen.wait(timeout=60)  # it died at its first email: nothing of that email was recorded
    assert first.popen.returncode == 97, first.log()[-3000:]
    stack.procs.worker("w2", MODULES, DEMO_PROVIDERS_URL=stack.url)
    wait_until(lambda: statuses(runs) == {RunStatus.COMPLETED: 6}, 90, what="the redriven runs to complete")
    wait_until(lambda: BulkBatch.objects.get(token=token).state == "done", 60, what="the batch to finish")

    assert books() == Counter({("payments", "capture", f"{r.id}:capture"): 1 for r in runs}
                              | {("email", "send", f"{r.id}:email"): 1 for r in runs})
    batch = BulkBatch.objects.get(token=token)
    assert (batch.total, batch.ok, batch.refused, batch.version) == (6, 6, 0, 2)
    for run in runs:
        done = WorkflowRun.objects.get(id=run.id)
        assert (done.version, done.result["loyalty"]) == (2, "none") and done.result["message_id"]
        moved = JournalEntry.objects.get(run=run, kind="moved")
        assert (moved.payload["from_version"], moved.payload["to_version"], moved.payload["by"]) == (1, 2, "olga")
        assert JournalEntry.objects.filter(run=run, kind="redriven").count() == 1
    assert AuditEntry.objects.filter(action="run.redrive", outcome="ok", actor_label="olga").count() == 6
    history = console.get(f"/runs/{runs[0].id}/").content.decode()
    assert "moved from v1 to v2 by olga" in history and "fix for the loyalty tier" in history


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


def test_a_run_re_run_from_a_step_before_its_capture_with_compensation_first_refunds_once_and_captures_anew(stack):
    from sagas import fork, fork_preview

    run = start("fork_order", {"id": "fk-2", "amount_cents": 4300}, business_key="fk-2")
    first = stack.procs.worker("w1", MODULES, DEMO_PROVIDERS_URL=stack.url)
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 60,
               what="the source run to complete")
    quote_seq = JournalEntry.objects.get(run=run, kind="step", name="quote").seq

    plan = fork_preview(run_id=run.id, at_seq=quote_seq, compensate_first=True)
    assert plan.possible, plan.blockers
    assert {e.name: e.fate for e in plan.effects} == {"capture": "undone", "email": "reused"}  # email: no undo
    # The provider SIGKILLs the worker right after it refunded: nothing of the refund's answer
    # reached the ledger.
    inject("payments", "refund", "kill_caller_after_work")
    redo = fork(run_id=run.id, at_seq=quote_seq, reason="the price was wrong: refund and charge again",
                compensate_first=True)
    first.popen.wait(timeout=60)
    assert first.popen.returncode == -9, first.log()[-3000:]
    stack.procs.worker("w2", MODULES, DEMO_PROVIDERS_URL=stack.url)
    wait_until(lambda: WorkflowRun.objects.get(id=redo.id).status == RunStatus.COMPLETED, 90,
               what="the re-run to refund and complete")

    # Per intent, once: the source's capture, its refund (the provider dedupes the retried refund
    # by key), the re-run's own capture; the email was reused, not sent again.
    assert books() == Counter({("payments", "capture", f"{run.id}:capture"): 1,
                               ("payments", "refund", f"{run.id}:capture:compensate"): 1,
                               ("payments", "capture", f"{redo.id}:capture"): 1,
                               ("email", "send", f"{run.id}:email"): 1})
    done, source = WorkflowRun.objects.get(id=redo.id), WorkflowRun.objects.get(id=run.id)
    assert done.result["transaction_id"] != source.result["transaction_id"]  # a new capture
    assert done.result["message_id"] == source.result["message_id"]  # the same email
    assert source.status == RunStatus.COMPLETED  # the source is left as it was
    undone = JournalEntry.objects.get(run=redo, kind="compensation_item", name="compensate:capture")
    assert undone.payload["of_run"] == str(run.id)

    # Once undone, the source's capture is not reused by a later re-run, nor undone again.
    again = fork_preview(run_id=run.id, at_seq=quote_seq)
    assert {e.name: e.fate for e in again.effects} == {"capture": "again", "email": "reused"}
    pack_seq = JournalEntry.objects.get(run=run, kind="step", name="pack").seq
    assert "undone since by a compensation" in " ".join(fork_preview(run_id=run.id, at_seq=pack_seq).blockers)
