"""In a real browser: a rejection that takes a reason and a ticked confirmation and then
compensates the run; the overview's queue lines, human ages and chart axes; the audit log's
links to what each entry is about. Screenshots: overview.png, audit.png, approvals-reject.png."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from demo.providers.faults import inject
from operators.models import AuditEntry
from sagas import start
from sagas.models import ApprovalRequest, ApprovalState, RunStatus, WorkflowRun
from tests.ledger import wf_orders, wf_sagas  # noqa: F401  (register the workflows here too)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


# The browser's own form check: a field it refuses fires "invalid" (it does not bubble) when the
# form is submitted, and the form is then not sent.
RECORD_INVALID = """() => { window.__invalid = [];
  document.addEventListener("invalid", (e) => window.__invalid.push(e.target.name), true); }"""


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def test_it_rejects_with_a_reason_and_a_confirmation_then_shows_it_on_the_overview_and_in_the_audit_log(
        console, users):
    run = start("approve_then_ship", {"id": "b-rej"}, business_key="order-b-rej", started_by=users["sam"])
    console.worker("w1")
    wait_until(lambda: status(run) == RunStatus.WAITING, 30, what="the run to wait for approval")
    approval = ApprovalRequest.objects.get(run=run)

    page = console.page("ann", "/approvals/")
    row = page.locator(f"#approval-{approval.id}")
    expect(row.get_by_role("button", name="Approve")).to_be_visible()  # approving stays one click
    reject_button = row.get_by_role("button", name="Reject and compensate")
    expect(reject_button).to_be_hidden()  # behind its own step
    row.locator("summary", has_text="Reject…").click()
    expect(row.locator("details.reject .warning")).to_contain_text("compensates")
    expect(row.locator("details.reject .warning")).to_contain_text("the 1 effect it has completed is undone")
    posts: list[str] = []
    page.on("request", lambda r: r.method == "POST" and posts.append(r.url))
    page.evaluate(RECORD_INVALID)
    reject_button.click()  # no reason, no confirmation: the browser asks for them, nothing is sent
    page.wait_for_function("(name) => window.__invalid.includes(name)", arg="comment", timeout=5_000)
    row.locator("details.reject textarea[name=comment]").fill("the customer cancelled by phone")
    page.evaluate("() => { window.__invalid = []; }")
    reject_button.click()  # still no confirmation
    page.wait_for_function("(name) => window.__invalid.includes(name)", arg="confirm", timeout=5_000)
    assert posts == []  # the browser's own check stopped both before anything was sent
    assert ApprovalRequest.objects.get(id=approval.id).state == ApprovalState.PENDING
    row.get_by_label("I understand the run will be compensated").check()
    console.shot(page, "approvals-reject")
    reject_button.click()
    wait_until(lambda: status(run) == RunStatus.COMPENSATED, 30, what="the rejected run to compensate")
    assert AuditEntry.objects.get(action="approval.reject").reason == "the customer cancelled by phone"

    # Something in the queues: an UNKNOWN email (a real fault), and runs that stopped hours and
    # days ago (rows, for the ages).
    inject("email", "send", "timeout_after_work")
    unknown = start("email_only", {"id": "b-unk"}, business_key="order-b-unk")
    wait_until(lambda: status(unknown) == RunStatus.NEEDS_ATTENTION, 30, what="the email to be UNKNOWN")
    for reason, state, age in (("step_failed", RunStatus.FAILED, timedelta(hours=3, minutes=5)),
                               ("workflow_error", RunStatus.FAILED, timedelta(minutes=12, seconds=20)),
                               ("budget_exceeded", RunStatus.NEEDS_ATTENTION, timedelta(days=2, hours=1))):
        stopped = WorkflowRun.objects.create(workflow_name="order3", version=1, definition_hash="0" * 64,
                                             status=state, status_reason=reason, business_key=f"order-{reason}")
        WorkflowRun.objects.filter(id=stopped.id).update(updated_at=timezone.now() - age)

    viewer = console.page("vic", "/")
    queues = viewer.locator("table.queues")
    expect(queues.locator("tr", has_text="Unknown effects")).to_contain_text("1")
    expect(queues.locator("tr", has_text="Unknown effects").locator("td.num")).to_have_text("1")
    expect(queues.locator("tr", has_text="Exhausted budgets").locator("td.num")).to_have_text("1")
    expect(queues.locator("tr", has_text="Failed runs")).to_contain_text("3 h")
    expect(queues.locator("tr", has_text="a step failed")).to_contain_text("3 h")
    expect(queues.locator("tr", has_text="the workflow raised an error")).to_contain_text("12 min")
    expect(queues.locator("tr", has_text="Exhausted budgets")).to_contain_text("2 d")
    chart = viewer.locator("svg.chart")
    expect(chart.locator(".y-axis text").first).to_have_text("0")
    expect(chart.locator(".x-axis text", has_text=re.compile(r"^\d\d:\d0$"))).to_have_count(6)
    console.shot(viewer, "overview")
    viewer.locator("table.queues a", has_text="Exhausted budgets").click()
    expect(viewer).to_have_url(re.compile(r"/runs/\?status=NEEDS_ATTENTION&reason=budget_exceeded$"))
    expect(viewer.locator("tr.run-row")).to_have_count(1)
    expect(viewer.locator("tr.run-row")).to_contain_text("order-budget_exceeded")

    viewer.goto("/audit/")
    entry = AuditEntry.objects.get(action="approval.reject")
    audit_row = viewer.locator(f"#audit-{entry.id}")
    expect(audit_row).to_contain_text("order-b-rej")
    link = audit_row.locator("td.object a")
    expect(link).to_have_attribute("href", f"/runs/{run.id}/#run-approval-{approval.id}")
    console.shot(viewer, "audit")
    link.click()
    expect(viewer.locator(f"#run-approval-{approval.id}")).to_contain_text("REJECTED")
