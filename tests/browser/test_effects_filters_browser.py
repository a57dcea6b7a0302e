"""In a real browser: an operator narrows the ambiguous-effects queue with its filters (connector,
age) and a search by part of a business key, sees each row's business context (summary, key,
tenant), and the filtered view survives paging and the page's live updates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import expect

from sagas.models import RunStatus
from tests.console.queue_data import make_effect, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_filters_and_searches_the_effects_queue_with_business_context(console, users):
    for n, (tenant, connector, minutes) in enumerate([("acme", "qp.lookup", 90), ("acme", "qp.blind", 3),
                                                      ("globex", "qp.lookup", 240), ("acme", "qp.lookup", 30)]):
        run = make_run(status=RunStatus.NEEDS_ATTENTION, name="order_agent", tenant=tenant,
                       business_key=f"ORD-{2026_0000 + n * 12:08d}",
                       summary={"order": f"ORD-{n}", "customer": ["Ada Lovelace", "Grace Hopper", "Alan Turing",
                                                                   "Edsger Dijkstra"][n],
                                "amount": f"{49.99 * (n + 1):.2f} EUR", "api_key": "sk_live_abcdef123456"})
        make_effect(run=run, tenant=tenant, connector=connector, step="capture", age=timedelta(minutes=minutes),
                    request_payload={"order": f"ORD-{n}", "amount_cents": 4999 * (n + 1), "currency": "EUR"})

    page = console.page("olga", "/effects/")
    expect(page.locator("tr.effect")).to_have_count(4)
    page.select_option("select[name=connector]", "qp.lookup")
    page.select_option("select[name=age]", "1h")
    page.fill("input[name=q]", "0012")  # inside ORD-20260012 (n = 1): a blind connector, 3 min: filtered out
    page.click("form.effects-filters button[type=submit]")
    expect(page.locator("tr.effect")).to_have_count(0)
    expect(page.locator("#live-effects_queue")).to_contain_text("No effect matches these filters")

    page.fill("input[name=q]", "2026")
    page.click("form.effects-filters button[type=submit]")
    rows = page.locator("tr.effect")
    expect(rows).to_have_count(2)  # the lookup effects unknown for over an hour: n = 0 and n = 2
    expect(rows.first).to_contain_text("Alan Turing")
    expect(rows.first).to_contain_text("globex")
    expect(rows.nth(1)).to_contain_text("Ada Lovelace")
    expect(rows.nth(1)).to_contain_text("49.99 EUR")
    expect(page.locator("#live-effects_queue")).not_to_contain_text("sk_live_abcdef123456")
    assert "connector=qp.lookup" in page.url and "age=1h" in page.url and "q=2026" in page.url
    expect(page.locator("#live-status")).to_have_text("live", timeout=20_000)
    console.shot(page, "effects_filters")
