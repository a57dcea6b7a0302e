"""The overview page: counts by status, the queues that need a person (with how long their
oldest item has waited) and runs per minute, read in a few queries whatever the data."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.selectors.overview import overview
from ledger.models import EffectRecord, EffectStatus
from sagas.models import (
    ApprovalRequest,
    CompensationItem,
    CompensationItemState,
    CompensationPlan,
    RunStatus,
    WorkflowRun,
)
from tests.console.conftest import client_for

pytestmark = pytest.mark.django_db

# Reading the overview: the kept counts, the workflow pauses, the small queues (one query), the
# oldest run per reason, runs per minute. None of them counts the runs table.
OVERVIEW_QUERIES = 5


def make_run(status: str = RunStatus.PENDING, reason: str = "", age: timedelta = timedelta(0),
             **fields) -> WorkflowRun:
    run = WorkflowRun.objects.create(workflow_name="ov", version=1, definition_hash="0" * 64, status=status,
                                     status_reason=reason, **fields)
    if age:
        WorkflowRun.objects.filter(id=run.id).update(updated_at=timezone.now() - age)
    return run


def make_unknown_effect(age: timedelta) -> EffectRecord:
    run = make_run(RunStatus.NEEDS_ATTENTION, "effect_unknown")
    return EffectRecord.objects.create(
        tenant="default", idempotency_key=f"ov-{uuid.uuid4()}", run_id=run.id, step_name="capture",
        connector="ov.pay", request_payload={}, payload_hash="0" * 64, status=EffectStatus.UNKNOWN,
        intent_at=timezone.now() - age, attempts=1,
    )


def make_pending_approval(age: timedelta) -> ApprovalRequest:
    run = make_run(RunStatus.WAITING)
    now = timezone.now()
    return ApprovalRequest.objects.create(run=run, step="ship", reason="ship it", requested_at=now - age,
                                          deadline=now + timedelta(hours=1))


def make_failed_compensation(age: timedelta) -> CompensationItem:
    run = make_run(RunStatus.NEEDS_ATTENTION, "compensation_failed", age=age)
    plan = CompensationPlan.objects.create(run=run, reason="refund", trigger="operator",
                                           created_at=timezone.now() - age)
    return CompensationItem.objects.create(plan=plan, position=0, effect_id=1, step_name="capture",
                                           connector="ov.pay", state=CompensationItemState.FAILED)


def queue_rows(html: str) -> dict[str, tuple[str, str]]:
    """The "Needs a person" table as the operator reads it: queue -> (items, oldest waiting)."""
    rows = re.findall(r'<td>(?:<span class="muted">↳ </span>)?<a href="[^"]+">([^<]+)</a></td>\s*'
                      r'<td class="num">(\d+)</td>\s*<td>(.*?)</td>', html, re.S)
    return {label: (n, re.sub(r"<[^>]+>", "", age).strip()) for label, n, age in rows}


def status_cards(html: str) -> dict[str, str]:
    return {s: n for n, s in re.findall(r'<span class="n">(\d+)</span><span class="label">([A-Z_]+)</span>',
                                               html)}


def seconds(text: str) -> int:
    """An age as the page says it ("40 s", "12 min", "3 h", "2 d"), in seconds (rounded down)."""
    n, unit = text.split()
    return int(n) * {"s": 1, "min": 60, "h": 3600, "d": 86400}[unit]


def test_it_shows_counts_by_status_and_the_queues_that_need_a_person(people):
    make_run(RunStatus.PENDING)
    make_run(RunStatus.COMPLETED, finished_at=timezone.now())
    make_unknown_effect(timedelta(minutes=10))
    make_unknown_effect(timedelta(minutes=2))
    make_pending_approval(timedelta(minutes=5))
    make_failed_compensation(timedelta(minutes=30))
    make_run(RunStatus.NEEDS_ATTENTION, "version_mismatch", age=timedelta(hours=2))
    make_run(RunStatus.NEEDS_ATTENTION, "budget_exceeded", age=timedelta(minutes=1))
    make_run(RunStatus.NEEDS_ATTENTION, "budget_exceeded", age=timedelta(minutes=3))

    html = client_for(people["viewer"]).get(reverse("console:overview")).content.decode()

    assert status_cards(html) == {
        "PENDING": "1", "RUNNING": "0", "WAITING": "1", "NEEDS_ATTENTION": "6", "COMPENSATING": "0",
        "COMPLETED": "1", "FAILED": "0", "CANCELLED": "0", "COMPENSATED": "0",
    }
    queues = queue_rows(html)
    assert {label: n for label, (n, _) in queues.items()} == {
        "Unknown effects": "2", "Pending approvals": "1", "Failed compensations": "1", "Version mismatches": "1",
        "Exhausted budgets": "2", "Models unavailable": "0", "Non-deterministic runs": "0", "Failed runs": "0",
        "Paused runs": "0",
    }
    # The oldest item of each queue, as people say it (a loaded machine only adds to them).
    for label, at_least, unit in (("Unknown effects", 600, 60), ("Pending approvals", 300, 60),
                                  ("Failed compensations", 1800, 60), ("Version mismatches", 7200, 3600),
                                  ("Exhausted budgets", 180, 60)):
        assert at_least <= seconds(queues[label][1]) <= at_least + unit, (label, queues[label])
    bars = re.findall(r'<title>\d\d:\d\d · started (\d+) · finished (\d+)</title>', html)
    assert len(bars) == 60
    assert sum(int(s) for s, _ in bars) == 9 and sum(int(f) for _, f in bars) == 1


def test_it_shows_empty_queues_with_no_age(people):
    html = client_for(people["viewer"]).get(reverse("console:overview")).content.decode()
    assert set(queue_rows(html).values()) == {("0", "–")}
    assert set(status_cards(html).values()) == {"0"}


def test_it_reads_the_overview_in_a_few_queries_whatever_the_data():
    for age in (1, 2):
        make_unknown_effect(timedelta(minutes=age))
        make_pending_approval(timedelta(minutes=age))
        make_failed_compensation(timedelta(minutes=age))
        make_run(RunStatus.NEEDS_ATTENTION, "version_mismatch")
        make_run(RunStatus.NEEDS_ATTENTION, "budget_exceeded")
    with CaptureQueriesContext(connection) as queries:
        overview(user=get_user_model()(is_superuser=True))  # sees every tenant without asking
    assert len(queries) == OVERVIEW_QUERIES, [q["sql"] for q in queries]
    for sql in (q["sql"] for q in queries):  # the runs are never counted: their counts are kept
        assert not ('FROM "sagas_workflowrun"' in sql and "COUNT(" in sql.upper()
                    and "paused_at" not in sql), sql
