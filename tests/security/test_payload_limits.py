"""Pages carry a bounded part of any payload: a preview, a marker saying how much is shown, and a
link that loads the rest on demand (or downloads it when it is too large to show).

A run whose input is ~5 MB and one of whose steps returned ~5 MB, an ambiguous effect whose
request and error message are ~5 MB, a settled one whose result is ~5 MB, an approval whose
reason is ~5 MB: every page stays small, and the whole value is one click away, redacted and
escaped, for any console role and nobody else.
"""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.urls import reverse

from console.templatetags.console_tags import REDACTED
from console.templatetags.payloads import EXPAND_MAX_CHARS, PREVIEW_CHARS
from ledger.models import EffectStatus
from sagas import start
from sagas.models import JournalEntry
from tests.console.conftest import client_for
from tests.console.queue_data import audit, make_approval, make_effect, make_run
from tests.console.run_data import append_entries

pytestmark = pytest.mark.django_db

MB = 1024 * 1024
PAGE_LIMIT = 300 * 1024  # bytes: what a page may weigh, whatever its payloads
HOSTILE = "<img src=x onerror=alert(1)>"
MARKER = re.compile(r"Showing the first (\d+) characters of ([\d.]+)\xa0(bytes|KB|MB)")


def _big(tag: str, size: int = 5 * MB) -> dict:
    """A JSON value of about ``size`` characters, with a secret and hostile HTML in it."""
    return {"tag": tag, "password": "hunter2", "note": HOSTILE, "rows": [f"{tag}-row-{i:07d}" for i in range(size // 20)]}


@pytest.fixture
def big_run():
    run = start("rp_plain", _big("input"), business_key="big-1")
    append_entries(run, 1, _big("step"))
    return run


def _get(client, url: str, **headers):
    response = client.get(url, **headers)
    assert response.status_code == 200, (url, response.status_code)
    return response


def _links(page: str) -> list[str]:
    """The "show all of it" links: their href and hx-get must be the same real URL."""
    pairs = re.findall(r'<a href="([^"]+)" hx-get="([^"]+)"[^>]*>show all of it</a>', page)
    assert all(href == get for href, get in pairs)
    return [unescape(href) for href, _ in pairs]


def _downloads(page: str) -> list[str]:
    return [unescape(u) for u in re.findall(r'<a href="([^"]+)" download>download all of it</a>', page)]


def test_it_keeps_the_run_and_history_pages_small_whatever_the_payloads(big_run, clients):
    viewer = clients["viewer"]
    run_page = _get(viewer, reverse("console:run", args=[big_run.id])).content.decode()
    history = _get(viewer, reverse("console:run_history", args=[big_run.id]) + "?before=999").content.decode()

    for page in (run_page, history):
        assert len(page.encode()) < PAGE_LIMIT
        shown = MARKER.findall(page)
        assert shown and all(int(chars) == PREVIEW_CHARS and unit == "MB" for chars, _, unit in shown)
        assert "hunter2" not in page and HOSTILE not in page
    # 5 MB is over the expand limit: downloads, never an inline expand of that size
    assert EXPAND_MAX_CHARS < 5 * MB
    input_url = reverse("console:run_payload", args=[big_run.id, "input"])
    step_url = reverse("console:run_item_payload", args=[big_run.id, "entry", big_run.last_seq])
    assert f"{input_url}?download=1" in _downloads(run_page)
    assert f"{step_url}?download=1" in _downloads(run_page) and f"{step_url}?download=1" in _downloads(history)


def test_it_keeps_the_effects_and_approvals_pages_small(clients):
    run = make_run(business_key="big-2")
    effect = make_effect(run=run, request_payload=_big("request"), error_message="timeout " + "x" * 5 * MB)
    make_approval(reason="Ship it? " + "y" * 5 * MB)
    viewer = clients["viewer"]

    effects = _get(viewer, reverse("console:effects")).content.decode()
    approvals = _get(viewer, reverse("console:approvals")).content.decode()

    for page in (effects, approvals):
        assert len(page.encode()) < PAGE_LIMIT
        assert MARKER.search(page)
    request_url = reverse("console:run_item_payload", args=[run.id, "effect-request", effect.id])
    assert f"{request_url}?download=1" in _downloads(effects)
    assert "hunter2" not in effects and HOSTILE not in effects


def test_it_expands_a_medium_payload_in_full_redacted_and_escaped(clients):
    run = start("rp_plain", _big("medium", size=40_000), business_key="medium-1")
    viewer = clients["viewer"]
    page = _get(viewer, reverse("console:run", args=[run.id])).content.decode()
    url = reverse("console:run_payload", args=[run.id, "input"])
    assert url in _links(page)  # small enough to expand in place
    assert len(re.search(r"medium-row-\d+", page).group()) and page.count("medium-row-") < 100

    fragment = _get(viewer, url, HTTP_HX_REQUEST="true")
    body = fragment.content.decode()
    assert fragment["Content-Type"].startswith("text/html")
    assert body.count("medium-row-") == 2000 and "<html" not in body
    assert "hunter2" not in body and REDACTED in body
    assert HOSTILE not in body and "&lt;img src=x onerror=alert(1)&gt;" in body

    plain = _get(viewer, url)  # the real href, without JavaScript: the whole text, as text
    assert plain["Content-Type"].startswith("text/plain") and plain.content.decode().count("medium-row-") == 2000
    assert "hunter2" not in plain.content.decode()


def test_it_downloads_a_large_payload_as_redacted_json(big_run, clients):
    viewer = clients["viewer"]
    for url in (reverse("console:run_payload", args=[big_run.id, "input"]),
                reverse("console:run_item_payload", args=[big_run.id, "entry", big_run.last_seq])):
        response = _get(viewer, url + "?download=1")
        assert response["Content-Type"].startswith("application/json")
        assert response["Content-Disposition"].startswith("attachment;")
        data = json.loads(response.content)
        assert data["password"] == REDACTED and len(data["rows"]) == 5 * MB // 20
        # asked for inline by htmx anyway: the page gets the preview and the download link, not 5 MB
        swapped = _get(viewer, url, HTTP_HX_REQUEST="true").content.decode()
        assert len(swapped) < 10_000 and f"{url}?download=1" in _downloads(swapped)


def test_it_serves_every_kind_of_value_in_full(clients):
    run = make_run(input={"a": 1}, result={"b": 2}, error={"message": "boom"})
    effect = make_effect(run=run, status=EffectStatus.SUCCEEDED, result={"receipt": "r" * 3000},
                         error_message="e" * 3000)
    approval = make_approval(run=run, reason="why " * 1000)
    JournalEntry.objects.create(run=run, seq=1, kind="step", name="s", payload={"c": 3}, created_at=run.created_at)
    viewer = clients["viewer"]
    expected = {
        ("input", None): '"a": 1', ("result", None): '"b": 2', ("error", None): "boom", ("entry", 1): '"c": 3',
        ("effect-request", effect.id): "amount_cents", ("effect-result", effect.id): "r" * 3000,
        ("effect-error", effect.id): "e" * 3000, ("approval-reason", approval.id): "why " * 999,
    }
    for (kind, item), needle in expected.items():
        args = [run.id, kind] if item is None else [run.id, kind, item]
        name = "console:run_payload" if item is None else "console:run_item_payload"
        assert needle in _get(viewer, reverse(name, args=args)).content.decode(), kind


def test_it_lets_any_console_role_read_a_payload_and_nobody_else(clients, people):
    run = start("rp_plain", _big("medium", size=40_000))
    url = reverse("console:run_payload", args=[run.id, "input"])
    for role in ("viewer", "operator", "approver", "superuser"):
        assert clients[role].get(url).status_code == 200, role
    anonymous = clients["anonymous"].get(url)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert client_for(people["nobody"]).get(url).status_code == 403  # logged in, no console role


def test_it_answers_404_for_unknown_values(big_run, clients):
    viewer = clients["viewer"]
    other = make_run()
    effect = make_effect(run=other)
    missing = [
        reverse("console:run_payload", args=["00000000-0000-0000-0000-000000000000", "input"]),
        reverse("console:run_payload", args=[big_run.id, "password"]),  # not a kind
        reverse("console:run_item_payload", args=[big_run.id, "entry", 999_999]),
        reverse("console:run_item_payload", args=[big_run.id, "entry", 2**40]),  # larger than any seq
        reverse("console:run_item_payload", args=[big_run.id, "effect-request", effect.id]),  # another run's
        reverse("console:run_item_payload", args=[big_run.id, "approval-reason", 2**70]),
        reverse("console:audit_payload", args=[2**31, "before"]),
    ]
    for url in missing:
        assert viewer.get(url).status_code == 404, url


def test_it_truncates_audit_payloads_and_reasons(clients):
    entry = audit(before=_big("before", size=MB), after={"status": "SUCCEEDED"}, reason="because " + "z" * MB)
    viewer = clients["viewer"]
    page = _get(viewer, reverse("console:audit")).content.decode()
    assert len(page.encode()) < PAGE_LIMIT and len(MARKER.findall(page)) == 2
    before = reverse("console:audit_payload", args=[entry.id, "before"])
    assert f"{before}?download=1" in _downloads(page)
    data = json.loads(_get(viewer, before + "?download=1").content)
    assert data["password"] == REDACTED and data["tag"] == "before"
    reason = _get(viewer, reverse("console:audit_payload", args=[entry.id, "reason"]) + "?download=1")
    assert reason["Content-Type"].startswith("text/plain") and len(reason.content) == len("because ") + MB


def test_it_cuts_a_long_run_error_message(clients):
    token = "Bearer sk_live_0123456789abcdef"
    run = make_run(error={"message": f"upstream said Authorization: {token} " + "e" * 5 * MB})
    page = _get(clients["viewer"], reverse("console:run", args=[run.id])).content.decode()
    assert len(page.encode()) < PAGE_LIMIT
    assert "sk_live_0123456789abcdef" not in page and "upstream said Authorization:" in page
