"""Notifications: staff configure webhook endpoints; what needs a person becomes one delivery per
(endpoint, item, kind), sent by real workers as a ledgered effect to the real demo receiver."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import tests.console.wf_notify  # noqa: F401  (registers nt_email in this process)
from console.notifications.detect import deliveries_create_for_run, deliveries_create_recent
from console.notifications.models import NotificationDelivery, NotificationEndpoint, NotificationKind
from console.notifications.selectors import delivery_states
from core.webhooks import SignatureScheme, is_standard_secret
from demo.models import WebhookArrival
from demo.providers import faults
from ledger import Final
from ledger.connectors import get_connector
from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry, AuditOutcome
from sagas import start
from sagas.events import send_run_changed_now
from sagas.models import RunStatus, WorkflowRun
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_effect, make_run
from tests.procs import start_providers, wait_until

ALL_KINDS = list(NotificationKind.values)
SECRET = "whsec_bm90aWZpY2F0aW9ucyB0ZXN0IHJlY2VpdmVyIGtleSE="  # base64 of 32 bytes, as the spec has it
LEGACY_SECRET = "whsec_test-receiver-secret"  # the form of a secret made before Standard Webhooks


def endpoint(name="ops", *, url="http://127.0.0.1:9/hook", kinds=ALL_KINDS, tenants=(), active=True,
             secret=SECRET, format="generic", scheme=SignatureScheme.STANDARD) -> NotificationEndpoint:
    return NotificationEndpoint.objects.create(name=name, url=url, kinds=list(kinds), tenants=list(tenants),
                                               active=active, secret=secret, format=format, signature_scheme=scheme)


def form(**values) -> dict:
    data = {"name": "ops chat", "url": "https://hooks.example.com/T1/B2", "format": "slack",
            "kinds": ["unknown_effect", "run_failed"], "tenants": "", "active": "on"}
    data.update(values)
    return data


# --- configuration: staff only, every change audited ---------------------------------------------


@pytest.mark.django_db
def test_it_lets_only_staff_configure_endpoints_and_audits_every_change(people):
    staff = people["viewer"]
    staff.is_staff = True
    staff.save()
    operator, admin_client = people["operator"], client_for(staff)
    page = reverse("console:notification_endpoints")

    # Not staff: the page is 403, and a POST is refused and audited as denied, nothing created.
    assert client_for(operator).get(page).status_code == 403
    assert client_for(operator).post(page, form()).status_code == 403
    assert not NotificationEndpoint.objects.exists()
    denied = AuditEntry.objects.get(action="notification.endpoint_create")
    assert (denied.actor_label, denied.outcome) == ("olga", AuditOutcome.DENIED)

    # A URL that is not http(s) is a 400 that says so.
    for bad in ("ftp://example.com/x", "javascript:alert(1)", "https://user:pw@example.com/x", "http:///x"):
        response = admin_client.post(page, form(url=bad))
        assert response.status_code == 400, bad
    assert not NotificationEndpoint.objects.exists()

    response = admin_client.post(page, form())
    created = NotificationEndpoint.objects.get()
    assert response.status_code == 302
    assert created.kinds == ["unknown_effect", "run_failed"] and created.tenants == [] and created.active
    assert is_standard_secret(created.secret) and created.signature_scheme == SignatureScheme.STANDARD
    entry = AuditEntry.objects.get(action="notification.endpoint_create", outcome=AuditOutcome.OK)
    assert entry.after["url"] == "https://hooks.example.com/T1/B2"
    assert created.secret not in json.dumps([entry.before, entry.after])
    # Staff see the secret on the endpoint's page; nobody else opens it.
    detail = reverse("console:notification_endpoint", args=[created.id])
    assert created.secret in admin_client.get(detail).content.decode()
    assert client_for(operator).get(detail).status_code == 403

    admin_client.post(detail, form(tenants="acme, globex", active=""))
    created.refresh_from_db()
    assert created.tenants == ["acme", "globex"] and not created.active
    update = AuditEntry.objects.get(action="notification.endpoint_update")
    assert update.before["active"] is True and update.after["tenants"] == ["acme", "globex"]

    old = created.secret
    admin_client.post(reverse("console:notification_endpoint_rotate", args=[created.id]))
    created.refresh_from_db()
    assert created.secret != old and created.previous_secret == ""
    rotated = AuditEntry.objects.get(action="notification.secret_rotate")
    assert rotated.after == {"secret": "rotated", "signature_scheme": "standard", "old_secret_signs_until": None}
    assert created.secret not in json.dumps(rotated.after)
    client_for(operator).post(reverse("console:notification_endpoint_rotate", args=[created.id]))
    created.refresh_from_db()
    assert AuditEntry.objects.filter(action="notification.secret_rotate", outcome=AuditOutcome.DENIED).count() == 1


@pytest.mark.django_db
def test_it_refuses_endpoint_settings_longer_than_their_limits(people):
    staff = people["viewer"]
    staff.is_staff = True
    staff.save()
    page = reverse("console:notification_endpoints")
    for too_long in ({"name": "n" * 101}, {"url": "https://hooks.example.com/" + "a" * 480},
                     {"tenants": ",".join(["t" * 99] * 11)}, {"tenants": "t" * 101}):
        response = client_for(staff).post(page, form(**too_long))
        assert response.status_code == 400, too_long
    assert not NotificationEndpoint.objects.exists()


# --- detection: one delivery per matching endpoint and item ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_creates_one_delivery_per_matching_endpoint_for_an_unknown_effect():
    everything = endpoint("everything")
    endpoint("failures only", kinds=["run_failed"])
    endpoint("globex only", tenants=["globex"])
    endpoint("switched off", active=False)
    acme = endpoint("acme", tenants=["acme"], kinds=["unknown_effect"])
    run = make_run(tenant="acme", business_key="order-0012")
    effect = make_effect(run=run, tenant="acme", step="email", connector="email.send",
                         error_message="no answer; Authorization: Bearer sk_live_abcdefghijklmnop")

    send_run_changed_now(run.id, RunStatus.NEEDS_ATTENTION, cause="needs_attention")
    send_run_changed_now(run.id, RunStatus.NEEDS_ATTENTION, cause="needs_attention")  # seen again
    deliveries_create_recent()  # and by the sweeper's pass

    deliveries = list(NotificationDelivery.objects.order_by("endpoint__name"))
    assert [(d.endpoint.name, d.kind, d.item) for d in deliveries] == [
        ("acme", "unknown_effect", f"effect:{effect.id}"), ("everything", "unknown_effect", f"effect:{effect.id}"),
    ]
    for d in deliveries:
        notify = WorkflowRun.objects.get(id=d.notify_run_id)
        assert (notify.workflow_name, notify.business_key, notify.tenant) == (
            "system.notify", f"delivery-{d.id}", "acme")
        assert "sk_live_abcdefghijklmnop" not in json.dumps(d.body)
    generic = next(d for d in deliveries if d.endpoint_id == everything.id).body
    assert generic["kind"] == "unknown_effect" and generic["business_key"] == "order-0012"
    assert generic["run_id"] == str(run.id) and generic["link"].endswith("/effects/")
    assert {d.endpoint_id for d in deliveries} == {everything.id, acme.id}


@pytest.mark.django_db(transaction=True)
def test_it_notifies_approvals_failed_runs_and_stranded_versions_but_never_its_own_runs():
    endpoint("everything", url="http://127.0.0.1:9/x", secret="s")
    waiting = make_approval()
    failed = make_run(status=RunStatus.FAILED, reason="workflow_error", error={"message": "boom"})
    stranded = make_run(reason="version_mismatch")
    compensation = make_run(reason="compensation_failed")
    own = make_run(status=RunStatus.FAILED, name="system.notify")
    make_effect(run=make_run(name="system.notify"))

    created = deliveries_create_recent()

    kinds = sorted(NotificationDelivery.objects.values_list("kind", "item"))
    assert kinds == sorted([
        ("approval_waiting", f"approval:{waiting.id}"), ("run_failed", f"run:{failed.id}"),
        ("version_mismatch", f"run:{stranded.id}"), ("compensation_failed", f"run:{compensation.id}"),
    ])
    assert created == 4 and not NotificationDelivery.objects.filter(run_id=own.id).exists()


# --- the signature ---------------------------------------------------------------------------------


class _Catcher(BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):  # noqa: N802
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append((dict(self.headers), raw))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def catcher():
    """A receiver in this process that records each POST's headers and bytes and answers 204."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Catcher)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    _Catcher.got = []
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def _post(hook: NotificationEndpoint, body: dict, key: str = "run-1:post") -> tuple[dict, bytes]:
    result = get_connector("webhook.post").execute({"delivery": 7, "endpoint": hook.id, "body": body}, key=key)
    assert result["status"] == 204
    return _Catcher.got[-1]


