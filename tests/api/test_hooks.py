"""Signed webhooks in: a provider's signed callback wakes the run it names; a bad,
stale, future or replayed signature, an unknown hook, a malformed or oversized body wake nothing."""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import call_command
from django.test import Client

import sagas
from api.hooks import MAX_BODY_BYTES, hook_create, hook_sign
from api.models import HookReceipt
from operators.models import AuditEntry
from sagas.models import JournalEntry, WorkflowRun
from tests.api import wf_api  # noqa: F401  (registers api_payment)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def post(name: str, body: bytes, *, secret: str | None = None, timestamp: int | None = None,
         signature: str | None = None):
    """POST ``body`` to hook ``name`` in process, signed with ``secret`` at ``timestamp`` (now)
    unless ``signature`` is given."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    if signature is None:
        signature = hook_sign(secret=secret or "", timestamp=timestamp, body=body)
    return Client().post(f"/api/v1/hooks/{name}", data=body, content_type="application/json",
                         HTTP_X_SAGA_TIMESTAMP=str(timestamp), HTTP_X_SAGA_SIGNATURE=signature)


def signals(run: WorkflowRun) -> list:
    return [e.payload for e in JournalEntry.objects.filter(run=run, kind="signal_received").order_by("seq")]


@pytest.fixture
def hook():
    """Hook ``stripe`` sending ``payment_settled``, its secret, and a run of api_payment (business key o-1)."""
    model, secret = hook_create(name="stripe", signal="payment_settled")
    run = sagas.start("api_payment", {"id": "o-1"}, business_key="o-1")
    return model, secret, run


def problem(response) -> str:
    assert response["Content-Type"] == "application/problem+json", response.content
    return response.json()["type"].rsplit("/", 1)[-1]


def test_it_signals_the_run_named_by_id_and_audits_it_as_the_hook(hook):
    _, secret, run = hook
    answer = post("stripe", json.dumps({"run_id": str(run.id), "payload": {"amount": 1250}}).encode(), secret=secret)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"hook": "stripe", "run_id": str(run.id), "signal": "payment_settled",
                             "run_status": "PENDING", "duplicate": False}
    assert [p["payload"] for p in signals(run)] == [{"amount": 1250}]
    entry = AuditEntry.objects.get(action="run.signal")
    assert (entry.actor_label, entry.object_id, entry.reason, entry.outcome) == (
        "system: hook stripe", str(run.id), "payment_settled", "ok")


def test_it_signals_the_run_named_by_business_key_with_the_whole_body_without_payload(hook):
    _, secret, run = hook
    body = {"business_key": "o-1", "workflow": "api_payment", "status": "settled"}
    answer = post("stripe", json.dumps(body).encode(), secret=secret)
    assert answer.status_code == 200, answer.content
    assert [p["payload"] for p in signals(run)] == [body]
    missing = post("stripe", json.dumps({"business_key": "o-404"}).encode(), secret=secret)
    assert missing.status_code == 404 and problem(missing) == "not-found"
    assert "o-404" in missing.json()["detail"]


@pytest.mark.parametrize("case", ["wrong secret", "body changed", "no header", "old", "future"])
def test_it_refuses_a_bad_stale_or_future_signature_and_wakes_nothing(hook, case):
    _, secret, run = hook
    body = json.dumps({"run_id": str(run.id)}).encode()
    now = int(time.time())
    answer = {
        "wrong secret": lambda: post("stripe", body, secret="whsec_guess"),
        "body changed": lambda: post("stripe", body, signature=hook_sign(secret=secret, timestamp=now, body=b"{}"),
                                     timestamp=now),
        "no header": lambda: post("stripe", body, signature=""),
        "old": lambda: post("stripe", body, secret=secret, timestamp=now - 301),
        "future": lambda: post("stripe", body, secret=secret, timestamp=now + 301),
    }[case]()
    assert answer.status_code == 401 and problem(answer) == "signature"
    detail = answer.json()["detail"]
    if case == "old":
        assert "old" in detail and "300 s" in detail
    if case == "future":
        assert "future" in detail
    assert signals(run) == [] and not AuditEntry.objects.filter(action="run.signal").exists()


def test_it_refuses_a_replayed_delivery_and_signals_once(hook):
    _, secret, run = hook
    body, now = json.dumps({"run_id": str(run.id), "payload": "paid"}).encode(), int(time.time())
    signature = hook_sign(secret=secret, timestamp=now, body=body)
    assert post("stripe", body, timestamp=now, signature=signature).status_code == 200
    again = post("stripe", body, timestamp=now, signature=signature)
    assert again.status_code == 409 and problem(again) == "replay"
    assert len(signals(run)) == 1 and HookReceipt.objects.count() == 1
    assert AuditEntry.objects.filter(action="run.signal").count() == 1
    # The sender's own retry, signed anew, is a second delivery: the n-th wait takes the n-th signal.
    assert post("stripe", body, secret=secret, timestamp=now + 1).status_code == 200
    assert len(signals(run)) == 2


def test_it_answers_a_resigned_retry_of_the_same_event_as_delivered_and_signals_once(hook):
    """A provider that re-signs its retries (a new timestamp) and names its event is answered
    200 duplicate, so it stops retrying, and the run gets one signal."""
    _, secret, run = hook
    body = json.dumps({"run_id": str(run.id), "event_id": "evt_1NZ", "payload": {"amount": 1250}}).encode()
    first = post("stripe", body, secret=secret)
    assert first.status_code == 200 and first.json()["duplicate"] is False
    retry = post("stripe", body, secret=secret, timestamp=int(time.time()) + 1)
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    assert len(signals(run)) == 1 and AuditEntry.objects.filter(action="run.signal").count() == 1
    other = json.dumps({"run_id": str(run.id), "event_id": "evt_2QX", "payload": {"amount": 50}}).encode()
    assert post("stripe", other, secret=secret).json()["duplicate"] is False
    assert [p["payload"] for p in signals(run)] == [{"amount": 1250}, {"amount": 50}]
    bad = post("stripe", json.dumps({"run_id": str(run.id), "event_id": 7}).encode(), secret=secret)
    assert bad.status_code == 400 and problem(bad) == "validation"


def test_it_answers_404_for_an_unknown_or_disabled_hook(hook):
    model, secret, run = hook
    body = json.dumps({"run_id": str(run.id)}).encode()
    assert problem(post("nope", body, secret=secret)) == "not-found"
    model.enabled = False
    model.save(update_fields=["enabled"])
    disabled = post("stripe", body, secret=secret)
    assert disabled.status_code == 404 and problem(disabled) == "not-found" and signals(run) == []


def test_it_refuses_malformed_json_and_bodies_that_name_no_run(hook):
    _, secret, run = hook
    for body in (b'{"run_id": ', b"[1, 2]", b'{"payload": 1}', b'{"run_id": "not-a-uuid"}'):
        answer = post("stripe", body, secret=secret)
        assert answer.status_code == 400 and problem(answer) == "validation", body
    assert signals(run) == []


def test_it_refuses_an_oversized_body_with_413(hook):
    _, secret, run = hook
    body = json.dumps({"run_id": str(run.id), "payload": "x" * MAX_BODY_BYTES}).encode()
    answer = post("stripe", body, secret=secret)
    assert answer.status_code == 413 and problem(answer) == "payload-too-large"
    assert signals(run) == []


def test_it_refuses_a_finished_run_and_a_run_of_another_tenant(hook):
    _, secret, run = hook
    sagas.cancel(run_id=run.id, reason="test", compensate=False)
    finished = post("stripe", json.dumps({"run_id": str(run.id)}).encode(), secret=secret)
    assert finished.status_code == 409 and problem(finished) == "conflict"
    assert HookReceipt.objects.count() == 0  # refused: the same delivery may be sent again
    other = sagas.start("api_payment", {"id": "o-2"}, business_key="o-2", tenant="acme")
    elsewhere = post("stripe", json.dumps({"run_id": str(other.id)}).encode(), secret=secret)
    assert elsewhere.status_code == 404 and signals(other) == []


def test_it_prints_the_secret_once_from_the_command_and_audits_it(capsys):
    call_command("createhook", "adyen", "--signal", "payment_settled", "--workflow", "api_payment")
    secret = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("whsec_"))
    run = sagas.start("api_payment", {"id": "o-3"}, business_key="o-3")
    assert post("adyen", json.dumps({"business_key": "o-3"}).encode(), secret=secret).status_code == 200
    entry = AuditEntry.objects.get(action="hook.create")
    assert entry.actor_label == "system: createhook" and entry.object_id == "adyen"
    assert secret not in json.dumps(entry.after)
    assert len(signals(run)) == 1


def test_it_wakes_a_waiting_run_over_http_and_it_completes_with_the_payload(api_server, keys):
    _, secret = hook_create(name="psp", signal="payment_settled", workflow="api_payment")
    started = api_server.call("POST", "/runs", keys["operator"], {"workflow": "api_payment", "input": {"id": "o-9"}},
                              headers={"Idempotency-Key": "o-9"})
    assert started.status == 201, started.body
    run_id = started.body["id"]
    api_server.worker("w1")
    wait_until(lambda: WorkflowRun.objects.get(id=run_id).status == "WAITING", 30, what="the run to wait")
    body = json.dumps({"business_key": "o-9", "payload": {"psp_ref": "pi_42", "amount": 1250}}).encode()
    now = int(time.time())
    answer = api_server.call("POST", "/hooks/psp", raw=body, headers={
        "X-Saga-Timestamp": str(now), "X-Saga-Signature": hook_sign(secret=secret, timestamp=now, body=body)})
    assert answer.status == 200, answer.body
    assert answer.body["run_id"] == run_id and answer.body["run_status"] == "PENDING"
    wait_until(lambda: WorkflowRun.objects.get(id=run_id).status == "COMPLETED", 30, what="the run to complete")
    assert WorkflowRun.objects.get(id=run_id).result == {"order": "o-9", "settled": {"psp_ref": "pi_42",
                                                                                      "amount": 1250}}
    forged = api_server.call("POST", "/hooks/psp", raw=body, headers={
        "X-Saga-Timestamp": str(now), "X-Saga-Signature": "v1=" + "0" * 64})
    assert forged.status == 401 and forged.problem == "signature"


def test_it_documents_the_signature_scheme_and_needs_no_api_key_in_openapi():
    from api.api import api

    operation = api.get_openapi_schema()["paths"]["/api/v1/hooks/{name}"]["post"]
    assert not operation.get("security")
    assert 'HMAC-SHA256(secret, "<timestamp>.<raw body>")' in operation["description"]
    assert {"X-Saga-Timestamp", "X-Saga-Signature"} <= {p["name"] for p in operation["parameters"]}
