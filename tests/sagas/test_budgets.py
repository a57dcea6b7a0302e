"""Budgets: a run that goes over its steps, cost or duration stops before its next step."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from sagas import start, workflow
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.replay.engine import Outcome, advance
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _cheap(i: int) -> int:
    return i


@workflow("budget_steps", version=1, max_steps=3)
def budget_steps(ctx, spec):
    return [ctx.step("s", _cheap, i) for i in range(5)]


@workflow("budget_cost", version=1, max_cost=1.0)
def budget_cost(ctx, spec):
    def call_model(i):
        ctx.add_cost(0.4)  # a model call billed at 0.40 usd
        return f"answer {i}"

    return [ctx.step("model", call_model, i) for i in range(5)]


@workflow("budget_duration", version=1, max_duration=timedelta(seconds=1))
def budget_duration(ctx, spec):
    def slow(i):
        # The first step is quick; the second lasts until the run is past its budget
        # (polled, so a loaded machine cannot make either end early or late).
        if i:
            started = WorkflowRun.objects.values_list("started_at", flat=True).get(id=ctx.run_id)
            wait_until(lambda: timezone.now() - started > timedelta(seconds=1), 30, what="the budget to run out")
        return i

    return [ctx.step("slow", slow, i) for i in range(5)]


def test_it_stops_a_run_that_used_up_its_step_budget():
    run = start("budget_steps", {})
    assert advance(str(run.id), owner="t") == Outcome.NEEDS_ATTENTION
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "budget_exceeded")
    assert run.error["budget"] == "steps" and run.error["used"] == 3 and run.error["limit"] == 3
    assert JournalEntry.objects.filter(run=run, kind="step").count() == 3
    assert run.steps_used == 3


def test_it_stops_a_run_that_used_up_its_cost_budget():
    run = start("budget_cost", {})
    assert advance(str(run.id), owner="t") == Outcome.NEEDS_ATTENTION
    run.refresh_from_db()
    assert run.status_reason == "budget_exceeded" and run.error["budget"] == "cost"
    assert run.cost_used == Decimal("1.2")  # three model calls; the fourth was never made
    assert run.error["used"] == pytest.approx(1.2) and run.error["limit"] == 1.0
    assert JournalEntry.objects.filter(run=run, kind="step").count() == 3


def test_it_stops_a_run_that_used_up_its_duration_budget():
    run = start("budget_duration", {})
    assert advance(str(run.id), owner="t") == Outcome.NEEDS_ATTENTION
    run.refresh_from_db()
    assert run.status_reason == "budget_exceeded" and run.error["budget"] == "duration"
    assert run.error["used"] >= 1.0 and run.error["limit"] == 1.0
    assert JournalEntry.objects.filter(run=run, kind="step").count() == 2


def test_it_lets_a_start_override_the_workflow_budget():
    run = start("budget_steps", {}, max_steps=10)
    assert advance(str(run.id), owner="t") == Outcome.COMPLETED
    assert WorkflowRun.objects.get(id=run.id).result == [0, 1, 2, 3, 4]