def _legacy_ok(secret: str, headers: dict, raw: bytes) -> bool:
    """What a receiver of the scheme before Standard Webhooks checks."""
    expected = hmac.new(secret.encode(), headers["X-Saga-Timestamp"].encode() + b"." + raw, hashlib.sha256)
    return headers.get("X-Saga-Signature") == f"sha256={expected.hexdigest()}"


@pytest.mark.django_db
def test_it_signs_every_body_so_a_standard_webhooks_receiver_can_check_it_with_the_secret_alone(catcher):
    body = {"text": "UNKNOWN effect: email", "blocks": []}
    headers, raw = _post(endpoint(url=catcher), body)
    # What a receiver written with the standardwebhooks library does, and nothing else.
    assert Webhook(SECRET).verify(raw, headers) == body
    assert headers["Webhook-Id"] == headers["Idempotency-Key"] == "run-1:post" and headers["X-Saga-Delivery"] == "7"
    assert abs(int(headers["Webhook-Timestamp"]) - time.time()) < 60
    assert "X-Saga-Signature" not in headers
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(raw.replace(b"email", b"e-mail"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(raw, {**headers, "Webhook-Id": "run-2:post"})


@pytest.mark.django_db
def test_it_signs_a_legacy_endpoint_as_before_until_staff_move_it_to_standard_webhooks(catcher, people):
    legacy = endpoint(url=catcher, secret=LEGACY_SECRET, scheme=SignatureScheme.LEGACY)
    headers, raw = _post(legacy, {"n": 1})
    assert _legacy_ok(LEGACY_SECRET, headers, raw) and "Webhook-Signature" not in headers

    staff = people["viewer"]
    staff.is_staff = True
    staff.save()
    page, rotate = (reverse(name, args=[legacy.id]) for name in ("console:notification_endpoint",
                                                                  "console:notification_endpoint_rotate"))
    html = client_for(staff).get(page).content.decode()
    assert "still signs with the legacy scheme" in html and '<option value="24" selected>' in html
    assert client_for(staff).post(rotate, {"keep_old_hours": "5"}).status_code == 400  # not a choice
    # The move, keeping the old secret for a day: both are sent, so the receiver is cut off neither
    # before it deploys its new check nor after.
    assert client_for(staff).post(rotate, {"keep_old_hours": "24"}).status_code == 302
    moved = NotificationEndpoint.objects.get(id=legacy.id)
    headers, raw = _post(moved, {"n": 2})
    assert _legacy_ok(LEGACY_SECRET, headers, raw) and Webhook(moved.secret).verify(raw, headers) == {"n": 2}
    entry = AuditEntry.objects.get(action="notification.secret_rotate")
    assert entry.before == {"signature_scheme": "saga-v1"} and entry.after["old_secret_signs_until"]
    assert LEGACY_SECRET not in json.dumps([entry.before, entry.after])
    html = client_for(staff).get(page).content.decode()
    assert "Signed with Standard Webhooks" in html and "The replaced secret signs too (legacy" in html
    # The read-only admin shows neither secret.
    admin = client_for(get_user_model().objects.create_superuser("root", password="pw-root-long-enough"))
    shown = admin.get(reverse("admin:console_notificationendpoint_change", args=[legacy.id]))
    assert shown.status_code == 200 and "legacy (X-Saga-Timestamp, X-Saga-Signature)" in shown.content.decode()
    assert LEGACY_SECRET not in shown.content.decode() and moved.secret not in shown.content.decode()

    # A standard secret rotated with an overlap: two v1 entries, either secret verifies.
    client_for(staff).post(rotate, {"keep_old_hours": "1"})
    again = NotificationEndpoint.objects.get(id=legacy.id)
    headers, raw = _post(again, {"n": 3})
    assert len(headers["Webhook-Signature"].split(" ")) == 2 and "X-Saga-Signature" not in headers
    assert Webhook(moved.secret).verify(raw, headers) == Webhook(again.secret).verify(raw, headers) == {"n": 3}
    # Once the overlap is over, only the new one signs.
    NotificationEndpoint.objects.filter(id=legacy.id).update(previous_until=again.previous_until - timedelta(days=1))
    headers, raw = _post(NotificationEndpoint.objects.get(id=legacy.id), {"n": 4})
    with pytest.raises(WebhookVerificationError):
        Webhook(moved.secret).verify(raw, headers)
    assert Webhook(again.secret).verify(raw, headers) == {"n": 4}


@pytest.mark.django_db
def test_it_sends_nothing_for_an_endpoint_whose_secret_is_not_a_standard_one(catcher):
    broken = endpoint(url=catcher, secret=LEGACY_SECRET)  # set by hand, scheme left standard
    with pytest.raises(Final, match="not a Standard Webhooks secret"):
        get_connector("webhook.post").execute({"delivery": 7, "endpoint": broken.id, "body": {}}, key="k")
    assert _Catcher.got == []


@pytest.mark.django_db
def test_it_retries_a_webhook_that_could_not_be_sent_rather_than_asking_a_person():
    from ledger import Retryable

    # A name that does not resolve, a port nobody listens on: no request went out, so the post is
    # retried (then failed), never UNKNOWN.
    for url in ("http://hooks.nonexistent.invalid/x", "http://127.0.0.1:9/hook"):
        hook = endpoint(url=url)
        with pytest.raises(Retryable, match="nothing was sent"):
            get_connector("webhook.post").execute({"delivery": 1, "endpoint": hook.id, "body": {}}, key="k")


# --- real workers, the real demo receiver ------------------------------------------------------------

MODULES = "tests.console.wf_notify"


@pytest.fixture
def receiver(procs, settings):
    """The demo providers (with their webhook receiver) as a real process, and an endpoint on it."""
    url = start_providers(procs, DEMO_WEBHOOK_SECRET=SECRET)
    settings.DEMO_PROVIDERS_URL = url
    endpoint("demo receiver", url=url + "/webhook/receive")
    return url


def _worker(procs, name, providers):
    return procs.worker(name, MODULES, DEMO_PROVIDERS_URL=providers, DEMO_PROVIDER_TIMEOUT="0.3",
                        NOTIFY_TIMEOUT="60", CONSOLE_URL="http://console.example")


def _order_with_unknown_email(number: str):
    """A real run whose email times out (UNKNOWN), so the worker's engine parks it NEEDS_ATTENTION."""
    faults.inject("email", "send", "timeout_after_work:1")
    return start("nt_email", {"id": number}, business_key=number, tenant="acme")


def _delivery(run):
    return NotificationDelivery.objects.filter(run_id=run.id, kind="unknown_effect").first()


@pytest.mark.django_db(transaction=True)
def test_it_delivers_a_signed_notification_to_the_receiver_seconds_after_an_effect_goes_unknown(procs, receiver):
    _worker(procs, "w1", receiver)
    run = _order_with_unknown_email("order-7")

    delivery = wait_until(lambda: _delivery(run), 30, what="a delivery for the UNKNOWN email")
    wait_until(lambda: delivery_states([delivery.id])[delivery.id] == "delivered", 30, what="delivered")

    [arrival] = WebhookArrival.objects.all()
    effect = EffectRecord.objects.get(run_id=run.id, step_name="email")
    latency = (arrival.received_at - effect.updated_at).total_seconds()
    print(f"UNKNOWN recorded -> notification arrived: {latency * 1000:.0f} ms")
    assert arrival.signature_ok and arrival.kind == "unknown_effect"
    assert arrival.body["business_key"] == "order-7" and arrival.body["tenant"] == "acme"
    assert arrival.body["link"] == "http://console.example/effects/"
    assert 0 <= latency < 5
    post = EffectRecord.objects.get(run_id=delivery.notify_run_id, step_name="post")
    assert (post.status, post.attempts, post.connector) == (EffectStatus.SUCCEEDED, 1, "webhook.post")
    assert arrival.idempotency_key == post.idempotency_key


class _Flaky(BaseHTTPRequestHandler):
    """A Standard Webhooks receiver written with the library: it answers 503 to the first two POSTs,
    then 204; it records, per POST, the headers and whether ``Webhook.verify`` took it."""

    got: list = []

    def do_POST(self):  # noqa: N802
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            Webhook(SECRET).verify(raw, dict(self.headers))
            verified = True
        except WebhookVerificationError:
            verified = False
        type(self).got.append((dict(self.headers), verified))
        self.send_response(503 if len(type(self).got) <= 2 else 204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.django_db(transaction=True)
def test_it_retries_a_receiver_answering_503_with_back_off_under_one_webhook_id_and_delivers_once(procs):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.got = []
    try:
        endpoint("flaky", url=f"http://127.0.0.1:{server.server_address[1]}/hook", kinds=["unknown_effect"])
        run = make_run(tenant="acme", business_key="order-8")
        make_effect(run=run, tenant="acme", step="email", connector="email.send")
        assert deliveries_create_for_run(str(run.id)) == 1
        procs.worker("w1", MODULES, NOTIFY_TIMEOUT="60")
        delivery = NotificationDelivery.objects.get()
        wait_until(lambda: delivery_states([delivery.id])[delivery.id] == "delivered", 40, what="delivered")
    finally:
        server.shutdown()

    post = EffectRecord.objects.get(run_id=delivery.notify_run_id, step_name="post")
    assert post.attempts == 3 and len(_Flaky.got) == 3
    # Every attempt verifies with the library; all carry the one webhook-id (the effect's key), each
    # signed anew at its own time: back-off of 1 s, then 2 s.
    assert all(verified for _, verified in _Flaky.got)
    assert {h["Webhook-Id"] for h, _ in _Flaky.got} == {post.idempotency_key}
    stamps = [int(h["Webhook-Timestamp"]) for h, _ in _Flaky.got]
    assert stamps[1] - stamps[0] >= 1 and stamps[2] - stamps[1] >= 2


@pytest.mark.django_db(transaction=True)
def test_it_never_delivers_twice_when_the_worker_is_killed_mid_delivery(procs, receiver):
    # The receiver stores the arrival, then holds its answer: the worker is killed while it waits.
    faults.inject("webhook", "receive", "timeout_after_work:30")
    first = _worker(procs, "w1", receiver)
    run = _order_with_unknown_email("order-9")

    wait_until(lambda: WebhookArrival.objects.exists(), 30, what="the notification to reach the receiver")
    first.kill()  # SIGKILL of its whole process group, mid-POST
    _worker(procs, "w2", receiver)

    delivery = _delivery(run)
    wait_until(lambda: delivery_states([delivery.id])[delivery.id] == "unknown", 30,
               what="the delivery to be UNKNOWN (another worker cannot know whether it arrived)")
    time.sleep(2)  # anything that would send it again has had its chance
    post = EffectRecord.objects.get(run_id=delivery.notify_run_id, step_name="post")
    assert post.status == EffectStatus.UNKNOWN
    assert WebhookArrival.objects.filter(idempotency_key=post.idempotency_key).count() == 1
    assert WebhookArrival.objects.count() == 1
    assert WorkflowRun.objects.get(id=delivery.notify_run_id).status == RunStatus.NEEDS_ATTENTION
    # and a notification about a notification is never sent
    assert not NotificationDelivery.objects.filter(run_id=delivery.notify_run_id).exists()


@pytest.mark.django_db(transaction=True)
def test_it_shows_deliveries_only_of_the_tenants_a_user_may_see(people):
    from operators.models import TenantScope

    endpoint("everything", secret="s")
    for tenant, key in (("acme", "order-acme-1"), ("globex", "order-globex-1")):
        make_effect(run=make_run(tenant=tenant, business_key=key), tenant=tenant)
    assert deliveries_create_recent() == 2
    TenantScope.objects.create(user=people["operator"], tenants=["acme"])

    limited = client_for(people["operator"]).get(reverse("console:notifications")).content.decode()
    everyone = client_for(people["viewer"]).get(reverse("console:notifications")).content.decode()
    assert "order-acme-1" in limited and "order-globex-1" not in limited
    assert "order-acme-1" in everyone and "order-globex-1" in everyone
    assert client_for(people["nobody"]).get(reverse("console:notifications")).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_it_sends_slack_a_text_and_blocks_body_where_a_business_key_cannot_ping_or_link():
    endpoint("slack", secret="s", format="slack")
    run = make_run(tenant="acme", business_key="<!channel> <https://evil.example|click> & co")
    make_effect(run=run, tenant="acme", step="email", connector="email.send")

    assert deliveries_create_recent() == 1
    body = NotificationDelivery.objects.get().body
    assert set(body) == {"text", "blocks"} and body["blocks"][0]["type"] == "section"
    sent = json.dumps(body)
    assert "<!channel>" not in sent and "<https://evil.example" not in sent
    assert "&lt;!channel&gt;" in body["text"] and "&amp; co" in body["text"]
    assert body["blocks"][1]["elements"][0]["text"].startswith("<http://")  # our own link stays a link
