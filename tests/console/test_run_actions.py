"""The run actions (cancel, retry, compensate): who may, what they change, what is audited, and
the refusals of a stale page."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from operators.models import AuditOutcome
from sagas import start
from sagas.models import (
    CompensationItemState,
    CompensationPlan,
    JournalEntry,
    RunStatus,
)
from sagas.replay.engine import advance
from tests.console.conftest import client_for
from tests.console.run_data import (
    act,
    audits,
    parked_run,
    run_url,
    text,
    waiting_run,
)

pytestmark = pytest.mark.django_db


def test_it_lets_an_operator_cancel_a_run_and_audits_it(people):
    run = waiting_run()
    client = client_for(people["operator"])
    response = act(client, run, "cancel")

    assert response.status_code == 302 and response["Location"] == run_url(run)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    [entry] = audits(run, "run.cancel")
    assert (entry.outcome, entry.actor_label, entry.reason) == (AuditOutcome.OK, "olga", "customer asked on ticket 4411")
    assert entry.before["state"] == "WAITING" and entry.after["state"] == "CANCELLED"
    assert "Run cancelled." in text(client.get(run_url(run)))
    assert JournalEntry.objects.filter(run=run, kind="cancelled").exists()


def test_it_cancels_with_compensation_when_asked(people):
    run = waiting_run()
    response = act(client_for(people["operator"]), run, "cancel", compensate="on")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING
    assert CompensationPlan.objects.get(run=run).trigger == "cancel"


def test_it_lets_an_operator_retry_a_run_that_used_up_its_budget(people):
    run = parked_run()
    client = client_for(people["operator"])
    page = text(client.get(run_url(run)))
    assert reverse("console:run_retry", args=[run.id]) in page

    response = act(client, run, "retry")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING and run.max_steps == 2
    [entry] = audits(run, "run.retry")
    assert entry.outcome == AuditOutcome.OK and entry.before["state"] == "NEEDS_ATTENTION"


def test_it_previews_the_compensation_plan_and_starts_it_on_confirmation(people):
    run = waiting_run("o-9")
    client = client_for(people["operator"])

    preview = text(client.get(run_url(run, "console:run_compensate")))
    assert re.findall(r"<td><bdi>(ship|charge)</bdi></td>", preview) == ["ship", "charge"]  # newest first
    assert "IRREVERSIBLE" in preview and "reversible" in preview and "sh-o-9" in preview
    assert f"{run.id}:charge:compensate" in preview
    assert 'name="expected" value="WAITING"' in preview
    assert not CompensationPlan.objects.filter(run=run).exists()  # a preview writes nothing

    response = act(client, run, "compensate")
    assert response.status_code == 302 and response["Location"] == run_url(run)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING
    [entry] = audits(run, "run.compensate")
    assert entry.outcome == AuditOutcome.OK and entry.after["state"] == "COMPENSATING"

    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATED
    plan = CompensationPlan.objects.get(run=run)
    states = dict(plan.items.values_list("step_name", "state"))
    assert states == {"ship": CompensationItemState.IRREVERSIBLE, "charge": CompensationItemState.SUCCEEDED}
    page = text(client.get(run_url(run)))
    assert 'id="live-run_compensation"' in page and "nothing can undo it" in page and "Compensation started" in page


@pytest.mark.parametrize("name", ["cancel", "retry", "compensate"])
def test_it_denies_a_viewer_every_run_action_and_audits_the_attempt(people, name):
    run = parked_run()
    response = act(client_for(people["viewer"]), run, name)

    assert response.status_code == 403
    assert "needs the operator role" in text(response)
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION
    [entry] = audits(run, f"run.{name}")
    assert entry.outcome == AuditOutcome.DENIED and entry.actor_label == "vera"


@pytest.mark.parametrize("name", ["cancel", "retry", "compensate"])
def test_it_refuses_an_action_on_a_run_that_changed_since_the_page_loaded(people, name):
    run = parked_run()
    response = act(client_for(people["operator"]), run, name, expected=RunStatus.WAITING)

    assert response.status_code == 409
    assert "it changed since you loaded the page" in text(response)
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION and not CompensationPlan.objects.filter(run=run).exists()
    [entry] = audits(run, f"run.{name}")
    assert entry.outcome == AuditOutcome.REFUSED


def test_it_refuses_an_action_the_run_no_longer_allows(people):
    run = start("rp_plain", {})
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    response = act(client_for(people["operator"]), run, "cancel")
    assert response.status_code == 409 and "already COMPLETED" in text(response)


def test_it_requires_a_reason_and_the_status_seen(people):
    run = waiting_run()
    client = client_for(people["operator"])
    assert act(client, run, "cancel", reason="  ").status_code == 400
    assert act(client, run, "cancel", expected="").status_code == 400
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and not audits(run, "run.cancel")


def test_it_refuses_an_action_without_a_csrf_token(people):
    run = waiting_run()
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    assert act(client, run, "cancel").status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


def test_it_answers_htmx_with_the_actions_region_and_the_new_header(people):
    run = waiting_run()
    client = client_for(people["operator"])

    response = client.post(reverse("console:run_cancel", args=[run.id]),
                           {"reason": "duplicate order", "expected": "WAITING"}, HTTP_HX_REQUEST="true")
    html = text(response)
    assert response.status_code == 200 and "<html" not in html
    assert 'id="live-run_actions"' in html and "Run cancelled." in html
    assert 'id="live-run_header" class="run-header" hx-swap-oob="morph"' in html and "CANCELLED" in html

    stale = client.post(reverse("console:run_cancel", args=[run.id]),
                        {"reason": "again", "expected": "WAITING"}, HTTP_HX_REQUEST="true")
    assert stale.status_code == 409 and 'id="live-run_actions"' in text(stale)
    assert "it changed since you loaded the page" in text(stale)
