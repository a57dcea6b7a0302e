"""Every audit entry links to what it is about and shows the business key of its run; automated
actors (the demo's approver bot, the reconciler, createuser) are named system actors."""

from __future__ import annotations

import io
import re
import uuid

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from console.models import BulkBatch, BulkState
from demo.loadgen import bot_approve, bot_user
from ledger.models import EffectStatus
from ledger.outcomes import Succeeded
from ledger.reconcile import reconcile_due
from operators.models import AuditEntry, AuditOutcome
from operators.roles import VIEWER
from sagas.models import ApprovalRequest, ApprovalState
from tests.console.conftest import client_for
from tests.console.queue_data import LookupConnector, make_effect, make_run, resolve
from tests.console.run_data import act, waiting_run

pytestmark = pytest.mark.django_db


def audit_rows(client) -> dict[str, str]:
    """The audit page's rows by entry id."""
    html = client.get(reverse("console:audit")).content.decode()
    return dict(re.findall(r'<tr id="audit-(\d+)"(.*?)</tr>', html, re.S))


def row_of(rows: dict[str, str], entry: AuditEntry) -> str:
    return rows[str(entry.id)]


def test_it_links_each_entry_to_its_object_with_the_business_key_of_its_run(people):
    # An approval decided, an effect resolved and a run cancelled, each through the console.
    waiting = waiting_run("order-7781")
    approval = ApprovalRequest.objects.get(run=waiting)
    assert client_for(people["approver"]).post(reverse("console:approval_decide", args=[approval.id]),
                                               {"decision": "approve", "expected": "PENDING"}).status_code == 302
    parked = make_run(business_key="order-5512")
    effect = make_effect(run=parked)
    assert resolve(client_for(people["operator"]), effect).status_code == 302
    cancelled = make_run(business_key="order-3003", status="PENDING", reason="")
    assert act(client_for(people["operator"]), cancelled, "cancel").status_code == 302

    rows = audit_rows(client_for(people["viewer"]))
    decided = row_of(rows, AuditEntry.objects.get(action="approval.approve"))
    assert f'href="/runs/{waiting.id}/#run-approval-{approval.id}"' in decided
    assert "order-7781" in decided
    resolved = row_of(rows, AuditEntry.objects.get(action="effect.resolve"))
    assert f'href="/runs/{parked.id}/#run-effect-{effect.id}"' in resolved and "order-5512" in resolved
    run_row = row_of(rows, AuditEntry.objects.get(action="run.cancel"))
    assert f'href="/runs/{cancelled.id}/"' in run_row and "order-3003" in run_row
    # The anchors exist on the run's page.
    page = client_for(people["viewer"]).get(reverse("console:run", args=[waiting.id])).content.decode()
    assert f'id="run-approval-{approval.id}"' in page
    page = client_for(people["viewer"]).get(reverse("console:run", args=[parked.id])).content.decode()
    assert f'id="run-effect-{effect.id}"' in page


def test_it_links_a_user_to_the_admin_for_staff_only(people):
    people["nobody"].groups.add(Group.objects.get(name=VIEWER))  # a user.roles entry about nils
    entry = AuditEntry.objects.filter(action="user.roles", object_id=str(people["nobody"].pk)).latest("id")
    admin_link = f'href="/admin/auth/user/{people["nobody"].pk}/change/"'

    assert admin_link not in row_of(audit_rows(client_for(people["viewer"])), entry)
    call_command("createuser", "vera", role=[VIEWER], password="a-long-enough-pass-42", staff=True,
                 stdout=io.StringIO())
    people["viewer"].refresh_from_db()  # a new password: sessions made with the old one have ended
    assert admin_link in row_of(audit_rows(client_for(people["viewer"])), entry)
    assert client_for(people["viewer"]).get(f"/admin/auth/user/{people['nobody'].pk}/change/").status_code == 200


def test_it_audits_the_demo_approver_bots_decisions_as_a_named_system_actor(people):
    run = waiting_run("order-bot-1")
    approval = ApprovalRequest.objects.get(run=run)
    assert bot_approve(approval.id, bot_user())
    approval.refresh_from_db()
    assert approval.state == ApprovalState.APPROVED
    entry = AuditEntry.objects.get(action="approval.approve")
    assert (entry.actor_label, entry.outcome, entry.object_id) == ("system: approver-bot", AuditOutcome.OK,
                                                                   str(approval.id))
    assert entry.after["state"] == ApprovalState.APPROVED and entry.tenant == run.tenant

    assert not bot_approve(approval.id, bot_user())  # decided already: refused, and audited as such
    assert AuditEntry.objects.filter(actor_label="system: approver-bot", outcome=AuditOutcome.REFUSED).count() == 1

    row = row_of(audit_rows(client_for(people["viewer"])), entry)
    assert re.search(r'<span class="system-actor"[^>]*><bdi>system: approver-bot</bdi></span>', row)
    assert "order-bot-1" in row


def test_it_audits_the_reconcilers_resolutions_as_a_system_actor_and_a_query_once(people, monkeypatch):
    monkeypatch.setattr(LookupConnector, "answer", Succeeded(downstream_ref="ch_777", result={"id": "ch_777"}))
    by_reconciler = make_effect(connector="qp.lookup", run=make_run(business_key="order-rec-1"),
                                next_check_at=timezone.now())
    by_person = make_effect(connector="qp.lookup")
    assert reconcile_due().succeeded == 1
    response = client_for(people["operator"]).post(reverse("console:effect_query", args=[by_person.id]))
    assert response.status_code == 302
    by_reconciler.refresh_from_db()
    assert by_reconciler.status == EffectStatus.SUCCEEDED
    entry = AuditEntry.objects.get(object_type="effect", object_id=str(by_reconciler.id))
    assert (entry.actor_label, entry.action, entry.outcome, entry.actor) == (
        "system: reconciler", "effect.resolve", AuditOutcome.OK, None)
    assert entry.after["state"] == EffectStatus.SUCCEEDED and entry.after["downstream_ref"] == "ch_777"
    # The operator's query is audited once, as theirs (not a second time as the reconciler's).
    assert list(AuditEntry.objects.filter(object_type="effect", object_id=str(by_person.id))
                .values_list("actor_label", "action")) == [("olga", "effect.query")]
    row = row_of(audit_rows(client_for(people["viewer"])), entry)
    assert "system: reconciler" in row and "order-rec-1" in row


def test_it_links_a_bulk_batchs_entry_to_the_batchs_page(people):
    batch = BulkBatch.objects.create(token=uuid.uuid4(), user=people["operator"], user_label="olga",
                                     action="run.cancel", reason="duplicates of order 12", state=BulkState.DONE)
    entry = AuditEntry.objects.create(actor=people["operator"], actor_label="olga", action="bulk.run.cancel",
                                      object_type="bulk_batch", object_id=str(batch.id), outcome=AuditOutcome.OK)
    client = client_for(people["viewer"])
    row = row_of(audit_rows(client), entry)
    href = reverse("console:bulk_batch", args=[batch.token])
    assert f'href="{href}"' in row and f"batch {batch.id}" in row
    assert client.get(href).status_code == 200
