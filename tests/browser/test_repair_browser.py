"""Repair in a real browser (Chromium, daphne): the versions page's replay check of the runs in
flight against a divergent version and against the fix, then moving a run to the fix from its
page. Screenshots in test-artifacts/screenshots/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from sagas import start
from sagas.models import JournalEntry, WorkflowRun, WorkflowVersion
from sagas.testing import run_until_idle
from sagas.versions import registry
from tests.sagas import wf_repair  # noqa: F401  (rm_order versions 1 to 3, also in daphne: tests/browser/conftest.py)

pytestmark = pytest.mark.django_db(transaction=True)


def _deployed() -> None:
    for d in registry.all_definitions():
        if d.name == "rm_order":
            WorkflowVersion.objects.get_or_create(name=d.name, version=d.version, definition_hash=d.definition_hash,
                                                  defaults={"source": d.source, "module": d.module})


def test_it_checks_runs_in_flight_against_a_version_then_moves_one_to_the_fix(console, users):
    _deployed()
    runs = []
    for key in ("order-81", "order-82"):
        run = start("rm_order", {"id": key}, version=1, business_key=key)
        run_until_idle(run.id)
        runs.append(run)

    page = console.page("olga", "/versions/")
    section = page.locator("#workflow-rm_order")
    section.get_by_label("Check in-flight runs against").select_option("3")
    section.get_by_role("button", name=re.compile("Replay check")).click()
    expect(page.locator("main h1")).to_contain_text("Replay check: rm_order v3")
    expect(page.locator("table.check-runs tbody tr")).to_have_count(2)
    expect(page.locator("table.check-runs")).to_contain_text("the code asks for step “reserve_stock”")
    console.shot(page, "replay-check-diverges")

    page.goto("/versions/")
    section = page.locator("#workflow-rm_order")
    section.get_by_label("Check in-flight runs against").select_option("2")
    section.get_by_role("button", name=re.compile("Replay check")).click()
    expect(page.locator("dl.check-counts")).to_contain_text("Compatible")
    expect(page.locator("main")).to_contain_text("2 runs in flight could move to this version")
    expect(page.locator("pre.source")).to_have_count(2)  # the sources side by side
    console.shot(page, "replay-check-compatible")
    assert JournalEntry.objects.filter(kind="moved").count() == 0  # checking changed nothing

    page.goto(f"/runs/{runs[0].id}/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    move = page.locator("#live-run_actions").get_by_role("group").filter(has_text="Move to another version…")
    move.locator("summary").click()
    move.get_by_label("Version").select_option("2")
    move.get_by_label("Reason").fill("fix for the tax rounding")
    move.get_by_role("button", name=re.compile("Move the run")).click()
    expect(page.locator("#messages, .messages").first).to_contain_text("Run moved to version 2", timeout=10_000)
    expect(page.locator("#live-run_header h1")).to_contain_text("v2")
    console.shot(page, "run-moved")
    assert WorkflowRun.objects.get(id=runs[0].id).version == 2
    assert WorkflowRun.objects.get(id=runs[1].id).version == 1


def test_it_previews_a_re_run_from_a_step_effect_by_effect_and_makes_it(console, users):
    from tests.console.run_data import waiting_run

    run = waiting_run("order-83")  # charge, then the irreversible ship (an rp_ workflow of the console tests)
    ship = JournalEntry.objects.get(run=run, kind="effect_intent", name="ship").seq
    page = console.page("olga", f"/runs/{run.id}/")
    page.get_by_role("link", name=re.compile("Re-run from a step")).click()
    expect(page.locator("main h1")).to_contain_text("from a step")
    page.get_by_label("From step").select_option(str(ship))
    page.get_by_role("button", name="Show what it would do").click()
    rows = page.locator("table.run-fork-preview tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.filter(has_text="charge")).to_contain_text("kept")
    expect(rows.filter(has_text="ship")).to_contain_text("reused")
    expect(rows.filter(has_text="ship")).to_contain_text("IRREVERSIBLE")
    console.shot(page, "fork-preview")
    charge = JournalEntry.objects.get(run=run, kind="effect_intent", name="charge").seq
    page.get_by_label("From step").select_option(str(charge))  # from the charge, compensating it first
    page.get_by_label(re.compile("compensate them first")).check()
    page.get_by_role("button", name="Show what it would do").click()
    expect(page.locator("main h2").first).to_contain_text("compensating later effects first")
    expect(rows.filter(has_text="charge")).to_contain_text("undone")
    expect(rows.filter(has_text="ship")).to_contain_text("cannot be compensated")
    console.shot(page, "fork-preview-compensate-first")
    page.get_by_label("From step").select_option(str(ship))
    page.get_by_label(re.compile("reuse their outcomes")).check()
    page.get_by_role("button", name="Show what it would do").click()
    expect(rows.filter(has_text="ship")).to_contain_text("reused")
    page.get_by_label("Reason").fill("ship again after the label fix")
    page.get_by_role("button", name=re.compile("Re-run from ship")).click()
    expect(page.locator("#live-run_header")).to_contain_text(f"Re-run from seq {ship} of run {run.id}")
    expect(page.locator(".run-repairs")).to_contain_text("by olga, reusing later outcomes: ship again after the label fix")
    console.shot(page, "fork-made")
    assert WorkflowRun.objects.filter(forked_from=run.id).count() == 1
