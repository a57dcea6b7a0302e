"""What every queue page and the audit log share: login, a console role and CSRF for every page
and action, escaped hostile text, and a live region per page."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from console import live
from ledger.models import EffectStatus
from operators.models import AuditEntry, AuditOutcome
from sagas.models import (
    ApprovalState,
)
from tests.console.conftest import client_for
from tests.console.queue_data import (
    ESCAPED,
    HOSTILE,
    make_approval,
    make_effect,
    resolve,
    text,
)

pytestmark = pytest.mark.django_db


def test_it_requires_login_on_every_page_and_action():
    effect = make_effect()
    approval = make_approval()
    anonymous = Client()
    for name in ("effects", "approvals", "versions", "audit", "audit_csv"):
        response = anonymous.get(reverse(f"console:{name}"))
        assert response.status_code == 302 and reverse("console:login") in response["Location"], name
    for url in (reverse("console:effect_query", args=[effect.id]), reverse("console:effect_resolve", args=[effect.id]),
                reverse("console:approval_decide", args=[approval.id])):
        assert anonymous.post(url, {"decision": "approve", "note": "x"}).status_code == 302
    effect.refresh_from_db()
    approval.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN and approval.state == ApprovalState.PENDING


def test_it_refuses_pages_to_an_account_without_a_console_role(people):
    response = client_for(people["nobody"]).get(reverse("console:effects"))
    assert response.status_code == 403


def test_it_refuses_an_action_without_a_csrf_token(people):
    effect = make_effect()
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    response = resolve(client, effect)
    assert response.status_code == 403
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_it_escapes_hostile_payload_text_everywhere(people):
    effect = make_effect(error_message=f"provider said {HOSTILE}", request_payload={"note": HOSTILE})
    make_approval(reason=f"ship {HOSTILE}")
    AuditEntry.objects.create(actor_label="olga", action="effect.resolve", object_type="effect",
                              object_id=str(effect.id), outcome=AuditOutcome.OK, reason=HOSTILE,
                              before={"state": HOSTILE}, after={"state": "SUCCEEDED"})
    client = client_for(people["operator"])
    for name in ("effects", "approvals", "audit"):
        page = text(client.get(reverse(f"console:{name}")))
        assert ESCAPED in page, name
        assert HOSTILE not in page, name


def test_it_registers_a_live_fragment_for_each_page(people):
    make_effect()
    make_approval()
    client = client_for(people["operator"])
    for page, fragment in (("effects", "effects_queue"), ("approvals", "approvals_inbox"),
                           ("versions", "versions_list"), ("audit", "audit_log")):
        body = text(client.get(reverse(f"console:{page}")))
        assert f"fragments={fragment}" in body, page
        assert body.count(f'id="live-{fragment}"') == 1, page
        pushed = live.render_fragment(fragment, people["operator"], {})
        assert pushed.count(f'<div id="live-{fragment}"') == 1, page
    pushed = live.render_fragment("effects_queue", people["viewer"], {})
    assert "Record resolution" not in pushed  # the viewer's push shows no actions either
