"""Issue 35 in a real browser: a parent's page shows its children (made by a real worker),
counted by status and updated live as they finish; a click goes to a child, and its parent link
back; the runs list shows the parent's children, or the top-level runs only."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from sagas import signal, start
from sagas.models import RunStatus, WorkflowRun
from tests.browser.a11y import wait_live
from tests.procs import wait_until
from tests.sagas import wf_children  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def test_a_parents_page_shows_its_children_live_and_links_both_ways(console, users):
    parent = start("waiting_tree", {"n": 3}, business_key="browser-tree")
    loner = start("waiting_tree", {"n": 0}, business_key="browser-loner")
    console.procs.worker("w-tree", "tests.sagas.wf_children", DEMO_PROVIDERS_URL=console.providers_url)
    wait_until(lambda: WorkflowRun.objects.filter(parent_run=parent.id, status=RunStatus.WAITING).count() == 3, 60,
               what="three children waiting for their signal")
    wait_until(lambda: status(parent) == RunStatus.WAITING and status(loner) == RunStatus.COMPLETED, 30,
               what="the parent waiting for its children")
    kids = list(WorkflowRun.objects.filter(parent_run=parent.id).order_by("created_at"))

    page = console.page("vic", f"/runs/{parent.id}/")
    wait_live(page)
    children = page.locator("#live-run_children")
    expect(children.get_by_role("heading", name=re.compile("Child runs"))).to_be_visible()
    counts = children.get_by_role("list", name="child runs by status")
    expect(counts).to_contain_text("3 in all")
    expect(counts.get_by_role("link", name="WAITING 3")).to_be_visible()
    rows = children.locator("tbody tr")
    expect(rows).to_have_count(3)
    for row, kid in zip(rows.all(), kids, strict=True):
        expect(row.get_by_role("link", name=str(kid.id)[:8])).to_be_visible()
        expect(row).to_contain_text("waiting_child")
        expect(row).to_contain_text("WAITING")
    console.shot(page, "run-tree-parent")

    # A child finishes: its parent's page counts it without a reload.
    signal(run_id=kids[0].id, name="go", payload={"from": "browser test"})
    expect(counts.get_by_role("link", name="COMPLETED 1")).to_be_visible(timeout=20_000)
    expect(counts.get_by_role("link", name="WAITING 2")).to_be_visible()
    expect(rows.first).to_contain_text("COMPLETED")
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

    # To a child, and back to its parent.
    rows.nth(1).get_by_role("link", name=str(kids[1].id)[:8]).click()
    expect(page).to_have_url(re.compile(rf"/runs/{kids[1].id}/$"))
    header = page.locator("#live-run_header")
    expect(header).to_contain_text("waiting_child")
    parent_link = header.get_by_role("link", name=str(parent.id))
    expect(parent_link).to_be_visible()
    expect(page.locator("#live-run_children")).to_be_hidden()  # a child without children of its own
    console.shot(page, "run-tree-child")
    parent_link.click()
    expect(page).to_have_url(re.compile(rf"/runs/{parent.id}/$"))
    expect(page.locator("#live-run_children tbody tr")).to_have_count(3)

    # The whole list of them in the runs list, and the top-level runs only.
    page.get_by_role("link", name="Show all 3 in the runs list").click()
    expect(page).to_have_url(re.compile(rf"/runs/\?parent={parent.id}$"))
    listed = page.locator("table.runs tbody tr")
    expect(listed).to_have_count(3)
    expect(page.locator("input[name=parent]")).to_have_value(str(parent.id))
    page.locator("input[name=parent]").fill("")
    page.get_by_label("Top-level runs only").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Filter").click()
    expect(listed).to_have_count(2)
    expect(page.locator("table.runs")).to_contain_text("waiting_tree")
    expect(page.locator("table.runs")).not_to_contain_text("waiting_child v1")  # its children are not listed
    expect(page.get_by_label("Top-level runs only")).to_be_checked()
    console.shot(page, "runs-top-level")

    # A bad parent id: the form says so (400), nothing listed.
    response = page.goto("/runs/?parent=not-a-run")
    assert response is not None and response.status == 400
    expect(page.get_by_role("alert")).to_contain_text("Parent run: “not-a-run” is not a run id")
    expect(page.locator("input[name=parent]")).to_have_attribute("aria-invalid", "true")
