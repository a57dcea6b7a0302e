"""In a real browser: an agent run's page shows its conversation, one row per turn; a long answer
opens on demand; a tool call's status badge leads to its effect in the ledger; hostile text from
the model and a tool's arguments stays text."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from ledger.models import EffectRecord
from sagas import approve
from sagas.models import RunStatus
from sagas.replay.engine import advance
from tests.console.conversation_data import agent_run
from tests.console.run_data import IMG, SCRIPT

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "Summary: " + "paid, shipped and confirmed. " * 30 + "END-OF-SUMMARY"


def test_it_shows_an_agent_run_as_a_conversation(console, users):
    run = agent_run([
        {"text": f"Let me look {SCRIPT}", "calls": [["lookup_order", {"order": "o-9", "note": IMG}]]},
        {"calls": [["capture_payment", {"order": "o-9", "amount_cents": 4999}]]},
        {"calls": [["ship_order", {"order": "o-9"}]]},
    ], final=LONG, started_by=users["olga"])
    approve(run_id=run.id, name="approve:ship_order", user=users["ann"], comment="fine")
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    payment = EffectRecord.objects.get(run_id=run.id, step_name="capture_payment")

    page = console.page("vic", f"/runs/{run.id}/")
    conversation = page.locator("#live-run_conversation")
    expect(conversation.get_by_role("heading", name=re.compile("Conversation"))).to_be_visible()
    turns = conversation.locator("li.turn")
    expect(turns).to_have_count(4)
    expect(turns.nth(0)).to_contain_text("Turn 1")
    expect(turns.nth(0)).to_contain_text("Order o-1: handle it")
    expect(turns.nth(0).locator(".turn-said")).to_have_text(f"Let me look {SCRIPT}")  # shown as text
    expect(turns.nth(0).locator(".tool-args")).to_contain_text(IMG)
    expect(turns.nth(0)).to_contain_text(re.compile(r"\d+ in / \d+ out tokens"))
    expect(turns.nth(2).locator(".tool-approval")).to_contain_text("APPROVED by ann")
    expect(conversation.locator(".conversation-total")).to_contain_text("4 turns")
    console.shot(page, "conversation")

    # The long answer is folded; it opens on a click.
    answer = turns.nth(3).locator("details.conv-long")
    expect(answer.locator("pre.payload")).to_be_hidden()
    answer.locator("summary").click()
    expect(answer.locator("pre.payload")).to_be_visible()
    expect(answer.locator("pre.payload")).not_to_contain_text("END-OF-SUMMARY")

    # The payment's status leads to its row in the run's effects.
    badge = turns.nth(1).locator(".tool-call-head a.badge")
    expect(badge).to_have_text("SUCCEEDED")
    badge.click()
    page.wait_for_url(re.compile(rf".*#run-effect-{payment.id}$"))
    expect(page.locator(f"#run-effect-{payment.id}")).to_contain_text("capture_payment")
