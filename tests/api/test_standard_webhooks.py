"""Standard Webhooks in: a sender written with the ``standardwebhooks`` library (``Webhook.sign``)
delivers to our live hook endpoint, and its retries under one ``webhook-id`` signal once; a hook
made before moves to the standard scheme with ``manage.py rotatehook`` without cutting its sender
off. (Out: tests/console/test_notifications.py, where the library's ``Webhook.verify`` checks what
our workers send.)"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from standardwebhooks.webhooks import Webhook

import sagas
from api.hooks import hook_create, legacy_sign
from api.models import Hook, HookReceipt
from core.webhooks import SignatureScheme, new_secret
from operators.models import AuditEntry
from sagas.models import JournalEntry, WorkflowRun
from tests.api import wf_api  # noqa: F401  (registers api_payment)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def signed(sender: Webhook, msg_id: str, body: bytes, at: datetime | None = None) -> dict[str, str]:
    """The headers a sender using the library sends: what its README shows."""
    at = at or datetime.now(tz=UTC)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": sender.sign(msg_id, at, body)}


def signals(run_id) -> list:
    return list(JournalEntry.objects.filter(run_id=run_id, kind="signal_received").values_list("payload", flat=True))


def test_a_sender_using_the_library_wakes_a_waiting_run_once_however_often_it_retries(api_server, keys):
    _, secret = hook_create(name="psp", signal="payment_settled", workflow="api_payment")
    started = api_server.call("POST", "/runs", keys["operator"], {"workflow": "api_payment", "input": {"id": "o-9"}},
                              headers={"Idempotency-Key": "o-9"})
    assert started.status == 201, started.body
    run_id = started.body["id"]
    api_server.worker("w1")
    wait_until(lambda: WorkflowRun.objects.get(id=run_id).status == "WAITING", 30, what="the run to wait")

    sender = Webhook(secret)
    body = json.dumps({"business_key": "o-9", "payload": {"psp_ref": "pi_42", "amount": 1250}}).encode()
    answer = api_server.call("POST", "/hooks/psp", raw=body, headers=signed(sender, "msg_2LhW0y", body))
    assert answer.status == 200, answer.body
    assert (answer.body["run_id"], answer.body["run_status"], answer.body["duplicate"]) == (run_id, "PENDING", False)
    # The sender did not hear the answer and retries: the same webhook-id, signed anew a second later.
    retry = api_server.call("POST", "/hooks/psp", raw=body, headers=signed(
        sender, "msg_2LhW0y", body, datetime.now(tz=UTC) + timedelta(seconds=1)))
    assert retry.status == 200 and retry.body["duplicate"] is True, retry.body
    wait_until(lambda: WorkflowRun.objects.get(id=run_id).status == "COMPLETED", 30, what="the run to complete")
    assert WorkflowRun.objects.get(id=run_id).result == {"order": "o-9", "settled": {"psp_ref": "pi_42",
                                                                                      "amount": 1250}}
    assert len(signals(run_id)) == 1 and AuditEntry.objects.filter(action="run.signal").count() == 1

    forged = api_server.call("POST", "/hooks/psp", raw=body, headers=signed(Webhook(new_secret()), "msg_3", body))
    stale = api_server.call("POST", "/hooks/psp", raw=body, headers=signed(
        sender, "msg_4", body, datetime.now(tz=UTC) - timedelta(seconds=400)))
    for refused in (forged, stale):
        assert refused.status == 401 and refused.problem == "signature", refused.body
        assert refused.headers["content-type"].startswith("application/problem+json")
    assert "no v1 entry of webhook-signature matches" in forged.body["detail"]
    assert "the timestamp is 400 s old; at most 300 s are accepted" in stale.body["detail"]
    assert len(signals(run_id)) == 1


def test_it_answers_a_captured_request_replayed_as_a_duplicate_and_takes_a_rotating_senders_two_signatures():
    _, secret = hook_create(name="psp", signal="payment_settled")
    run = sagas.start("api_payment", {"id": "o-1"}, business_key="o-1")
    body = json.dumps({"run_id": str(run.id), "payload": "paid"}).encode()
    captured = signed(Webhook(secret), "msg_a", body)
    first = Client().post("/api/v1/hooks/psp", data=body, content_type="application/json", headers=captured)
    replayed = Client().post("/api/v1/hooks/psp", data=body, content_type="application/json", headers=captured)
    assert first.json()["duplicate"] is False and replayed.status_code == 200 and replayed.json()["duplicate"] is True
    assert HookReceipt.objects.get().event_id == "msg_a" and len(signals(run.id)) == 1

    # A sender rotating its own secret signs with both, space-separated: one match is enough.
    now = datetime.now(tz=UTC)
    both = " ".join(Webhook(s).sign("msg_b", now, body) for s in (new_secret(), secret))
    answer = Client().post("/api/v1/hooks/psp", data=body, content_type="application/json", headers={
        "webhook-id": "msg_b", "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": both})
    assert answer.status_code == 200 and answer.json()["duplicate"] is False and len(signals(run.id)) == 2


def test_rotatehook_moves_a_legacy_hook_to_standard_webhooks_accepting_the_old_signature_for_the_overlap(capsys):
    old = "whsec_" + secrets.token_urlsafe(32)
    Hook.objects.create(name="old-psp", secret=old, signature_scheme=SignatureScheme.LEGACY, signal="payment_settled")
    run = sagas.start("api_payment", {"id": "o-2"}, business_key="o-2")

    def deliver(n: int, *, standard: str = "", legacy: str = "") -> dict:
        """Deliver payload ``n``, signed with the standard secret ``standard`` or the legacy ``legacy``."""
        body = json.dumps({"run_id": str(run.id), "payload": n}).encode()
        if standard:
            headers = signed(Webhook(standard), f"msg_{n}", body)
        else:
            now = int(time.time())
            headers = {"X-Saga-Timestamp": str(now),
                       "X-Saga-Signature": legacy_sign(secret=legacy, timestamp=now, body=body)}
        answer = Client().post("/api/v1/hooks/old-psp", data=body, content_type="application/json", headers=headers)
        return {"status": answer.status_code, **answer.json()}

    call_command("rotatehook", "old-psp", "--keep-old-hours", "24")
    out = capsys.readouterr().out
    new = next(line for line in out.splitlines() if line.startswith("whsec_"))
    assert "The old secret is still accepted until" in out
    # Both ways work while the overlap lasts: the sender switches when it deploys.
    assert deliver(1, legacy=old)["status"] == 200
    assert deliver(2, standard=new)["status"] == 200
    entry = AuditEntry.objects.get(action="hook.rotate")
    assert (entry.actor_label, entry.object_id, entry.before) == ("system: rotatehook", "old-psp",
                                                                  {"signature_scheme": "saga-v1"})
    assert entry.after["signature_scheme"] == "standard" and entry.after["old_secret_accepted_until"]
    assert old not in json.dumps(entry.after) and new not in json.dumps(entry.after)

    # After it, the old signature is refused, saying what to send instead.
    Hook.objects.filter(name="old-psp").update(previous_until=datetime.now(tz=UTC) - timedelta(seconds=1))
    late = deliver(3, legacy=old)
    assert late["status"] == 401 and "takes webhook-id, webhook-timestamp and webhook-signature" in late["detail"]
    assert "X-Saga-Signature is the legacy scheme" in late["detail"]
    assert [p["payload"] for p in signals(run.id)] == [1, 2]

    call_command("rotatehook", "old-psp")  # no overlap: a leaked secret stops at once
    assert "The old secret is refused from now on." in capsys.readouterr().out
    assert deliver(4, standard=new)["status"] == 401
