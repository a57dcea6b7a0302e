"""Pausing and resuming a workflow from the versions page in Chromium against daphne, with the
page's live connection open: a push re-renders the region's forms without the request (so without
a CSRF field of their own), and the forms must still post (through htmx, whose CSRF header comes
from the page). Each action shows its result as a message and the region as it is now; a form
loaded before someone else paused the workflow is refused (409) with the reason, in place."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from operators.models import AuditEntry
from operators.services.actions import Actor
from operators.services.runs import workflow_pause_act
from sagas import start
from sagas.models import WorkflowPause, WorkflowVersion
from sagas.versions import registry
from tests.browser.a11y import wait_live
from tests.ledger import wf_orders  # noqa: F401  (email_only, started here; daphne has it too)

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOW = "email_only"
REASON = "mail relay down, ticket OPS-12 <b>now</b>"


def _deployed() -> None:
    for d in registry.all_definitions():
        if d.name == WORKFLOW:
            WorkflowVersion.objects.get_or_create(name=d.name, version=d.version, definition_hash=d.definition_hash,
                                                  defaults={"source": d.source, "module": d.module})


def _pushed_in_flight(page, n: int) -> None:
    """Start a run (the test process publishes the runs topic after commit) and wait until the
    page shows it in flight: the region was pushed, its forms rendered again by the push."""
    start(WORKFLOW, {"id": f"held-{n}"}, business_key=f"order-held-{n}")
    in_flight = page.locator(f"#workflow-{WORKFLOW} table.versions-table td.num").first
    expect(in_flight).to_have_text(str(n), timeout=10_000)


def test_it_pauses_and_resumes_a_workflow_from_the_page_after_live_pushes(console, users):
    _deployed()
    page = console.page("olga", "/versions/")
    wait_live(page)
    _pushed_in_flight(page, 1)

    section = page.locator(f"#workflow-{WORKFLOW}")
    section.locator("summary", has_text="Pause runs").click()
    pause = section.locator("form[action$='/versions/pause/']")
    pause.get_by_label("Which").select_option("1")
    pause.get_by_label("Reason").fill(REASON)
    pause.get_by_role("button", name=re.compile(r"^Pause the runs")).click()

    expect(page.locator("#messages")).to_contain_text(f"{WORKFLOW} version 1 paused", timeout=10_000)
    held = page.locator(f"#workflow-{WORKFLOW} .run-paused")
    expect(held).to_contain_text("Version 1 paused by olga")
    expect(held).to_contain_text(REASON)  # as text: no <b> element
    assert held.locator("b").count() == 0
    assert WorkflowPause.objects.get(workflow_name=WORKFLOW).version == 1
    [entry] = AuditEntry.objects.filter(action="workflow.pause")
    assert (entry.object_id, entry.outcome, entry.reason) == (f"{WORKFLOW} v1", "ok", REASON)

    _pushed_in_flight(page, 2)  # the resume form, as a push renders it
    held.locator("summary", has_text="Resume").click()
    held.get_by_label("Reason").fill("relay is back")
    held.get_by_role("button", name=re.compile(r"^Resume the runs")).click()

    expect(page.locator("#messages")).to_contain_text(f"{WORKFLOW} version 1 resumed", timeout=10_000)
    expect(page.locator(f"#workflow-{WORKFLOW} .run-paused")).to_have_count(0)
    assert not WorkflowPause.objects.exists()
    assert AuditEntry.objects.filter(action="workflow.resume", outcome="ok", object_id=f"{WORKFLOW} v1").count() == 1

    # Sam pauses it meanwhile (nothing pushes a pause to this page): Olga's form is stale.
    workflow_pause_act(Actor(user=users["sam"], ip=None), name=WORKFLOW, version=1, reason="deploy", expected="running")
    section.locator("summary", has_text="Pause runs").click()
    pause.get_by_label("Which").select_option("1")
    pause.get_by_label("Reason").fill("the relay again")
    pause.get_by_role("button", name=re.compile(r"^Pause the runs")).click()

    expect(page.locator("#messages")).to_contain_text(f"{WORKFLOW} v1 is now paused by sam", timeout=10_000)
    expect(page.locator(f"#workflow-{WORKFLOW} .run-paused")).to_contain_text("Version 1 paused by sam")
    assert WorkflowPause.objects.get(workflow_name=WORKFLOW).paused_by_label == "sam"
    outcomes = list(AuditEntry.objects.filter(action="workflow.pause").order_by("id").values_list("outcome", flat=True))
    assert outcomes == ["ok", "ok", "refused"]
