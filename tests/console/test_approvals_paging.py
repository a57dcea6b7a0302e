"""The approvals inbox in pages of 50, soonest deadline first: every open approval is reachable
(before, only the first 100 were shown and the rest could not be reached), a decision taken
on page 2 answers with page 2, live pushes keep the page, and a damaged page link says so."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from console.views.queues import approvals_fragment
from operators.selectors.queues import INBOX_LIMIT
from sagas.models import ApprovalState, RunStatus
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_run

pytestmark = pytest.mark.django_db

OPEN = 120


@pytest.fixture
def inbox():
    """120 open approvals with deadlines 1..120 minutes away (ids in that order), and one more
    whose run no longer waits (it never shows)."""
    made = [make_approval(run=make_run(status=RunStatus.WAITING, reason="", business_key=f"order-{i:03d}"),
                          step=f"ship-{i:03d}", deadline_in=timedelta(minutes=i + 1))
            for i in range(OPEN)]
    gone = make_approval(run=make_run(status=RunStatus.COMPLETED, reason=""), step="ship-gone",
                         deadline_in=timedelta(minutes=30, seconds=30))
    return made, gone


def shown(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="approval-(\d+)" data-action-row', html)]


def next_link(html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', html)
    return found.group(1).replace("&amp;", "&") if found else None


def test_it_pages_every_open_approval_once_in_deadline_order(people, inbox):
    made, gone = inbox
    client = client_for(people["approver"])
    html = client.get(reverse("console:approvals")).content.decode()
    assert f"<strong>{OPEN}</strong> approvals waiting, {INBOX_LIMIT} on this page: the soonest deadlines." in html
    seen, pages = shown(html), 1
    while (url := next_link(html)) is not None:
        assert "← soonest deadlines" not in html or pages > 1
        response = client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        assert "← soonest deadlines" in html  # back to page 1
        seen += shown(html)
        pages += 1
    assert pages == 3 and seen == [a.id for a in made]  # each once, soonest first, the gone one never
    assert gone.id not in seen


def test_a_decision_on_page_two_answers_with_page_two(people, inbox):
    made, _ = inbox
    client = client_for(people["approver"])
    page2 = next_link(client.get(reverse("console:approvals")).content.decode())
    after = page2.split("after=")[1]
    target = made[INBOX_LIMIT + 3]
    url = reverse("console:approval_decide", args=[target.id])
    form = {"decision": "approve", "expected": ApprovalState.PENDING, "comment": "address checked", "after": after}

    answer = client.post(url, form, HTTP_HX_REQUEST="true").content.decode()
    rows = shown(answer)
    assert target.id not in rows and made[INBOX_LIMIT].id in rows and made[0].id not in rows  # still page 2
    assert f'<input type="hidden" name="after" value="{after}">' in answer  # its forms carry the page on

    plain = client.post(reverse("console:approval_decide", args=[made[INBOX_LIMIT + 4].id]),
                        {**form, "expected": ApprovalState.PENDING})
    assert plain.status_code == 302 and plain["Location"] == f"{reverse('console:approvals')}?after={after}"


def test_a_live_push_renders_the_page_the_browser_shows(people, inbox):
    made, _ = inbox
    client = client_for(people["approver"])
    page = client.get(reverse("console:approvals")).content.decode()
    after = next_link(page).split("after=")[1]
    page2 = client.get(f"{reverse('console:approvals')}?after={after}").content.decode()
    assert f"after={after}" in re.search(r'ws-connect="([^"]+)"', page2).group(1).replace("&amp;", "&")
    pushed = approvals_fragment(people["approver"], {"after": after})
    assert shown(pushed)[0] == made[INBOX_LIMIT].id


@pytest.mark.parametrize("damaged", ["nonsense", "1_2_3", "9" * 81])
def test_a_damaged_page_link_shows_the_first_page_and_says_so(people, inbox, damaged):
    made, _ = inbox
    response = client_for(people["viewer"]).get(reverse("console:approvals"), {"after": damaged})
    html = response.content.decode()
    assert response.status_code == 400
    assert "That page link is not valid" in html
    assert shown(html)[:INBOX_LIMIT] == [a.id for a in made[:INBOX_LIMIT]]
