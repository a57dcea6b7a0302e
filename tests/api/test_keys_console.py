"""API keys in the console (staff): listed with their state, expired now or revoked with a
confirmation and a reason, each audited; the hooks listed without secrets; and a key's rate."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from api.keys import apikey_create, apikey_revoke
from api.models import ApiKey, Hook
from operators import roles
from operators.models import AuditEntry, AuditOutcome
from tests.api.conftest import login

pytestmark = pytest.mark.django_db
NO_RUN = "/api/v1/runs/00000000-0000-0000-0000-000000000000"


def api_get(key: str, path: str = NO_RUN):
    return Client().get(path, HTTP_AUTHORIZATION=f"Bearer {key}")


def test_it_lists_every_key_with_its_state_and_the_hooks_without_their_secrets():
    apikey_create(name="orders", role="operator", tenants=["acme", "globex"], rate_per_minute=120)
    apikey_create(name="old-batch", role="viewer", expires_at=timezone.now() - timedelta(days=1))
    gone, _ = apikey_create(name="leaked", role="approver")
    apikey_revoke(key=gone, by="alice")
    Hook.objects.create(name="payments", secret="whsec-never-shown-7f3a", signal="<script>alert(1)</script>",
                        tenant="acme", signature_scheme="saga-v1")  # made before Standard Webhooks
    page = login("sam", is_staff=True).get(reverse("console:api_keys"))
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("orders", "acme, globex", "ACTIVE", "old-batch", "EXPIRED", "leaked", "REVOKED", "by <bdi>alice</bdi>",
                 "120", "every tenant", "manage.py createapikey", "payments", "legacy: rotate its secret",
                 "manage.py rotatehook NAME"):
        assert text in html, text
    assert "whsec-never-shown-7f3a" not in html
    assert not any(key.secret_hash in html for key in ApiKey.objects.all())
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # strict CSP: no inline script or style allowed on the page
    csp = page["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    # the nav shows the page to staff only
    assert f'href="{reverse("console:api_keys")}"' in html
    viewer_home = login("vic", roles.VIEWER).get(reverse("console:overview")).content.decode()
    assert reverse("console:api_keys") not in viewer_home


def test_it_turns_away_anyone_but_staff_and_audits_their_attempt():
    model, key = apikey_create(name="orders", role="operator")
    url = reverse("console:api_key_revoke", args=[model.id])
    anonymous = Client().get(reverse("console:api_keys"))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    superop = login("ops", roles.VIEWER, roles.OPERATOR, roles.APPROVER)
    assert superop.get(reverse("console:api_keys")).status_code == 403
    assert superop.post(url, {"reason": "not mine to do", "confirm": "yes"}).status_code == 403
    denied = AuditEntry.objects.get(action="apikey.revoke")
    assert (denied.outcome, denied.object_type, denied.object_id, denied.actor_label) == \
        (AuditOutcome.DENIED, "apikey", "orders", "ops")
    assert ApiKey.objects.get(pk=model.id).state == "ACTIVE" and api_get(key).status_code == 404


def test_it_revokes_a_key_after_confirmation_with_a_reason_and_audits_it_in_one_go():
    model, key = apikey_create(name="orders", role="operator")
    staff = login("sam", is_staff=True)
    url = reverse("console:api_key_revoke", args=[model.id])
    no_reason = staff.post(url, {"reason": "  ", "confirm": "yes"})
    assert no_reason.status_code == 400 and "A reason is required" in no_reason.content.decode()
    unconfirmed = staff.post(url, {"reason": "leaked in a log"})
    assert unconfirmed.status_code == 400 and "Tick the box to confirm" in unconfirmed.content.decode()
    assert ApiKey.objects.get(pk=model.id).state == "ACTIVE"
    assert not AuditEntry.objects.filter(object_type="apikey").exists()
    done = staff.post(url, {"reason": "leaked in a log", "confirm": "yes"}, follow=True)
    assert done.status_code == 200 and "Key “orders” revoked" in done.content.decode()
    model.refresh_from_db()
    assert model.state == "REVOKED" and model.revoked_by == "sam" and not model.user.is_active
    entry = AuditEntry.objects.get(action="apikey.revoke")
    assert (entry.outcome, entry.object_type, entry.object_id, entry.reason) == \
        (AuditOutcome.OK, "apikey", "orders", "leaked in a log")
    assert entry.before["state"] == "ACTIVE" and entry.after["state"] == "REVOKED"
    assert api_get(key).status_code == 401
    again = staff.post(url, {"reason": "twice", "confirm": "yes"})
    assert again.status_code == 409 and "revoked already" in again.content.decode()
    assert AuditEntry.objects.filter(action="apikey.revoke", outcome=AuditOutcome.REFUSED).count() == 1


def test_it_expires_a_key_now_and_a_revocation_can_still_follow():
    model, key = apikey_create(name="batch", role="viewer")
    assert api_get(key).status_code == 404  # the key works: no such run
    staff = login("root", is_superuser=True)
    expired = staff.post(reverse("console:api_key_expire", args=[model.id]),
                         {"reason": "job retired", "confirm": "on"})
    assert expired.status_code == 302
    model.refresh_from_db()
    assert model.state == "EXPIRED" and model.user.is_active
    assert api_get(key).status_code == 401
    entry = AuditEntry.objects.get(action="apikey.expire")
    assert (entry.outcome, entry.object_id, entry.actor_label) == (AuditOutcome.OK, "batch", "root")
    assert staff.post(reverse("console:api_key_expire", args=[model.id]),
                      {"reason": "again", "confirm": "on"}).status_code == 409
    assert staff.post(reverse("console:api_key_revoke", args=[model.id]),
                      {"reason": "for good", "confirm": "on"}).status_code == 302
    assert ApiKey.objects.get(pk=model.id).state == "REVOKED"
    assert staff.post(reverse("console:api_key_revoke", args=[99999]),
                      {"reason": "x", "confirm": "on"}).status_code == 404


def test_it_refuses_a_post_without_the_csrf_token():
    model, _ = apikey_create(name="orders", role="operator")
    user = User.objects.create_user("sam", password="pw-for-tests", is_staff=True)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    forged = client.post(reverse("console:api_key_revoke", args=[model.id]), {"reason": "x", "confirm": "yes"})
    assert forged.status_code == 403 and ApiKey.objects.get(pk=model.id).state == "ACTIVE"


def test_it_answers_429_problem_json_on_the_call_past_the_key_rate():
    _, key = apikey_create(name="slow", role="viewer", rate_per_minute=3)
    if time.time() % 60 > 55:  # the window is a clock minute: do not straddle two
        time.sleep(60 - time.time() % 60 + 0.1)
    assert [api_get(key).status_code for _ in range(3)] == [404, 404, 404]
    limited = api_get(key)
    assert limited.status_code == 429 and limited["Content-Type"] == "application/problem+json"
    body = json.loads(limited.content)
    assert body["type"].endswith("/rate-limited") and "3 requests a minute" in body["detail"]
    assert 0 < body["retry_after"] <= 60
    assert limited["Retry-After"] == str(max(1, body["retry_after"]))  # what HTTP clients and proxies read
    _, other = apikey_create(name="other", role="viewer", rate_per_minute=3)
    assert api_get(other).status_code == 404  # the limit is per key
