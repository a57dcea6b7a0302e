"""Business context where people decide: a workflow's summary of its input, stored on the run at
start and shown (redacted, isolated) with the business key and tenant on the effects queue, the
approvals inbox, the run list and the compensation preview and plan."""

from __future__ import annotations

import logging
import re
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from core.redaction import MARK
from ledger.models import EffectStatus
from sagas import start, workflow
from sagas.models import (
    CompensationItem,
    CompensationPlan,
    RunStatus,
    WorkflowRun,
)
from sagas.summaries import ERROR_KEY
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_effect, text

pytestmark = pytest.mark.django_db

CARD = "4242 4242 4242 4242"
ORDER = {"id": "ORD-1842", "customer": {"name": "Ada Lovelace", "email": "ada@example.com"},
         "amount_cents": 12999, "currency": "EUR", "lines": [{"sku": "SKU-9", "qty": 2}]}


@workflow("bc_fields", version=1, summary=["id", "customer.name", "amount_cents", "currency", "lines.0.sku", "gone"])
def bc_fields(ctx, order):  # pragma: no cover - never run: the tests only start runs
    return order


@workflow("bc_function", version=1,
          summary=lambda o: {"order": o["id"], "amount": f"{o['amount_cents'] / 100:.2f} {o['currency']}"})
def bc_function(ctx, order):  # pragma: no cover
    return order


def _raises(order):
    return {"order": order["no-such-field"]}


@workflow("bc_raises", version=1, summary=_raises)
def bc_raises(ctx, order):  # pragma: no cover
    return order


@workflow("bc_not_json", version=1, summary=lambda o: {"amount": Decimal("1.5"), "tags": {"a"}})
def bc_not_json(ctx, order):  # pragma: no cover
    return order


@workflow("bc_secret", version=1, summary=["id", "api_key", "card"])
def bc_secret(ctx, order):  # pragma: no cover
    return order


def test_it_stores_the_fields_a_workflow_names_as_the_runs_summary_at_start():
    run = start("bc_fields", ORDER, business_key="ORD-1842", tenant="acme")
    stored = WorkflowRun.objects.get(id=run.id)
    assert stored.summary == {"id": "ORD-1842", "customer.name": "Ada Lovelace", "amount_cents": 12999,
                              "currency": "EUR", "lines.0.sku": "SKU-9"}
    assert stored.input == ORDER  # the input itself is stored as given


def test_it_stores_what_a_summary_function_returns():
    run = start("bc_function", ORDER, business_key="ORD-1842")
    assert WorkflowRun.objects.get(id=run.id).summary == {"order": "ORD-1842", "amount": "129.99 EUR"}


def test_it_starts_the_run_when_the_summary_function_raises_and_logs_it_once(caplog):
    with caplog.at_level(logging.WARNING, logger="sagas.summaries"):
        first = start("bc_raises", {"id": "a"}, business_key="a")
        second = start("bc_raises", {"id": "b"}, business_key="b")
    for run in (first, second):
        stored = WorkflowRun.objects.get(id=run.id)
        assert stored.status == RunStatus.PENDING
        assert stored.summary == {ERROR_KEY: "KeyError: 'no-such-field'"}
    assert len([r for r in caplog.records if "bc_raises" in r.getMessage()]) == 1


def test_it_starts_the_run_when_the_summary_is_not_json():
    run = start("bc_not_json", {"id": "a"})
    summary = WorkflowRun.objects.get(id=run.id).summary
    assert list(summary) == [ERROR_KEY] and "not JSON" in summary[ERROR_KEY]


def test_it_refuses_a_summary_that_is_neither_a_function_nor_a_list_of_fields():
    for bad in ("customer", [""], [1], ["a..b"], {"customer": 1}):
        with pytest.raises(ValueError, match="summary"):
            workflow("bc_bad", version=1, summary=bad)


def _row(page: str, anchor: str) -> str:
    """The table row with id ``anchor``."""
    found = re.search(rf'<tr id="{anchor}".*?</tr>', page, re.S)
    assert found, anchor
    return found.group(0)


