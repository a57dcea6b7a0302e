"""Every list page reads in a number of queries that does not grow with the rows it shows: a
row that adds a query (a run, a summary, a user looked up per row) fails here. Each page is
read with a few rows, then with many more, and the counts must be equal."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.models import EffectStatus
from operators.models import AuditOutcome
from sagas.models import ApprovalState, RunStatus
from tests.console.conftest import client_for
from tests.console.queue_data import audit, make_approval, make_effect, make_run

pytestmark = pytest.mark.django_db

SUMMARY = {"customer": "ACME <b>GmbH</b>", "amount": "49.99 EUR", "card": "4111 1111 1111 1111"}


def runs(i: int) -> None:
    make_run(status=RunStatus.NEEDS_ATTENTION, reason="budget_exceeded", business_key=f"order-{i}",
             summary=SUMMARY, tenant=f"t{i % 3}")


def effects(i: int) -> None:
    make_effect(run=make_run(business_key=f"order-{i}", summary=SUMMARY, tenant=f"t{i % 3}"),
                status=EffectStatus.UNKNOWN if i % 2 else EffectStatus.IN_PROGRESS, age=timedelta(minutes=i + 1),
                tenant=f"t{i % 3}")


def approvals(i: int) -> None:
    make_approval(run=make_run(status=RunStatus.WAITING, reason="", business_key=f"order-{i}", summary=SUMMARY,
                               tenant=f"t{i % 3}"),
                  state=ApprovalState.PENDING if i % 2 else ApprovalState.ESCALATED)


def audits(i: int) -> None:
    audit(actor_label=f"user-{i % 4}", object_id=str(i), outcome=AuditOutcome.OK if i % 2 else AuditOutcome.REFUSED,
          reason=f"checked <i>{i}</i>")


# A search reads its page's positions, then its rows by id (operators.selectors.runs._sorted_page,
# operators.selectors.queues): still as many queries for 50 rows as for 2.
PAGES: list[tuple[str, str, dict[str, str], Callable[[int], None]]] = [
    ("runs list", "console:runs", {}, runs),
    ("runs list, business-key search", "console:runs", {"q": "order-"}, runs),
    ("ambiguous-effects queue", "console:effects", {}, effects),
    ("ambiguous-effects queue, filtered", "console:effects", {"tenant": "t1"}, effects),
    ("ambiguous-effects queue, business-key search", "console:effects", {"q": "order-"}, effects),
    ("approvals inbox", "console:approvals", {}, approvals),
    ("audit log", "console:audit", {}, audits),
    ("overview", "console:overview", {}, runs),
]


@pytest.mark.parametrize(("page", "url", "params", "make"), PAGES, ids=[p[0] for p in PAGES])
def test_a_list_page_reads_in_as_many_queries_for_many_rows_as_for_a_few(people, page, url, params, make):
    client = client_for(people["operator"])

    def queries_for_rows(start: int, count: int) -> int:
        for i in range(start, start + count):
            make(i)
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse(url), params)
        assert response.status_code == 200
        return len(queries)

    few = queries_for_rows(0, 2)
    many = queries_for_rows(2, 30)
    assert many == few, f"{page}: {few} queries with 2 rows, {many} with 32"
