"""Keyboard and screen-reader users: a skip link, row actions named by their run and
step, one persistent polite live region for the results of actions, the live connection status
as a status, and form errors announced as alerts and tied to their fields."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client
from django.urls import reverse

from sagas.models import RunStatus
from tests.console.conftest import client_for
from tests.console.queue_data import HOSTILE, make_approval, make_effect, make_run, text
from tests.console.run_data import waiting_run

pytestmark = pytest.mark.django_db

OOB_INTO_MESSAGES = 'hx-swap-oob="afterbegin:#messages"'


def accessible_text(fragment: str) -> str:
    """The text a screen reader reads for an element's content: tags dropped, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def names(page: str, tag: str, marker: str) -> list[str]:
    """The accessible names of every ``tag`` element whose opening tag contains ``marker``."""
    pattern = rf"<{tag}\b[^>]*{re.escape(marker)}[^>]*>(.*?)</{tag}>"
    return [accessible_text(inner) for inner in re.findall(pattern, page, flags=re.S)]


def short(run) -> str:
    return str(run.id)[:8]


def test_it_names_each_approval_action_by_its_step_run_and_business_key(people):
    first = make_approval(run=make_run(status=RunStatus.WAITING, reason="", business_key="order-1042"),
                          step="charge_card")
    second = make_approval(run=make_run(status=RunStatus.WAITING, reason="", business_key="order-1043"),
                           step="ship_goods")
    page = text(client_for(people["approver"]).get(reverse("console:approvals")))

    assert names(page, "button", 'value="approve"') == [
        f"Approve charge_card on run {short(first.run)} (order-1042)",
        f"Approve ship_goods on run {short(second.run)} (order-1043)",
    ]
    assert names(page, "summary", 'data-row-action="reject"') == [
        f"Reject… charge_card on run {short(first.run)} (order-1042)",
        f"Reject… ship_goods on run {short(second.run)} (order-1043)",
    ]
    assert names(page, "button", 'value="reject"')[0] == (
        f"Reject and compensate charge_card on run {short(first.run)} (order-1042)")
    # What is seen stays as it was: the name only adds hidden words after it.
    assert re.search(r'data-row-action="approve">Approve<span class="visually-hidden"> ', page)


def test_it_names_each_effect_action_by_its_effect_step_and_run(people):
    run = make_run(business_key="order-7")
    effect = make_effect(run=run, step="capture", connector="qp.lookup")
    page = text(client_for(people["operator"]).get(reverse("console:effects")))
    target = f"effect #{effect.id}, capture on run {short(run)} (order-7)"
    assert names(page, "button", 'data-row-action="query"') == [f"Query provider {target}"]
    assert names(page, "summary", 'data-row-action="resolve"') == [f"Resolve… {target}"]
    assert names(page, "button", 'class="primary"')[-1] == f"Record resolution {target}"


def test_it_keeps_a_hostile_business_key_escaped_in_an_actions_name(people):
    make_approval(run=make_run(status=RunStatus.WAITING, reason="", business_key=HOSTILE), step="ship")
    page = text(client_for(people["approver"]).get(reverse("console:approvals")))
    assert HOSTILE not in page
    assert names(page, "button", 'value="approve"')[0].endswith(f"({HOSTILE})")  # read as text, never run


def test_it_names_the_run_on_the_run_pages_actions(people):
    run = waiting_run("o-55")
    page = text(client_for(people["operator"]).get(reverse("console:run", args=[run.id])))
    assert names(page, "summary", "") and f"Cancel… run {short(run)} (o-55)" in names(page, "summary", "")
    assert f"Cancel the run {short(run)}" in names(page, "button", 'class="danger"')


def test_it_starts_every_page_with_a_skip_link_to_the_main_content(people):
    page = text(client_for(people["operator"]).get(reverse("console:overview")))
    body = page[page.index("<body"):]
    first_focusable = re.compile(r"<(a|button|input|select|textarea|summary)\b[^>]*>").search(body, body.index(">"))
    assert first_focusable.group(0) == '<a class="skip-link" href="#main">'
    assert accessible_text(body[first_focusable.start():body.index("</a>")]) == "Skip to main content"
    assert re.search(r'<main id="main" tabindex="-1"', page)


def test_it_has_one_persistent_polite_live_region_and_announces_the_connection_status(people):
    make_approval()
    page = text(client_for(people["approver"]).get(reverse("console:approvals")))
    assert re.search(r'<div id="messages" class="action-messages" aria-live="polite">', page)
    assert page.count("aria-live=") == 1  # the inbox region itself is not live: the notices are
    status = re.search(r'<span [^>]*id="live-status"[^>]*>', page).group(0)
    assert 'role="status"' in status