def _shows_context(html: str) -> None:
    assert '<bdi class="v">ORD-1842</bdi>' in html  # the summary's order id
    assert '<bdi class="v">Ada Lovelace</bdi>' in html
    assert '<bdi class="v">12999</bdi>' in html and '<bdi class="v">EUR</bdi>' in html


def test_it_shows_summary_business_key_and_tenant_on_each_queue_row(people):
    run = start("bc_fields", ORDER, business_key="ORD-1842", tenant="acme")
    WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.WAITING)
    effect = make_effect(run=run, tenant="acme")
    approval = make_approval(run=run)
    client = client_for(people["viewer"])

    row = _row(text(client.get(reverse("console:effects"))), f"effect-{effect.id}")
    _shows_context(row)
    assert "ORD-1842</bdi>" in row and '<bdi class="tenant">acme</bdi>' in row

    row = _row(text(client.get(reverse("console:approvals"))), f"approval-{approval.id}")
    _shows_context(row)
    assert "ORD-1842</bdi>" in row and '<bdi class="tenant">acme</bdi>' in row

    page = text(client.get(reverse("console:runs")))
    row = re.search(rf'<tr class="run-row[^"]*">(?:(?!</tr>).)*{run.id}.*?</tr>', page, re.S).group(0)
    _shows_context(row)
    assert "acme" in row


def test_it_shows_the_summary_and_each_effects_request_on_the_compensation_preview_and_plan(people):
    run = start("bc_fields", ORDER, business_key="ORD-1842", tenant="acme")
    WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.FAILED)
    charge = make_effect(run=run, status=EffectStatus.SUCCEEDED, step="capture", tenant="acme",
                         request_payload={"order": "ORD-1842", "amount_cents": 12999, "currency": "EUR",
                                          "api_key": "sk_live_abcdef123456"})
    client = client_for(people["operator"])

    preview = text(client.get(reverse("console:run_compensate", args=[run.id])))
    _shows_context(preview)
    assert "&quot;amount_cents&quot;: 12999" in preview and "&quot;currency&quot;: &quot;EUR&quot;" in preview
    assert "sk_live_abcdef123456" not in preview and MARK in preview

    plan = CompensationPlan.objects.create(run=run, reason="customer cancelled", trigger="operator",
                                           created_at=timezone.now())
    CompensationItem.objects.create(plan=plan, position=0, effect_id=charge.id, step_name="capture",
                                    connector=charge.connector, compensation_key="k:compensate")
    page = text(client.get(reverse("console:run", args=[run.id])))
    section = re.search(r'<section id="live-run_compensation".*?</section>', page, re.S).group(0)
    _shows_context(section)
    assert "&quot;amount_cents&quot;: 12999" in section and "sk_live_abcdef123456" not in section


def test_it_hides_a_secret_in_a_summary_and_isolates_its_text_on_every_page(people):
    rlo = "evil\u202eKEY"
    run = start("bc_secret", {"id": rlo, "api_key": "sk_live_abcdef123456", "card": CARD}, business_key="bk-secret")
    WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.WAITING)
    make_effect(run=run)
    make_approval(run=run)
    client = client_for(people["operator"])
    for name in ("console:effects", "console:approvals", "console:runs"):
        page = text(client.get(reverse(name)))
        assert "sk_live_abcdef123456" not in page and CARD not in page, name
        assert f'<bdi class="v">{MARK}</bdi>' in page, name
        assert "<bdi class=\"v\">evil⟨U+202E⟩KEY</bdi>" in page and rlo not in page, name


def test_it_says_summary_unavailable_for_a_run_whose_summary_failed(people):
    run = start("bc_raises", {"id": "x"}, business_key="bk-failed-summary")
    make_effect(run=run)
    page = text(client_for(people["viewer"]).get(reverse("console:effects")))
    assert "summary unavailable" in page and "KeyError" in page
