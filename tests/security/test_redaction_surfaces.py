"""Every place that shows a stored value applies the one redaction policy: a run whose input,
step results, effect request and result, approval, error and audit entries carry secrets shows
none of them on any page, export, websocket push or admin page, and still shows its LLM token
count."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import reverse

from config.asgi import application
from console import topics
from console.broadcast import broadcast
from demo.models import ProviderExecution
from ledger.models import EffectRecord
from operators.models import AuditEntry
from sagas.models import ApprovalRequest, JournalEntry, RunStatus, WorkflowRun
from tests.console.queue_data import audit, make_approval, make_effect, make_run
from tests.console.run_data import append_entries

SECRETS = ("hunter2-pw", "tok_bearer_7f3a9c", "4242 4242 4242 4242", "4242424242424242", "DE89370400440532013000",
           "pair-secret-9", "sk_live_key_55")
PAYLOAD = {
    "password": "hunter2-pw",
    "note": "Authorization: Bearer tok_bearer_7f3a9c",
    "paid": "with 4242 4242 4242 4242 yesterday",
    "iban": "DE89370400440532013000",
    "argv": ["password", "pair-secret-9"],
    "usage": {"prompt_tokens": 1234},
}
ERROR_TEXT = "provider said 401 for api_key=sk_live_key_55 (Authorization: Bearer tok_bearer_7f3a9c)"
# The token count as each surface writes it: HTML-escaped JSON, JSON, or CSV-quoted JSON.
TOKENS = re.compile(r'prompt_tokens(&quot;|"|"")?: 1234\b')


def assert_redacted(text: str, *, tokens: bool = True) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert leaked == [], f"secrets shown: {leaked}"
    if tokens:
        assert TOKENS.search(text), "the prompt token count is not shown"


def make_leaky_run() -> WorkflowRun:
    """A WAITING run with a pending approval and an UNKNOWN effect, every value carrying secrets."""
    run = make_run(status=RunStatus.WAITING, reason="", name="rs_leaky", input=PAYLOAD,
                   error={"message": ERROR_TEXT, "usage": {"prompt_tokens": 1234}})
    append_entries(run, 1, {"result": PAYLOAD})  # a step's result
    append_entries(run, 1, {"error": {"message": ERROR_TEXT}, "usage": {"prompt_tokens": 1234}})  # a failed step
    make_effect(run=run, request_payload=PAYLOAD, result=PAYLOAD, error_message=ERROR_TEXT,
                resolution_note="card 4242424242424242 refunded")
    make_approval(run=run, reason=f"Pay? {ERROR_TEXT}; iban DE89370400440532013000")
    audit(object_type="run", object_id=str(run.id), before=PAYLOAD, after=dict(PAYLOAD, rotated=True),
          reason="rotated password=hunter2-pw", message=ERROR_TEXT)
    ProviderExecution.objects.create(provider="pay", operation="charge", idempotency_key="k-1", request=PAYLOAD,
                                     response=PAYLOAD, status_code=200)
    return run


@pytest.fixture
def leaky_run(db) -> WorkflowRun:
    return make_leaky_run()


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def test_it_shows_no_secret_on_the_run_page_and_its_history(leaky_run, people):
    viewer = Client()
    viewer.force_login(people["viewer"])
    run_page = page(viewer, reverse("console:run", args=[leaky_run.id]))
    assert_redacted(run_page)
    assert "sk_live_key_55" not in run_page and "api_key=" in run_page  # the error text, redacted

    older = page(viewer, reverse("console:run_history", args=[leaky_run.id]) + "?before=3")  # a page of its own
    assert 'id="seq-1"' in older
    assert_redacted(older)

    exported = page(viewer, reverse("console:run_history_json", args=[leaky_run.id]))
    assert_redacted(exported)
    data = json.loads(exported)
    assert data["run"]["input"]["usage"] == {"prompt_tokens": 1234}
    assert data["entries"][0]["payload"]["result"]["argv"] == ["password", "•••• redacted"]


def test_it_shows_no_secret_in_the_effects_queue_and_the_approvals_inbox(leaky_run, people):
    viewer = Client()
    viewer.force_login(people["viewer"])
    effects = page(viewer, reverse("console:effects"))
    assert EffectRecord.objects.get(run_id=leaky_run.id).idempotency_key in effects
    assert_redacted(effects)
    approvals = page(viewer, reverse("console:approvals"))
    assert "Pay? provider said 401" in approvals
    assert_redacted(approvals, tokens=False)  # an approval shows its reason, no payload


def test_it_shows_no_secret_on_the_audit_page_or_in_its_csv(leaky_run, people):
    viewer = Client()
    viewer.force_login(people["viewer"])
    log = page(viewer, reverse("console:audit"))
    assert "rotated password=" in log
    assert_redacted(log)

    exported = page(viewer, reverse("console:audit_csv"))
    assert_redacted(exported)
    row = next(r for r in csv.DictReader(io.StringIO(exported)) if r["object_id"] == str(leaky_run.id))
    assert json.loads(row["before"])["password"] == "•••• redacted"
    assert row["reason"] == "rotated password=•••• redacted"


def test_it_shows_no_secret_on_admin_change_pages_and_changelists(leaky_run, superuser):
    admin = Client()
    admin.force_login(superuser)
    rows = {
        "sagas/workflowrun": leaky_run.pk,
        "sagas/journalentry": JournalEntry.objects.get(run=leaky_run, seq=2).pk,
        "ledger/effectrecord": EffectRecord.objects.get(run_id=leaky_run.id).pk,
        "sagas/approvalrequest": ApprovalRequest.objects.get(run=leaky_run).pk,
        "operators/auditentry": AuditEntry.objects.get(object_id=str(leaky_run.id)).pk,
        "demo/providerexecution": ProviderExecution.objects.get(idempotency_key="k-1").pk,
    }
    for model, pk in rows.items():
        change = page(admin, f"/admin/{model}/{pk}/change/")
        assert "(redacted)" in change, model  # the redacted read-only display is there
        assert_redacted(change, tokens=model != "sagas/approvalrequest")
        assert_redacted(page(admin, f"/admin/{model}/"), tokens=False)


def _cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def _one_more_step(run: WorkflowRun) -> None:
    append_entries(run, 1, {"result": PAYLOAD, "marker": "pushed-later"})
    broadcast(topics.run_topic(str(run.id)))


@pytest.mark.django_db(transaction=True)
def test_it_pushes_no_secret_over_the_websocket(people):
    """The catch-up push every connection gets, then a push after a change: the same fragments
    as the pages, so the same policy."""
    run = make_leaky_run()
    fragments = "run_header,run_history,run_effects,run_approvals,effects_queue,approvals_inbox,audit_log"
    headers = [(b"origin", b"http://localhost"), (b"cookie", _cookie(people["viewer"]))]

    async def scenario() -> list[str]:
        socket = WebsocketCommunicator(application, f"/ws/live/?fragments={fragments}&run={run.id}&since=0",
                                       headers=headers)
        connected, _ = await socket.connect(timeout=5)
        assert connected
        pushes = [await socket.receive_from(timeout=10)]
        await database_sync_to_async(_one_more_step)(run)
        while "pushed-later" not in pushes[-1]:
            pushes.append(await socket.receive_from(timeout=10))
        await socket.disconnect()
        return pushes

    pushes = async_to_sync(scenario)()
    first, last = pushes[0], pushes[-1]
    for name in ("run_header", "run_history", "run_effects", "run_approvals", "effects_queue", "audit_log"):
        assert f'id="live-{name}"' in first, name
    assert_redacted(first)
    assert_redacted(last)
