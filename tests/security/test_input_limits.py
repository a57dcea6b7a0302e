"""Limits on what anyone can send: free text is capped server-side (a clear 400, nothing stored),
a NUL or an out-of-range value is a 400 with a message and never a 500, a denied attempt is
audited whatever it carried (clipped, so it cannot bloat the append-only log), and input that
comes back in a page is escaped."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import EffectStatus
from operators.models import AuditEntry, AuditOutcome
from sagas.models import ApprovalState, RunStatus, WorkflowRun, WorkflowVersion
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_effect, make_run, resolve

pytestmark = pytest.mark.django_db

IMG = "<img src=x onerror=alert(1)>"
SCRIPT = '"><script>alert(1)</script>'


def _cancel(client, run, reason: str):
    return client.post(reverse("console:run_cancel", args=[run.id]), {"reason": reason, "expected": run.status})


def _entries(run) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(object_type="run", object_id=str(run.id)))


def _parked_run() -> WorkflowRun:
    return make_run(status=RunStatus.NEEDS_ATTENTION, reason="budget_exceeded")


def test_it_audits_a_viewers_2_mb_reason_clipped(people):
    run = _parked_run()
    response = _cancel(client_for(people["viewer"]), run, "r" * 2_000_000)

    assert response.status_code == 403
    [entry] = _entries(run)
    assert entry.outcome == AuditOutcome.DENIED and entry.actor_label == "vera"
    assert len(entry.reason) <= 4100
    assert entry.reason.startswith("r" * 4000) and entry.reason.endswith("… [cut, 2000000 chars]")
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION


def test_it_audits_a_viewers_reason_with_a_nul(people):
    run = _parked_run()
    response = _cancel(client_for(people["viewer"]), run, "stop\x00it")

    assert response.status_code == 403
    [entry] = _entries(run)
    assert entry.outcome == AuditOutcome.DENIED and entry.reason == "stopit"


def test_it_audits_an_attempt_by_someone_with_no_console_role(people):
    run = _parked_run()
    response = _cancel(client_for(people["nobody"]), run, "stop\x00" + "r" * 10_000)

    assert response.status_code == 403
    [entry] = _entries(run)
    assert entry.outcome == AuditOutcome.DENIED and entry.actor_label == "nils" and entry.action == "run.cancel"
    assert entry.reason.startswith("stoprrr") and len(entry.reason) <= 4100
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION


def test_it_audits_a_denied_approval_decision_whatever_the_decision_says(people):
    approval = make_approval()
    response = client_for(people["operator"]).post(reverse("console:approval_decide", args=[approval.id]),
                                                   {"decision": "maybe\x00", "comment": "x" * 5000})
    assert response.status_code == 403
    [entry] = AuditEntry.objects.filter(object_type="approval", object_id=str(approval.id))
    assert entry.outcome == AuditOutcome.DENIED and len(entry.reason) <= 4100


def test_it_refuses_an_operators_4001_character_reason_and_stores_nothing_then_takes_4000(people):
    run = _parked_run()
    client = client_for(people["operator"])
    response = _cancel(client, run, "r" * 4001)

    assert response.status_code == 400
    assert "Reason is longer than 4000 characters (it has 4001)" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert _entries(run) == []

    assert _cancel(client, run, "r" * 4000).status_code == 302
    run.refresh_from_db()
    assert run.status != RunStatus.NEEDS_ATTENTION
    [entry] = _entries(run)
    assert entry.outcome == AuditOutcome.OK and entry.reason == "r" * 4000


def test_it_refuses_an_operators_nul_reason_and_stores_nothing(people):
    run = _parked_run()
    response = _cancel(client_for(people["operator"]), run, "stop\x00it")

    assert response.status_code == 400
    assert "Reason contains a NUL character" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION and _entries(run) == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"note": "n" * 4001}, "Evidence is longer than 4000 characters"),
        ({"note": "seen\x00"}, "Evidence contains a NUL character"),
        ({"downstream_ref": "c" * 301}, "Downstream reference is longer than 300 characters"),
        ({"expected": "UNKNOWN\x00"}, "contains a NUL character"),
    ],
)
def test_it_refuses_an_overlong_or_unstorable_resolution_and_stores_nothing(people, fields, message):
    effect = make_effect()
    response = resolve(client_for(people["operator"]), effect, **fields)

    assert response.status_code == 400
    assert message in response.content.decode()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN and effect.resolved_at is None
    assert not AuditEntry.objects.filter(object_type="effect").exists()


def test_it_refuses_an_overlong_approval_comment_and_stores_nothing(people):
    approval = make_approval()
    response = client_for(people["approver"]).post(reverse("console:approval_decide", args=[approval.id]),
                                                   {"decision": "approve", "comment": "c" * 4001,
                                                    "expected": "PENDING"})
    assert response.status_code == 400
    assert "Comment is longer than 4000 characters" in response.content.decode()
    approval.refresh_from_db()
    assert approval.state == ApprovalState.PENDING
    assert not AuditEntry.objects.filter(object_type="approval").exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"q": "\x00"}, "Search contains a NUL character"),
        ({"tenant": "a\x00b"}, "Tenant contains a NUL character"),
        ({"workflow": "w\x00"}, "Workflow contains a NUL character"),
        ({"to": "9999-12-31"}, "is out of range"),
        ({"from": "x" * 41}, "Created from is longer than 40 characters"),
    ],
)
def test_it_answers_a_nul_or_out_of_range_runs_filter_with_a_message(people, params, message):
    make_run()
    response = client_for(people["viewer"]).get(reverse("console:runs"), params)
    assert response.status_code == 400  # the page, with the form's message and no rows
    page = response.content.decode()
    assert message in page and not re.search(r'href="/runs/[0-9a-f-]{36}/"', page)


@pytest.mark.parametrize("payload", [IMG, SCRIPT])
def test_it_escapes_a_hostile_effects_cursor(people, payload):
    response = client_for(people["operator"]).get(reverse("console:effects"), {"after": payload})
    body = response.content.decode()
    assert response.status_code == 400
    assert "not a page cursor" in body
    assert payload not in body
    assert payload.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;") in body


def test_it_escapes_hostile_workflow_names_in_the_diff_refusal(people):
    a, b = (WorkflowVersion.objects.create(name=name, version=1, definition_hash=name[1] * 64, source="x = 1\n",
                                           module="m") for name in (IMG, SCRIPT))
    response = client_for(people["viewer"]).get(reverse("console:version_diff"), {"a": a.id, "b": b.id})
    body = response.content.decode()
    assert response.status_code == 400 and response["Content-Type"].startswith("text/html")
    assert "Only versions of one workflow can be compared" in body
    assert IMG not in body and SCRIPT not in body
    assert "&lt;img src=x onerror=alert(1)&gt;" in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body


@pytest.mark.parametrize("username", ["u" * 5000, "vera\x00"])
def test_it_answers_an_overlong_or_nul_username_as_a_failed_login(people, username):
    response = Client().post(reverse("console:login"), {"username": username, "password": "x" * 5000})
    assert response.status_code == 200 and "Wrong username or password." in response.content.decode()


def test_it_caps_the_resolution_evidence_in_the_browser_where_the_server_does(people):
    make_effect()
    page = client_for(people["operator"]).get(reverse("console:effects")).content.decode()
    assert re.search(r'<textarea name="note"[^>]*\bmaxlength="4000"', page)
