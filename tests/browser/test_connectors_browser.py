"""The connectors page in Chromium against daphne with a real worker: an operator pauses a
connector with a reason through the page; it shows as paused there and, live, on a viewer's page;
a run that sends mail is held (its run page says what it waits for) while a limits form someone
half typed survives the page's updates; resuming through the page lets the run finish.

The page as the operator sees it with the connector paused and a call waiting is saved for the
documentation (docs/img/connectors.png, shown in docs/reference/console-pages.md)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from ledger.models import ConnectorFlow
from operators.models import AuditEntry
from sagas import start
from sagas.models import RunStatus, WorkflowRun
from tests.browser.a11y import wait_live
from tests.ledger import wf_orders  # noqa: F401  (email_only, started here)
from tests.procs import ROOT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

DOCS_SHOT = ROOT / "docs" / "img" / "connectors.png"
REASON = "mail relay down, ticket OPS-9 <b>now</b>"


def test_it_pauses_a_connector_holds_its_calls_and_resumes_it_from_the_page(console, users):
    console.worker("w1")  # a worker writes each registered connector's flow row at start-up
    wait_until(lambda: ConnectorFlow.objects.filter(connector="email.send").exists(), 30,
               what="the worker wrote the connectors' flow rows")
    watcher = console.page("vic", "/connectors/")
    page = console.page("olga", "/connectors/")
    wait_live(watcher)
    wait_live(page)
    assert page.locator("nav a", has_text="Connectors").get_attribute("aria-current") == "page"
    row = page.locator('tr[data-connector="email.send"]')
    expect(row).to_contain_text("running")
    expect(row).to_contain_text("declared defaults")
    assert watcher.locator("#live-connectors_list form").count() == 0  # a viewer reads only

    section = page.locator("#connector-email-send")
    section.locator("summary", has_text="Pause").click()
    section.locator("form[action$='/pause/'] textarea[name=reason]").fill(REASON)
    section.get_by_role("button", name=re.compile(r"^Pause")).click()  # through htmx: the region answers

    expect(page.locator("#messages")).to_contain_text("email.send paused")
    row = page.locator('tr[data-connector="email.send"]')
    expect(row).to_contain_text("paused by olga")
    expect(row).to_contain_text(REASON)  # as text: no <b> element
    assert row.locator("b").count() == 0
    assert ConnectorFlow.objects.get(connector="email.send").paused_by_label == "olga"
    assert AuditEntry.objects.filter(action="connector.pause", outcome="ok", object_id="email.send").count() == 1
    # The viewer's page shows it too, without a reload.
    expect(watcher.locator('tr[data-connector="email.send"]')).to_contain_text("paused by olga", timeout=10_000)

    # Olga starts on new limits for the connector and leaves them half typed.
    section = page.locator("#connector-email-send")
    section.locator("summary", has_text="Change limits").click()
    limits = section.locator("form[action$='/limits/']")
    limits.locator("input[name=rate]").fill("0.5")
    limits.locator("textarea[name=reason]").fill("slow it down once it is back")

    # A run that sends mail: its call is held, never sent; its page says what it waits for.
    run = start("email_only", {"id": "held-1"}, business_key="order-held-1")
    run_page = console.page("vic", f"/runs/{run.id}/")
    expect(run_page.locator("#live-run_header")).to_contain_text(
        "waiting for email.send (connector paused, position 1)", timeout=30_000)
    # The connectors page counts it waiting (its own poll), and the half-typed form is untouched.
    waiting = page.locator('tr[data-connector="email.send"] td.num').nth(1)
    expect(waiting).to_have_text("1", timeout=15_000)
    expect(limits.locator("input[name=rate]")).to_have_value("0.5")
    expect(limits.locator("textarea[name=reason]")).to_have_value("slow it down once it is back")
    console.shot(page, "connectors")
    DOCS_SHOT.parent.mkdir(parents=True, exist_ok=True)
    # The table and the paused connector's section with its forms: the top of the page.
    page.screenshot(path=str(DOCS_SHOT), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": 1150})

    section.locator("summary", has_text="Resume").click()
    section.locator("form[action$='/resume/'] textarea[name=reason]").fill("relay is back")
    section.get_by_role("button", name=re.compile(r"^Resume")).click()
    expect(page.locator("#messages")).to_contain_text("email.send resumed")
    expect(page.locator('tr[data-connector="email.send"]')).to_contain_text("running")
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 30,
               what="the held run to finish once the connector was resumed")
    header = run_page.locator("#live-run_header")
    expect(header).to_contain_text("COMPLETED", timeout=15_000)
    expect(header).not_to_contain_text("waiting for email.send")
    assert ConnectorFlow.objects.get(connector="email.send").changed_by_label == ""  # the half-typed form never went
