"""Rejecting an approval stops the run and compensates it, so it takes a reason and a ticked
confirmation that says so; approving stays one click with an optional comment."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from console.user_audit import ACTION as ROLE_CHANGES
from operators.models import AuditEntry, AuditOutcome
from sagas.models import ApprovalRequest, ApprovalState, CompensationPlan, JournalEntry, RunStatus
from sagas.replay.engine import advance
from tests.console.conftest import client_for
from tests.console.run_data import waiting_run

pytestmark = pytest.mark.django_db

CONFIRM = "I understand the run will be compensated"


def decide(client, approval, **form):
    return client.post(reverse("console:approval_decide", args=[approval.id]), {"expected": "PENDING", **form})


def nothing_changed(run, approval) -> None:
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.state == ApprovalState.PENDING and approval.decided_by is None
    assert run.status == RunStatus.WAITING
    assert not JournalEntry.objects.filter(run=run, kind="approval_decided").exists()
    assert not AuditEntry.objects.exclude(action=ROLE_CHANGES).exists()


@pytest.mark.parametrize("form, says", [
    ({"comment": "", "confirm": "compensate"}, "A reason is required to reject"),
    ({"comment": "   ", "confirm": "compensate"}, "A reason is required to reject"),
    ({"comment": "wrong address"}, f"tick “{CONFIRM}” to confirm"),
    ({"comment": "wrong address", "confirm": "yes"}, f"tick “{CONFIRM}” to confirm"),
    ({"comment": "r" * 4001, "confirm": "compensate"}, "Comment is longer than 4000 characters"),
])
def test_it_refuses_a_rejection_without_a_reason_or_the_confirmation_and_changes_nothing(people, form, says):
    run = waiting_run("o-rej-1")
    approval = ApprovalRequest.objects.get(run=run)
    for htmx in (False, True):
        headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
        response = decide(client_for(people["approver"]), approval, decision="reject", **form, **headers)
        assert response.status_code == 400
        assert says in response.content.decode()
        nothing_changed(run, approval)


def test_it_rejects_with_a_reason_and_the_confirmation_and_the_run_compensates(people):
    run = waiting_run("o-rej-2")
    approval = ApprovalRequest.objects.get(run=run)
    response = decide(client_for(people["approver"]), approval, decision="reject",
                      comment="customer cancelled on the phone", confirm="compensate")
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.state == ApprovalState.REJECTED and approval.comment == "customer cancelled on the phone"
    entry = AuditEntry.objects.get(action="approval.reject")
    assert (entry.outcome, entry.reason, entry.actor_label) == (AuditOutcome.OK, "customer cancelled on the phone",
                                                                "ann")
    advance(str(run.id), owner="t")  # what the confirmation said: the run stops and is compensated
    run.refresh_from_db()
    plan = CompensationPlan.objects.get(run=run)
    assert plan.trigger == "rejection"
    assert run.status in (RunStatus.COMPENSATED, RunStatus.NEEDS_ATTENTION, RunStatus.COMPENSATING), run.status


def test_it_approves_in_one_click_with_or_without_a_comment(people):
    for who, comment in (("approver", ""), ("approver2", "address checked")):
        run = waiting_run(f"o-app-{who}")
        approval = ApprovalRequest.objects.get(run=run)
        response = decide(client_for(people[who]), approval, decision="approve", comment=comment)
        assert response.status_code == 302
        approval.refresh_from_db()
        assert approval.state == ApprovalState.APPROVED and approval.comment == comment


def test_it_shows_the_rejection_behind_its_own_step_with_what_it_will_compensate(people):
    run = waiting_run("o-rej-3")
    approval = ApprovalRequest.objects.get(run=run)
    html = client_for(people["approver"]).get(reverse("console:approvals")).content.decode()
    row = html[html.index(f'<tr id="approval-{approval.id}"'):html.index("</tr>", html.index(f'id="approval-{approval.id}"'))]
    approve_form = row[row.index(f'id="decide-{approval.id}"'):row.index("</form>")]
    assert 'value="approve"' in approve_form and 'value="reject"' not in approve_form
    assert re.search(r'<textarea name="comment"[^>]*>', approve_form) and " required" not in approve_form
    reject = row[row.index(f'<details class="reject" id="reject-{approval.id}"'):row.index("</details>")]
    assert '<summary data-row-action="reject">Reject…<span class="visually-hidden">' in reject  # + its run
    assert re.search(r'<textarea name="comment"[^>]*\brequired\b', reject)
    assert re.search(r'<input type="checkbox" name="confirm" value="compensate" required>\s*' + CONFIRM, reject)
    assert "compensates" in reject and "the 2 effects it has completed" in reject
    assert 'value="reject"' in reject and "Reject and compensate" in reject
    assert "onclick" not in row and "confirm(" not in row
