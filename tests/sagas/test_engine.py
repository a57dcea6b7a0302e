"""Engine invariants checked in-process against real PostgreSQL (the test process is the worker)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from sagas import StepFailed, start
from sagas.errors import IllegalTransition, LeaseLost, NotSerializable, StartConflict, WorkflowNotRegistered
from sagas.models import JournalEntry, RunStatus, WorkflowRun, check_transition
from sagas.replay.engine import Outcome, advance
from sagas.store import systemdb
from sagas.versions.registry import workflow
from tests.sagas import wf_engine  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def _add(a: int, b: int) -> int:
    return a + b


def _boom() -> None:
    raise ValueError("provider said no")


@workflow("inproc_steps", version=1)
def inproc_steps(ctx, spec):
    total = ctx.step("add", _add, 1, 2)
    total = ctx.step("add", _add, total, 10)  # same name again: journaled as add#2
    try:
        ctx.step("boom", _boom)
    except StepFailed as failure:
        caught = failure.error_type
    return {"total": total, "caught": caught}


@workflow("inproc_bad_result", version=1)
def inproc_bad_result(ctx, spec):
    return ctx.step("set", lambda: {1, 2})


def test_it_journals_repeated_names_and_step_errors_deterministically(step_calls):
    run = start("inproc_steps", {})
    assert advance(str(run.id), owner="t") == Outcome.COMPLETED
    run.refresh_from_db()
    assert run.result == {"total": 13, "caught": "ValueError"}
    steps = list(JournalEntry.objects.filter(run=run, kind="step").values_list("name", "payload"))
    assert steps == [
        ("add", {"value": 3}),
        ("add#2", {"value": 13}),
        ("boom", {"error": {"type": "ValueError", "message": "provider said no"}}),
    ]
    assert run.steps_used == 3


def test_it_records_a_non_json_step_result_as_a_step_failure(step_calls):
    run = start("inproc_bad_result", {})
    assert advance(str(run.id), owner="t") == Outcome.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.status_reason == "step_failed"
    assert "not JSON" in run.error["message"]


def test_it_refuses_a_stale_fence_and_writes_nothing(step_calls):
    run = start("five_steps", {})
    first = systemdb.claim(str(run.id), owner="a", ttl=30)
    assert first is not None
    assert systemdb.claim(str(run.id), owner="b", ttl=30) is None  # live lease: the loser returns quietly
    WorkflowRun.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    second = systemdb.claim(str(run.id), owner="b", ttl=30)
    assert second is not None and second.fence == first.fence + 1
    before = JournalEntry.objects.filter(run=run).count()
    with pytest.raises(LeaseLost):
        systemdb.append(str(run.id), fence=first.fence, kind="step", name="s1", payload='{"value":1}', worker="a")
    assert JournalEntry.objects.filter(run=run).count() == before
    systemdb.append(str(run.id), fence=second.fence, kind="step", name="s1", payload='{"value":1}', worker="b")
    assert JournalEntry.objects.filter(run=run).count() == before + 1


def test_it_keeps_the_journal_append_only(step_calls):
    run = start("five_steps", {})
    entry = JournalEntry.objects.get(run=run, seq=1)
    for statement in ("UPDATE sagas_journalentry SET kind = 'x' WHERE id = %s", "DELETE FROM sagas_journalentry WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(statement, [entry.id])
    assert JournalEntry.objects.get(id=entry.id).kind == "started"


def test_it_starts_once_per_business_key_and_refuses_a_different_input():
    first = start("five_steps", {"each": 0}, business_key="order-1842", tenant="acme")
    again = start("five_steps", {"each": 0}, business_key="order-1842", tenant="acme")
    assert again.id == first.id
    with pytest.raises(StartConflict, match="order-1842"):
        start("five_steps", {"each": 1}, business_key="order-1842", tenant="acme")
    other_tenant = start("five_steps", {"each": 1}, business_key="order-1842", tenant="globex")
    assert other_tenant.id != first.id
    assert WorkflowRun.objects.count() == 2


def test_it_refuses_unknown_workflows_and_non_json_input():
    with pytest.raises(WorkflowNotRegistered):
        start("no_such_workflow", {})
    with pytest.raises(NotSerializable):
        start("five_steps", {"when": object()})
    assert WorkflowRun.objects.count() == 0


def test_it_guards_run_transitions_in_one_table():
    check_transition(RunStatus.PENDING, RunStatus.RUNNING)
    with pytest.raises(IllegalTransition, match="COMPLETED to RUNNING"):
        check_transition(RunStatus.COMPLETED, RunStatus.RUNNING)
    run = start("five_steps", {})
    WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.COMPLETED)
    assert systemdb.claim(str(run.id), owner="t", ttl=5) is None  # a finished run is never claimed again
