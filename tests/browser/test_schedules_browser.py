"""The schedules pages in Chromium against daphne: an operator finds a nightly schedule with its
next fire times in UTC and in Berlin time, fires it now, previews a backfill across the night the
clocks go forward and runs it, then pauses the schedule; each answer says what happened, the
ticks table shows who fired what, and a viewer sees the same page without a single form."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from playwright.sync_api import expect

from operators.models import AuditEntry
from sagas import create_schedule, schedule
from sagas.models import Schedule, ScheduleTick
from sagas.testing import frozen_clock
from tests.sagas import wf_schedules  # noqa: F401  (sched_quick, in this process too)

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_fires_backfills_and_pauses_a_schedule_from_its_page(console, users):
    with frozen_clock(datetime(2030, 4, 10, 12, tzinfo=UTC)):
        create_schedule("sched_quick", schedule(
            "nightly-settlement", cron="30 2 * * *", timezone="Europe/Berlin", overlap="allow_all",
            input={"ledger": "<b>eu</b>"}, business_key="settle-{fire_time:%Y-%m-%d}"))
    page = console.page("olga", "/schedules/")
    assert page.locator("nav a", has_text="Schedules").get_attribute("aria-current") == "page"
    row = page.locator("#schedule-nightly-settlement")
    expect(row).to_contain_text("30 2 * * * (Europe/Berlin)")
    expect(row).to_contain_text("2030-04-11 00:30:00 UTC (2030-04-11 02:30 CEST)")
    row.get_by_role("link", name="nightly-settlement").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("nightly-settlement")
    expect(page.locator("pre.payload")).to_contain_text("<b>eu</b>")  # as text
    assert page.locator("pre.payload b").count() == 0

    page.get_by_label("Reason for firing now").fill("last night's run was lost")
    page.get_by_role("button", name="Trigger now").click()
    expect(page.locator("#messages")).to_contain_text(re.compile(r"fired now: run [0-9a-f-]{36} started"))
    expect(page.locator("table").last).to_contain_text("trigger by olga")

    page.get_by_label("From").fill("2030-03-30T00:00")
    page.get_by_label("To").fill("2030-04-01T23:00")
    page.get_by_role("button", name="Preview the ticks").click()
    preview = page.locator("section", has=page.get_by_role("heading", name=re.compile("Backfill preview")))
    expect(preview).to_contain_text("3 ticks, 3 to fire")
    expect(preview).to_contain_text("2030-03-31 01:00:00")  # 02:30 does not exist that night: 03:00 CEST
    expect(preview).to_contain_text("settle-2030-03-31")
    preview.get_by_label("Reason for the backfill").fill("the sweeper was down")
    preview.get_by_role("button", name="Backfill these 3 ticks").click()
    expect(page.locator("#messages")).to_contain_text("3 tick(s) fired, 3 run(s) started")
    assert ScheduleTick.objects.filter(how="backfill", outcome="started").count() == 3

    page.get_by_label("Reason for pausing").fill("month-end freeze")
    page.get_by_role("button", name="Pause schedule").click()
    expect(page.locator("#messages")).to_contain_text("nightly-settlement paused")
    expect(page.get_by_role("heading", level=1)).to_contain_text("paused")
    expect(page.get_by_text("None while it is paused.")).to_be_visible()
    assert Schedule.objects.get(name="nightly-settlement").paused
    assert list(AuditEntry.objects.filter(action__startswith="schedule.").order_by("id")
                .values_list("action", "actor_label")) == [
        ("schedule.trigger", "olga"), ("schedule.backfill", "olga"), ("schedule.pause", "olga")]

    viewer = console.page("vic", "/schedules/nightly-settlement/")
    expect(viewer.locator("h1")).to_contain_text("paused")
    assert viewer.locator("main form[method=post]").count() == 0