def test_it_inserts_an_htmx_actions_notice_into_the_region_and_never_replaces_it(people):
    approval = make_approval(run=make_run(status=RunStatus.WAITING, reason="", business_key="order-9"))
    response = client_for(people["approver"]).post(
        reverse("console:approval_decide", args=[approval.id]),
        {"decision": "approve", "expected": "PENDING", "comment": ""}, HTTP_HX_REQUEST="true")
    answer = text(response)
    assert response.status_code == 200
    assert OOB_INTO_MESSAGES in answer and 'id="messages"' not in answer
    notice = answer[answer.index(OOB_INTO_MESSAGES):]
    assert re.search(r'class="action-message success" tabindex="-1"><p>Approved', notice)
    # a success is read by the region (no nested live region of its own); focus may land on it
    assert 'role="status"' not in notice


def test_it_shows_a_notice_without_javascript_inside_the_region(people):
    approval = make_approval()
    client = client_for(people["approver"])
    response = client.post(reverse("console:approval_decide", args=[approval.id]),
                           {"decision": "approve", "expected": "PENDING"}, follow=True)
    page = text(response)
    region = page[page.index('<div id="messages"'):page.index('id="live-approvals_inbox"')]
    assert "Approved" in region and 'class="action-message success"' in region


def test_it_announces_a_failed_login_and_marks_both_fields(people):
    response = Client().post(reverse("console:login"), {"username": "vera", "password": "not her password"})
    page = text(response)
    assert re.search(r'<p class="error" id="login-error" role="alert">Wrong username or password.</p>', page)
    for name in ("username", "password"):
        field = re.search(rf'<input [^>]*name="{name}"[^>]*>', page).group(0)
        assert 'aria-invalid="true"' in field and 'aria-describedby="login-error"' in field
    fresh = text(Client().get(reverse("console:login")))
    assert "aria-invalid" not in fresh and 'role="alert"' not in fresh


def test_it_announces_a_form_error_and_ties_it_to_its_field(people):
    staff = people["viewer"]
    staff.is_staff = True
    staff.save()
    response = client_for(staff).post(reverse("console:notification_endpoints"), {
        "name": "ops chat", "url": "ftp://example.com/x", "format": "slack", "kinds": ["run_failed"],
        "tenants": "", "active": "on"})
    page = text(response)
    assert response.status_code == 400
    alert = re.search(r'<div class="form-problems" role="alert">(.*?)</div>', page, flags=re.S).group(1)
    assert '<p class="flash error" id="id_url_error">The URL must start with http:// or https://.</p>' in alert
    url = re.search(r'<input [^>]*name="url"[^>]*>', page).group(0)
    assert 'aria-invalid="true"' in url and 'aria-describedby="id_url_error"' in url
    name = re.search(r'<input [^>]*name="name"[^>]*>', page).group(0)
    assert "aria-invalid" not in name


def test_it_announces_a_bulk_confirmation_error_and_marks_the_missing_reason(people):
    effect = make_effect()
    client = client_for(people["operator"])
    preview = client.post(reverse("console:bulk_preview"), {"action": "effect.resolve", "scope": "selected",
                                                            "ids": [str(effect.id)]})
    assert preview.status_code == 302
    response = client.post(preview["Location"] + "confirm/",
                           {"action": "effect.resolve", "outcome": "failed", "reason": "", "confirm": "yes"})
    page = text(response)
    assert response.status_code == 400
    assert re.search(r'<p class="flash error" role="alert" id="bulk-error">A reason is required', page)
    reason = re.search(r"<textarea [^>]*name=\"reason\"[^>]*>", page).group(0)
    assert 'aria-invalid="true"' in reason and 'aria-describedby="bulk-error"' in reason
    outcome = re.search(r'<select [^>]*name="outcome"[^>]*>', page).group(0)
    assert "aria-invalid" not in outcome and 'aria-describedby="bulk-error"' in outcome


def test_it_names_each_rows_tick_box_by_its_step_and_run(people):
    approval = make_approval(run=make_run(status=RunStatus.WAITING, reason="", business_key="order-5"), step="ship")
    page = text(client_for(people["approver"]).get(reverse("console:approvals")))
    box = re.search(rf'<input type="checkbox" name="ids" value="{approval.id}"[^>]*>', page).group(0)
    assert f'aria-label="select approval {approval.id}: ship on run {short(approval.run)} (order-5)"' in box
