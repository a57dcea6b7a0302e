"""Action results are messages outside the live regions: a push re-renders a region
and must not take the result of the operator's last action with it."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from console import live
from tests.console.conftest import client_for
from tests.console.queue_data import make_effect, resolve, text
from tests.console.run_data import act, waiting_run

pytestmark = pytest.mark.django_db

OOB = 'hx-swap-oob="afterbegin:#messages"'


def _region(html: str, name: str) -> str:
    """The live region ``name`` of an htmx answer (up to the messages appended after it)."""
    start = html.index(f'id="live-{name}"')
    end = html.find(OOB, start)
    return html[start:end if end >= 0 else len(html)]


def test_it_answers_an_htmx_action_with_its_message_out_of_band_and_outside_the_region(people):
    effect = make_effect()
    client = client_for(people["operator"])
    response = client.post(reverse("console:effect_resolve", args=[effect.id]),
                           {"outcome": "failed", "note": "provider says never charged", "expected": "UNKNOWN"},
                           HTTP_HX_REQUEST="true")
    html = text(response)
    assert response.status_code == 200 and OOB in html
    said = f"Effect #{effect.id} (capture) resolved as failed"
    assert said in html and said not in _region(html, "effects_queue")
    # a success is announced by the polite #messages region it goes into, not a live region of its own
    assert re.search(r'class="action-message success" tabindex="-1">.*' + re.escape(said), html)
    assert 'class="action-message-dismiss"' in html

    refused = client.post(reverse("console:effect_resolve", args=[effect.id]),
                          {"outcome": "failed", "note": "again", "expected": "UNKNOWN"}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 409 and OOB in text(refused)
    assert 'class="action-message error" role="alert"' in text(refused)

    # What a push carries: the region, never a message.
    pushed = live.render_fragment("effects_queue", people["operator"], {})
    assert "action-message" not in pushed and "resolved as failed" not in pushed


def test_it_shows_a_refusal_without_javascript_in_the_messages_area_with_a_dismiss_button(people):
    effect = make_effect()
    client = client_for(people["operator"])
    assert resolve(client, effect).status_code == 302
    page = resolve(client, effect)  # already resolved: refused, the page again
    html = text(page)
    assert page.status_code == 409
    messages = html[html.index('id="messages"'):html.index('id="live-effects_queue"')]
    assert "action-message error" in messages and "action-message-dismiss" in messages


def test_it_answers_a_run_action_with_the_live_actions_region_and_a_message(people):
    run = waiting_run()
    client = client_for(people["operator"])
    response = client.post(reverse("console:run_cancel", args=[run.id]),
                           {"reason": "duplicate order", "expected": "WAITING"}, HTTP_HX_REQUEST="true")
    html = text(response)
    assert response.status_code == 200
    assert 'id="live-run_actions"' in html and "Cancel…" not in _region(html, "run_actions")
    assert OOB in html and "Run cancelled." in html and "Run cancelled." not in _region(html, "run_actions")

    stale = act(client, run, "cancel", expected="WAITING")  # without htmx: the page, the refusal on top
    assert stale.status_code == 409
    assert re.search(r'id="messages".*action-message error.*it changed since you loaded the page', text(stale),
                     re.S)
