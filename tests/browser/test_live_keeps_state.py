"""Live pages keep the operator's work: in a real browser (Chromium, daphne, the real
channel layer, real workers), pushes morph the page instead of replacing it. A message stays
until dismissed; a half-typed note, its caret, the keyboard focus and the scroll position survive
50 pushes; and a run page's actions follow the run's state."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.db.models import F
from playwright.sync_api import expect

from demo.providers.faults import inject
from ledger.models import EffectRecord, EffectStatus
from ledger.signals import send_effect_changed
from operators.services.actions import Actor
from operators.services.queues import effect_manual_resolve
from sagas import start
from sagas.models import RunStatus, WorkflowRun
from tests.console.queue_data import make_effect
from tests.ledger import wf_orders, wf_sagas  # noqa: F401  (register the workflows here too)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PUSHES = 50
MAX_CHANGES = 200  # each change waits for a push: far more changes than pushes means they stopped arriving
HALF_TYPED = "Checked the provider dashboard: charge ch_81 is th"
COUNT_PUSHES = """() => { window.__pushes = 0;
  document.addEventListener("htmx:wsAfterMessage", () => { window.__pushes += 1; }); }"""


def _change(typed: EffectRecord) -> None:
    """What the workers do all day, as the ledger reports it: a new effect became UNKNOWN, and the
    effect being resolved was tried once more (its row shows the attempts)."""
    new = make_effect(age=timedelta(seconds=1))
    EffectRecord.objects.filter(id=typed.id).update(attempts=F("attempts") + 1)
    send_effect_changed(effect_id=new.id, run_id=new.run_id, status=EffectStatus.UNKNOWN, previous="IN_PROGRESS")


def test_it_keeps_a_message_a_half_typed_note_and_the_focus_through_50_pushes(console, users):
    typed = make_effect(age=timedelta(minutes=30), step="capture")
    acted = make_effect(age=timedelta(minutes=20), step="email")
    page = console.page("olga", "/effects/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)

    # An action: its result is a message outside the live region.
    row = page.locator(f"#effect-{acted.id}")
    row.locator("summary", has_text="Resolve").click()
    row.locator("select[name=outcome]").select_option("failed")
    row.locator("textarea[name=note]").fill("provider support: never charged, ticket 4471")
    row.get_by_role("button", name="Record resolution").click()
    message = page.locator("#messages .action-message", has_text=f"Effect #{acted.id} (email) resolved as failed")
    expect(message).to_be_visible(timeout=10_000)
    expect(page.locator(f"#effect-{acted.id}")).to_have_count(0)

    # Half a note typed in another row's resolve form, the focus in it.
    row = page.locator(f"#effect-{typed.id}")
    row.locator("summary", has_text="Resolve").click()
    row.locator("select[name=outcome]").select_option("succeeded")
    note = row.locator("textarea[name=note]")
    note.click()
    page.keyboard.type(HALF_TYPED)
    page.evaluate(COUNT_PUSHES)
    attempts = row.locator("td.num").first
    scrolled = page.evaluate("window.scrollY")

    def still_there(pushed: int) -> None:
        state = page.evaluate("""(id) => ({
            active: document.activeElement === document.querySelector(`#effect-${id} textarea[name=note]`),
            open: document.querySelector(`#resolve-${id}`).open,
            outcome: document.querySelector(`#effect-${id} select[name=outcome]`).value,
            caret: document.activeElement.selectionStart,
            scrolled: window.scrollY })""", typed.id)
        assert message.is_visible(), f"the message vanished after {pushed} pushes"
        assert note.input_value() == HALF_TYPED, f"the note was changed after {pushed} pushes"
        assert state["active"], f"the focus left the note after {pushed} pushes"
        assert state["open"] and state["outcome"] == "succeeded", state
        assert state["caret"] == len(HALF_TYPED) and state["scrolled"] == scrolled, state

    # Changes as fast as the pushes take them, until 50 pushes have reached the page: one change
    # ahead, and the next each time a push arrives (a page gets at most one push per
    # consumers.PUSH_INTERVAL, 0.25 s, so that takes 12.5 s or more). After every fifth push,
    # everything the person left is checked to be there.
    started = time.monotonic()
    _change(typed)
    changes, pushed = 1, 0
    while pushed < PUSHES:
        assert changes < MAX_CHANGES, f"only {pushed} pushes after {changes} changes"
        _change(typed)
        changes += 1
        page.wait_for_function("(n) => window.__pushes > n", arg=pushed, timeout=10_000)
        before, pushed = pushed, page.evaluate("window.__pushes")
        if pushed // 5 > before // 5:
            still_there(pushed)
    took = time.monotonic() - started
    still_there(PUSHES)

    # The pushes did arrive: the count and the typed row's attempts moved with them.
    total = EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).count()
    expect(page.locator("#live-effects_queue .summary strong")).to_have_text(str(total))
    tried = EffectRecord.objects.get(id=typed.id).attempts
    assert tried == changes + 1
    expect(attempts).to_have_text(re.compile(rf"^\s*{tried}\b"))
    assert total == changes + 1
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    print(f"\n{PUSHES} pushes ({changes} changes) in {took:.1f} s: the message, the half-typed note, the focus and "
          "the open form were all there after every fifth push")
    console.shot(page, "effects_live_state")

    # The message goes when its dismiss button is pressed, and only then.
    message.get_by_role("button", name="Dismiss").click()
    expect(message).to_have_count(0)


def test_it_drops_cancel_and_the_unknown_effect_hint_when_the_run_moves_on(console, users):
    inject("email", "send", "timeout_after_work")
    run = start("email_only", {"id": "live-actions-1"})
    console.worker("w1")
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.NEEDS_ATTENTION, 30,
               what="the email to be UNKNOWN")
    page = console.page("olga", f"/runs/{run.id}/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    actions = page.locator("#live-run_actions")
    expect(actions.locator("summary", has_text="Cancel")).to_have_count(1)
    expect(actions).to_contain_text("It waits for an unknown effect")

    effect = EffectRecord.objects.get(run_id=run.id)
    effect_manual_resolve(Actor(user=users["sam"], ip=None), effect_id=effect.id, outcome="succeeded",
                          downstream_ref="msg-1", note="found in the mail log", expected="UNKNOWN")
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 30,
               what="the run to resume and complete")
    expect(page.locator("#live-run_header")).to_contain_text("COMPLETED", timeout=10_000)
    expect(actions.locator("summary", has_text="Cancel")).to_have_count(0)
    expect(actions).not_to_contain_text("It waits for an unknown effect")
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    console.shot(page, "run_actions_live")


def test_it_keeps_a_row_being_typed_in_when_someone_else_resolves_it_and_refuses_the_stale_form(console, users):
    effect = make_effect(age=timedelta(minutes=30))
    other = make_effect(age=timedelta(minutes=10))
    page = console.page("olga", "/effects/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    row = page.locator(f"#effect-{effect.id}")
    row.locator("summary", has_text="Resolve").click()
    row.locator("select[name=outcome]").select_option("not_executed")
    note = row.locator("textarea[name=note]")
    note.fill("asked the provider, no record of th")

    # Meanwhile another operator resolves it: the push drops it from the queue, but not from this
    # page while something is typed in its form.
    effect_manual_resolve(Actor(user=users["sam"], ip=None), effect_id=effect.id, outcome="failed",
                          downstream_ref="", note="declined by the bank", expected="UNKNOWN")
    expect(page.locator("#live-effects_queue .summary strong")).to_have_text("1", timeout=10_000)
    expect(row).to_have_class(re.compile(r"\blive-gone\b"))
    expect(row.locator("td").first).to_contain_text("(no longer in this list)")  # said to screen readers too
    expect(note).to_have_value("asked the provider, no record of th")

    # Submitting it is refused with the reason, as a message; the text is still there.
    note.press_sequentially("is key")
    row.get_by_role("button", name="Record resolution").click()
    refusal = page.locator("#messages .action-message.error")
    expect(refusal).to_be_visible(timeout=10_000)
    expect(note).to_have_value("asked the provider, no record of this key")
    assert EffectRecord.objects.get(id=effect.id).status == EffectStatus.FAILED_FINAL

    # Once what was typed and chosen is undone, the row goes with the next push.
    note.fill("")
    row.locator("select[name=outcome]").select_option("")
    page.locator(f"#effect-{other.id} summary", has_text="Resolve").click()  # moves the focus away
    effect_changed_elsewhere = make_effect(age=timedelta(minutes=1))
    send_effect_changed(effect_id=effect_changed_elsewhere.id, run_id=effect_changed_elsewhere.run_id,
                        status=EffectStatus.UNKNOWN, previous="IN_PROGRESS")
    expect(row).to_have_count(0, timeout=10_000)
    expect(page.locator(f"#effect-{other.id}")).to_have_count(1)
    expect(refusal).to_be_visible()
