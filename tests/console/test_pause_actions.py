"""Pause and resume on the console: a run's (run page) and a workflow's (versions page). Who may,
what changes, what is audited, what the pages then say, and the refusals of a stale page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from operators.models import AuditEntry, AuditOutcome, TenantScope
from sagas.models import JournalEntry, RunStatus, WorkflowPause, WorkflowRun
from sagas.replay.engine import Outcome, advance
from tests.console.conftest import client_for
from tests.console.run_data import act, audits, run_url, text, waiting_run

pytestmark = pytest.mark.django_db


def test_an_operator_pauses_and_resumes_a_run_and_each_is_audited_and_journaled(people):
    run = waiting_run()
    client = client_for(people["operator"])
    page = text(client.get(run_url(run)))
    assert reverse("console:run_pause", args=[run.id]) in page
    assert reverse("console:run_resume", args=[run.id]) not in page  # nothing to resume yet

    assert act(client, run, "pause", reason="checking <b>tax</b> rounding").status_code == 302
    held = text(client.get(run_url(run)))
    assert 'class="badge PAUSED"' in held and "Paused by <bdi>olga</bdi>" in held
    assert "checking &lt;b&gt;tax&lt;/b&gt; rounding" in held  # the reason, escaped
    assert reverse("console:run_resume", args=[run.id]) in held
    [paused] = audits(run, "run.pause")
    assert paused.outcome == AuditOutcome.OK and (paused.before["paused"], paused.after["paused"]) == (False, True)

    overview = text(client.get(reverse("console:overview")))
    assert "Paused runs" in overview
    listed = text(client.get(reverse("console:runs") + "?paused=1"))
    assert str(run.id) in listed

    assert act(client, run, "resume", reason="rounding is fine").status_code == 302
    run.refresh_from_db()
    assert run.paused_at is None and run.status == RunStatus.WAITING
    [resumed] = audits(run, "run.resume")
    assert resumed.outcome == AuditOutcome.OK and resumed.after["paused"] is False
    names = list(JournalEntry.objects.filter(run=run, kind="operator_action").values_list("name", flat=True))
    assert names == ["pause", "resume"]
    assert str(run.id) not in text(client.get(reverse("console:runs") + "?paused=1"))


def test_a_viewer_is_denied_a_pause_and_a_second_pause_is_refused_as_already_paused(people):
    run = waiting_run()
    viewer = client_for(people["viewer"])
    assert reverse("console:run_pause", args=[run.id]) not in text(viewer.get(run_url(run)))
    assert act(viewer, run, "pause").status_code == 403
    [denied] = audits(run, "run.pause")
    assert denied.outcome == AuditOutcome.DENIED
    assert WorkflowRun.objects.get(id=run.id).paused_at is None

    first, second = client_for(people["operator"]), client_for(people["operator2"])
    assert act(first, run, "pause").status_code == 302
    refused = act(second, run, "pause")  # a page loaded before the first pause, submitted after it
    assert refused.status_code == 409 and "already paused" in text(refused)
    outcomes = [a.outcome for a in sorted(audits(run, "run.pause"), key=lambda a: a.id)]
    assert outcomes == [AuditOutcome.DENIED, AuditOutcome.OK, AuditOutcome.REFUSED]


def test_a_malformed_pause_is_answered_400_and_changes_nothing(people):
    run = waiting_run()
    answer = act(client_for(people["operator"]), run, "pause", reason="")
    assert answer.status_code == 400 and "A reason is required" in text(answer)
    assert WorkflowRun.objects.get(id=run.id).paused_at is None and not audits(run, "run.pause")


def _workflow_post(client, action: str, name: str = "rp_charge_ship_wait", **data):
    form = {"workflow": name, "reason": "provider incident", "version": "",
            "expected": "paused" if action == "resume" else "running"}
    form.update(data)
    return client.post(reverse(f"console:workflow_{action}"), form)


def test_an_operator_pauses_a_workflow_on_the_versions_page_and_its_runs_wait(people):
    run = waiting_run()
    client = client_for(people["operator"])
    page = text(client.get(reverse("console:versions")))
    assert reverse("console:workflow_pause") in page and 'value="rp_charge_ship_wait"' in page

    assert _workflow_post(client, "pause", version="1").status_code == 302
    pause = WorkflowPause.objects.get()
    assert (pause.workflow_name, pause.version, pause.paused_by_label) == ("rp_charge_ship_wait", 1, "olga")
    versions = text(client.get(reverse("console:versions")))
    assert "Version 1 paused by <bdi>olga</bdi>" in versions
    held = text(client.get(run_url(run)))
    assert "Held by the pause of <bdi>rp_charge_ship_wait</bdi> (version 1)" in held
    [entry] = AuditEntry.objects.filter(action="workflow.pause")
    assert (entry.object_type, entry.object_id, entry.outcome) == ("workflow", "rp_charge_ship_wait v1", "ok")

    again = _workflow_post(client_for(people["operator2"]), "pause", version="1")  # a stale page
    assert again.status_code == 409 and "is now paused by olga" in text(again)

    WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.PENDING)
    assert advance(str(run.id), owner="t") == Outcome.NOT_CLAIMED
    assert _workflow_post(client, "resume", version="1").status_code == 302
    assert not WorkflowPause.objects.exists()
    assert AuditEntry.objects.filter(action="workflow.resume", outcome="ok").count() == 1


def test_a_workflow_pause_is_denied_to_a_viewer_and_to_an_operator_limited_to_some_tenants(people):
    assert _workflow_post(client_for(people["viewer"]), "pause").status_code == 403
    limited = people["operator2"]
    TenantScope.objects.create(user=limited, tenants=["acme"])
    page = text(client_for(limited).get(reverse("console:versions")))
    assert reverse("console:workflow_pause") not in page
    answer = _workflow_post(client_for(limited), "pause")
    assert answer.status_code == 403
    assert not WorkflowPause.objects.exists()
    assert [e.outcome for e in AuditEntry.objects.filter(action="workflow.pause")] == ["denied", "denied"]
    bad = _workflow_post(client_for(people["operator"]), "pause", version="two")
    assert bad.status_code == 400 and "is not a version number" in text(bad)
