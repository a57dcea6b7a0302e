"""Dual control: a dangerous action one operator asks for waits until a different one confirms it
with a reason, before a deadline; the rule is a setting per action and tenant; both halves are
audited; the HTTP API follows the same rule."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from api.keys import apikey_create
from console.models import BulkBatch, BulkState
from console.notifications.bodies import body_for
from console.notifications.dual import _item as dual_item
from console.notifications.models import NotificationDelivery
from console.services.bulk import batch_work
from ledger.models import EffectRecord
from operators.models import AuditEntry, AuditOutcome, DualControlRequest, DualState
from sagas.events import send_swept
from sagas.models import CompensationPlan, RunStatus, WorkflowRun
from tests.api.actions_data import call
from tests.console.conftest import client_for
from tests.console.queue_data import make_effect, resolve
from tests.console.run_data import act, run_url, text, waiting_run
from tests.console.test_bulk_actions import confirm, preview, token_of
from tests.console.test_notifications import endpoint

pytestmark = pytest.mark.django_db

COMPENSATION_NEEDS_TWO = {"run.compensate": ["*"]}


def _entries(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).order_by("id"))


def _decide(client, request: DualControlRequest, verb: str, reason: str = "checked the order with finance"):
    return client.post(reverse(f"console:dual_{verb}", args=[request.pk]), {"reason": reason})


def test_a_compensation_waits_for_a_second_operator_who_confirms_it(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    olga, oscar = client_for(people["operator"]), client_for(people["operator2"])

    asked = act(olga, run, "compensate")
    assert asked.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and not CompensationPlan.objects.filter(run=run).exists()
    [request] = DualControlRequest.objects.all()
    assert (request.state, request.requested_by_label, request.action) == (DualState.PENDING, "olga", "run.compensate")
    run_page = text(olga.get(run_url(run)))
    assert "needs a second person" in run_page  # the notice of the request
    assert f'id="run-dual-{request.pk}"' in run_page and "waits for a second person" in run_page  # and while it waits
    again = act(client_for(people["operator2"]), run, "compensate")  # asked again: one request, one confirmation
    assert again.status_code == 409 and f"Request #{request.pk}" in text(again)
    assert DualControlRequest.objects.count() == 1
    [asked_entry] = _entries("dual.request")
    assert (asked_entry.actor_label, asked_entry.object_id, asked_entry.outcome) == ("olga", str(run.id), "ok")

    inbox = text(oscar.get(reverse("console:approvals")))
    assert f"Compensate run {run.id}" in inbox and reverse("console:dual_confirm", args=[request.pk]) in inbox

    done = _decide(oscar, request, "confirm")
    assert done.status_code == 302
    run.refresh_from_db()
    request.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING
    assert (request.state, request.decided_by_label) == (DualState.CONFIRMED, "oscar")
    asked_twice, compensated = _entries("run.compensate")  # oscar's own ask, refused, then the confirmation
    assert (asked_twice.actor_label, asked_twice.outcome) == ("oscar", AuditOutcome.REFUSED)
    assert (compensated.actor_label, compensated.outcome, compensated.reason) == ("oscar", "ok",
                                                                                  "customer asked on ticket 4411")
    [confirmed] = _entries("dual.confirm")
    assert (confirmed.actor_label, confirmed.reason) == ("oscar", "checked the order with finance")
    assert confirmed.after["requested_by"] == "olga"


def test_the_requester_cannot_confirm_their_own_request(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    olga = client_for(people["operator"])
    act(olga, run, "compensate")
    request = DualControlRequest.objects.get()

    answer = _decide(olga, request, "confirm")

    assert answer.status_code == 403
    assert "another person must confirm it" in text(answer)
    run.refresh_from_db()
    request.refresh_from_db()
    assert run.status == RunStatus.WAITING and request.state == DualState.PENDING
    [refused] = _entries("dual.confirm")
    assert (refused.actor_label, refused.outcome) == ("olga", AuditOutcome.REFUSED)


def test_a_request_past_its_deadline_can_no_longer_be_confirmed(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    act(client_for(people["operator"]), run, "compensate")
    request = DualControlRequest.objects.get()
    DualControlRequest.objects.filter(pk=request.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    oscar = client_for(people["operator2"])

    answer = _decide(oscar, request, "confirm")

    assert answer.status_code == 409 and "expired" in text(answer)
    request.refresh_from_db()
    run.refresh_from_db()
    assert request.state == DualState.EXPIRED and run.status == RunStatus.WAITING
    assert f"Compensate run {run.id}" not in text(oscar.get(reverse("console:approvals")))


def test_a_refused_request_does_nothing_and_cannot_be_confirmed_after(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    act(client_for(people["operator"]), run, "compensate")
    request = DualControlRequest.objects.get()
    oscar = client_for(people["operator2"])

    assert _decide(oscar, request, "refuse", "the customer kept the order").status_code == 302
    again = _decide(oscar, request, "confirm")

    assert again.status_code == 409 and "refused by oscar" in text(again)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert [e.outcome for e in _entries("dual.refuse")] == ["ok"]


def test_a_run_that_moved_on_since_the_request_is_not_compensated_on_confirmation(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    act(client_for(people["operator"]), run, "compensate")
    request = DualControlRequest.objects.get()
    act(client_for(people["operator"]), run, "cancel")  # not under the rule: done at once
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED

    answer = _decide(client_for(people["operator2"]), request, "confirm")

    assert answer.status_code == 409 and "is now CANCELLED" in text(answer)
    request.refresh_from_db()
    assert request.state == DualState.FAILED and "CANCELLED" in request.result
    assert not CompensationPlan.objects.filter(run=run).exists()


def test_the_rule_is_per_tenant_and_per_outcome(people, settings):
    settings.SAGA_DUAL_CONTROL = {"run.compensate": ["acme"], "effect.resolve_unsafe": ["*"]}
    run = waiting_run()  # tenant "default": not covered
    olga = client_for(people["operator"])
    assert act(olga, run, "compensate").status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING and not DualControlRequest.objects.exists()

    safe, unsafe = make_effect(step="safe"), make_effect(step="unsafe")
    assert resolve(olga, safe).status_code == 302  # succeeded: cannot charge twice, no second person
    safe.refresh_from_db()
    assert safe.status == "SUCCEEDED"
    assert resolve(olga, unsafe, outcome="not_executed", downstream_ref="").status_code == 302
    unsafe.refresh_from_db()
    assert unsafe.status == "UNKNOWN"
    [request] = DualControlRequest.objects.all()
    assert request.summary == f"Resolve effect {unsafe.id} as not executed"

    assert _decide(client_for(people["operator2"]), request, "confirm").status_code == 302
    unsafe.refresh_from_db()
    request.refresh_from_db()
    assert unsafe.status == "PENDING" and request.state == DualState.CONFIRMED  # to be done again, as resolved


def test_the_api_answers_202_and_a_second_key_confirms(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    first = apikey_create(name="ops-bot", role="operator")[1]
    second = apikey_create(name="ops-bot-2", role="operator")[1]
    viewer = apikey_create(name="auditor", role="viewer")[1]
    run = waiting_run()

    asked = call("post", f"/runs/{run.id}/compensate", first, {"reason": "refund ticket 7", "expected": "WAITING"})
    assert asked.status_code == 202
    request_id = asked.json()["dual_control"]["id"]
    assert asked.json()["dual_control"]["state"] == "PENDING" and "second person" in asked.json()["message"]
    assert [r["id"] for r in call("get", "/dual-control", viewer).json()] == [request_id]

    own = call("post", f"/dual-control/{request_id}/confirm", first, {"reason": "me again"})
    assert own.status_code == 403 and own.json()["type"].endswith("/second-person")
    no_role = call("post", f"/dual-control/{request_id}/confirm", viewer, {"reason": "looks fine"})
    assert no_role.status_code == 403
    no_reason = call("post", f"/dual-control/{request_id}/confirm", second, {"reason": ""})
    assert no_reason.status_code == 400

    done = call("post", f"/dual-control/{request_id}/confirm", second, {"reason": "checked with finance"})
    assert done.status_code == 200 and done.json()["state"] == "CONFIRMED"
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING
    twice = call("post", f"/dual-control/{request_id}/confirm", second, {"reason": "checked with finance"})
    assert twice.status_code == 409
    assert call("get", "/dual-control", viewer).json() == []
    assert call("post", "/dual-control/999999/confirm", second, {"reason": "x"}).status_code == 404


def test_hostile_text_in_a_request_is_shown_escaped(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    act(client_for(people["operator"]), run, "compensate", reason='<img src=x onerror="alert(1)">')
    inbox = text(client_for(people["operator2"]).get(reverse("console:approvals")))
    assert '<img src=x onerror="alert(1)">' not in inbox
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in inbox


def test_a_misspelt_rule_stops_the_start_instead_of_protecting_nothing(settings):
    settings.SAGA_DUAL_CONTROL = {"run.compensat": ["*"]}
    with pytest.raises(SystemCheckError, match="unknown rule.*run.compensat"):
        call_command("check")


def test_a_large_bulk_batch_waits_for_a_second_person_then_runs_as_confirmed(people, settings):
    settings.SAGA_DUAL_CONTROL = {"bulk": ["*"], "effect.resolve_unsafe": ["*"]}
    settings.SAGA_DUAL_CONTROL_BULK_ITEMS = 3
    effects = [make_effect(step=f"s{i}") for i in range(3)]
    olga = client_for(people["operator"])
    token = token_of(preview(olga, "effect.resolve"))

    asked = confirm(olga, token, outcome="succeeded", downstream_ref="mail-log-2026-12-01")
    assert asked.status_code == 302 and asked["Location"] == reverse("console:approvals")
    batch = BulkBatch.objects.get(token=token)
    assert batch.state == BulkState.DRAFT  # nothing queued
    [request] = DualControlRequest.objects.all()
    assert (request.policy, request.object_type, request.action) == ("bulk", "bulk", "effect.resolve")
    assert request.summary == f"Resolve: 3 effects (bulk batch {batch.id})"

    assert _decide(client_for(people["operator2"]), request, "confirm").status_code == 302
    batch.refresh_from_db()
    assert batch.state == BulkState.QUEUED
    assert batch_work(batch_id=batch.id) == "done"  # items under the confirmed batch: no new request per item
    assert {e.status for e in EffectRecord.objects.filter(id__in=[e.id for e in effects])} == {"SUCCEEDED"}
    assert DualControlRequest.objects.count() == 1
    [whole] = _entries("bulk.effect.resolve")
    assert whole.actor_label == "oscar"


def test_a_request_is_notified_once_to_the_endpoints_that_want_it(people, settings,
                                                                 django_capture_on_commit_callbacks):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    endpoint("ops", kinds=["dual_control"])
    endpoint("acme-only", kinds=["dual_control"], tenants=["acme"])
    endpoint("failures", kinds=["run_failed"])
    with django_capture_on_commit_callbacks(execute=True):
        act(client_for(people["operator"]), run, "compensate", reason="refund <b>ticket</b> 7")
    request = DualControlRequest.objects.get()

    [delivery] = NotificationDelivery.objects.all()
    assert (delivery.endpoint.name, delivery.kind, delivery.item) == ("ops", "dual_control", f"dual:{request.pk}")
    send_swept(report=None)  # the sweeper's pass looks again: nothing twice
    assert NotificationDelivery.objects.count() == 1
    body = body_for(dual_item(request), "generic", delivery_id=delivery.id)
    NotificationDelivery.objects.all().delete()  # as if the signal had been lost with its process
    send_swept(report=None)
    assert list(NotificationDelivery.objects.values_list("endpoint__name", "item")) == [("ops", f"dual:{request.pk}")]
    assert f"Compensate run {run.id}, asked by olga" in body["summary"]
    assert (body["run_id"], body["requested_by"], body["reason"]) == (str(run.id), "olga", "refund <b>ticket</b> 7")
    assert body["link"].endswith(f"/approvals/#dual-{request.pk}")


def test_a_run_that_changed_and_came_back_to_the_same_status_is_not_acted_on(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    act(client_for(people["operator"]), run, "compensate")
    request = DualControlRequest.objects.get()
    WorkflowRun.objects.filter(id=run.id).update(fence=F("fence") + 1)  # a worker claimed it meanwhile; WAITING again

    answer = _decide(client_for(people["operator2"]), request, "confirm")

    assert answer.status_code == 409 and "changed since the request was made (fence" in text(answer)
    request.refresh_from_db()
    assert request.state == DualState.FAILED and not CompensationPlan.objects.filter(run=run).exists()
    [refused] = _entries("run.compensate")  # the action's own refusal, kept with the request's end
    assert (refused.actor_label, refused.outcome) == ("oscar", AuditOutcome.REFUSED)
    assert [e.outcome for e in _entries("dual.confirm")] == [AuditOutcome.REFUSED]


def test_a_request_whose_action_cannot_run_any_more_fails_clearly_not_with_a_500(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    act(client_for(people["operator"]), run, "compensate")
    request = DualControlRequest.objects.get()
    DualControlRequest.objects.filter(pk=request.pk).update(params={**request.params, "removed_since": 1})

    answer = _decide(client_for(people["operator2"]), request, "confirm")

    assert answer.status_code == 409 and "could not be done (TypeError" in text(answer)
    request.refresh_from_db()
    run.refresh_from_db()
    assert request.state == DualState.FAILED and run.status == RunStatus.WAITING
    assert [e.outcome for e in _entries("dual.confirm")] == [AuditOutcome.REFUSED]


def test_the_sweepers_pass_expires_requests_past_their_deadline_with_an_audit_entry(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    run = waiting_run()
    act(client_for(people["operator"]), run, "compensate")
    DualControlRequest.objects.update(deadline=timezone.now() - timedelta(seconds=1))

    send_swept(report=None)

    request = DualControlRequest.objects.get()
    assert request.state == DualState.EXPIRED
    [expired] = _entries("dual.expire")
    assert (expired.actor_label, expired.object_id) == ("system: dual control", str(run.id))


def test_a_bulk_batch_asked_for_twice_is_refused_the_second_time(people, settings):
    settings.SAGA_DUAL_CONTROL = {"effect.resolve_unsafe": ["*"]}
    make_effect(step="s1")
    olga = client_for(people["operator"])
    token = token_of(preview(olga, "effect.resolve"))
    assert confirm(olga, token, outcome="not_executed").status_code == 302
    again = confirm(olga, token, outcome="not_executed")
    assert again.status_code == 409 and "already waits for a second person" in text(again)
    assert DualControlRequest.objects.count() == 1


def test_a_persons_keys_and_login_are_one_person_for_dual_control(people, settings):
    settings.SAGA_DUAL_CONTROL = COMPENSATION_NEEDS_TWO
    olga = people["operator"]
    first = apikey_create(name="olga-bot", role="operator", created_by=olga)[1]
    second = apikey_create(name="olga-bot-2", role="operator", created_by=olga)[1]
    run = waiting_run()
    asked = call("post", f"/runs/{run.id}/compensate", first, {"reason": "refund ticket 8", "expected": "WAITING"})
    request_id = asked.json()["dual_control"]["id"]

    by_her_other_key = call("post", f"/dual-control/{request_id}/confirm", second, {"reason": "fine"})
    assert by_her_other_key.status_code == 403 and by_her_other_key.json()["type"].endswith("/second-person")
    by_her_login = _decide(client_for(olga), DualControlRequest.objects.get(), "confirm")
    assert by_her_login.status_code == 403
    assert "Confirm and do it" not in text(client_for(olga).get(reverse("console:approvals")))
    assert _decide(client_for(people["operator2"]), DualControlRequest.objects.get(), "confirm").status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING
