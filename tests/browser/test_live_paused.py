"""In a real browser (Chromium, daphne, the real channel layer): a run page whose live history
becomes too large to push says "live updates paused" and shows a notice in that section, instead
of saying "live" while nothing arrives."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console import live, topics
from console.broadcast import broadcast, publisher
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.console.queue_data import make_run
from tests.security.test_push_limits import hostile_history

pytestmark = pytest.mark.django_db(transaction=True)

PAUSED = "live updates paused: reload the page"
HOSTILE = "<img src=x onerror=alert(1)>"
COUNT_PUSHES = """() => { window.__pushes = 0;
  document.addEventListener("htmx:wsAfterMessage", () => { window.__pushes += 1; }); }"""


def test_it_says_live_updates_paused_when_a_section_is_too_large_to_push(console, users):
    run = make_run(status=RunStatus.RUNNING, reason="")
    page = console.page("vic", f"/runs/{run.id}/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)

    hostile_history(run)  # 100 new entries: the run page's live history is now over the push limit
    WorkflowRun.objects.filter(id=run.id).update(last_seq=100)
    params = {"run": str(run.id), "since": "0"}
    assert len(live.FRAGMENTS["run_history"].render(users["vic"], params).encode()) > live.PUSH_MAX_BYTES
    broadcast(topics.run_topic(str(run.id)))
    assert publisher.flush(timeout=5)

    expect(page.locator("#live-status")).to_have_text(PAUSED, timeout=10_000)
    notice = page.locator("#live-run_history .live-stale")
    expect(notice).to_have_count(1, timeout=10_000)  # as the status above: a loaded machine only delays it
    expect(notice).to_contain_text("too large to push")
    expect(page.locator("#live-run_header")).to_contain_text("100 entries")  # the small sections still arrive
    expect(page.locator("#live-run_history li.entry")).to_have_count(0)
    console.shot(page, "run-live-paused")

    page.evaluate(COUNT_PUSHES)
    broadcast(topics.run_topic(str(run.id)))  # pushed again: still one notice, still paused
    assert publisher.flush(timeout=5)
    page.wait_for_function("() => window.__pushes >= 1", timeout=10_000)
    expect(page.locator("#live-run_history .live-stale:visible")).to_have_count(1)
    expect(page.locator("#live-status")).to_have_text(PAUSED)


def test_it_expands_a_truncated_payload_in_place(console, users):
    run = make_run(status=RunStatus.RUNNING, reason="", last_seq=1)
    JournalEntry.objects.create(run=run, seq=1, kind="step", name="plan", created_at=run.created_at,
                                payload={"rows": [f"row-{i:05d}" for i in range(400)], "note": HOSTILE})
    page = console.page("vic", f"/runs/{run.id}/")
    entry = page.locator("#seq-1")
    expect(entry).to_contain_text("Showing the first 600 characters")
    expect(entry).not_to_contain_text("row-00399")
    entry.locator("details.entry-payload > summary").click()  # the history row folds its payload
    entry.get_by_role("link", name="show all of it").click()
    expect(entry).to_contain_text("row-00399")  # the whole payload, swapped in by htmx
    expect(entry).not_to_contain_text("Showing the first")
    expect(entry).to_contain_text(HOSTILE)  # as text: no script ran (a dialog fails the test)
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    console.shot(page, "run-payload-expanded")
