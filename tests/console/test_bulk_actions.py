"""Bulk actions: the preview, the confirmation, and the job that works through a batch, each
item checked like the single action (role, tenant, four-eyes, the state seen at the preview)
and audited like it; re-submitting, and a worker killed mid-batch."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from console.models import BulkBatch, BulkItem, BulkState
from console.services.bulk import CHUNK, batch_work
from console.user_audit import ACTION as ROLE_CHANGES  # the fixtures' role grants
from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry, AuditOutcome, TenantScope
from sagas.models import ApprovalRequest, ApprovalState, JournalEntry, JournalKind, RunStatus, WorkflowRun
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_effect, make_run, resolve, text
from tests.procs import wait_sessions_gone, wait_until

PREVIEW = "console:bulk_preview"


def preview(client, action, *, ids=None, **filters):
    data = {"action": action, "scope": "filter" if ids is None else "selected", **filters}
    if ids is not None:
        data["ids"] = [str(i) for i in ids]
    return client.post(reverse(PREVIEW), data)


def token_of(response) -> str:
    assert response.status_code == 302, text(response)[:2000]
    return re.search(r"/bulk/([0-9a-f-]{36})/", response["Location"]).group(1)


def confirm(client, token, *, reason="provider dashboards checked, ticket OPS-7", tick=True, **fields):
    data = {"reason": reason, **fields}
    if tick:
        data["confirm"] = "yes"
    return client.post(reverse("console:bulk_confirm", args=[token]), data)


def entries(**filters):
    return AuditEntry.objects.exclude(action=ROLE_CHANGES).filter(**filters)


def run_batch(token) -> BulkBatch:
    batch = BulkBatch.objects.get(token=token)
    assert batch_work(batch_id=batch.id) == "done"
    batch.refresh_from_db()
    return batch


@pytest.mark.django_db
def test_it_previews_how_many_match_the_filter_with_a_sample_and_acts_on_nothing(people):
    stuck = [make_run(business_key=f"order-{i:03}") for i in range(14)]  # NEEDS_ATTENTION
    make_run(status=RunStatus.COMPLETED, reason="", business_key="order-done")
    client = client_for(people["operator"])
    token = token_of(preview(client, "run.cancel", status="NEEDS_ATTENTION"))
    page = client.get(reverse("console:bulk_batch", args=[token]))
    assert page.status_code == 200
    body = text(page)
    assert re.search(r"<strong>14</strong> runs\s+match the filters", body)
    assert len(re.findall(r'<tr><td><a class="mono" href="/runs/', body)) == 10  # the first 10 only
    assert "order-done" not in body
    assert 'name="confirm"' in body and 'name="reason"' in body
    assert all(r.status == RunStatus.NEEDS_ATTENTION for r in WorkflowRun.objects.filter(id__in=[r.id for r in stuck]))
    assert not entries().exists()
    # Ticked rows: only those (a completed one among them is left out: it cannot be cancelled).
    done = WorkflowRun.objects.get(business_key="order-done")
    token = token_of(preview(client, "run.cancel", ids=[stuck[0].id, stuck[1].id, done.id]))
    assert BulkBatch.objects.get(token=token).total == 2
    assert re.search(r"<strong>2</strong> runs\s+of those you ticked", text(client.get(f"/bulk/{token}/")))


@pytest.mark.django_db
def test_it_requires_a_reason_and_queues_nothing_without_one(people):
    make_effect()
    client = client_for(people["operator"])
    token = token_of(preview(client, "effect.resolve"))
    answer = confirm(client, token, reason="  ", outcome="failed")
    assert answer.status_code == 400
    assert "A reason is required" in text(answer)
    assert BulkBatch.objects.get(token=token).state == BulkState.DRAFT
    answer = confirm(client, token, reason="x" * 4001, outcome="failed")
    assert answer.status_code == 400 and "at most 4000 characters" in text(answer)
    assert BulkBatch.objects.get(token=token).state == BulkState.DRAFT
    assert not entries().exists()


@pytest.mark.django_db
def test_it_requires_the_explicit_confirmation(people):
    make_effect()
    client = client_for(people["operator"])
    token = token_of(preview(client, "effect.resolve"))
    answer = confirm(client, token, tick=False, outcome="failed")
    assert answer.status_code == 400 and "Tick the confirmation" in text(answer)
    assert BulkBatch.objects.get(token=token).state == BulkState.DRAFT
    assert EffectRecord.objects.get().status == EffectStatus.UNKNOWN


@pytest.mark.django_db
def test_it_denies_an_operator_bulk_approval_and_a_viewer_anything_and_audits_both(people):
    make_approval()
    make_run()
    answer = preview(client_for(people["operator"]), "approval.approve")
    assert answer.status_code == 403 and "needs the approver role" in text(answer)
    answer = preview(client_for(people["viewer"]), "run.cancel")
    assert answer.status_code == 403
    answer = preview(client_for(people["nobody"]), "run.cancel", ids=["x"])
    assert answer.status_code == 403
    assert not BulkBatch.objects.exists()
    denied = {(e.actor_label, e.action): e for e in entries()}
    assert set(denied) == {("olga", "bulk.approval.approve"), ("vera", "bulk.run.cancel"), ("nils", "bulk.run.cancel")}
    assert all(e.outcome == AuditOutcome.DENIED for e in denied.values())
    assert ApprovalRequest.objects.get().state == ApprovalState.PENDING


@pytest.mark.django_db
def test_it_checks_each_items_role_when_the_job_reaches_it(people):
    runs = [make_run() for _ in range(3)]
    operator = people["operator"]
    client = client_for(operator)
    token = token_of(preview(client, "run.cancel"))
    assert confirm(client, token).status_code == 302
    operator.groups.remove(Group.objects.get(name="operator"))  # taken away before the job runs
    batch = run_batch(token)
    assert (batch.ok, batch.denied, batch.refused, batch.state) == (0, 3, 0, BulkState.DONE)
    assert {r.status for r in WorkflowRun.objects.filter(id__in=[r.id for r in runs])} == {RunStatus.NEEDS_ATTENTION}
    per_item = entries(action="run.cancel")
    assert per_item.count() == 3 and {e.outcome for e in per_item} == {AuditOutcome.DENIED}
    assert {e.object_id for e in per_item} == {str(r.id) for r in runs}


@pytest.mark.django_db
def test_it_refuses_per_item_the_approvals_of_runs_the_approver_started(people):
    ann = people["approver"]
    own = make_approval(run=make_run(status=RunStatus.WAITING, reason="", started_by=ann))
    others = [make_approval() for _ in range(2)]
    client = client_for(ann)
    token = token_of(preview(client, "approval.approve"))
    assert "1 of these approvals is of runs you started" in text(client.get(f"/bulk/{token}/"))
    assert confirm(client, token).status_code == 302
    batch = run_batch(token)
    assert (batch.ok, batch.refused) == (2, 1)
    own.refresh_from_db()
    assert own.state == ApprovalState.PENDING
    assert all(ApprovalRequest.objects.get(id=a.id).state == ApprovalState.APPROVED for a in others)
    refusal = entries(action="approval.approve", object_id=str(own.id)).get()
    assert refusal.outcome == AuditOutcome.REFUSED and "started this run and cannot approve" in refusal.message
    assert "cannot approve" in BulkItem.objects.get(batch=batch, object_id=str(own.id)).message


@pytest.mark.django_db
def test_it_skips_as_refused_an_item_whose_state_changed_since_the_preview(people):
    effects = [make_effect(step=f"s{i}") for i in range(3)]
    olga, oscar = people["operator"], people["operator2"]
    token = token_of(preview(client_for(olga), "effect.resolve"))
    assert resolve(client_for(oscar), effects[1]).status_code == 302  # someone resolves one by hand meanwhile
    assert confirm(client_for(olga), token, outcome="not_executed").status_code == 302
    batch = run_batch(token)
    assert (batch.ok, batch.refused) == (2, 1)
    moved = EffectRecord.objects.get(id=effects[1].id)
    assert (moved.status, moved.resolved_by_label) == (EffectStatus.SUCCEEDED, "oscar")  # not acted on again
    item = BulkItem.objects.get(batch=batch, object_id=str(effects[1].id))
    assert item.outcome == "refused" and "now SUCCEEDED" in item.message and "oscar" in item.message
    assert {EffectRecord.objects.get(id=e.id).status for e in (effects[0], effects[2])} == {EffectStatus.PENDING}  # not executed: retried with the same key


@pytest.mark.django_db
def test_it_writes_one_audit_entry_per_item_and_one_for_the_batch(people):
    effects = [make_effect(step=f"s{i}") for i in range(5)]
    client = client_for(people["operator"])
    token = token_of(preview(client, "effect.resolve"))
    assert confirm(client, token, outcome="succeeded", downstream_ref="mail-log-2026-12-01").status_code == 302
    batch = run_batch(token)
    assert batch.ok == 5
    per_item = entries(action="effect.resolve")
    assert sorted(int(e.object_id) for e in per_item) == sorted(e.id for e in effects)
    assert {(e.outcome, e.reason, e.actor_label) for e in per_item} == {
        (AuditOutcome.OK, "provider dashboards checked, ticket OPS-7", "olga")}
    assert all(e.before["state"] == "UNKNOWN" and e.after["state"] == "SUCCEEDED" for e in per_item)
    [whole] = entries(action="bulk.effect.resolve")
    assert (whole.object_type, whole.object_id, whole.after["items"]) == ("bulk_batch", str(batch.id), 5)
    assert whole.after["evidence"] == "mail-log-2026-12-01"
    assert entries().count() == 6
    assert {e.downstream_ref for e in EffectRecord.objects.all()} == {"mail-log-2026-12-01"}


@pytest.mark.django_db
def test_it_returns_the_same_batch_when_the_confirmation_is_submitted_again(people, django_capture_on_commit_callbacks):
    make_effect()
    client = client_for(people["operator"])
    token = token_of(preview(client, "effect.resolve"))
    with django_capture_on_commit_callbacks() as first:
        one = confirm(client, token, outcome="failed")
    with django_capture_on_commit_callbacks() as second:
        two = confirm(client, token, outcome="succeeded", downstream_ref="other")
    assert one["Location"] == two["Location"] == f"/bulk/{token}/"
    assert len(first) >= 1 and len(second) == 0  # queued once
    batch = BulkBatch.objects.get(token=token)
    assert (batch.state, batch.outcome) == (BulkState.QUEUED, "failed")
    assert entries(action="bulk.effect.resolve").count() == 1
    run_batch(token)
    assert batch_work(batch_id=batch.id) == "nothing to do"  # a second job: nothing done twice
    assert entries(action="effect.resolve").count() == 1


@pytest.mark.django_db
def test_it_keeps_a_batch_to_the_users_tenants_and_checks_each_item_again(people):
    olga = people["operator"]
    TenantScope.objects.create(user=olga, tenants=["acme"])
    ours = [make_effect(tenant="acme", step=f"a{i}") for i in range(3)]
    theirs = make_effect(tenant="globex", step="g")
    client = client_for(olga)
    token = token_of(preview(client, "effect.resolve"))
    assert BulkBatch.objects.get(token=token).total == 3  # globex's is not in it
    ticked = token_of(preview(client, "effect.resolve", ids=[ours[0].id, theirs.id]))
    assert BulkBatch.objects.get(token=ticked).total == 1
    assert confirm(client, token, outcome="failed").status_code == 302
    TenantScope.objects.filter(user=olga).update(tenants=["acme-ltd"])  # narrowed before the job runs
    batch = run_batch(token)
    assert (batch.ok, batch.denied) == (0, 3)
    assert {e.status for e in EffectRecord.objects.all()} == {EffectStatus.UNKNOWN}
    denied = entries(action="effect.resolve")
    assert denied.count() == 3 and {(e.outcome, e.message, e.tenant) for e in denied} == {
        (AuditOutcome.DENIED, "outside the user's tenants", "acme")}
    # Someone else's batch is not shown to a user limited to some tenants.
    assert client_for(people["operator2"]).get(f"/bulk/{token}/").status_code == 200  # sees every tenant
    TenantScope.objects.create(user=people["operator2"], tenants=["acme"])
    assert client_for(people["operator2"]).get(f"/bulk/{token}/").status_code == 404


@pytest.mark.django_db
def test_it_shows_the_batch_with_its_progress_and_what_was_refused(people):
    effects = [make_effect(step=f"s{i}") for i in range(2)]
    client = client_for(people["operator"])
    token = token_of(preview(client, "effect.resolve"))
    EffectRecord.objects.filter(id=effects[0].id).update(status=EffectStatus.FAILED_FINAL)
    confirm(client, token, outcome="failed", reason="<script>alert(1)</script> checked")
    run_batch(token)
    body = text(client.get(f"/bulk/{token}/"))
    assert re.search(r'<strong class="bulk-done">2</strong> of <strong>2</strong> done', body)
    assert '<progress class="bulk-progress" value="2" max="2"' in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt; checked" in body and "<script>alert" not in body
    assert "now FAILED" in body
    assert 'ws-connect="/ws/live/?fragments=bulk_batch&amp;batch=' in body


@pytest.mark.django_db(transaction=True)
def test_it_finishes_a_batch_after_its_worker_is_killed_mid_batch_without_acting_twice(people, procs):
    N = 400
    runs = WorkflowRun.objects.bulk_create(
        [WorkflowRun(workflow_name="qp_orders", version=1, definition_hash="a" * 64, status=RunStatus.WAITING,
                     business_key=f"k-{i}") for i in range(N)])
    client = client_for(people["operator"])
    token = token_of(preview(client, "run.cancel"))
    batch = BulkBatch.objects.get(token=token)
    assert batch.total == N
    first = procs.worker("bulk-w1", "tests.console.queue_data", "--concurrency", "2")  # takes both of its jobs
    assert confirm(client, token, reason="closing the old campaign").status_code == 302

    def progress() -> int:
        batch.refresh_from_db()
        return batch.ok
    wait_until(lambda: progress() >= CHUNK, 60, what="the first worker to make progress")
    first.kill()  # SIGKILL of its process group, mid-batch
    wait_sessions_gone("sagas_worker bulk-w1")  # whatever it had sent is committed or gone
    halfway = progress()
    assert CHUNK <= halfway < N, halfway
    assert BulkItem.objects.filter(batch=batch, outcome="pending").count() == N - halfway
    procs.worker("bulk-w2", "tests.console.queue_data")  # its sweeper gives the batch a new job after its lease
    wait_until(lambda: BulkBatch.objects.get(id=batch.id).state == BulkState.DONE, 90, what="the batch to finish")
    batch.refresh_from_db()
    assert (batch.ok, batch.refused, batch.denied) == (N, 0, 0)
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {RunStatus.CANCELLED}
    cancels = JournalEntry.objects.filter(kind=JournalKind.CANCELLED)
    assert cancels.count() == N and cancels.values("run_id").distinct().count() == N  # once each
    per_item = entries(action="run.cancel")
    assert per_item.count() == N and set(per_item.values_list("outcome", flat=True)) == {AuditOutcome.OK}
    assert entries().count() == N + 1


@pytest.mark.django_db
def test_it_refuses_an_item_that_fails_unexpectedly_and_still_does_the_others(people):
    runs = [make_run(business_key=f"gone-{i}") for i in range(3)]
    client = client_for(people["operator"])
    token = token_of(preview(client, "run.retry"))
    WorkflowRun.objects.filter(id=runs[1].id).delete()  # gone since the preview: its lock cannot be taken
    assert confirm(client, token).status_code == 302
    batch = run_batch(token)
    assert (batch.ok + batch.refused, batch.state) == (3, BulkState.DONE)
    gone = BulkItem.objects.get(batch=batch, object_id=str(runs[1].id))
    assert gone.outcome == "refused" and gone.message.startswith("failed: ")
    assert entries(action="run.retry", object_id=str(runs[1].id)).get().outcome == AuditOutcome.REFUSED
    assert entries(action="run.retry").count() == 3


@pytest.mark.django_db
def test_it_offers_the_bulk_bar_and_row_checkboxes_only_to_roles_that_may_use_them(people):
    effect = make_effect(connector="qp.lookup")
    approval = make_approval()
    run = make_run()
    checkbox = 'type="checkbox" name="ids" value="{}" form="bulk-form"'
    pages = (("/effects/?connector=qp.lookup", effect.id, "operator"), ("/approvals/", approval.id, "approver"),
             ("/runs/?status=NEEDS_ATTENTION", run.id, "operator"))
    for url, pk, role in pages:
        allowed = text(client_for(people[role]).get(url))
        assert checkbox.format(pk) in allowed and 'id="bulk-form"' in allowed, url
        viewer = text(client_for(people["viewer"]).get(url))
        assert 'name="ids"' not in viewer and 'id="bulk-form"' not in viewer, url
    bar = text(client_for(people["operator"]).get("/effects/?connector=qp.lookup"))
    assert '<input type="hidden" name="connector" value="qp.lookup">' in bar  # the filters go to the preview
    assert '<option value="effect.resolve">Resolve</option>' in bar


@pytest.mark.django_db
def test_it_takes_the_effects_queues_filters_for_everything_matching(people):
    make_effect(connector="qp.lookup", step="mail")
    make_effect(connector="qp.blind", step="charge")
    client = client_for(people["operator"])
    token = token_of(preview(client, "effect.resolve", connector="qp.lookup"))
    assert BulkBatch.objects.get(token=token).total == 1
    body = text(client.get(f"/bulk/{token}/"))
    assert "qp.lookup" in body and "charge" not in body
    assert preview(client, "effect.resolve", age="forever").status_code == 400  # a bad filter selects nothing


@pytest.mark.django_db
def test_it_gives_a_batch_whose_jobs_stopped_to_a_new_job_after_a_sweep(people):
    from django.utils import timezone

    from sagas.events import send_swept
    from sagas.runtime.queue import compensation_queue_name, get_queue

    make_effect()
    client = client_for(people["operator"])
    token = token_of(preview(client, "effect.resolve"))
    confirm(client, token, outcome="failed")  # its jobs' enqueueing waits for a commit this test never makes
    queue = get_queue(compensation_queue_name())
    BulkBatch.objects.filter(token=token).update(state=BulkState.RUNNING,
                                                 heartbeat_at=timezone.now() - timedelta(minutes=5))
    send_swept(None)
    assert [job.args for job in queue.get_jobs()] == [(BulkBatch.objects.get(token=token).id,)]
    send_swept(None)  # the heartbeat moved: not again until another lease has passed
    assert queue.count == 1
    assert timezone.now() - BulkBatch.objects.get(token=token).heartbeat_at < timedelta(seconds=30)


@pytest.mark.django_db
def test_it_refuses_a_selection_over_the_cap_and_stores_nothing(people, monkeypatch):
    monkeypatch.setattr("console.services.bulk.MAX_ITEMS", 2)
    for i in range(3):
        make_run(business_key=f"many-{i}")
    answer = preview(client_for(people["operator"]), "run.cancel")
    assert answer.status_code == 400 and "More than 2 objects match" in text(answer)
    assert not BulkBatch.objects.exists() and not BulkItem.objects.exists()
