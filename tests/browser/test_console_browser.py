"""The console in a real browser: roles, live updates over websockets, the operator actions,
hostile payloads and CSRF. Screenshots of the pages go to test-artifacts/screenshots/ for people to
look at; what a test checks is in its expectations, never in a screenshot."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from demo.providers.faults import inject
from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry
from sagas import start
from sagas.models import ApprovalRequest, RunStatus, WorkflowRun
from tests.console.queue_data import make_run
from tests.ledger import wf_orders, wf_sagas  # noqa: F401  (register the workflows here too)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def test_it_logs_in_each_role_and_shows_only_what_the_role_may_do(console, users):
    run = start("capture_then_wait", {"id": "b-1"}, started_by=users["sam"])
    console.worker("w1")
    wait_until(lambda: status(run) == RunStatus.WAITING, 30, what="the run to wait")
    for name, role in (("olga", "operator"), ("ann", "approver"), ("vic", "viewer")):
        page = console.page(name, via_form=True)  # the real login form, for each role
        expect(page.locator("header .user")).to_contain_text(role)
        expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)  # the websocket is up
        console.shot(page, f"overview-{role}")
        cancel = page.locator("#live-run_actions summary", has_text="Cancel")
        approve = page.get_by_role("button", name="Approve")
        page.goto(f"/runs/{run.id}/")
        expect(cancel).to_have_count(1 if role == "operator" else 0)
        expect(page.locator("#live-run_actions summary", has_text="Retry")).to_have_count(0)  # nothing to retry here
        page.goto("/approvals/")
        expect(approve).to_have_count(1 if role == "approver" else 0)
        page.context.close()


def test_it_shows_an_approval_resuming_the_run_live_in_a_second_page(console, users):
    run = start("approve_then_ship", {"id": "b-2"}, started_by=users["sam"])
    console.worker("w1")
    wait_until(lambda: status(run) == RunStatus.WAITING, 30, what="the run to wait for approval")
    watcher = console.page("olga", f"/runs/{run.id}/")
    header = watcher.locator("#live-run_header")
    expect(header).to_contain_text("WAITING")
    expect(watcher.locator("#live-status")).to_have_text("live", timeout=10_000)
    console.shot(watcher, "run-detail-waiting")

    approver = console.page("ann", "/approvals/")
    console.shot(approver, "approvals-inbox")
    row = approver.locator(f"#approval-{ApprovalRequest.objects.get(run=run).id}")
    row.locator("form.decide textarea[name=comment]").fill("address verified by phone")
    row.get_by_role("button", name="Approve").click()

    expect(header).to_contain_text("COMPLETED", timeout=15_000)  # pushed, no reload in this page
    console.shot(watcher, "run-detail-completed-live")
    assert watcher.evaluate("performance.getEntriesByType('navigation').length") == 1


def test_it_resolves_an_unknown_effect_with_evidence(console, users):
    inject("email", "send", "timeout_after_work")
    run = start("email_only", {"id": "b-3"})
    console.worker("w1")
    wait_until(lambda: status(run) == RunStatus.NEEDS_ATTENTION, 30, what="the email to be UNKNOWN")
    effect = EffectRecord.objects.get(run_id=run.id)
    page = console.page("olga", "/effects/")
    console.shot(page, "ambiguous-effects")
    row = page.locator(f"#effect-{effect.id}")
    row.locator("summary", has_text="Resolve").click()
    row.locator("select[name=outcome]").select_option("succeeded")
    row.locator("input[name=downstream_ref]").fill("msg-4711")
    row.locator("textarea[name=note]").fill("found in the mail server log at 21:04")
    row.get_by_role("button", name="Record resolution").click()
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 30, what="the run to resume and complete")
    effect.refresh_from_db()
    assert effect.status == EffectStatus.SUCCEEDED and effect.resolved_by_label == "olga"
    assert AuditEntry.objects.get(action="effect.resolve").reason == "found in the mail server log at 21:04"


def test_it_compensates_after_showing_the_plan(console, users):
    run = start("capture_then_wait", {"id": "b-4"})
    console.worker("w1")
    wait_until(lambda: status(run) == RunStatus.WAITING, 30, what="the run to wait")
    page = console.page("olga", f"/runs/{run.id}/")
    page.get_by_role("link", name=re.compile("Compensate")).click()
    expect(page.locator("main")).to_contain_text("capture")  # the preview lists what will be undone
    console.shot(page, "compensation-preview")
    assert status(run) == RunStatus.WAITING  # previewing changed nothing
    page.locator("textarea[name=reason]").fill("customer cancelled by phone")
    page.get_by_role("button", name="Start the compensation").click()
    wait_until(lambda: status(run) == RunStatus.COMPENSATED, 30, what="the compensation to finish")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator("#live-run_header")).to_contain_text("COMPENSATED")
    console.shot(page, "run-detail-compensated")


def test_it_refuses_and_audits_a_forged_post_from_a_viewer_and_a_post_without_csrf(console, users):
    run = make_run(status=RunStatus.WAITING, reason="", name="capture_then_wait")  # the POSTs never reach it
    page = console.page("vic", f"/runs/{run.id}/")
    token = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")
    forged = page.request.post(f"/runs/{run.id}/cancel/", form={"reason": "x", "expected": "WAITING"},
                               headers={"X-CSRFToken": token, "Referer": console.base + "/"})
    assert forged.status == 403
    denied = AuditEntry.objects.get(action="run.cancel")
    assert denied.outcome == "denied" and denied.actor_label == "vic"
    operator = console.page("olga", None)  # logged in, no page loaded: no CSRF token
    no_csrf = operator.request.post(f"/runs/{run.id}/cancel/", form={"reason": "x", "expected": "WAITING"})
    assert no_csrf.status == 403
    assert status(run) == RunStatus.WAITING


def test_it_shows_hostile_html_in_results_as_text(console, users):
    # The provider echoes the order id in its result, so the effect's recorded result carries it.
    hostile = "<script>alert('xss')</script><img src=x onerror=alert(1)>"
    run = start("capture_only", {"id": hostile, "card_number": "4111111111111111"})
    console.worker("w1")
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 30, what="the capture")
    assert EffectRecord.objects.get(run_id=run.id).result["order"] == hostile
    page = console.page("vic", f"/runs/{run.id}/")  # a dialog from any script fails the test (see conftest)
    for details in page.locator("details").all():
        details.evaluate("d => d.open = true")
    body = page.locator("main").inner_text()
    assert "<script>alert('xss')</script>" in body and "<img src=x onerror=alert(1)>" in body  # shown as text
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    assert "4111111111111111" not in page.content()  # the card number in the input is redacted
    console.shot(page, "run-detail-hostile-payload")


def test_it_shows_a_waiting_run_where_an_operator_looks_for_it_on_every_page(console, users):
    """Each page of the console, as an operator sees it with one run waiting (and one screenshot
    per page, for people to look at)."""
    run = start("capture_then_wait", {"id": "b-7"}, business_key="order-b-7")
    console.worker("w1")
    wait_until(lambda: status(run) == RunStatus.WAITING, 30, what="the run to wait")
    short = str(run.id)[:8]

    page = console.page("olga", "/runs/")
    expect(page.locator("main h1")).to_have_text("Runs")
    row = page.locator("tr.run-row", has_text=short)
    expect(row).to_contain_text("capture_then_wait")
    expect(row).to_contain_text("WAITING")
    expect(row).to_contain_text("order-b-7")
    console.shot(page, "page-runs")

    row.locator(f"a[href$='/runs/{run.id}/']").first.click()
    expect(page).to_have_url(f"{console.base}/runs/{run.id}/")
    header = page.locator("#live-run_header")
    expect(header.locator("h1")).to_contain_text("capture_then_wait")
    expect(header).to_contain_text("WAITING")
    expect(page.locator("#live-run_actions summary", has_text="Cancel")).to_be_visible()
    expect(page.get_by_role("link", name=re.compile("Compensate"))).to_be_visible()
    console.shot(page, "page-run-detail")

    for path, heading, shows in (
            ("/effects/", "Ambiguous effects", ["Nothing is ambiguous"]),
            # the run waits for its approval "go", which an operator may see but not decide
            ("/approvals/", "Approvals inbox", ["1 approval waiting.", short, "order-b-7", "approvers decide these"]),
            ("/versions/", "Workflow versions", ["capture_then_wait"]),
            ("/audit/", "Audit log", ["olga: groups +operator", "sam: groups +operator"])):  # the users made
        page.goto(path)
        expect(page.locator("main h1")).to_have_text(heading)
        for text in shows:
            expect(page.locator("main")).to_contain_text(text)
        console.shot(page, f"page-{path.strip('/')}")

    page.goto("/")
    expect(page.locator("main h1")).to_have_text("Overview")
    expect(page.locator("#live-overview .card.status-waiting .n")).to_have_text("1")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    console.shot(page, "page-overview")
    page.locator("#live-overview .card.status-waiting").click()  # the card leads to the waiting runs
    expect(page).to_have_url(re.compile(r"/runs/\?status=WAITING$"))
    expect(page.locator("tr.run-row")).to_have_count(1)
    expect(page.locator("tr.run-row")).to_contain_text(short)
