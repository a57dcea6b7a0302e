"""Notifications when a connector's circuit opens or closes: one delivery per endpoint and change,
from the ledger's signal or, when that was lost, the sweeper's pass; saying the connector, the
state, the failures and the error that opened it; hostile text escaped wherever it is shown."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import ThreadingHTTPServer

import pytest
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from console.notifications.circuits import on_circuit_changed
from console.notifications.models import NotificationDelivery
from ledger.flow import gate, services
from ledger.models import CircuitChange, ConnectorFlow, EffectStatus, FlowBucket
from ledger.signals import circuit_changed
from operators.models import TenantScope
from sagas.events import send_swept
from sagas.models import WorkflowRun
from sagas.testing import run_until_idle
from tests.console.conftest import client_for
from tests.console.queue_data import make_effect
from tests.console.test_notifications import ALL_KINDS, _Catcher, endpoint

pytestmark = pytest.mark.django_db(transaction=True)

CONNECTOR = "email.send"
SECRET_TOKEN = "sk_live_abcdefghijklmnop"
HOSTILE = f"HTTP 503 <script>alert(1)</script> <!channel> <https://evil.example|click> & Bearer {SECRET_TOKEN}"


@pytest.fixture
def breaker():
    """Every connector's flow row (as a worker writes them at start-up); email.send's circuit
    opens after two failures in a row."""
    services.sync_declared()
    flow = services.Limits.of(ConnectorFlow.objects.get(connector=CONNECTOR))
    services.connector_limits_set(connector=CONNECTOR, by="ops", limits=services.Limits(
        **{**flow.as_dict(), "circuit_failures": 2}))


def _fail(error: str = HOSTILE):
    """A call to the connector that failed (retryable), counted in its own transaction as a worker does."""
    effect = make_effect(connector=CONNECTOR, step="mail", status=EffectStatus.IN_PROGRESS, error_message=error)
    with transaction.atomic():
        gate.record_failure(effect)
    return effect


def _close(trial) -> None:
    """The trial call after the cool-down: half-open with ``trial`` out, and it succeeds."""
    FlowBucket.objects.filter(connector=CONNECTOR).update(circuit="half_open", trial_effect_id=trial.id)
    with transaction.atomic():
        gate.record_success(trial)


def _deliveries() -> list[tuple[str, str, str]]:
    return sorted(NotificationDelivery.objects.values_list("endpoint__name", "kind", "item"))


def test_it_notifies_once_when_a_circuit_opens_and_once_when_it_closes(breaker):
    endpoint("everything", kinds=ALL_KINDS)
    endpoint("slack", kinds=["circuit_opened", "circuit_closed"], format="slack")
    endpoint("acme only", kinds=ALL_KINDS, tenants=["acme"])  # a connector serves every tenant: not theirs
    endpoint("runs only", kinds=["run_failed", "unknown_effect"])
    endpoint("switched off", kinds=ALL_KINDS, active=False)

    _fail("HTTP 503 the first")
    assert not NotificationDelivery.objects.exists()  # one failure does not open it
    trial = _fail()
    opened = CircuitChange.objects.get(state="open")
    assert _deliveries() == [("everything", "circuit_opened", f"circuit:{opened.id}"),
                             ("slack", "circuit_opened", f"circuit:{opened.id}")]
    # Seen again: the same signal twice, and the sweeper's pass: nothing more.
    circuit_changed.send(sender=None, connector=CONNECTOR, key="", state="open", failures=2, error="")
    send_swept(report=None)
    assert NotificationDelivery.objects.count() == 2

    _close(trial)
    closed = CircuitChange.objects.get(state="closed")
    send_swept(report=None)
    assert _deliveries() == [("everything", "circuit_closed", f"circuit:{closed.id}"),
                             ("everything", "circuit_opened", f"circuit:{opened.id}"),
                             ("slack", "circuit_closed", f"circuit:{closed.id}"),
                             ("slack", "circuit_opened", f"circuit:{opened.id}")]

    generic = {d.kind: d for d in NotificationDelivery.objects.filter(endpoint__name="everything")}
    body = generic["circuit_opened"].body
    assert (body["connector"], body["state"], body["failures"], body["key"]) == (CONNECTOR, "open", 2, "")
    assert body["error"].startswith("HTTP 503 <script>alert(1)</script>")  # JSON: the receiver escapes
    assert body["run_id"] is None and body["tenant"] == "" and body["link"].startswith(settings.CONSOLE_URL)
    assert "2 failure(s) in a row" in body["summary"] and CONNECTOR in body["summary"]
    closing = generic["circuit_closed"].body
    assert (closing["state"], closing["failures"], closing["error"]) == ("closed", 2, body["error"])
    assert closing["opened_at"] == opened.at.isoformat() and "calls go again" in closing["summary"]
    for delivery in NotificationDelivery.objects.all():
        assert SECRET_TOKEN not in json.dumps(delivery.body) and SECRET_TOKEN not in delivery.summary
        notify = WorkflowRun.objects.get(id=delivery.notify_run_id)
        assert (notify.workflow_name, notify.business_key) == ("system.notify", f"delivery-{delivery.id}")
        assert (delivery.run_id, delivery.tenant, notify.tenant) == (None, "", "system")

    slack = json.dumps(NotificationDelivery.objects.get(endpoint__name="slack", kind="circuit_opened").body)
    for raw in ("<script>", "<!channel>", "<https://evil.example"):
        assert raw not in slack, raw
    assert "&lt;script&gt;" in slack and "&lt;!channel&gt;" in slack and "&amp; Bearer" in slack


def test_the_deliveries_page_escapes_the_error_and_shows_circuits_only_to_who_sees_every_tenant(breaker, people):
    endpoint("everything", kinds=ALL_KINDS)
    _fail()
    _fail()
    [delivery] = NotificationDelivery.objects.all()
    TenantScope.objects.create(user=people["operator"], tenants=["acme"])

    page = client_for(people["viewer"]).get(reverse("console:notifications"))
    html = page.content.decode()
    assert page.status_code == 200 and f'id="delivery-{delivery.id}"' in html and CONNECTOR in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<!channel>" not in html and SECRET_TOKEN not in html
    limited = client_for(people["operator"]).get(reverse("console:notifications"))
    assert limited.status_code == 200 and f'id="delivery-{delivery.id}"' not in limited.content.decode()


def test_the_sweepers_pass_sends_what_a_lost_signal_missed_once_and_only_recent_changes(breaker):
    endpoint("everything", kinds=ALL_KINDS)
    circuit_changed.disconnect(dispatch_uid="console.notifications.circuit_changed")
    try:  # a worker killed between its commit and its receivers: the rows, no signal
        _fail()
        _fail()
        with transaction.atomic():  # and the notifications' own connector: never notified
            gate.circuit_changed("webhook.post", "", "open", failures=5, error="endpoint down", at=timezone.now())
        old = CircuitChange.objects.create(connector=CONNECTOR, key="acme", state="open", failures=3,
                                           error="long ago", at=timezone.now() - timedelta(hours=1))
    finally:
        circuit_changed.connect(on_circuit_changed, dispatch_uid="console.notifications.circuit_changed")
    assert not NotificationDelivery.objects.exists()

    send_swept(report=None)
    send_swept(report=None)
    [delivery] = NotificationDelivery.objects.all()
    assert delivery.item == f"circuit:{CircuitChange.objects.get(connector=CONNECTOR, key='').id}"
    assert not NotificationDelivery.objects.filter(item=f"circuit:{old.id}").exists()


def test_the_notify_run_posts_the_circuit_body_to_the_endpoint_once(breaker):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Catcher)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Catcher.got = []
    try:
        endpoint("receiver", url=f"http://127.0.0.1:{server.server_address[1]}/hook", kinds=["circuit_opened"])
        _fail()
        _fail()
        [delivery] = NotificationDelivery.objects.all()
        run_until_idle(delivery.notify_run_id)
        send_swept(report=None)
    finally:
        server.shutdown()
    [(headers, raw)] = _Catcher.got
    sent = json.loads(raw)
    assert (sent["kind"], sent["connector"], sent["state"], sent["failures"]) == ("circuit_opened", CONNECTOR, "open", 2)
    assert headers["X-Saga-Delivery"] == str(delivery.id) and headers["Idempotency-Key"]
