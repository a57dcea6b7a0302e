"""Signed webhooks in: a provider's signed callback wakes the run it names; a bad,
stale, future or replayed signature, an unknown hook, a malformed or oversized body wake nothing.
Deliveries are signed as the ``standardwebhooks`` library signs them; a hook made before Standard
Webhooks (legacy) takes the scheme it always took."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.test import Client
from standardwebhooks.webhooks import Webhook

import sagas
from api.hooks import MAX_BODY_BYTES, hook_create, legacy_sign
from api.models import Hook, HookReceipt
from core.webhooks import SignatureScheme, is_standard_secret, new_secret
from operators.models import AuditEntry
from sagas.models import JournalEntry, WorkflowRun
from tests.api import wf_api  # noqa: F401  (registers api_payment)

pytestmark = pytest.mark.django_db(transaction=True)


def post(name: str, body: bytes, *, secret: str | None = None, timestamp: int | None = None,
         signature: str | None = None, msg_id: str | None = None):
    """POST ``body`` to hook ``name`` in process as message ``msg_id`` (a new one), signed by the
    standardwebhooks library with ``secret`` at ``timestamp`` (now) unless ``signature`` is given."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    if signature is None:
        signature = Webhook(secret or "").sign(msg_id, datetime.fromtimestamp(timestamp, UTC), body)
    return Client().post(f"/api/v1/hooks/{name}", data=body, content_type="application/json", headers={
        "webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature})


def post_legacy(name: str, body: bytes, *, secret: str = "", timestamp: int | None = None,
                signature: str | None = None):
    """POST ``body`` to hook ``name`` signed the way before Standard Webhooks."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    if signature is None:
        signature = legacy_sign(secret=secret, timestamp=timestamp, body=body)
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


@pytest.mark.parametrize("case", ["wrong secret", "body changed", "other id", "no header", "old", "future",
                                  "legacy headers"])
def test_it_refuses_a_bad_stale_or_future_signature_and_wakes_nothing(hook, case):
    _, secret, run = hook
    body = json.dumps({"run_id": str(run.id)}).encode()
    now = int(time.time())
    signed = Webhook(secret).sign("msg_1", datetime.fromtimestamp(now, UTC), b"{}")
    answer = {
        "wrong secret": lambda: post("stripe", body, secret=new_secret()),
        "body changed": lambda: post("stripe", body, signature=signed, timestamp=now, msg_id="msg_1"),
        "other id": lambda: post("stripe", b"{}", signature=signed, timestamp=now, msg_id="msg_2"),
        "no header": lambda: post("stripe", body, signature=""),
        "old": lambda: post("stripe", body, secret=secret, timestamp=now - 301),
        "future": lambda: post("stripe", body, secret=secret, timestamp=now + 301),
        "legacy headers": lambda: post_legacy("stripe", body, secret=secret),
    }[case]()
    assert answer.status_code == 401 and problem(answer) == "signature"
    detail = answer.json()["detail"]
    expected = {"old": "is 301 s old; at most 300 s are accepted", "future": "in the future",
                "no header": "send the webhook-id, webhook-timestamp and webhook-signature headers",
                "legacy headers": "takes webhook-id, webhook-timestamp and webhook-signature (Standard Webhooks)",
                }.get(case, "no v1 entry of webhook-signature matches")
    assert expected in detail, detail
    assert signals(run) == [] and not AuditEntry.objects.filter(action="run.signal").exists()


# --- hooks made before Standard Webhooks --------------------------------------------------------


@pytest.fixture
def legacy_hook(hook):
    """Hook ``old-psp``, made before Standard Webhooks (its secret is not base64), and its secret."""
    secret = "whsec_" + secrets.token_urlsafe(32)
    Hook.objects.create(name="old-psp", secret=secret, signature_scheme=SignatureScheme.LEGACY,
                        signal="payment_settled")
    return secret, hook[2]


def test_it_takes_the_old_signature_on_a_legacy_hook_refuses_a_replay_and_signals_once(legacy_hook):
    secret, run = legacy_hook
    body, now = json.dumps({"run_id": str(run.id), "payload": "paid"}).encode(), int(time.time())
    signature = legacy_sign(secret=secret, timestamp=now, body=body)
    assert post_legacy("old-psp", body, timestamp=now, signature=signature).status_code == 200
    again = post_legacy("old-psp", body, timestamp=now, signature=signature)
    assert again.status_code == 409 and problem(again) == "replay"
    assert len(signals(run)) == 1 and HookReceipt.objects.count() == 1
    assert AuditEntry.objects.filter(action="run.signal").count() == 1
    # The sender's own retry, signed anew, is a second delivery: the n-th wait takes the n-th signal.
    assert post_legacy("old-psp", body, secret=secret, timestamp=now + 1).status_code == 200
    assert len(signals(run)) == 2
    # Standard Webhooks headers are refused until the hook's secret is rotated, saying so.
    standard = post("old-psp", body, secret=new_secret())
    assert standard.status_code == 401 and "legacy scheme, until the hook's secret is rotated" in \
        standard.json()["detail"]


def test_it_answers_a_resigned_retry_of_the_same_legacy_event_as_delivered_and_signals_once(legacy_hook):
    """A provider that re-signs its retries (a new timestamp) and names its event in the body is
    answered 200 duplicate, so it stops retrying, and the run gets one signal."""
    secret, run = legacy_hook
    body = json.dumps({"run_id": str(run.id), "event_id": "evt_1NZ", "payload": {"amount": 1250}}).encode()
    first = post_legacy("old-psp", body, secret=secret)
    assert first.status_code == 200 and first.json()["duplicate"] is False
    retry = post_legacy("old-psp", body, secret=secret, timestamp=int(time.time()) + 1)
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    assert len(signals(run)) == 1 and AuditEntry.objects.filter(action="run.signal").count() == 1
    other = json.dumps({"run_id": str(run.id), "event_id": "evt_2QX", "payload": {"amount": 50}}).encode()
    assert post_legacy("old-psp", other, secret=secret).json()["duplicate"] is False
    assert [p["payload"] for p in signals(run)] == [{"amount": 1250}, {"amount": 50}]
    bad = post_legacy("old-psp", json.dumps({"run_id": str(run.id), "event_id": 7}).encode(), secret=secret)
    assert bad.status_code == 400 and problem(bad) == "validation"


# --- every hook ------------------------------------------------------------------------------------


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
    assert is_standard_secret(secret)
    run = sagas.start("api_payment", {"id": "o-3"}, business_key="o-3")
    assert post("adyen", json.dumps({"business_key": "o-3"}).encode(), secret=secret).status_code == 200
    entry = AuditEntry.objects.get(action="hook.create")
    assert entry.actor_label == "system: createhook" and entry.object_id == "adyen"
    assert secret not in json.dumps(entry.after)
    assert len(signals(run)) == 1


def test_it_documents_the_signature_scheme_and_needs_no_api_key_in_openapi():
    from api.api import api

    operation = api.get_openapi_schema()["paths"]["/api/v1/hooks/{name}"]["post"]
    assert not operation.get("security")
    assert "Standard Webhooks" in operation["description"]
    assert '"<webhook-id>.<webhook-timestamp>.<raw\nbody>"' in operation["description"]
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature", "X-Saga-Timestamp",
                            "X-Saga-Signature"}
    assert headers["X-Saga-Signature"]["deprecated"] and not headers["webhook-signature"].get("deprecated")
    assert "application/problem+json" in operation["responses"]["401"]["content"]
