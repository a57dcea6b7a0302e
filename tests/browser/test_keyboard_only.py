"""Issue 17: an operator's and an approver's work with the keyboard alone, in a real browser.

The skip link, resolving an UNKNOWN effect, approving two approvals in a row, with the focus
where the next thing to do is and each result announced in the one persistent live region
(the axe-core sweep of every page is in test_accessibility.py).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from demo.providers.faults import inject
from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry
from sagas import start
from sagas.models import ApprovalRequest, ApprovalState, RunStatus
from tests.browser.a11y import wait_live
from tests.browser.test_accessibility import short, status
from tests.ledger import wf_orders, wf_sagas  # noqa: F401  (register the workflows here too)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# Focusable controls a keyboard user can land on.
CONTROLS = "a[href], button, input:not([type=hidden]), select, textarea, summary, [tabindex]:not([tabindex='-1'])"


def _focused(locator) -> bool:
    return locator.evaluate("el => el === document.activeElement")


def _tab_to(page: Page, target, *, most: int, what: str) -> int:
    """Tab (never a click) until ``target`` has the focus; how many Tabs that took (0: it had it)."""
    if _focused(target):
        return 0
    for count in range(1, most + 1):
        page.keyboard.press("Tab")
        if _focused(target):
            return count
    active = page.evaluate("() => document.activeElement && document.activeElement.outerHTML.slice(0, 160)")
    raise AssertionError(f"{what} not reached in {most} Tabs; the focus is on {active}")


def _skip_link_first(page: Page) -> None:
    """The first Tab stop is the skip link; Enter on it puts the focus on the main content."""
    page.keyboard.press("Tab")
    active = page.evaluate("""() => { const a = document.activeElement;
        return {tag: a.tagName, text: a.textContent.trim(), href: a.getAttribute("href") || ""}; }""")
    assert active["tag"] == "A" and re.search(r"skip to( the)? main content", active["text"], re.I), active
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement === document.querySelector('main')"), \
        page.evaluate("() => document.activeElement.outerHTML.slice(0, 160)")


def _live_region(page: Page):
    """The one persistent aria-live region for notices: outside every section a push replaces."""
    region = page.locator("[aria-live=polite]#messages")
    expect(region).to_have_count(1)
    assert region.evaluate("el => !el.closest('[id^=\"live-\"]')"), "the notices region is inside a live section"
    region.evaluate("el => { el.__kept = true; }")  # the same element after the actions: never replaced
    return region


def _focus_in_row_or_notice(page: Page, row_id: str | None, region) -> None:
    # The focus moves when the answer has settled (htmx:afterSettle, htmx's settle delay after the
    # swap that removed the row): wait for it, up to a time no person would call instant.
    try:
        page.wait_for_function(
            """([id, controls]) => { const a = document.activeElement;
                if (id === null) return !!a && !!a.closest('#messages');
                const row = document.getElementById(id); return !!row && row.contains(a) && a.matches(controls); }""",
            arg=[row_id, CONTROLS], timeout=1_000)
    except PlaywrightTimeoutError:
        pass  # the assertions below say where the focus is instead
    if row_id is not None:
        where = page.evaluate("""([id, controls]) => {
            const a = document.activeElement, row = document.getElementById(id);
            return {inRow: !!row && row.contains(a), control: a.matches(controls),
                    html: a.outerHTML.slice(0, 160)}; }""", [row_id, CONTROLS])
        assert where["inRow"] and where["control"], f"the focus is not on a control of #{row_id}: {where['html']}"
    else:
        assert region.evaluate("el => el.contains(document.activeElement)"), \
            page.evaluate("() => document.activeElement.outerHTML.slice(0, 160)")


def _row_ids(page: Page, selector: str) -> list[str]:
    return page.locator(selector).evaluate_all("rows => rows.map((r) => r.id)")


def _row_controls(page: Page, row_id: str) -> int:
    return page.evaluate("([id, controls]) => document.getElementById(id).querySelectorAll(controls).length",
                         [row_id, CONTROLS])


def _names(run, step: str, verb: str) -> re.Pattern:
    """An accessible name that says what it does, to which step, of which run."""
    who = f"(?:{short(run)}|{re.escape(run.business_key)})"
    return re.compile(f"^(?=.*{verb})(?=.*\\b{re.escape(step)}\\b)(?=.*{who})", re.I)


def test_it_resolves_an_effect_and_approves_two_approvals_with_the_keyboard_alone(console, users):
    inject("email", "send", "timeout_after_work", times=2)
    first = start("email_only", {"id": "kb-1"}, business_key="order-kb-1")
    second = start("email_only", {"id": "kb-2"}, business_key="order-kb-2")
    ship_a = start("approve_then_ship", {"id": "kb-a"}, business_key="order-kb-a", started_by=users["sam"])
    ship_b = start("approve_then_ship", {"id": "kb-b"}, business_key="order-kb-b", started_by=users["sam"])
    console.worker("w1")
    wait_until(lambda: [status(r) for r in (first, second, ship_a, ship_b)] == [RunStatus.NEEDS_ATTENTION] * 2
               + [RunStatus.WAITING] * 2, 60, what="two UNKNOWN emails and two approvals")
    effects = {e.id: e for e in EffectRecord.objects.filter(run_id__in=[first.id, second.id])}
    by_run = {first.id: first, second.id: second}

    # The operator: an UNKNOWN email resolved with evidence.
    page = console.page("olga", "/effects/")
    wait_live(page)
    older, newer = (effects[int(i.removeprefix("effect-"))] for i in _row_ids(page, "tr.effect"))  # page order
    region = _live_region(page)
    _skip_link_first(page)
    older_run = by_run[older.run_id]
    resolve = page.locator(f"#resolve-{older.id} > summary")
    expect(resolve).to_have_accessible_name(_names(older_run, "email", "Resolve"))
    _tab_to(page, resolve, most=60, what="the first effect's Resolve…")
    page.keyboard.press("Enter")  # opens the form
    expect(page.locator(f"#resolve-{older.id}")).to_have_attribute("open", "")
    outcome = page.locator(f"#effect-{older.id} select[name=outcome]")
    _tab_to(page, outcome, most=3, what="the outcome")
    page.keyboard.type("succeeded")  # a closed <select> takes the option typed
    expect(outcome).to_have_value("succeeded")
    _tab_to(page, page.locator(f"#effect-{older.id} input[name=downstream_ref]"), most=3, what="the reference")
    page.keyboard.type("msg-4711")
    _tab_to(page, page.locator(f"#effect-{older.id} textarea[name=note]"), most=3, what="the evidence")
    page.keyboard.type("found in the mail server log at 21:04")
    record = page.get_by_role("button", name=_names(older_run, "email", "Record resolution"))
    expect(record).to_have_count(1)
    _tab_to(page, record, most=3, what="Record resolution")
    page.keyboard.press("Enter")

    notice = region.locator(".action-message", has_text=f"#{older.id}")
    expect(notice).to_be_visible(timeout=10_000)
    expect(page.locator(f"#effect-{older.id}")).to_have_count(0)
    _focus_in_row_or_notice(page, f"effect-{newer.id}", region)
    assert region.evaluate("el => el.__kept === true"), "the notices region was replaced"
    wait_until(lambda: EffectRecord.objects.get(id=older.id).status == EffectStatus.SUCCEEDED, 10,
               what="the resolution to be recorded")
    assert EffectRecord.objects.get(id=older.id).resolved_by_label == "olga"
    assert AuditEntry.objects.get(action="effect.resolve").reason == "found in the mail server log at 21:04"
    assert EffectRecord.objects.get(id=newer.id).status == EffectStatus.UNKNOWN  # only the one resolved
    console.shot(page, "keyboard-effect-resolved")
    page.context.close()

    # The approver: two approvals in a row, the focus moving to the next one, then to the notice.
    runs = {ship_a.id: ship_a, ship_b.id: ship_b}
    page = console.page("ann", "/approvals/")
    wait_live(page)
    pending = {a.id: a for a in ApprovalRequest.objects.filter(run__in=[ship_a, ship_b])}
    approvals = [pending[int(i.removeprefix("approval-"))] for i in _row_ids(page, "tr.approval")]  # page order
    assert len(approvals) == 2
    region = _live_region(page)
    _skip_link_first(page)
    most = 80  # from the top of the content to the first Approve
    for i, approval in enumerate(approvals):
        run = runs[approval.run_id]
        approve = page.get_by_role("button", name=_names(run, "ship", "Approve"))
        expect(approve).to_have_count(1)
        expect(page.locator(f"#reject-{approval.id} > summary")).to_have_accessible_name(
            _names(run, "ship", "Reject"))
        _tab_to(page, approve, most=most, what=f"Approve of run {short(run)}")
        if i == 0:
            page.keyboard.press("Space")
        else:  # back to this row's comment, a word typed, forward to Approve again, and Enter
            page.keyboard.press("Shift+Tab")
            expect(page.locator(f"#decide-{approval.id} textarea[name=comment]")).to_be_focused()
            page.keyboard.type("address checked by phone")
            page.keyboard.press("Tab")
            expect(approve).to_be_focused()
            page.keyboard.press("Enter")
        notice = region.locator(".action-message", has_text=short(run))
        expect(notice).to_contain_text("Approved", timeout=10_000)
        expect(page.locator(f"tr.approval#approval-{approval.id}")).to_have_count(0)  # gone from the pending
        after = approvals[i + 1] if i + 1 < len(approvals) else None
        _focus_in_row_or_notice(page, f"approval-{after.id}" if after else None, region)
        if after:  # the next Approve is within that row's own controls, not back at the top
            most = _row_controls(page, f"approval-{after.id}")
    assert region.evaluate("el => el.__kept === true"), "the notices region was replaced"
    console.shot(page, "keyboard-approvals-done")
    page.context.close()

    wait_until(lambda: set(ApprovalRequest.objects.filter(id__in=[a.id for a in approvals])
                           .values_list("state", flat=True)) == {ApprovalState.APPROVED}, 10,
               what="both approvals to be recorded")
    assert set(ApprovalRequest.objects.filter(id__in=[a.id for a in approvals])
               .values_list("decided_by_label", flat=True)) == {"ann"}
    assert AuditEntry.objects.filter(action="approval.approve", outcome="ok", actor_label="ann").count() == 2
    assert ApprovalRequest.objects.get(id=approvals[1].id).comment == "address checked by phone"
    wait_until(lambda: status(ship_a) == status(ship_b) == RunStatus.COMPLETED, 30, what="both runs to ship")
