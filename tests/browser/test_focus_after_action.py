"""Where the keyboard focus goes after an action, in a real browser (Chromium, daphne,
the real channel layer): the decided row leaves the inbox, and the focus goes to the next row's
Approve, whose name says which run it approves; after the last one it goes to the notice, which
a screen reader then reads. A live push that adds a row leaves the focus where it is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import expect

from sagas.events import send_run_changed_now
from sagas.models import ApprovalRequest, ApprovalState, RunStatus
from tests.console.queue_data import make_approval, make_run

pytestmark = pytest.mark.django_db(transaction=True)

def waiting(page, approval: ApprovalRequest):
    """The approval's row in the inbox (a decided one has a row of the same id under "Recently decided")."""
    return page.locator(f"table.approvals #approval-{approval.id}")


FOCUSED_ROW = "() => { const row = document.activeElement.closest('tr'); return row ? row.id : null; }"
# Where the focus went, event by event, and the websocket messages between (kept on the page, read
# when an assertion on the focus fails: it failed once in the whole suite and never alone).
FOCUS_LOG = """
window.__focusLog = [];
const note = (what) => window.__focusLog.push(`${Math.round(performance.now())} ${what}`);
const describe = (el) => !el ? "null" : el === document.body ? "body"
  : `${el.tagName.toLowerCase()}#${el.id || ""}[${el.getAttribute("aria-label") || el.textContent.trim().slice(0, 40)}]`
    + ` in ${el.closest("tr") ? el.closest("tr").id : "-"}${el.isConnected ? "" : " (detached)"}`;
document.addEventListener("focusin", (e) => note("focusin " + describe(e.target)), true);
document.addEventListener("focusout", (e) => note("focusout " + describe(e.target)), true);
document.addEventListener("htmx:wsBeforeMessage", () => note("ws message"));
document.addEventListener("htmx:wsAfterMessage", () => note("ws message done, focus on " + describe(document.activeElement)));
document.addEventListener("htmx:afterSettle", () => note("settled, focus on " + describe(document.activeElement)));
"""


def focus_story(page) -> str:
    return "\n".join(page.evaluate("window.__focusLog || []")[-30:])


def _approval(key: str, hours: int) -> ApprovalRequest:
    run = make_run(status=RunStatus.WAITING, reason="", business_key=key)
    return make_approval(run=run, step="ship", deadline_in=timedelta(hours=hours))


def _approve_name(approval: ApprovalRequest) -> str:
    return f"Approve ship on run {str(approval.run_id)[:8]} ({approval.run.business_key})"


def test_it_moves_the_focus_to_the_next_approve_then_to_the_notice(console, users):
    first, second, third = (_approval(f"order-{n}", n) for n in (1, 2, 3))
    page = console.page("ann", None)
    page.add_init_script(FOCUS_LOG)
    page.goto("/approvals/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    focused = page.locator(":focus")

    # By mouse: the row goes, the focus lands on the next row's Approve, named after its run.
    waiting(page, first).get_by_role("button", name=_approve_name(first)).click()
    expect(waiting(page, first)).to_have_count(0, timeout=10_000)
    expect(focused).to_have_accessible_name(_approve_name(second))
    assert page.evaluate(FOCUSED_ROW) == f"approval-{second.id}"

    # By keyboard, from there: Enter approves it and the focus moves on to the third.
    page.keyboard.press("Enter")
    expect(waiting(page, second)).to_have_count(0, timeout=10_000)
    expect(focused).to_have_accessible_name(_approve_name(third))
    assert ApprovalRequest.objects.get(id=second.id).state == ApprovalState.APPROVED

    # A push that brings a new row does not take the focus away from the person.
    late = _approval("order-9", 9)
    send_run_changed_now(late.run_id, RunStatus.WAITING, cause="waiting")
    expect(waiting(page, late)).to_have_count(1, timeout=10_000)
    try:
        expect(focused).to_have_accessible_name(_approve_name(third))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nfocus and pushes, newest last:\n{focus_story(page)}") from None

    # The last actionable row above the newcomer: then the newcomer; and after it, the notice.
    page.keyboard.press("Enter")
    expect(waiting(page, third)).to_have_count(0, timeout=10_000)
    expect(focused).to_have_accessible_name(_approve_name(late))
    page.keyboard.press("Enter")
    expect(page.locator("#live-approvals_inbox .empty").first).to_have_text("No approval is waiting.", timeout=10_000)
    expect(focused).to_have_class("action-message success")
    expect(focused).to_contain_text("Approved")
    assert page.evaluate("document.activeElement.parentElement.id") == "messages"
    assert ApprovalRequest.objects.filter(state=ApprovalState.APPROVED).count() == 4
    page.context.close()


def test_it_moves_the_focus_to_the_notice_after_a_run_action_that_leaves_nothing_to_do(console, users):
    run = make_run(status=RunStatus.WAITING, reason="", business_key="order-77")
    page = console.page("olga", f"/runs/{run.id}/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    actions = page.locator("#live-run_actions")
    cancel = actions.get_by_role("group").filter(has_text="Cancel…")
    cancel.locator("summary").click()
    cancel.locator("textarea[name=reason]").fill("customer asked on ticket 4411")
    actions.get_by_role("button", name=f"Cancel the run {str(run.id)[:8]}").press("Enter")

    # The run is cancelled, so its Cancel… is gone: the focus is on the notice saying so.
    expect(actions.locator("summary", has_text="Cancel")).to_have_count(0, timeout=10_000)
    focused = page.locator(":focus")
    expect(focused).to_contain_text("Run cancelled.")
    assert page.evaluate("document.activeElement.parentElement.id") == "messages"
    page.context.close()
