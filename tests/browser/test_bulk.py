"""A bulk resolve from the browser: every UNKNOWN email effect, previewed, confirmed, and
followed live on the batch's page until done (real daphne, workers and providers)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from console.models import BulkBatch
from demo.providers.faults import inject
from ledger.models import EffectRecord, EffectStatus
from operators.models import AuditEntry
from sagas import start
from sagas.models import RunStatus, WorkflowRun
from tests.ledger import wf_orders  # noqa: F401  (register the workflows here too)
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_resolves_every_unknown_email_effect_in_one_batch_with_live_progress(console, users):
    inject("email", "send", "timeout_after_work", times=4)
    inject("payments", "capture", "timeout_after_work", times=1)
    emails = [start("email_only", {"id": f"bulk-{i}"}) for i in range(4)]
    capture = start("capture_only", {"id": "bulk-pay"})
    first = console.worker("w1")
    wait_until(lambda: EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).count() == 5, 60,
               what="four emails and a capture to be UNKNOWN")
    first.kill()  # no worker: the batch waits in the queue, and its page shows it coming to life

    page = console.page("olga", None)
    errors: list[str] = []  # a CSP violation is a console error in Chromium
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto("/effects/?connector=email.send")
    toolbar = page.locator("#bulk-form")
    toolbar.locator("select[name=action]").select_option("effect.resolve")
    console.shot(page, "bulk-effects-toolbar")
    toolbar.get_by_role("button", name=re.compile("everything matching")).click()
    expect(page.locator("h1")).to_contain_text("Resolve 4 effects?")
    expect(page.locator(".bulk-sample tbody tr")).to_have_count(4)
    expect(page.locator(".bulk-sample")).not_to_contain_text("capture")
    console.shot(page, "bulk-preview")
    form = page.locator("form.bulk-confirm")
    form.locator("select[name=outcome]").select_option("succeeded")
    form.locator("input[name=downstream_ref]").fill("mail-log-2026-12-01")
    form.locator("textarea[name=reason]").fill("the mail provider's log export shows all four sent (ticket OPS-12)")
    form.locator("input[name=confirm]").check()
    form.get_by_role("button", name="Resolve 4 effects").click()

    live = page.locator("#live-bulk_batch")
    expect(live).to_contain_text("0 of 4 done")
    expect(page.locator("#live-status")).to_have_text("live", timeout=10_000)
    console.shot(page, "bulk-batch-queued")
    console.worker("w2")
    expect(live).to_contain_text("4 of 4 done", timeout=30_000)  # pushed: no reload
    expect(live.locator(".bulk-state .badge")).to_have_text("done")
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    console.shot(page, "bulk-batch-done")
    page.goto("/bulk/")
    expect(page.locator(".bulk-batches tbody tr")).to_have_count(1)
    assert errors == []

    batch = BulkBatch.objects.get()
    assert (batch.total, batch.ok) == (4, 4)
    email_effects = EffectRecord.objects.filter(connector="email.send")
    assert set(email_effects.values_list("resolved_by_label", flat=True)) == {"olga"}
    other = EffectRecord.objects.get(run_id=capture.id)  # not an email: not in the batch (the reconciler may settle it)
    assert other.resolved_by_label != "olga" and not batch.items.filter(object_id=str(other.id)).exists()
    assert AuditEntry.objects.filter(action="effect.resolve", outcome="ok", actor_label="olga").count() == 4
    assert set(email_effects.values_list("status", flat=True)) == {EffectStatus.SUCCEEDED}
    wait_until(lambda: all(WorkflowRun.objects.get(id=r.id).status == RunStatus.COMPLETED for r in emails), 60,
               what="the email runs to finish with the reference as their message id")
