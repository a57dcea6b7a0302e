"""The approvals inbox: open approvals by deadline, deciding, four eyes, and who may decide."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from console.user_audit import ACTION as ROLE_CHANGES  # the fixture's role grants
from operators.models import AuditEntry, AuditOutcome
from sagas import start
from sagas.models import (
    ApprovalRequest,
    ApprovalState,
    JournalEntry,
    RunStatus,
)
from sagas.replay.engine import advance
from tests.console.conftest import client_for
from tests.console.queue_data import (
    make_approval,
    make_run,
    text,
)

pytestmark = pytest.mark.django_db


def test_it_lists_open_approvals_soonest_deadline_first_with_a_countdown(people):
    later = make_approval(deadline_in=timedelta(hours=3), step="later")
    sooner = make_approval(deadline_in=timedelta(minutes=30), step="sooner")
    escalated = make_approval(deadline_in=-timedelta(minutes=10), step="escalated", state=ApprovalState.ESCALATED,
                              run=make_run(status=RunStatus.NEEDS_ATTENTION, reason="approval_escalated"))
    finished = make_approval(step="finished", run=make_run(status=RunStatus.CANCELLED, reason=""))
    decided = make_approval(step="decided", state=ApprovalState.APPROVED, decided_by_label="abe",
                            decided_at=timezone.now(), comment="looks right")

    page = text(client_for(people["approver"]).get(reverse("console:approvals")))

    inbox = page.split("Recently decided")[0]
    assert re.findall(r'id="approval-(\d+)"', inbox) == [str(escalated.id), str(sooner.id), str(later.id)]
    assert f'id="approval-{finished.id}"' not in page
    assert f'id="approval-{decided.id}"' in page.split("Recently decided")[1] and "looks right" in page
    assert "ESCALATED" in inbox and "overdue by 10m" in inbox
    assert re.search(r'data-deadline="[^"]+">29m \d+s left<', inbox)
    assert f'href="/runs/{later.run_id}/"' in inbox
    assert "console/countdown.js" in page
    assert inbox.count('value="approve"') == 3 and inbox.count('value="reject"') == 3


def test_it_approves_as_approver_and_wakes_the_run(people):
    run = start("qp_ship", {"id": "o-7"}, started_by=people["operator"])
    advance(str(run.id), owner="test-worker")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    approval = ApprovalRequest.objects.get(run=run)
    client = client_for(people["approver"])
    assert "Irreversible: ship order o-7" in text(client.get(reverse("console:approvals")))

    response = client.post(reverse("console:approval_decide", args=[approval.id]),
                           {"decision": "approve", "comment": "checked the address", "expected": "PENDING"})

    assert response.status_code == 302 and response["Location"] == reverse("console:approvals")
    page = text(client.get(response["Location"]))
    assert "Approved “ship”" in page
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.state == ApprovalState.APPROVED and approval.decided_by == people["approver"]
    assert approval.comment == "checked the address"
    assert run.status == RunStatus.PENDING
    assert JournalEntry.objects.filter(run=run, kind="approval_decided").exists()
    entry = AuditEntry.objects.get(action="approval.approve")
    assert entry.outcome == AuditOutcome.OK and entry.before["state"] == "PENDING"
    assert entry.after["state"] == "APPROVED"


def test_it_refuses_the_runs_starter_four_eyes(people):
    approval = make_approval(run=make_run(status=RunStatus.WAITING, reason="", started_by=people["approver"]))
    client = client_for(people["approver"])
    page = text(client.get(reverse("console:approvals")))
    assert "You started this run and cannot approve its steps" in page
    assert 'value="approve"' not in page

    response = client.post(reverse("console:approval_decide", args=[approval.id]),
                           {"decision": "approve", "expected": "PENDING"})
    assert response.status_code == 409
    assert "ann started this run and cannot approve its steps" in text(response)
    approval.refresh_from_db()
    assert approval.state == ApprovalState.PENDING
    assert AuditEntry.objects.exclude(action=ROLE_CHANGES).get().outcome == AuditOutcome.REFUSED


def test_it_refuses_a_double_decision_with_who_and_when(people):
    approval = make_approval()
    assert client_for(people["approver"]).post(reverse("console:approval_decide", args=[approval.id]),
                                               {"decision": "approve", "expected": "PENDING"}).status_code == 302
    approval.refresh_from_db()

    response = client_for(people["approver2"]).post(reverse("console:approval_decide", args=[approval.id]),
                                                    {"decision": "reject", "comment": "wrong address",
                                                     "confirm": "compensate", "expected": "PENDING"})

    assert response.status_code == 409
    assert f"already approved by ann at {approval.decided_at:%Y-%m-%d %H:%M:%S} UTC" in text(response)
    approval.refresh_from_db()
    assert approval.state == ApprovalState.APPROVED and approval.decided_by == people["approver"]


def test_it_denies_an_operator_deciding_an_approval(people):
    approval = make_approval()
    response = client_for(people["operator"]).post(reverse("console:approval_decide", args=[approval.id]),
                                                   {"decision": "approve", "expected": "PENDING"})
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.state == ApprovalState.PENDING
    assert AuditEntry.objects.exclude(action=ROLE_CHANGES).get().outcome == AuditOutcome.DENIED
    bad = client_for(people["approver"]).post(reverse("console:approval_decide", args=[approval.id]),
                                              {"decision": "maybe"})
    assert bad.status_code == 400
