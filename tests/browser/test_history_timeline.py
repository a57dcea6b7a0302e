"""In a real browser: a run's history of 20 entries is one compact row each, well under a
screen and a half (it was about 5,000 px of pretty-printed JSON); a payload opens on demand and
its "show all of it" loads the rest; "go to entry" lands on the entry, highlighted."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from sagas.models import RunStatus
from tests.console.history_data import order_history
from tests.console.queue_data import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_shows_20_entries_compactly_and_opens_payloads_on_demand(console, users):
    run = make_run(status=RunStatus.COMPLETED, reason="", name="orders")
    order_history(run)
    page = console.page("vic", f"/runs/{run.id}/history/")
    rows = page.locator("ol.timeline > li.entry")
    expect(rows).to_have_count(20)
    height = page.evaluate("document.body.scrollHeight")
    print(f"history page, 20 entries, {page.viewport_size['width']} px wide: {height} px high")
    assert height < 1500
    console.shot(page, "history")

    # Each row: millisecond time with its zone, the gap, the kind, the worker.
    expect(page.locator("#seq-2 time")).to_have_text("23:59:58.357 UTC")
    expect(page.locator("#seq-2 .entry-gap")).to_have_text("+12 ms")
    expect(page.locator("#seq-2 .entry-worker")).to_have_text("worker-1@ops-a:4242")
    # The charge's intent points at its outcome, and the outcome back.
    expect(page.locator("#seq-4 .entry-pair")).to_contain_text("#5 SUCCEEDED after 377 ms")
    expect(page.locator("#seq-5 .entry-pair")).to_contain_text("of #4 SUCCEEDED after 377 ms")

    # A payload is folded; it opens on a click, and the rest of a long one loads on demand.
    label = page.locator("#seq-16 details.entry-payload")
    expect(label.locator("pre.payload")).to_be_hidden()
    label.locator("summary").click()
    expect(label.locator("pre.payload")).to_be_visible()
    expect(label.locator("pre.payload")).not_to_contain_text("end-of-label")
    label.get_by_text("show all of it").click()
    expect(label.locator("pre.payload")).to_contain_text("end-of-label")
    assert page.evaluate("document.body.scrollHeight") > height  # it takes room only when asked

    # Go to an entry: its page, scrolled to it and highlighted.
    page.fill("input[name=seq]", "3")
    page.get_by_role("button", name="Go", exact=True).click()
    page.wait_for_url(re.compile(r".*/history/#seq-3$"))
    assert page.evaluate("document.querySelector('#seq-3').matches(':target')")
    background = page.evaluate("getComputedStyle(document.querySelector('#seq-3')).backgroundColor")
    assert background == "rgb(255, 244, 194)"
