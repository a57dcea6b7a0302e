"""In a real browser: a workflow name ending in a right-to-left override does not flip the text
after it. The run page's title reads "orders-‮x v1 RUNNING" left to right: the version and the
status stay to the right of the name (before, the override reversed them to its left), and the
business key shows its override as a visible ⟨U+202E⟩."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from sagas.models import RunStatus
from tests.console.queue_data import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_keeps_the_text_after_an_override_in_reading_order(console, users):
    run = make_run(status=RunStatus.RUNNING, reason="", name="orders-\u202ex", business_key="invoice-\u202egpj.exe")
    page = console.page("vic", f"/runs/{run.id}/")
    title = page.locator("#live-run_header h1")
    name = title.locator("bdi").first.bounding_box()
    version = title.locator("span.muted", has_text="v1").bounding_box()
    status = title.locator("span.badge").bounding_box()
    assert name["x"] + name["width"] <= version["x"] < status["x"]  # left to right: name, version, status
    expect(page.locator(".run-facts dd.key")).to_have_text("invoice-⟨U+202E⟩gpj.exe")
    console.shot(page, "run-bidi")
