"""Dual control in a real browser (Chromium, daphne, the real channel layer): a compensation one
operator asks for appears live in another operator's inbox beside the approvals, who confirms it
with a reason; the run is then compensating. Screenshot in test-artifacts/screenshots/."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.broadcast import publisher
from operators.models import DualControlRequest, DualState
from operators.services.actions import Actor
from operators.services.dual import ConfirmationNeeded
from operators.services.runs import run_compensate_act
from sagas.models import RunStatus
from tests.console.run_data import waiting_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_request_is_pushed_to_the_inbox_and_confirmed_there(console, users, settings):
    settings.SAGA_DUAL_CONTROL = {"run.compensate": ["*"]}
    run = waiting_run("o-dual")
    page = console.page("sam", "/approvals/")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    expect(page.locator("#live-approvals_inbox")).to_contain_text("No request is waiting for a second person")

    # olga asks (here, in the test process: its commit pushes to the open page through Redis)
    with pytest.raises(ConfirmationNeeded):
        run_compensate_act(Actor(user=users["olga"], ip="127.0.0.1"), run_id=str(run.id),
                           reason="customer <b>refund</b> OPS-9", expected="WAITING")
    assert publisher.flush(timeout=5)
    request = DualControlRequest.objects.get()
    row = page.locator(f"#dual-{request.pk}")
    expect(row).to_contain_text(f"Compensate run {run.id}", timeout=10_000)  # without a reload
    expect(row).to_contain_text("customer <b>refund</b> OPS-9")  # shown as text
    expect(row.locator("b")).to_have_count(0)
    console.shot(page, "dual-control-inbox")

    row.get_by_label("Reason (required)").fill("checked with finance")
    row.get_by_role("button", name="Confirm and do it").click()
    expect(page.locator("#live-approvals_inbox")).to_contain_text("No request is waiting for a second person",
                                                                  timeout=10_000)
    expect(page.get_by_text(f"Confirmed request #{request.pk}")).to_be_visible()
    request.refresh_from_db()
    run.refresh_from_db()
    assert (request.state, request.decided_by_label) == (DualState.CONFIRMED, "sam")
    assert run.status == RunStatus.COMPENSATING
